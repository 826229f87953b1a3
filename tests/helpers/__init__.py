"""Shared helpers of the test suite: tiny models and tokenizer, CLI arguments, callbacks and strategies for tests."""
