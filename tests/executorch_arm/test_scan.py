"""The loop form: one `recurrent_lowering::loop` node per layer direction, its step lowered
once by ExecuTorch and copied per timestep into the delegate's TOSA (loop.op, loop.step,
loop.tosa). Checked against torch eager: run through its step programs (loop.op.run_graph),
on the TOSA reference model (FP and INT), and through Vela for Ethos-U55."""

import re

import numpy as np
import pytest
import torch
import tosa_serializer as ts

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.emission import decompose
from recurrent_lowering.backends.executorch_arm.loop import op as loop_op
from recurrent_lowering.backends.executorch_arm.loop.step import StepTemplate
from recurrent_lowering.backends.executorch_arm.loop.tosa_template import TosaTemplate
from recurrent_lowering.examples import models
from recurrent_lowering.passes.spec import SpecError
from recurrent_lowering.runtime import arm_numerics, tosa_flatbuffer, tosa_reference
from recurrent_lowering.tests.executorch_arm.sequence_output import SequenceOutput


def _small(kind, layers=1, bidirectional=False, T=5):
    torch.manual_seed(0)
    module = models.RNNHead(kind, 6, 8, layers, bidirectional).eval()
    return module, (torch.randn(1, T, 6),)


def _calls(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(
    "kind,layers,bidirectional",
    [("gru", 1, False), ("lstm", 1, False), ("rnn_tanh", 2, False), ("gru", 2, True)],
)
def test_scan_matches_torch_and_unrolled(kind, layers, bidirectional):
    module, inputs = _small(kind, layers, bidirectional)
    ep = torch.export.export(module, inputs)
    looped = decompose.decompose_recurrent(ep, "loop")
    unrolled = decompose.decompose_recurrent(torch.export.export(module, inputs), "unrolled")
    loops = [n for n in _calls(looped) if n.target is loop_op.OP]
    assert len(loops) == layers * (2 if bidirectional else 1)
    assert len(_calls(looped)) < len(_calls(unrolled))
    with torch.no_grad():
        expected = module(*inputs)
        got = loop_op.run_graph(looped.module(), *inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_loop_node_runs_only_through_its_program():
    module, inputs = _small("gru", T=5)
    looped = decompose.decompose_recurrent(torch.export.export(module, inputs), "loop")
    with pytest.raises(RuntimeError, match="runs through its step program"):
        looped.module()(*inputs)
    (node,) = [n for n in _calls(looped) if n.target is loop_op.OP]
    node.meta["custom"].pop(loop_op.META_KEY)
    with pytest.raises(ValueError, match="without its step program"):
        loop_op.program_of(node)


def _two_copies(template: TosaTemplate) -> bytes:
    """Two independent copies of `template` side by side, sharing constants."""
    graph = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
    (i,), (o,) = template.inputs, template.outputs
    block = graph.currRegion.currBasicBlock
    written = set()
    for k in range(2):
        graph.addInputTensor(ts.TosaSerializerTensor(f"x{k}", list(i.shape), i.dtype, data=None))
        block.addTensor(f"y{k}", list(o.shape), o.dtype)
        template.instantiate(graph, f"c{k}_", [f"x{k}"], [f"y{k}"], "const_", written)
    for k in range(2):
        graph.addOutputTensor(block.getTensorByName(f"y{k}"))
    return graph.serialize()


def _with_tail_copies(template: TosaTemplate, k: int, count: int) -> bytes:
    """`template` once, its output k also written by `count` copies of its tail."""
    graph = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
    block = graph.currRegion.currBasicBlock
    for i, t in enumerate(template.inputs):
        graph.addInputTensor(ts.TosaSerializerTensor(f"in{i}", list(t.shape), t.dtype, data=None))
    outs = [f"out{i}" for i in range(len(template.outputs))]
    copies = [f"copy{j}" for j in range(count)]
    spec = template.outputs[k]
    for i, t in enumerate(template.outputs):
        block.addTensor(outs[i], list(t.shape), t.dtype)
    for name in copies:
        block.addTensor(name, list(spec.shape), spec.dtype)
    inputs = [f"in{i}" for i in range(len(template.inputs))]
    template.instantiate(graph, "s_", inputs, outs, "const_", set(), copies={k: copies})
    for name in outs + copies:
        graph.addOutputTensor(block.getTensorByName(name))
    return graph.serialize()


@pytest.mark.parametrize("weight_bits", [8, 4])  # 4: INT4 constants, two to a byte
def test_template_copies_are_bit_exact(weight_bits, tmp_path):
    module, inputs = _small("gru", T=3)
    target = "TOSA-1.0+INT" + ("+int4" if weight_bits == 4 else "")
    result = flow.lower(
        module, inputs, target, tmp_path, emission="loop", recurrent_weight_bits=weight_bits
    )
    source = result.tosa_files[0].read_bytes()
    types = {t.tosa_dtype for t in tosa_flatbuffer.op_inputs(source, "CONV2D", 1)}
    assert types == ({"INT8", "INT4"} if weight_bits == 4 else {"INT8"})
    template = TosaTemplate(source)
    copies = _two_copies(template)
    counts, source_counts = tosa_flatbuffer.op_counts(copies), tosa_flatbuffer.op_counts(source)
    for op in ("CONST", "CONST_SHAPE"):  # constants are written once, shared by both copies
        assert counts[op] == source_counts[op]
    for op, n in source_counts.items():
        if op not in ("CONST", "CONST_SHAPE"):
            assert counts[op] == 2 * n
    (info,), _ = tosa_flatbuffer.graph_io(source)
    rng = np.random.default_rng(0)
    xs = [rng.integers(-128, 128, size=info.shape).astype(np.int8) for _ in range(2)]
    together = tosa_reference.run(copies, xs)
    for x, y in zip(xs, together):
        np.testing.assert_array_equal(tosa_reference.run(source, [x])[0], y)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_scan_fp_tosa_matches_torch(kind, tmp_path):
    module, inputs = _small(kind, layers=1, bidirectional=True, T=6)
    result = flow.lower(module, inputs, "TOSA-1.0+FP", artifact_dir=tmp_path, emission="loop")
    assert result.num_delegates == 1 and result.cpu_nodes == 0
    assert arm_numerics.check(result, module, inputs).max_abs_err <= 1e-5


def test_scan_int_tosa_shares_one_state_quantization(tmp_path):
    module, inputs = _small("gru", T=6)
    result = flow.lower(module, inputs, "TOSA-1.0+INT", artifact_dir=tmp_path, emission="loop")
    assert result.num_delegates == 1
    (program,) = result.loop_programs
    assert program.quant_config is not None
    (template,) = [t for t in program.templates.values() if isinstance(t, StepTemplate)]
    h_in = template.input_quant[template.input_roles.index(0)]
    h_out = template.output_quant[template.output_roles.index(0)]
    assert h_in == h_out  # step t's output feeds step t+1 with no requantization
    # the step ran once through ExecuTorch and was copied per step: T - 1 looped steps
    # (the first, from a zero state, is peeled into ordinary ops), each with its TABLEs
    step_tables = sum(1 for op in template.tosa.operators if op.op == ts.Op.TABLE)
    assert step_tables > 0 and result.tosa_op_counts["TABLE"] >= 5 * step_tables
    # h' comes from a short elementwise tail (loop.tosa writes copies of it for h's readers
    # that Vela would otherwise copy): the copies compute the same integers
    k = template.output_roles.index(0)
    tail = [template.tosa.operators[i].op for i in template.tosa.tail(k)]
    assert 0 < len(tail) <= 8 and ts.Op.MATMUL not in tail, tail
    source = _with_tail_copies(template.tosa, k, 2)
    rng = np.random.default_rng(0)
    ins, _ = tosa_flatbuffer.graph_io(source)
    feeds = [rng.integers(-128, 128, size=i.shape).astype(np.int8) for i in ins]
    outs = tosa_reference.run(source, feeds)
    for copy in outs[-2:]:
        np.testing.assert_array_equal(copy, outs[k])
    assert arm_numerics.check(result, module, inputs).sqnr_db > 30


def test_scan_ethos_u55(tmp_path):
    module, inputs = models.build("tiny_gru")
    result = flow.lower(module, inputs, "ethos-u55-128", artifact_dir=tmp_path, emission="loop")
    assert result.num_delegates == 1
    assert b"vela_bin_stream" in result.pte
    assert all(op.target == "NPU" for op in result.vela.ops)
    assert result.executorch_vela.cycles == result.vela.summary.cycles
    assert arm_numerics.check(result, module, inputs).sqnr_db > 35


def test_int16_state_in_an_int8_program(tmp_path):
    torch.manual_seed(0)
    # Y as the output: no head whose int8 output would hide the state's error
    module = SequenceOutput(torch.nn.GRU(8, 32, batch_first=True)).eval()
    inputs = (torch.randn(1, 12, 8),)
    sqnr = {}
    for bits in (8, 16):
        result = flow.lower(
            module,
            inputs,
            "TOSA-1.0+INT+int16",
            artifact_dir=tmp_path / str(bits),
            emission="loop",
            quantization="int16_state" if bits == 16 else "int8",
        )
        (info,), _ = tosa_flatbuffer.graph_io(result.tosa_files[0])
        assert info.tosa_dtype == "INT8"  # the program's input stays int8 either way
        sqnr[bits] = arm_numerics.check(result, module, inputs).sqnr_db
    assert sqnr[16] > sqnr[8] + 3  # measured: 34.6 -> 38.3 dB


def test_scan_relu_state_takes_its_quantization_from_the_add(tmp_path):
    """A relu keeps its input's qparams (TOSA: a CLAMP, no rescale), so the step's state
    output shares the input state's qparams through the add before it; shared at the relu
    itself, every step after the first came out shifted (SQNR -0.6 dB; unrolled 41.6)."""
    torch.manual_seed(0)
    module = SequenceOutput(torch.nn.RNN(4, 8, nonlinearity="relu", batch_first=True)).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.2, 0.2)
    inputs = (torch.randn(1, 9, 4),)
    result = flow.lower(module, inputs, "TOSA-1.0+INT", tmp_path, emission="loop")
    assert arm_numerics.check(result, module, inputs).sqnr_db > 38  # measured 42.9


class _GruWithState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(4, 8, batch_first=True)

    def forward(self, x, h0):
        return self.rnn(x, h0)


@pytest.mark.parametrize("T", [1, 9])
def test_scan_keeps_an_initial_state_beyond_the_output_range(T, tmp_path):
    """A user's h0 may reach beyond the range of every h the layer computes (Y's): the step
    then keeps its own h scale instead of Y's, which would clip h0 (T=1: 9.6 dB before)."""
    torch.manual_seed(0)
    module = _GruWithState().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.2, 0.2)
    inputs = (torch.randn(1, T, 4), torch.randn(1, 1, 8) * 0.5)
    result = flow.lower(module, inputs, "TOSA-1.0+INT", tmp_path, emission="loop")
    assert arm_numerics.check(result, module, inputs).sqnr_db > 32  # measured 37.3, 35.0


def test_auto_unrolls_an_lstm_with_proj_size():
    """The loop form carries h and c of one shape; `auto` unrolls what it cannot write."""
    lstm = torch.nn.LSTM(4, 8, proj_size=3, batch_first=True)
    refused = r"^lstm: attribute 'emission': the loop form cannot take proj_size"
    with pytest.raises(SpecError, match=refused):
        decompose.decompose_recurrent(torch.export.export(lstm, (torch.randn(1, 12, 4),)), "loop")
    ep = decompose.decompose_recurrent(torch.export.export(lstm, (torch.randn(1, 12, 4),)), "auto")
    assert not [n for n in _calls(ep) if n.target is loop_op.OP]
    with torch.no_grad():
        x = torch.randn(1, 12, 4)
        torch.testing.assert_close(ep.module()(x), lstm(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind,layers,bidirectional", [("gru", 2, True), ("lstm", 1, False)])
def test_scan_boundaries_and_copies_on_ethos_u85(kind, layers, bidirectional, tmp_path):
    """Vela copies a value with several readers when one of them is a RESHAPE or a CONCAT,
    and copies a column slice: each looped step's h reaches Y and the next step's MATMUL
    through copies of its last fused op (scan_tosa), each direction has its own projection
    (no column slice), and the step takes the projection's and Y's scales (no RESCALE of
    the projection at the scan's boundary). What is left are the peeled first steps' h
    (read by Y and by step 1) and the head's concat of the two directions. Every TABLE in
    the loop is chained into the op before it (LSTM's tanh(c') reads its own copy of c')."""
    module, inputs = _small(kind, layers=layers, bidirectional=bidirectional, T=6)
    result = flow.lower(module, inputs, "ethos-u85-256", artifact_dir=tmp_path, emission="loop")
    assert result.num_delegates == 1
    ops = result.vela.ops
    in_loop = [op for op in ops if re.search(r"_t\d+_", op.name)]
    looped = [op.name for op in in_loop if op.npu_op == "MemoryCopy"]
    assert looped == []
    assert [op.name for op in in_loop if op.npu_op == "LUT" and op.cycles > 0] == []
    copies = [op for op in ops if op.npu_op == "MemoryCopy"]
    # per peeled step a reshape copy and a concat row; 2 + 2 concat parts between the
    # layers and before the head
    assert len(copies) <= 2 * layers * (1 + bidirectional) + 4 * bidirectional, [
        (op.original_op, op.name) for op in copies
    ]
    assert not any(op.original_op == "Slice" for op in copies)
    graph = ts.TosaSerializer("")
    assert graph.loadTosaFlatbuffer(str(result.tosa_files[0]))
    block = graph.regions[0].basicBlocks[0]
    shapes = {n: tuple(block.getTensorByName(n).shape) for n in block.tensors.keys()}
    projections = [(6, 24), (6, 32)]  # [T*B, G] requantized whole: the boundary rescale
    boundary = [
        op
        for op in block.operators
        if op.op == ts.Op.RESCALE and shapes.get(list(op.inputs)[0]) in projections
    ]
    assert boundary == []
    assert arm_numerics.check(result, module, inputs).sqnr_db > 30


class _Classifier(torch.nn.Module):
    """The keyword-spotting shape: a head on h_n, the output sequence unread."""

    def __init__(self, kind):
        super().__init__()
        self.rnn = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[kind](6, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        state = self.rnn(x)[1]
        h = state[0] if isinstance(state, tuple) else state
        return self.head(h[-1])


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_scan_with_only_the_final_state_read(kind, tmp_path):
    """auto picks the loop form from 9 steps on; a layer whose Y nobody reads was refused
    there ('the loop form needs each step's output to be its h')."""
    torch.manual_seed(0)
    module, inputs = _Classifier(kind).eval(), (torch.randn(1, 12, 6),)
    looped = decompose.decompose_recurrent(torch.export.export(module, inputs), "loop")
    assert [n.target for n in _calls(looped)].count(loop_op.OP) == 1
    with torch.no_grad():
        got = loop_op.run_graph(looped.module(), *inputs)
        torch.testing.assert_close(got, module(*inputs), atol=1e-5, rtol=0)
    result = flow.lower(module, inputs, "TOSA-1.0+INT", tmp_path, emission="auto")
    assert result.num_delegates == 1 and result.cpu_nodes <= 2
    assert arm_numerics.check(result, module, inputs).sqnr_db > 30
