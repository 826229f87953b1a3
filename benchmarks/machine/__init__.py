"""Machine and precision probes: matmul speed by precision, training memory, QLoRA, the GPU scale-out check."""
