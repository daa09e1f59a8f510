"""Whole-process lowering time of a bundled model: our CLI against ExecuTorch 1.5.1's own flow.

    python -m recurrent_lowering.benchmarks.process_time --model gru_a \
        --target ethos-u55-128 --repeats 3 --out OUT.md

Each lowering is a fresh Python process, imports and all, as a user or a build action meets
it, the two alternating so that the machine's drift falls on both: ours is `//tools:lower
MODEL --target T` with its default flags (numerics check included); ExecuTorch's is
`executorch_baseline` (its Arm quantizer and its own recurrent decompositions, through
`to_edge_transform_and_lower`, Vela and `to_executorch`, then its numerics check). Wall and
CPU seconds (user + system of the process and its children), median over the repeats.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from recurrent_lowering.benchmarks import caller_directory, machine_speed


def _timed(command: list[str], cwd: str) -> tuple[float, float]:
    """(wall s, CPU s) of one process; raises with its stderr's last line if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{' '.join(command[2:4])} failed: {last}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def commands(model: str, target: str, work: str) -> dict[str, list[str]]:
    python = sys.executable
    return {
        "ours": [
            python,
            "-m",
            "recurrent_lowering.tools.lower",
            model,
            f"--target={target}",
            f"--output={os.path.join(work, 'ours.pte')}",
        ],
        "executorch": [
            python,
            "-m",
            "recurrent_lowering.benchmarks.executorch_baseline",
            model,
            target,
            f"--out={os.path.join(work, 'executorch')}",
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gru_a")
    parser.add_argument("--target", default="ethos-u55-128")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True, help="Markdown table")
    args = parser.parse_args()
    caller_directory.enter()
    speed = machine_speed.line()  # before the lowerings load the machine
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "executorch": []}
    with tempfile.TemporaryDirectory() as work:
        flows = commands(args.model, args.target, work)
        for _ in range(args.repeats):
            for name, command in flows.items():
                times[name].append(_timed(command, work))
                print(name, *(round(x, 1) for x in times[name][-1]), flush=True)
    median = {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    }
    command = (
        "python -m recurrent_lowering.benchmarks.process_time "
        f"--model {args.model} --target {args.target} --repeats {args.repeats} --out {args.out}"
    )
    lines = [
        f"    {command}",
        "",
        f"{datetime.date.today()}, {os.cpu_count()}-core machine, load average "
        f"{os.getloadavg()[0]:.1f} at the end. {speed}",
        "",
        "| flow | wall s (median) | CPU s (median) | each run, wall / CPU s |",
        "|---|---|---|---|",
    ]
    for name, t in times.items():
        runs = ", ".join(f"{w:.1f} / {c:.1f}" for w, c in t)
        lines.append(f"| {name} | {median[name][0]:.1f} | {median[name][1]:.1f} | {runs} |")
    ratio = median["ours"][0] / median["executorch"][0]
    lines += ["", f"ours / executorch, wall: {ratio:.2f}"]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
