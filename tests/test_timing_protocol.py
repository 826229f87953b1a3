"""The timing protocol every speed benchmark uses (benchmarks/common/timing.py): interleaved order, per-round ratios
and their spread on fake clocks, the "not shown" verdict, and the refusal to compare arms that did different work."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from benchmarks.common.timing import Done, Pass, claim, compare, measure, median_interval, order, run


class FakeClock:
    """A clock that only moves when a pass says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_arms(clock: FakeClock, cpu: FakeClock, seconds: dict[str, list[float]], calls: list[str],
              work: dict[str, object] | None = None) -> dict:
    """Pass functions that advance the clocks by their next scripted duration (wall; CPU at half of it)."""

    def arm(name: str):
        durations = iter(seconds[name])

        def one_pass():
            calls.append(name)
            step = next(durations)
            clock.now += step
            cpu.now += step / 2
            return (work or {}).get(name, 8)
        return one_pass
    return {name: arm(name) for name in seconds}


def test_order_rotates_so_no_arm_always_goes_first():
    assert [order("AB", i) for i in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert [order("ABC", i) for i in range(3)] == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"]]


def test_run_interleaves_drops_the_warm_up_and_keeps_every_pass():
    clock, cpu, calls = FakeClock(), FakeClock(), []
    seconds = {"dense": [9.0, 2.0, 2.2, 1.8, 2.0, 2.4], "skip": [9.0, 1.0, 1.0, 1.2, 0.8, 1.0]}
    timing = run(fake_arms(clock, cpu, seconds, calls), rounds=5, warmup=1, clock=clock, cpu_clock=cpu, log=None)
    assert calls == ["dense", "skip", "skip", "dense", "dense", "skip", "skip", "dense", "dense", "skip", "skip",
                     "dense"]
    assert timing.order == [["skip", "dense"], ["dense", "skip"], ["skip", "dense"], ["dense", "skip"],
                            ["skip", "dense"]]
    assert [p.wall_s for p in timing.passes["dense"]] == pytest.approx([2.0, 2.2, 1.8, 2.0, 2.4])  # no 9 s warm-up
    assert [p.cpu_s for p in timing.passes["skip"]] == pytest.approx([0.5, 0.5, 0.6, 0.4, 0.5])
    report = json.loads(json.dumps(timing.report({"skip": ("dense", "skip")})))
    assert len(report["passes"]["dense"]) == 5 and report["passes"]["skip"][0] == pytest.approx(
        {"wall_s": 1.0, "cpu_s": 0.5, "work": 8})
    assert len(report["load_average_before"]) == 3 and "cpu_flags" in report["machine"]
    skip = report["comparisons"]["skip"]
    assert skip["wall"]["pair_ratios"] == pytest.approx([2.0, 2.2, 1.5, 2.5, 2.4])
    assert skip["wall"]["median"] == pytest.approx(2.2)
    assert (skip["wall"]["min"], skip["wall"]["max"]) == pytest.approx((1.5, 2.5))
    assert skip["cpu"]["median"] == pytest.approx(2.2)  # both clocks moved at half speed
    assert skip["claim_wall"] == "2.20x (1.50-2.50)"


def test_interval_of_the_median_is_the_order_statistics_with_95_percent_coverage():
    low, high, coverage = median_interval([5, 1, 4, 2, 3])
    assert (low, high, coverage) == (1, 5, 0.9375)  # 5 pairs: only min..max reaches 93.75%
    low, high, coverage = median_interval(list(range(10)))
    assert (low, high) == (1, 8) and coverage == pytest.approx(1 - 2 * 11 / 1024)
    low, high, _ = median_interval(list(range(20)))
    assert (low, high) == (5, 14)  # P(Bin(20, 1/2) <= 5) = 0.0207 <= 2.5%, and <= 6 is 0.0577


def test_a_ratio_whose_interval_holds_one_is_not_shown():
    baseline = [Pass(s, None, 1) for s in (1.0, 1.1, 0.9, 1.05, 1.0)]
    candidate = [Pass(1.0, None, 1)] * 5
    result = compare(baseline, candidate)
    assert result["cpu"] is None
    assert claim(result["wall"]) == "not shown (0.90-1.10)"
    assert claim(compare([Pass(0.7, 0.7, 1)] * 5, candidate)["wall"]) == "0.70x (0.70-0.70)"  # a slowdown, shown
    assert claim(None) == "not measured"
    assert claim(compare([Pass(2.0, 2.0, 1)] * 4, candidate[:4])["wall"]) == "not shown (4 pairs)"  # 87.5% only


def test_arms_that_did_different_work_get_no_ratio():
    clock, cpu, calls = FakeClock(), FakeClock(), []
    seconds = {"dense": [1.0] * 3, "skip": [0.5] * 3}
    arms = fake_arms(clock, cpu, seconds, calls, work={"dense": [3, 5], "skip": [3, 4]})
    comparison = run(arms, rounds=2, warmup=1, clock=clock, cpu_clock=cpu, log=None).compare("dense", "skip")
    assert "wall" not in comparison and comparison["refused"].startswith("different work in rounds [0, 1]")
    assert comparison["claim_wall"] == "refused"
    with pytest.raises(ValueError, match="as many passes"):
        compare([Pass(1.0, 1.0, 1)], [])


def test_a_pass_in_another_process_brings_its_own_cpu_seconds():
    assert measure(lambda: Done(work=3, cpu_s=None)).cpu_s is None
    measured = measure(lambda: Done(work=3, cpu_s=7.5))
    assert (measured.cpu_s, measured.work) == (7.5, 3) and 0 <= measured.wall_s < 1


def test_real_clocks_measure_a_busy_pass():
    def busy() -> int:
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass
        return 1
    measured = measure(busy)
    assert measured.wall_s >= 0.005 and measured.cpu_s > 0
    phase = measured.minus(Pass(0.001, 0.0, 1))
    assert phase.wall_s == pytest.approx(measured.wall_s - 0.001) and phase.work == 1


def test_two_vllm_steps_take_turns_in_the_protocols_order(tmp_path):
    from benchmarks.speed.serving import Turns, turn_schedule

    schedule = turn_schedule(2, [1, 8])
    assert schedule == ["skip", "dense", "dense", "skip", "dense", "skip", "skip", "dense", "skip", "dense"]
    ran: list[str] = []

    def step(name: str) -> None:
        turn = Turns(tmp_path, name, schedule)
        for _ in range(schedule.count(name)):
            with turn:
                ran.append(name)

    skip = threading.Thread(target=step, args=("skip",))
    skip.start()  # the skip step starts first and opens the turns
    dense = threading.Thread(target=step, args=("dense",))
    dense.start()
    skip.join(timeout=30)
    dense.join(timeout=30)
    assert ran == schedule


def test_the_lossless_arms_do_the_same_work_and_speculation_keeps_full_depths_outputs():
    from helpers.tiny_models import left_padded_batch, tiny_model

    from benchmarks.speed.lossless import Decoding, timing
    from skiptrain import Dense, SkipDecode, generate_under_schedule

    model, dense = tiny_model("llama", 6), Dense().build(6)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    eos = int(generate_under_schedule(model, ids, mask, dense, 8).tokens[0, 2])  # row 0 stops at its third token
    decoding = Decoding(model, [{"prompt_input_ids": ids, "prompt_attention_mask": mask}], 8, eos, 0, {})
    row = timing(decoding, SkipDecode(max_layers=5, min_layers=2, decay_tokens=4).build(6), dense, [2], rounds=2,
                 warmup=0, label="")
    works = {arm: [p["work"] for p in passes] for arm, passes in row["timing"]["passes"].items()}
    assert works == {arm: [row["steps_per_batch"]] * 2 for arm in ("full_depth", "speculative_k2", "skip_schedule")}
    assert row["speculative"][0]["differing_outputs"] == 0 and 0 <= row["speculative"][0]["acceptance"] <= 1
    for name in ("speculative_k2", "skip_schedule"):
        comparison = row["timing"]["comparisons"][name]
        assert comparison["baseline"] == "full_depth" and len(comparison["wall"]["pair_ratios"]) == 2
    assert row["skip_schedule"]["claim_wall"] == "not shown (2 pairs)"


@pytest.mark.parametrize("frontend", ["transformers", "both"])
def test_the_transformers_lossless_arms_do_the_same_work_and_keep_full_depths_outputs(frontend):
    from helpers.tiny_models import left_padded_batch, tiny_model

    from benchmarks.speed.lossless import Decoding, timing
    from skiptrain import Dense, SkipDecode, generate_under_schedule

    model, dense = tiny_model("llama", 6), Dense().build(6)
    ids, mask = left_padded_batch(batch=3, prompt_length=7, continuation=0)
    eos = int(generate_under_schedule(model, ids, mask, dense, 8).tokens[0, 2])  # row 0 stops at its third token
    levers = {"draft_vocab": torch.arange(0, model.config.vocab_size, 2), "draft_confidence": 0.1}
    batches = [{"prompt_input_ids": ids[:1], "prompt_attention_mask": mask[:1]},  # ends at its third token
               {"prompt_input_ids": ids, "prompt_attention_mask": mask}]
    decoding = Decoding(model, batches, 8, eos, 0, levers)
    row = timing(decoding, SkipDecode(max_layers=5, min_layers=2, decay_tokens=4).build(6), dense, [2, 3], rounds=2,
                 warmup=0, label="", frontend=frontend)
    works = {arm: [p["work"] for p in passes] for arm, passes in row["timing"]["passes"].items()}
    hf = row["transformers"]
    assert row["steps_per_batch"] == [3, 8]
    assert hf["generated_length_per_batch"] == row["steps_per_batch"] and hf["tokens"] == row["tokens"]
    arms = ["hf_full_depth", "hf_speculative_k2", "hf_speculative_k3"]
    if frontend == "both":
        arms += ["full_depth", "speculative_k2", "speculative_k3", "skip_schedule"]
    assert works == {arm: [row["steps_per_batch"]] * 2 for arm in arms}
    assert hf["full_depth_differing_from_skiptrain"] == 0
    assert [one["draft_tokens"] for one in hf["speculative"]] == [2, 3]
    assert all(one["differing_outputs"] == 0 for one in hf["speculative"] + row.get("speculative", []))
    assert ("speculative" in row) == (frontend == "both")
    for k in (2, 3):
        comparison = row["timing"]["comparisons"][f"hf_speculative_k{k}"]
        assert comparison["baseline"] == "hf_full_depth" and len(comparison["wall"]["pair_ratios"]) == 2
    assert hf["speculative"][0]["claim_wall"] == "not shown (2 pairs)"
