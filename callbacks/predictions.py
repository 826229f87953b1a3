"""Save what ``predict`` decodes as JSON lines (``skiptrain.callbacks.predictions``).

Add it to the ``predict`` command::

    python -m skiptrain predict --config recipes/quickstart.yaml --ckpt_path runs/.../last.ckpt \
        --trainer.callbacks+=skiptrain.callbacks.predictions.PredictionWriter \
        --trainer.callbacks.output predictions.jsonl

For prompts of your own rather than a data module's test split, use ``skiptrain generate``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from skiptrain.errors import UsageError


class PredictionWriter(BasePredictionWriter):
    """Write each predicted ``{"source", "prediction"}`` record
    (:meth:`~skiptrain.training.module.SkipLM.predict_step`) as one JSON line, batch by batch, so that a long run keeps
    what it decoded.

    Args:
        output: The JSON-lines file, replaced when ``predict`` starts. With several processes, each writes its own
            file, ``<stem>.rank<N><suffix>``.
    """

    def __init__(self, output: str) -> None:
        super().__init__(write_interval="batch")
        if Path(output).is_dir():
            raise UsageError(f"output={output!r} is a directory: allowed a JSON-lines file path")
        self.output = output
        self._path: Path | None = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.output)
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        self._path = path

    def write_on_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, prediction: Sequence[Any],
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        with self._path.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in prediction)


__all__ = ["PredictionWriter"]
