"""The vLLM job's test cases: tiny exports and their conformance vectors, written by skiptrain's reference decoder.

vLLM 0.32 pins transformers below the release skiptrain's decoder needs (>= 5.24), so the vLLM job writes the cases
with the tested stack's venv and decodes them with the vLLM venv:

    PYTHONPATH=tests python -m helpers.vllm_cases build/vllm-cases [--quickstart] [--chat]   # the tested stack
    SKIPTRAIN_VLLM_CASES=build/vllm-cases python -m pytest -m vllm tests/test_vllm.py   # the vLLM venv
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers.tiny_models import tiny_model
from helpers.tiny_tokenizer import build_tiny_tokenizer

FAMILIES = ("llama", "qwen2", "mistral", "opt", "qwen3", "phi3", "gemma2", "gemma3_text", "gpt2")
"""Every family skiptrain trains, as :mod:`helpers.tiny_models` builds them (Gemma's sliding window, 5 tokens, is
shorter than the prompts, so its sliding layers attend to a window)."""
PROMPTS = [
    "The council met on Monday",
    "Describe the restaurant in one sentence. Attributes: name[The Eagle], eatType[coffee shop], area[riverside]",
    "Expect sunshine in Lisbon",
    "Once upon a time there lived a king who had three daughters, and the youngest was the most beautiful",
    "Voters will go to the polls",
    "The museum, which opened in 1990, attracts thousands of visitors every summer.",
]
NEW_TOKENS = 12
LONG_NEW_TOKENS = 40
"""Long enough that a request outgrows its first KV block of 32 tokens, so a tiny KV budget preempts requests."""
NUM_LAYERS = 6
WIDTH = 128  # 4 heads of 32: the smallest head size vLLM's CPU attention takes
QUICKSTART_NEW_TOKENS = 24


def schedule():
    """Of 6 layers: 5, 5, 4, 3, 2, 2, ... per generated token, every layer for prompt tokens."""
    from skiptrain.core.schedules import SkipDecode

    return SkipDecode(max_layers=5, min_layers=2, decay_tokens=4).build(NUM_LAYERS)


def vectors_file(root: Path, family: str, new_tokens: int) -> Path:
    return root / family / f"vectors{new_tokens}.json"


def build(root: Path, quickstart: bool = False) -> None:
    """Write ``root/<family>/export`` and its vectors for every family (and the quickstart export's, if asked)."""
    from skiptrain.export.load import load_exported
    from skiptrain.export.record import ExportRecord
    from skiptrain.export.write import write_export
    from skiptrain.frontends.conformance import write_vectors
    from skiptrain.modeling.loading import load_causal_lm, load_tokenizer

    for family in FAMILIES:
        base, export = root / family / "base", root / family / "export"
        if not export.is_dir():
            tokenizer = build_tiny_tokenizer(base)
            model = tiny_model(family, NUM_LAYERS, vocab_size=len(tokenizer), width=WIDTH)
            model.config.pad_token_id, model.config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
            model.config.bos_token_id = tokenizer.bos_token_id
            model.save_pretrained(base)
            write_export(load_causal_lm(str(base)), load_tokenizer(str(base)), schedule(), export,
                         ExportRecord(str(base)))
        model, built, tokenizer = load_exported(export)
        for new_tokens in (NEW_TOKENS, LONG_NEW_TOKENS):
            write_vectors(model, tokenizer, built, PROMPTS, vectors_file(root, family, new_tokens),
                          max_new_tokens=new_tokens)
    if quickstart:
        build_quickstart(root / "quickstart")


def build_quickstart(root: Path) -> None:
    """The quickstart recipe's export (SmolLM2-135M, base weights, its SkipDecode schedule) and its vectors."""
    from skiptrain.cli.app import main
    from skiptrain.export.load import load_exported
    from skiptrain.frontends.conformance import write_vectors

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    export = root / "export"
    if not export.is_dir():
        main(["export", "--config", str(recipe), "--output_dir", str(export), "--trainer.logger", "false"])
    model, built, tokenizer = load_exported(export)
    write_vectors(model, tokenizer, built, PROMPTS[:4], root / f"vectors{QUICKSTART_NEW_TOKENS}.json",
                  max_new_tokens=QUICKSTART_NEW_TOKENS)


# -- prefix caching: a shared system prompt, and a second turn holding the first turn's reply --------------------------
SYSTEM = ("You write short, accurate weather forecasts from the data you are given. Describe the weather in one "
          "sentence, name the city and the day, give the high and the low, and say if it will be rainy, sunny, cloudy "
          "or snowy. Expect strong winds near the river.")
"""93 tiny-tokenizer tokens: two whole KV blocks of 32 that every prompt below starts with."""
QUESTIONS = (" Forecast: city[Oslo], day[Monday], condition[rainy], high[12]",
             " Forecast: city[Cairo], day[Wednesday], condition[sunny], high[30]",
             " Forecast: city[Denver], day[Thursday], condition[snowy], high[2]")
FOLLOW_UP = " Tell me more."
PREFIX_NEW_TOKENS = 40
"""Long enough that the first turn's reply fills a KV block of generated tokens (the one block caching must skip)."""


class GivenIds:
    """A prompt format for :func:`~skiptrain.frontends.conformance.write_vectors` whose prompts are token ids already
    (as JSON text): the reference decoder prefills them as given, at full depth, as it prefills any prompt."""

    def encode(self, tokenizer, prompts: list[str]) -> tuple[list[str], list[list[int]]]:
        return list(prompts), [json.loads(prompt) for prompt in prompts]


def build_prefix_cases(root: Path) -> None:
    """``root/prefix/``: vectors on the tiny Llama export (written by :func:`build`) for prefix caching.

    ``shared.json``: prompts that share :data:`SYSTEM`. ``turn2.json``: the second turn of ``shared.json``'s case 0,
    whose prompt is that case's prompt ids, its greedy reply's ids and :data:`FOLLOW_UP`'s, prefilled at full depth.
    """
    from skiptrain.export.load import load_exported
    from skiptrain.frontends.conformance import write_vectors

    model, built, tokenizer = load_exported(root / "llama" / "export")
    shared = write_vectors(model, tokenizer, built, [SYSTEM + question for question in QUESTIONS],
                           root / "prefix" / "shared.json", max_new_tokens=PREFIX_NEW_TOKENS)
    first = shared["cases"][0]
    follow_up = tokenizer(FOLLOW_UP, add_special_tokens=False)["input_ids"]
    turn2 = first["prompt_token_ids"] + first["token_ids"] + follow_up
    write_vectors(model, tokenizer, built, [json.dumps(turn2)], root / "prefix" / "turn2.json",
                  max_new_tokens=NEW_TOKENS, prompt_format=GivenIds())


# -- the chat fragment's export, for the OpenAI-compatible server ------------------------------------------------------
CHAT_SOURCES = ("city[Oslo], day[Monday], condition[snowy], high[-2], low[-9], wind[strong]",
                "city[Lisbon], day[Saturday], condition[sunny], high[27], rain[10]",
                "city[Seattle], day[Wednesday], condition[rainy], low[8], rain[80]",
                "city[Nairobi], day[Friday], condition[partly cloudy], high[24], wind[light]")
CHAT_NEW_TOKENS = 24


def build_chat(root: Path) -> None:
    """``root/export``: the quickstart recipe with the chat fragment (SmolLM2-135M-Instruct, base weights, the
    tokenizer's chat template after the fragment's system message), and ``root/vectors24.json`` of its prompts made
    from :data:`CHAT_SOURCES` by the recorded prompt format."""
    from skiptrain.cli.app import main
    from skiptrain.export.load import load_exported
    from skiptrain.frontends.conformance import write_vectors
    from skiptrain.shipped.prompt_format import PromptFormat

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    export = root / "export"
    if not export.is_dir():
        main(["export", "--config", str(recipes / "quickstart.yaml"), "--config",
              str(recipes / "fragments" / "smollm2-135m_chat.yaml"), "--output_dir", str(export),
              "--trainer.logger", "false"])
    model, built, tokenizer = load_exported(export)
    recorded = PromptFormat.from_dict(json.loads((export / "skip_schedule.json").read_text())["prompt_format"])
    write_vectors(model, tokenizer, built, list(CHAT_SOURCES), root / f"vectors{CHAT_NEW_TOKENS}.json",
                  max_new_tokens=CHAT_NEW_TOKENS, prompt_format=recorded)


def read(root: Path, family: str, new_tokens: int) -> tuple[Path, dict]:
    """``(export, vectors)`` of one family."""
    return root / family / "export", json.loads(vectors_file(root, family, new_tokens).read_text())


if __name__ == "__main__":
    build(Path(sys.argv[1]), quickstart="--quickstart" in sys.argv[2:])
    build_prefix_cases(Path(sys.argv[1]))
    if "--chat" in sys.argv[2:]:
        build_chat(Path(sys.argv[1]) / "chat")
