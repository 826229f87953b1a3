"""Lossless self-speculative decoding of sliding-window models (Gemma 2, Gemma 3, Mistral with a window): a window
counted in cache columns covers a row's real tokens once each verification compacts the cache, so the output stays
full depth's while the window slides far past the prompt."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import left_padded_batch, tiny_config, tiny_model
from test_speculative import DRAFTS, LAYERS, assert_full_depth_tokens
from test_speculative_levers import HALF
from transformers import AutoModelForCausalLM, DynamicCache

import skiptrain.shipped.speculate as shared
from skiptrain import Dense, generate_under_schedule
from skiptrain.frontends.speculative import generate_lossless
from skiptrain.modeling.loading import load_tokenizer
from skiptrain.shipped.cache import compact_cache, full_length_cache

SLIDING = ("gemma2", "gemma3_text", "mistral-sliding")
LONG = 30  # new tokens: several windows (4 or 5 columns) past prompts that end inside the first one
LEVERS = {"none": {}, "vocab": {"draft_vocab": HALF}, "confidence": {"draft_confidence": 0.5}}


def short_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 3, 1 and 2 tokens, shorter than every window."""
    return left_padded_batch(batch=3, prompt_length=3, continuation=0, seed=1)


@pytest.mark.parametrize("family", SLIDING)
@pytest.mark.parametrize("draft_tokens", [2, 5])
def test_greedy_tokens_stay_full_depth_while_the_window_slides_past_the_prompt(family, draft_tokens):
    model = tiny_model(family, LAYERS)
    window = tiny_config(family).sliding_window
    assert LONG > 5 * window, "precondition: the window slides over generated tokens only"
    ids, mask = short_prompts()
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), LONG, return_logits=True)
    rejected = 0
    for draft in DRAFTS.values():
        for name, levers in LEVERS.items():
            out = generate_lossless(model, ids, mask, draft.build(LAYERS), LONG, draft_tokens, **levers)
            assert_full_depth_tokens(out.tokens, dense)
            assert out.stats.committed == (LONG - 1) * 3, name
            rejected += out.stats.judged - out.stats.accepted
    assert rejected > 0, "precondition: rows reject drafts, so their caches are compacted"


@pytest.mark.parametrize("family", SLIDING)
def test_without_compaction_the_window_would_cover_rejected_columns_and_the_tokens_change(family, monkeypatch):
    """The defect compaction removes, shown: rejected columns left in place as padding take up a window counted in
    columns, and the tokens stop being full depth's."""
    model = tiny_model(family, LAYERS)
    ids, mask = short_prompts()
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), LONG)
    draft = DRAFTS["one_layer"].build(LAYERS)
    assert torch.equal(generate_lossless(model, ids, mask, draft, LONG, 3).tokens, dense.tokens)
    monkeypatch.setattr(shared, "compact_cache", lambda cache, attention_mask, min_length=0: attention_mask)
    assert not torch.equal(generate_lossless(model, ids, mask, draft, LONG, 3).tokens, dense.tokens)


def test_compaction_moves_each_rows_padding_before_its_tokens_in_every_layer_and_drops_shared_padding():
    config = tiny_config("gemma2", 2)
    cache = full_length_cache(config)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0],
                         [0, 0, 1, 1, 1, 1],
                         [0, 1, 0, 1, 0, 0]])
    for layer in range(2):  # each column's key is its column index (+ 10 per layer), values its negative
        keys = (torch.arange(6.0) + 10 * layer).expand(3, 1, 6)[..., None].expand(3, 1, 6, 2).contiguous()
        cache.update(keys, -keys, layer)
    assert [type(layer).__name__ for layer in cache.layers] == ["DynamicLayer", "DynamicLayer"], \
        "sliding layers keep every column"
    compacted = compact_cache(cache, mask)
    assert compacted.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], "2 columns are padding in every row"
    for index, layer in enumerate(cache.layers):
        columns = layer.keys[:, 0, :, 0] - 10 * index  # [B, S']: the column each kept key came from
        tokens = compacted.bool()
        assert columns[0][tokens[0]].tolist() == [1, 2, 4]
        assert columns[1].tolist() == [2, 3, 4, 5]
        assert columns[2][tokens[2]].tolist() == [1, 3]
        assert torch.equal(layer.values, -layer.keys)
    assert compact_cache(cache, compacted) is compacted, "left-padded rows are left as they are"


def test_compaction_keeps_the_columns_asked_for():
    cache = DynamicCache()
    cache.update(torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2), 0)
    mask = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 1]])
    assert compact_cache(cache, mask, min_length=3).tolist() == [[0, 1, 1], [0, 1, 1]]
    assert cache.layers[0].keys.shape[2] == 3


@pytest.mark.parametrize("family", SLIDING)
def test_the_exports_generate_stays_transformers_full_depth_output_with_both_levers(skip_export, family):
    """The export's ``generate(speculative_tokens=K)`` on the gated transformers model, the window sliding far
    past the prompts, equals transformers' own full-depth greedy ``generate`` of the same weights."""
    path = skip_export(family)
    tokenizer = load_tokenizer(str(path))
    batch = dict(tokenizer(["The council met", "Hello", "Describe the weather"], return_tensors="pt", padding=True))
    dense = AutoModelForCausalLM.from_pretrained(path).eval().generate(**batch, max_new_tokens=LONG, do_sample=False)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    for levers in ({}, {"draft_vocab": HALF.tolist(), "draft_confidence": 0.4}):
        out = model.generate(**batch, max_new_tokens=LONG, do_sample=False, speculative_tokens=3, **levers)
        assert torch.equal(out, dense), levers


def test_generate_speculative_on_a_sliding_window_export_writes_the_full_depth_completions(skip_export, tmp_path):
    from skiptrain.cli.app import main

    export = skip_export("gemma2")
    prompts, output = tmp_path / "prompts.txt", tmp_path / "out.jsonl"
    prompts.write_text("The council met\nDescribe the weather in one sentence. Forecast: city[Oslo]\nHello\n")
    common = ["generate", "--model.model", str(export), "--prompts", str(prompts), "--max_new_tokens", str(LONG),
              "--batch_size", "3", "--trainer.accelerator", "cpu", "--output", str(output)]
    main([*common, "--dense", "true"])
    dense = output.read_text()
    main([*common, "--speculative", "3"])
    assert output.read_text() == dense
