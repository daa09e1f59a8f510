"""PT2E annotation of `recurrent_lowering::loop` nodes for ExecuTorch's Arm quantizer.

The Arm quantizer does not know the loop op, so the quantizer hook annotates it after the Arm
annotators ran: the projected inputs and the initial states are observed as inputs and the
result (every step's h, then c_n) as one output, with the layer's activation config. The
node is marked quantized the way the Arm quantizer marks its own, so ExecuTorch folds the
q/dq pairs around it into the node's `input_qparams` / `output_qparams`, where loop.tosa
reads them. The config is also kept on the step program: the step is quantized with it.
"""

from __future__ import annotations

from executorch.backends.arm.common.annotation_meta import ArmAnnotationInfo
from torch.fx import Graph, Node
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation

from . import op as loop_op

_Q_KEY = "quantization_annotation"


def annotate_loops(graph: Graph, config, step_config=None, weight_parts: int = 1) -> int:
    """Annotate every loop node with `config` (an Arm QuantizationConfig); returns how many.
    `step_config` quantizes the step itself differently (e.g. int16 activations: the state
    and the gate arithmetic in int16 while the layer's inputs and outputs stay int8);
    `weight_parts` 2 splits the step's weights (quantization.weight_parts)."""
    if config is None:
        return 0
    count = 0
    for node in graph.find_nodes(op="call_function", target=loop_op.OP):
        xs, h, c = node.args[:3]
        inputs = {a: config.get_input_act_qspec() for a in (xs, h, c) if isinstance(a, Node)}
        node.meta[_Q_KEY] = QuantizationAnnotation(
            input_qspec_map=inputs, output_qspec=config.get_output_act_qspec(), _annotated=True
        )
        custom = node.meta.get("custom", {})
        custom[ArmAnnotationInfo.CUSTOM_META_KEY] = dict(ArmAnnotationInfo(quantized=True))
        node.meta["custom"] = custom
        program = loop_op.program_of(node)
        program.quant_config, program.step_config = config, step_config
        program.weight_parts = weight_parts
        count += 1
    return count
