"""The vLLM job's test cases: tiny exports and their conformance vectors, written by skiptrain's reference decoder.

vLLM 0.32 pins transformers below the release skiptrain's decoder needs (>= 5.24), so the vLLM job writes the cases
with the tested stack's venv and decodes them with the vLLM venv:

    PYTHONPATH=tests python -m helpers.vllm_cases build/vllm-cases      # the tested stack (.venv)
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


def read(root: Path, family: str, new_tokens: int) -> tuple[Path, dict]:
    """``(export, vectors)`` of one family."""
    return root / family / "export", json.loads(vectors_file(root, family, new_tokens).read_text())


if __name__ == "__main__":
    build(Path(sys.argv[1]), quickstart="--quickstart" in sys.argv[2:])
