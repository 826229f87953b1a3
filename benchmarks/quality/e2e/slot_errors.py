"""Which E2E attributes a run's outputs leave out: by attribute, by MR size, and by where the dense run says them.

    python benchmarks/quality/e2e/slot_errors.py dense+lora_all_r64 calibrated2x+lora_all_r64 skipdecode3x+lora_all_r64

Reads ``benchmarks/results/e2e/study/NAME.SPLIT.outputs.jsonl`` (written by ``score.py``; SPLIT: ``--splits``,
default dev and test) and prints a Markdown table: per split and run, the share of the MR's attributes that its
output does not mention, overall, for MRs of up to 6 and of 7-8 attributes, by the word at which a reference run
(``--reference``, default the first run named, e.g. the dense ceiling) says the attribute in its own output for the
same MR, and per attribute. An attribute counts as mentioned when the output contains its value or a common
paraphrase of it (below); the rules are deliberately simple, so the table is for comparing runs on the same MRs, not
an absolute slot error rate. Polarity (``familyFriendly[no]`` said as "family-friendly") is not checked.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

STUDY = Path("benchmarks/results/e2e/study")
ATTRIBUTE = re.compile(r"(\w[\w ]*?)\[(.*?)\]")
# Paraphrases of values that outputs often use instead of the value itself (lower case, regular expressions).
RATED = r"(rat|star|review)"  # a customer rating's value counts only near one of these words
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
}
for value, said in {"low": "low|poor|1 out of 5|one", "average": "average|3 out of 5|three",
                    "high": "high|excellent|5 out of 5|five", "1 out of 5": "1 out of 5|one|low",
                    "3 out of 5": "3 out of 5|three|average", "5 out of 5": "5 out of 5|five|high"}.items():
    PARAPHRASES[("customer rating", value)] = rf"\b({said})\b.{{0,25}}{RATED}|{RATED}.{{0,25}}\b({said})\b"


def attributes(mr: str) -> list[tuple[str, str]]:
    """``name[The Eagle], food[Fast food]`` -> ``[("name", "The Eagle"), ("food", "Fast food")]``."""
    return [(key.strip(), value.strip()) for key, value in ATTRIBUTE.findall(mr)]


def mention(attribute: tuple[str, str], text: str) -> int | None:
    """Word index in ``text`` where the attribute's value (or a paraphrase of it) is first said, or ``None``."""
    key, value = attribute
    text = text.lower()
    pattern = PARAPHRASES.get(attribute, re.escape(value.lower().removeprefix("the ")))
    found = re.search(pattern, text)
    return None if found is None else len(text[: found.start()].split())


def position_bucket(word: int) -> str:
    return "words 0-9" if word < 10 else "words 10-19" if word < 20 else "words 20+"


def omissions(path: Path, reference: Path) -> dict[str, list[int]]:
    """``[omitted, total]`` attribute counts of one outputs file: overall, by MR size, by where the reference
    run's output (same MRs, same order) says the attribute, and by attribute."""
    counts: dict[str, list[int]] = {}

    def add(bucket: str, missed: bool) -> None:
        tally = counts.setdefault(bucket, [0, 0])
        tally[0] += missed
        tally[1] += 1

    rows = [json.loads(line) for line in path.read_text().splitlines()]
    reference_rows = [json.loads(line) for line in reference.read_text().splitlines()]
    for row, reference_row in zip(rows, reference_rows, strict=True):
        if row["source"] != reference_row["source"]:
            raise SystemExit(f"{path} and {reference} hold different MRs: {row['source']!r}")
        slots = attributes(row["source"])
        for slot in slots:
            missed = mention(slot, row["prediction"]) is None
            add("all", missed)
            add("MRs of <= 6" if len(slots) <= 6 else "MRs of 7-8", missed)
            said_at = mention(slot, reference_row["prediction"])
            if said_at is not None:
                add(f"reference says it at {position_bucket(said_at)}", missed)
            add(slot[0], missed)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="study run names (results/e2e/study/NAME.SPLIT.outputs.jsonl)")
    parser.add_argument("--reference", help="the run whose word positions group the attributes (default: the first)")
    parser.add_argument("--splits", nargs="+", default=["dev", "test"], choices=["dev", "devmatch", "test"])
    args = parser.parse_args()
    reference = args.reference or args.runs[0]
    outputs = "{}.{}.outputs.jsonl".format
    table = {(split, run): omissions(STUDY / outputs(run, split), STUDY / outputs(reference, split))
             for split in args.splits for run in args.runs}
    buckets = list(dict.fromkeys(bucket for counts in table.values() for bucket in counts))
    ordered = ["all", "MRs of <= 6", "MRs of 7-8"] + sorted(b for b in buckets if b.startswith("reference")) + sorted(
        b for b in buckets if b not in {"all", "MRs of <= 6", "MRs of 7-8"} and not b.startswith("reference"))
    print(f"Share of attributes omitted (omitted/total); reference run: {reference}\n")
    print("| split | run | " + " | ".join(ordered) + " |")
    print("|---|---|" + "---:|" * len(ordered))
    for (split, run), counts in table.items():
        cells = [f"{100 * counts[b][0] / counts[b][1]:.1f}% ({counts[b][0]}/{counts[b][1]})" if b in counts else "-"
                 for b in ordered]
        print(f"| {split} | {run} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
