"""The export format: writing, verifying and loading a model with its skip schedule; it imports no Lightning
(the import contracts in pyproject.toml hold it to that)."""
