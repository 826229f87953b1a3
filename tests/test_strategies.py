"""Scale-out: DDP, FSDP and DeepSpeed ZeRO-2/3 on CPU processes over gloo, rank-independent module order,
consolidation of sharded checkpoints, the strategy fragments.

Multi-process runs start the real CLI under ``torchrun`` (as users launch multi-node jobs) with 2 processes and
compare each rank-averaged loss trajectory, and the consolidated final weights, with a single process that sees
the same global batches. Every row is a full text block, so the mean of the two ranks' mean losses is exactly the
global mean loss, and tolerances only absorb float reduction order. The ZeRO-3 + offload + DeepSpeed CPU Adam run
JIT-compiles a C++ extension (minutes): it is marked ``slow`` and left out of the default run (``pytest -m slow``).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.tiny_models import left_padded_batch, tiny_config, tiny_model
from helpers.tiny_tokenizer import build_tiny_tokenizer
from transformers import AutoModelForCausalLM

from skiptrain.cli.app import main
from skiptrain.cli.trainer import SkipTrainer
from skiptrain.core.schedules import SkipDecode
from skiptrain.modeling.architectures import decoder_parts, enable_activation_checkpointing
from skiptrain.modeling.forward import skip_hidden_states
from skiptrain.modeling.generation import generate_under_schedule
from skiptrain.training import strategies
from skiptrain.training.checkpoints import (
    CheckpointError,
    checkpoint_layout,
    checkpoint_metadata,
    consolidate_checkpoint,
)
from skiptrain.training.module import SkipLM
from skiptrain.training.strategies import (
    ClippingFSDPPrecision,
    SkipDeepSpeedStrategy,
    SkipFSDPStrategy,
    decoder_layer_classes,
)

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
HAS_DEEPSPEED = find_spec("deepspeed") is not None
requires_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="DeepSpeed is the optional extra: pip install 'skiptrain[deepspeed]'"
)
STEPS = 3
LOSS_TOLERANCE = 1e-4  # absolute, on losses ~6: float reduction order across 2 ranks and 3 AdamW steps
WEIGHT_TOLERANCE = 1e-4  # absolute, on final weights after 3 steps at lr 1e-2


# -- rank independence: the same module calls in the same order, whatever the data ------------------------------------
# SkipDecode on 6 layers: E(0) = {0, 3, 4, 5}, so layers 1 and 2 run only on prompt columns. With prompt_depth=max
# no column runs them on any rank; with prompt_depth=all a rank with prompts runs them and a rank with plain
# language-model rows (no prompt, P = 0) does not: exactly where a data-dependent "skip the call" would diverge.
def rank_schedule(prompt_depth: str = "max") -> SkipDecode:
    return SkipDecode(max_layers=4, min_layers=2, decay_tokens=4, prompt_depth=prompt_depth)


RANK_SCHEDULE = rank_schedule()


def record_calls(model: torch.nn.Module) -> tuple[list[str], list]:
    """Record, in order, every call of a module that owns parameters (what ZeRO-3/FSDP gather on each call)."""
    calls: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda m, args, name=name: calls.append(name))
        for name, module in model.named_modules()
        if any(True for _ in module.parameters(recurse=False))
    ]
    return calls, handles


def training_calls(model: torch.nn.Module, schedule, batch: int, prompt: int, continuation: int, seed: int):
    """Module calls of one training step (forward and backward), and each layer's run length."""
    if prompt:
        ids, mask = left_padded_batch(batch, prompt, continuation, seed=seed)
    else:  # plain language-model rows
        ids = torch.randint(3, 97, (batch, continuation), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
    model.zero_grad()
    calls, handles = record_calls(model)
    hidden = skip_hidden_states(model, ids, mask, schedule, prompt_length=prompt)  # [B, S, H]
    decoder_parts(model).lm_head(hidden).float().logsumexp(-1).mean().backward()
    for handle in handles:
        handle.remove()
    return calls, schedule.layer_run_lengths(prompt, prompt + continuation)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation_checkpointing"])
@pytest.mark.parametrize("prompt_depth", ["max", "all"])
def test_training_step_calls_the_same_modules_in_the_same_order_on_every_rank(prompt_depth, checkpointing):
    model = tiny_model("llama", 6).train()
    if checkpointing:
        enable_activation_checkpointing(model)
    schedule = rank_schedule(prompt_depth).build(6)
    rank0, lengths0 = training_calls(model, schedule, batch=2, prompt=5, continuation=3, seed=0)
    rank1, lengths1 = training_calls(model, schedule, batch=3, prompt=0 if prompt_depth == "all" else 9,
                                     continuation=12, seed=1)
    # precondition: some layer is run by no column on a rank (and, with prompt_depth=all, only on one of them)
    assert lengths1[1] == 0 and (lengths0[1] > 0) == (prompt_depth == "all")
    assert rank0 == rank1
    # every decoder layer is called once per forward; checkpointing calls it again in the backward (recompute)
    calls_per_layer = 2 if checkpointing else 1
    assert [rank0.count(f"model.layers.{i}.self_attn.q_proj") for i in range(6)] == [calls_per_layer] * 6
    assert rank0.count("model.embed_tokens") == rank0.count("lm_head") == 1
    # a layer no column runs still gets a (zero) gradient: DDP's find_unused_parameters=False and ZeRO need one
    skipped = model.model.layers[1].self_attn.q_proj.weight.grad
    assert skipped is not None and not skipped.any()
    assert model.model.layers[3].self_attn.q_proj.weight.grad.abs().sum() > 0


def generation_calls(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, eos: int, synced: bool):
    schedule = RANK_SCHEDULE.build(decoder_parts(model).num_layers)
    calls, handles = record_calls(model)
    out = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=4, eos_token_id=eos, synced=synced)
    for handle in handles:
        handle.remove()
    return calls, out


def test_synced_generation_calls_the_same_modules_on_every_rank_when_one_rank_finishes_early():
    model = tiny_model("llama", 6)
    ids0, mask0 = left_padded_batch(1, 4, 0, seed=2)
    ids1, mask1 = left_padded_batch(2, 7, 0, seed=3)
    schedule = RANK_SCHEDULE.build(6)
    eos = int(generate_under_schedule(model, ids0, mask0, schedule, 1).tokens[0, 0])  # rank 0 ends at once
    _, ends_late = generation_calls(model, ids1, mask1, eos, synced=False)
    assert ends_late.lengths.tolist() == [4, 4], "precondition: rank 1 generates all 4 tokens"

    early0, out0 = generation_calls(model, ids0, mask0, eos, synced=False)
    early1, _ = generation_calls(model, ids1, mask1, eos, synced=False)
    assert out0.tokens.shape[1] == 1 and early0 != early1  # unsynced: rank 0 stops, rank 1 would wait for it

    synced0, out0 = generation_calls(model, ids0, mask0, eos, synced=True)
    synced1, out1 = generation_calls(model, ids1, mask1, eos, synced=True)
    assert synced0 == synced1 and out0.tokens.shape[1] == out1.tokens.shape[1] == 4
    assert out0.lengths.tolist() == [1]  # the finished row still reports its length; the rest is padding


# -- small units ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["opt", "llama", "gpt2", "mistral", "qwen2"])
def test_fsdp_wraps_the_decoder_layer_class_of_every_family(family):
    model = tiny_model(family, 2)
    (layer_class,) = decoder_layer_classes(model)
    assert layer_class is type(decoder_parts(model).layers[0])
    assert layer_class.__name__ != "ModuleList"


def test_decoder_layer_classes_look_inside_a_lightning_module_with_lora(tiny_model_dir):
    module = SkipLM(model=tiny_model_dir("opt"), schedule=SkipDecode(min_layers=2), lora={"r": 2, "lora_alpha": 4})
    module.configure_model()
    assert {c.__name__ for c in decoder_layer_classes(module)} == {"OPTDecoderLayer"}
    with pytest.raises(ValueError, match="no Hugging Face PreTrainedModel"):
        decoder_layer_classes(torch.nn.Linear(2, 2))


def test_deepspeed_strategy_refuses_invalid_stages_before_needing_deepspeed():
    with pytest.raises(ValueError, match="stage=1 is invalid"):
        SkipDeepSpeedStrategy(stage=1)
    with pytest.raises(ValueError, match="offload_parameters=True is invalid with stage=2"):
        SkipDeepSpeedStrategy(stage=2, offload_parameters=True)


def test_fsdp_strategy_clips_over_the_root_module_and_keeps_buffers_in_fp32():
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.plugins.precision import FSDPPrecision

    strategy = SkipFSDPStrategy()
    strategy.precision_plugin = FSDPPrecision("bf16-mixed")  # what Lightning's connector assigns
    plugin = strategy.precision_plugin
    assert isinstance(plugin, ClippingFSDPPrecision) and plugin.precision == "bf16-mixed"
    config = strategy.mixed_precision_config
    assert (config.param_dtype, config.reduce_dtype, config.buffer_dtype) == (torch.bfloat16, torch.bfloat16,
                                                                               torch.float32)
    with pytest.raises(MisconfigurationException, match="not supported"):
        plugin.clip_grad_by_norm(None, 0.5)  # no root module yet: Lightning's refusal, not a silent no-op

    class Root(torch.nn.Module):
        clipped: list[float] = []

        def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
            self.clipped.append(max_norm)
            return torch.tensor(1.0)

    plugin.root = Root()
    plugin.clip_grad_by_norm(None, 0.5)
    assert plugin.root.clipped == [0.5]


def test_release_process_group_destroys_the_group_at_exit(monkeypatch, tmp_path):
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(strategies, "_RELEASE_REGISTERED", False)
    strategies.release_process_group()
    strategies.release_process_group()  # registered once
    assert registered == [strategies._destroy_process_group]
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert torch.distributed.is_initialized()
        registered[0]()  # what the interpreter runs at exit
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    registered[0]()  # and a no-op without a group


# -- strategy fragments ------------------------------------------------------------------------------------------------
FRAGMENTS = sorted((ROOT / "recipes" / "strategies").glob("*.yaml"))


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.stem)
def test_strategy_fragments_configure_the_strategy_they_name(fragment):
    if "DeepSpeed" in fragment.read_text() and not HAS_DEEPSPEED:
        pytest.skip("DeepSpeed fragment: needs the optional extra skiptrain[deepspeed]")
    text = fragment.read_text()
    (base,) = [line.removeprefix("# base: ").split() for line in text.splitlines() if line.startswith("# base: ")]
    assert "recipes/opt6.7b_cnndm.yaml" in base
    command = next(line for line in text.splitlines() if "python -m skiptrain fit" in line)
    assert f"recipes/strategies/{fragment.name}" in text and "--config recipes/opt6.7b_cnndm.yaml" in command
    configs = [arg for item in [*base, str(fragment.relative_to(ROOT))] for arg in ("--config", str(ROOT / item))]
    cli = main(configs, run=False)
    strategy = cli.trainer.strategy
    expected = {"ddp": "DDPStrategy", "fsdp": "SkipFSDPStrategy"}.get(fragment.stem, "SkipDeepSpeedStrategy")
    assert type(strategy).__name__ == expected
    assert cli.trainer.precision == "bf16-mixed"
    if fragment.stem == "ddp":
        assert strategy._ddp_kwargs["find_unused_parameters"] is False and cli.model.lora is not None
    elif fragment.stem == "fsdp":
        assert strategy._state_dict_type == "sharded" and strategy.sharding_strategy.name == "FULL_SHARD"
        assert cli.model.hparams.activation_checkpointing
    else:
        zero = strategy.config["zero_optimization"]
        assert zero["stage"] == (2 if "zero2" in fragment.stem else 3)
        assert ("offload_optimizer" in zero) == ("offload" in fragment.stem) == strategy.offloads_optimizer


def test_slurm_example_is_valid_bash_and_passes_the_allocation_to_the_trainer():
    script = ROOT / "recipes" / "strategies" / "slurm_example.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "srun python -m skiptrain fit" in text
    assert '--trainer.num_nodes "${SLURM_JOB_NUM_NODES}"' in text and "--ntasks-per-node=8" in text


# -- consolidation failure modes ------------------------------------------------------------------------------------
def tied_module(model_dir: str) -> SkipLM:
    module = SkipLM(model=model_dir, schedule=RANK_SCHEDULE)
    module.configure_model()
    return module


def test_consolidation_restores_a_missing_tied_weight_and_names_other_missing_keys(tied_model_dir, tmp_path):
    module = tied_module(tied_model_dir)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    assert "model.lm_head.weight" in state, "precondition: the state dict lists the tied weight under both names"
    del state["model.lm_head.weight"]
    torch.save({"state_dict": state}, tmp_path / "tied.ckpt")
    restored = consolidate_checkpoint(tmp_path / "tied.ckpt", reference=module)
    assert torch.equal(restored["model.lm_head.weight"], state["model.model.embed_tokens.weight"])
    module.load_state_dict(restored)  # strict

    del state["model.model.norm.weight"]  # not tied to anything: refused, by name
    torch.save({"state_dict": state}, tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match=r"1 missing: model\.model\.norm\.weight"):
        consolidate_checkpoint(tmp_path / "missing.ckpt", reference=module)
    state["model.model.norm.weight"] = torch.ones(3)
    torch.save({"state_dict": state}, tmp_path / "shape.ckpt")
    with pytest.raises(CheckpointError, match=r"model\.model\.norm\.weight: \[3\] instead of \[32\]"):
        consolidate_checkpoint(tmp_path / "shape.ckpt", reference=module)


def test_consolidation_refuses_zero_element_placeholders_by_name(tied_model_dir, tmp_path):
    state = dict(tied_module(tied_model_dir).state_dict())
    state["model.model.layers.0.mlp.up_proj.weight"] = torch.empty(0)  # what a ZeRO-3 module holds outside a gather
    torch.save({"state_dict": state}, tmp_path / "partitioned.ckpt")
    with pytest.raises(CheckpointError, match=r"1 zero-element tensors.*model\.model\.layers\.0\.mlp\.up_proj\.weight"):
        consolidate_checkpoint(tmp_path / "partitioned.ckpt")
    with pytest.raises(CheckpointError, match="no such file or directory"):
        consolidate_checkpoint(tmp_path / "absent.ckpt")
    (tmp_path / "not_a_checkpoint").mkdir()
    with pytest.raises(CheckpointError, match="neither a DeepSpeed ZeRO checkpoint"):
        consolidate_checkpoint(tmp_path / "not_a_checkpoint")


# -- multi-process runs ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory) -> str:
    """A 4-layer Llama whose LM head is tied to the input embedding (as SmolLM2's), with the tiny tokenizer."""
    path = tmp_path_factory.mktemp("tied_llama")
    tokenizer = build_tiny_tokenizer(path)
    config = tiny_config("llama", 4, vocab_size=len(tokenizer))
    config.tie_word_embeddings = True
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(f"Line {i} of a small corpus about the weather in town." for i in range(200)))
    return path


def fit_args(model_dir: str, corpus: Path, run_dir: Path, batch_size: int, lora: bool, *extra: str) -> list[str]:
    recorder = {"class_path": "helpers.cpu_strategies.RunRecorder", "init_args": {"path": str(run_dir)}}
    return [
        "--model.model", model_dir,
        "--model.schedule", "SkipDecode",  # layer 1 of 4 is run by no column: the zero-gradient path
        "--model.schedule.max_layers", "3",
        "--model.schedule.min_layers", "2",
        "--model.schedule.decay_tokens", "6",
        "--model.schedule.prompt_depth", "max",
        "--model.optimizer.learning_rate", "1e-2",
        "--model.optimizer.lr_schedule", "constant",
        "--model.generation.num_batches", "0",
        *(["--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}"] if lora else []),
        "--data.task", "text",
        "--data.block_size", "16",
        "--data.data_files", f"{{train: {corpus}, validation: {corpus}}}",
        "--data.max_train_samples", "16",
        "--data.max_eval_samples", "4",
        "--data.batch_size", str(batch_size),
        "--trainer.accelerator", "cpu",
        "--trainer.max_steps", str(STEPS),
        "--trainer.gradient_clip_val", "0.1",  # active on every step: clipping must use the global norm
        "--trainer.limit_val_batches", "1",
        "--trainer.num_sanity_val_steps", "1",
        "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", str(run_dir),
        "--trainer.logger", "CSVLogger",
        "--trainer.logger.save_dir", str(run_dir),
        "--seed_everything", "3",
        f"--trainer.callbacks+={json.dumps(recorder)}",
        *extra,
    ]


def torchrun(args: list[str], run_dir: Path, nprocs: int = 2) -> None:
    """``torchrun --standalone --nproc-per-node N -m skiptrain fit ...``; every rank must exit with status 0."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        "DS_ACCELERATOR": "cpu",  # DeepSpeed's CPU accelerator even where a GPU is visible
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
               "-m", "skiptrain", "fit", *args, "--trainer.devices", str(nprocs)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "output.txt").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}"


def records(run_dir: Path, world_size: int) -> list[dict]:
    found = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(world_size)]
    assert all(len(r["losses"]) == STEPS and r["world_size"] == world_size for r in found)
    return found


def rank_mean_losses(found: list[dict]) -> list[float]:
    return [sum(r["losses"][i] for r in found) / len(found) for i in range(STEPS)]


def final_checkpoint(run_dir: Path) -> Path:
    (path,) = sorted(run_dir.rglob("*.ckpt"))
    return path


DDP = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"find_unused_parameters": False}}


@pytest.fixture(scope="module")
def single(tied_model_dir, corpus, tmp_path_factory):
    """One-process reference runs, in-process: ``run(lora, *extra_args)`` -> its record and final state dict.

    The reference runs DDP with world size 1: under any distributed strategy Lightning wraps the data module's
    sampler in a ``DistributedSamplerWrapper`` that re-shuffles positions, so the plain one-device order differs;
    with one replica the wrapper yields exactly the global batches of the two-rank runs (checked row by row).
    """
    made = {}

    def run(lora: bool, *extra: str) -> dict[str, Any]:
        if (lora, extra) not in made:
            run_dir = tmp_path_factory.mktemp("single_lora" if lora else "single_full")
            environ = dict(os.environ)  # Lightning's launcher exports MASTER_PORT, WORLD_SIZE, ... for its children
            try:
                main(["fit", *fit_args(tied_model_dir, corpus, run_dir, 4, lora, *extra),
                      "--trainer.strategy", json.dumps(DDP), "--trainer.devices", "1"])
            finally:
                if torch.distributed.is_initialized():
                    torch.distributed.destroy_process_group()
                os.environ.clear()
                os.environ.update(environ)
            (record,) = records(run_dir, 1)
            made[lora, extra] = {**record, "state": consolidate_checkpoint(final_checkpoint(run_dir))}
        return made[lora, extra]

    return run


def test_the_global_batch_is_made_of_full_blocks(tied_model_dir, corpus):
    """Precondition of the exact comparison: every row has the same number of target tokens."""
    from skiptrain.data.datamodule import SkipDataModule

    data = SkipDataModule(task="text", tokenizer=tied_model_dir, block_size=16, max_train_samples=16,
                          data_files={"train": str(corpus), "validation": str(corpus)})
    data.setup("fit")
    assert {len(row["target_ids"]) for row in data.datasets["train"]} == {16}


def check_run(run_dir: Path, lora: bool, single, tied_model_dir: str, *extra: str) -> list[dict]:
    """Rank-mean losses and consolidated final weights equal the single-process run's; the export keys too."""
    found = records(run_dir, 2)
    reference = single(lora, *extra)
    reference_state = reference["state"]
    for step, rows in enumerate(reference["rows"]):  # precondition: the ranks split the single process's batches
        assert sorted(found[0]["rows"][step] + found[1]["rows"][step]) == sorted(rows), f"step {step}"
    assert rank_mean_losses(found) == pytest.approx(reference["losses"], abs=LOSS_TOLERANCE)
    assert found[0]["lrs"] == pytest.approx(reference["lrs"])
    assert found[0]["losses"] != found[1]["losses"], "the two ranks saw different rows"

    checkpoint = final_checkpoint(run_dir)
    module = SkipLM(model=tied_model_dir, schedule=RANK_SCHEDULE,
                    lora={"r": 4, "lora_alpha": 8, "lora_dropout": 0} if lora else None)
    module.configure_model()
    state = consolidate_checkpoint(checkpoint, reference=module)  # complete, right shapes, no placeholders
    assert set(state) == set(reference_state)
    for name, value in reference_state.items():
        assert torch.allclose(state[name].float(), value.float(), atol=WEIGHT_TOLERANCE), name
    module.load_state_dict(state)  # strict
    merged = module.model.merge_and_unload() if lora else module.model
    base = AutoModelForCausalLM.from_pretrained(tied_model_dir)
    assert {k: v.shape for k, v in merged.state_dict().items()} == {k: v.shape for k, v in base.state_dict().items()}
    assert checkpoint_metadata(checkpoint, weights_only=False)["global_step"] == STEPS
    # and the export subcommand reads the same checkpoint (sharded or not) into a plain transformers model
    fresh = SkipLM(model=tied_model_dir, schedule=RANK_SCHEDULE,
                   lora={"r": 4, "lora_alpha": 8, "lora_dropout": 0} if lora else None)
    exported = SkipTrainer(accelerator="cpu", logger=False).export(
        fresh, ckpt_path=str(checkpoint), weights_only=False, output_dir=str(run_dir / "export"))
    plain = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    for name, value in merged.state_dict().items():
        assert torch.equal(plain[name], value), name
    return found


def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tied_model_dir, corpus, single, tmp_path):
    torchrun(fit_args(tied_model_dir, corpus, tmp_path, 2, False, "--trainer.strategy", json.dumps(DDP)), tmp_path)
    check_run(tmp_path, False, single, tied_model_dir)
    assert checkpoint_layout(final_checkpoint(tmp_path)) == "file"


def test_fsdp_shards_every_decoder_layer_and_its_checkpoint_consolidates(tied_model_dir, corpus, single, tmp_path):
    strategy = {"class_path": "skiptrain.training.strategies.SkipFSDPStrategy"}
    torchrun(fit_args(tied_model_dir, corpus, tmp_path, 2, True, "--trainer.strategy", json.dumps(strategy),
                      "--model.activation_checkpointing", "true"), tmp_path)
    found = check_run(tmp_path, True, single, tied_model_dir)
    assert found[0]["layout"]["fsdp_units"] == {"SkipLM": 1, "LlamaDecoderLayer": 4}
    assert checkpoint_layout(final_checkpoint(tmp_path)) == "fsdp_sharded"


@requires_deepspeed
def test_deepspeed_zero2_matches_one_process_and_its_checkpoint_consolidates(tied_model_dir, corpus, single, tmp_path):
    strategy = {"class_path": "helpers.cpu_strategies.CPUDeepSpeedStrategy", "init_args": {"stage": 2}}
    torchrun(fit_args(tied_model_dir, corpus, tmp_path, 2, False, "--trainer.strategy", json.dumps(strategy)),
             tmp_path)
    found = check_run(tmp_path, False, single, tied_model_dir)
    assert found[0]["layout"]["zero3_params"] == 0 and found[0]["optimizer"] == "AdamW"
    assert checkpoint_layout(final_checkpoint(tmp_path)) == "deepspeed"


@requires_deepspeed
def test_deepspeed_zero3_partitions_weights_at_load_and_its_checkpoint_consolidates(
    tied_model_dir, corpus, single, tmp_path
):
    strategy = {"class_path": "helpers.cpu_strategies.CPUDeepSpeedStrategy", "init_args": {"stage": 3}}
    torchrun(fit_args(tied_model_dir, corpus, tmp_path, 2, True, "--trainer.strategy", json.dumps(strategy),
                      "--model.activation_checkpointing", "true"), tmp_path)
    found = check_run(tmp_path, True, single, tied_model_dir)
    layout = found[0]["layout"]
    assert layout["zero3_params"] > 0 and layout["zero3_local_numel"] < layout["zero3_full_numel"]
    checkpoint = final_checkpoint(tmp_path)
    # The per-rank model-state files hold only placeholders: read naively, they are refused by name.
    (states,) = sorted(checkpoint.glob("*/zero_pp_rank_0_mp_rank_00_model_states.pt"))
    module_state = torch.load(states, map_location="cpu", weights_only=False)["module"]
    torch.save({"state_dict": module_state}, tmp_path / "naive.ckpt")
    with pytest.raises(CheckpointError, match=r"zero-element tensors.*model\.base_model\.model\.model\.embed_tokens"):
        consolidate_checkpoint(tmp_path / "naive.ckpt")


@pytest.mark.slow
@requires_deepspeed
def test_deepspeed_zero3_offload_steps_deepspeed_cpu_adam_on_the_modules_schedule(
    tied_model_dir, corpus, single, tmp_path
):
    """Slow: JIT-compiles DeepSpeed's CPU Adam (about 3 minutes on 1 core the first time)."""
    strategy = {"class_path": "helpers.cpu_strategies.CPUDeepSpeedStrategy",
                "init_args": {"stage": 3, "offload_optimizer": True, "offload_parameters": True, "pin_memory": False}}
    # the swapped optimizer follows the schedule
    schedule = ("--model.optimizer.lr_schedule", "linear", "--model.optimizer.warmup_steps", "2")
    torchrun(fit_args(tied_model_dir, corpus, tmp_path, 2, False, *schedule, "--trainer.strategy",
                      json.dumps(strategy)), tmp_path)
    found = check_run(tmp_path, False, single, tied_model_dir, *schedule)
    assert found[0]["optimizer"] == "DeepSpeedCPUAdam"
    assert len(set(found[0]["lrs"])) == STEPS  # warm-up then linear decay: a new rate every step
