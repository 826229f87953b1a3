"""Which E2E attributes a run's outputs leave out, by attribute and by the size of the meaning representation.

    python benchmarks/e2e/slot_errors.py dense+lora_all_r64 calibrated2x+lora_all_r64 skipdecode3x+lora_all_r64

Reads ``benchmarks/results/e2e/study/NAME.{dev,test}.outputs.jsonl`` (written by ``score.py``) and prints a
Markdown table: per split and run, the share of the MR's attributes that its output does not mention, overall,
for MRs of up to 6 and of 7-8 attributes, and per attribute. An attribute counts as mentioned when the output
contains its value or a common paraphrase of it (below); the rules are deliberately simple, so the table is for
comparing runs on the same MRs, not an absolute slot error rate. Polarity (``familyFriendly[no]`` said as
"family-friendly") is not checked.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

STUDY = Path("benchmarks/results/e2e/study")
ATTRIBUTE = re.compile(r"(\w[\w ]*?)\[(.*?)\]")
# Paraphrases of values that outputs often use instead of the value itself (lower case, regular expressions).
PARAPHRASES = {
    ("area", "city centre"): r"cent(re|er)",
    ("area", "riverside"): r"river",
    ("familyFriendly", "yes"): r"famil|kid|child",
    ("familyFriendly", "no"): r"famil|kid|child",
    ("priceRange", "cheap"): r"cheap|inexpensive|low[- ]pric|affordable",
    ("priceRange", "less than £20"): r"£20|20 pounds|cheap|inexpensive|low[- ]pric",
    ("priceRange", "moderate"): r"moderate|average[- ]pric|mid",
    ("priceRange", "£20-25"): r"£20|20-25|25",
    ("priceRange", "high"): r"high[- ]pric|expensive|pricey",
    ("priceRange", "more than £30"): r"£30|30 pounds|expensive|high[- ]pric",
    ("customer rating", "low"): r"low|poor|1 star|one star",
    ("customer rating", "average"): r"average|3 star|three star",
    ("customer rating", "high"): r"high|excellent|5 star|five star",
    ("customer rating", "1 out of 5"): r"1 out of 5|one star|1 star|low",
    ("customer rating", "3 out of 5"): r"3 out of 5|three star|3 star|average",
    ("customer rating", "5 out of 5"): r"5 out of 5|five star|5 star|high",
}


def attributes(mr: str) -> list[tuple[str, str]]:
    """``name[The Eagle], food[Fast food]`` -> ``[("name", "The Eagle"), ("food", "Fast food")]``."""
    return [(key.strip(), value.strip()) for key, value in ATTRIBUTE.findall(mr)]


def mentioned(attribute: tuple[str, str], text: str) -> bool:
    """Whether ``text`` mentions the attribute's value (or a paraphrase of it)."""
    key, value = attribute
    text = text.lower()
    pattern = PARAPHRASES.get(attribute)
    if pattern is not None:
        return re.search(pattern, text) is not None
    value = value.lower().removeprefix("the ")
    return value in text


def omissions(path: Path) -> dict:
    """Omitted/total attribute counts of one outputs file: overall, by MR size and by attribute."""
    counts: dict[str, list[int]] = {}

    def add(bucket: str, missed: int, total: int) -> None:
        tally = counts.setdefault(bucket, [0, 0])
        tally[0] += missed
        tally[1] += total

    for line in path.read_text().splitlines():
        row = json.loads(line)
        slots = attributes(row["source"])
        missed = [slot for slot in slots if not mentioned(slot, row["prediction"])]
        add("all", len(missed), len(slots))
        add("MRs of <= 6" if len(slots) <= 6 else "MRs of 7-8", len(missed), len(slots))
        for key, _ in slots:
            add(key, sum(slot[0] == key for slot in missed), 1)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="study run names (results/e2e/study/NAME.SPLIT.outputs.jsonl)")
    args = parser.parse_args()
    table = {(split, run): omissions(STUDY / f"{run}.{split}.outputs.jsonl")
             for split in ("dev", "test") for run in args.runs}
    buckets = ["all", "MRs of <= 6", "MRs of 7-8"] + sorted({b for c in table.values() for b in c} -
                                                            {"all", "MRs of <= 6", "MRs of 7-8"})
    print("| split | run | " + " | ".join(f"omitted: {b}" for b in buckets) + " |")
    print("|---|---|" + "---:|" * len(buckets))
    for (split, run), counts in table.items():
        cells = [f"{100 * counts[b][0] / counts[b][1]:.1f}% ({counts[b][0]}/{counts[b][1]})" if b in counts else "-"
                 for b in buckets]
        print(f"| {split} | {run} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
