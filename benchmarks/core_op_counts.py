"""Ops per timestep: the core (measured with CountingBuilder) next to ExecuTorch 1.5.1's Arm passes.

ExecuTorch's figures are counted from the source of
executorch/backends/arm/_passes/decompose_{gru,lstm,rnn}_pass.py in the installed package:
the `create_node` calls inside the time loop of `_build_direction` (following calls to the
class's own helpers, such as LSTM's `_build_cell_step`), plus the per-timestep direction
concat of the bidirectional case. Nothing is imported from ExecuTorch.

    ./bazelw run //benchmarks:core_op_counts
"""

from __future__ import annotations

import ast
import collections
import importlib.util
import os

import numpy as np

from recurrent_lowering.passes import CellKind, Direction, LayerWeights, RecurrentSpec, emit
from recurrent_lowering.passes.op_count import CountingBuilder

VARIANTS = [
    ("GRU", "linear_before_reset=1 (PyTorch)", dict(linear_before_reset=True)),
    ("GRU", "linear_before_reset=0", dict(linear_before_reset=False)),
    ("LSTM", "", {}),
    ("LSTM", "peepholes", dict(peephole=True)),
    ("LSTM", "input_forget", dict(input_forget=True)),
    ("LSTM", "proj_size", dict(proj_size=2)),
    ("RNN", "", {}),
]


def _weights(spec: RecurrentSpec, peephole: bool):
    G, H = spec.cell.num_gates, spec.hidden_size
    return [
        [
            LayerWeights(
                w=np.zeros((G * H, spec.layer_input_size(layer)), np.float32),
                r=np.zeros((G * H, spec.output_size), np.float32),
                b_w=np.ones(G * H, np.float32),
                b_r=np.ones(G * H, np.float32),
                peephole=np.full((3, H), 0.5, np.float32) if peephole else None,  # not 1: kept
                proj=np.ones((spec.proj_size, H), np.float32) if spec.proj_size else None,
            )
            for _ in range(spec.num_directions)
        ]
        for layer in range(spec.num_layers)
    ]


def count(kind: str, T: int, D: int = 1, emission: str = "unrolled", init=True, **kw):
    peephole = kw.pop("peephole", False)
    cell = CellKind(kind)
    spec = RecurrentSpec(
        "count",
        cell,
        6,
        4,
        direction=Direction.BIDIRECTIONAL if D == 2 else Direction.FORWARD,
        seq_len=T,
        has_initial_h=init,
        has_initial_c=init and cell is CellKind.LSTM,
        **kw,
    )
    b = CountingBuilder()
    lstm = cell is CellKind.LSTM
    emit(
        b,
        spec,
        _weights(spec, peephole),
        "x",
        "h0" if init else None,
        "c0" if init and lstm else None,
        emission=emission,
    )
    return b


def per_step(kind: str, D: int = 1, **kw) -> int:
    """Steady-state ops per timestep (all directions), fixed per-layer ops excluded."""
    return (count(kind, 7, D, **kw).total() - count(kind, 4, D, **kw).total()) // 3


def loop_body(kind: str, **kw) -> int:
    (body,) = count(kind, 5, emission="loop", **kw).bodies
    return body.total()


# --- ExecuTorch, counted from source ------------------------------------------------------


def _calls(node, methods: dict, seen=()) -> int:
    """create_node calls under `node`, following self.<helper>() calls into the class."""
    n = 0
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        f = sub.func
        if isinstance(f, ast.Name) and f.id == "create_node":
            n += 1
        elif (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "self"
            and f.attr in methods
            and f.attr not in seen
        ):
            n += _calls(methods[f.attr], methods, seen + (f.attr,))
    return n


def executorch_per_step(kind: str) -> tuple[int, int, str]:
    """(ops per step one direction, bidirectional, source file) from ExecuTorch's pass source."""
    spec = importlib.util.find_spec("executorch")
    if spec is None:
        raise SystemExit("executorch is not installed in this environment")
    root = spec.submodule_search_locations[0]
    path = os.path.join(root, "backends", "arm", "_passes", f"decompose_{kind.lower()}_pass.py")
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    loop = next(n for n in ast.walk(methods["_build_direction"]) if isinstance(n, ast.For))
    one = sum(_calls(stmt, methods) for stmt in loop.body)
    # per-timestep concat of forward and backward outputs: a loop over zip(fw_outputs, ...)
    pair = 0
    for n in ast.walk(methods["call"]):
        if isinstance(n, ast.For) and "zip(fw_out" in ast.unparse(n.iter):
            pair = sum(_calls(stmt, methods) for stmt in n.body)
    return one, 2 * one + pair, os.path.relpath(path, os.path.dirname(root))


def main():
    et = {k: executorch_per_step(k) for k in ("GRU", "LSTM", "RNN")}
    rows = [
        "| cell | variant | core unrolled, 1 dir | 2 dirs | core loop body | "
        "ExecuTorch 1.5.1, 1 dir | 2 dirs |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, label, kw in VARIANTS:
        one, two = per_step(kind, **kw), per_step(kind, D=2, **kw)
        plain = label in ("", "linear_before_reset=1 (PyTorch)")
        e1, e2 = (str(et[kind][0]), str(et[kind][1])) if plain else ("-", "-")
        rows.append(
            f"| {kind} | {label or 'plain'} | {one} | {two} | {loop_body(kind, **kw)} "
            f"| {e1} | {e2} |"
        )
    print("\n".join(rows))
    print()
    for kind, _, kw in VARIANTS[:1] + VARIANTS[2:3] + VARIANTS[-1:]:
        c = collections.Counter(count(kind, 7, **kw).counts())
        c.subtract(count(kind, 4, **kw).counts())
        ops = ", ".join(f"{k} {v // 3}" for k, v in sorted(c.items()) if v)
        print(f"- {kind} per step: {ops}")
    print()
    for kind, (_, _, path) in et.items():
        print(f"- ExecuTorch {kind}: counted in {path}")


if __name__ == "__main__":
    main()
