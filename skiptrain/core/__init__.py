"""The schedule core (pure Python, no torch): skip schedules and what they cost, the files that describe them, the
training curriculum, the calibration's candidate search, and small file utilities."""
