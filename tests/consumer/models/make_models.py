"""Writes the consumer example's small models (run from the repository root):

    PYTHONPATH=<dir with recurrent_lowering> .venv/bin/python tests/consumer/models/make_models.py

kws_gru.onnx: an ONNX GRU (I=8, H=16, T=4, batch 1) with a MatMul head, weights as initializers.
kws_gru.pt2:  the same shape as a torch.export program (nn.GRU + Linear + sigmoid).
"""

import pathlib

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).parent
I, H, T = 8, 16, 4  # noqa: E741 (the equations' names)


def onnx_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array(rng.uniform(-0.3, 0.3, shape).astype(np.float32), name)

    inits = [
        init("W", 1, 3 * H, I),
        init("R", 1, 3 * H, H),
        init("B", 1, 6 * H),
        init("head", H, 1),
    ]
    nodes = [
        helper.make_node("GRU", ["x", "W", "R", "B"], ["y", ""], name="gru", hidden_size=H),
        helper.make_node("Squeeze", ["y", "axes1"], ["y3"], name="squeeze"),
        helper.make_node("MatMul", ["y3", "head"], ["score"], name="head"),
    ]
    inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axes1"))
    graph = helper.make_graph(
        nodes,
        "kws_gru",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, 1, I])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [T, 1, 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


class KwsGru(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(I, H, batch_first=True)
        self.head = torch.nn.Linear(H, 1)

    def forward(self, x):
        y, _ = self.rnn(x)
        return torch.sigmoid(self.head(y))


def torch_program():
    torch.manual_seed(0)
    model = KwsGru().eval()
    return torch.export.export(model, (torch.randn(1, T, I),))


if __name__ == "__main__":
    onnx.save(onnx_model(), str(HERE / "kws_gru.onnx"))
    torch.export.save(torch_program(), str(HERE / "kws_gru.pt2"))
