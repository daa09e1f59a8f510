"""torch.export programs as the Arm flow takes them.

torch 2.13's `ExportedProgram.module()` adds a `_guards_fn` call_module unless called with
`check_guards=False`, and ExecuTorch's Arm passes reject call_modules; an exported
program's module refuses `.eval()`.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule


def module_of(ep: ExportedProgram) -> GraphModule:
    """`ep.module()` without the guards call."""
    try:
        return ep.module(check_guards=False)
    except TypeError:  # torch without the check_guards argument
        return ep.module()


def eval_mode(module: torch.nn.Module) -> torch.nn.Module:
    """Eval mode; an exported program's module (from a .pt2) refuses .eval() and needs none."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


def as_module(ep: ExportedProgram) -> torch.fx.GraphModule:
    """`ep` as a plain GraphModule that can be re-exported, `.eval()`ed and quantized.

    `ExportedProgram.module()` refuses `.eval()` and, in torch 2.13, adds a `_guards_fn`
    call_module that ExecuTorch's Arm passes reject; this copy has neither.
    """
    unlifted = module_of(ep)
    gm = GraphModule(unlifted, unlifted.graph)
    for n in list(gm.graph.nodes):
        if n.op == "call_module" and n.target == "_guards_fn" and not n.users:
            gm.graph.erase_node(n)
    gm.recompile()
    return gm.eval()
