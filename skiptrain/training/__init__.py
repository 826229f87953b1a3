"""Training: the LightningModule, its losses, strategies and checkpoints, and what runs leave behind."""
