"""How fast this machine runs Python, so wall times measured on different days compare.

Lowering is mostly Python (torch.fx passes, ExecuTorch's Arm passes, the quantizer), and the
machines these benchmarks run on differ by more than the code does between two commits: the
same lowering took 1.5-2.6x as long on one day's machine as on the next
(docs/results/real_model_accuracy.md). A benchmark prints `seconds()` in its header: the
best of three runs of a fixed pure-Python workload (object creation, dict and attribute
traffic, the kind torch.fx spends its time on), one process, one thread.
"""

from __future__ import annotations

import time


class _Node:
    __slots__ = ("name", "args", "users")

    def __init__(self, name: str, args: tuple):
        self.name, self.args, self.users = name, args, {}


def _workload(nodes: int = 200_000) -> int:
    """A graph of `nodes` nodes built, walked and renamed: fx-like Python, no native code."""
    graph: list = []
    by_name: dict = {}
    for i in range(nodes):
        args = (graph[i - 1], graph[i // 2]) if i > 1 else ()
        node = _Node(f"n{i}", args)
        for a in args:
            a.users[node] = None
        graph.append(node)
        by_name[node.name] = node
    total = 0
    for node in graph:
        total += len(node.users) + sum(len(a.name) for a in node.args)
        node.name = node.name + "_"
    return total


def seconds(repeats: int = 3) -> float:
    """The workload's best wall time over `repeats` runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _workload()
        best = min(best, time.perf_counter() - start)
    return best


def line() -> str:
    """The sentence a benchmark's header carries."""
    return (
        f"Machine speed: {seconds():.3f} s for benchmarks/machine_speed.py's fixed Python "
        "workload (lower is faster)."
    )
