"""The schedule core: skip schedules and what they cost, plus small file utilities (pure Python, no torch)."""
