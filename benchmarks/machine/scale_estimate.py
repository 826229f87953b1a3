"""Expected GPU memory and time of a recipe at a size this project never trained, from a small explicit cost model.

    python -m benchmarks.machine.scale_estimate recipes/opt6.7b_cnndm.yaml [--config F.yaml ...] [--gpu h100] [--gpus N]
    python -m benchmarks.machine.scale_estimate --validate     # the model against the step costs measured on CPUs

The recipe is read by skiptrain's CLI parser (:func:`benchmarks.common.study.study_config`); the model is built from
its config on the ``meta`` device (hub ids from :data:`HUB_CONFIGS`: the hub may be unreachable), with skiptrain's
own LoRA adapters. An earlier run named as teacher or ``init_from`` need not exist: only its kind matters.

FLOPs per example at full truncation length (``P = max_source_tokens`` prompt columns, ``T = max_target_tokens + 1``
target columns; the prompt template's few tokens left out): layer ``l`` runs the first ``n_l`` columns
(``SkipSchedule.layer_run_lengths``: the schedule saves on target columns only) for ``2 p_l n_l`` (its ``p_l`` matmul
weights), ``2 a_l n_l`` (its ``a_l`` LoRA weights) and ``2 w n_l^2`` (causal attention, query width ``w``); the LM
head ``2 V d T`` runs at target columns only. A trained pass is that forward, the decoder layers once more under
activation checkpointing, and a backward of 1x the frozen matmuls (activation gradients), 2x the trained ones
(activation and weight gradients) and 2x adapters and attention. The joint objective adds a trained pass at full
depth; a distillation teacher a full-depth forward without gradient (its LM head only for a KL weight > 0). The
optimizer's arithmetic (under 0.1%), validation and generation are left out. Time = FLOPs / (GPUs x bf16 dense peak
x utilisation), the utilisation an assumption (:data:`UTILISATION`), of executed FLOPs (recompute included).

Memory per GPU: weights in the dtype skiptrain loads them in (``modeling.precision.weights_dtype``; DeepSpeed holds
bf16 weights and fp32 masters with the optimizer), fp32 gradients and AdamW's two fp32 states of the trained weights,
sharded over the GPUs by ZeRO stage (FSDP FULL_SHARD as 3, SHARD_GRAD_OP as 2); autocast's bf16 copies of fp32
trained weights (held through the forward; single device and DDP); one gathered layer under stage 3; activations:
with checkpointing each layer's input plus one layer's working set, else every layer's working set, ``9h + 2kv + 4f``
elements a column for a gated MLP (a norm's input, normed and scaled values, twice; queries, keys, values; attention
output twice; gate, up, activation, product), ``2f`` for a plain one, no ``T x T`` matrix (SDPA); float32 logits at
target columns three times per trained pass, twice more for a KL; a teacher run in float32 on every GPU (as
``training.sources.load_trained_model`` loads it). Communication buffers and allocator slack are not counted.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

from benchmarks.common.study import study_config
from benchmarks.quality.study_report import RESULTS, row_configs, seedless
from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.errors import SkiptrainError, UsageError
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.loading import load_config
from skiptrain.modeling.precision import ALIASES, compute_dtype, weights_dtype
from skiptrain.training.lora import with_adapters
from skiptrain.training.settings import TEACHERS

HUB_CONFIGS = {  # hub id: (revision, the config.json values that shape the model)
    "facebook/opt-1.3b": ("main, commit not recorded", dict(
        model_type="opt", hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
        vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048, do_layer_norm_before=True)),
    "facebook/opt-6.7b": ("main, commit not recorded", dict(
        model_type="opt", hidden_size=4096, ffn_dim=16384, num_hidden_layers=32, num_attention_heads=32,
        vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=4096, do_layer_norm_before=True)),
    "meta-llama/Llama-3.2-1B": ("4e20de362430cd3b72f300e6b0f18e50e7166e08", dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True)),
}
GPUS = {  # name: (what it is, bf16 dense peak FLOP/s from the vendor's datasheet, memory in GB)
    "h100": ("NVIDIA H100 SXM", 989e12, 80), "h200": ("NVIDIA H200 SXM", 989e12, 141),
    "a100-80": ("NVIDIA A100 SXM 80GB", 312e12, 80), "a100-40": ("NVIDIA A100 SXM 40GB", 312e12, 40),
}
UTILISATION = (0.35, 0.45)
"""Assumed share of the bf16 peak that fine-tuning a 1-7B model with activation checkpointing reaches."""
TRAIN_EXAMPLES = {"cnn_dailymail": 287_113, "xsum": 204_045, "e2e_nlg": 42_061, "reddit_tldr": 116_722}
"""Training-split sizes of the builtin tasks' hub datasets (reddit_tldr: trl-lib/tldr)."""


@dataclass(frozen=True)
class Recipe:
    configs: tuple[str, ...]
    model: str
    schedule: SkipSchedule
    lora: dict | None
    dense_loss_weight: float
    teacher: str | None  # None, "dense", "base" or "run" (an earlier run of the same shape)
    kl: bool  # whether the teacher's LM head runs
    checkpointing: bool
    precision: str  # auto as on a bf16 GPU: bf16-mixed
    dtype: str  # model.dtype
    batch: int
    accumulate: int
    prompt: int
    target: int
    task: str
    max_train_samples: int | None
    epochs: float  # unbounded where max_steps ends the run (Lightning's: 1000 where neither is set)
    max_steps: int
    strategy: tuple[str, int, bool]  # single, ddp, deepspeed or fsdp; ZeRO stage; optimizer offloaded


def read_recipe(configs: list[str]) -> Recipe:
    """The recipe's settings, composed by skiptrain's CLI parser."""
    earlier = {}  # the model keys naming an earlier run, as the configs leave them
    for config in configs:
        model = (yaml.safe_load(Path(config).read_text() if Path(config).is_file() else config) or {}).get("model")
        for key in ("distillation", "init_from"):
            if key in (model or {}):
                value = model[key]
                earlier[key] = value.get("teacher", earlier.get(key)) if isinstance(value, dict) else value
    runs = {key for key, value in earlier.items() if isinstance(value, str) and value not in TEACHERS}
    stand_ins = {"init_from": {"init_from": None}, "distillation": {"distillation": {"teacher": "dense"}}}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # the configs are ours, not argv's
        cli = study_config([*configs, *(json.dumps({"model": stand_ins[key]}) for key in sorted(runs))])
    module, data, trainer, strategy = cli.model, cli.datamodule, cli.config.trainer, cli.trainer.strategy
    distillation, precision = module.distillation, str(trainer.precision)
    epochs = trainer.max_epochs if trainer.max_epochs is not None else 1000 if trainer.max_steps < 0 else math.inf
    kind, stage, offload = {"DDPStrategy": "ddp"}.get(type(strategy).__name__, "single"), 0, False
    if hasattr(strategy, "zero_stage_3"):
        zero = strategy.config["zero_optimization"]
        kind, stage, offload = "deepspeed", zero["stage"], "offload_optimizer" in zero
    elif "FSDP" in type(strategy).__name__:
        kind, stage = "fsdp", 3 if "FULL" in str(strategy.sharding_strategy) else 2
    return Recipe(
        tuple(configs), module.model_name,
        module._schedule_family().build(model_config(module.model_name).num_hidden_layers), module.lora,
        module.hparams.dense_loss_weight, None if distillation is None else
        "run" if "distillation" in runs else distillation.teacher, bool(distillation and distillation.weight > 0),
        module.hparams.activation_checkpointing, ALIASES.get(precision, precision).replace("auto", "bf16-mixed"),
        module.hparams.get("dtype", "auto"), data.batching.batch_size, trainer.accumulate_grad_batches,
        data.lengths.max_source_tokens, data.lengths.max_target_tokens + 1, data.task_spec.name,
        data.splits.max_train_samples, epochs, trainer.max_steps, (kind, stage, offload))


@functools.cache
def model_config(name: str):
    """The transformers config of ``name``: from :data:`HUB_CONFIGS`, else as skiptrain loads it (offline for a
    bundled model, a local directory or an export)."""
    if name in HUB_CONFIGS:
        values = dict(HUB_CONFIGS[name][1])
        return AutoConfig.for_model(values.pop("model_type"), **values)
    return load_config(name)


@dataclass(frozen=True)
class Shape:
    """What the cost model needs of a model, counted on the meta device."""

    parameters: int
    trainable: int
    layer_weights: tuple[int, ...]  # matmul weights of each decoder layer
    layer_adapters: tuple[int, ...]  # LoRA weights of each decoder layer
    head: int  # LM head weights
    vocab: int
    attention_width: int
    hidden: int
    kv_width: int
    ffn: int
    gated: bool


def model_shape(name: str, lora: dict | None) -> Shape:
    return _shape(name, json.dumps(lora, sort_keys=True))


@functools.cache
def _shape(name: str, lora: str) -> Shape:
    config = model_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    layers = decoder_parts(model).layers
    weights = tuple(sum(m.weight.numel() for m in x.modules() if isinstance(m, torch.nn.Linear)) for x in layers)
    gated = any(name.endswith(("gate_proj", "gate_up_proj")) for name, _ in layers[0].named_modules())
    head = model.get_output_embeddings().weight
    if json.loads(lora) is not None:
        model = with_adapters(model, json.loads(lora))
    adapters = tuple(sum(p.numel() for n, p in layer.named_parameters() if "lora_" in n)
                     for layer in decoder_parts(model).layers)
    params, head_dim = list(model.parameters()), getattr(config, "head_dim", None) or config.hidden_size // \
        config.num_attention_heads
    return Shape(sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad), weights,
                 adapters, head.numel(), head.shape[0], config.num_attention_heads * head_dim, config.hidden_size,
                 getattr(config, "num_key_value_heads", config.num_attention_heads) * head_dim,
                 getattr(config, "intermediate_size", None) or config.ffn_dim, gated)


def step_flops(shape: Shape, recipe: Recipe) -> dict[str, float]:
    """FLOPs of one optimizer step on one GPU, by part (see the module docstring)."""
    def forward(schedule: SkipSchedule, adapters: bool = True) -> tuple[float, float, float]:
        lengths = [max(n, 1) for n in schedule.layer_run_lengths(recipe.prompt, recipe.prompt + recipe.target)]
        matmul = sum(2 * w * n for w, n in zip(shape.layer_weights, lengths, strict=True))
        other = sum(2 * (a * adapters + shape.attention_width * n) * n
                    for a, n in zip(shape.layer_adapters, lengths, strict=True))
        return matmul, other, 2 * shape.head * recipe.target

    def trained(schedule: SkipSchedule) -> dict[str, float]:
        matmul, other, head = forward(schedule)
        return {"forward": matmul + other + head, "recompute": recipe.checkpointing * (matmul + other),
                "backward": (2 if recipe.lora is None else 1) * (matmul + head) + 2 * other}

    dense = Dense().build(recipe.schedule.num_layers)
    parts = trained(recipe.schedule)
    if recipe.dense_loss_weight > 0:
        parts["dense pass"] = sum(trained(dense).values())
    if recipe.teacher is not None:
        matmul, other, head = forward(dense, adapters=recipe.teacher == "dense")
        parts["teacher"] = matmul + other + head * recipe.kl
    return {part: value * recipe.batch * recipe.accumulate for part, value in parts.items()}


def gpu_memory(shape: Shape, recipe: Recipe, gpus: int) -> dict[str, float]:
    """Bytes per GPU, by part (see the module docstring)."""
    kind, stage, offload = recipe.strategy
    shard = {0: (1, 1, 1), 1: (1, 1, gpus), 2: (1, gpus, gpus), 3: (gpus, gpus, gpus)}[stage if gpus > 1 else 0]
    computed = compute_dtype(recipe.precision).itemsize
    held = computed if kind == "deepspeed" else weights_dtype(recipe.precision, recipe.lora is None,
                                                              recipe.dtype).itemsize
    trained = shape.trainable
    trained_bytes = held if recipe.lora is None else 4  # peft keeps adapters in float32
    parts = {"weights": ((shape.parameters - trained) * held + trained * trained_bytes) / shard[0],
             "gradients": 4 * trained / shard[1],
             "AdamW states": 0 if offload else (12 if kind == "deepspeed" else 8) * trained / shard[2]}
    if kind in ("single", "ddp") and computed < trained_bytes:
        parts["autocast copies"] = computed * trained
    if shard[0] > 1:
        parts["gathered layer"] = computed * max(shape.layer_weights) + 4 * max(shape.layer_adapters)
    per_column = 9 * shape.hidden + 2 * shape.kv_width + (4 if shape.gated else 2) * shape.ffn
    columns, logits = recipe.prompt + recipe.target, recipe.batch * recipe.target * shape.vocab * 4

    def activations(schedule: SkipSchedule) -> float:
        lengths = schedule.layer_run_lengths(recipe.prompt, columns)
        if recipe.checkpointing:
            return recipe.batch * (len(lengths) * columns * shape.hidden * held + max(lengths) * per_column * computed)
        return recipe.batch * sum(lengths) * per_column * computed

    parts["activations"] = activations(recipe.schedule) + 3 * logits + 2 * logits * (recipe.teacher is not None
                                                                                     and recipe.kl)
    if recipe.dense_loss_weight > 0:
        parts["activations"] += activations(Dense().build(recipe.schedule.num_layers)) + 3 * logits
    if recipe.teacher == "run":
        parts["teacher (float32)"] = 4 * (shape.parameters - sum(shape.layer_adapters))
    return parts


@dataclass(frozen=True)
class Cost:
    """One recipe's expected cost on ``gpus`` GPUs of kind ``gpu``."""
    recipe: Recipe
    gpu: str
    gpus: int
    shape: Shape
    flops: dict[str, float]  # per optimizer step and GPU, by part
    memory: dict[str, float]  # bytes per GPU, by part
    size: int  # training examples an epoch
    per_step: int  # examples an optimizer step, all GPUs
    steps: int  # optimizer steps an epoch
    run: int  # optimizer steps in all
    hours: list[float]  # an epoch's wall hours, at the higher then the lower utilisation

    @property
    def fits(self) -> bool:
        return sum(self.memory.values()) <= 0.9e9 * GPUS[self.gpu][2]

    @property
    def run_hours(self) -> list[float]:
        return [h * self.run / self.steps for h in self.hours]


def cost(recipe: Recipe, gpu: str, gpus: int, examples: int | None = None) -> Cost:
    check_gpus(gpu, gpus)
    size = min(examples or TRAIN_EXAMPLES.get(recipe.task) or math.inf, recipe.max_train_samples or math.inf)
    if size == math.inf:
        raise UsageError(f"task={recipe.task!r} has no known training-set size: give --train-examples N (known: "
                         f"{', '.join(TRAIN_EXAMPLES)}, or a recipe's data.max_train_samples)")
    shape = model_shape(recipe.model, recipe.lora)
    flops, per_step = step_flops(shape, recipe), recipe.batch * recipe.accumulate * gpus
    steps = math.ceil(size / per_step)
    run = min(steps * recipe.epochs, recipe.max_steps) if recipe.max_steps > 0 else steps * recipe.epochs
    hours = [sum(flops.values()) * steps / (GPUS[gpu][1] * u) / 3600 for u in reversed(UTILISATION)]
    return Cost(recipe, gpu, gpus, shape, flops, gpu_memory(shape, recipe, gpus), size, per_step, steps, run, hours)


def estimate(recipe: Recipe, gpu: str, gpus: int, examples: int | None = None) -> str:
    """The Markdown block for one recipe on ``gpus`` GPUs of kind ``gpu``."""
    c = cost(recipe, gpu, gpus, examples)
    label, peak, capacity = GPUS[gpu]
    shape, flops, memory, columns = c.shape, c.flops, c.memory, recipe.prompt + recipe.target
    total, source = sum(memory.values()), HUB_CONFIGS.get(recipe.model, ("",))[0]
    trained = "every weight (full fine-tuning)" if recipe.lora is None else \
        f"LoRA r={recipe.lora['r']} on {recipe.lora.get('target_modules') or 'the attention projections'}"
    kind = "ddp" if recipe.strategy[0] == "single" and gpus > 1 else recipe.strategy[0]  # Lightning's choice then
    strategy = kind + (f" ZeRO-{recipe.strategy[1]}" if recipe.strategy[1] else "")
    return "\n".join([
        f"#### {recipe.model} on {recipe.task}: expected, not run at this size",
        f"`{' + '.join(recipe.configs)}`: {recipe.precision}, {strategy}, {gpus} x {label}", "", "| | |", "|---|---|",
        f"| parameters, adapters included | {shape.parameters:,}"
        + (f" (hub config, revision {source})" if source else "") + " |",
        f"| trained | {shape.trainable:,}: {trained} |",
        f"| schedule | {recipe.schedule.family}: {recipe.schedule.mean_layers_per_token(recipe.target):.1f} of "
        f"{recipe.schedule.num_layers} layers per target column, on average over {recipe.target} |",
        f"| tokens per optimizer step | <= {c.per_step:,} x {columns:,} = {c.per_step * columns:,} (every row at full "
        "truncation length: an upper bound) |",
        f"| FLOPs per optimizer step, per GPU | {sum(flops.values()) / 1e12:,.4g} TFLOP ("
        + ", ".join(f"{k} {v / 1e12:,.4g}" for k, v in flops.items()) + ") |",
        f"| steps per epoch | {c.steps:,} ({c.size:,} examples / {c.per_step} per step) |",
        f"| time per epoch | {span(c.hours)}: bf16 dense peak {peak / 1e12:.0f} TFLOPS per GPU, utilisation "
        f"{UTILISATION[0]}-{UTILISATION[1]} assumed |",
        f"| whole run | {c.run:,} steps: {span(c.run_hours)}, {span([gpus * h for h in c.run_hours])} of GPU time |",
        f"| memory per GPU | {total / 1e9:.1f} GB of {capacity} ("
        + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in memory.items() if v >= 0.05e9) + ")"
        + ("" if c.fits else ": does not fit") + " |", ""])


def span(hours: list[float]) -> str:
    """``1.2-1.5 h``, or in minutes under an hour."""
    return f"{hours[0]:.1f}-{hours[1]:.1f} h" if hours[1] >= 1 else f"{60 * hours[0]:.1f}-{60 * hours[1]:.1f} min"


def check_gpus(gpu: str, gpus: int) -> None:
    if gpu not in GPUS:
        raise UsageError(f"--gpu {gpu!r} is invalid: allowed {', '.join(GPUS)}")
    if gpus < 1:
        raise UsageError(f"--gpus {gpus} is invalid: allowed >= 1")


UNMODELLED = {"qlora", "curriculum"}  # dequantisation and an annealed schedule are outside the cost model
SCHEDULE_ONLY = '{"model": {"dense_loss_weight": 0.0}}'


def study_rows() -> dict[str, tuple[tuple, list[str], dict]]:
    """Trained study rows: name -> ((study, seed, precision, machine or None), schedule and levers, record)."""
    rows = {}
    for path in sorted(RESULTS.glob("*/study/*.train.json")):
        record, name = json.loads(path.read_text()), path.name.removesuffix(".train.json")
        machines = {f"{m['cpu']} {m['cpu_capability']}, {m['torch_threads']} thread(s)"
                    for m in record.get("machines", [])}
        seed = re.search(r"_s\d+$", name)
        key = (path.parts[-3], seed and seed.group(), record["precision"], "; ".join(sorted(machines)) or None)
        rows[name] = (key, seedless(name).split("+"), record)
    return rows


def measured_pairs() -> list[tuple[str, list[str], list[str], float, str | None]]:
    """``(what, configs A, configs B, measured step cost B / A, machine)``: study rows of one study, seed, precision
    and machine (None: unrecorded) that differ by one lever or by their schedule against dense; and the quickstart's
    fit with and without the joint objective (CPU time, setup and validation included)."""
    rows = {name: (key, parts, rec["wall_seconds"] / rec["steps"]) for name, (key, parts, rec) in study_rows().items()
            if rec.get("wall_seconds") and rec.get("steps") and not UNMODELLED & set(parts)}
    pairs = []
    for a, (key, parts_a, cost_a) in rows.items():
        for b, (key_b, parts_b, cost_b) in rows.items():
            schedule = parts_a[0] == "dense" != parts_b[0] and parts_a[1:] == parts_b[1:]
            if key == key_b and (parts_b[:-1] == parts_a or schedule) and ";" not in (key[3] or ""):
                pairs.append((f"{key[0]}: {b} / {a}, {key[2]}", row_configs(key[0], a), row_configs(key[0], b),
                              cost_b / cost_a, key[3]))
    joint, alone = (RESULTS / "quickstart" / f for f in ("readme_job_joint_one_core.json",
                                                         "avx512bf16_epyc_auto_readme_job.json"))
    if joint.is_file() and alone.is_file():
        cost = json.loads(joint.read_text())["cpu_s"] / json.loads(alone.read_text())["fit"]["cpu_s"]
        pairs.append(("quickstart: joint / schedule-only, fit CPU s, bf16-mixed", ["recipes/quickstart.yaml",
                      SCHEDULE_ONLY], ["recipes/quickstart.yaml"], cost, "AMD EPYC AVX512-BF16, 1 thread"))
    return pairs


def memory_cases() -> list[tuple[str, list[str], float, float | None]]:
    """``(what, configs, measured peak RSS bytes, measured weight bytes or None)``: memory.py's cases, qlora.py's LoRA
    rows and the study rows that recorded their peak."""
    cases = []
    memory, qlora = RESULTS / "memory_cpu.json", RESULTS / "qlora" / "cpu_step_memory.json"
    models = {"quickstart": ["recipes/quickstart.yaml", SCHEDULE_ONLY], "llama1b": [
        "recipes/llama3.2-1b_xsum.yaml", '{"model": {"lora": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}, '
        '"activation_checkpointing": false}}']}
    for case in json.loads(memory.read_text())["cases"] if memory.is_file() else []:
        (batch, length), weights = case["batch"], case["weights"]
        shape = {"model": {"dtype": case["dtype"]}, "trainer": {"precision": "bf16-mixed"}, "data": {
            "batch_size": batch, "max_source_tokens": length // 2, "max_target_tokens": length // 2 - 1}}
        cases.append((f"memory.py {case['model']}, {case['dtype']} weights, batch {batch} x {length}",
                      [*models[case["model"]], json.dumps(shape)], case["peak_rss_mib"] * 2**20,
                      (weights["frozen_mib"] + weights["trainable_mib"]) * 2**20))
    for name, row in json.loads(qlora.read_text())["results"].items() if qlora.is_file() else []:
        if row["quantization"] is None:  # peak resident memory sampled while training
            cases.append((f"qlora.py {name}: E2E flat 2x, LoRA r=64, batch 8", [
                *row_configs("e2e", "flat2x+lora_all_r64"), json.dumps({"trainer": {"precision": row["precision"]}})],
                row["peak_rss_training_bytes"], None))
    for name, ((study, *_), _, record) in study_rows().items():
        if record.get("max_rss_gib"):
            cases.append((f"{study} {name}", row_configs(study, name), record["max_rss_gib"] * 2**30, None))
    return cases


def validate() -> str:
    """Markdown: predicted against measured step-cost ratios, then memory against the CPU measurements."""
    def flops(configs: list[str]) -> float:
        recipe = read_recipe(configs)
        return sum(step_flops(model_shape(recipe.model, recipe.lora), recipe).values())

    lines, pairs = [], measured_pairs()
    for recorded in (True, False):
        rows, errors = [], []
        for what, a, b, measured, where in pairs:
            if (where is not None) == recorded:
                predicted = flops(b) / flops(a)
                errors.append(abs(predicted / measured - 1))
                rows.append(f"| {what} | {where or 'unrecorded'} | {measured:.2f} | {predicted:.2f} | "
                            f"{100 * (predicted / measured - 1):+.0f}% |")
        errors.sort()
        which = "machine recorded" if recorded else "machine unrecorded (a pair may mix machines and loads)"
        lines += [f"Step cost B / A, {which}: {len(errors)} pairs, median error {100 * errors[len(errors) // 2]:.0f}%"
                  f", {sum(e <= 0.15 for e in errors)} within 15%" if errors else f"Step cost, {which}: no pairs", "",
                  "| pair | machine | measured | predicted | error |", "|---|---|---:|---:|---:|", *rows, ""]
    lines += ["Memory on one device against the peak resident memory measured on CPUs, which adds the Python/torch "
              "runtime (about 1 GB) and loading's copies; the weights exactly", "",
              "| case | peak RSS | predicted | weights | predicted |", "|---|---:|---:|---:|---:|"]
    for what, configs, rss, weights in memory_cases():
        recipe = read_recipe(configs)
        parts = gpu_memory(model_shape(recipe.model, recipe.lora), recipe, 1)
        lines.append(f"| {what} | {rss / 1e9:.2f} GB | {sum(parts.values()) / 1e9:.2f} GB | "
                     + (f"{weights / 1e9:.3f} GB | {parts['weights'] / 1e9:.3f} GB |" if weights else "- | - |"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", help="the recipe (first config)")
    parser.add_argument("--config", action="append", default=[], help="a fragment stacked on it (repeatable)")
    parser.add_argument("--gpu", default="h100", help=f"one of {', '.join(GPUS)}")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--train-examples", type=int, help="training-set size where the task's is not known")
    parser.add_argument("--validate", action="store_true", help="the model against the measured step costs")
    args = parser.parse_args(argv)
    for name in ("lightning.pytorch", "lightning.fabric", "skiptrain"):
        logging.getLogger(name).setLevel(logging.WARNING)  # the trainer's device lines, not this report's
    try:
        if args.validate:
            print(validate())
        elif args.recipe is None:
            raise UsageError("a recipe is required: allowed a recipe path (recipes/*.yaml) or --validate")
        else:
            check_gpus(args.gpu, args.gpus)  # before the slower parsing of the recipe
            print(estimate(read_recipe([args.recipe, *args.config]), args.gpu, args.gpus, args.train_examples))
    except SkiptrainError as err:
        print(f"scale_estimate: error: {' '.join(str(err).split())}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None


if __name__ == "__main__":
    main()
