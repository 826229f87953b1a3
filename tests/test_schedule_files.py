"""Schedule files given as options: a skip_schedule.json, a family YAML alone or as a recipe fragment, a calibration
grid; each refusal names the option and the file."""

from __future__ import annotations

import pytest

from skiptrain.core.schedule_files import read_grid, schedule_from_file
from skiptrain.core.schedules import Ranked, ScheduleError, SkipDecode, Static
from skiptrain.errors import InputError, UsageError


def test_a_skip_schedule_json_is_read_as_stored(tmp_path):
    schedule = Ranked(min_layers=2, decay_tokens=3, ranking=(0, 3, 1, 2, 5, 4)).build(6)
    path = tmp_path / "skip_schedule.json"
    path.write_text(schedule.to_json(base_model="x"))
    assert schedule_from_file(str(path), 6) == schedule


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("family.yaml", "class_path: skiptrain.SkipDecode\ninit_args: {min_layers: 2, decay_tokens: 4}\n"),
        ("family.yml", "class_path: SkipDecode\ninit_args:\n  min_layers: 2\n  decay_tokens: 4\n"),
        ("fragment.yaml", "model:\n  schedule:\n    class_path: skiptrain.SkipDecode\n"
                          "    init_args: {min_layers: 2, decay_tokens: 4}\n"),
    ],
)
def test_a_family_yaml_is_built_for_the_model(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert schedule_from_file(str(path), 6) == SkipDecode(min_layers=2, decay_tokens=4).build(6)
    assert schedule_from_file(str(path), 8) == SkipDecode(min_layers=2, decay_tokens=4).build(8)


def test_a_family_without_parameters(tmp_path):
    path = tmp_path / "dense.yaml"
    path.write_text("class_path: skiptrain.Dense\n")
    assert schedule_from_file(str(path), 3).executed_layers(0) == (0, 1, 2)


@pytest.mark.parametrize(
    ("name", "text", "error", "message"),
    [
        ("s.json", Static(depth=2).build(6).to_json(), ScheduleError,
         r"draft_schedule='.*s.json': num_layers=6 of the schedule does not match the model's 4"),
        ("s.json", "{", ScheduleError, r"draft_schedule='.*s.json': skip schedule is not valid JSON"),
        ("s.yaml", "class_path: skiptrain.Nope\n", ScheduleError,
         r"draft_schedule='.*s.yaml': class_path='skiptrain.Nope' is invalid: allowed one of \['Dense'"),
        ("s.yaml", "- 1\n- 2\n", ScheduleError, r"class_path=\[1, 2\] is invalid"),
        ("s.yaml", "class_path: skiptrain.Static\ninit_args: {depht: 2}\n", ScheduleError,
         r"draft_schedule='.*s.yaml': .*depht"),
        ("s.yaml", "class_path: skiptrain.Static\ninit_args: {depth: 9}\n", ScheduleError,
         r"draft_schedule='.*s.yaml': depth=9 is invalid: allowed 2 <= depth <= num_layers=4"),
        ("s.yaml", "class_path: [", InputError, r"draft_schedule='.*s.yaml' is not valid YAML"),
    ],
)
def test_refusals_name_the_option_and_the_file(tmp_path, name, text, error, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(error, match=message):
        schedule_from_file(str(path), 4, "draft_schedule")


def test_a_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match=r"schedule='.*none.yaml' cannot be read \(FileNotFoundError\): give a "):
        schedule_from_file(str(tmp_path / "none.yaml"), 4)


def test_a_grid_file_takes_single_values_as_lists(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("skipdecode: {min_layers: [2, 3], decay_tokens: 8}\nstatic: {depth: 2}\n")
    assert read_grid(path) == {"skipdecode": {"min_layers": [2, 3], "decay_tokens": [8]}, "static": {"depth": [2]}}


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("- skipdecode\n", UsageError, r"grid='.*grid.yaml' is invalid: allowed a YAML mapping"),
        ("skipdecode: [2, 3]\n", UsageError, r"grid='.*grid.yaml' is invalid"),
        ("skipdecode: {min_layers: [2\n", InputError, r"grid='.*grid.yaml' cannot be read"),
        (None, InputError, r"grid='.*grid.yaml' cannot be read"),
    ],
)
def test_grid_refusals(tmp_path, text, error, message):
    path = tmp_path / "grid.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(error, match=message):
        read_grid(path)
