"""What validation and test measure: the loss and perplexity under the scored schedule and densely, and the task's
generation metrics (ROUGE-1/2/L, multi-reference SacreBLEU) from generated text, on a 0-100 scale.

The generation metrics are torchmetrics', which report a 0-1 fraction; skiptrain scales them to the 0-100 scale that
papers and sacrebleu report, in logs and in every JSON it writes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import MeanMetric
from torchmetrics.text import ROUGEScore, SacreBLEUScore

__all__ = ["EvaluationMetrics", "GENERATION_METRICS", "METRIC_SCALE", "ROUGE_KEYS", "generation_scores"]

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")  # ROUGE-Lsum is left out: it needs nltk data not fetchable offline
GENERATION_METRICS = (*ROUGE_KEYS, "bleu")
METRIC_SCALE = 100.0
"""torchmetrics' 0-1 scores times this: the 0-100 scale of every logged or written ROUGE and BLEU."""


def _rouge() -> ROUGEScore:
    return ROUGEScore(rouge_keys=ROUGE_KEYS)


def _rouge_values(scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ROUGE F-measures by key (``rouge1``, ...) on the 0-100 scale."""
    return {k.removesuffix("_fmeasure"): v * METRIC_SCALE for k, v in scores.items() if k.endswith("_fmeasure")}


def generation_scores(predictions: Sequence[str], references: Sequence[Sequence[str]], metric: str
                      ) -> dict[str, float]:
    """ROUGE-1/2/L against each example's first reference (``metric="rouge"``) or multi-reference SacreBLEU
    (``"bleu"``), on the 0-100 scale."""
    if metric == "bleu":
        return {"bleu": float(SacreBLEUScore()(list(predictions), [list(r) for r in references])) * METRIC_SCALE}
    return {k: float(v) for k, v in _rouge_values(_rouge()(list(predictions), [r[0] for r in references])).items()}


class EvaluationMetrics(torch.nn.Module):
    """The running metrics of one validation or test epoch.

    Args:
        metric: Generation metrics to keep: ``rouge``, ``bleu``, ``both`` or ``none``.
    """

    def __init__(self, metric: str = "none") -> None:
        super().__init__()
        self.loss = torch.nn.ModuleDict({name: MeanMetric() for name in ("skip", "dense")})
        self.rouge = _rouge() if metric in ("rouge", "both") else None
        self.bleu = SacreBLEUScore() if metric in ("bleu", "both") else None

    @property
    def scores_text(self) -> bool:
        """Whether generated text is scored (a ROUGE or BLEU metric is kept)."""
        return self.rouge is not None or self.bleu is not None

    def update_loss(self, name: str, loss: torch.Tensor, weight: int) -> None:
        """Add a batch's mean cross entropy over ``weight`` target tokens under ``name`` (``skip`` or ``dense``)."""
        self.loss[name].update(loss, weight)

    def update_text(self, predictions: list[str], references: list[list[str]]) -> None:
        """Score generated ``predictions`` against each example's references (ROUGE uses the first one)."""
        if self.rouge is not None:
            self.rouge.update(predictions, [refs[0] for refs in references])
        if self.bleu is not None:
            self.bleu.update(predictions, references)

    def compute(self) -> dict[str, torch.Tensor]:
        """The epoch's values by name (``loss_skip``, ``ppl_skip``, ``ppl_gap``, ``rouge1``, ``bleu``, ...), then
        reset for the next epoch; metrics without updates are left out."""
        values: dict[str, torch.Tensor] = {}
        losses = {}
        for name, metric in self.loss.items():
            if metric.update_count:
                losses[name] = metric.compute()
                values[f"loss_{name}"], values[f"ppl_{name}"] = losses[name], torch.exp(losses[name])
            metric.reset()
        if len(losses) == 2:
            values["ppl_gap"] = values["ppl_skip"] - values["ppl_dense"]
        if self.rouge is not None and self.rouge.update_count:
            values.update(_rouge_values(self.rouge.compute()))
        if self.bleu is not None and self.bleu.update_count:
            values["bleu"] = self.bleu.compute() * METRIC_SCALE
        for metric in (self.rouge, self.bleu):
            if metric is not None:
                metric.reset()
        return values
