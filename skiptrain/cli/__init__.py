"""The command line: LightningCLI and the Trainer with skiptrain's own subcommands."""
