"""The command line's answer to user mistakes: one line naming the input, the right exit code, no traceback, nothing
written. One table of bad inputs, each run through the real CLI in-process on a tiny model; a few also as real
processes, to see what a console shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
from helpers.cli_args import tiny_args
from helpers.cli_runs import error_lines, run_cli, snapshot
from transformers import PreTrainedModel

import skiptrain.training.calibrate
from skiptrain.cli.app import DEBUG_VARIABLE, main
from skiptrain.cli.lightning_cli import SkipCLI
from skiptrain.core.schedules import ScheduleError
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.export.format import SCHEDULE_FILE
from skiptrain.training.module import SkipLM

USAGE, INPUT = 2, 1  # exit codes: an option or combination of options; an unusable input file
ERROR_PREFIX = "skiptrain {}: error: "


@dataclass(frozen=True)
class Inputs:
    """What the cases start from: a tiny model, a LoRA fit run's checkpoint, its merged and adapter exports."""

    model: str
    other_model: str  # the same family with 2 layers instead of 4
    ckpt: str
    export: str
    adapter: str


@pytest.fixture(scope="module")
def inputs(tiny_model_dir, tmp_path_factory) -> Inputs:
    root = tmp_path_factory.mktemp("inputs")
    model = tiny_model_dir("llama")
    main(["fit", *tiny_args(model, root / "fit", "--data.task", "builtin", "--data.max_train_samples", "4",
                            "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}",
                            "--model.generation.num_batches", "0",
                            "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1")])
    (ckpt,) = (root / "fit").rglob("*.ckpt")
    main(["export", "--model.model", model, "--ckpt_path", str(ckpt), "--output_dir", str(root / "export")])
    main(["export", "--model.model", model, "--ckpt_path", str(ckpt), "--output_dir", str(root / "adapter"),
          "--adapter_only", "true"])
    return Inputs(model, tiny_model_dir("llama", 2), str(ckpt), str(root / "export"), str(root / "adapter"))


# -- broken inputs, written under the case's own folder ---------------------------------------------------------------
def write(name: str, content: str | bytes) -> Callable[[Path, Inputs], None]:
    def prepare(tmp: Path, inputs: Inputs) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)

    return prepare


def copy_of(which: str, breaking: Callable[[Path], None]) -> Callable[[Path, Inputs], None]:
    """Copy ``inputs.<which>`` to ``tmp/<which>`` and break the copy."""

    def prepare(tmp: Path, inputs: Inputs) -> None:
        source = Path(getattr(inputs, which))
        target = tmp / which
        shutil.copytree(source, target) if source.is_dir() else shutil.copy(source, target)
        breaking(target)

    return prepare


def edit_schedule(**changes) -> Callable[[Path], None]:
    def breaking(export: Path) -> None:
        record = json.loads((export / SCHEDULE_FILE).read_text())
        (export / SCHEDULE_FILE).write_text(json.dumps({**record, **changes}))

    return breaking


def truncate(name: str) -> Callable[[Path], None]:
    def breaking(path: Path) -> None:
        file = path / name if name else path
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])

    return breaking


def delete(name: str) -> Callable[[Path], None]:
    return lambda export: (export / name).unlink()


def without_eos(model: Path) -> None:
    """A tokenizer with neither an EOS nor a pad token."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = model / name
        if path.is_file():
            config = json.loads(path.read_text())
            for key in ("eos_token", "pad_token"):
                config.pop(key, None)
            path.write_text(json.dumps(config))
    config = json.loads((model / "config.json").read_text())
    config.update(eos_token_id=None, pad_token_id=None)
    (model / "config.json").write_text(json.dumps(config))


# -- the table -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One bad input: the argv (``{model}``, ``{ckpt}``, ... ``{tmp}`` filled in), the exit code, what the one
    error line must say, and, for an input that only the expensive work can find bad, which step that is (every
    other case is refused with that work made to fail if it runs: :func:`no_expensive_work`)."""

    name: str
    argv: tuple[str, ...]
    code: int
    says: str
    prepare: Callable[[Path, Inputs], None] | None = None
    found_by: tuple[str, ...] = ()  # the expensive steps that run before the input is found bad
    needs: tuple[str, ...] = ()  # optional packages the refused option needs installed (skipped without them)


def fit(*extra: str, schedule: tuple[str, ...] = ("--model.schedule", "SkipDecode", "--model.schedule.min_layers",
                                                  "2")) -> tuple[str, ...]:
    """A one-step fit of the tiny model on the built-in task, into ``{tmp}/run``, with ``extra`` options."""
    args = tiny_args("{model}", Path("{tmp}/run"), "--data.task", "builtin", "--data.max_train_samples", "4",
                     "--trainer.max_steps", "1", "--model.generation.num_batches", "0")
    start = args.index("--model.schedule")
    args[start:start + 6] = schedule  # tiny_args' schedule: --model.schedule SkipDecode and two of its options
    return ("fit", *args, *extra)


def skipdecode(**params) -> tuple[str, ...]:
    return ("--model.schedule", "SkipDecode", *(a for k, v in params.items() for a in (f"--model.schedule.{k}", v)))


def family(name: str, **params) -> tuple[str, ...]:
    return ("--model.schedule", name, *(a for k, v in params.items() for a in (f"--model.schedule.{k}", v)))


READING_DATA = ("Trainer.fit", "reading the data")  # a fit reads its data inside Trainer.fit
BUILDING_THE_MODEL = ("building the model", "loading weights")


def data_file(name: str, content: str | bytes, *extra: str) -> dict:
    """A fit on a local file ``name`` holding ``content`` (summarisation columns ``article``/``highlights``)."""
    return dict(argv=fit("--data.task", "cnn_dailymail", "--data.data_files", f"{{train: {{tmp}}/{name}}}", *extra),
                prepare=write(name, content), found_by=READING_DATA)


def generate(*extra: str, model: str = "{export}") -> tuple[str, ...]:
    return ("generate", "--model.model", model, "--trainer.accelerator", "cpu", "--prompts", "{tmp}/prompts.txt",
            "--output", "{tmp}/out.jsonl", "--max_new_tokens", "4", *extra)


def with_prompts(content: str | bytes, *extra: str, name: str = "prompts.txt") -> dict:
    return dict(argv=generate("--prompts", f"{{tmp}}/{name}", *extra), prepare=write(name, content))


EXPORT_CALLBACK = '{"class_path": "skiptrain.callbacks.export.ExportCallback", "init_args": {"output_dir": "%s"}}'
ROWS = "article,highlights\n" + "".join(f"The council of town {i} met on Monday.,Town {i} met.\n" for i in range(4))


SMALL_DATA = ("--data.task", "builtin", "--data.max_source_tokens", "48", "--data.max_target_tokens", "24")
"""The built-in task, its examples short enough for the tiny models' context of 256 tokens."""


def export(*extra: str, ckpt: str = "{ckpt}") -> tuple[str, ...]:
    return ("export", "--model.model", "{model}", "--ckpt_path", ckpt, "--output_dir", "{tmp}/out", *extra)


def calibrate(*extra: str) -> tuple[str, ...]:
    """A calibration of the tiny model's base weights on the built-in task, into ``{tmp}/out``."""
    return ("calibrate", "--model.model", "{model}", *skipdecode(min_layers="2"), "--data.task", "builtin",
            "--data.max_eval_samples", "4", "--data.max_source_tokens", "48", "--data.max_target_tokens", "24",
            "--trainer.accelerator", "cpu", "--output_dir", "{tmp}/out", *extra)


def conformance(*extra: str) -> tuple[str, ...]:
    return ("conformance", "--model.model", "{export}", "--trainer.accelerator", "cpu", *extra)


def vectors_of_the_export(tmp: Path, inputs: Inputs) -> None:
    """A vectors file (no cases) for the export's own schedule, as ``{tmp}/v.json``."""
    schedule = json.loads((Path(inputs.export) / SCHEDULE_FILE).read_text())
    (tmp / "v.json").write_text(json.dumps({"format": "skiptrain.conformance", "version": 1,
                                            "skip_schedule": schedule, "max_new_tokens": 4, "cases": []}))


def without_tokenizer_files(export: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        (export / name).unlink(missing_ok=True)


LORA = ("--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}")
QUANTIZATION = ("--model.quantization", "{bits: 4, type: nf4}")
FSDP = json.dumps({"class_path": "skiptrain.training.strategies.SkipFSDPStrategy"})
ZERO3 = json.dumps({"class_path": "skiptrain.training.strategies.SkipDeepSpeedStrategy", "init_args": {"stage": 3}})

NO_VALID_GRID = "skipdecode: {min_layers: [3], max_layers: [2], decay_tokens: [4]}\n"


CASES = [
    # every schedule refusal, when the run starts (before its run directory is made)
    Case("skipdecode_warmup_zero", fit(schedule=skipdecode(warmup_layers="0")), USAGE, "warmup_layers=0"),
    Case("skipdecode_warmup_all", fit(schedule=skipdecode(warmup_layers="4")), USAGE, "warmup_layers=4"),
    Case("skipdecode_min_not_above_warmup", fit(schedule=skipdecode(min_layers="1")), USAGE, "min_layers=1"),
    Case("skipdecode_min_above_layers", fit(schedule=skipdecode(min_layers="5")), USAGE, "min_layers=5"),
    Case("skipdecode_max_above_layers", fit(schedule=skipdecode(min_layers="2", max_layers="5")), USAGE,
         "max_layers=5"),
    Case("skipdecode_max_below_min", fit(schedule=skipdecode(min_layers="3", max_layers="2")), USAGE,
         "max_layers=2"),
    Case("skipdecode_decay_zero", fit(schedule=skipdecode(min_layers="2", decay_tokens="0")), USAGE,
         "decay_tokens=0"),
    Case("skipdecode_prompt_depth", fit(schedule=skipdecode(min_layers="2", prompt_depth="some")), USAGE,
         "prompt_depth"),
    Case("hierarchical_no_boundaries", fit(schedule=family("Hierarchical", phase_boundaries="[]")), USAGE,
         "phase_boundaries=[]"),
    Case("hierarchical_unsorted_boundaries", fit(schedule=family("Hierarchical", phase_boundaries="[4, 2]")), USAGE,
         "phase_boundaries=[4, 2]"),
    Case("hierarchical_max_level_zero", fit(schedule=family("Hierarchical", max_level="0")), USAGE, "max_level=0"),
    Case("hierarchical_stride_too_wide", fit(schedule=family("Hierarchical", phase_boundaries="[0, 2]")), USAGE,
         "max_level=2"),
    Case("hierarchical_warmup_all", fit(schedule=family("Hierarchical", warmup_layers="4")), USAGE,
         "warmup_layers=4"),
    Case("static_neither_layers_nor_depth", fit(schedule=family("Static")), USAGE, "layers/depth"),
    Case("static_depth_one", fit(schedule=family("Static", depth="1")), USAGE, "depth=1"),
    Case("static_depth_above_layers", fit(schedule=family("Static", depth="5")), USAGE, "depth=5"),
    Case("static_layers_without_zero", fit(schedule=family("Static", layers="[1, 2]")), USAGE,
         "a set containing layer 0"),
    Case("static_layers_out_of_range", fit(schedule=family("Static", layers="[0, 7]")), USAGE,
         "layer indices in [0, 3]"),
    Case("schedule_missing", fit(schedule=()), USAGE, "model.schedule is required"),
    Case("schedule_unknown_family", fit(schedule=family("Turbo")), USAGE, "Turbo"),
    # configuration
    Case("unknown_option", fit("--model.schedule.min_layer", "3"), USAGE, "min_layer"),
    Case("lr_schedule", fit("--model.optimizer.lr_schedule", "step"), USAGE, "lr_schedule"),
    Case("learning_rate", fit("--model.optimizer.learning_rate", "-1"), USAGE, "learning_rate=-1"),
    Case("distillation_temperature", fit("--model.distillation", "{temperature: 0}"), USAGE,
         "distillation.temperature=0"),
    Case("distillation_hidden_weight", fit("--model.distillation", "{hidden_weight: -1}"), USAGE,
         "distillation.hidden_weight=-1"),
    Case("base_teacher_without_lora", fit("--model.distillation", "{teacher: base}"), USAGE,
         "teacher='base' needs lora"),
    Case("init_from_missing", fit("--model.init_from", "{tmp}/nope.ckpt"), USAGE, "init_from="),
    Case("task", fit("--data.task", "poetry"), USAGE, "task='poetry'"),
    Case("prompt_template", fit("--data.prompt_template", "no placeholder"), USAGE, "prompt_template"),
    Case("data_batch_size", fit("--data.batch_size", "0"), USAGE, "batch_size must be >= 1"),
    Case("chat_template_without_one", fit("--data.chat_template", "true"), USAGE,
         "chat_template=true needs a tokenizer with a chat template"),
    Case("system_message_without_chat_template", fit("--data.system_message", "Be brief."), USAGE,
         "system_message='Be brief.' needs chat_template=true"),
    Case("prompt_template_repeated_field", fit("--data.prompt_template", "{source} and {source}"), USAGE,
         "names ['source'] more than once"),
    Case("template_longer_than_max_source", fit("--data.max_source_tokens", "2"), USAGE, "max_source_tokens=2"),
    Case("target_beyond_the_context", fit("--data.max_target_tokens", "500"), USAGE,
         "exceeds the model's context length of 256"),
    Case("unavailable_accelerator", fit("--trainer.accelerator", "cuda"), USAGE, "accelerator"),
    Case("precision", fit("--trainer.precision", "7"), USAGE, "precision"),
    Case("model_dtype", fit("--model.dtype", "float8"), USAGE, "dtype"),
    Case("lora_rank_zero", fit("--model.lora", "{r: 0}"), USAGE, "lora.r=0"),
    Case("lora_dropout_one", fit("--model.lora", "{lora_dropout: 1}"), USAGE, "lora.lora_dropout=1"),
    Case("lora_target_unknown", fit("--model.lora", "{target_modules: [nonexistent_proj]}"), USAGE,
         "['nonexistent_proj'] match no linear layer of model_type='llama': allowed ['down_proj', 'gate_proj', "
         "'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', 'v_proj']"),
    Case("lora_former_name", fit("--model.lora", "{r: 4, alpha: 8}"), USAGE,
         "lora.alpha is now lora.lora_alpha (peft LoraConfig's name)"),
    Case("lora_not_a_field", fit("--model.lora", "{rank: 4}"), USAGE,
         "lora.rank is not a field of peft's LoraConfig: allowed ['r', 'target_modules',"),
    Case("lora_regex_matches_nothing", fit("--model.lora", "{target_modules: '.*nothing_proj'}"), USAGE,
         "lora.target_modules='.*nothing_proj' is invalid: the regex matches no module of model_type='llama'"),
    Case("moved_option", fit("--model.learning_rate", "0.1"), USAGE,
         "model.learning_rate is now model.optimizer.learning_rate"),
    Case("moved_option_in_config", fit("--config", "{tmp}/old.yaml"), USAGE,
         "model.warmup_steps is now model.optimizer.warmup_steps", write("old.yaml", "model:\n  warmup_steps: 3\n")),
    Case("optimizer", fit("--optimizer", "torch.optim.SGD", "--optimizer.lr", "0.1"), USAGE,
         "--optimizer is not an option of skiptrain: the optimizer is AdamW"),
    Case("lr_scheduler", fit("--lr_scheduler=StepLR"), USAGE, "--lr_scheduler is not an option of skiptrain"),
    Case("ckpt_path_lightning_keyword", export(ckpt="hpc"), USAGE, "ckpt_path='hpc' is not supported"),
    Case("ckpt_path_last_without_one", export("--trainer.default_root_dir", "{tmp}", ckpt="last"), INPUT,
         "ckpt_path='last': no last.ckpt under trainer.default_root_dir="),
    Case("export_callback_target_not_empty", fit(f"--trainer.callbacks+={EXPORT_CALLBACK % '{tmp}/out'}"), USAGE,
         "exists and is not empty", write("out/keep.txt", "precious")),
    # QLoRA (model.quantization)
    Case("quantization_without_lora", fit(*QUANTIZATION), USAGE, "model.quantization needs model.lora"),
    Case("quantization_type", fit(*LORA, "--model.quantization", "{bits: 4, type: int4}"), USAGE,
         """Parser key "type": Expected a typing.Literal['nf4', 'fp4']. Got value: int4"""),
    Case("quantization_bits", fit(*LORA, "--model.quantization", "{bits: 3}"), USAGE,
         'Parser key "bits": Expected a typing.Literal[4, 8]. Got value: 3'),
    Case("quantization_under_fsdp", fit(*LORA, *QUANTIZATION, "--trainer.strategy", FSDP), USAGE,
         "model.quantization is not supported with trainer.strategy=SkipFSDPStrategy", needs=("bitsandbytes",)),
    Case("quantization_under_zero3", fit(*LORA, *QUANTIZATION, "--trainer.strategy", ZERO3), USAGE,
         "model.quantization is not supported with trainer.strategy=SkipDeepSpeedStrategy",
         needs=("bitsandbytes", "deepspeed")),
    # Lightning's other subcommands and evaluate refuse as fit does
    Case("validate_schedule", ("validate", *fit(schedule=skipdecode(min_layers="5"))[1:]), USAGE, "min_layers=5"),
    Case("test_lora_rank", ("test", *fit("--model.lora", "{r: 0}")[1:]), USAGE, "lora.r=0"),
    Case("predict_lora_target", ("predict", *fit("--model.lora", "{target_modules: [wq]}")[1:]), USAGE,
         "['wq'] match no linear layer"),
    Case("evaluate_export_beyond_its_context", ("evaluate", "--model.model", "{export}", "--data.task", "builtin",
                                                "--data.max_target_tokens", "500", "--trainer.accelerator", "cpu"),
         USAGE, "exceeds the model's context length of 256"),
    # models
    Case("model_path_missing", ("fit", *fit()[1:], "--model.model", "/nonexistent/model"), INPUT,
         "model='/nonexistent/model': no such file or directory"),
    Case("model_dir_not_a_model", ("fit", *fit()[1:], "--model.model", "{tmp}/empty"), INPUT,
         "neither a Hugging Face model directory nor a skiptrain export", write("empty/notes.txt", "")),
    Case("model_hub_id_offline", ("fit", *fit()[1:], "--model.model", "nobody/no-such-model"), INPUT,
         "bundled offline model 'smollm2-135m-instruct'"),
    Case("tokenizer_without_eos_or_pad", ("fit", *fit()[1:], "--model.model", "{tmp}/model"), INPUT,
         "has no eos_token", copy_of("model", without_eos)),
    # data
    Case("data_file_missing", fit("--data.task", "cnn_dailymail", "--data.data_files", "{train: {tmp}/nope.csv}"),
         INPUT, "nope.csv does not exist", found_by=READING_DATA),
    Case("data_wrong_columns", **data_file("news.csv", "text,summary\na,b\n"), code=INPUT,
         says="missing column(s) ['article', 'highlights']"),
    Case("data_empty_split", **data_file("news.csv", "article,highlights\n"), code=INPUT, says="is empty"),
    Case("data_no_usable_rows", **data_file("news.csv", 'article,highlights\n" ",x\n'), code=INPUT,
         says="no usable rows"),
    Case("data_binary_file", **data_file("news.csv", bytes(range(256)) * 8), code=INPUT, says="could not be read"),
    Case("data_bad_encoding", **data_file("news.csv", ROWS.encode() + "caf\xe9,x\n".encode("latin-1")), code=INPUT,
         says="could not be read"),
    Case("data_unsupported_extension", **data_file("news.xlsx", ROWS), code=INPUT, says="unsupported extension"),
    Case("data_without_a_template_column", **data_file("news.csv", ROWS, "--data.prompt_template",
                                                       "{article} by {author}"), code=INPUT,
         says="the prompt template names column(s) ['author'] that the data lacks"),
    Case("data_training_split_missing",
         fit("--data.task", "cnn_dailymail", "--data.data_files", "{validation: {tmp}/news.csv}"), INPUT,
         "split 'train' not in data_files", write("news.csv", ROWS), READING_DATA),
    # checkpoints
    Case("ckpt_missing", export(ckpt="{tmp}/nope.ckpt"), INPUT, "no such file or directory"),
    Case("ckpt_truncated", export(ckpt="{tmp}/ckpt"), INPUT, "truncated", copy_of("ckpt", truncate(""))),
    Case("ckpt_not_a_checkpoint", export(ckpt="{tmp}/notes.ckpt"), INPUT, "not a torch checkpoint",
         write("notes.ckpt", "hello")),
    Case("ckpt_of_another_architecture", ("export", "--model.model", "{other_model}", "--ckpt_path", "{ckpt}",
                                          "--output_dir", "{tmp}/out"), INPUT, "does not match",
         found_by=BUILDING_THE_MODEL),
    # exports
    Case("export_bad_json", generate(model="{tmp}/export"), INPUT, "is not valid JSON",
         copy_of("export", lambda e: (e / SCHEDULE_FILE).write_text('{"format": '))),
    Case("export_unknown_schema_version", generate(model="{tmp}/export"), INPUT, "schema_version=2 is not supported",
         copy_of("export", edit_schedule(schema_version=2))),
    Case("export_layers_not_nested", generate(model="{tmp}/export"), INPUT, "(nesting)",
         copy_of("export", edit_schedule(executed_layers=[[0, 3], [0, 2, 3]]))),
    Case("export_layer_count_mismatch", generate(model="{tmp}/export"), INPUT, "does not match the model's 4",
         copy_of("export", edit_schedule(num_layers=3, prompt_layers=[0, 1, 2], executed_layers=[[0, 2]],
                                         family="custom", params={}))),
    Case("export_weights_missing", generate(model="{tmp}/export"), INPUT, "its weights are missing",
         copy_of("export", delete("model.safetensors"))),
    Case("export_weights_truncated", generate(model="{tmp}/export"), INPUT, "is truncated or corrupt",
         copy_of("export", truncate("model.safetensors"))),
    Case("export_schedule_lost", generate(model="{tmp}/export"), INPUT, "has lost its schedule",
         copy_of("export", delete(SCHEDULE_FILE))),
    Case("adapter_export_base_missing", generate(model="{tmp}/adapter"), INPUT, "no such file or directory",
         copy_of("adapter", edit_schedule(base_model="/nonexistent/base"))),
    # prompts and generation options
    Case("prompts_missing", generate("--prompts", "{tmp}/nope.txt"), INPUT, "prompts="),
    Case("prompts_bad_json_line", **with_prompts('{"prompt": "a"}\n{"prompt": \n', name="p.jsonl"), code=INPUT,
         says="line 2: not valid JSON"),
    Case("prompts_without_prompt_field", **with_prompts('{"text": "a"}\n', name="p.jsonl"), code=INPUT,
         says="line 1: expected an object with a string 'prompt' field"),
    Case("prompts_empty", **with_prompts("\n\n"), code=INPUT, says="no prompts"),
    Case("prompts_binary", **with_prompts(bytes(range(128, 256))), code=INPUT, says="cannot be read as UTF-8"),
    Case("prompt_beyond_the_context", **with_prompts("word " * 400 + "\n", "--raw_prompts", "true"), code=INPUT,
         says="exceeds the model's context length of 256 tokens"),  # a source would be trimmed in its template
    Case("prompt_missing_a_template_field", **with_prompts('{"template": {"name": "x"}}\n', name="prompts.jsonl"),
         code=USAGE, says="missing field(s) ['source'] for the template"),
    Case("raw_prompts_not_a_boolean", generate("--raw_prompts", "maybe"), USAGE, "raw_prompts"),
    Case("max_new_tokens_zero", generate("--max_new_tokens", "0"), USAGE, "max_new_tokens=0"),
    Case("max_new_tokens_fill_the_context", generate("--max_new_tokens", "256"), USAGE, "max_new_tokens=256"),
    Case("generate_batch_size_zero", generate("--batch_size", "0"), USAGE, "batch_size=0"),
    Case("sampling_temperature", generate("--sampling.do_sample", "true", "--sampling.temperature", "0"), USAGE,
         "temperature=0"),
    Case("sampling_top_p", generate("--sampling.top_p", "1.5"), USAGE, "top_p=1.5"),
    Case("sampling_block_repeated_ngrams", generate("--sampling.block_repeated_ngrams", "-1"), USAGE,
         "block_repeated_ngrams=-1 is invalid: allowed >= 0"),
    Case("block_repeated_ngrams_with_speculative", generate("--speculative", "2", "--sampling.block_repeated_ngrams",
                                                            "3"), USAGE,
         "sampling.block_repeated_ngrams=3 is invalid with speculative decoding: allowed 0"),
    Case("long_prompts_choice", generate("--long_prompts", "cut"), USAGE, "long_prompts"),
    Case("export_with_a_checkpoint", generate("--ckpt_path", "{ckpt}"), USAGE, "is an export"),
    Case("speculative_negative", generate("--speculative", "-1"), USAGE,
         "speculative=-1 is invalid with max_new_tokens=4: allowed 0 <= speculative <= 4"),
    Case("speculative_above_max_new_tokens", generate("--speculative", "5"), USAGE, "speculative=5 is invalid"),
    Case("speculative_with_dense", generate("--speculative", "2", "--dense", "true"), USAGE,
         "dense=true is invalid with speculative=2"),
    Case("draft_schedule_without_speculative", generate("--draft_schedule", "{tmp}/prompts.txt"), USAGE,
         "is invalid without speculative"),
    Case("draft_schedule_missing", generate("--speculative", "2", "--draft_schedule", "{tmp}/nope.yaml"), INPUT,
         "draft_schedule='"),
    Case("draft_schedule_unreadable", generate("--speculative", "2", "--draft_schedule", "{tmp}/draft.yaml"), INPUT,
         "draft_schedule=", write("draft.yaml", "class_path: [")),
    Case("draft_schedule_wrong_layer_count", generate("--speculative", "2", "--draft_schedule", "{tmp}/draft.yaml"),
         USAGE, "draft_schedule=", write("draft.yaml", "class_path: skiptrain.Static\ninit_args: {layers: [0, 9]}\n")),
    Case("draft_confidence_without_speculative", generate("--draft_confidence", "0.5"), USAGE,
         "draft_confidence=0.5 is invalid without speculative"),
    Case("draft_confidence_not_below_one", generate("--speculative", "2", "--draft_confidence", "1.0"), USAGE,
         "draft_confidence=1.0 is invalid: allowed 0 <= draft_confidence < 1"),
    Case("draft_vocab_without_speculative", generate("--draft_vocab", "{tmp}/prompts.txt"), USAGE,
         "draft_vocab='"),
    Case("draft_vocab_missing", generate("--speculative", "2", "--draft_vocab", "{tmp}/nope.json"), INPUT,
         "draft_vocab='"),
    Case("draft_vocab_not_token_ids", generate("--speculative", "2", "--draft_vocab", "{tmp}/vocab.json"), INPUT,
         "is not a draft vocabulary: allowed distinct token ids", write("vocab.json", "[3, 3]")),
    Case("draft_vocab_beyond_the_vocabulary", generate("--speculative", "2", "--draft_vocab", "{tmp}/vocab.json"),
         INPUT, "is not a draft vocabulary: allowed distinct token ids in [0, ", write("vocab.json", "[3, 100000]")),
    Case("generate_export_without_tokenizer", generate(model="{tmp}/export"), INPUT, "has no tokenizer files",
         copy_of("export", without_tokenizer_files)),
    # calibration options: derived limits are checked before the model is profiled
    Case("calibrate_target_beyond_the_depth", calibrate("--targets", "[100]"), USAGE,
         "targets=[100.0] are invalid for a model of 4 decoder layers: allowed ideal speedups 1 <= target <= 2.00"),
    Case("calibrate_target_below_one", calibrate("--targets", "[0.5]"), USAGE, "target=0.5 is invalid"),
    Case("calibrate_grid_without_a_valid_schedule", calibrate("--grid", "{tmp}/g.yaml"), USAGE,
         "has no valid schedule for 4 decoder layers", write("g.yaml", NO_VALID_GRID)),
    Case("calibrate_grid_unreadable", calibrate("--grid", "{tmp}/g.yaml"), INPUT, "grid=",
         write("g.yaml", "skipdecode: [")),
    Case("calibrate_grid_missing", calibrate("--grid", "{tmp}/nope.yaml"), INPUT, "nope.yaml"),
    Case("calibrate_unknown_family", calibrate("--families", "[turbo]"), USAGE, "families=['turbo'] is invalid"),
    Case("calibrate_num_batches_zero", calibrate("--num_batches", "0"), USAGE, "num_batches=0"),
    Case("calibrate_per_target_zero", calibrate("--per_target", "0"), USAGE, "per_target=0"),
    Case("calibrate_target_not_empty", calibrate(), USAGE, "exists and is not empty", write("out/keep.txt", "x")),
    # conformance
    Case("conformance_vectors_missing", conformance("--vectors", "{tmp}/nope.json", "--check", "{tmp}/e.jsonl"),
         INPUT, "vectors='", write("e.jsonl", '{"id": 0, "token_ids": [1]}\n')),
    Case("conformance_check_missing", conformance("--vectors", "{tmp}/v.json", "--check", "{tmp}/nope.jsonl"),
         INPUT, "check='", vectors_of_the_export),
    Case("conformance_top_zero", conformance("--vectors", "{tmp}/v.json", "--prompts", "{tmp}/prompts.txt",
                                             "--top", "0"), USAGE, "top=0"),
    # export options
    Case("export_draft_vocab_size_zero", export("--draft_vocab_size", "0", *SMALL_DATA), USAGE,
         "draft_vocab_size=0 is invalid: allowed 1 <= draft_vocab_size <= "),
    Case("export_draft_vocab_size_beyond_the_vocabulary", export("--draft_vocab_size", "100000", *SMALL_DATA), USAGE,
         "draft_vocab_size=100000 is invalid: allowed 1 <= draft_vocab_size <= "),
    Case("export_draft_vocab_size_without_data", export("--draft_vocab_size", "8"), USAGE,
         "draft_vocab_size=8 needs the run's data"),
    Case("export_target_not_empty", export(), USAGE, "exists and is not empty", write("out/keep.txt", "precious")),
    Case("export_target_is_a_file", export(), USAGE, "is a file, not a directory", write("out", "a file")),
    Case("adapter_only_without_lora", ("export", "--model.model", "{model}", "--model.schedule", "SkipDecode",
                                       "--model.schedule.min_layers", "2", "--output_dir", "{tmp}/out",
                                       "--adapter_only", "true"), USAGE, "adapter_only=True needs a LoRA model"),
]


def test_the_battery_is_large_and_names_are_unique():
    assert len(CASES) >= 50
    assert len({case.name for case in CASES}) == len(CASES)


def forbidden(step: str) -> Callable[..., None]:
    def called(*args, **kwargs) -> None:
        raise AssertionError(f"{step} ran before the bad input was refused")

    return called


EXPENSIVE_STEPS = {
    "loading weights": (PreTrainedModel, "from_pretrained"),  # decoding and profiling need weights
    "building the model": (SkipLM, "configure_model"),
    "reading the data": (SkipDataModule, "setup"),
    "profiling layers": (skiptrain.training.calibrate, "layer_importance"),
    "scoring schedules": (skiptrain.training.calibrate, "schedule_loss"),
    **{f"Trainer.{stage}": (L.Trainer, stage) for stage in ("fit", "validate", "test", "predict")},
}
"""What costs minutes on a real model, each replaced by :func:`no_expensive_work` with a function that fails."""


def no_expensive_work(monkeypatch, allowed: tuple[str, ...] = ()) -> None:
    """Make every step of :data:`EXPENSIVE_STEPS` but those ``allowed`` fail if it is called."""
    for step, (owner, name) in EXPENSIVE_STEPS.items():
        if step not in allowed:
            fail = forbidden(step)
            monkeypatch.setattr(owner, name, classmethod(fail) if name == "from_pretrained" else fail)


def test_every_subcommand_refuses_before_the_expensive_work():
    """Each subcommand has bad inputs refused with the expensive steps made to fail (the battery below)."""
    assert all(step in EXPENSIVE_STEPS for case in CASES for step in case.found_by)
    early = {case.argv[0] for case in CASES if not case.found_by}
    assert early == set(SkipCLI.subcommands())


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_bad_input_gets_one_line_the_exit_code_and_writes_nothing(case, inputs, tmp_path, capsys, monkeypatch):
    for package in case.needs:
        pytest.importorskip(package, reason=f"{case.name} is refused where {package} is installed")
    (tmp_path / "prompts.txt").write_text("Forecast:\n")  # what generate reads unless the case says otherwise
    if case.prepare is not None:
        case.prepare(tmp_path, inputs)
    before = snapshot(tmp_path)
    argv = [fill(arg, {"tmp": str(tmp_path), **vars(inputs)}) for arg in case.argv]
    no_expensive_work(monkeypatch, allowed=case.found_by)
    code, stderr = run_cli(argv, capsys)
    lines = error_lines(stderr)
    assert "Traceback" not in stderr, stderr
    assert code == case.code, stderr
    assert len(lines) == 1, stderr
    assert case.says in lines[0], lines[0]
    if not lines[0].startswith("error: "):  # the parser's own errors follow its usage text
        assert lines[0].startswith(ERROR_PREFIX.format(case.argv[0])), lines[0]
    assert snapshot(tmp_path) == before, "the failed command wrote or removed files"


def fill(arg: str, values: dict[str, str]) -> str:
    """``arg`` with ``{model}``, ``{tmp}``, ... replaced (other braces, e.g. YAML flow mappings, kept)."""
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def test_debug_shows_the_traceback(inputs, tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_VARIABLE, "1")
    with pytest.raises(ScheduleError, match="min_layers=5"):
        main([fill(arg, {"tmp": str(tmp_path), **vars(inputs)}) for arg in fit(schedule=skipdecode(min_layers="5"))])


def test_a_bug_keeps_its_traceback(inputs, tmp_path):
    crash = '{"class_path": "helpers.interrupt.CrashAtEpoch", "init_args": {"epoch": 0}}'
    with pytest.raises(RuntimeError, match="simulated crash"):
        main([fill(arg, {"tmp": str(tmp_path), **vars(inputs)}) for arg in fit(f"--trainer.callbacks+={crash}")])


@pytest.mark.parametrize(("argv", "code", "says"), [
    (fit(schedule=skipdecode(min_layers="25")), USAGE, "skiptrain fit: error: min_layers=25 is invalid"),
    (("export", "--model.model", "{model}", "--ckpt_path", "{tmp}/nope.ckpt", "--output_dir", "{tmp}/out"), INPUT,
     "skiptrain export: error: checkpoint"),
], ids=["usage", "input"])
def test_the_console_shows_one_line_and_no_traceback(argv, code, says, inputs, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), str(Path(__file__).parent)])}
    env.pop(DEBUG_VARIABLE, None)
    done = subprocess.run([sys.executable, "-m", "skiptrain", *(fill(a, {"tmp": str(tmp_path), **vars(inputs)})
                                                                for a in argv)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = error_lines(done.stderr)
    assert line.startswith(says), done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_a_long_prompt_is_truncated_on_request(inputs, tmp_path):
    (tmp_path / "prompts.txt").write_text("word " * 400 + "\nForecast:\n")
    with pytest.warns(UserWarning, match=r"prompt 1 has \d+ tokens; truncated to its last 252"):
        main([fill(arg, {"tmp": str(tmp_path), **vars(inputs)}) for arg in generate("--long_prompts", "truncate",
                                                                                   "--raw_prompts", "true")])
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["prompt"] == "Forecast:"
    assert rows[0]["prompt"].endswith("word ") and len(rows[0]["prompt"]) < 400 * len("word ")
