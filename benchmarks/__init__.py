"""skiptrain's benchmarks, run from the repository root as modules (``python -m benchmarks.quality.score ...``), so
that they import the installed package and the shared helpers of :mod:`benchmarks.common` without any path edits.
Where each number of ``benchmarks/RESULTS.md`` comes from: ``benchmarks/README.md``."""
