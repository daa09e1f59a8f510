"""Our int8 and int16 programs against onnxruntime's own post-training quantizer, on the
real models, the same inputs and the same calibration.

A generic quantizer is the anchor a user would reach for first: if ours is worse on a
model, that model's loss is ours, not the model's. For each model of real_models.py:

- the reference is onnxruntime on the original fp32 model;
- the anchor is `onnxruntime.quantization.quantize_static` (QDQ, per-channel int8 weights,
  MinMax, int8 or int16 activations) applied to our fp32 rewrite of the model with its
  recurrent nodes unrolled (`lower --target onnx --emission unrolled`: onnxruntime's
  quantizer leaves GRU/LSTM/RNN nodes in float), run in onnxruntime; each timestep's
  tensors get their own ranges, which the NPU programs' shared loop cannot have;
- ours is the CLI's `--quantization int8` and `int16` for --target, the TOSA reference
  model on the flatbuffer given to Vela (the CLI's own numerics check).

All three see the same samples: calibration on espeak-ng's sentences, SQNR on alsa-utils'
recordings held out from it (speech.py), streams in closed loop (each program fed its own
state) with the calibration's states from the fp32 stream, as the CLI calibrates.

  python -m recurrent_lowering.benchmarks.qdq_anchor --out docs/results/qdq_anchor.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

from recurrent_lowering.backends.onnx import input_sizes
from recurrent_lowering.benchmarks import caller_directory, real_models, speech
from recurrent_lowering.runtime import metrics, streams
from recurrent_lowering.runtime.onnxruntime_session import session
from recurrent_lowering.tools.lowering import calibration

PRECISIONS = ("int8", "int16")


def _runner(program, names: list):
    """`run(inputs) -> outputs`, inputs in the original model's order `names`; the inputs
    the rewrite fixed to constants (silero-vad's sample rate) are not fed."""
    taken = {i.name for i in program.get_inputs()}
    return lambda inputs: program.run(
        None, {n: a for n, a in zip(names, inputs, strict=True) if n in taken}
    )


def _samples(path: str, model: onnx.ModelProto) -> list:
    return calibration.load_samples(path, input_sizes.input_specs(model))


def _rewrite(path: str, feeds: str, out: str) -> str | None:
    """Our fp32 rewrite, recurrent nodes unrolled at the calibration's lengths; or the
    CLI's error line."""
    process = subprocess.run(
        [sys.executable, "-m", "recurrent_lowering.tools.lower", path, "--target=onnx"]
        + ["--emission=unrolled", f"--calibration={feeds}", f"--output={out}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    if process.returncode:
        return (process.stderr.strip().splitlines() or ["failed"])[-1]
    return None


class _Reader:
    """quantize_static's calibration data: one feed per calibration sample."""

    def __init__(self, names, samples, taken):
        self._feeds = iter([{n: a for n, a in zip(names, s) if n in taken} for s in samples])

    def get_next(self):
        return next(self._feeds, None)

    def rewind(self):  # not needed for MinMax's one pass
        raise NotImplementedError


def qdq(rewrite: str, out: str, names: list, taken: list, activations: str) -> str:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    inputs = {i.name for i in session(rewrite).get_inputs()}
    model = onnx.load(rewrite)
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
        model = onnx.version_converter.convert_version(model, 13)  # per-channel: axis
        rewrite = f"{out}.opset13.onnx"
        onnx.save(model, rewrite)
    quantize_static(
        rewrite,
        out,
        _Reader(names, taken, inputs),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8 if activations == "int8" else QuantType.QInt16,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return out


def measure(model, proto, signals, args, work: str) -> dict:
    path = os.path.join(work, f"{model.name}.onnx")
    onnx.save(proto, path)
    feeds = model.samples(proto, signals[0], model.calibration, args.frames)
    held = model.samples(proto, signals[1], model.evaluation, args.frames)
    cal_path, eval_path = (os.path.join(work, f"{model.name}.{k}.npz") for k in ("cal", "eval"))
    np.savez(cal_path, **feeds)
    np.savez(eval_path, **held)
    original = session(path)
    names = [i.name for i in original.get_inputs()]
    run = _runner(original, names)
    cal, ev = _samples(cal_path, proto), _samples(eval_path, proto)
    state = streams.pairs(ev[0], run(ev[0]))
    taken, _ = streams.fed_back(run, cal, state)  # the calibration's states: the fp32 stream's
    _, produced = streams.fed_back(run, ev, state)
    reference = streams.stacked(produced)
    record = {
        "model": model.name,
        "outputs": [o.name for o in original.get_outputs()],
        "samples": {"calibration": len(cal), "evaluation": len(ev)},
        "stream": bool(state),
    }
    rewrite = os.path.join(work, f"{model.name}.rewrite.onnx")
    error = _rewrite(path, cal_path, rewrite)
    for precision in PRECISIONS:
        if error is None:
            try:
                quantized = qdq(rewrite, f"{rewrite}.{precision}.onnx", names, taken, precision)
                _, got = streams.fed_back(_runner(session(quantized), names), ev, state)
                got = streams.stacked(got)
                record[f"qdq_{precision}"] = metrics.sqnr_per_output(reference, got)
            except Exception as e:  # the anchor's failure is a row, not the end of the run
                record[f"qdq_{precision}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        else:
            record[f"qdq_{precision}"] = error
        ours = real_models.lower(path, args.target, cal_path, work, precision, eval_path)
        if ours["status"] == "ok":
            numerics = ours["report"]["numerics"]
            record[precision] = numerics.get("sqnr_db_per_output") or [numerics["sqnr_db"]]
            record[f"{precision}_cycles"] = (ours["report"].get("vela") or {}).get("cycles")
        else:
            record[precision] = ours.get("error") or ours["status"]
    return record


def _figures(value) -> str:
    if isinstance(value, str):
        return value.replace("|", "\\|").replace("\n", " ")
    return " / ".join(f"{v:.1f}" for v in value)


def _verdict(ours, anchor) -> str:
    if isinstance(ours, str) or isinstance(anchor, str):
        return "-"
    return "yes" if min(ours) >= min(anchor) - 0.05 else f"no ({min(ours) - min(anchor):+.1f})"


def row(r: dict) -> str:
    cells = [r["model"], " / ".join(r["outputs"])]
    for p in PRECISIONS:
        cells += [_figures(r[f"qdq_{p}"]), _figures(r[p]), _verdict(r[p], r[f"qdq_{p}"])]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Markdown table; records go to OUT.jsonl")
    parser.add_argument("--models", default="", help="comma-separated subset of real_models'")
    parser.add_argument("--target", default="ethos-u55-128")
    parser.add_argument("--frames", type=int, default=100, help="T where time is dynamic")
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/recurrent_lowering/real_models")
    )
    args = parser.parse_args()
    caller_directory.enter()
    logging.getLogger("root").setLevel(logging.ERROR)  # the quantizer's progress lines
    chosen = args.models.split(",") if args.models else [m.name for m in real_models.MODELS]
    unknown = set(chosen) - {m.name for m in real_models.MODELS}
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    command = "python -m recurrent_lowering.benchmarks.qdq_anchor --out " + args.out
    command += f" --models {args.models}" if args.models else ""
    command += f" --target {args.target}" if args.target != "ethos-u55-128" else ""
    bed = speech.noise(args.cache)
    signals = (
        speech.stream(speech.synthesized(args.cache), bed, seed=0),
        speech.stream(speech.recordings(args.cache), bed, seed=1),
    )
    head = [
        "onnxruntime's `quantize_static` (QDQ, per-channel int8 weights, MinMax) on our fp32 "
        "rewrite with the recurrent nodes unrolled, run in onnxruntime, against our "
        f"`--quantization int8` / `int16` programs for {args.target} (TOSA reference model "
        "on the flatbuffer given to Vela). SQNR dB per output against onnxruntime on the "
        "original fp32 model, on alsa-utils' recordings held out from the calibration "
        "(espeak-ng's sentences), streams in closed loop. 'at least as accurate': our worst "
        "output against the anchor's worst.",
        "",
        f"    {command}",
        "",
        f"{datetime.date.today().isoformat()}; 2-core machine.",
        "",
        "| model | outputs | QDQ int8 | ours int8 | at least as accurate | QDQ int16 | "
        "ours int16 | at least as accurate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows, records = [], []
    jsonl = os.path.splitext(args.out)[0] + ".jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for model in (m for m in real_models.MODELS if m.name in chosen):
            proto = onnx.load_from_string(real_models.fetch(model, args.cache))
            records.append(measure(model, proto, signals, args, work))
            rows.append(row(records[-1]))
            print(rows[-1], flush=True)
            with open(args.out, "w") as f:
                f.write("\n".join(head + rows) + "\n")
            with open(jsonl, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
