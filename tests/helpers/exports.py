"""Shared by the export tests: prompts, the export callback's config, a fit run, and a cache-free decoder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from skiptrain import SkipSchedule, skip_forward

PROMPTS = [
    "Write the weather forecast.\nData: city[Oslo], day[Monday]\nForecast:",
    "The council met on Monday",
    "Describe the restaurant in one sentence.\nAttributes: name[The Eagle]\nSentence:",
]
EXPORT_CALLBACK = '{"class_path": "skiptrain.callbacks.export.ExportCallback", "init_args": {"output_dir": "%s"}}'


@dataclass
class Run:
    """A tiny LoRA fit run with the export callback."""

    cli: object
    model_dir: str
    run_dir: Path
    export_dir: Path

    @property
    def checkpoint(self) -> Path:
        (path,) = self.run_dir.rglob("*.ckpt")
        return path

    @property
    def config(self) -> Path:
        (path,) = self.run_dir.rglob("config.yaml")
        return path


def left_padded(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``prompts``, padded as the tokenizer pads (left, once prepared)."""
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def minimal_decode(model, ids, mask, schedule: SkipSchedule, steps: int, eos: int) -> list[list[int]]:
    """Greedy decoding without a cache: re-run the whole sequence under the schedule for every new token."""
    prompt_length, rows = ids.shape[1], [[] for _ in range(ids.shape[0])]
    done = [False] * ids.shape[0]
    with torch.no_grad():
        for _ in range(steps):
            next_ids = skip_forward(model, ids, mask, schedule, prompt_length)[:, -1].argmax(-1)
            for row, token in enumerate(next_ids.tolist()):
                if not done[row]:
                    rows[row].append(token)
                    done[row] = token == eos
            ids = torch.cat([ids, next_ids[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(next_ids[:, None])], 1)
    return rows
