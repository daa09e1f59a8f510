"""Where an ONNX variant's extra cycles go: Vela's per-layer cycles summed per operator kind,
the variant (benchmarks/onnx_variants.py: peepholes, linear_before_reset=0, clip,
HardSigmoid, reverse) against the nn-expressible node it departs from, both in int8 (or
int16) through the CLI's ONNX route. Shows whether a variant costs more than the arithmetic
it adds (Vela estimates; Markdown).

  ./bazelw run //benchmarks:variant_ops -- --out OUT.md
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import numpy as np
import onnx

from recurrent_lowering.benchmarks import caller_directory, int16_per_op, onnx_variants


def _lower(model: onnx.ModelProto, steps, input_size, target, precision, work: pathlib.Path):
    work.mkdir(parents=True)
    path, calibration = work / "model.onnx", work / "calibration.npz"
    onnx.save(model, path)
    x = np.random.default_rng(1).standard_normal((steps, 1, input_size)).astype(np.float32)
    np.savez(calibration, X=x)
    module, inputs = int16_per_op.onnx_module(str(path), str(calibration), target)
    return int16_per_op.per_kind(module, inputs, target, precision, work / "lowered")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default="ethos-u85-256")
    parser.add_argument("--quantization", default="int8", choices=("int8", "int16"))
    onnx_variants.add_model_flags(parser)
    args = parser.parse_args()
    caller_directory.enter()
    only = set(filter(None, args.only.split(",")))
    sizes = (args.input_size, args.hidden, args.steps)
    lines = [
        f"Vela cycles per operator kind, {args.quantization}, {args.target}; "
        f"I={args.input_size}, H={args.hidden}, T={args.steps}.",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for label, op, attributes, peepholes, base in onnx_variants.PAIRS:
            if only and label not in only:
                continue
            models = {
                "variant": onnx_variants.model(op, attributes, peepholes, *sizes),
                "baseline": onnx_variants.model(op, base, False, *sizes),
            }
            work = pathlib.Path(tmp) / "_".join(label.split())  # no spaces: Vela's argv
            results = {
                k: _lower(m, args.steps, args.input_size, args.target, args.quantization, work / k)
                for k, m in models.items()
            }
            (total_v, kinds_v), (total_b, kinds_b) = results["variant"], results["baseline"]
            lines += [
                "",
                f"{label}: {total_v:,} / {total_b:,} cycles ({total_v / total_b:.3f}x)",
                "",
                "| operator | variant ops | variant cycles | baseline ops | baseline cycles "
                "| difference |",
                "|---|---|---|---|---|---|",
            ]
            for kind in sorted(set(kinds_v) | set(kinds_b)):
                (nv, cv), (nb, cb) = kinds_v.get(kind, (0, 0)), kinds_b.get(kind, (0, 0))
                lines.append(f"| {kind} | {nv} | {cv:,} | {nb} | {cb:,} | {cv - cb:+,} |")
            print("\n".join(lines[-len(kinds_v | kinds_b) - 5 :]), flush=True)
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
