"""What the core knew about an emitted node, carried on the node for the policies after it.

FxBuilder tags every node it writes with the recurrent layer it computes, and each weight
with its role (which weight, whether every timestep reads it). The tag lives in
`node.meta["custom"]`, which torch.export, to_edge's decompositions and ExecuTorch's passes
copy onto the nodes they make from it, so the quantizer's policies, the CPU fallback and the
report read it after any number of rewrites; it holds plain values, so a decomposed
program still saves as a .pt2.
"""

from __future__ import annotations

from typing import Optional

from torch.fx import Node

KEY = "recurrent_lowering"  # node.meta["custom"][KEY]: {"layer": ..., "weight": ..., ...}


def tagged(custom: Optional[dict], **fields) -> dict:
    """A copy of a node's `custom` metadata with our tag holding `fields` (plain values)."""
    out = dict(custom or {})
    out[KEY] = {**out.get(KEY, {}), **fields}
    return out


def tag(node: Node, **fields) -> None:
    node.meta["custom"] = tagged(node.meta.get("custom"), **fields)


def _fields(node: Node) -> dict:
    custom = node.meta.get("custom") if isinstance(node, Node) else None
    return (custom or {}).get(KEY) or {}


def field(node: Node, name: str):
    """Our tag's field `name` on `node` (None if untagged): for policies that tag their own."""
    return _fields(node).get(name)


def layer_of(node: Node) -> Optional[str]:
    """The recurrent layer `node` was emitted for (its module path or op name), or None."""
    return _fields(node).get("layer")


def is_per_step_weight(node: Node) -> bool:
    """Whether `node` is a weight every timestep reads (R, an LSTM's projection)."""
    return bool(_fields(node).get("per_step"))
