"""RecurrentTOSAPartitioner: to_edge_transform_and_lower on a program that still holds
aten.gru decomposes it with our core (transform_for_pre_decomposition), not torch's."""

import torch
from executorch.backends.arm.tosa import TosaSpecification
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from torch import nn

from recurrent_lowering.backends.executorch_arm.emission.decompose import decompose_recurrent
from recurrent_lowering.backends.executorch_arm.partition import partitioner
from recurrent_lowering.backends.executorch_arm.plan import ArmPlan


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(2, 3, batch_first=True)
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def edge_graph(ep):
    spec = TosaCompileSpec(TosaSpecification.create_from_string("TOSA-1.0+FP"))
    edge = to_edge_transform_and_lower(
        ep,
        partitioner=[partitioner.create(spec, ArmPlan("TOSA-1.0+FP", quantize=False))],
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    gm = edge.exported_program().graph_module
    lowered = [m for name, m in gm.named_children() if name.startswith("lowered_module")]
    cpu = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and "delegate" not in str(n.target)
        and "getitem" not in str(n.target)
    ]
    return lowered, cpu


def test_partitioner_hook_uses_our_decomposition():
    torch.manual_seed(0)
    model, x = Tiny().eval(), torch.randn(1, 3, 2)
    ep = torch.export.export(model, (x,))
    hooked, cpu = edge_graph(ep)
    assert len(hooked) == 1 and not cpu  # one delegate, nothing left on the CPU
    ops = [n.target for m in hooked for n in m.original_module.graph.nodes]
    assert not any("gru" in str(op) for op in ops)
    # FP keeps aten.linear whole: the delegate has exactly the linears of our decomposition
    # (hoisted input projection + one per step after the first + head), where torch's own
    # GRU decomposition has two per step.
    ours = decompose_recurrent(ep).graph.find_nodes(
        op="call_function", target=torch.ops.aten.linear.default
    )
    linears = [op for op in ops if "linear" in str(op)]
    assert len(linears) == len(ours) < 2 * x.shape[1] + 1


def test_a_loop_left_outside_a_delegate_is_refused():
    """The partitioner sees the edge dialect's loop op, not the torch op: the check that
    refuses an undelegated loop has to recognise both."""
    import pytest
    from executorch.exir.dialects._ops import ops as exir_ops

    from recurrent_lowering.backends.executorch_arm.loop import op as loop_op
    from recurrent_lowering.passes.spec import SpecError

    for target in (loop_op.OP, exir_ops.edge.recurrent_lowering.loop.default):
        graph = torch.fx.Graph()
        xs, h = graph.placeholder("xs"), graph.placeholder("h")
        node = graph.call_function(target, (xs, h, None, 0, 4, False, False, False))
        graph.output(node)
        assert loop_op.is_loop(node)
        with pytest.raises(SpecError, match="not delegated"):
            partitioner._check_loops_delegated(graph)
        node.meta["delegation_tag"] = "tag0"
        partitioner._check_loops_delegated(graph)  # delegated: accepted


class _GruAttention(nn.Module):
    """A GRU's output read by dot-product attention, whose int16 matmuls Ethos-U55 leaves on
    the CPU: the softmax's delegate also handed y on, expanded and viewed to its own shape,
    to the second matmul, an output that ExecuTorch's passes made one of its inputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.q = nn.Linear(16, 16)

    def forward(self, x):
        y, _ = self.gru(x)
        return torch.softmax(self.q(y) @ y.transpose(1, 2) / 4.0, -1) @ y


def test_a_delegate_passing_an_input_on_unchanged_leaves_it_on_the_cpu(tmp_path):
    """Vela refused that delegate ("Output tensor getitem does not have any writers"); the
    moves stay on the CPU (cpu_reasons.PASS_THROUGH) and the program matches torch."""
    from recurrent_lowering.backends.executorch_arm import flow
    from recurrent_lowering.backends.executorch_arm.partition import cpu_reasons
    from recurrent_lowering.backends.executorch_arm.precision import accuracy
    from recurrent_lowering.runtime.metrics import sqnr_per_output

    module = _GruAttention().eval()
    generator = torch.Generator().manual_seed(1)
    samples = [(torch.randn(1, 12, 8, generator=generator),) for _ in range(4)]
    result = flow.lower(
        module,
        samples[0],
        "ethos-u55-128",
        tmp_path,
        quantization="int16",
        calibration_inputs=samples[:3],
    )
    assert result.cpu_reasons[cpu_reasons.PASS_THROUGH] > 0
    held_out = accuracy.Evaluation(samples[3:])
    want = accuracy.outputs(accuracy.of_module(module), held_out)
    got = accuracy.outputs(accuracy.of_lowered(result), held_out)
    assert min(sqnr_per_output(want, got)) > 35
