"""Lossless self-speculative decoding: full-depth tokens whatever the draft accepts, full-depth keys and values in the
cache after a verification, and the full-depth distribution when sampling (and a biased rule caught)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers.tiny_models import ARCHITECTURES, left_padded_batch, tiny_model
from helpers.tiny_tokenizer import build_tiny_tokenizer

import skiptrain.shipped.speculate as shared
from skiptrain import Dense, SamplingConfig, SkipDecode, Static, generate_under_schedule
from skiptrain.errors import UsageError
from skiptrain.frontends.decode import Decoder, complete, warn_unless_speculation_pays
from skiptrain.frontends.request import GenerationRequest
from skiptrain.frontends.speculative import SkipSteps, StepSeconds, generate_lossless
from skiptrain.modeling.loading import prepare_tokenizer
from skiptrain.shipped.gates import ColumnGate, checked_layers, gates_installed, own_forwards
from skiptrain.shipped.lossless import GatedSteps, sampling_warpers
from skiptrain.shipped.speculate import SpeculationStats, sampled_acceptance, speedup_bound

LAYERS = 6
NEW_TOKENS = 12
NEAR_TIE = 1e-4
FAMILIES = ARCHITECTURES  # sliding windows too: the cache is compacted after each verification
DRAFTS = {
    "decaying": SkipDecode(min_layers=2, max_layers=5, decay_tokens=3),  # accepts some drafts
    "one_layer": Static(layers=(0,)),  # layer 0 alone: its drafts are almost always rejected
}


def assert_full_depth_tokens(got: torch.Tensor, dense) -> None:
    """``got`` equals dense greedy decoding's tokens, or first differs where its top-2 logits are a near-tie."""
    for row, (mine, theirs) in enumerate(zip(got.tolist(), dense.tokens.tolist(), strict=True)):
        if mine == theirs:
            continue
        first = next(g for g, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
        top2 = dense.logits[row, first].topk(2).values
        assert float(top2[0] - top2[1]) < NEAR_TIE, f"row {row} differs at token {first} without a near-tie"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("draft_tokens", [1, 2, 5])
def test_greedy_tokens_are_full_depth_at_batch_1_and_3_for_every_draft(family, draft_tokens):
    model = tiny_model(family, LAYERS)
    for batch in (1, 3):
        ids, mask = left_padded_batch(batch=batch, prompt_length=7, continuation=0)
        dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS, return_logits=True)
        for name, draft in DRAFTS.items():
            out = generate_lossless(model, ids, mask, draft.build(LAYERS), NEW_TOKENS, draft_tokens)
            assert out.tokens.shape == dense.tokens.shape, name
            assert_full_depth_tokens(out.tokens, dense)
            assert out.stats.committed == (NEW_TOKENS - 1) * batch, "the first token comes from the prompt's forward"
            assert 0 <= out.stats.accepted <= out.stats.judged <= draft_tokens * out.stats.row_verifications


def test_a_draft_that_is_almost_always_rejected_still_makes_progress_and_is_counted():
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    out = generate_lossless(model, ids, mask, DRAFTS["one_layer"].build(LAYERS), NEW_TOKENS, 5)
    assert out.stats.acceptance_rate < 0.5, "precondition: random tiny models reject most drafts"
    assert out.stats.verifications >= (NEW_TOKENS - 1) / 2


@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_an_end_of_sequence_token_reached_mid_draft_ends_the_row_as_generate_does(family):
    model = tiny_model(family, LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    free = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS)
    eos = int(free.tokens[1, 3])  # row 1 ends at its fourth token, inside the first drafts of K = 5
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS, eos_token_id=eos,
                                    pad_token_id=0)
    for draft in DRAFTS.values():
        out = generate_lossless(model, ids, mask, draft.build(LAYERS), NEW_TOKENS, 5, eos_token_id=eos,
                                pad_token_id=0)
        assert torch.equal(out.tokens, dense.tokens)
        assert torch.equal(out.lengths, dense.lengths)
        assert int(out.lengths[1]) <= 4


class RecordingSteps(SkipSteps):
    """:class:`SkipSteps` that keep, after each verification, the cache, the attention mask and every column's token,
    and whose drafts for row 1 are spoiled (the argmax moved to the next id), so that its drafts are rejected.

    Each row's cached tokens are the first of those it was fed (the prompt, then each verification's columns, up to
    its rejected ones): as many as the mask of the cached columns counts, in its last columns.
    """

    def __init__(self, *args, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        super().__init__(*args)
        self.fed = [row[seen.bool()] for row, seen in zip(prompt_ids, prompt_mask, strict=True)]
        self.after_verification = []
        self.rows = list(range(len(prompt_ids)))  # the batch's rows, as numbered in the prompts
        select = self.cache.batch_select_indices

        def select_rows(rows):  # the rows that ended leave the batch
            select(rows)
            self.fed, self.rows = [self.fed[row] for row in rows.tolist()], [self.rows[row] for row in rows.tolist()]

        self.cache.batch_select_indices = select_rows

    def draft(self, input_ids, attention_mask, index):
        logits = super().draft(input_ids, attention_mask, index)
        if 1 in self.rows:  # until row 1 ends
            spoiled = self.rows.index(1)
            logits[spoiled] = logits[spoiled].roll(1)
        return logits

    def verify(self, input_ids, attention_mask, past):
        logits = super().verify(input_ids, attention_mask, past)
        cached = attention_mask[:, :past].sum(1).tolist()
        self.fed = [torch.cat([fed[:count], new]) for fed, count, new in zip(self.fed, cached, input_ids, strict=True)]
        ids = torch.zeros_like(attention_mask)
        for row, fed in enumerate(self.fed):
            ids[row, ids.shape[1] - len(fed):] = fed
        self.after_verification.append((ids, attention_mask, [(layer.keys.clone(), layer.values.clone())
                                                              for layer in self.cache.layers]))
        return logits


@pytest.mark.parametrize("family", FAMILIES)
def test_after_a_verification_the_cache_holds_exactly_the_full_depth_keys_and_values(family):
    """Against a full-depth prefill of the same tokens under the same mask (earlier rejected columns: padding, moved
    before each row's tokens)."""
    model = tiny_model(family, LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    steps = RecordingSteps(model, DRAFTS["decaying"].build(LAYERS), ids.shape[1], prompt_ids=ids, prompt_mask=mask)
    _, _, stats = shared.speculate(steps, ids, mask, NEW_TOKENS, 4)
    assert len(steps.after_verification) >= 3
    assert stats.accepted < stats.judged, "precondition: rejected columns, moved before their rows' tokens"
    for round_, (seen_ids, seen_mask, cache) in enumerate(steps.after_verification):
        reference = SkipSteps(model, Dense().build(LAYERS), 0)  # compacted rows: prompts may end before column P
        reference.prefill(seen_ids, seen_mask)
        tokens = seen_mask.bool()[:, None, :, None]  # [B, 1, S, 1]: columns that hold a token (not padding)
        for index, ((keys, values), theirs) in enumerate(zip(cache, reference.cache.layers, strict=True)):
            assert keys.shape == theirs.keys.shape, f"round {round_}, layer {index}"
            for mine, full in ((keys, theirs.keys), (values, theirs.values)):
                torch.testing.assert_close(mine * tokens, full * tokens, atol=1e-5, rtol=1e-5,
                                           msg=f"round {round_}, layer {index}")


def test_rows_keep_their_own_accepted_tokens_and_the_batch_minimum_is_also_lossless():
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS, return_logits=True)
    draft = DRAFTS["decaying"].build(LAYERS)
    own = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 4)
    fewest = generate_lossless(model, ids, mask, draft, NEW_TOKENS, 4, batch_minimum=True)
    assert_full_depth_tokens(own.tokens, dense)
    assert_full_depth_tokens(fewest.tokens, dense)
    assert own.stats.verifications < fewest.stats.verifications
    assert own.stats.tokens_per_verification > fewest.stats.tokens_per_verification


# -- sampling ------------------------------------------------------------------------------------------------------
VOCAB = 8
DRAWS = 20000


def chi_square_p_value(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    """Pearson's goodness-of-fit p-value, cells expecting fewer than 5 draws pooled into one."""
    expected = probabilities.double().flatten() * counts.sum()
    counts = counts.double().flatten()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))


def peaked_model() -> torch.nn.Module:
    """A tiny llama over 8 tokens whose logits are sharp enough that its one-layer draft disagrees with it."""
    model = tiny_model("llama", LAYERS, vocab_size=VOCAB, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(60)
    return model


def full_depth_joint(model: torch.nn.Module, prompt: torch.Tensor) -> torch.Tensor:
    """``[V, V, V]`` full-depth probabilities of the first three generated tokens after ``prompt`` ``[P]``."""
    grid = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))  # [V * V, 2]
    ids = torch.cat([prompt.expand(len(grid), -1), grid], 1)
    with torch.no_grad():
        probs = model(input_ids=ids).logits[:, prompt.numel() - 1:].float().softmax(-1)  # [V * V, 3, V]
    first = probs[0, 0]  # [V]
    second = probs[::VOCAB, 1].view(VOCAB, VOCAB)  # rows with the same first token share its next distribution
    third = probs[:, 2].view(VOCAB, VOCAB, VOCAB)
    return first[:, None, None] * second[:, :, None] * third


def sampled_first_tokens(model: torch.nn.Module, prompt: torch.Tensor, seed: int) -> torch.Tensor:
    """``[V, V, V]`` counts of the first three tokens of ``DRAWS`` speculative samples (K = 2, one-layer draft)."""
    ids = prompt.expand(DRAWS, -1)
    out = generate_lossless(model, ids, torch.ones_like(ids), DRAFTS["one_layer"].build(LAYERS), 3, 2,
                            sampling=SamplingConfig(do_sample=True), generator=torch.Generator().manual_seed(seed))
    cells = (out.tokens[:, 0] * VOCAB + out.tokens[:, 1]) * VOCAB + out.tokens[:, 2]
    return torch.bincount(cells, minlength=VOCAB**3).view(VOCAB, VOCAB, VOCAB)


def resample_from_p(verified, drafted, drafts, generator=None, proposed=None):
    """A biased rule: accepts as Leviathan et al., but replaces a rejected draft with a sample of ``p``, not of
    ``max(p - q, 0)``."""
    tokens, accepted = sampled_acceptance(verified, drafted, drafts, generator, proposed)
    fresh = torch.multinomial(verified.reshape(-1, verified.shape[-1]), 1, generator=generator).view(tokens.shape)
    rows = torch.arange(len(tokens))
    rejected = accepted < drafts.shape[1]
    tokens[rows[rejected], accepted[rejected]] = fresh[rows[rejected], accepted[rejected]]
    return tokens, accepted


def test_sampled_tokens_follow_the_full_depth_distribution_and_a_biased_rule_is_caught(monkeypatch):
    model = peaked_model()
    prompt = torch.tensor([[5, 3, 7, 4]])
    joint = full_depth_joint(model, prompt)
    draft = generate_lossless(model, prompt, torch.ones_like(prompt), DRAFTS["one_layer"].build(LAYERS), 3, 2)
    assert draft.stats.acceptance_rate < 1, "precondition: the draft disagrees with full depth"
    assert chi_square_p_value(sampled_first_tokens(model, prompt, seed=0), joint) > 1e-3
    monkeypatch.setattr(shared, "sampled_acceptance", resample_from_p)
    assert chi_square_p_value(sampled_first_tokens(model, prompt, seed=0), joint) < 1e-6


def test_the_rejection_rule_gives_p_at_every_draft_position_and_the_biased_one_does_not():
    generator = torch.Generator().manual_seed(0)
    rows, k = 50000, 2
    p = torch.softmax(3 * torch.randn(k + 1, VOCAB, generator=generator), -1).expand(rows, -1, -1)
    q = torch.softmax(3 * torch.randn(k, VOCAB, generator=generator), -1).expand(rows, -1, -1)
    drafts = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=generator).view(rows, k)
    for rule, fits in ((sampled_acceptance, True), (resample_from_p, False)):
        tokens, accepted = rule(p, q, drafts, torch.Generator().manual_seed(1))
        values = [chi_square_p_value(torch.bincount(tokens[accepted >= j, j], minlength=VOCAB), p[0, j])
                  for j in range(k + 1)]  # position j is reached when the j drafts before it were accepted
        if fits:
            assert min(values) > 1e-3, values
        else:
            assert min(values) < 1e-6, values


SAMPLINGS = [SamplingConfig(), SamplingConfig(do_sample=True), SamplingConfig(do_sample=True, temperature=0.6),
             SamplingConfig(do_sample=True, top_k=3), SamplingConfig(do_sample=True, top_p=0.8),
             SamplingConfig(do_sample=True, temperature=1.7, top_k=20, top_p=0.95), SamplingConfig(temperature=0.5)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=repr)
def test_the_shipped_warpers_are_sampling_configs_and_draw_the_same_tokens(sampling):
    """The export's lossless mode builds its warpers from transformers' options (``sampling_warpers``), skiptrain's
    from a :class:`~skiptrain.modeling.generation.SamplingConfig`: the same options give the same distribution, and
    with the same seed the same draws."""
    logits = 4 * torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    shipped = sampling_warpers(sampling.do_sample, sampling.temperature, sampling.top_k, sampling.top_p)
    ids = torch.zeros(len(logits), 0, dtype=torch.long)
    ours, theirs = sampling.warpers()(ids, logits.clone()).softmax(-1), shipped(ids, logits.clone()).softmax(-1)
    assert torch.equal(ours, theirs)
    draws = [torch.multinomial(probs, 8, replacement=True, generator=torch.Generator().manual_seed(1))
             for probs in (ours, theirs)]
    assert torch.equal(*draws)
    if sampling.do_sample and (sampling.top_k or sampling.top_p < 1 or sampling.temperature != 1):
        assert not torch.equal(ours, logits.softmax(-1)), "the warpers change the distribution"


def test_a_fixed_seed_repeats_the_draws():
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    sampling = SamplingConfig(do_sample=True, temperature=1.5, top_k=20)
    runs = [generate_lossless(model, ids, mask, DRAFTS["decaying"].build(LAYERS), NEW_TOKENS, 3,
                              sampling=sampling, generator=torch.Generator().manual_seed(seed)).tokens
            for seed in (4, 4, 5)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


# -- refusals and the bound -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"draft_tokens": -1}, "speculative=-1 is invalid with max_new_tokens=4: allowed 0 <= speculative <= 4"),
    ({"draft_tokens": 5}, "speculative=5 is invalid"),
    ({"draft_tokens": 2, "synced": True}, "synced=True is invalid with speculative decoding"),
    ({"draft_tokens": 2, "sampling": SamplingConfig(block_repeated_ngrams=3)},
     "sampling.block_repeated_ngrams=3 is invalid with speculative decoding: allowed 0"),
])
def test_what_cannot_be_decoded_losslessly_is_refused_in_one_line(kwargs, message):
    model = tiny_model("llama", LAYERS)
    ids, mask = left_padded_batch(batch=1, prompt_length=4, continuation=0)
    with pytest.raises(UsageError, match=message):
        generate_lossless(model, ids, mask, DRAFTS["decaying"].build(LAYERS), 4, **kwargs)
    with pytest.raises(ValueError, match="num_layers"):
        generate_lossless(model, ids, mask, DRAFTS["decaying"].build(LAYERS + 1), 4, 2)


def test_the_speedup_bound():
    assert speedup_bound(1.0, 4, 0.0) == 5.0  # every draft accepted and free: K + 1 tokens per full-depth step
    assert speedup_bound(0.0, 4, 0.5) == pytest.approx(1 / 3)  # nothing accepted: one token per 3 steps' cost
    assert speedup_bound(0.8, 2, 0.5) == pytest.approx((1 + 0.8 + 0.64) / 2)
    assert speedup_bound(0.8, 2, 0.5, verify_cost=2.0) == pytest.approx((1 + 0.8 + 0.64) / 3)  # v: 2 full steps



# -- saying when it does not pay ------------------------------------------------------------------------------------
UNPAID = "is slower than full-depth decoding on this model"
PROMPTS = ["Monday", "Rain", "Write the weather forecast.\nData: city[Oslo]\nForecast:", "The council met on",
           "Hello there", "A B C"]


def unpaid_warnings(recorded) -> list[str]:
    return [str(w.message) for w in recorded if UNPAID in str(w.message)]


def test_the_warning_measures_c_against_a_full_depth_step_and_says_what_to_do(recwarn):
    stats = SpeculationStats(verifications=4, draft_steps=16, judged=10, accepted=2)
    bound = warn_unless_speculation_pays(stats, StepSeconds(draft=1.6, verify=1.5), 4, 0.25)
    assert bound == pytest.approx(speedup_bound(0.2, 4, (1.6 / 16) / 0.25, (1.5 / 4) / 0.25))  # c = 0.4, v = 1.5
    (line,) = unpaid_warnings(recwarn)
    for part in ("speculative=4 is slower", "a = 0.20", "c = 0.40", "v = 1.50", f"= {bound:.2f}x", "joint objective "
                 "(--model.dense_loss_weight 1.0)", "--draft_vocab_size N", "smaller --speculative", "fewer layers",
                 "without --speculative"):
        assert part in line, (part, line)
    assert "\n" not in line
    assert warn_unless_speculation_pays(SpeculationStats(verifications=3), StepSeconds(verify=1.0), 4, 0.25) is None
    assert warn_unless_speculation_pays(replace(stats, accepted=10), StepSeconds(draft=1.6, verify=1.0), 4, 0.25) > 1
    assert len(unpaid_warnings(recwarn)) == 1, "no warning where every draft is accepted"


def test_an_untrained_draft_is_said_once_to_be_slower_and_a_draft_that_is_always_accepted_is_not(recwarn):
    """Three batches of a random model whose one-layer drafts are mostly rejected: one warning. The same request on
    a model whose layers after the first add nothing to the residual stream (output projections zeroed), so that
    its one-layer draft is its full-depth model and every draft is accepted at a fraction of the cost: none."""
    tokenizer = prepare_tokenizer(build_tiny_tokenizer())
    request = GenerationRequest(16, batch_size=2, speculative=8)
    untrained = tiny_model("llama", LAYERS, vocab_size=len(tokenizer))
    stats = complete(Decoder(untrained, tokenizer), Static(layers=(0,)).build(LAYERS), PROMPTS, request)[1]
    assert stats.speculation.acceptance_rate < 0.5, "precondition: random tiny models reject most drafts"
    (line,) = unpaid_warnings(recwarn)
    assert "speculative=8 is slower" in line

    recwarn.clear()
    shallow = tiny_model("llama", 12, vocab_size=len(tokenizer))
    with torch.no_grad():
        for layer in shallow.model.layers[1:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    stats = complete(Decoder(shallow, tokenizer), Static(layers=(0,)).build(12), PROMPTS,
                     GenerationRequest(16, batch_size=2, speculative=4))[1]
    assert stats.speculation.acceptance_rate == 1.0
    assert not unpaid_warnings(recwarn)
    complete(Decoder(untrained, tokenizer), Static(layers=(0,)).build(LAYERS), PROMPTS, request, advise=False)
    assert not unpaid_warnings(recwarn), "advise=False (generate's warm-up) says nothing"


# -- the command line -------------------------------------------------------------------------------------------------
def test_generate_speculative_writes_the_full_depth_completions_and_reports_acceptance_and_cost(skip_export, tmp_path):
    from skiptrain.cli.app import main
    from skiptrain.cli.trainer import SkipTrainer
    from skiptrain.training.module import SkipLM

    export = skip_export("llama")
    prompts, output = tmp_path / "prompts.txt", tmp_path / "out.jsonl"
    prompts.write_text("The council met\nDescribe the weather in one sentence. Forecast: city[Oslo]\nHello\n")
    common = ["generate", "--model.model", str(export), "--prompts", str(prompts), "--max_new_tokens", "10",
              "--batch_size", "3", "--trainer.accelerator", "cpu", "--trainer.logger", "false"]
    main([*common, "--output", str(output), "--dense", "true"])
    dense = output.read_text()
    draft = tmp_path / "draft.yaml"
    draft.write_text("class_path: skiptrain.Static\ninit_args:\n  layers: [0, 4, 5]\n")
    main([*common, "--output", str(output), "--speculative", "2", "--draft_schedule", str(draft)])
    assert output.read_text() == dense

    trainer = SkipTrainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    for compare in (False, True):
        report = trainer.generate(SkipLM(str(export)), prompts=str(prompts), output=str(output), max_new_tokens=10,
                                  batch_size=3, speculative=3, compare_dense=compare)
        assert output.read_text() == dense
        summary = report.summary()
        for part in ("lossless speculative decoding", "acceptance", "tokens per verification", "of a full-depth step",
                     "bound (1 - a^(K+1)) / ((1 - a)(K c + v))", "tokens/s"):
            assert part in summary, (part, summary)
        assert ("measured speedup" in summary) == compare, summary
        assert report.speculation.stats.speculation.judged >= report.speculation.stats.speculation.accepted > 0



def test_generate_speculative_says_once_when_its_first_batch_makes_it_slower(skip_export, tmp_path, recwarn):
    from skiptrain.cli.app import main

    prompts, draft = tmp_path / "prompts.txt", tmp_path / "draft.yaml"
    prompts.write_text("The council met\nDescribe the weather in one sentence.\nHello\n")
    draft.write_text("class_path: skiptrain.Static\ninit_args:\n  layers: [0]\n")
    report = main(["generate", "--model.model", str(skip_export("llama")), "--prompts", str(prompts),
                   "--output", str(tmp_path / "out.jsonl"), "--max_new_tokens", "12", "--batch_size", "1",
                   "--speculative", "8", "--draft_schedule", str(draft), "--trainer.accelerator", "cpu"])
    assert report.speculation.acceptance < 0.5, "precondition: a random model's one-layer drafts are mostly rejected"
    (line,) = unpaid_warnings(recwarn)  # three batches, one line
    assert line.startswith("speculative=8 is slower than full-depth decoding") and "--model.dense_loss_weight" in line


def test_schedule_from_file_takes_an_export_json_a_family_or_a_recipe_fragment(skip_export, tmp_path):
    from skiptrain.core.schedule_files import schedule_from_file
    from skiptrain.core.schedules import ScheduleError

    export = skip_export("llama")
    own = schedule_from_file(str(export / "skip_schedule.json"), LAYERS)
    assert own == SkipDecode(max_layers=5, min_layers=2, decay_tokens=4).build(LAYERS)
    fragment = tmp_path / "fragment.yaml"
    fragment.write_text("model:\n  schedule:\n    class_path: skiptrain.Static\n    init_args: {depth: 3}\n")
    assert schedule_from_file(str(fragment), LAYERS) == Static(depth=3).build(LAYERS)
    with pytest.raises(ScheduleError, match=r"draft_schedule=.*num_layers=6 of the schedule does not match the "
                                            r"model's 4"):
        schedule_from_file(str(export / "skip_schedule.json"), 4, "draft_schedule")
    fragment.write_text("class_path: skiptrain.Nope\n")
    with pytest.raises(ScheduleError, match=r"class_path='skiptrain.Nope' is invalid: allowed one of"):
        schedule_from_file(str(fragment), LAYERS)


def test_the_lossless_profile_breaks_a_round_down_on_a_tiny_model():
    from argparse import Namespace

    from benchmarks.speed.lossless_profile import exact_prefix, profile_batch

    model, draft = tiny_model("llama", LAYERS), DRAFTS["decaying"].build(LAYERS)
    ids, mask = left_padded_batch(3, 5, 0)
    args = Namespace(draft_tokens=3, context=2, padding=4, rounds=2, new_tokens=8)
    with torch.no_grad():
        row = profile_batch(model, draft, ids, mask, args, eos=None, pad=0)
    assert row["cache_columns"] == 5 + 2 and row["padded"]["cache_columns"] == 5 + 2 + 4
    assert row["draft_exact_prefix_layers"] == exact_prefix(draft, 2) < LAYERS
    for name in ("full", "draft", "verify"):
        sections = row["sections_ms"][name]
        assert sections["decoder layers"] > 0 and sections["lm head"] > 0
        assert sections["total"] >= sections["decoder layers"] + sections["lm head"]
    assert list(row["lm_head_ms_by_rows"]) == ["1", "2", "3", "4", "6", "12"]  # up to B (K + 1) columns
    assert 0 < row["sections_ms"]["verify"]["recomputed draft layers"] < row["sections_ms"]["verify"]["decoder layers"]
    decode = row["decode"]
    assert decode["tokens_generated"] == 3 * 8  # no end of sequence: every row runs to new_tokens
    assert abs(sum(decode["share"].values()) - 1) < 0.01 and set(decode["share"]) == {
        "prefill", "draft", "verify", "cache compaction", "loop bookkeeping"}
    assert 0 < decode["kept_per_row_column_verified"] <= 1


def calls_rows(steps):
    """``steps`` with each call's kind and row count recorded in ``steps.rows_seen``."""
    steps.rows_seen = []
    for kind in ("prefill", "draft", "verify"):
        call = getattr(steps, kind)
        setattr(steps, kind, lambda input_ids, *args, kind=kind, call=call: steps.rows_seen.append(
            (kind, len(input_ids))) or call(input_ids, *args))
    return steps


@pytest.mark.parametrize("family", FAMILIES)
def test_a_row_that_ends_leaves_the_batch_and_every_row_keeps_its_full_depth_tokens(family):
    """Through both steps (skiptrain's forward and the export's gated model): after a row ends no call brings it."""
    model = tiny_model(family, LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    free = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS)
    eos = int(free.tokens[1, 3])  # row 1 ends by its fourth token
    dense = generate_under_schedule(model, ids, mask, Dense().build(LAYERS), NEW_TOKENS, eos_token_id=eos,
                                    pad_token_id=0, return_logits=True)
    assert int(dense.lengths.min()) < int(dense.lengths.max()), "precondition: rows end at different tokens"
    draft = DRAFTS["decaying"].build(LAYERS)
    layers = checked_layers(model)
    gate = ColumnGate(ids.shape[1], range(LAYERS), [draft.executed_layers(g) for g in range(NEW_TOKENS)])
    own = calls_rows(SkipSteps(model, draft, ids.shape[1]))
    decoded = {own: shared.speculate(own, ids, mask, NEW_TOKENS, 3, eos, 0)}
    gated = calls_rows(GatedSteps(model, gate))
    with gates_installed(layers, own_forwards(layers), gate):
        decoded[gated] = shared.speculate(gated, ids, mask, NEW_TOKENS, 3, eos, 0)
    for steps, (tokens, lengths, stats) in decoded.items():
        assert_full_depth_tokens(tokens, dense)
        assert torch.equal(lengths, dense.lengths)
        sizes = [rows for _, rows in steps.rows_seen]
        assert sizes[0] == 3 and sizes[-1] < 3 and sizes == sorted(sizes, reverse=True), steps.rows_seen
        assert stats.row_verifications == sum(rows for kind, rows in steps.rows_seen if kind == "verify")
