"""Front-ends over a model and its schedule: batched completion of raw prompts, and the conformance kit."""
