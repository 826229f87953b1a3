"""benchmarks/quality/repeats.py counts the word trigrams an output says more than once."""

import json

from benchmarks.quality.repeats import references, repetition


def test_repetition_counts_repeated_trigrams_within_each_output_only():
    # "a b c" repeats within the first output; the second says it once more, but in another output
    repeating, repeated, words = repetition(["A b c a b c", "x y a b c"])
    assert (repeating, repeated, words) == (0.5, 1 / 7, 5.5)  # 1 of the 4 + 3 trigrams repeats
    assert repetition(["one two"]) == (0.0, 0.0, 2.0)  # too short for a trigram


def test_references_are_read_from_csv_and_json_lines_in_row_order(tmp_path):
    (tmp_path / "refs.csv").write_text('article,highlights\n"x, y",first\nz,"second, said"\n')
    (tmp_path / "refs.jsonl").write_text("\n".join(json.dumps({"summary": s}) for s in ("first", "second")) + "\n")
    assert references(tmp_path / "refs.csv", "highlights") == ["first", "second, said"]
    assert references(tmp_path / "refs.jsonl", "summary") == ["first", "second"]
