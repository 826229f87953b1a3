"""What every benchmark shares: the machine a result records, and a study's configuration, model and prompts."""
