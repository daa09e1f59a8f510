"""How a lowered edge program's inputs and outputs reach its delegate: the mapping and the
quantization at the boundary. Shared by the flow (one delegate per program) and the loop
form (one per step); imports nothing of this package."""

from __future__ import annotations

from typing import Optional

from recurrent_lowering.runtime.quantization import QuantParams

QUANTIZE = "quantized_decomposed.quantize_per_tensor"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor"


def target_name(node) -> str:
    return str(getattr(node.target, "__name__", node.target))


def quant_params(node) -> QuantParams:
    _, scale, zero_point, qmin, qmax, dtype = node.args[:6]
    return QuantParams(float(scale), int(zero_point), int(qmin), int(qmax), str(dtype)[6:])


def io_mapping(graph, user_inputs: list) -> Optional[tuple]:
    """(input_map, output_map, input_quant, output_quant) for a single fully-delegated graph:
    delegate input k <- program input index, program output i <- delegate output index,
    and the QuantParams (or None) at each; None when the graph is not one delegate fed by
    the program inputs."""
    delegates = [
        n for n in graph.nodes if n.op == "call_function" and "call_delegate" in target_name(n)
    ]
    if len(delegates) != 1:
        return None
    (delegate,) = delegates
    input_map, input_quant = [], []
    for arg in delegate.args[1:]:
        quant = None
        if arg.op == "call_function" and QUANTIZE in target_name(arg):
            quant, arg = quant_params(arg), arg.args[0]
        if arg.op != "placeholder" or arg.name not in user_inputs:
            return None  # a CPU op or a parameter between the program inputs and the delegate
        input_map.append(user_inputs.index(arg.name))
        input_quant.append(quant)
    num_outputs = max((u.args[1] for u in delegate.users if u.op == "call_function"), default=-1)
    output_quant = [None] * (num_outputs + 1)
    output_map = []
    for out in graph.output_node().args[0]:
        quant = None
        if out.op == "call_function" and DEQUANTIZE in target_name(out):
            quant, out = quant_params(out), out.args[0]
        if not (out.op == "call_function" and out.args[0] is delegate):
            return None  # an output computed on the CPU
        output_map.append(out.args[1])
        output_quant[out.args[1]] = quant
    return input_map, output_map, input_quant, output_quant
