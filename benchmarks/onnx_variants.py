"""ONNX recurrent nodes torch's modules cannot express, against the nearest one they can.

Each variant (peepholes, linear_before_reset=0, clip, HardSigmoid gates, reverse) lowers
through `//tools:lower` as the layer op in the loop form; its baseline is the same layer
without the variant, which becomes nn.GRU/LSTM/RNN. Compared: lowering time (the CLI's
total), Vela's cycle estimate, TOSA-reference SQNR against onnxruntime, and ops left on the
CPU. Writes a Markdown table and the reports as JSON lines.

  ./bazelw run //benchmarks:onnx_variants -- --out docs/results/onnx_variants.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.benchmarks import caller_directory

GATES = {"GRU": 3, "LSTM": 4, "RNN": 1}
# (label, op, variant attributes, peepholes, baseline attributes)
PAIRS = [
    ("LSTM peepholes", "LSTM", {}, True, {}),
    ("GRU linear_before_reset=0", "GRU", {}, False, {"linear_before_reset": 1}),
    (
        "GRU clip=3",
        "GRU",
        {"linear_before_reset": 1, "clip": 3.0},
        False,
        {"linear_before_reset": 1},
    ),
    (
        "GRU HardSigmoid gates",
        "GRU",
        {
            "linear_before_reset": 1,
            "activations": ["HardSigmoid", "Tanh"],
            "activation_alpha": [0.2],
            "activation_beta": [0.5],
        },
        False,
        {"linear_before_reset": 1},
    ),
    ("RNN reverse", "RNN", {"direction": "reverse"}, False, {}),
    (
        "LSTM bidirectional peepholes",
        "LSTM",
        {"direction": "bidirectional"},
        True,
        {"direction": "bidirectional"},
    ),
]


def model(op, attributes, peepholes, input_size, hidden, steps) -> onnx.ModelProto:
    """X [steps, 1, input_size] -> op -> Y, Y_h, with seeded weights."""
    rng = np.random.default_rng(0)
    dirs = 2 if attributes.get("direction") == "bidirectional" else 1
    gates, bound = GATES[op], 1 / np.sqrt(hidden)

    def uniform(*shape):
        return numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32))

    arrays = {
        "W": uniform(dirs, gates * hidden, input_size),
        "R": uniform(dirs, gates * hidden, hidden),
        "B": uniform(dirs, 2 * gates * hidden),
    }
    inputs = ["X", "W", "R", "B"]
    if peepholes:
        arrays["P"] = uniform(dirs, 3 * hidden)
        inputs += ["", "", "", "P"]
    for name, array in arrays.items():
        array.name = name
    node = helper.make_node(op, inputs, ["Y", "Y_h"], hidden_size=hidden, name="rec", **attributes)
    graph = helper.make_graph(
        [node],
        "variant",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, 1, input_size])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None),
        ],
        list(arrays.values()),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def lower(path: str, target: str, calibration: str, quantization: str) -> dict:
    report = path + f".{target}.json"
    args = [path, f"--target={target}", f"--calibration={calibration}", f"--report={report}"]
    args.append(f"--quantization={quantization}")
    result = subprocess.run(
        [sys.executable, "-m", "recurrent_lowering.tools.lower", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    if result.returncode:
        raise SystemExit(f"{path} to {target}: {result.stderr.strip().splitlines()[-1]}")
    with open(report) as f:
        return json.load(f)


def row(label, target, variant, baseline) -> str:
    def cells(r):
        return (
            f"{r['time']['total_s']:.1f} s",
            f"{r['vela']['cycles']:,}",
            f"{r['numerics']['sqnr_db']:.1f}",
            str(r["ops"]["cpu"] - r["ops"]["cpu_reasons"].get("q/dq at delegate boundary", 0)),
        )

    v, b = cells(variant), cells(baseline)
    cost = variant["vela"]["cycles"] / baseline["vela"]["cycles"]
    time = variant["time"]["total_s"] / baseline["time"]["total_s"]
    kinds = variant["recurrent_nodes"]
    form = (
        "layer op"
        if kinds["as_layer_ops"]
        else "torch module"
        if kinds["as_torch_modules"]
        else "unrolled"
    )
    return (
        f"| {label} | {target} | {form} | {v[0]} / {b[0]} ({time:.2f}x) | "
        f"{v[1]} / {b[1]} ({cost:.3f}x) | {v[2]} / {b[2]} | {v[3]} / {b[3]} |"
    )


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The variants' sizes and which to run (shared with variant_ops.py)."""
    parser.add_argument("--input_size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", default="", help="comma-separated labels to run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Markdown table; reports go to OUT.jsonl")
    parser.add_argument("--targets", default="ethos-u55-128,ethos-u85-256")
    parser.add_argument(
        "--quantization", default="int8", help="the CLI's --quantization, the same for both"
    )
    add_model_flags(parser)
    args = parser.parse_args()
    caller_directory.enter()
    size = (args.input_size, args.hidden, args.steps)
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        calibration = os.path.join(tmp, "calibration.npz")
        x = np.random.default_rng(1).standard_normal((args.steps, 1, args.input_size))
        np.savez(calibration, X=x.astype(np.float32))
        for label, op, attributes, peepholes, base in PAIRS:
            if args.only and label not in args.only.split(","):
                continue
            paths = {}
            for kind, attrs, peep in (
                ("variant", attributes, peepholes),
                ("baseline", base, False),
            ):
                paths[kind] = os.path.join(tmp, f"{label.replace(' ', '_')}.{kind}.onnx")
                onnx.save(model(op, attrs, peep, *size), paths[kind])
            for target in args.targets.split(","):
                reports = {
                    k: lower(p, target, calibration, args.quantization) for k, p in paths.items()
                }
                rows.append(row(label, target, reports["variant"], reports["baseline"]))
                records.append({"label": label, "target": target, **reports})
                print(rows[-1], flush=True)
    header = [
        f"ONNX nodes torch cannot express vs the nearest one it can (I={size[0]}, H={size[1]}, "
        f"T={size[2]}, batch 1, {args.quantization}, calibrated on one seeded normal input). "
        "Cycles are Vela estimates, SQNR is the TOSA reference model against onnxruntime on "
        "the original model; lowering time is `//tools:lower`'s total on this 2-core machine.",
        "",
        f"    ./bazelw run //benchmarks:onnx_variants -- --quantization {args.quantization} "
        f"--out {args.out}",
        "",
        "| variant | target | variant as | lowering time variant / baseline | Vela cycles | "
        "SQNR dB | CPU ops (besides boundary q/dq) |",
        "|---|---|---|---|---|---|---|",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(header + rows) + "\n")
    with open(os.path.splitext(args.out)[0] + ".jsonl", "w") as f:
        for record in records:
            for kind in ("variant", "baseline"):
                record[kind]["numerics"].pop("plot", None)
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
