"""Checks a //tools:lower JSON report against thresholds; the engine of npu_model_test."""

from __future__ import annotations

import json
import sys

from absl import app, flags

flags.DEFINE_float("min_sqnr_db", None, "fail when numerics.sqnr_db is lower")
flags.DEFINE_float("max_abs_err", None, "fail when numerics.max_abs_err is higher")
flags.DEFINE_float("max_cycles", None, "fail when vela.cycles is higher")
FLAGS = flags.FLAGS


def violations(report: dict) -> list[str]:
    checks = [
        ("numerics.sqnr_db", report["numerics"]["sqnr_db"], FLAGS.min_sqnr_db, "<"),
        ("numerics.max_abs_err", report["numerics"]["max_abs_err"], FLAGS.max_abs_err, ">"),
        ("vela.cycles", report["vela"]["cycles"], FLAGS.max_cycles, ">"),
    ]
    found = []
    for key, value, limit, bad in checks:
        if limit is None:
            continue
        if value is None:
            found.append(f"{key} is missing from the report (limit {limit})")
        elif (value < limit) if bad == "<" else (value > limit):
            found.append(f"{key} = {value} crosses the limit {limit}")
        else:
            print(f"ok: {key} = {value} (limit {limit})")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: check_report REPORT.json [--min_sqnr_db=X] ...", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        report = json.load(f)
    found = violations(report)
    for line in found:
        print(f"FAIL: {report['model']} -> {report['target']}: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    app.run(main)
