"""The E2E NLG study: its configs, dev split, speed measurement and slot-error analysis."""
