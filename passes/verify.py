"""A program's invariants, checked after every pass (plan.lower): a broken pass fails there,
naming itself and the node, not later in an adapter's translation.

Every node reachable from the outputs is of a known kind with that kind's attributes
(graph.ATTRS), takes its kind's number of inputs, all built in its own graph (a loop body's
nodes in the body's graph, reaching the program only through `external` leaves), and has a
shape that is None or a tuple of ints and Nones; a `piece` reads an unstack or split, a
`result` a loop or recurrence, within their outputs. Loop and recurrence bodies are
verified the same way.
"""

from __future__ import annotations

from .graph import ATTRS, Body, Node, reachable

# inputs per node kind: an exact count, or (least, most); None for no bound
_ARITY = {
    **dict.fromkeys(("input", "external", "const"), 0),
    **dict.fromkeys(("add", "sub", "mul", "less"), 2),
    "where": 3,
    **dict.fromkeys(
        (
            "neg",
            "act",
            "clamp",
            "slice",
            "squeeze",
            "unsqueeze",
            "transpose",
            "reshape",
            "unstack",
            "split",
            "piece",
            "result",
            "positions",
            "zeros_like_rows",
        ),
        1,
    ),
    "linear": (1, 3),
    **dict.fromkeys(("concat", "stack"), (1, None)),
    **dict.fromkeys(("loop", "recurrence"), (1, None)),
}


class VerifyError(AssertionError):
    """A program breaks an invariant; the message names the node and what is wrong."""


def _fail(node: Node, what: str):
    raise VerifyError(f"{node.op} node {node!r}: {what}")


def _count(node: Node) -> int:
    """The outputs of a multi-output node (what its piece or result nodes index)."""
    at = node.attrs
    if node.op == "unstack":
        return at.n
    if node.op == "split":
        return at.sizes if isinstance(at.sizes, int) else len(at.sizes)
    if node.op == "loop":
        return len(at.loop.body.outputs)
    return 1 + len(at.recurrence.step.outputs)  # y, then the final states


def verify(outputs: list, graph, where: str = "program") -> None:
    """Every node `outputs` reach keeps the invariants, built in `graph`."""
    nodes = [o for o in outputs if o is not None]
    for node in reachable(nodes):
        if node.op not in ATTRS:
            _fail(node, "an unknown kind of node")
        if not isinstance(node.attrs, ATTRS[node.op]):
            _fail(node, f"attributes {node.attrs!r}, not {ATTRS[node.op].__name__}")
        arity = _ARITY[node.op]
        least, most = (arity, arity) if isinstance(arity, int) else arity
        if len(node.args) < least or (most is not None and len(node.args) > most):
            _fail(node, f"{len(node.args)} inputs")
        if node.graph is not graph:
            _fail(node, f"built in another graph than the {where}'s")
        for a in node.args:
            if not isinstance(a, Node) or a.graph is not graph:
                _fail(node, f"an input from another graph: {a!r}")
        shape = node.shape
        if shape is not None and not (
            isinstance(shape, tuple) and all(d is None or isinstance(d, int) for d in shape)
        ):
            _fail(node, f"shape {shape!r}")
        if node.op in ("piece", "result"):
            parent = node.args[0]
            parents = ("unstack", "split") if node.op == "piece" else ("loop", "recurrence")
            if parent.op not in parents:
                _fail(node, f"reads a {parent.op} node")
            if not 0 <= node.attrs.index < _count(parent):
                _fail(node, f"index {node.attrs.index} of {_count(parent)} outputs")
        if node.op == "loop":
            _verify_body(node.attrs.loop.body, node)
        if node.op == "recurrence":
            _verify_body(node.attrs.recurrence.step, node)


def _verify_body(body: Body, node: Node) -> None:
    if len(body.outputs) < body.num_carried or len(body.inputs) < body.num_carried:
        _fail(node, f"a body of {len(body.outputs)} outputs for {body.num_carried} carried")
    for leaf in body.inputs:
        if leaf.op != "input" or leaf.graph is not body.graph:
            _fail(node, f"a body input {leaf!r} that is not an input of the body's graph")
    verify(body.outputs, body.graph, where=f"{node.op} body")
