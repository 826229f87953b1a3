"""``skiptrain generate`` on an export, without Lightning: its own parser, one checked request, the decode driver.

The options keep the names LightningCLI gave the ``generate`` subcommand (``--model.model``, ``--prompts``,
``--sampling.top_p``, ``--trainer.precision``, ...), and ``--config`` files are read as they were: a run's
``config.yaml`` or a recipe may be given, and only the keys below are taken from it. ``--help`` lists these options
only. A model that is not an export, or a ``--ckpt_path``, needs the training stack to rebuild the run's module:
:func:`wants_training_stack` tells :func:`skiptrain.cli.app.main` to hand such a command to LightningCLI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from skiptrain.core.schedule_files import schedule_from_file
from skiptrain.errors import InputError, UsageError
from skiptrain.export.format import is_export, read_record
from skiptrain.export.hub import hub_export
from skiptrain.export.load import load_exported
from skiptrain.export.verify import export_config
from skiptrain.frontends.decode import Decoder
from skiptrain.frontends.inference import prepare_prompts, run_request
from skiptrain.frontends.prompts import STDIO, LongPrompts, chosen_prompt_format
from skiptrain.frontends.request import DEFAULT_MAX_NEW_TOKENS, GenerationRequest
from skiptrain.modeling.generation import SamplingConfig
from skiptrain.modeling.loading import context_length, load_tokenizer
from skiptrain.modeling.precision import compute_dtype
from skiptrain.shipped.draft_head import DRAFT_VOCAB_FILE
from skiptrain.training.precision import resolve_precision

PROGRAM = "skiptrain generate"
DESCRIPTION = ("Complete prompts with a skiptrain export under its skip schedule: batched, KV-cached, JSON lines out "
               "(or one --prompt streamed to the terminal), with its speed.")


def parser() -> ArgumentParser:
    """The options of ``skiptrain generate`` (docs/cli.md, "Generate")."""
    p = ArgumentParser(prog=PROGRAM, description=DESCRIPTION, exit_on_error=False, parser_mode="yaml",
                       default_meta=False)
    p.add_argument("--config", action=ActionConfigFile, help="a YAML file of these options (a run's config.yaml too)")
    p.add_argument("--model.model", type=str, required=True, help="the export directory")
    p.add_argument("--model.attn_implementation", type=Literal["sdpa", "eager"], default="sdpa")
    p.add_argument("--model.generation.max_new_tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help="the default of --max_new_tokens")
    p.add_argument("--model.generation.sampling", type=SamplingConfig | None, default=None,
                   help="the default of --sampling")
    p.add_argument("--ckpt_path", type=str | None, default=None,
                   help="a Lightning checkpoint of a fit run, with a base model and the run's --config")
    p.add_argument("--weights_only", type=bool | None, default=None, help="how --ckpt_path is unpickled")
    p.add_argument("--prompts", type=str, default=STDIO,
                   help=".jsonl file (prompt, template or messages per line), text file (a prompt per line), or -")
    p.add_argument("--prompt", type=str | None, default=None, help="one prompt, streamed to the terminal")
    p.add_argument("--stop", type=list[str], default=[], help="strings that end a completion, e.g. '[\"\\n\"]'")
    p.add_argument("--output", type=str, default=STDIO, help="JSON-lines file of completions, or - for stdout")
    p.add_argument("--max_new_tokens", type=int | None, default=None,
                   help="tokens per prompt at most; default --model.generation.max_new_tokens")
    p.add_argument("--batch_size", type=int, default=8, help="prompts decoded together")
    p.add_argument("--sampling", type=SamplingConfig | None, default=None,
                   help="greedy by default; default --model.generation.sampling")
    p.add_argument("--dense", type=bool, default=False, help="decode with every layer, ignoring the schedule")
    p.add_argument("--compare_dense", type=bool, default=False,
                   help="also time the prompts densely at equal work and report the measured speedup")
    p.add_argument("--long_prompts", type=LongPrompts, default="refuse",
                   help="a prompt that leaves no room for --max_new_tokens: refuse, or truncate with a warning")
    p.add_argument("--speculative", type=int, default=0,
                   help="K >= 1: lossless, the full-depth output with K tokens drafted per verification")
    p.add_argument("--draft_schedule", type=str | None, default=None,
                   help="with --speculative, draft under this schedule file instead of the export's")
    p.add_argument("--draft_vocab", type=str | None, default=None,
                   help="with --speculative, draft over the token ids of this JSON file instead of the export's "
                        "draft_vocab.json (if any)")
    p.add_argument("--draft_confidence", type=float, default=0.0,
                   help="with --speculative, a row stops drafting after a draft less probable than this (0: off)")
    p.add_argument("--raw_prompts", type=bool, default=False,
                   help="use each prompt as it is, not as a source of the recorded prompt format")
    p.add_argument("--trainer.accelerator", type=str, default="auto", help="auto, cpu, gpu or cuda")
    p.add_argument("--trainer.precision", type=str | None, default=None,
                   help="e.g. 32-true, bf16-mixed, bf16-true or auto (what the device runs natively)")
    p.add_argument("--trainer.logger", type=Any, default=None, help="accepted for run configs; generate logs nothing")
    return p


# -- which stack runs the command ------------------------------------------------------------------------------
STACK_KEYS = {"model.model", "ckpt_path"}
"""The options that decide whether LightningCLI must run the command (:func:`wants_training_stack`)."""


def wants_training_stack(args: Sequence[str]) -> bool:
    """Whether a ``generate`` command needs LightningCLI: a ``--ckpt_path``, or a model that is not an export.

    Read from the command line and its ``--config`` files (later ones win) without parsing: ``--help`` and an
    export stay on this module's parser, which refuses what it does not know.
    """
    if any(arg in ("-h", "--help") for arg in args):
        return False
    found: dict[str, Any] = {}
    for name, value in _named_values(args):
        if name == "--config":
            try:
                found.update(_dotted(_keep(_yaml_file(value), STACK_KEYS)))
            except InputError:
                pass  # the parser refuses it, by name
        elif name[2:] in STACK_KEYS:
            found[name[2:]] = value
    model = found.get("model.model")
    return bool(found.get("ckpt_path")) or (model is not None and not is_export(_local(str(model))))


def _named_values(args: Sequence[str]) -> list[tuple[str, str]]:
    """``(--name, value)`` pairs of ``args``, from ``--name value`` and ``--name=value``."""
    pairs = []
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            pairs.append((name, value))
        elif arg.startswith("--") and i + 1 < len(args):
            pairs.append((arg, args[i + 1]))
    return pairs


def _known_options(args: Sequence[str], known: set[str]) -> list[str]:
    """``args`` with each ``--config FILE`` replaced by the YAML of the keys of ``known`` (dotted) it holds: a run's
    config.yaml configures training too."""
    kept, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name, _, value = arg.partition("=")
        if name == "--config":
            if not value:
                value, skip = (args[i + 1] if i + 1 < len(args) else ""), True
            kept += ["--config", yaml.safe_dump(_keep(_yaml_file(value), known))]
        else:
            kept.append(arg)
    return kept


def _yaml_file(path: str) -> Mapping[str, Any]:
    """The mapping a YAML config file holds (empty for another document)."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as err:
        raise InputError(f"config={path!r}: no such file") from err
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"config={path!r} cannot be read as YAML: {' '.join(str(err).split())}") from err
    return config if isinstance(config, Mapping) else {}


def _keep(config: Mapping[str, Any], known: set[str], prefix: str = "") -> dict[str, Any]:
    """The part of ``config`` whose dotted keys are in ``known`` (or lead to one)."""
    kept: dict[str, Any] = {}
    for key, value in config.items():
        name = prefix + str(key)
        if name in known:
            kept[key] = value
        elif isinstance(value, Mapping) and any(k.startswith(name + ".") for k in known):
            kept[key] = _keep(value, known, name + ".")
    return kept


def _dotted(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config`` flattened to dotted keys."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(_dotted(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {prefix + str(key): value})
    return flat


# -- the command -----------------------------------------------------------------------------------------------------
def request_from(config: Any) -> GenerationRequest:
    """The one checked request of parsed options; left-out budget and sampling come from ``model.generation``."""
    generation = config.model.generation
    return GenerationRequest(
        max_new_tokens=generation.max_new_tokens if config.max_new_tokens is None else config.max_new_tokens,
        batch_size=config.batch_size, sampling=config.sampling or generation.sampling or SamplingConfig(),
        dense=config.dense, compare_dense=config.compare_dense, long_prompts=config.long_prompts,
        speculative=config.speculative, draft_schedule=config.draft_schedule, draft_vocab=config.draft_vocab,
        draft_confidence=config.draft_confidence, raw_prompts=config.raw_prompts,
        prompts=config.prompts, prompt=config.prompt, stop=tuple(config.stop), output=config.output,
    )


ACCELERATORS = ["auto", "cpu", "gpu", "cuda"]
PRECISIONS = ["auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true", "32", "bf16", "16", "64"]


def placement_for(accelerator: str, precision: str | None) -> tuple[str, Callable[[], Any], Any]:
    """Where the export runs (``cuda`` or ``cpu``), the context it decodes in and the dtype its weights load in,
    from the trainer options generate shares with Lightning: ``*-true`` loads the weights in their dtype,
    ``*-mixed`` autocasts fp32 weights."""
    name = accelerator.lower()
    if name not in ACCELERATORS:
        raise UsageError(f"trainer.accelerator={accelerator!r} is invalid for generate: allowed one of {ACCELERATORS}")
    if precision is not None and str(precision) not in PRECISIONS:
        raise UsageError(f"trainer.precision={precision!r} is invalid for generate: allowed one of {PRECISIONS}")
    device = "cuda" if name in ("gpu", "cuda") or name == "auto" and torch.cuda.is_available() else "cpu"
    resolved = "32-true" if precision is None else str(resolve_precision(precision, name))
    dtype = compute_dtype(resolved)
    if "mixed" in resolved or resolved in ("16", "bf16"):
        return device, partial(torch.autocast, device, dtype=dtype), torch.float32
    return device, nullcontext, dtype


def _local(model: str) -> str:
    """The local directory of an export given by its Hub repo id (downloaded once into huggingface_hub's cache), or
    ``model`` as given."""
    return str(hub_export(model) or model)


def main(args: Sequence[str]) -> Any:
    """Run ``skiptrain generate`` on an export: every option checked, the prompts read and fitted, before any
    weights load."""
    p = parser()
    known = set(p.get_defaults().keys()) - {"config"}
    config = p.parse_args(_known_options(args, known))
    config = p.instantiate_classes(config)
    request = request_from(config)
    device, context, dtype = placement_for(config.trainer.accelerator, config.trainer.precision)
    export = _local(config.model.model)
    model_config = export_config(export)  # a missing or broken export is refused here, by name, before its weights
    draft = request.draft_schedule and schedule_from_file(request.draft_schedule, model_config.num_hidden_layers,
                                                          "draft_schedule")
    record = read_record(export)
    request = request.with_draft_vocab(model_config.vocab_size,
                                       None if record.draft_vocab is None else Path(export) / DRAFT_VOCAB_FILE)
    prompt_format = chosen_prompt_format(record.prompt_format, request.raw_prompts)
    tokenizer = load_tokenizer(export)
    prompts, prompt_format = prepare_prompts(request, tokenizer, context_length(model_config), prompt_format)
    model, schedule, tokenizer = load_exported(export, config.model.attn_implementation, dtype)
    decoder = Decoder(model.to(device), tokenizer, prompt_format, device, context)
    return run_request(decoder, draft or schedule, request, prompts)
