"""skiptrain's benchmarks, run from the repository root as modules (``python -m benchmarks.score ...``), so that they
import the installed package and the shared helper :mod:`benchmarks.common` without any path edits."""
