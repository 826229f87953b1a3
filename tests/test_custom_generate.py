"""Plain transformers ``generate()`` under an export's schedule, through the export's ``custom_generate``: the same
tokens and logits as skiptrain's decoder for every family, sampling, processors, streamers, beam search and the
pipeline, layers outside ``E(g)`` never called, and dense loading untouched."""

from __future__ import annotations

import ast
import functools
import itertools
import json
import random
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.schedules import random_family
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    TextStreamer,
    pipeline,
)

import skiptrain.shipped
from skiptrain import Dense, SamplingConfig, generate_under_schedule, load_exported, skip_forward
from skiptrain.core.schedules import ScheduleError, SkipSchedule
from skiptrain.export.format import CUSTOM_GENERATE_FILE
from skiptrain.frontends.speculative import generate_lossless
from skiptrain.modeling.architectures import ARCHITECTURES
from skiptrain.modeling.loading import load_tokenizer
from skiptrain.shipped.cache import CACHE_ARGUMENT, SkipCache, cache_argument
from skiptrain.shipped.gates import DECODER_LAYERS, decoder_layers, skipping
from skiptrain.shipped.schedule import SkipScheduleError, read_schedule

HF_FAMILIES = ("llama", "mistral", "qwen2", "opt", "gpt2", "qwen3", "gemma2", "gemma3_text", "phi3")
PROMPTS = [
    "Describe the weather in one sentence. Forecast: city[Oslo], day[Monday]",
    "The council met",
    "Describe the restaurant in one sentence. Attributes: name[The Eagle] Sentence:",
]
NEW_TOKENS = 10


@pytest.fixture
def export(skip_export):
    return skip_export


def hf_skip_model(path: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()


def prompt_batch(tokenizer, prompts=PROMPTS) -> dict[str, torch.Tensor]:
    return dict(tokenizer(prompts, return_tensors="pt", padding=True))  # left-padded (prepare_tokenizer)


def reference(path: Path, batch: dict, **kwargs):
    """skiptrain's own decoder on the export: ``(output, tokenizer)``."""
    model, schedule, tokenizer = load_exported(path)
    out = generate_under_schedule(model, batch["input_ids"], batch["attention_mask"], schedule, NEW_TOKENS,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **kwargs)
    return out, tokenizer


class Recorder(LogitsProcessor):
    """A logits processor that keeps the scores it is given (and changes nothing)."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.seen.append(scores.clone())
        return scores


@pytest.mark.parametrize(("family", "schedule"), [(family, "skipdecode") for family in HF_FAMILIES]
                         + [("llama", "ranked"), ("llama", "hierarchical"), ("mistral-sliding", "skipdecode"),
                            ("gemma2", "ranked"), ("gemma2", "hierarchical"), ("gemma3_text", "ranked")])
def test_greedy_generate_equals_skiptrain_tokens_and_logits(export, family, schedule):
    path = export(family, schedule)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    expected, _ = reference(path, batch, return_logits=True)
    model = hf_skip_model(path)
    assert "generate" in vars(model), "trust_remote_code=True installs the export's custom generate"
    assert batch["input_ids"].shape[1] > (getattr(model.config, "sliding_window", None) or 0), "windows cut prompts"
    recorder = Recorder()
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                         output_logits=True, logits_processor=LogitsProcessorList([recorder]))
    prompt_length = batch["input_ids"].shape[1]
    assert torch.equal(out.sequences[:, prompt_length:], expected.tokens)
    torch.testing.assert_close(torch.stack(out.logits, 1), expected.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.stack(recorder.seen, 1), expected.logits, atol=1e-4, rtol=0)  # processors see them
    dense = load_exported(path).model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False,
                                               return_dict_in_generate=True, output_logits=True)
    assert not torch.allclose(torch.stack(dense.logits, 1), expected.logits, atol=1e-3), "the schedule matters"


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_sampling_with_a_seed_equals_skiptrain_sampling(export, family):
    """Both draw one ``torch.multinomial`` sample per row and step from the default generator, after the same
    transformers warpers (temperature, top-p), so a seed gives the same tokens."""
    path = export(family)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    torch.manual_seed(7)
    expected, _ = reference(path, batch, sampling=SamplingConfig(do_sample=True, temperature=0.7, top_p=0.9))
    model = hf_skip_model(path)
    torch.manual_seed(7)
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=0.7, top_p=0.9, top_k=0)
    assert torch.equal(out[:, batch["input_ids"].shape[1]:], expected.tokens)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_blocking_repeated_ngrams_equals_skiptrains(export, family):
    path = export(family)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    skip_model, schedule, _ = load_exported(path)

    def decode(sampling: SamplingConfig):
        return generate_under_schedule(skip_model, batch["input_ids"], batch["attention_mask"], schedule, 24,
                                       sampling=sampling, eos_token_id=tokenizer.eos_token_id,
                                       pad_token_id=tokenizer.pad_token_id)

    free = decode(SamplingConfig())
    said = [row[:n] for row, n in zip(free.tokens.tolist(), free.lengths.tolist(), strict=True)]
    assert any(len(set(itertools.pairwise(row))) < len(row) - 1 for row in said), "it repeats when free to"
    expected = decode(SamplingConfig(block_repeated_ngrams=2))
    model = hf_skip_model(path)
    out = model.generate(**batch, max_new_tokens=24, do_sample=False, block_repeated_ngrams=2)
    assert torch.equal(out[:, batch["input_ids"].shape[1]:], expected.tokens)
    with pytest.raises(ValueError, match=r"block_repeated_ngrams=2 is invalid with speculative_tokens=2: allowed 0"):
        model.generate(**batch, max_new_tokens=3, block_repeated_ngrams=2, speculative_tokens=2)
    with pytest.raises(ValueError, match=r"block_repeated_ngrams=-1 is invalid: allowed an integer >= 0"):
        model.generate(**batch, max_new_tokens=3, block_repeated_ngrams=-1)


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_layers_outside_the_executed_set_are_not_called_and_keep_no_cache(export, family):
    path = export(family)
    model = hf_skip_model(path)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    schedule = load_exported(path).schedule
    step, calls = [-1], Counter()  # forward call index (0: the prompt); (call, layer) -> calls of the layer's parts
    model.register_forward_pre_hook(lambda module, args: step.__setitem__(0, step[0] + 1))
    for index, layer in enumerate(decoder_layers(model)):
        for part in layer.children():  # attention, MLP, norms
            part.register_forward_hook(lambda module, args, out, index=index: calls.update([(step[0], index)]))
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                         return_dict_in_generate=True)
    assert step[0] == NEW_TOKENS - 1
    for call in range(NEW_TOKENS):
        expected = schedule.prompt_layers if call == 0 else schedule.executed_layers(call - 1)
        assert {layer for (c, layer) in calls if c == call} == set(expected), f"forward call {call}"
    prompt_length = batch["input_ids"].shape[1]
    cached = [layer.get_seq_length() for layer in getattr(out, CACHE_ARGUMENT).layers]
    assert cached == schedule.layer_run_lengths(prompt_length, prompt_length + NEW_TOKENS - 1)


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_a_streamer_receives_skiptrains_text(export, family, capsys):
    path = export(family)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer, PROMPTS[:1])  # TextStreamer streams one row
    expected, _ = reference(path, batch)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    hf_skip_model(path).generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, streamer=streamer)
    streamed = capsys.readouterr().out
    assert streamed.strip() == expected.texts(tokenizer)[0] and streamed.strip()


def test_positional_prompts_the_pipeline_and_the_custom_generate_argument_decode_under_the_schedule(export):
    path = export("qwen2")
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer, PROMPTS[:1])
    expected, _ = reference(path, batch)
    generated = expected.tokens[0, : expected.lengths[0]].tolist()
    model = hf_skip_model(path)
    positional = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False,
                                max_new_tokens=NEW_TOKENS)  # the prompt as generate's first positional argument
    assert positional[0, batch["input_ids"].shape[1]:].tolist() == generated
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    (result,) = pipe(PROMPTS[0], max_new_tokens=NEW_TOKENS, do_sample=False, return_tensors=True)
    assert result["generated_token_ids"][batch["input_ids"].shape[1]:] == generated
    dense = AutoModelForCausalLM.from_pretrained(path).eval()  # no trust_remote_code: transformers' own generate
    out = dense.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=str(path),
                         trust_remote_code=True)
    assert out[0, batch["input_ids"].shape[1]:].tolist() == generated


def test_beam_search_scores_are_the_schedules_log_probabilities(export):
    """Beams share the column of their row, so each beam runs the schedule's layers: the returned score of every
    sequence is the sum of its token log-probabilities under the skip-aware training forward."""
    path = export("gpt2")
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    model = hf_skip_model(path)
    out = model.generate(**batch, max_new_tokens=6, num_beams=3, num_return_sequences=3, do_sample=False,
                         length_penalty=0.0, return_dict_in_generate=True, output_scores=True, eos_token_id=None)
    ids = out.sequences  # [B * 3, P + 6]
    prompt_length = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"].repeat_interleave(3, 0), torch.ones_like(ids[:, prompt_length:])], 1)
    logits = skip_forward(load_exported(path).model, ids, mask, load_exported(path).schedule, prompt_length)
    log_probs = logits[:, prompt_length - 1:-1].log_softmax(-1).gather(-1, ids[:, prompt_length:, None]).squeeze(-1)
    torch.testing.assert_close(out.sequences_scores, log_probs.sum(1), atol=1e-4, rtol=0)


def test_plain_from_pretrained_still_loads_and_decodes_densely(export):
    path = export("llama")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert "generate" not in vars(model), "without trust_remote_code transformers' own generate runs"
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    exported = load_exported(path).model
    dense = generate_under_schedule(exported, batch["input_ids"], batch["attention_mask"], Dense().build(6),
                                    max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                                    pad_token_id=tokenizer.pad_token_id)
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(out[:, batch["input_ids"].shape[1]:], dense.tokens)


@pytest.mark.parametrize("family", (*HF_FAMILIES, "mistral-sliding"))  # sliding windows: Gemma 2/3, Mistral's
@pytest.mark.parametrize("draft_tokens", [1, 3])
def test_speculative_tokens_give_transformers_own_full_depth_greedy_output(export, family, draft_tokens):
    path = export(family)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    dense = AutoModelForCausalLM.from_pretrained(path).eval().generate(**batch, max_new_tokens=NEW_TOKENS,
                                                                        do_sample=False)
    model = hf_skip_model(path)
    layer_calls = Counter()
    for index, layer in enumerate(decoder_layers(model)):  # counted inside the gates: calls that run the layer
        layer.forward = functools.partial(lambda *a, index, run, **k: layer_calls.update([index]) or run(*a, **k),
                                          index=index, run=layer.forward)
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, speculative_tokens=draft_tokens)
    assert torch.equal(out, dense)
    assert layer_calls[1] < layer_calls[0], "the drafts skip the layers the schedule skips"
    for layer in decoder_layers(model):
        del layer.forward
    torch.manual_seed(0)
    sampled = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=5,
                             speculative_tokens=draft_tokens)
    assert sampled.shape[0] == out.shape[0] and torch.equal(sampled[:, :batch["input_ids"].shape[1]],
                                                            batch["input_ids"])
    assert not any("forward" in vars(layer) for layer in decoder_layers(model)), "the gates are removed"


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_speculative_sampling_with_a_seed_equals_skiptrains_lossless_sampling(export, family):
    """The export's lossless mode and skiptrain's (:func:`~skiptrain.frontends.speculative.generate_lossless`) run
    the same loop from torch's default generator, with warpers built each its own way from the same options."""
    path = export(family)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    skip_model, schedule, _ = load_exported(path)
    ends = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    options = {"do_sample": True, "temperature": 0.8, "top_k": 6, "top_p": 0.9}
    torch.manual_seed(11)
    expected = generate_lossless(skip_model, batch["input_ids"], batch["attention_mask"], schedule, NEW_TOKENS, 3,
                                 sampling=SamplingConfig(**options), **ends)
    model = hf_skip_model(path)
    torch.manual_seed(11)
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, speculative_tokens=3, **options, **ends)
    assert torch.equal(out[:, batch["input_ids"].shape[1]:], expected.tokens)
    torch.manual_seed(12)
    again = model.generate(**batch, max_new_tokens=NEW_TOKENS, speculative_tokens=3, **options, **ends)
    assert not torch.equal(again, out), "another seed draws other tokens"


def test_the_speculative_mode_refuses_what_it_cannot_take(export):
    path = export("llama")
    model = hf_skip_model(path)
    batch = prompt_batch(load_tokenizer(str(path)))
    with pytest.raises(ValueError, match=r"speculative_tokens=-1 is invalid: allowed an integer >= 0"):
        model.generate(**batch, max_new_tokens=3, speculative_tokens=-1)
    with pytest.raises(ValueError, match=r"speculative_tokens=4 is invalid with max_new_tokens=3"):
        model.generate(**batch, max_new_tokens=3, speculative_tokens=4)
    with pytest.raises(ValueError, match=r"does not take \['num_beams'\]"):
        model.generate(**batch, max_new_tokens=3, speculative_tokens=2, num_beams=2)


def test_calls_it_cannot_apply_exactly_are_refused(export):
    """Refusals are ``ValueError`` s (the exported copy defines its own ``SkipScheduleError`` class)."""
    path = export("llama")
    model = hf_skip_model(path)
    tokenizer = load_tokenizer(str(path))
    batch = prompt_batch(tokenizer)
    with pytest.raises(ValueError, match="needs different executed layer sets.*use_cache=True"):
        model.generate(**batch, max_new_tokens=3, use_cache=False)
    with pytest.raises(ValueError, match="needs different executed layer sets"):
        model.generate(**prompt_batch(tokenizer, PROMPTS[:1]), max_new_tokens=6,
                       assistant_model=AutoModelForCausalLM.from_pretrained(path))  # verifies drafts in one call
    right = {k: v.flip(1) for k, v in batch.items()}
    with pytest.raises(ValueError, match="last column: allowed only left-padded prompts"):
        model.generate(**right, max_new_tokens=3)
    assert "forward" not in vars(decoder_layers(model)[1]), "a refused call leaves the layers as they were"
    model.config.skip_schedule = {**model.config.skip_schedule, "num_layers": 4}
    with pytest.raises(ValueError, match=r"skip_schedule.num_layers=4 is invalid: allowed 6"):
        model.generate(**batch, max_new_tokens=3)
    model.config.model_type = "bloom"
    with pytest.raises(SkipScheduleError, match="model_type='bloom' is not supported"):
        decoder_layers(model)


def test_a_forward_set_on_a_layer_instance_is_gated_and_then_restored(export):
    """Hooks such as accelerate's (``device_map``) replace ``layer.forward`` on the instance; they are kept."""
    path = export("llama")
    model = hf_skip_model(path)
    layer = decoder_layers(model)[2]
    calls, original = [], layer.forward

    def hooked(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    layer.forward = hooked
    model.generate(**prompt_batch(load_tokenizer(str(path))), max_new_tokens=NEW_TOKENS, do_sample=False)
    schedule = load_exported(path).schedule  # the last token generated is never fed back
    assert len(calls) == 1 + sum(2 in schedule.executed_layers(g) for g in range(NEW_TOKENS - 1)) < NEW_TOKENS
    assert vars(layer)["forward"] is hooked


SHIPPED_IMPORTS = {"__future__", "collections", "contextlib", "dataclasses", "functools", "inspect", "json", "re",
                   "typing", "torch", "transformers"}
"""What the shipped modules may import besides each other: the standard library, torch and transformers."""


def absolute_imports(tree: ast.Module) -> set[str]:
    """The top-level packages a module imports (relative imports aside)."""
    return {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                        if isinstance(node, ast.ImportFrom) and not node.level}


def test_the_export_ships_the_shipped_package_byte_for_byte(export):
    folder = (export("llama") / CUSTOM_GENERATE_FILE).parent
    package = Path(skiptrain.shipped.__file__).parent
    modules = sorted(path.name for path in package.glob("*.py"))
    assert {"generate.py", "speculate.py", "prompt_format.py"} <= set(modules)
    assert sorted(path.name for path in folder.iterdir()) == modules, "the package, and nothing else"
    for name in modules:
        text = (package / name).read_text()
        assert (folder / name).read_bytes() == (package / name).read_bytes(), name
        tree = ast.parse(text)
        assert absolute_imports(tree) <= SHIPPED_IMPORTS, f"{name} imports {absolute_imports(tree) - SHIPPED_IMPORTS}"
        siblings = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
        assert all(f"{module}.py" in modules for module in siblings), f"{name}: only `from .sibling import`"
        # transformers copies a sibling into its module cache when it finds `from .sibling import` in the text
        assert len(re.findall(r"^\s*from\s+\.(\S+)\s+import", text, re.MULTILINE)) == len(siblings), name
    prompt_format = ast.parse((package / "prompt_format.py").read_text())
    assert not absolute_imports(prompt_format) & {"torch", "transformers"}, "the data pipeline imports it"
    card = (export("llama") / "README.md").read_text()
    assert 'AutoModelForCausalLM.from_pretrained("path/to/this/export", trust_remote_code=True)' in card
    config = json.loads((export("llama") / "config.json").read_text())
    assert "auto_map" not in config, "the model class stays transformers' own"
    # the same layers skiptrain's own forward drives, for every architecture in its table
    assert DECODER_LAYERS == {name: entry.layers_path for name, entry in ARCHITECTURES.items()}


def test_masks_of_a_layer_kind_are_sized_by_the_longest_cache_of_that_kind(export):
    """The first generated token skips layer 1, Gemma 2's first global layer: transformers sizes the global layers'
    mask by it, one column short of the global layers that run; the skip cache sizes it by them."""
    model = hf_skip_model(export("gemma2"))
    prompt = torch.arange(3, 11)[None]  # 8 columns, past the sliding window of 5
    caches = SkipCache(config=model.config), DynamicCache(config=model.config)
    for cache in caches:
        with skipping(model, prompt.shape[1]), torch.no_grad():
            model(input_ids=prompt, **cache_argument(cache))
            model(input_ids=torch.tensor([[11]]), **cache_argument(cache))  # generated index 0: layers 0, 2, 3, 4, 5
    skip, transformers_own = caches
    assert [layer.get_seq_length() for layer in skip.layers] == [9, 8, 9, 9, 9, 9]
    assert skip.get_mask_sizes(1, layer_idx=1) == skip.layers[3].get_mask_sizes(1) == (10, 0)
    assert transformers_own.get_mask_sizes(1, layer_idx=1) == (9, 0)
    assert skip.get_mask_sizes(1, layer_idx=0) == transformers_own.get_mask_sizes(1, layer_idx=0) == (5, 5)


def test_gemma_decodes_into_a_skip_cache_and_refuses_caches_that_size_masks_by_a_skipped_layer(export):
    path = export("gemma2")
    model = hf_skip_model(path)
    batch = prompt_batch(load_tokenizer(str(path)))
    model.generation_config.cache_implementation = "hybrid"  # as Gemma checkpoints ship it: a static cache
    out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
    assert type(getattr(out, CACHE_ARGUMENT)).__name__ == "SkipCache"  # the export's own copy of the class
    assert torch.equal(out.sequences[:, batch["input_ids"].shape[1]:], reference(path, batch)[0].tokens)
    with pytest.raises(ValueError, match=r"a DynamicCache was passed for a model with sliding-window and global "
                                         r"layers: allowed none"):
        model.generate(**batch, max_new_tokens=3, **cache_argument(DynamicCache(config=model.config)))
    with pytest.raises(ValueError, match=r"cache_implementation='static' is invalid for a model with sliding-window "
                                         r"and global layers: allowed None or 'dynamic'"):
        model.generate(**batch, max_new_tokens=3, cache_implementation="static")


def _explicit(num_layers: int = 6, **changes) -> dict:
    """A valid ``skip_schedule`` object given only as layer lists (family ``explicit``), with ``changes`` applied."""
    record = SkipSchedule(num_layers, (0, 1, 2, 3, 4, 5), ((0, 1, 3, 4), (0, 3), (0,)), family="explicit").to_dict()
    return {**record, **changes}


INVALID_SCHEDULES = {
    "not ascending": _explicit(prompt_layers=[0, 2, 1, 3, 4, 5]),
    "a repeated layer": _explicit(executed_layers=[[0, 0, 1], [0]]),
    "no layer 0": _explicit(executed_layers=[[1, 3], [1]]),
    "not nested": _explicit(executed_layers=[[0, 3], [0, 4]]),
    "a layer past the last": _explicit(prompt_layers=[0, 1, 2, 3, 4, 5, 6]),
    "a negative layer": _explicit(executed_layers=[[-1, 0, 1]]),
    "no executed layers": _explicit(executed_layers=[]),
    "no prompt layers": {k: v for k, v in _explicit().items() if k != "prompt_layers"},
    "another format": _explicit(format="other.schedule"),
    "another schema version": _explicit(schema_version=2),
    "another position": _explicit(position="absolute"),
    "another layer count": _explicit(num_layers=8),
}


def _skiptrain_accepts(record: dict, num_layers: int) -> bool:
    """skiptrain's reader of an export's schedule: the contract, then the model's layer count."""
    try:
        SkipSchedule.from_dict(record).check_num_layers(num_layers)
    except ScheduleError:
        return False
    return True


def _custom_generate_accepts(record: dict, num_layers: int) -> bool:
    try:
        read_schedule(SimpleNamespace(skip_schedule=record, num_hidden_layers=num_layers))
    except SkipScheduleError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(INVALID_SCHEDULES))
def test_custom_generate_and_skiptrain_refuse_the_same_invalid_schedules(name):
    record = INVALID_SCHEDULES[name]
    assert not _skiptrain_accepts(record, 6) and not _custom_generate_accepts(record, 6)


@pytest.mark.parametrize("seed", range(60))
def test_custom_generate_and_skiptrain_accept_the_same_valid_schedules(seed):
    num_layers = random.Random(seed).choice([3, 6, 12, 30])
    record = random_family(random.Random(seed), num_layers).build(num_layers).to_dict()
    assert _skiptrain_accepts(record, num_layers) and _custom_generate_accepts(record, num_layers)
    assert read_schedule(SimpleNamespace(skip_schedule=record, num_hidden_layers=num_layers)) == (
        tuple(record["prompt_layers"]), tuple(tuple(s) for s in record["executed_layers"]))
