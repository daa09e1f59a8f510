"""Speech for the real-model benchmarks, fetched at set-up and never committed.

- `recordings`: the eight voice recordings Debian's alsa-utils ships
  (usr/share/sounds/alsa/*.wav: "front left", "rear center", ...; 48 kHz, about 1.4 s each),
  extracted from the package `apt-get download` fetches into the cache; and its Noise.wav.
- `synthesized`: sentences espeak-ng speaks (Debian's espeak-ng, installed with apt-get when
  missing): another voice, for calibration, held apart from the recordings the numerics
  check measures on.
- `stream`: utterances in a row with silences between them and noise under them, as a
  voice-activity detector or an enhancer meets them.

Everything is 16 kHz float32 mono in [-1, 1].
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile

import numpy as np

SR = 16000
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags, and we will go meet her.",
    "Wednesday at the train station.",
)


def _resampled(path: str) -> np.ndarray:
    from scipy.io import wavfile
    from scipy.signal import resample_poly

    rate, data = wavfile.read(path)
    x = data.astype(np.float32) / 32768.0
    if x.ndim > 1:
        x = x.mean(axis=1)
    g = np.gcd(rate, SR)
    return resample_poly(x, SR // g, rate // g).astype(np.float32)


def _alsa_sounds(cache: str) -> str:
    """The directory of alsa-utils' sounds, the package fetched and unpacked into `cache`."""
    target = os.path.join(cache, "alsa-utils")
    sounds = os.path.join(target, "usr", "share", "sounds", "alsa")
    if not os.path.isdir(sounds):
        os.makedirs(target, exist_ok=True)
        subprocess.run(["apt-get", "download", "alsa-utils"], cwd=target, check=True)
        (deb,) = glob.glob(os.path.join(target, "alsa-utils_*.deb"))
        subprocess.run(["dpkg-deb", "-x", deb, target], check=True)
    return sounds


def recordings(cache: str) -> list[np.ndarray]:
    """The eight voice recordings of alsa-utils, in name order."""
    sounds = _alsa_sounds(cache)
    names = sorted(p for p in glob.glob(os.path.join(sounds, "*.wav")) if "Noise" not in p)
    return [_resampled(p) for p in names]


def noise(cache: str) -> np.ndarray:
    return _resampled(os.path.join(_alsa_sounds(cache), "Noise.wav"))


def synthesized(cache: str) -> list[np.ndarray]:
    """SENTENCES as espeak-ng speaks them (installed with apt-get when missing)."""
    if shutil.which("espeak-ng") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "espeak-ng"], check=True)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, sentence in enumerate(SENTENCES):
            path = os.path.join(tmp, f"{k}.wav")
            subprocess.run(["espeak-ng", "-v", "en", "-s", "150", "-w", path, sentence], check=True)
            out.append(_resampled(path))
    return out


def stream(
    utterances: list[np.ndarray],
    noise_signal: np.ndarray,
    snr_db: float = 20.0,
    gap_s: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """The utterances in a row, each at a peak of about 0.5, `gap_s` of silence before each
    and after the last, and `noise_signal` looped under all of it at `snr_db` below the
    speech's mean power."""
    rng = np.random.default_rng(seed)
    gap = np.zeros(int(gap_s * SR), np.float32)
    parts = [gap]
    for u in utterances:
        parts += [0.5 * u / max(float(np.abs(u).max()), 1e-6), gap]
    speech = np.concatenate(parts)
    voiced = np.concatenate([0.5 * u / max(float(np.abs(u).max()), 1e-6) for u in utterances])
    start = int(rng.integers(len(noise_signal)))
    reps = -(-(len(speech) + start) // len(noise_signal))
    bed = np.tile(noise_signal, reps)[start : start + len(speech)]
    gain = np.sqrt(np.mean(voiced**2) / max(np.mean(bed**2), 1e-12) / 10 ** (snr_db / 10))
    return (speech + gain * bed).astype(np.float32)
