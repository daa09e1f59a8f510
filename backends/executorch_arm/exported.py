"""torch.export programs as the Arm flow takes them.

torch 2.13's `ExportedProgram.module()` adds a `_guards_fn` call_module unless called with
`check_guards=False`, and ExecuTorch's Arm passes reject call_modules; an exported
program's module refuses `.eval()`. Its tensors are the exported module's own, which
ExecuTorch may write into (`with_own_tensors`).
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


def with_own_tensors(gm: GraphModule) -> GraphModule:
    """`gm` (an exported program's module) reading copies of its tensors rather than the
    module's that was exported: ExecuTorch 1.5.1's FoldScalarMulIntoConvPass (in the Arm
    quantizer's transform_for_annotation) folds `conv(x) * s` by writing the scaled weight
    into the get_attr's tensor in place, which would scale the caller's module too, and
    again in every later quantization of it (auto quantizes one module per candidate).
    Tensors shared by several attributes stay shared among the copies."""
    copies: dict = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        owner_name, _, attr = str(node.target).rpartition(".")
        owner = gm.get_submodule(owner_name)
        value = getattr(owner, attr, None)
        if not isinstance(value, torch.Tensor):
            continue
        if id(value) not in copies:
            data = value.detach().clone()
            if isinstance(value, torch.nn.Parameter):
                data = torch.nn.Parameter(data, requires_grad=value.requires_grad)
            copies[id(value)] = data
        setattr(owner, attr, copies[id(value)])  # a parameter, buffer or plain attribute
    return gm


def distinct(example_inputs) -> tuple:
    """`example_inputs` with every tensor that shares storage with an earlier one cloned.
    torch.export takes one tensor given for two inputs (`lower(m, (x, z, z))`, h0 = c0 =
    zeros) as one input: the program would then read one value for both."""
    seen, out = set(), []
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.numel():
            storage = t.untyped_storage().data_ptr()
            if storage in seen:
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
        out.append(t)
    return tuple(out)


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
