"""Error per timestep as a PNG, so quantization drift over a sequence is visible at a glance."""

from __future__ import annotations

import io

import numpy as np


def plot_error_per_timestep(reference: list, actual: list, title: str) -> bytes | None:
    """Max abs error at each timestep of the first output shaped [B, T, ...] with T > 1."""
    for ref, act in zip(reference, actual):
        ref, act = np.asarray(ref), np.asarray(act).reshape(np.shape(ref))
        if ref.ndim >= 2 and ref.shape[1] > 1:
            break
    else:
        return None
    error = np.abs(ref - act).reshape(ref.shape[0], ref.shape[1], -1).max(axis=(0, 2))
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.plot(np.arange(len(error)), error, marker="o", markersize=3)
    ax.set_xlabel("timestep")
    ax.set_ylabel("max abs error vs fp32")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{title}: error per timestep")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
