"""The draft levers of lossless speculative decoding: a pruned draft vocabulary and a confidence threshold. Each
keeps the output exactly full depth's (greedy tokens, the sampled distribution), in skiptrain's decoder and the
export's ``generate(speculative_tokens=K)``; only what is proposed and accepted changes."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import left_padded_batch, tiny_model
from test_speculative import (
    DRAFTS,
    FAMILIES,
    LAYERS,
    NEW_TOKENS,
    VOCAB,
    assert_full_depth_tokens,
    chi_square_p_value,
    full_depth_joint,
    peaked_model,
)
from transformers import AutoModelForCausalLM

import skiptrain.shipped.speculate as shared
from skiptrain import Dense, SamplingConfig, generate_under_schedule, load_exported
from skiptrain.errors import InputError, UsageError
from skiptrain.export.format import read_record
from skiptrain.export.record import ExportRecord
from skiptrain.export.verify import verify_export
from skiptrain.export.write import write_export
from skiptrain.frontends.speculative import generate_lossless
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.shipped.draft_head import DRAFT_VOCAB_FILE, DraftHead
from skiptrain.shipped.speculate import sampled_acceptance

HALF = torch.arange(0, 97, 2)  # every other id of the tiny models' 97: it leaves out many full-depth tokens
LEVERS = {"vocab": {"draft_vocab": HALF}, "confidence": {"draft_confidence": 0.5},
          "both": {"draft_vocab": HALF, "draft_confidence": 0.5}}


@pytest.mark.parametrize("family", ["llama", "opt", "gpt2", "gemma2"])
def test_the_draft_head_scores_the_vocabulary_rows_as_the_full_head_and_nothing_else(family):
    """As the model's own head (Gemma 2: with its final logit soft-capping), -inf outside the vocabulary."""
    model = tiny_model(family, LAYERS)
    parts = decoder_parts(model)
    hidden = torch.randn(3, model.config.hidden_size)
    head = DraftHead(parts.lm_head, HALF, model.config)
    full, mine = parts.logits(hidden).float(), head(hidden)
    torch.testing.assert_close(mine[:, HALF], full[:, HALF])
    outside = torch.ones(full.shape[-1], dtype=torch.bool)
    outside[HALF] = False
    assert bool(torch.isneginf(mine[:, outside]).all())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lever", LEVERS)
def test_greedy_tokens_stay_full_depth_with_each_lever_and_both_at_batch_3(family, lever):
    model = tiny_model(family, LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS, return_logits=True)
    out = generate_lossless(model, ids, mask, DRAFTS["decaying"].build(LAYERS), NEW_TOKENS, 4, **LEVERS[lever])
    assert_full_depth_tokens(out.tokens, dense)
    stats = out.stats
    assert stats.committed == (NEW_TOKENS - 1) * 3
    assert 0 <= stats.accepted <= stats.judged <= stats.proposed <= 4 * stats.row_verifications


def test_a_vocabulary_without_the_full_depth_tokens_accepts_nothing_and_stays_exact():
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS, return_logits=True)
    left_out = torch.ones(97, dtype=torch.bool)
    left_out[dense.tokens.flatten()] = False
    draft = DRAFTS["decaying"].build(LAYERS)
    full = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 3)
    out = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 3, draft_vocab=left_out.nonzero().flatten())
    assert full.stats.accepted > 0, "precondition: the whole vocabulary accepts some drafts"
    assert out.stats.accepted == 0 and out.stats.judged > 0
    assert_full_depth_tokens(out.tokens, dense)


def test_a_threshold_below_every_greedy_draft_probability_changes_nothing_and_a_high_one_drafts_less():
    """A greedy draft is its distribution's argmax, so its probability is at least 1/V: a threshold below that stops
    no row, and the stats are exactly those without one."""
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    draft = DRAFTS["decaying"].build(LAYERS)
    off = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 4)
    assert off.stats.judged <= off.stats.proposed
    low = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 4, draft_confidence=0.5 / 97)
    assert low.stats == off.stats and torch.equal(low.tokens, off.tokens)
    high = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 4, draft_confidence=0.9)
    assert torch.equal(high.tokens, off.tokens)
    assert high.stats.proposed < off.stats.proposed and high.stats.draft_steps < off.stats.draft_steps
    assert high.stats.drafts_per_verification < off.stats.drafts_per_verification
    assert high.stats.judged <= high.stats.proposed


def test_rows_of_a_batch_propose_different_draft_lengths_in_one_round(monkeypatch):
    """Seen where the rejection rule judges a round: the rows' proposed counts differ (the threshold is near 1/V,
    where the random tiny model's draft probabilities lie)."""
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    rounds = []

    def recording(verified, drafted, drafts, generator=None, proposed=None):
        rounds.append(proposed)
        return sampled_acceptance(verified, drafted, drafts, generator, proposed)

    monkeypatch.setattr(shared, "sampled_acceptance", recording)
    generate_lossless(model, ids, mask, DRAFTS["decaying"].build(LAYERS), NEW_TOKENS, 4,
                      sampling=SamplingConfig(do_sample=True), generator=torch.Generator().manual_seed(0),
                      draft_confidence=0.01)
    assert any(len(set(proposed.tolist())) > 1 for proposed in rounds), rounds


# -- sampling -------------------------------------------------------------------------------------------------------
DRAWS = 20000
PEAKED_VOCAB = torch.tensor([0, 2, 3, 5, 6])  # leaves out tokens full depth samples


def sampled_with_levers(model, prompt, seed):
    """``[V, V, V]`` counts of the first three tokens of ``DRAWS`` speculative samples with both levers, and the
    speculation counts."""
    ids = prompt.expand(DRAWS, -1)
    # 4 new tokens: the first round then drafts 2, so the threshold can stop a row after its first draft
    out = generate_lossless(model, ids, torch.ones_like(ids), DRAFTS["one_layer"].build(LAYERS), 4, 2,
                            sampling=SamplingConfig(do_sample=True), generator=torch.Generator().manual_seed(seed),
                            draft_vocab=PEAKED_VOCAB, draft_confidence=0.9)
    cells = (out.tokens[:, 0] * VOCAB + out.tokens[:, 1]) * VOCAB + out.tokens[:, 2]
    return torch.bincount(cells, minlength=VOCAB**3).view(VOCAB, VOCAB, VOCAB), out.stats


def residual_where_not_proposed(verified, drafted, drafts, generator=None, proposed=None):
    """A biased rule: a row that stopped proposing takes, at its first not-proposed column, a sample of the residual
    ``max(p - q, 0)`` of the draft it did not propose, instead of ``p``."""
    tokens, accepted = sampled_acceptance(verified, drafted, drafts, generator)
    if proposed is None or drafts.shape[1] == 0:
        return tokens, accepted
    rows = torch.arange(len(tokens))
    stopped = (proposed < drafts.shape[1]) & (accepted >= proposed)
    residual = (verified[:, :-1] - drafted).clamp(min=0)
    at = proposed.clamp(max=drafts.shape[1] - 1)
    chosen = residual[rows, at]
    chosen = torch.where(chosen.sum(-1, keepdim=True) > 0, chosen, verified[rows, at])
    fresh = torch.multinomial(chosen, 1, generator=generator).squeeze(1)
    tokens[rows[stopped], at[stopped]] = fresh[stopped]
    return tokens, accepted.minimum(proposed)


def test_sampled_tokens_with_both_levers_follow_the_full_depth_distribution_and_a_biased_rule_is_caught(monkeypatch):
    model = peaked_model()
    prompt = torch.tensor([[7, 7, 7, 7]])  # its drafts are often accepted, and often stopped at the threshold
    joint = full_depth_joint(model, prompt)
    counts, stats = sampled_with_levers(model, prompt, seed=0)
    assert stats.proposed < stats.draft_steps * DRAWS, "precondition: the threshold stops some rows"
    assert chi_square_p_value(counts, joint) > 1e-3
    monkeypatch.setattr(shared, "sampled_acceptance", residual_where_not_proposed)
    assert chi_square_p_value(sampled_with_levers(model, prompt, seed=0)[0], joint) < 1e-6


# -- refusals -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"draft_confidence": 1.0}, r"draft_confidence=1.0 is invalid: allowed 0 <= draft_confidence < 1"),
    ({"draft_confidence": -0.1}, r"draft_confidence=-0.1 is invalid: allowed 0 <= draft_confidence < 1"),
    ({"draft_vocab": torch.tensor([1, 1])}, r"draft_vocab=\[1, 1\] is invalid: allowed distinct token ids in "
                                            r"\[0, 97\)"),
    ({"draft_vocab": torch.tensor([3, 97])}, r"draft_vocab=\[3, 97\] is invalid: allowed distinct token ids"),
    ({"draft_vocab": torch.tensor([], dtype=torch.long)}, r"draft_vocab=\[\] is invalid: allowed a non-empty list"),
    ({"draft_vocab": [1, 2]}, r"draft_vocab=<list of shape \(\)> is invalid: allowed a non-empty list \(1-D "),
])
def test_bad_levers_are_refused_in_one_line(kwargs, message):
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=1, prompt_length=4, continuation=0)
    with pytest.raises(UsageError, match=message) as caught:
        generate_lossless(model, ids, mask, DRAFTS["decaying"].build(LAYERS), 4, 2, **kwargs)
    assert "\n" not in str(caught.value)


# -- the export and its custom_generate ------------------------------------------------------------------------------
EXPORT_VOCAB = tuple(range(96, 0, -2))  # most frequent first, as the export writes it


@pytest.fixture(scope="module")
def vocab_export(tiny_model_dir, tmp_path_factory):
    """A merged export of a tiny 6-layer llama that records :data:`EXPORT_VOCAB` as its draft vocabulary."""
    from conftest import EXPORT_SCHEDULES

    model_dir = tiny_model_dir("llama", 6)
    target = tmp_path_factory.mktemp("vocab_export") / "export"
    write_export(load_causal_lm(model_dir), load_tokenizer(model_dir), EXPORT_SCHEDULES["skipdecode"].build(6),
                 target, ExportRecord(model_dir, draft_vocab=EXPORT_VOCAB))
    return target


def test_the_export_writes_and_reads_its_draft_vocabulary_and_refuses_a_broken_one(vocab_export, tmp_path):
    import shutil

    assert json.loads((vocab_export / DRAFT_VOCAB_FILE).read_text()) == list(EXPORT_VOCAB)
    schedule = json.loads((vocab_export / "skip_schedule.json").read_text())
    assert schedule["draft_vocab_size"] == len(EXPORT_VOCAB)
    assert json.loads((vocab_export / "config.json").read_text())["skip_schedule"] == schedule
    assert read_record(vocab_export).draft_vocab == EXPORT_VOCAB == verify_export(vocab_export).draft_vocab
    assert load_exported(vocab_export).record.draft_vocab == EXPORT_VOCAB
    broken = tmp_path / "broken"
    shutil.copytree(vocab_export, broken)
    (broken / DRAFT_VOCAB_FILE).write_text(json.dumps(list(EXPORT_VOCAB[:-1])))
    with pytest.raises(InputError, match=r"draft_vocab.json is not a draft vocabulary: allowed 48 ids "
                                         r"\(draft_vocab_size=48 in skip_schedule.json\); restore it or export again"):
        verify_export(broken)
    (broken / DRAFT_VOCAB_FILE).unlink()
    with pytest.raises(InputError, match=r"draft_vocab.json is missing"):
        verify_export(broken)


def hf_skip_model(path):
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()


def test_custom_generate_drafts_over_the_recorded_vocabulary_and_stays_full_depth(vocab_export):
    """With the recorded vocabulary the drafts skip the model's LM head (their own scores its rows): the head runs for
    the prompt and the verifications alone."""
    tokenizer = load_tokenizer(str(vocab_export))
    batch = dict(tokenizer(["The council met", "Describe the weather in one sentence. Forecast: city[Oslo]",
                            "Hello"], return_tensors="pt", padding=True))
    dense = AutoModelForCausalLM.from_pretrained(vocab_export).eval().generate(**batch, max_new_tokens=NEW_TOKENS,
                                                                                do_sample=False)
    model = hf_skip_model(vocab_export)
    calls = []
    model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    head_calls = {}
    for confidence in (0.0, 0.4):
        for vocab in (None, False):  # None: the recorded one; False: the whole vocabulary
            calls.clear()
            out = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, speculative_tokens=3,
                                 draft_confidence=confidence, draft_vocab=vocab)
            assert torch.equal(out, dense), (confidence, vocab)
            head_calls[confidence, vocab] = len(calls)
    for confidence in (0.0, 0.4):
        assert head_calls[confidence, None] < head_calls[confidence, False], head_calls


def test_the_two_front_ends_sample_the_same_tokens_with_both_levers_under_one_seed(vocab_export):
    tokenizer = load_tokenizer(str(vocab_export))
    batch = dict(tokenizer(["The council met", "Hello there", "Describe the weather"], return_tensors="pt",
                           padding=True))
    skip_model, schedule, _ = load_exported(vocab_export)
    ends = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    options = {"do_sample": True, "temperature": 0.8, "top_k": 6}
    torch.manual_seed(11)
    expected = generate_lossless(skip_model, batch["input_ids"], batch["attention_mask"], schedule, NEW_TOKENS, 3,
                                 sampling=SamplingConfig(**options), draft_vocab=torch.tensor(EXPORT_VOCAB),
                                 draft_confidence=0.3, **ends)
    torch.manual_seed(11)
    out = hf_skip_model(vocab_export).generate(**batch, max_new_tokens=NEW_TOKENS, speculative_tokens=3,
                                               draft_confidence=0.3, **options, **ends)
    assert torch.equal(out[:, batch["input_ids"].shape[1]:], expected.tokens)


def test_custom_generate_refuses_bad_levers_in_one_line(vocab_export):
    model = hf_skip_model(vocab_export)
    batch = dict(load_tokenizer(str(vocab_export))(["Hello"], return_tensors="pt"))
    for kwargs, message in (
        ({"speculative_tokens": 2, "draft_confidence": 1.5}, r"draft_confidence=1.5 is invalid: allowed 0 <="),
        ({"speculative_tokens": 2, "draft_vocab": [5, 5]}, r"draft_vocab is invalid: allowed distinct token ids"),
        ({"draft_confidence": 0.5}, r"draft_confidence and draft_vocab are invalid without speculative_tokens"),
    ):
        with pytest.raises(ValueError, match=message):
            model.generate(**batch, max_new_tokens=3, **kwargs)


# -- the command line -------------------------------------------------------------------------------------------------
def test_export_records_the_most_frequent_training_targets_and_generate_drafts_over_them(tiny_model_dir, tmp_path):
    from collections import Counter

    from helpers.cli_args import tiny_args

    from skiptrain.cli.app import main
    from skiptrain.data.datamodule import SkipDataModule

    model_dir = tiny_model_dir("llama", 6)
    export = tmp_path / "export"
    data = ("--data.task", "builtin", "--data.max_train_samples", "16")
    main(["export", *tiny_args(model_dir, tmp_path / "run", *data), "--output_dir", str(export),
          "--draft_vocab_size", "8"])
    vocab = json.loads((export / DRAFT_VOCAB_FILE).read_text())
    assert read_record(export).draft_vocab == tuple(vocab) and len(vocab) == 8

    datamodule = SkipDataModule(task="builtin", tokenizer=model_dir, max_train_samples=16, max_source_tokens=48,
                                max_target_tokens=24)
    datamodule.setup("fit")
    counts = Counter(label for batch in datamodule.train_dataloader() for label in batch["labels"].flatten().tolist()
                     if label != -100)
    assert [counts[i] for i in vocab] == sorted(counts.values(), reverse=True)[:8], "the 8 most frequent, in order"

    prompts, output = tmp_path / "prompts.txt", tmp_path / "out.jsonl"
    prompts.write_text("The council met\nDescribe the weather in one sentence. Forecast: city[Oslo]\nHello\n")
    common = ["generate", "--model.model", str(export), "--prompts", str(prompts), "--max_new_tokens", "8",
              "--batch_size", "3", "--trainer.accelerator", "cpu", "--output", str(output)]
    main([*common, "--dense", "true"])
    dense = output.read_text()
    report = main([*common, "--speculative", "3"])  # over the recorded vocabulary
    assert output.read_text() == dense
    other = tmp_path / "vocab.json"
    other.write_text(json.dumps(list(range(0, 60, 3))))
    lowered = main([*common, "--speculative", "3", "--draft_vocab", str(other), "--draft_confidence", "0.3"])
    assert output.read_text() == dense
    proposed = [r.speculation.stats.speculation for r in (report, lowered)]
    assert proposed[1].proposed < proposed[0].proposed, "the threshold stops drafts"
