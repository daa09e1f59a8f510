"""Compile a TOSA flatbuffer with Vela and read its performance estimates.

Vela's cycle estimates are our Ethos-U figure of merit when no FVP is at hand. `run_vela` calls
Vela the way ExecuTorch's EthosUCompileSpec does (same accelerator, system config, memory mode and
vela.ini defaults, raw output) plus `--verbose-performance`, then parses the two CSV files Vela
writes into its output directory: `<stem>_summary_<system-config>.csv` (whole network) and
`<stem>_per-layer.csv` (one row per NPU operator).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

from . import tosa_flatbuffer

# (system config, memory mode) ExecuTorch 1.5.1's EthosUCompileSpec uses when none is given
# (executorch/backends/arm/ethosu/compile_spec.py); a test pins this table against it.
DEFAULT_CONFIGS = {
    "ethos-u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
    "ethos-u65": ("Ethos_U65_High_End", "Dedicated_Sram_384KB"),
    "ethos-u85": ("Ethos_U85_SYS_DRAM_Mid", "Sram_Only"),
}
DEFAULT_CONFIG_INI = "Arm/vela.ini"  # resolved by Vela inside its own config_files directory


class VelaError(RuntimeError):
    """Vela failed or wrote no performance summary."""


def default_config(accelerator: str) -> tuple[str, str]:
    """(system_config, memory_mode) ExecuTorch uses for `accelerator`, e.g. "ethos-u55-128"."""
    family = accelerator.lower().rsplit("-", 1)[0]
    if family not in DEFAULT_CONFIGS:
        raise ValueError(f"unknown Ethos-U accelerator {accelerator!r}")
    return DEFAULT_CONFIGS[family]


def config_names() -> tuple[list[str], list[str]]:
    """(system configs, memory modes) that Vela's default vela.ini defines."""
    import configparser

    import ethosu

    ini = configparser.ConfigParser()
    package = pathlib.Path(list(ethosu.__path__)[0])  # a namespace package: no __file__
    ini.read(package / "config_files" / DEFAULT_CONFIG_INI)
    names: dict[str, list[str]] = {"System_Config": [], "Memory_Mode": []}
    for section in ini.sections():
        kind, _, name = section.partition(".")
        if kind in names:
            names[kind].append(name)
    return names["System_Config"], names["Memory_Mode"]


def macs_per_cycle(accelerator: str) -> int:
    """int8 MACs per cycle of an accelerator config: the number after its last dash."""
    return int(accelerator.rsplit("-", 1)[1])


def _f(row: dict, key: str, default: float = 0.0) -> float:
    value = row.get(key, "")
    return float(value) if value not in ("", None) else default


@dataclasses.dataclass(frozen=True)
class VelaSummary:
    """Whole-network figures from Vela's summary CSV (bytes, seconds, cycles)."""

    accelerator: str
    system_config: str
    memory_mode: str
    core_clock_hz: float
    cycles: int  # cycles_total: the estimate we report
    cycles_npu: int
    inference_time_s: float
    nn_macs: int
    sram_used_bytes: int
    dram_used_bytes: int
    on_chip_flash_used_bytes: int
    off_chip_flash_used_bytes: int
    sram_traffic_bytes: float
    dram_traffic_bytes: float
    off_chip_flash_traffic_bytes: float
    cycles_by_kind: dict  # cycles_npu, cycles_sram_access, ... as Vela names them
    raw: dict  # every CSV column as text

    @property
    def mac_utilisation(self) -> Optional[float]:
        """MACs / (cycles * MACs per cycle), as a fraction; None when cycles or config unknown."""
        try:
            peak = macs_per_cycle(self.accelerator.lower().replace("_", "-"))
        except (IndexError, ValueError):
            return None
        return self.nn_macs / (self.cycles * peak) if self.cycles else None


@dataclasses.dataclass(frozen=True)
class VelaOpPerf:
    """One row of Vela's per-layer table."""

    original_op: str
    npu_op: str
    target: str
    cycles: int
    mac_count: int
    mac_util_percent: float
    name: str
    raw: dict


@dataclasses.dataclass(frozen=True)
class VelaResult:
    summary: VelaSummary
    ops: list  # list[VelaOpPerf]; empty when Vela wrote no per-layer table
    output_dir: pathlib.Path
    log: str


def parse_summary_csv(path: "str | os.PathLike") -> VelaSummary:
    """Parse Vela's `<stem>_summary_<system-config>.csv` (one header row, one data row)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 1:
        raise VelaError(f"{path}: expected one data row in Vela summary, found {len(rows)}")
    row = rows[0]
    missing = {"cycles_total", "inference_time", "sram_memory_used"} - row.keys()
    if missing:
        raise VelaError(f"{path}: not a Vela summary CSV (missing {sorted(missing)})")
    kib = 1024.0
    return VelaSummary(
        accelerator=row.get("accelerator_configuration", ""),
        system_config=row.get("system_config", ""),
        memory_mode=row.get("memory_mode", ""),
        core_clock_hz=_f(row, "core_clock"),
        cycles=int(round(_f(row, "cycles_total"))),
        cycles_npu=int(round(_f(row, "cycles_npu"))),
        inference_time_s=_f(row, "inference_time"),
        nn_macs=int(round(_f(row, "nn_macs"))),
        sram_used_bytes=int(round(_f(row, "sram_memory_used") * kib)),
        dram_used_bytes=int(round(_f(row, "dram_memory_used") * kib)),
        on_chip_flash_used_bytes=int(round(_f(row, "on_chip_flash_memory_used") * kib)),
        off_chip_flash_used_bytes=int(round(_f(row, "off_chip_flash_memory_used") * kib)),
        sram_traffic_bytes=_f(row, "sram_total_bytes"),
        dram_traffic_bytes=_f(row, "dram_total_bytes"),
        off_chip_flash_traffic_bytes=_f(row, "off_chip_flash_total_bytes"),
        cycles_by_kind={k: _f(row, k) for k in row if k.startswith("cycles_")},
        raw=dict(row),
    )


def parse_per_layer_csv(path: "str | os.PathLike") -> list[VelaOpPerf]:
    """Parse Vela's `<stem>_per-layer.csv` (written with --verbose-performance)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        VelaOpPerf(
            original_op=r.get("Original Operator", ""),
            npu_op=r.get("NNG Operator", ""),
            target=r.get("Target", ""),
            cycles=int(round(_f(r, "Op Cycles"))),
            mac_count=int(round(_f(r, "MAC Count"))),
            mac_util_percent=_f(r, "Util% (MAC)"),
            name=r.get("Name", ""),
            raw=dict(r),
        )
        for r in rows
    ]


def vela_args(
    tosa_path: "str | os.PathLike",
    output_dir: "str | os.PathLike",
    accelerator: str = "ethos-u55-128",
    system_config: Optional[str] = None,
    memory_mode: Optional[str] = None,
    config_ini: str = DEFAULT_CONFIG_INI,
    extra_flags: Sequence[str] = (),
) -> list[str]:
    """Vela command-line arguments (without the program name)."""
    default_system, default_memory = default_config(accelerator)
    return [
        f"--accelerator-config={accelerator}",
        f"--config={config_ini}",
        "--output-format=raw",
        f"--system-config={system_config or default_system}",
        f"--memory-mode={memory_mode or default_memory}",
        "--verbose-performance",
        f"--output-dir={output_dir}",
        *extra_flags,
        str(tosa_path),
    ]


def run_vela(
    tosa: tosa_flatbuffer.TosaSource,
    accelerator: str = "ethos-u55-128",
    system_config: Optional[str] = None,
    memory_mode: Optional[str] = None,
    output_dir: "str | os.PathLike | None" = None,
    config_ini: str = DEFAULT_CONFIG_INI,
    extra_flags: Sequence[str] = (),
    timeout_s: float = 1800,
) -> VelaResult:
    """Compile `tosa` (bytes or .tosa path) with Vela and return its parsed estimates.

    Vela runs in a subprocess (it prints a lot and keeps global state). Its files stay in
    `output_dir` (a fresh temporary directory when None).
    """
    out = pathlib.Path(output_dir or tempfile.mkdtemp(prefix="vela_"))
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(tosa, (bytes, bytearray)):
        tosa_path = out / "out.tosa"
        tosa_path.write_bytes(bytes(tosa))
    else:
        tosa_path = pathlib.Path(tosa)
    system = system_config or default_config(accelerator)[0]
    cmd = [sys.executable, "-m", "ethosu.vela"]
    cmd += vela_args(tosa_path, out, accelerator, system, memory_mode, config_ini, extra_flags)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise VelaError(f"vela exited with {proc.returncode}: {' '.join(cmd)}\n{log[-4000:]}")
    stem = tosa_path.stem
    summary_path = out / f"{stem}_summary_{system}.csv"
    if not summary_path.exists():
        raise VelaError(f"vela wrote no summary {summary_path}\n{log[-4000:]}")
    per_layer = out / f"{stem}_per-layer.csv"
    ops = parse_per_layer_csv(per_layer) if per_layer.exists() else []
    return VelaResult(parse_summary_csv(summary_path), ops, out, log)


_SUMMED = (
    "cycles",
    "cycles_npu",
    "inference_time_s",
    "nn_macs",
    "on_chip_flash_used_bytes",
    "off_chip_flash_used_bytes",
    "sram_traffic_bytes",
    "dram_traffic_bytes",
    "off_chip_flash_traffic_bytes",
)


def combined(results: Sequence[VelaResult], output_dir: pathlib.Path) -> VelaResult:
    """One figure for a program with several delegates, run one after the other: cycles,
    times, MACs, flash and traffic add up; SRAM and DRAM use are the largest (each delegate
    reuses the arena). Per-op rows are concatenated; `raw` is the first delegate's."""
    if len(results) == 1:
        return results[0]
    first = results[0].summary
    sums = {k: sum(getattr(r.summary, k) for r in results) for k in _SUMMED}
    kinds: dict = {}
    for r in results:
        for k, v in r.summary.cycles_by_kind.items():
            kinds[k] = kinds.get(k, 0) + v
    summary = dataclasses.replace(
        first,
        sram_used_bytes=max(r.summary.sram_used_bytes for r in results),
        dram_used_bytes=max(r.summary.dram_used_bytes for r in results),
        cycles_by_kind=kinds,
        **sums,
    )
    ops = [op for r in results for op in r.ops]
    return VelaResult(summary, ops, output_dir, "\n".join(r.log for r in results))
