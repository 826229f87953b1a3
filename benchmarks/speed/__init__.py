"""Speed: the core forward and decode, the front-ends side by side, serving in vLLM, lossless mode, the quickstart."""
