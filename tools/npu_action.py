"""Runs `lower` as npu_model's Bazel action: quiet, inside its own directory, reproducible.

  python3 npu_action.py --report R --log L --timings T [--plot P] -- LOWER_ARGS...

- HOME, TMPDIR and the libraries' cache directories point into a scratch directory beside
  the outputs (inside the action's sandbox or remote work directory), removed at the end.
- Nothing reaches Bazel's console unless the lowering fails: `lower --log` puts the other
  libraries' output (C++ included) in the declared log, and what `lower` itself shows
  (stage lines, summary) is appended to it; on failure that is printed instead.
- The report keeps only what the model, the flags and the environment determine: wall-clock
  times go to the timings file, and paths under the working directory (the execution root)
  become relative to it, so the same action gives the same bytes in every checkout.
- The plot is a declared output, so it always exists: when the lowering drew none (no output
  shaped [batch, time, ...] with time > 1, or numerics not checked) it is a figure saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

LOG_TAIL_LINES = 80


def _scratch_env(scratch: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    for var, sub in [
        ("HOME", "home"),
        ("TMPDIR", "tmp"),
        ("XDG_CACHE_HOME", "cache"),
        ("MPLCONFIGDIR", "matplotlib"),
    ]:
        (scratch / sub).mkdir(parents=True)
        env[var] = str(scratch / sub)
    return env


def _relative(value, prefixes: tuple[str, ...]):
    """`value` with every absolute path under the working directory made relative to it."""
    if isinstance(value, str):
        for prefix in prefixes:
            value = value.replace(prefix, "")
        return value
    if isinstance(value, list):
        return [_relative(v, prefixes) for v in value]
    if isinstance(value, dict):
        return {_relative(k, prefixes): _relative(v, prefixes) for k, v in value.items()}
    return value


def _placeholder_plot(path: pathlib.Path, why: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 1.5), dpi=100)
    ax.axis("off")
    ax.text(0.5, 0.5, f"no error-per-timestep plot: {why}", ha="center", va="center")
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def _split_report(report_path: pathlib.Path, timings_path: pathlib.Path, seconds: float) -> dict:
    report = json.loads(report_path.read_text())
    cwd = os.getcwd()
    prefixes = tuple(sorted({cwd + os.sep, os.path.realpath(cwd) + os.sep}, key=len, reverse=True))
    timings = {"time": report.pop("time", None), "action_wall_s": round(seconds, 3)}
    report = _relative(report, prefixes)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    timings_path.write_text(json.dumps(timings, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", required=True, type=pathlib.Path)
    parser.add_argument("--log", required=True, type=pathlib.Path)
    parser.add_argument("--timings", required=True, type=pathlib.Path)
    parser.add_argument("--plot", type=pathlib.Path)
    args = parser.parse_args(argv[:split])
    lower_args = argv[split + 1 :]
    scratch = args.report.with_name(args.report.name + ".scratch")
    shutil.rmtree(scratch, ignore_errors=True)
    start = time.perf_counter()
    try:
        env = _scratch_env(scratch)
        os.environ.update(env)  # this process too: the placeholder plot imports matplotlib
        terminal = scratch / "terminal.txt"  # what `lower` shows a user: stages, summary
        with open(terminal, "wb") as out:
            status = subprocess.run(
                [sys.executable, "-B", "-P", "-s", "-m", "recurrent_lowering.tools.lower"]
                + lower_args
                + ["--report", str(args.report), "--log", str(args.log)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            ).returncode
        shown = terminal.read_text(errors="replace")
        if status != 0:
            lines = shown.splitlines()
            print("\n".join(lines[-LOG_TAIL_LINES:]), file=sys.stderr)
            print(f"lowering failed (exit {status})", file=sys.stderr)
            return status
        with open(args.log, "a") as log:  # the libraries' log, then what `lower` showed
            log.write("\n--- lower's own output ---\n" + shown)
        report = _split_report(args.report, args.timings, time.perf_counter() - start)
        if args.plot is not None and not args.plot.exists():
            checked = report.get("numerics", {}).get("sqnr_db") is not None
            why = "no output shaped [batch, time, ...] with time > 1"
            if not checked:
                why = "numerics not checked (see the report's warnings)"
            _placeholder_plot(args.plot, why)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
