"""Where int16 activations cost cycles: Vela's per-layer table, int8 against int16, summed
per operator kind, for one recurrent layer or an ONNX model through the CLI's route.

`--quantization auto` models int16's price from the products and the gate arithmetic
(backends/executorch_arm/precision/cost_model.py); this shows what else a program pays in
int16, e.g.
RESCALEs Vela keeps apart from the elementwise ops in a step, or Y written in twice the
bytes. Writes a Markdown table (cycles are Vela estimates).

  ./bazelw run //benchmarks:int16_per_op -- --layer gru,24,25,100,bi --out OUT.md
  ./bazelw run //benchmarks:int16_per_op -- --onnx M.onnx --calibration C.npz --out OUT.md
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import pathlib
import tempfile

import numpy as np

from recurrent_lowering.benchmarks import caller_directory


def _layer(spec: str):
    """(module, inputs) for KIND,INPUT,HIDDEN,STEPS[,bi]: an nn.GRU/LSTM/RNN returning Y."""
    import torch

    kind, size, hidden, steps, *rest = spec.split(",")
    cls = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM, "rnn": torch.nn.RNN}[kind]

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(int(size), int(hidden), bidirectional=rest == ["bi"])

        def forward(self, x):
            return self.rnn(x)[0]

    torch.manual_seed(0)
    return Layer().eval(), (torch.randn(int(steps), 1, int(size)),)


class _Stages:
    """The progress interface onnx_route.prepare reports to, kept silent."""

    @contextlib.contextmanager
    def stage(self, name):
        yield

    def record(self, name, seconds):
        pass


def onnx_module(path: str, calibration: str, target: str):
    """(module, inputs) as //tools:lower's ONNX route builds them."""
    from recurrent_lowering.tools.lowering import model_source, onnx_route, report, targets

    source = model_source.load(path)
    arrays = list(np.load(calibration).values())
    prepared = onnx_route.prepare(
        source, targets.Options(), arrays, report.empty(target, path), _Stages()
    )
    return prepared.module, prepared.example


def per_kind(module, inputs, target: str, activations: str, out: pathlib.Path):
    from recurrent_lowering.backends.executorch_arm import flow

    result = flow.lower(module, inputs, target, out, quantization=activations)
    kinds = collections.defaultdict(lambda: [0, 0])
    for op in result.vela.ops:
        kinds[op.original_op][0] += 1
        kinds[op.original_op][1] += op.cycles
    return result.vela.summary.cycles, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", help="KIND,INPUT,HIDDEN,STEPS[,bi], e.g. gru,24,25,100,bi")
    parser.add_argument("--onnx", help="an .onnx model (with --calibration)")
    parser.add_argument("--calibration", help=".npz of the model's inputs, in order")
    parser.add_argument("--target", default="ethos-u55-128")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    caller_directory.enter()
    if bool(args.layer) == bool(args.onnx):
        parser.error("give --layer or --onnx")
    if args.onnx:
        module, inputs = onnx_module(args.onnx, args.calibration, args.target)
    else:
        module, inputs = _layer(args.layer)
    with tempfile.TemporaryDirectory() as work:
        totals, tables = {}, {}
        for bits in ("int8", "int16"):
            totals[bits], tables[bits] = per_kind(
                module, inputs, args.target, bits, pathlib.Path(work) / bits
            )
    what = args.layer or pathlib.Path(args.onnx).name
    lines = [
        f"{what} on {args.target}: Vela cycles int8 {totals['int8']:,}, int16 "
        f"{totals['int16']:,} ({totals['int16'] / totals['int8']:.3f}x)",
        "",
        "| operator | int8 ops | int8 cycles | int16 ops | int16 cycles |",
        "|---|---|---|---|---|",
    ]
    for kind in sorted(set(tables["int8"]) | set(tables["int16"])):
        (n8, c8), (n16, c16) = tables["int8"].get(kind, (0, 0)), tables["int16"].get(kind, (0, 0))
        lines.append(f"| {kind} | {n8} | {c8:,} | {n16} | {c16:,} |")
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
