"""What the benchmark scripts share: a study's configuration read by skiptrain's own CLI parser, a study run's
model, and the prompts and references of a scored split."""

from __future__ import annotations

import json
from collections.abc import Sequence

from torch import nn

from skiptrain.cli.app import main
from skiptrain.cli.lightning_cli import SkipCLI
from skiptrain.modeling.loading import load_causal_lm
from skiptrain.training.sources import load_trained_model, resolve_weights_source


def study_config(configs: Sequence[str], data_file: str | None = None) -> SkipCLI:
    """The module, data module and trainer that ``fit --config ...`` would build from ``configs`` (no weights are
    loaded), with ``data_file`` as the test split when given."""
    args = [arg for config in configs for arg in ("--config", config)] + ["--trainer.logger", "false"]
    args += ["--data.max_eval_samples", "null"]  # every row of the scored split
    if data_file is not None:
        args += ["--data.data_files", json.dumps({"test": data_file})]
    return main(args, run=False)


def load_model(cli: SkipCLI, checkpoint: str | None) -> nn.Module:
    """The configured base model, or a run's model with LoRA merged (as in an export), in eval mode."""
    if checkpoint is None:
        return load_causal_lm(cli.model.model_name).eval()
    return load_trained_model(resolve_weights_source(checkpoint)).eval()


def test_prompts(cli: SkipCLI) -> tuple[list[str], list[str], list[list[str]]]:
    """``(sources, prompts, references)`` of the configured test split: one row per unique source, its prompt
    filled and trimmed exactly as training fills and trims prompts (``data.max_source_tokens``)."""
    data = cli.datamodule
    data.setup("test")
    sources, references = [], []
    for batch in data.test_dataloader():
        sources += batch["sources"]
        references += batch["references"]
    prompts, _ = data.prompt_format.encode(data.tokenizer, sources)  # trimmed to data.max_source_tokens
    return sources, prompts, references
