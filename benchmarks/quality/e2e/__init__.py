"""The E2E NLG study: its configs, its dev split and training subsets, and the slot-error analysis (its decode speed
and lossless-mode rows are in benchmarks/speed/)."""
