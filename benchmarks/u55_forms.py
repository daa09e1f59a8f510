"""What the default programs on Ethos-U55 are made of, and what each int16 figure rests on.

Each model is lowered under the default (`--quantization auto`) for ethos-u55-128: the real
models through the CLI with real_models.py's files (calibration on espeak-ng's speech,
evaluation held out on alsa-utils' recordings), the benchmark models (examples/models.py)
through `flow.lower` on their example input, as precision_auto.py does. The .tosa given to
Vela is compiled again by Vela to its command stream (the cycles must equal the lowering's:
the same program), and every NPU operation is classified by what the report's figure, the
TOSA reference model's, rests on for it (runtime/ethos_u55_int16.py `inventory`): int8
operations; int16 x int8 convolutions, equal while their accumulator fits the U55's 40 bits
(the worst case over every int16 input, from the TOSA weights); 16-bit and 32-bit
elementwise and 1x1 pool operations the model computes (the 32-bit ones resting on a whole
product and an unclipped OFM); any it does not model; and how many carry a 16-bit LUT
(resting on its rounding). A benchmark model is also measured with its LUTs rounding down
(`truncating_luts`).

  python -m recurrent_lowering.benchmarks.u55_forms --out OUT.md [--models a,b]

Writes a Markdown table and OUT.jsonl; `--work DIR` keeps (and reuses) each lowering.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import tempfile

import numpy as np

from recurrent_lowering.benchmarks import caller_directory, real_models
from recurrent_lowering.runtime import arm_numerics, vela
from recurrent_lowering.runtime import ethos_u55_int16 as u55

TARGET = "ethos-u55-128"
BENCHMARK_MODELS = ("gru_a", "lstm_a", "rnn_tanh_a", "bigru2", "big_gru", "crnn")
REAL_MODELS = tuple(m.name for m in real_models.MODELS)


def _lower_real(name: str, work: pathlib.Path, cache: str, signals) -> dict:
    model = next(m for m in real_models.MODELS if m.name == name)
    stem = work / f"{name}.onnx.{TARGET}"
    if not (stem.with_suffix(".tosa").exists() and pathlib.Path(f"{stem}.json").exists()):
        path, calibration, evaluation, _ = real_models.files(model, str(work), cache, signals, 100)
        record = real_models.lower(
            path, TARGET, calibration, str(work), "auto", evaluation,
            extra=(f"--tosa_output={stem.with_suffix('.tosa')}",), timeout_s=1800,
        )  # fmt: skip
        if record["status"] != "ok":
            return {"model": name, **record}
    report = json.loads(pathlib.Path(f"{stem}.json").read_text())
    quant = report.get("quantization") or {}
    auto = quant.get("auto") or {}
    return {
        "model": name,
        "status": "ok",
        "choice": auto.get("choice") or quant.get("activations"),
        "cycles": report["vela"]["cycles"],
        "sqnr_db_per_output": report["numerics"].get("sqnr_db_per_output")
        or [report["numerics"]["sqnr_db"]],
        "tosa": str(stem.with_suffix(".tosa")),
    }


def _lower_benchmark(name: str, work: pathlib.Path) -> dict:
    tosa = work / f"{name}.{TARGET}.tosa"
    saved = work / f"{name}.{TARGET}.json"
    if not (tosa.exists() and saved.exists()):
        from recurrent_lowering.backends.executorch_arm import flow
        from recurrent_lowering.examples import models

        module, inputs = models.build(name)
        with tempfile.TemporaryDirectory() as tmp:
            result = flow.lower(module, inputs, TARGET, artifact_dir=tmp)
            program = result.tosa_files[0].read_bytes()
            tosa.write_bytes(program)
            sqnr = arm_numerics.check(result, module, inputs).sqnr_db
            result.tosa_files[0].write_bytes(u55.truncating_luts(program))
            down = arm_numerics.check(result, module, inputs).sqnr_db
            choice = result.precision.report()["choice"] if result.precision else None
            cycles = int(result.vela.summary.cycles)
            record = {"choice": choice, "cycles": cycles, "sqnr_db": [sqnr], "lut_down": [down]}
            saved.write_text(json.dumps(record))
    return {"model": name, "status": "ok", **json.loads(saved.read_text()), "tosa": str(tosa)}


def classify(record: dict, work: pathlib.Path) -> dict:
    """Vela's command stream for the record's .tosa, its operations counted by standing."""
    tosa = pathlib.Path(record["tosa"])
    out = work / f"{tosa.stem}.vela"
    npz_path = out / f"{tosa.stem}_vela.npz"
    if not npz_path.exists():
        result = vela.run_vela(tosa, TARGET, output_dir=out)  # --output-format=raw: an .npz
        cycles = int(result.summary.cycles)
        if cycles != record["cycles"]:
            raise SystemExit(f"{record['model']}: Vela gives {cycles} cycles, the lowering "
                             f"{record['cycles']}: not the same program")  # fmt: skip
    npz = np.load(npz_path)
    standings, forms = collections.Counter(), collections.Counter()
    for standing, lut, form, _ in u55.inventory(
        bytes(npz["cmd_data"].item()), u55.weight_data(npz)
    ):
        standings[standing] += 1
        standings[LUT] += lut
        forms[(standing, form)] += 1
    bits = u55.accumulator_bits(tosa.read_bytes())
    return {
        **record,
        "operations": sum(n for s, n in standings.items() if s != LUT),
        "standings": dict(standings),
        "forms": [[s, f, n] for (s, f), n in sorted(forms.items())],
        "accumulator_bits": bits,
    }


LUT = "through a 16-bit LUT"
COLUMNS = (u55.INT8, u55.CONV16, u55.MODELLED, u55.WIDE, u55.NOT_MODELLED, LUT)


def table(records: list, command: str) -> str:
    lines = [
        "NPU operations of each default program on ethos-u55-128 by what the report's figure "
        "rests on for them (Vela 5.1.0's command stream; runtime/ethos_u55_int16.py). Worst "
        "SQNR: the TOSA reference model against fp32 (benchmark models: torch eager on their "
        "example input, which they are calibrated on; real models: onnxruntime on held-out "
        "speech, the report's figure); LUTs rounding down: the same program as a U55 whose LUT "
        "truncated its interpolation would compute it (ethos_u55_int16.truncating_luts; real "
        "models: `stream_attribution --tosa --lut_down`, docs/precision.md).",
        "",
        f"    {command}",
        "",
        "| model | auto chose | cycles | worst SQNR dB | LUTs rounding down | operations | "
        + " | ".join(COLUMNS)
        + " | int16 convolutions' worst-case accumulator |",
        "|---|---|---|---|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {r['status']}: {r.get('error', '')} |")
            continue
        counts = " | ".join(str(r["standings"].get(c, 0)) for c in COLUMNS)
        bits = r["accumulator_bits"]
        worst = f"{bits} bits" if bits else "-"
        sqnr = r.get("sqnr_db") or r.get("sqnr_db_per_output")
        down = r.get("lut_down")
        lines.append(
            f"| {r['model']} | {r['choice']} | {r['cycles']:,} | "
            f"{f'{min(sqnr):.2f}' if sqnr else '-'} | {f'{min(down):.2f}' if down else '-'} | "
            f"{r['operations']} | {counts} | {worst} |"
        )
    lines += ["", "Forms other than int8, per model (how many operations):", ""]
    for r in records:
        if r["status"] != "ok":
            continue
        lines.append(f"- {r['model']}:")
        lines += [f"  - {s}: `{f}` x {n}" for s, f, n in r["forms"] if s != u55.INT8]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Markdown table; records go to OUT.jsonl")
    parser.add_argument("--models", default=",".join(BENCHMARK_MODELS + REAL_MODELS))
    parser.add_argument("--work", default=None, help="keep the lowerings here (and reuse them)")
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/recurrent_lowering/real_models")
    )
    args = parser.parse_args()
    caller_directory.enter()
    names = args.models.split(",")
    unknown = set(names) - set(BENCHMARK_MODELS + REAL_MODELS)
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    command = f"python -m recurrent_lowering.benchmarks.u55_forms --out {args.out}"
    if args.models != parser.get_default("models"):
        command += f" --models {args.models}"
    keep = tempfile.TemporaryDirectory() if args.work is None else None
    work = pathlib.Path(args.work or keep.name)
    work.mkdir(parents=True, exist_ok=True)
    signals = None
    records = []
    for name in names:
        if name in REAL_MODELS:
            signals = signals or real_models.speech_signals(args.cache)
            record = _lower_real(name, work, args.cache, signals)
        else:
            record = _lower_benchmark(name, work)
        if record["status"] == "ok":
            record = classify(record, work)
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "forms"}), flush=True)
        pathlib.Path(args.out).write_text(table(records, command))
        with open(os.path.splitext(args.out)[0] + ".jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
