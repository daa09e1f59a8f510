"""The loop form: every recurrence becomes one `loop` node whose body is its step.

A zero initial state is first stepped outside the loop (its recurrent products vanish),
so the loop always carries real values. With a run-time length (which may be 1:
onnxruntime fails on a Scan over no steps) nothing is stepped outside; the zero states
take the run-time batch from `zeros_like_rows`. Masks of sequence_lens become one more
sequence the loop reads.

`initial_in_ys` (a target that can put the loop's initial h into its per-step outputs)
saves the concatenation of the peeled step's h with the loop's: see Graph.loop.
"""

from __future__ import annotations

from .graph import Body, Graph, Loop, Node, rebuild
from .masks import SKIP, Mask, blend
from .program import Recurrence, RecurrentProgram
from .unroll import instantiate


def loop(program: RecurrentProgram, initial_in_ys: bool = False) -> RecurrentProgram:
    """Every recurrence of `program` as a loop node."""
    expanded: dict = {}

    def hook(node: Node, args, new):
        if node.op == "result" and node.args[0].op == "recurrence":
            rec = node.args[0]
            if id(rec) not in expanded:
                expanded[id(rec)] = _loop(program.graph, rec, args[0].args, initial_in_ys)
            return expanded[id(rec)][node.attrs.index]
        return None

    return program.replace(rebuild(program.outputs, hook))


def _loop(g: Graph, node: Node, args, initial_in_ys: bool) -> list:
    r: Recurrence = node.attrs.recurrence
    xp, *state = args
    T, p, want_y = r.steps, r.cell, r.want_y
    y_first, peeled, first_mask = None, False, None
    start, end = 0, T  # steps left for the loop (T is None: known only at run time)
    if T is None and any(s.is_const(0) for s in state):
        x_0 = g.squeeze(g.slice(xp, 0, 0, 1), 0)
        state = [
            g.zeros_like_rows(x_0, w) if s.is_const(0) else s for s, w in zip(state, p.state_widths)
        ]
    elif any(s.is_const(0) for s in state):  # T is static here
        peeled = True
        t = T - 1 if r.reverse else 0
        mask = first_mask = r.lens.step(t)
        if mask is SKIP:
            y_first = g.unsqueeze(r.zeros(g, p.output_size), 0) if want_y else None
            state = [r.zeros(g, w) if s.is_const(0) else s for s, w in zip(state, p.state_widths)]
        else:
            x_t = g.squeeze(g.slice(xp, 0, t, t + 1), 0)
            new = tuple(instantiate(r.step, g, [*state, x_t]))
            state, y = blend(g, mask, new, tuple(state), new[0])
            state = list(state)
            y_first = g.unsqueeze(y, 0) if want_y else None
        if r.reverse:
            end = T - 1
        else:
            start = 1
    if peeled and end - start <= 0:  # the peeled step was the only one
        return [y_first, *state]

    mask = r.lens.steps(start, end) if T is not None else r.lens.run_time_steps(xp)
    xs = [g.slice(xp, 0, start, end) if peeled else xp]
    if mask is not None:
        xs.append(mask.value)
    body = _body(g, r, mask)
    with_initial = (
        initial_in_ys and want_y and y_first is not None and first_mask is None and mask is None
    )
    results = g.loop(Loop(body, r.reverse, with_initial), state, xs)
    n = len(state)
    finals = results[:n]
    y = None
    if with_initial:
        y = results[n]
    elif want_y:
        ys = results[n]
        parts = [ys] if y_first is None else ([ys, y_first] if r.reverse else [y_first, ys])
        y = g.concat(parts, 0) if len(parts) > 1 else parts[0]
    return [y, *finals]


def _body(outer: Graph, r: Recurrence, mask) -> Body:
    """The loop body: the step over (h[, c], x_t[, mask_t]) with the mask applied."""
    bg = Graph(outer.dtype)
    states = [bg.input(leaf.attrs.name, leaf.shape) for leaf in r.step.inputs[:-1]]
    x_leaf = r.step.inputs[-1]
    x_t = bg.input("x_t", x_leaf.shape)
    leaves = [*states, x_t]
    m = None
    if mask is not None:
        shape = None if mask.value.shape is None else mask.value.shape[1:]
        leaf = bg.input("mask_t", shape)
        leaves.append(leaf)
        m = Mask(leaf, False, mask.select)
    new = tuple(_instantiate_in_body(r.step, bg, [*states, x_t]))
    new, y = blend(bg, m, new, tuple(states), new[0])
    outputs = [*new] + ([y] if r.want_y else [])
    return Body(bg, leaves, outputs, len(states))


def _instantiate_in_body(step: Body, bg: Graph, leaves: list) -> list:
    """The step built in a loop body: external leaves (runtime weights of the program)
    stay external, read from the enclosing graph."""
    bound = {id(leaf): value for leaf, value in zip(step.inputs, leaves)}

    def hook(node: Node, args, new):
        return bound.get(id(node))

    return rebuild(step.outputs, hook, graph=bg)
