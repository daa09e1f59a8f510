"""What the TOSA reference model costs per run of a graph cut into pieces of N operators
(runtime/tosa_pieces.py), and what the cut costs once: the figures behind tosa_pieces.MAX_OPS.

The reference model looks a tensor up among its graph's tensors one by one, so a graph's
run takes time in about the square of its size; a piece also repeats the constants it
reads and costs a call of its own. Each .tosa (a delegate's flatbuffer, as `//tools:lower
--tosa_output` writes it) is cut at each size, run once to cut and again `--runs` times on
the same integer inputs; every size's outputs are checked equal to the first's, bit for bit.

  python -m recurrent_lowering.benchmarks.reference_pieces A.tosa B.tosa \
      --sizes 2000,1000,500 --out OUT.md
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.runtime import tosa_flatbuffer, tosa_pieces, tosa_reference


def measure(path: str, sizes: list, runs: int) -> list:
    """[(size, pieces, seconds to cut, seconds per run)] for the graph at `path`."""
    flatbuffer = tosa_flatbuffer.load_bytes(path)
    inputs, _ = tosa_flatbuffer.graph_io(flatbuffer)
    rng = np.random.default_rng(0)
    arrays = [rng.integers(-100, 100, i.shape).astype(i.numpy_dtype) for i in inputs]
    rows, reference = [], None
    for size in sizes:
        start = time.perf_counter()
        pieces = tosa_pieces.split(flatbuffer, size)
        cut = time.perf_counter() - start
        tosa_reference.run(flatbuffer, arrays, piece_ops=size)  # its own cut, cached
        start = time.perf_counter()
        for _ in range(runs):
            outputs = tosa_reference.run(flatbuffer, arrays, piece_ops=size)
        per_run = (time.perf_counter() - start) / runs
        reference = reference or outputs
        if not all(np.array_equal(a, b) for a, b in zip(reference, outputs)):
            raise AssertionError(f"{path}: pieces of {size} give other outputs")
        rows.append((size, len(pieces.graphs) if pieces else 1, cut, per_run))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tosa", nargs="+", help=".tosa files")
    parser.add_argument("--sizes", default="4000,2000,1000,500,250")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    caller_directory.enter()
    sizes = [int(s) for s in args.sizes.split(",")]
    lines = [
        "TOSA reference model, a graph run in pieces of N operators (`python -m "
        f"recurrent_lowering.benchmarks.reference_pieces ... --sizes {args.sizes} "
        f"--runs {args.runs}`): seconds to cut once, seconds per run.",
        "",
        "| graph | operators | N | pieces | cut s | run s |",
        "|---|---|---|---|---|---|",
    ]
    for path in args.tosa:
        ops = tosa_flatbuffer.count_ops(path, include_constants=False)
        for size, pieces, cut, run in measure(path, sizes, args.runs):
            name = os.path.basename(path)
            lines.append(f"| {name} | {ops:,} | {size} | {pieces} | {cut:.1f} | {run:.3g} |")
            print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
