"""A single-step (streaming) recurrent program run frame by frame, its state fed back.

The delegated graph (the dumped .tosa of a fully delegated lowering) runs on the TOSA reference
model; each frame's h_n output is dequantized and fed back as the next frame's h0 input, where
it is quantized again, exactly as a host application would do with the .pte's float I/O. The
fp32 reference runs the eager module in the same closed loop. The per-frame SQNR of the state
shows whether quantization error accumulates across frames.

`requantized` counts state elements whose integer value changed on the way round
(quantize(dequantize(q)) != q): zero when h0 and h_n share quantization parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import torch

from . import tosa_reference
from .arm_numerics import NumericsError
from .metrics import sqnr_db


@dataclasses.dataclass
class ClosedLoop:
    """Per-frame figures of a closed-loop run (index t = state after frame t)."""

    state_sqnr_db: np.ndarray  # SQNR of the fed-back state vs the fp32 closed loop
    output_sqnr_db: np.ndarray  # SQNR of the other outputs (e.g. a score) per frame
    requantized: int  # state elements whose integers changed when fed back

    @property
    def min_state_sqnr_db(self) -> float:
        return float(np.min(self.state_sqnr_db))


def frames(num: int, input_shape: Sequence[int], seed: int) -> list[torch.Tensor]:
    """`num` input frames drawn N(0, 1) from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*input_shape, generator=generator) for _ in range(num)]


def fp32_states(module: torch.nn.Module, xs: Sequence[torch.Tensor], h0: torch.Tensor) -> list:
    """[(x_t, h_t)] of the fp32 closed loop: the states each frame starts from."""
    samples, h = [], h0
    with torch.no_grad():
        for x in xs:
            samples.append((x, h))
            h = module(x, h)[1]
    return samples


def run_closed_loop(
    result,
    module: torch.nn.Module,
    xs: Sequence[torch.Tensor],
    h0: torch.Tensor,
    state_input: int = 1,
    state_output: int = 1,
) -> ClosedLoop:
    """Run `result`'s delegate over the frames `xs`, feeding program output `state_output`
    back into program input `state_input` (`result`: a flow.LoweringResult), against the
    eager fp32 module in the same loop."""
    if result.num_delegates != 1 or result.input_map is None or len(result.tosa_files) != 1:
        raise NumericsError("closed loop needs a single delegate fed by the program inputs")
    tosa = result.tosa_files[0]
    in_slot = result.input_map.index(state_input)
    state_in_q = result.input_quant[in_slot]
    state_out_q = result.output_quant[result.output_map[state_output]]
    state_sqnr, output_sqnr, requantized = [], [], 0
    h_ref = h0
    h_q = h0.detach().numpy()
    for x in xs:
        with torch.no_grad():
            ref = [t.numpy() for t in module(x, h_ref)]
        program_in = [x.numpy(), h_q] if state_input == 1 else [h_q, x.numpy()]
        out = tosa_reference.run(
            tosa,
            [program_in[i] for i in result.input_map],
            input_quant=result.input_quant,
            output_quant=result.output_quant,
        )
        outputs = [np.asarray(out[j], dtype=np.float32) for j in result.output_map]
        h_q = outputs[state_output].reshape(h0.shape)
        if state_in_q is not None and state_out_q is not None:
            q_out = state_out_q.quantize(h_q)  # exact: h_q is a dequantized integer
            requantized += int(np.count_nonzero(state_in_q.quantize(h_q) != q_out))
        h_ref = torch.from_numpy(ref[state_output])
        state_sqnr.append(sqnr_db(ref[state_output], h_q))
        others = [i for i in range(len(ref)) if i != state_output]
        output_sqnr.append(
            sqnr_db(
                np.concatenate([ref[i].ravel() for i in others]),
                np.concatenate([outputs[i].ravel() for i in others]),
            )
        )
    return ClosedLoop(np.array(state_sqnr), np.array(output_sqnr), requantized)
