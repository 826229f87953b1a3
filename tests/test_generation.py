"""The batched, KV-cached skip-aware front-end: sampling, end of sequence, per-step work."""

import pytest
import torch
from helpers.tiny_models import left_padded_batch, tiny_model

from skiptrain import Dense, Hierarchical, Ranked, SamplingConfig, SkipDecode, generate_under_schedule
from skiptrain.modeling.architectures import decoder_parts


@pytest.mark.parametrize("family", [
    SkipDecode(min_layers=2, max_layers=5, decay_tokens=3),
    Ranked(min_layers=2, max_layers=5, decay_tokens=3, ranking=(3, 0, 1, 5, 2, 4)),
    Hierarchical(phase_boundaries=(1, 3)),
], ids=lambda f: f.name)
@pytest.mark.parametrize("architecture", ["opt", "qwen3", "gemma2", "gemma3_text", "phi3"])
def test_each_step_runs_only_the_executed_layers(family, architecture):
    model = tiny_model(architecture, 6)
    schedule = family.build(6)
    calls = {index: [] for index in range(6)}
    hooks = [layer.register_forward_hook(lambda mod, args, out, index=index: calls[index].append(args[0].shape[1]))
             for index, layer in enumerate(decoder_parts(model).layers)]
    ids, mask = left_padded_batch(batch=3, prompt_length=5, continuation=0)
    generate_under_schedule(model, ids, mask, schedule, max_new_tokens=6)
    for hook in hooks:
        hook.remove()
    # prefill runs every layer on the 5 prompt columns; step g feeds the token of index g (g = 0..4)
    for index in range(6):
        steps = [g for g in range(5) if index in schedule.executed_layers(g)]
        assert calls[index] == [5] + [1] * len(steps), f"layer {index}"


def test_eos_ends_rows_and_pads_after():
    model = tiny_model("llama", 4)
    ids, mask = left_padded_batch(batch=3, prompt_length=5, continuation=0)
    free = generate_under_schedule(model, ids, mask, Dense().build(4), max_new_tokens=8)
    eos = int(free.tokens[0, 2])  # make the third greedy token of row 0 the end-of-sequence token
    ended = generate_under_schedule(model, ids, mask, Dense().build(4), max_new_tokens=8, eos_token_id=eos,
                                    pad_token_id=0)
    assert ended.lengths[0] == 3
    assert torch.equal(ended.tokens[0, :3], free.tokens[0, :3])
    assert (ended.tokens[0, 3:] == 0).all()
    for row in range(3):
        hits = (free.tokens[row] == eos).nonzero()
        expected = int(hits[0]) + 1 if len(hits) else free.tokens.shape[1]
        assert ended.lengths[row] == expected


def test_stops_when_every_row_has_ended():
    model = tiny_model("gpt2", 4)
    ids, mask = left_padded_batch(batch=2, prompt_length=4, continuation=0)
    first = generate_under_schedule(model, ids, mask, Dense().build(4), max_new_tokens=1).tokens[:, 0]
    out = generate_under_schedule(model, ids, mask, Dense().build(4), max_new_tokens=20, eos_token_id=first.tolist())
    assert out.tokens.shape[1] == 1 and out.lengths.tolist() == [1, 1]


def test_sampling_is_seeded_and_respects_top_k():
    model = tiny_model("llama", 4)
    ids, mask = left_padded_batch(batch=3, prompt_length=5, continuation=0)
    schedule = SkipDecode(min_layers=2, decay_tokens=4).build(4)
    sampling = SamplingConfig(do_sample=True, temperature=0.7, top_k=1)
    greedy = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=6)
    top1 = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=6, sampling=sampling,
                                   generator=torch.Generator().manual_seed(0))
    assert torch.equal(top1.tokens, greedy.tokens), "top_k=1 sampling is greedy"
    wide = SamplingConfig(do_sample=True, temperature=2.0, top_p=0.95)
    runs = [generate_under_schedule(model, ids, mask, schedule, max_new_tokens=6, sampling=wide,
                                    generator=torch.Generator().manual_seed(seed)).tokens for seed in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def repeats(row: list[int], n: int) -> bool:
    grams = [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]
    return len(grams) != len(set(grams))


def test_blocking_repeated_ngrams_counts_the_generated_tokens_only():
    model = tiny_model("llama", 4)
    schedule = SkipDecode(min_layers=2, decay_tokens=4).build(4)
    ids, mask = left_padded_batch(batch=3, prompt_length=5, continuation=0)
    free = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=24)
    assert any(repeats(row, 2) for row in free.tokens.tolist()), "the tiny model loops when nothing is blocked"
    blocked = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=24,
                                      sampling=SamplingConfig(block_repeated_ngrams=2), return_logits=True)
    assert not any(repeats(row, 2) for row in blocked.tokens.tolist())
    # Each token is the best one that does not complete a bigram the row already generated; the prompt's bigrams and
    # the bigram across the prompt's end stay allowed (a summary may copy its article).
    for row in range(3):
        generated = blocked.tokens[row].tolist()
        for g, token in enumerate(generated):
            said = {generated[i + 1] for i in range(g - 1) if generated[i] == generated[g - 1]} if g else set()
            allowed = [t for t in blocked.logits[row, g].argsort(descending=True).tolist() if t not in said]
            assert token == allowed[0], f"row {row}, token {g}"


def test_block_repeated_ngrams_allows_what_the_prompt_said():
    model = tiny_model("llama", 4)
    schedule = Dense().build(4)
    ids, mask = left_padded_batch(batch=1, prompt_length=5, continuation=0)
    free = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=3).tokens
    echo = torch.cat([ids, free, ids], dim=1)  # the prompt says its last token, then free's first
    again = generate_under_schedule(model, echo, torch.ones_like(echo), schedule, max_new_tokens=3).tokens
    assert again[0, 0] == free[0, 0], "greedy decoding repeats the prompt's bigram across its end"
    blocked = generate_under_schedule(model, echo, torch.ones_like(echo), schedule, max_new_tokens=3,
                                      sampling=SamplingConfig(block_repeated_ngrams=2)).tokens
    assert blocked[0, 0] == free[0, 0]  # transformers' no_repeat_ngram_size=2 would ban it: it counts the prompt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"temperature": 0.0}, "temperature=0.0"), ({"top_k": -1}, "top_k=-1"), ({"top_p": 0.0}, "top_p=0.0"),
     ({"block_repeated_ngrams": -1}, "block_repeated_ngrams=-1")],
)
def test_bad_sampling_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(do_sample=True, **kwargs)


def test_max_new_tokens_must_be_positive():
    model = tiny_model("llama", 4)
    ids, mask = left_padded_batch(batch=1, prompt_length=3, continuation=0)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        generate_under_schedule(model, ids, mask, Dense().build(4), max_new_tokens=0)
