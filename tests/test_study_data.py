"""The study's data subsets: the E2E data-scale curve's training subsets are nested and start from the shipped one."""

import csv
from collections import Counter

from benchmarks.quality.e2e.prepare_train import subset


def read_rows(path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as file:
        return list(csv.reader(file))[1:]


def test_training_subsets_are_nested_and_start_from_the_shipped_2000_pairs(shared_data):
    official = read_rows(shared_data / "e2e/official/trainset.csv")
    shipped = read_rows(shared_data / "e2e/subsets/trainset_2000.csv")
    sizes = {size: subset(official, size) for size in (2000, 4000, 8000)}
    assert sizes[2000] == shipped
    for smaller, larger in ((2000, 4000), (4000, 8000)):
        assert len(sizes[larger]) == larger
        assert not Counter(map(tuple, sizes[smaller])) - Counter(map(tuple, sizes[larger]))
