"""Assemble the E2E evidence: a Markdown table of the rows and two plots (quality vs speedup, schedules).

    python benchmarks/e2e/report.py
    # reads benchmarks/results/e2e/row*.json, benchmarks/results/e2e/speed.json and runs/e2e/*/metrics.csv

Writes ``benchmarks/results/e2e/table.md``, ``benchmarks/e2e_quality_vs_speedup.png`` and
``benchmarks/e2e_schedules.png``.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from score import schedule_family  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "e2e"
RUNS = HERE.parents[1] / "runs" / "e2e"
ROWS = {
    1: "base model, dense decoding (zero-shot)",
    2: "dense fine-tuned, dense decoding",
    3: "dense fine-tuned, SkipDecode 2x decoding",
    4: "dense fine-tuned, HSD ~2x decoding",
    5: "skip-aware fine-tuned SkipDecode 2x",
    6: "skip-aware fine-tuned SkipDecode 3x",
    7: "skip-aware fine-tuned HSD ~2x",
    8: "row 5 + self-distillation",
    9: "dense full fine-tuning, dense decoding",
}
DECODE_NAME = {
    (schedule_family(HERE / f"schedule_{name}.yaml").name,
     json.dumps(schedule_family(HERE / f"schedule_{name}.yaml").build(30).params, sort_keys=True)): name
    for name in ("dense", "skipdecode2x", "skipdecode3x", "hsd2x")
}
TRAINED = {2: "dense", 5: "skipdecode2x", 6: "skipdecode3x", 7: "hsd2x", 8: "skipdecode2x_distill", 9: "dense_full"}


def training_throughput(name: str) -> tuple[float, float] | None:
    """Median logged training tokens/s (after the first 10 steps) and wall minutes of a run."""
    files = sorted(RUNS.glob(f"{name}/lightning_logs/version_*/metrics.csv"))
    if not files:
        return None
    rows = list(csv.DictReader(files[-1].open()))
    rates = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s") and int(r["step"]) >= 10]
    wall = (files[-1].stat().st_mtime - (files[-1].parent / "hparams.yaml").stat().st_mtime) / 60  # fit start -> end
    return statistics.median(rates), wall


def validation_losses(name: str) -> tuple[float, float] | None:
    """Final dev-set loss of a run under its own schedule and dense (the same weights)."""
    files = sorted(RUNS.glob(f"{name}/lightning_logs/version_*/metrics.csv"))
    rows = [r for r in csv.DictReader(files[-1].open()) if r.get("val/loss_skip")] if files else []
    return (float(rows[-1]["val/loss_skip"]), float(rows[-1]["val/loss_dense"])) if rows else None


def main() -> None:
    results = {int(p.stem.removeprefix("row")): json.loads(p.read_text()) for p in RESULTS.glob("row*.json")}
    speed = json.loads((RESULTS / "speed.json").read_text())["schedules"]
    for r in results.values():  # decode speed belongs to the decoding schedule, measured once by speed.py
        r.update(speed[DECODE_NAME[r["decode_schedule"]["family"], json.dumps(r["decode_schedule"]["params"],
                                                                            sort_keys=True)]])
    lines = [
        "| row | setup | BLEU | ROUGE-L | mean layers / token | ideal speedup | decode tok/s | measured speedup | "
        "train tok/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(results):
        r = results[row]
        train = training_throughput(TRAINED[row]) if row in TRAINED else None
        lines.append(
            f"| {row} | {ROWS[row]} | {100 * r['bleu']:.1f} | {100 * r['rouge_l']:.1f} | "
            f"{r['mean_layers_per_generated_token']:.1f} | {r['ideal_speedup']:.2f}x | "
            f"{r['tokens_per_s']:.1f} | {r['measured_speedup']:.2f}x | "
            f"{f'{train[0]:.0f}' if train else '-'} |"
        )
    lines += ["", "| trained run | dev loss, own schedule | dev loss, same weights dense | wall minutes |",
              "|---|---:|---:|---:|"]
    for name in sorted(set(TRAINED.values())):
        losses, train = validation_losses(name), training_throughput(name)
        if losses:
            lines.append(f"| {name} | {losses[0]:.3f} | {losses[1]:.3f} | {train[1]:.0f} |")
    (RESULTS / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row, r in sorted(results.items()):
        ax.scatter(r["measured_speedup"], 100 * r["bleu"], s=40)
        ax.annotate(f"{row}", (r["measured_speedup"], 100 * r["bleu"]), textcoords="offset points", xytext=(5, 3))
    ax.set_xlabel("measured decode speedup vs dense (batch 8, CPU)")
    ax.set_ylabel("BLEU (E2E test, 100 MRs, all references)")
    ax.set_title("SmolLM2-135M on E2E: quality vs speed (numbers = table rows)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE.parent / "e2e_quality_vs_speedup.png", dpi=120)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in ("skipdecode2x", "skipdecode3x", "hsd2x"):
        schedule = schedule_family(HERE / f"schedule_{name}.yaml").build(30)
        counts = [len(s) for s in schedule.materialize(48)]
        ax.step(range(48), counts, where="post", label=f"{name} (ideal {schedule.ideal_speedup(32):.2f}x)")
    ax.axhline(30, color="gray", linestyle=":", label="dense (30 layers)")
    ax.set_xlabel("generated index g")
    ax.set_ylabel("executed layers |E(g)|")
    ax.set_title("Schedules of the E2E runs (SmolLM2-135M, 30 layers)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE.parent / "e2e_schedules.png", dpi=120)


if __name__ == "__main__":
    main()
