"""stream_gru fed its own state for many frames: does quantization error accumulate?

  ./bazelw run //benchmarks:streaming_sqnr -- \
      --target ethos-u55-128 --activations int8 --frames 1000 --out /tmp/stream_gru_u55_int8

Lowers stream_gru fully delegated (our decomposition; h_n shares h0's quantization unless
--noshare_state), calibrated on fp32 closed-loop frames (seed 1), then runs
the dumped .tosa on the TOSA reference model over --frames new frames (seed 2), feeding the
dequantized h_n back as h0, against the fp32 eager module in the same loop. Writes OUT.json
(figures) and OUT.png (state SQNR per frame). For int16 without Vela use TOSA-1.0+INT+int16.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import numpy as np
import torch
from absl import app, flags

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import streaming

FLAGS = flags.FLAGS
flags.DEFINE_string("target", "ethos-u55-128", "Ethos-U or TOSA-1.0+INT[+int16] target")
flags.DEFINE_enum(
    "activations",
    "int8",
    ["auto", "int8", "int16", "int16_state"],
    "activation precision; int16_state: int8 program, the recurrent step in int16 (loop "
    "form); auto: what flow.lower's default chooses per region for the target",
)
flags.DEFINE_bool("share_state", True, "h_n shares h0's quantization parameters")
flags.DEFINE_integer("frames", 1000, "frames in the closed loop")
flags.DEFINE_integer("calibration_frames", 512, "fp32 closed-loop frames to calibrate on")
flags.DEFINE_string("out", None, "write OUT.json and OUT.png", required=True)
flags.DEFINE_list("overlay", [], "JSON files of earlier runs to draw in the same PNG")
flags.DEFINE_bool("plot_only", False, "no lowering: draw the --overlay runs into OUT.png")


def measure(target, activations, share_state, frames, calibration_frames=512, artifact_dir=None):
    """(LoweringResult, ClosedLoop) for stream_gru on `target`."""
    module, inputs = models.build("stream_gru")
    x_shape, h_shape = inputs[0].shape, inputs[1].shape
    h0 = torch.zeros(h_shape)
    calibration = streaming.fp32_states(
        module, streaming.frames(calibration_frames, x_shape, seed=1), h0
    )
    options = Options(target, quantization=activations, share_state=share_state)
    result = flow.lower(
        module,
        inputs,
        options,
        artifact_dir or tempfile.mkdtemp(prefix="stream_sqnr_"),
        calibration_inputs=calibration,
        run_vela=False,
    )
    if result.precision is not None:
        print(f"auto chose: {result.precision.report()}")
    loop = streaming.run_closed_loop(result, module, streaming.frames(frames, x_shape, seed=2), h0)
    return result, loop


def plot(curves: dict, path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, sqnr in curves.items():
        ax.plot(np.arange(1, len(sqnr) + 1), sqnr, linewidth=0.8, label=label)
    ax.axhline(30, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("frame (state fed back)")
    ax.set_ylabel("hidden state SQNR vs fp32 (dB)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _label(figures: dict) -> str:
    sharing = "shared" if figures["share_state"] else "own"
    return f"{figures['target']} {figures['activations']}, {sharing} h0/h_n qparams"


def main(argv) -> int:
    del argv
    caller_directory.enter()
    out = pathlib.Path(FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if FLAGS.plot_only:
        runs = [json.loads(pathlib.Path(p).read_text()) for p in FLAGS.overlay]
        curves = {_label(r): np.array(r["state_sqnr_db"]) for r in runs}
        frames = max(len(c) for c in curves.values())
        plot(curves, out.with_suffix(".png"), f"stream_gru, state fed back for {frames} frames")
        return 0
    result, loop = measure(
        FLAGS.target, FLAGS.activations, FLAGS.share_state, FLAGS.frames, FLAGS.calibration_frames
    )
    figures = {
        "target": FLAGS.target,
        "activations": FLAGS.activations,
        "share_state": FLAGS.share_state,
        "frames": FLAGS.frames,
        "calibration_frames": FLAGS.calibration_frames,
        "min_state_sqnr_db": loop.min_state_sqnr_db,
        "median_state_sqnr_db": float(np.median(loop.state_sqnr_db)),
        "first_100_median_db": float(np.median(loop.state_sqnr_db[:100])),
        "last_100_median_db": float(np.median(loop.state_sqnr_db[-100:])),
        "requantized_state_elements": loop.requantized,
        "state_sqnr_db": [round(float(v), 3) for v in loop.state_sqnr_db],
        "tosa_ops": result.tosa_ops,
        "edge_nodes": result.edge_nodes,
    }
    out.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
    label = _label(figures)
    curves = {label: loop.state_sqnr_db}
    for path in FLAGS.overlay:
        earlier = json.loads(pathlib.Path(path).read_text())
        curves[_label(earlier)] = np.array(earlier["state_sqnr_db"])
    plot(curves, out.with_suffix(".png"), f"stream_gru, state fed back for {FLAGS.frames} frames")
    print(
        f"{FLAGS.target} {label}: min {loop.min_state_sqnr_db:.2f} dB, median "
        f"{figures['median_state_sqnr_db']:.2f} dB over {FLAGS.frames} frames, "
        f"{loop.requantized} requantized state elements"
    )
    return 0


if __name__ == "__main__":
    app.run(main)
