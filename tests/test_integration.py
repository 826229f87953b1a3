"""Skip-aware training inside transformers' ``Trainer`` (:mod:`skiptrain.integration`): the same losses, step by step,
as ``SkipLM`` under Lightning on the same batches, and the model's own forward back after the block."""

from __future__ import annotations

import datasets
import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler
from transformers import Trainer, TrainingArguments

from skiptrain.core.schedules import Dense, SkipDecode
from skiptrain.errors import DataError, UsageError
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.text.batch import IGNORE_INDEX
from skiptrain.training.integration import PairCollator, skip_aware, skip_loss
from skiptrain.training.module import OptimizerSettings, SkipLM

PAIRS = [{"prompt": f"Data: city[Town {i}], sky[{sky}]\nForecast:", "target": f"It is {sky} in Town {i} today."}
         for i, sky in enumerate(["sunny", "rainy", "cloudy", "windy"] * 3)]
STEPS, BATCH, LR = 3, 4, 1e-2
FAMILY = SkipDecode(min_layers=2, decay_tokens=6)


class InOrderTrainer(Trainer):
    """transformers' Trainer reading the data in order (as the Lightning run does), recording each step's loss."""

    losses: list[float]

    def _get_train_sampler(self, train_dataset=None):
        return SequentialSampler(train_dataset or self.train_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.losses.append(float(loss))
        return loss


class LossRecorder(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def hf_trainer_losses(model_dir: str, tmp_path) -> list[float]:
    model, tokenizer = load_causal_lm(model_dir).train(), load_tokenizer(model_dir)
    schedule = FAMILY.build(model.config.num_hidden_layers)
    args = TrainingArguments(str(tmp_path / "hf"), per_device_train_batch_size=BATCH, max_steps=STEPS,
                             learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
                             remove_unused_columns=False, use_cpu=True, report_to=[], save_strategy="no",
                             logging_steps=1, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    with skip_aware(model, schedule):
        trainer = InOrderTrainer(model, args, train_dataset=datasets.Dataset.from_list(PAIRS),
                                 data_collator=PairCollator(tokenizer, max_source_tokens=48, max_target_tokens=24))
        trainer.losses = []
        trainer.train()
    assert "forward" not in vars(model), "the model's own forward is back after the block"
    return trainer.losses


def skiplm_losses(model_dir: str) -> list[float]:
    module = SkipLM(model_dir, schedule=FAMILY, optimizer=OptimizerSettings(learning_rate=LR, lr_schedule="constant"))
    loader = DataLoader(PAIRS, batch_size=BATCH, shuffle=False,
                        collate_fn=PairCollator(load_tokenizer(model_dir), max_source_tokens=48, max_target_tokens=24))
    recorder = LossRecorder()
    L.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder]).fit(module, loader)
    return recorder.losses


def test_transformers_trainer_with_skip_aware_has_skiplm_losses(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("llama")
    hf, lightning = hf_trainer_losses(model_dir, tmp_path), skiplm_losses(model_dir)
    assert len(hf) == len(lightning) == STEPS
    assert hf[0] == lightning[0], "the same weights and batch give the same loss"
    torch.testing.assert_close(torch.tensor(hf), torch.tensor(lightning), rtol=1e-5, atol=1e-6)
    assert hf[-1] < hf[0], "it trains"


def test_collator_layout_and_the_dense_loss_is_transformers_own(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    model, tokenizer = load_causal_lm(model_dir).eval(), load_tokenizer(model_dir)
    batch = PairCollator(tokenizer)(PAIRS[:3])
    prompt_length = batch["prompt_length"]
    assert bool(batch["attention_mask"][:, prompt_length - 1].all()), "prompts end at one column"
    assert bool((batch["labels"][:, :prompt_length] == IGNORE_INDEX).all()), "prompts carry no labels"
    with torch.no_grad():
        own = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        dense = skip_loss(model, batch, Dense().build(model.config.num_hidden_layers))
        with skip_aware(model, FAMILY.build(model.config.num_hidden_layers)):
            skipped = model(**batch).loss
    torch.testing.assert_close(dense, own, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(skipped, own), "the schedule is applied inside the block"


def test_refusals_name_the_problem(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    with pytest.raises(DataError, match="allowed string 'prompt' and 'target' fields.*remove_unused_columns"):
        PairCollator(tokenizer)([{"input_ids": [1, 2]}])
    with pytest.raises(UsageError, match="schedule.num_layers=6 is invalid for a model with 4 decoder layers"):
        with skip_aware(model, FAMILY.build(6)):
            pass
    with skip_aware(model, FAMILY.build(4)), pytest.raises(UsageError, match="does not nest"):
        with skip_aware(model, FAMILY.build(4)):
            pass
