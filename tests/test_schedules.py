"""Schedule invariants over many parameter draws, derived quantities, serialisation and every refusal."""

import json
import random

import pytest
from helpers.schedules import random_family

from skiptrain.core.schedules import (
    Dense,
    Hierarchical,
    Ranked,
    ScheduleError,
    SkipDecode,
    SkipSchedule,
    Static,
)
from skiptrain.core.speedup import skipdecode_for_speedup

DRAWS = [(seed, random.Random(seed).choice([3, 4, 6, 12, 24, 30, 32])) for seed in range(400)]


@pytest.mark.parametrize(("seed", "num_layers"), DRAWS)
def test_invariants_hold_for_random_parameters(seed, num_layers):
    family = random_family(random.Random(seed * 7919 + 1), num_layers)
    schedule = family.build(num_layers)
    horizon = schedule.span + 5
    sets = schedule.materialize(horizon)
    assert set(sets[0]) <= set(schedule.prompt_layers)
    for g in range(horizon):
        layers = schedule.executed_layers(g)
        assert 0 in layers, "layer 0 must always run"
        assert all(0 <= i < num_layers for i in layers)
        assert list(layers) == sorted(set(layers))
        if g:
            assert set(layers) <= set(schedule.executed_layers(g - 1)), "nesting"
    assert sets[-1] == schedule.executed_layers(10_000)
    # deterministic and lossless through JSON
    assert family.build(num_layers) == schedule
    again = SkipSchedule.from_json(schedule.to_json())
    assert again == schedule and again.to_dict() == schedule.to_dict()
    # run lengths agree with the per-position definition
    prompt_length, generated = 3, horizon
    lengths = schedule.layer_run_lengths(prompt_length, prompt_length + generated)
    for layer, length in enumerate(lengths):
        runs = [c for c in range(prompt_length + generated)
                if layer in (schedule.prompt_layers if c < prompt_length else sets[c - prompt_length])]
        assert runs == list(range(length)), f"layer {layer} must run a prefix of columns"


def test_skipdecode_linear_decay_bottom_plus_top():
    schedule = SkipDecode(min_layers=6, max_layers=24, warmup_layers=1, decay_tokens=10).build(24)
    counts = [len(schedule.executed_layers(g)) for g in range(12)]
    assert counts == [24, 23, 21, 19, 17, 15, 14, 12, 10, 8, 6, 6]
    assert schedule.executed_layers(10) == (0, 19, 20, 21, 22, 23)
    assert schedule.prompt_layers == tuple(range(24))
    assert schedule.span == 11


def test_hierarchical_power_of_two_strides_by_phase():
    schedule = Hierarchical(phase_boundaries=(2, 5), warmup_layers=1).build(12)
    assert schedule.executed_layers(0) == tuple(range(12))
    assert schedule.executed_layers(2) == (0, 2, 4, 6, 8, 10, 11)
    assert schedule.executed_layers(5) == (0, 4, 8, 11)
    assert schedule.executed_layers(500) == (0, 4, 8, 11)


def test_ranked_takes_a_prefix_of_its_ranking_over_the_warmup_layers():
    ranking = (3, 0, 5, 1, 2, 4)
    schedule = Ranked(min_layers=3, max_layers=5, warmup_layers=1, decay_tokens=2, ranking=ranking).build(6)
    assert schedule.materialize() == [(0, 1, 2, 3, 5), (0, 1, 3, 5), (0, 3, 5)]
    assert schedule.prompt_layers == tuple(range(6))


@pytest.mark.parametrize("num_layers", [4, 12, 30])
def test_ranked_with_the_top_down_ranking_is_skipdecode(num_layers):
    params = {"min_layers": 2, "max_layers": num_layers - 1, "warmup_layers": 1, "decay_tokens": 9}
    ranked = Ranked(ranking=tuple(reversed(range(num_layers))), **params).build(num_layers)
    assert ranked.executed_layers_table == SkipDecode(**params).build(num_layers).executed_layers_table


def test_ranked_ranking_round_trips_and_a_tampered_one_is_refused():
    schedule = Ranked(min_layers=2, max_layers=4, decay_tokens=3, ranking=[0, 2, 4, 1, 3, 5]).build(6)
    data = json.loads(schedule.to_json())
    assert data["params"]["ranking"] == [0, 2, 4, 1, 3, 5]
    assert SkipSchedule.from_dict(data) == schedule
    swapped = {**data, "params": {**data["params"], "ranking": [0, 1, 4, 2, 3, 5]}}
    with pytest.raises(ScheduleError, match="does not rebuild the stored layer lists"):
        SkipSchedule.from_dict(swapped)
    repeated = {**data, "params": {**data["params"], "ranking": [0, 2, 2, 1, 3, 5]}}
    with pytest.raises(ScheduleError, match="ranking=.* is invalid: allowed a permutation of the layers 0..5"):
        SkipSchedule.from_dict(repeated)


def test_static_and_dense_and_prompt_depth():
    assert Static(depth=3).build(8).executed_layers(0) == (0, 6, 7)
    assert Static(layers=(0, 3, 5)).build(8).executed_layers(9) == (0, 3, 5)
    assert Dense().build(5).executed_layers(100) == (0, 1, 2, 3, 4)
    assert Static(depth=3, prompt_depth="max").build(8).prompt_layers == (0, 6, 7)


def test_derived_quantities():
    schedule = Static(depth=6).build(24)
    assert schedule.mean_layers_per_token(50) == 6
    assert schedule.sequence_ideal_speedup(50) == 4
    assert schedule.layer_flop_fraction(prompt_length=100, generation_length=100) == pytest.approx((100 + 25) / 200)
    decay = SkipDecode(min_layers=2, max_layers=4, decay_tokens=2).build(4)  # counts 4, 3, 2, 2, ...
    assert decay.mean_layers_per_token(4) == pytest.approx((4 + 3 + 2 + 2) / 4)
    assert decay.layer_flop_fraction(0, 3) == pytest.approx((4 + 3 + 2) / 12)


def test_describe_merges_runs():
    text = Hierarchical(phase_boundaries=(0, 4)).build(8).describe()
    assert "| 0-3 | 0, 2, 4, 6-7 | 5 |" in text
    assert "| 4+ | 0, 4, 7 | 3 |" in text


@pytest.mark.parametrize("target", [2.0, 3.0, 4.0])
def test_speedup_helper_reaches_target(target):
    family = skipdecode_for_speedup(24, target, decay_tokens=100, generation_length=100)
    assert family.build(24).sequence_ideal_speedup(100) == pytest.approx(target, rel=0.05)
    fixed = skipdecode_for_speedup(24, target, decay_tokens=50, generation_length=200, max_layers=24)
    assert fixed.max_layers == 24
    assert fixed.build(24).sequence_ideal_speedup(200) == pytest.approx(target, rel=0.1)


def test_export_schema_keys():
    data = json.loads(SkipDecode(min_layers=3, max_layers=5, decay_tokens=4).build(6).to_json(base_model="x"))
    assert data["format"] == "skiptrain.skip_schedule" and data["schema_version"] == 1
    assert data["family"] == "skipdecode" and data["position"] == "generated_index" and data["nested"] is True
    assert data["params"] == {"prompt_depth": "all", "min_layers": 3, "max_layers": 5, "warmup_layers": 1,
                              "decay_tokens": 4}
    assert data["executed_layers"][0] == [0, 2, 3, 4, 5] and data["executed_layers"][-1] == [0, 4, 5]
    assert data["base_model"] == "x"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SkipDecode(min_layers=5, max_layers=4).build(8), "max_layers"),
        (lambda: SkipDecode(min_layers=9).build(8), "min_layers"),
        (lambda: SkipDecode(min_layers=1, warmup_layers=1).build(8), "min_layers"),
        (lambda: SkipDecode(min_layers=3, warmup_layers=0).build(8), "warmup_layers"),
        (lambda: SkipDecode(min_layers=3, decay_tokens=0).build(8), "decay_tokens"),
        (lambda: SkipDecode(min_layers=3, prompt_depth="some").build(8), "prompt_depth"),
        (lambda: Ranked(min_layers=3).build(8), "ranking"),
        (lambda: Ranked(min_layers=3, ranking=(0, 1, 2, 3)).build(8), "ranking"),
        (lambda: Ranked(min_layers=1, ranking=range(8)).build(8), "min_layers"),
        (lambda: Hierarchical(phase_boundaries=(4, 2)).build(8), "phase_boundaries"),
        (lambda: Hierarchical(phase_boundaries=()).build(8), "phase_boundaries"),
        (lambda: Hierarchical(phase_boundaries=(0, 1), max_level=3).build(8), "max_level"),
        (lambda: Hierarchical(phase_boundaries=(0, 1, 2)).build(8), "max_level"),
        (lambda: Hierarchical(phase_boundaries=(0,), warmup_layers=0).build(8), "warmup_layers"),
        (lambda: Static(layers=(1, 2)).build(8), "executed_layers[0]"),
        (lambda: Static(layers=(0, 9)).build(8), "executed_layers[0]"),
        (lambda: Static(layers=(0, 2, 1)).build(8), "executed_layers[0]"),
        (lambda: Static(depth=1).build(8), "depth"),
        (lambda: Static().build(8), "layers/depth"),
        (lambda: Dense().build(0), "num_layers"),
        (lambda: SkipSchedule(4, (0, 1), ((0, 1, 2),)), "executed_layers[0]"),
        (lambda: SkipSchedule(4, (0, 1, 2, 3), ((0, 3), (0, 2, 3))), "executed_layers[1]"),
        (lambda: SkipSchedule(4, (0, 1, 2, 3), ()), "executed_layers"),
        (lambda: Dense().build(4).check_num_layers(6), "num_layers"),
        (lambda: Dense().build(4).executed_layers(-1), "g"),
        (lambda: Dense().build(4).layer_run_lengths(5, 3), "prompt_length"),
        (lambda: skipdecode_for_speedup(8, 0.5, decay_tokens=16), "target_speedup"),
        (lambda: skipdecode_for_speedup(8, 2.0, decay_tokens=16, max_layers=1), "max_layers"),
    ],
)
def test_refusals_name_the_field(build, field):
    with pytest.raises(ScheduleError) as err:
        build()
    assert str(err.value).startswith(f"{field}=")
    assert "allowed" in str(err.value) or "match" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format="other"), "format="),
        (lambda d: d.update(schema_version=2), "schema_version=2 is not supported"),
        (lambda d: d.update(position="column"), "position="),
        (lambda d: d.pop("executed_layers"), "missing the key 'executed_layers'"),
        (lambda d: d.update(executed_layers=[[0, 1], [0, 1, 2]]), "nesting"),
        (lambda d: d["params"].update(min_layers=2), "does not rebuild"),
        (lambda d: d.update(prompt_layers=5), "malformed"),
    ],
)
def test_malformed_serialised_schedules_are_refused(edit, message):
    data = SkipDecode(min_layers=3, decay_tokens=4).build(6).to_dict()
    edit(data)
    with pytest.raises(ScheduleError, match=message):
        SkipSchedule.from_dict(data)


def test_explicit_layer_lists_round_trip():
    schedule = SkipSchedule(4, (0, 1, 2, 3), ((0, 2, 3), (0, 3)))
    assert SkipSchedule.from_json(schedule.to_json()) == schedule
    with pytest.raises(ScheduleError, match="not valid JSON"):
        SkipSchedule.from_json("{")
