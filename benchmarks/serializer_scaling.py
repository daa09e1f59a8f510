"""What tosa_serializer's addTensor costs as a block grows: it looks every new name up among
the block's tensors one by one, so writing a graph of N tensors takes time in N^2. A loop
lowered to TOSA writes its step once per timestep (madmom's BLSTM: some 45,000 tensors), so
this sets a floor under its lowering time that no change of ours removes.

  python -m recurrent_lowering.benchmarks.serializer_scaling --out OUT.md
"""

from __future__ import annotations

import argparse
import time

import tosa_serializer as ts


def per_call_us(total: int, window: int) -> list:
    """(tensors in the block, microseconds per addTensor over the last `window` calls)."""
    graph = ts.TosaSerializer("")  # held: the block is its, freed with it
    block = graph.currRegion.currBasicBlock
    rows, start = [], time.perf_counter()
    for k in range(1, total + 1):
        block.addTensor(f"t{k}", [1, 25], ts.DType.INT16)  # short names, as the loop writes
        if k % window == 0:
            now = time.perf_counter()
            rows.append((k, (now - start) / window * 1e6))
            start = now
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tensors", type=int, default=60000)
    parser.add_argument("--window", type=int, default=10000)
    args = parser.parse_args()
    rows = per_call_us(args.tensors, args.window)
    lines = [
        f"tosa_serializer addTensor, one block, {args.tensors:,} tensors "
        "(`python -m recurrent_lowering.benchmarks.serializer_scaling`):",
        "",
        "| tensors in the block | us per addTensor (last window) |",
        "|---|---|",
        *(f"| {k:,} | {us:.0f} |" for k, us in rows),
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
