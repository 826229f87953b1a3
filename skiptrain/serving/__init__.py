"""Serving engines that decode skiptrain exports under their schedule: the vLLM plugin (docs/serving.md).

Nothing here is imported by the rest of skiptrain; vLLM imports its modules through the entry points in
``pyproject.toml`` (``vllm.general_plugins``, ``vllm.logits_processors``). ``docs/serving.md`` tells how to serve.
"""
