"""A bundled example as an .onnx file, the way PyTorch users export theirs, with its example
input as a calibration .npz: the inputs of the ONNX -> Ethos-U measurements
(docs/results/onnx_to_ethos_u.md).

    ./bazelw run //benchmarks:export_onnx -- gru_a /tmp/onnx_route   # gru_a.onnx, gru_a_c.npz
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import torch

from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.examples import models


def export(name: str, out_dir: pathlib.Path, opset: int) -> tuple[pathlib.Path, pathlib.Path]:
    module, inputs = models.build(name)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path, npz_path = out_dir / f"{name}.onnx", out_dir / f"{name}_c.npz"
    torch.onnx.export(module.eval(), inputs, str(onnx_path), dynamo=False, opset_version=opset)
    np.savez(npz_path, *[t.numpy() for t in inputs])  # unnamed: taken in input order
    return onnx_path, npz_path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(models.MODELS))
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args(argv)
    caller_directory.enter()
    for path in export(args.model, args.out_dir, args.opset):
        print(path)


if __name__ == "__main__":
    main()
