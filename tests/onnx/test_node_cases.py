"""ONNX's own GRU/LSTM/RNN node tests pass after rewriting, under onnxruntime.

The cases feed W/R/B/P as graph inputs; the adapter needs them constant, so they become
initializers holding the test's values. sequence_lens and initial states stay run-time
inputs. The layout=1 cases run too, although onnxruntime refuses them natively.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from recurrent_lowering.backends.onnx.rewrite import rewrite_model

from . import models
from .cases import node_cases
from .ort_util import assert_close, check_rewritten, run

WEIGHT_POSITIONS = (1, 2, 3, 7)  # W, R, B, P


CASES = node_cases()


def _with_constant_weights(case):
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    (node,) = model.graph.node
    weights = {node.input[i] for i in WEIGHT_POSITIONS if i < len(node.input) and node.input[i]}
    inputs, outputs = case.data_sets[0]
    names = [i.name for i in model.graph.input]
    feeds = {}
    for name, value in zip(names, inputs):
        if name in weights:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        else:
            feeds[name] = np.asarray(value)
    kept = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model, feeds, outputs


def test_cases_were_collected():
    assert len(CASES) >= 12
    assert {"GRU", "LSTM", "RNN"} == {c.model.graph.node[0].op_type for c in CASES.values()}


@pytest.mark.parametrize("emission", ["auto", "loop"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case(name, emission):
    model, feeds, expected = _with_constant_weights(CASES[name])
    rewritten = rewrite_model(model, emission=emission)
    check_rewritten(rewritten)
    ops = {n.op_type for n in rewritten.graph.node}
    if emission == "auto":  # every case has a static T: unrolled
        assert "Scan" not in ops
    got = run(rewritten, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_close(g, e)


@pytest.mark.parametrize(
    "op,lbr,per_step", [("GRU", 1, 10), ("GRU", 0, 9), ("LSTM", 0, 10), ("RNN", 0, 2)]
)
def test_unrolled_nodes_per_step(op, lbr, per_step):
    """Guards the per-step node count onnxruntime pays for (about 0.26 us per node): a Gemm
    per activation group (x_t's block folded in as C), the activations, the elementwise
    ops of the equations and one Split per group of gate slices."""

    def nodes(steps):
        cfg = models.Config(op=op, steps=steps, batch=1, linear_before_reset=lbr, outputs=(1, 1, 0))
        return len(rewrite_model(models.build(cfg)[0], emission="unrolled").graph.node)

    assert nodes(12) - nodes(8) == 4 * per_step
    assert nodes(8) <= 8 * per_step + 12  # per node: projection, splits, Y, Y_h
