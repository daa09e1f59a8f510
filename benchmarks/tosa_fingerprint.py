"""The sha256 of the TOSA each model lowers to, through `//tools:lower`: a structural change
to the lowering must leave these bytes as they were.

For every (model, target, quantization) the CLI runs as a user would type it, with
`--tosa_output`; the record holds the TOSA's sha256 (the flatbuffer given to Vela), Vela's
cycle estimate, the TOSA reference model's SQNR and the wall time. Bundled examples lower on
their example inputs; the real models (benchmarks/real_models.py) on that script's
calibration input. Writes JSON lines, one record per lowering, as each ends; `--compare`
prints the rows whose sha256 differ between two such files. `--via flow` lowers the
bundled models with `flow.lower` in this process instead of the CLI (no real models): its
file compared with the CLI's shows that both give the same programs.

  ./bazelw run //benchmarks:tosa_fingerprint -- --out /tmp/after.jsonl
  ./bazelw run //benchmarks:tosa_fingerprint -- --compare /tmp/before.jsonl /tmp/after.jsonl
  ./bazelw run //benchmarks:tosa_fingerprint -- --via flow --real_models '' --out /tmp/flow.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

from recurrent_lowering.benchmarks import caller_directory, real_models

BENCHMARK_MODELS = ("gru_a", "lstm_a", "rnn_tanh_a", "bigru2", "big_gru", "crnn", "stream_gru")
TARGETS = ("ethos-u55-128", "ethos-u85-256")
QUANTIZATIONS = ("auto", "int8")


def _lower(model: str, target: str, quantization: str, work: str, calibration=None) -> dict:
    stem = os.path.join(work, f"{os.path.basename(model)}.{target}.{quantization}")
    args = [model, f"--target={target}", f"--quantization={quantization}"]
    args += [f"--output={stem}.pte", f"--report={stem}.json", f"--tosa_output={stem}.tosa"]
    args += [f"--calibration={calibration}"] if calibration else []
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "recurrent_lowering.tools.lower", *args],
        capture_output=True,
        text=True,
        cwd=work,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    record = {"wall_s": round(time.monotonic() - start, 1)}
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return {**record, "error": lines[-1]}
    with open(f"{stem}.json") as f:
        report = json.load(f)
    with open(f"{stem}.tosa", "rb") as f:
        record["sha256"] = hashlib.sha256(f.read()).hexdigest()
    auto = (report.get("quantization") or {}).get("auto") or {}
    record.update(
        cycles=report["vela"]["cycles"],
        sqnr_db=report["numerics"]["sqnr_db"],
        choice=auto.get("choice"),
    )
    return record


def _lower_flow(model: str, target: str, quantization: str, work: str) -> dict:
    """What `_lower` records, from flow.lower in this process."""
    from recurrent_lowering.backends.executorch_arm import flow
    from recurrent_lowering.examples import models
    from recurrent_lowering.runtime import arm_numerics

    module, inputs = models.build(model)
    start = time.monotonic()
    out = os.path.join(work, f"{model}.{target}.{quantization}.flow")
    result = flow.lower(module, inputs, target, out, quantization=quantization)
    numerics = arm_numerics.check(result, module, inputs)
    choice = result.precision
    return {
        "wall_s": round(time.monotonic() - start, 1),
        "sha256": hashlib.sha256(result.tosa_files[0].read_bytes()).hexdigest(),
        "cycles": result.vela.summary.cycles,
        "sqnr_db": numerics.sqnr_db,
        "choice": None if choice is None else choice.name,
    }


def _cases(args):
    for model in args.models.split(",") if args.models else ():
        for target in args.targets.split(","):
            for quantization in args.quantizations.split(","):
                yield model, target, quantization, None


def run(args) -> None:
    records = []
    with tempfile.TemporaryDirectory() as work, open(args.out, "w") as out:

        def emit(record):
            records.append(record)
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(json.dumps(record), flush=True)

        lower = _lower_flow if args.via == "flow" else _lower
        for model, target, quantization, _ in _cases(args):
            emit(
                {"model": model, "target": target, "quantization": quantization}
                | lower(model, target, quantization, work)
            )
        chosen = args.real_models.split(",") if args.real_models else []
        for model in (m for m in real_models.MODELS if m.name in chosen):
            path = os.path.join(work, f"{model.name}.onnx")
            with open(path, "wb") as f:
                f.write(real_models.fetch(model, args.cache))
            feeds = model.inputs(onnx.load(path, load_external_data=False), args.frames)
            calibration = os.path.join(work, f"{model.name}.npz")
            np.savez(calibration, **feeds)
            for target in args.targets.split(","):
                for quantization in args.real_quantizations.split(","):
                    emit(
                        {"model": model.name, "target": target, "quantization": quantization}
                        | _lower(path, target, quantization, work, calibration)
                    )


def compare(before: str, after: str) -> int:
    def read(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return {(r["model"], r["target"], r["quantization"]): r for r in rows}

    a, b = read(before), read(after)
    differ = 0
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, {}), b.get(key, {})
        same = old.get("sha256") is not None and old.get("sha256") == new.get("sha256")
        differ += not same
        mark = "same" if same else "DIFFERS"
        print(
            f"{' / '.join(key)}: {mark} {str(old.get('sha256'))[:12]} {str(new.get('sha256'))[:12]}"
            f" cycles {old.get('cycles')} -> {new.get('cycles')}"
            f" sqnr {old.get('sqnr_db')} -> {new.get('sqnr_db')}"
        )
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON lines, one record per lowering")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--models", default=",".join(BENCHMARK_MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--quantizations", default=",".join(QUANTIZATIONS))
    parser.add_argument(
        "--real_models", default=",".join(m.name for m in real_models.MODELS), help="'' for none"
    )
    parser.add_argument("--real_quantizations", default="auto")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--via", default="cli", choices=("cli", "flow"))
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/recurrent_lowering/real_models")
    )
    args = parser.parse_args()
    caller_directory.enter()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.out:
        parser.error("--out or --compare")
    run(args)


if __name__ == "__main__":
    main()
