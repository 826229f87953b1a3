"""Time the README's quickstart command end to end and write what it did as JSON.

Runs ``python -m skiptrain fit --config recipes/quickstart.yaml`` (its outputs under ``--run_dir``), then reads the
run's metrics.csv: wall time, overall steps/s, mean training tokens/s, final training loss, final validation loss
(under the schedule and dense) and BLEU, the precision resolved (from the run's own log line), the CPU capability,
the thread count, and what else loaded the machine. ``cpu_s`` (user + system time of the run) is what a busy machine
inflates least: on an idle machine a one-thread run's wall time is about its ``cpu_s``.

    python -m benchmarks.speed.quickstart --out benchmarks/results/quickstart_auto.json [--cpus 0,1]
    python -m benchmarks.speed.quickstart --out benchmarks/results/quickstart_avx2_fp32.json --emulate_avx2
    python -m benchmarks.speed.quickstart --out x.json --threads 1 -- --trainer.max_steps 20
    python -m benchmarks.speed.quickstart --out benchmarks/results/quickstart/auto_calibrate.json --cpus 0 --threads 1 \
        --calibrate runs/quickstart_calib

``--readme_job`` then times the rest of the README's main job, its ``export`` and ``generate`` commands as the
README's quickstart block writes them (read from README.md, with ``runs/quickstart`` replaced by ``--run_dir``), and
records each one's wall and CPU time, the speedup ``generate --compare_dense`` printed, and the job's total.

``--calibrate DIR`` then times the README's calibrate command on the run's last checkpoint (its outputs in ``DIR``,
replaced) and records its wall and CPU time and its ``summary.json`` (the setting and the schedules it chose).

``--emulate_avx2`` makes torch, oneDNN and MKL dispatch AVX2 kernels only (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``): a CPU without native bf16, where ``auto`` resolves
to ``32-true`` and an explicit bf16 is emulated. Arguments after ``--`` go to the fit command.

This times one whole job once, and compares no two arms, so it does not use the A/B timing protocol
(:mod:`benchmarks.common.timing`); the speedup it records is the one ``generate --compare_dense`` printed, not a
claim of its own.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
README_COMMAND = [sys.executable, "-m", "skiptrain", "fit", "--config", "recipes/quickstart.yaml"]
README_RUN_DIR = "runs/quickstart"
PROBE = "import json; from benchmarks.common.machine import describe; print(json.dumps(describe()))"
"""The machine as the timed run sees it: run in its environment, where AVX2-only dispatch may be emulated."""


def other_load() -> list[dict]:
    """Processes other than this one using over 10% of a core: CPU share and program name with its first arguments."""
    rows = subprocess.run(["ps", "-eo", "pid,pcpu,args", "--no-headers"], capture_output=True, text=True).stdout
    busy = []
    for line in rows.splitlines():
        pid, cpu, *args = line.split()
        if int(pid) != os.getpid() and float(cpu) > 10 and args:
            busy.append({"cpu_percent": float(cpu), "command": " ".join(Path(a).name for a in args[:4])})
    return busy


def read_metrics(run_dir: Path) -> dict:
    """The last value of each metric in the run's metrics.csv, the step count and the mean training tokens/s."""
    files = sorted(run_dir.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        return {}
    rows = list(csv.DictReader(files[-1].open()))
    last = {key: float(row[key]) for row in rows for key in row if row[key] not in ("", None) and key != "epoch"}
    speeds = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
    return {"steps": int(last.get("step", -1)) + 1, "mean_train_tokens_per_s": sum(speeds) / max(len(speeds), 1),
            "final": {k: v for k, v in last.items() if k != "step"}}


def timed_run(command: list[str], env: dict, log: Path) -> tuple[int, str, float, float]:
    """Run ``command``, write its output to ``log``: ``(exit code, output, wall seconds, CPU seconds)``, the CPU
    time (user + system) being the command's own."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = result.stdout + result.stderr
    log.write_text(output)
    return result.returncode, output, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def readme_job_commands(run_dir: Path) -> dict[str, list[str]]:
    """The README quickstart block's ``skiptrain`` commands after ``fit`` (export, generate), writing under
    ``run_dir``."""
    block = re.search(r"## Quickstart.*?```bash\n(.*?)\n```", Path("README.md").read_text(), re.S)[1]
    commands = {}
    for part in block.split("&&"):
        words = shlex.split(part.replace(README_RUN_DIR, str(run_dir)))
        if words[:3] == ["python", "-m", "skiptrain"] and words[3] != "fit":
            commands[words[3]] = [sys.executable, *words[1:]]
    return commands


def time_readme_job(run_dir: Path, pin: list[str], env: dict, out: Path) -> dict:
    """Run and time the README's export and generate commands after the fit (logs beside ``out``)."""
    records = {}
    for name, command in readme_job_commands(run_dir).items():
        if name == "export":
            command += ["--trainer.default_root_dir", str(run_dir)]  # where the fit wrote its last checkpoint
        code, log, wall, cpu = timed_run([*pin, *command], env, out.with_suffix(f".{name}.log"))
        records[name] = {"command": " ".join(["python", *command[1:]]), "exit_code": code, "wall_s": round(wall, 1),
                         "cpu_s": round(cpu, 1)}
        speedup = re.search(r"measured speedup (\d+\.\d+)x", log)
        if name == "generate" and speedup:
            records[name]["printed_speedup"] = float(speedup.group(1))
        if code:
            break
    return records


def time_calibrate(run_dir: Path, out_dir: Path, pin: list[str], env: dict, out: Path) -> dict:
    """Run the README's calibrate command on the run's last checkpoint and time it (log beside ``out``)."""
    checkpoint = max(run_dir.rglob("last.ckpt"), key=lambda p: p.stat().st_mtime)
    subprocess.run(["rm", "-rf", str(out_dir)], check=True)
    command = [sys.executable, "-m", "skiptrain", "calibrate", "--config", "recipes/quickstart.yaml",
               "--ckpt_path", str(checkpoint), "--output_dir", str(out_dir)]
    code, _, wall, cpu = timed_run([*pin, *command], env, out.with_suffix(".calibrate.log"))
    summary = out_dir / "summary.json"
    record = {"command": " ".join(["python", *command[1:]]), "exit_code": code, "wall_s": round(wall, 1),
              "cpu_s": round(cpu, 1), "outputs": sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []}
    if summary.is_file():
        record["summary"] = json.loads(summary.read_text())
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--run_dir", default="runs/quickstart_timing", help="where the run writes (replaced)")
    parser.add_argument("--emulate_avx2", action="store_true", help="dispatch AVX2 kernels only (no native bf16)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS (default: torch's own choice)")
    parser.add_argument("--cpus", help="pin to these CPUs with taskset, e.g. 0,1")
    parser.add_argument("--phases", action="store_true",
                        help="also clock setup, steps and validations in CPU time (benchmarks/speed/phase_clock.py)")
    parser.add_argument("--readme_job", action="store_true",
                        help="then time the README quickstart's export and generate commands too")
    parser.add_argument("--calibrate", metavar="DIR", help="then time calibrate on the run's checkpoint, into DIR")
    parser.add_argument("fit_args", nargs="*", help="extra arguments for the fit command (after --)")
    args = parser.parse_args()

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **(AVX2_ONLY if args.emulate_avx2 else {}))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    pin = ["taskset", "-c", args.cpus] if args.cpus else []
    probe = json.loads(subprocess.run([*pin, sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    run_dir = Path(args.run_dir)
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [*README_COMMAND, "--trainer.default_root_dir", str(run_dir),
               "--trainer.logger.init_args.save_dir", str(run_dir), *args.fit_args]
    phases = Path(args.out).with_suffix(".phases.json")
    if args.phases:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
        clock = {"class_path": "phase_clock.PhaseClock", "init_args": {"out": str(phases)}}
        command.append(f"--trainer.callbacks+={json.dumps(clock)}")
    load_before, busy_before = os.getloadavg(), other_load()
    code, log, wall, cpu = timed_run([*pin, *command], env, Path(args.out).with_suffix(".log"))
    resolved = re.search(r"precision auto -> (\S+):", log)
    metrics = read_metrics(run_dir)
    record = {
        "command": " ".join(["python", *command[1:]]),
        "exit_code": code,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "steps_per_s_overall": round(metrics.get("steps", 0) / wall, 4),
        **metrics,
        "precision_resolved": resolved.group(1) if resolved else "as given in the command",
        "machine": {**probe,
                    "pinned_cpus": args.cpus, "omp_num_threads": env.get("OMP_NUM_THREADS"),
                    "avx2_emulated": args.emulate_avx2},
        "load_average_before_after": [list(load_before), list(os.getloadavg())],
        "other_processes_at_start": busy_before,
        "checkpoint_written": bool(list(run_dir.rglob("*.ckpt"))),
    }
    if args.phases and phases.exists():
        record["phases"] = json.loads(phases.read_text())
    if args.readme_job and code == 0:
        record["readme_job"] = time_readme_job(run_dir, pin, env, Path(args.out))
        record["readme_job_total"] = {key: round(wall * (key == "wall_s") + cpu * (key == "cpu_s") + sum(
            step[key] for step in record["readme_job"].values()), 1) for key in ("wall_s", "cpu_s")}
        record["load_average_before_after"][1] = list(os.getloadavg())
        code = max(step["exit_code"] for step in record["readme_job"].values())
    if args.calibrate and code == 0:
        record["calibrate"] = time_calibrate(run_dir, Path(args.calibrate), pin, env, Path(args.out))
        code = record["calibrate"]["exit_code"]
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    sys.exit(code)


if __name__ == "__main__":
    main()
