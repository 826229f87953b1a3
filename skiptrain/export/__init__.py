"""The export format: writing, verifying and loading a model with its skip schedule (no Lightning)."""
