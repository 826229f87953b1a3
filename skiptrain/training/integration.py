"""Skip-aware training inside another training stack: transformers' ``Trainer``, TRL's ``SFTTrainer``, your own loop
or LightningModule.

Two pieces, the same that :class:`~skiptrain.training.module.SkipLM` is built from:

- :class:`PairCollator` turns ``{"prompt": ..., "target": ...}`` examples into skiptrain's batch layout
  (:func:`skiptrain.text.batch.collate`: prompts left-padded to end at one column, labels on the target tokens),
  tokenised as ``skiptrain fit`` tokenises them;
- :func:`skip_aware` makes a model's ``forward`` run under a skip schedule for the duration of a ``with`` block and
  return the loss ``SkipLM`` trains on (cross entropy over the labelled tokens, the LM head on those columns only).

Example::

    schedule = SkipDecode(min_layers=8).build(model.config.num_hidden_layers)
    args = TrainingArguments("out", remove_unused_columns=False)  # the collator reads the text columns
    with skip_aware(model, schedule):
        Trainer(model, args, train_dataset=pairs, data_collator=PairCollator(tokenizer)).train()
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

from skiptrain.core.schedules import SkipSchedule
from skiptrain.errors import DataError, UsageError
from skiptrain.modeling.loading import prepare_tokenizer
from skiptrain.text.batch import PROMPT_IDS, TARGET_IDS, collate
from skiptrain.text.encoding import encode_pairs
from skiptrain.text.tasks import SOURCE_PLACEHOLDER, validate_template
from skiptrain.training.losses import target_logits

PROMPT, TARGET = "prompt", "target"


@dataclass
class PairCollator:
    """A ``collate_fn`` / ``data_collator`` from (prompt, target) examples to skiptrain's batch layout.

    Args:
        tokenizer: A Hugging Face tokenizer (a missing pad token is set to EOS, padding on the left).
        template: Prompt template with one ``{source}``, filled with each example's ``prompt``; the default uses the
            prompt as it is.
        max_source_tokens: Maximum prompt tokens (the prompt is trimmed, never the template).
        max_target_tokens: Maximum target tokens before the EOS token that ends every target.
        prompt_loss: Also put labels on prompt tokens.
    """

    tokenizer: Any
    template: str = SOURCE_PLACEHOLDER
    max_source_tokens: int = 768
    max_target_tokens: int = 128
    prompt_loss: bool = False

    def __post_init__(self) -> None:
        self.tokenizer = prepare_tokenizer(self.tokenizer)
        validate_template(self.template)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Tokenise and collate ``examples``, each with a string ``prompt`` and ``target``.

        Raises:
            DataError: naming the first example without them.
        """
        for number, example in enumerate(examples):
            if not all(isinstance(example.get(key), str) for key in (PROMPT, TARGET)):
                raise DataError(f"example {number} of the batch has keys {sorted(example)}: allowed string "
                                f"'{PROMPT}' and '{TARGET}' fields (set remove_unused_columns=False in "
                                "TrainingArguments so that the trainer keeps them)")
        prompt_ids, target_ids = encode_pairs(
            self.tokenizer, self.template, [e[PROMPT] for e in examples], [e[TARGET] for e in examples],
            self.max_source_tokens, self.max_target_tokens,
        )
        pairs = [{PROMPT_IDS: p, TARGET_IDS: t} for p, t in zip(prompt_ids, target_ids, strict=True)]
        return collate(pairs, self.tokenizer.pad_token_id, self.prompt_loss)


def skip_loss(model: nn.Module, batch: Mapping[str, Any], schedule: SkipSchedule,
              num_items_in_batch: int | torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross entropy of a skiptrain batch under ``schedule``: what ``SkipLM`` trains on.

    Args:
        model: A supported Hugging Face causal LM, optionally wrapped by peft.
        batch: A batch of :func:`skiptrain.text.batch.collate`'s layout.
        schedule: The skip schedule.
        num_items_in_batch: Labelled tokens over all the micro-batches of one optimizer step, as transformers'
            ``Trainer`` passes it under gradient accumulation: the loss is then the sum over this batch divided by
            it. ``None`` gives the mean over this batch.
    """
    logits, targets = target_logits(model, batch, schedule)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, targets)
    return F.cross_entropy(logits, targets, reduction="sum") / num_items_in_batch


@contextmanager
def skip_aware(model: nn.Module, schedule: SkipSchedule) -> Iterator[nn.Module]:
    """Run ``model``'s ``forward`` under ``schedule`` inside the block: skip-aware training in another trainer.

    Inside the block ``model(**batch)`` takes a batch of :class:`PairCollator` (or :func:`skiptrain.text.batch.collate`)
    and returns a ``CausalLMOutput`` whose ``loss`` is :func:`skip_loss` (``logits`` are not computed). Every decoder
    layer is still called on every step, as ``SkipLM`` does, so sharded strategies keep their module order. The
    model's own ``forward`` (dense, plain transformers) comes back when the block ends.

    Raises:
        UsageError: for a schedule built for another layer count.
        ModelError: for an unsupported model family or attention implementation.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if schedule.num_layers != base.config.num_hidden_layers:
        raise UsageError(f"schedule.num_layers={schedule.num_layers} is invalid for a model with "
                         f"{base.config.num_hidden_layers} decoder layers: build the schedule for "
                         "model.config.num_hidden_layers")
    if "forward" in vars(model):
        raise UsageError("the model's forward is already replaced (an enclosing skip_aware block?): skip_aware "
                         "does not nest")

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, prompt_length: int,
                num_items_in_batch: int | torch.Tensor | None = None, **unused: Any) -> CausalLMOutput:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
                 "prompt_length": int(prompt_length)}
        return CausalLMOutput(loss=skip_loss(model, batch, schedule, num_items_in_batch))

    model.forward = forward
    try:
        yield model
    finally:
        del model.forward


__all__ = ["PairCollator", "skip_aware", "skip_loss"]
