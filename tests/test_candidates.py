"""The candidate search of ``skiptrain calibrate`` without a model: the request's checks, each family's space, the
target windows of the search, grids, and the Pareto front and the choice per target on constructed tables."""

from __future__ import annotations

import math

import pytest

from skiptrain.core.candidates import (
    DEFAULT_TARGETS,
    SEARCHED_FAMILIES,
    CalibrationRequest,
    Candidate,
    best_for_target,
    family_space,
    grid_candidates,
    highest_speedup,
    pareto_front,
    search_candidates,
)
from skiptrain.core.schedules import Dense, Ranked, ScheduleError, SkipDecode, Static
from skiptrain.core.speedup import batch_ideal_speedup
from skiptrain.errors import InputError, UsageError

LENGTHS, RANKING = [10, 14, 20], [0, 5, 1, 4, 2, 3]


def candidate(loss: float, speedup: float) -> Candidate:
    return Candidate(Static(depth=2), loss, 6 / speedup, speedup)


def test_pareto_front_of_a_constructed_table():
    a, b, c, d, e, f = (candidate(1.0, 1.0), candidate(1.2, 1.5), candidate(1.3, 1.4), candidate(1.2, 1.6),
                        candidate(2.0, 3.0), candidate(2.0, 2.5))
    assert pareto_front([e, c, b, a, d, f]) == [a, d, e]  # b is beaten by d, c by d, f by e
    assert pareto_front([a]) == [a]
    assert best_for_target([a, b, c, d, e, f], 1.45) is d
    assert best_for_target([a, b, c, d, e, f], 2.0) is e
    assert best_for_target([a, b, c, d, e, f], 3.5) is None


def test_best_for_target_of_one_family_and_the_row():
    skip = Candidate(SkipDecode(min_layers=2, decay_tokens=4), 1.5, 3.0, 2.0, {"bleu": 0.25})
    static = Candidate(Static(depth=3), 1.4, 3.0, 2.0)
    assert best_for_target([skip, static], 2.0) is static
    assert best_for_target([skip, static], 2.0, "skipdecode") is skip
    assert best_for_target([skip, static], 2.0, "hierarchical") is None
    row = skip.row()
    assert row["family"] == "skipdecode" and row["params"]["min_layers"] == 2 and row["bleu"] == 0.25
    assert row["perplexity"] == pytest.approx(math.exp(1.5))


def test_family_spaces_enumerate_every_configuration():
    skipdecode = family_space("skipdecode", 6, LENGTHS, RANKING)
    assert {f.decay_tokens for f in skipdecode} == {14, 20}  # the median and the longest target length
    assert len(skipdecode) == 2 * (5 + 4 + 3 + 2 + 1)  # 2 <= min_layers <= max_layers <= 6, per decay span
    ranked = family_space("ranked", 6, LENGTHS, RANKING)
    assert len(ranked) == len(skipdecode) and all(isinstance(f, Ranked) and f.ranking == tuple(RANKING) for f in ranked)
    hierarchical = family_space("hierarchical", 6, LENGTHS, RANKING)
    assert len(hierarchical) == 7 + 21  # one or two phase starts among 0, 1, 2, 4, 8, 12, 16 (below 20)
    assert [f.depth for f in family_space("static", 6, LENGTHS, RANKING)] == [2, 3, 4, 5, 6]
    with pytest.raises(ScheduleError, match=r"family='dense' is invalid for calibration: allowed \['skipdecode'"):
        family_space("dense", 6, LENGTHS, RANKING)


def test_search_keeps_up_to_per_target_configurations_in_each_target_window():
    targets, tolerance, per_target = [1.5, 2.0, 2.9], 0.15, 3
    for name in SEARCHED_FAMILIES:
        space = family_space(name, 6, LENGTHS, RANKING)
        cost = {f: batch_ideal_speedup(f.build(6), LENGTHS) for f in space}
        for target in targets:
            chosen = search_candidates([name], [target], 6, LENGTHS, RANKING, per_target, tolerance)
            window = [f for f in space if target <= cost[f] <= target * (1 + tolerance)]
            if window:
                assert chosen and set(chosen) <= set(window) and len(chosen) <= per_target, (name, target)
            else:  # the closest above the target, if any reaches it
                above = [f for f in space if cost[f] >= target]
                assert chosen == ([min(above, key=cost.get)] if above else []), (name, target)
    found = search_candidates(SEARCHED_FAMILIES, targets, 6, LENGTHS, RANKING, per_target, tolerance)
    each = [f for name in SEARCHED_FAMILIES for target in targets
            for f in search_candidates([name], [target], 6, LENGTHS, RANKING, per_target, tolerance)]
    assert found == list(dict.fromkeys(each)), "every family and target searched, a configuration scored once"
    assert {f.name for f in found} == set(SEARCHED_FAMILIES)


def test_grid_leaves_out_invalid_combinations_and_names_bad_fields():
    grid = {"skipdecode": {"min_layers": [2, 4], "max_layers": [3, 6], "decay_tokens": [8]},
            "ranked": {"min_layers": [3]}}
    found = grid_candidates(grid, 6, [0, 5, 4, 3, 2, 1])
    assert SkipDecode(min_layers=4, max_layers=3, decay_tokens=8) not in found  # min > max is left out
    assert len([f for f in found if f.name == "skipdecode"]) == 3
    assert [f.ranking for f in found if f.name == "ranked"] == [(0, 5, 4, 3, 2, 1)]
    with pytest.raises(ScheduleError, match=r"parameters \['min_layer'\] are invalid"):
        grid_candidates({"skipdecode": {"min_layer": [2]}}, 6, [])
    with pytest.raises(ScheduleError, match="grid family='skip' is invalid"):
        grid_candidates({"skip": {}}, 6, [])
    with pytest.raises(ScheduleError, match=r"has no valid schedule for 6 decoder layers.*first refused: skipdecode"):
        grid_candidates({"skipdecode": {"min_layers": [7]}}, 6, [])


def test_highest_speedup_bounds_every_realised_speedup():
    assert highest_speedup([Dense(), Static(depth=2)], 6) == 3.0
    hierarchical = family_space("hierarchical", 6, LENGTHS, RANKING)
    assert highest_speedup(hierarchical, 6) == 2.0  # stride 4 keeps layers 0, 4 and 5
    space = [f for name in SEARCHED_FAMILIES for f in family_space(name, 6, LENGTHS, RANKING)]
    highest = highest_speedup(space, 6)
    assert max(batch_ideal_speedup(f.build(6), LENGTHS) for f in space) <= highest


def test_request_defaults_and_a_grid_read_from_its_file(tmp_path):
    request = CalibrationRequest.checked(6)
    assert request.targets == DEFAULT_TARGETS and request.families == SEARCHED_FAMILIES and request.grid is None
    grid = tmp_path / "grid.yaml"
    grid.write_text("skipdecode: {min_layers: 2, max_layers: [3, 4], decay_tokens: 8}\n")
    request = CalibrationRequest.checked(6, targets=[1.2], grid=str(grid))
    assert request.grid == {"skipdecode": {"min_layers": [2], "max_layers": [3, 4], "decay_tokens": [8]}}
    with pytest.raises(ScheduleError, match=r"targets=\[3.5\] are invalid .* 1 <= target <= 3.00, the most the grid.s"):
        CalibrationRequest.checked(6, targets=[3.5], grid=str(grid))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"families": ["skipdecod"]}, "families=['skipdecod'] is invalid: allowed some of"),
        ({"families": []}, "families=[] is invalid"),
        ({"per_target": 0}, "per_target=0 is invalid: allowed >= 1"),
        ({"generation_batches": -1}, "generation_batches=-1 is invalid: allowed >= 0"),
        ({"tolerance": -0.1}, "tolerance=-0.1 is invalid"),
        ({"tolerance": float("nan")}, "tolerance=nan is invalid"),
        ({"num_batches": 0}, "num_batches=0 is invalid: allowed -1 (all) or >= 1"),
        ({"num_batches": -2}, "num_batches=-2 is invalid"),
        ({"targets": [0.5]}, "target=0.5 is invalid: allowed ideal speedups >= 1"),
        ({"targets": [1.5, 100]}, "targets=[100] are invalid for a model of 4 decoder layers: allowed ideal speedups "
                                  "1 <= target <= 2.00, the most the families"),
    ],
)
def test_request_refusals_name_the_option(options, message):
    with pytest.raises(UsageError) as err:
        CalibrationRequest.checked(4, **options)
    assert str(err.value).startswith(message), str(err.value)


def test_request_refuses_an_unreadable_grid(tmp_path):
    with pytest.raises(InputError, match="grid=.*no.yaml.* cannot be read"):
        CalibrationRequest.checked(6, grid=str(tmp_path / "no.yaml"))
