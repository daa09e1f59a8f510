"""Writes the ONNX end-to-end model of one recurrent family (a build step of BUILD's e2e_*).

  make_e2e_model.py gru|lstm|rnn OUT.onnx

X [T=4, 1, I=8] -> GRU/LSTM/RNN (H=16) -> Squeeze -> MatMul head -> Z [4, 1, 1], and the
final state Y_h as a second output (models.recurrent_with_head): small, so lowering is quick.
"""

import sys

import onnx

from recurrent_lowering.tests.onnx_ethos_u import e2e_case, models

if __name__ == "__main__":
    family, out = sys.argv[1:]
    onnx.save(models.recurrent_with_head(e2e_case.FAMILIES[family]), out)
