"""ExecuTorch's int16 TABLEs emulated in a converted module, to attribute a simulation's gap
to the TOSA program one table at a time.

The simulation (precision/accuracy.py) computes a sigmoid, tanh, reciprocal or sqrt exactly
on its dequantized input, where the lowered program reads a TOSA TABLE: 513 entries at input
codes -32768 + 128 k, each the function quantized to the output (ExecuTorch's
InsertTableOpsPass, `generate_16_bit_table_values`; a sqrt arrives as pow(x, 0.5)), and
between them `table[i] << 7 + (table[i+1] - table[i]) * fraction`, rescaled by 2^-7 rounding
half up. `emulate` puts that arithmetic in place of each chosen op read between an int16
dequantize and quantize, so the module then computes what the program does there. A
loop-form layer's step (loop/step.py) is another module and keeps its exact functions.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch.fx import GraphModule, Node

_qd = torch.ops.quantized_decomposed
_aten = torch.ops.aten

FUNCTIONS = {
    _aten.sigmoid.default: torch.sigmoid,
    _aten.tanh.default: torch.tanh,
    _aten.sqrt.default: torch.sqrt,
    _aten.rsqrt.default: torch.rsqrt,
    _aten.reciprocal.default: torch.reciprocal,
    _aten.exp.default: torch.exp,
    _aten.log.default: torch.log,
}


def _function(node: Node) -> Callable | None:
    if node.target == _aten.pow.Tensor_Scalar and float(node.args[1]) not in (1.0, 2.0):
        return lambda x, e=float(node.args[1]): torch.pow(x, e)  # ExecuTorch's sqrt
    return FUNCTIONS.get(node.target)


def _qparams(node) -> tuple | None:
    """(scale, zero point, qmin, qmax) of an int16 quantize/dequantize_per_tensor node."""
    return tuple(node.args[1:5]) if node.args[5] == torch.int16 else None


class Table(torch.nn.Module):
    """f as a 513-entry int16 TABLE from `qin` to `qout` (see the module docstring)."""

    def __init__(self, f: Callable, qin: tuple, qout: tuple):
        super().__init__()
        self.qin, self.qout = qin, qout
        scale, zp = float(qin[0]), int(qin[1])
        codes = -32768.0 + 128.0 * torch.arange(513, dtype=torch.float64)
        values = f(((codes - zp) * scale).float()).double()
        out_scale, out_zp, lo, hi = float(qout[0]), int(qout[1]), int(qout[2]), int(qout[3])
        self.lut = torch.clamp(torch.round(values / out_scale) + out_zp, lo, hi)

    def forward(self, x):
        scale, zp, lo, hi = (float(v) for v in self.qin)
        out_scale, out_zp = float(self.qout[0]), float(self.qout[1])
        code = torch.clamp(torch.round(x.double() / scale) + zp, lo, hi) + 32768
        i = torch.div(code, 128, rounding_mode="floor").long()
        fraction = code - 128 * i
        after = self.lut[torch.clamp(i + 1, max=512)]
        y = torch.floor((self.lut[i] * 128 + (after - self.lut[i]) * fraction) / 128 + 0.5)
        return ((y - out_zp) * out_scale).float()


def tables(module: GraphModule) -> list[Node]:
    """The ops of a converted module ExecuTorch makes int16 TABLEs: a table function read
    between an int16 dequantize and its one int16 quantize."""
    found = []
    for node in module.graph.nodes:
        if node.op != "call_function" or _function(node) is None:
            continue
        source, users = node.args[0], list(node.users)
        if getattr(source, "target", None) != _qd.dequantize_per_tensor.default:
            continue
        if len(users) != 1 or users[0].target != _qd.quantize_per_tensor.default:
            continue
        if _qparams(source) is not None and _qparams(users[0]) is not None:
            found.append(node)
    return found


def emulate(module: GraphModule, chosen: Callable[[Node], bool]) -> tuple[GraphModule, list]:
    """A copy of `module` with each table op `chosen` accepts computed as its TABLE; and
    the names of those ops."""
    module = copy.deepcopy(module)
    names = []
    for node in tables(module):
        if not chosen(node):
            continue
        qin, qout = _qparams(node.args[0]), _qparams(next(iter(node.users)))
        name = f"int16_table_{node.name}"
        module.add_module(name, Table(_function(node), qin, qout))
        with module.graph.inserting_after(node):
            table = module.graph.call_module(name, (node.args[0],))
        node.replace_all_uses_with(table)
        module.graph.erase_node(node)
        names.append(node.name)
    module.recompile()
    return module, names


def chooser(spec: str) -> Callable[[Node], bool]:
    """'all', or comma-separated op names (aten's: sigmoid, pow) and node names."""
    parts = set(spec.split(","))
    if "all" in parts:
        return lambda node: True
    return lambda node: node.name in parts or node.target.__name__.split(".")[0] in parts
