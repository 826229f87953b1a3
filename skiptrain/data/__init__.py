"""Training and evaluation data: raw splits from files, the hub or the builtin task, and the LightningDataModule."""
