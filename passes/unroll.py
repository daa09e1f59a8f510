"""The unrolled form: every recurrence becomes T copies of its step (static T).

Each step is the step graph instantiated on that timestep's slice of the projection and
the previous step's states, so the algebra runs again per step: a zero initial state
makes the first step's recurrent products vanish, a gate block of one step's slice is the
sequence's gate block sliced once. Steps take the projection with one `unstack` and Y is
one `stack`.
"""

from __future__ import annotations

from .graph import Body, Graph, Node, rebuild
from .masks import SKIP, blend
from .program import Recurrence, RecurrentProgram


def instantiate(body: Body, g: Graph, leaves: list) -> list:
    """The body's outputs built in `g` over `leaves` (one per body input); its external
    leaves stand for the nodes of `g` they name."""
    bound = {id(leaf): value for leaf, value in zip(body.inputs, leaves)}

    def hook(node: Node, args, new):
        if node.op == "external" and isinstance(node.attrs.value, Node):
            return node.attrs.value
        return bound.get(id(node))

    return rebuild(body.outputs, hook, graph=g)


def unroll(program: RecurrentProgram) -> RecurrentProgram:
    """Every recurrence of `program` as T steps (T must be static)."""
    expanded: dict = {}  # id(recurrence node) -> its results

    def hook(node: Node, args, new):
        if node.op == "result" and node.args[0].op == "recurrence":
            rec = node.args[0]
            if id(rec) not in expanded:  # args[0]: the recurrence over rebuilt inputs
                expanded[id(rec)] = _steps(program.graph, rec, args[0].args)
            return expanded[id(rec)][node.attrs.index]
        return None

    return program.replace(rebuild(program.outputs, hook))


def _steps(g: Graph, node: Node, args) -> list:
    r: Recurrence = node.attrs.recurrence
    xp, *state = args
    T, p = r.steps, r.cell
    if T is None:
        raise ValueError("unrolling needs a static sequence length")
    xs = g.unstack(xp, 0, T)  # [B, G] per step
    ys: list = [None] * T
    for t in reversed(range(T)) if r.reverse else range(T):
        mask = r.lens.step(t)
        if mask is SKIP:
            ys[t] = r.zeros(g, p.output_size) if r.want_y else None
            continue
        new = tuple(instantiate(r.step, g, [*state, xs[t]]))
        state, ys[t] = blend(g, mask, new, tuple(state), new[0])
    finals = [r.zeros(g, w) if s.is_const(0) else s for s, w in zip(state, p.state_widths)]
    y = g.stack(ys, 0) if r.want_y else None
    return [y, *finals]
