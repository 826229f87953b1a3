"""The architecture table, the skip-aware forward and batched KV-cached generation, and loading models."""
