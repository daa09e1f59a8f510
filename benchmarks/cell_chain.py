"""A sequence written as a Python loop of cell calls against the same weights as a layer.

`nn.GRUCell` called once per timestep, each h fed to the next call and the h's stacked, is
the same function as `nn.GRU` over the sequence, but torch.export writes T `aten.gru_cell`
ops; recurrent_ops.cell_chains reads them back as the layer. This lowers both forms, the
same weights, calibration and held-out samples, and writes Vela's cycles and each held-out
sample's SQNR (the TOSA reference model on the flatbuffer given to Vela, against torch
eager): where the chain is read as a layer, the two rows agree.

  python -m recurrent_lowering.benchmarks.cell_chain --out OUT.md [--target ethos-u55-128]

`--onnx` lowers instead the two forms exported by torch.onnx (TorchScript exporter): the layer
is one ONNX GRU node, the loop becomes plain ops per step (Gather, Gemm, Split, Sigmoid,
Tanh, ...), which no reader takes for a recurrent layer. Each goes through the CLI
(`//tools:lower`), its SQNR the report's, over the held-out samples against onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.runtime import arm_numerics


class Layer(torch.nn.Module):
    def __init__(self, gru: torch.nn.GRU):
        super().__init__()
        self.gru = gru

    def forward(self, x):
        return self.gru(x)[0]


class Cells(torch.nn.Module):
    def __init__(self, cell: torch.nn.GRUCell):
        super().__init__()
        self.cell = cell

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.cell.hidden_size)
        ys = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            ys.append(h)
        return torch.stack(ys, 1)


def forms(input_size: int, hidden: int) -> dict:
    """{"layer": nn.GRU, "cells": a GRUCell loop} with the same weights."""
    torch.manual_seed(0)
    gru = torch.nn.GRU(input_size, hidden, batch_first=True)
    cell = torch.nn.GRUCell(input_size, hidden)
    with torch.no_grad():
        for ours, theirs in (("weight_ih", "weight_ih_l0"), ("weight_hh", "weight_hh_l0")):
            getattr(cell, ours).copy_(getattr(gru, theirs))
        for ours, theirs in (("bias_ih", "bias_ih_l0"), ("bias_hh", "bias_hh_l0")):
            getattr(cell, ours).copy_(getattr(gru, theirs))
    return {"layer": Layer(gru).eval(), "cells": Cells(cell).eval()}


def _onnx_rows(args, modules: dict, calibration, held_out) -> list:
    """One row per form and quantization: the CLI on the form's torch.onnx export."""
    import onnx

    rows = []
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        stacked = {"cal": calibration, "ev": held_out}
        for key, samples in stacked.items():
            np.savez(work / f"{key}.npz", x=np.stack([s[0].numpy() for s in samples]))
        for name, module in modules.items():
            model = work / f"{name}.onnx"
            torch.onnx.export(module, calibration[0], str(model), input_names=["x"], dynamo=False)
            ops = {n.op_type for n in onnx.load(str(model)).graph.node} - {"Constant"}
            for q in args.quantizations.split(","):
                report = work / f"{name}_{q}.json"
                command = [sys.executable, "-m", "recurrent_lowering.tools.lower", str(model)]
                command += ["--target", args.target, "--quantization", q]
                command += ["--calibration", str(work / "cal.npz")]
                command += ["--evaluation", str(work / "ev.npz")]
                command += ["--output", str(work / f"{name}_{q}.pte"), "--report", str(report)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                r = json.loads(report.read_text())
                rows.append(
                    f"| {name} | {', '.join(sorted(ops))} | {q} | {r['vela']['cycles']:,} | "
                    f"{r['numerics']['sqnr_db']:.1f} |"
                )
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default="ethos-u55-128")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--quantizations", default="int8,int16")
    parser.add_argument("--onnx", action="store_true", help="the forms as torch.onnx exports")
    args = parser.parse_args()
    caller_directory.enter()
    input_size, hidden = 4, 8
    generator = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, args.steps, input_size, generator=generator),) for _ in range(12)]
    calibration, held_out = samples[:8], samples[8:]
    lines = [
        f"nn.GRU({input_size}, {hidden}) against nn.GRUCell called per step, the same weights, "
        f"T = {args.steps}, {args.target}; 8 calibration and {len(held_out)} held-out N(0, 1) "
        "sequences (`python -m recurrent_lowering.benchmarks.cell_chain "
        f"--target {args.target}`). Cycles: Vela's estimate; dB: TOSA reference model "
        "against torch eager, per held-out sample.",
        "",
        "| form | quantization | cycles | dB per held-out sample |",
        "|---|---|---|---|",
    ]
    if args.onnx:
        lines[0] = (
            lines[0]
            .replace("--target", "--onnx --target")
            .replace(
                "against torch eager, per held-out sample", "against onnxruntime (fp32), the CLI's"
            )
        )
        lines[2:4] = ["| form | ONNX ops | quantization | cycles | dB, held-out samples |"]
        lines.append("|---|---|---|---|---|")
        lines += _onnx_rows(args, forms(input_size, hidden), calibration, held_out)
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        return
    for q in args.quantizations.split(","):
        for name, module in forms(input_size, hidden).items():
            with tempfile.TemporaryDirectory() as work:
                result = flow.lower(
                    module,
                    calibration[0],
                    args.target,
                    work,
                    calibration_inputs=calibration,
                    quantization=q,
                )
                db = [arm_numerics.check(result, module, s).sqnr_db for s in held_out]
            cycles = result.vela.summary.cycles if result.vela else "-"
            lines.append(
                f"| {name} | {q} | {cycles:,} | " + ", ".join(f"{d:.1f}" for d in db) + " |"
            )
            print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
