"""Run an ExecuTorch .pte on an Arm Corstone FVP (Ethos-U55/U65 on Corstone-300, U85 on 320).

The FVPs are not installable here, so nothing is downloaded: the FVP binary and ExecuTorch's
semihosting `arm_executor_runner` ELF are found from explicit arguments or environment variables
(`FVP_CORSTONE_300`, `FVP_CORSTONE_300_U65`, `FVP_CORSTONE_320`, `ARM_EXECUTOR_RUNNER`), then
PATH. The command line mirrors ExecuTorch 1.5.1's `backends/arm/test/runner_utils.run_corstone`
(semihosting: the runner reads program.pte and i<k>.bin from the work directory and writes
out-<k>.bin). The log is parsed for failures and for the PMU report printed by
`examples/arm/executor_runner/arm_perf_monitor.cpp` (NPU cycles counted by the Ethos-U PMU).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from typing import Optional, Sequence

import numpy as np

# target family -> (environment variable, FVP executable name)
FVP_BINARIES = {
    "ethos-u55": ("FVP_CORSTONE_300", "FVP_Corstone_SSE-300_Ethos-U55"),
    "ethos-u65": ("FVP_CORSTONE_300_U65", "FVP_Corstone_SSE-300_Ethos-U65"),
    "ethos-u85": ("FVP_CORSTONE_320", "FVP_Corstone_SSE-320"),
}
RUNNER_ENV = "ARM_EXECUTOR_RUNNER"
MAX_SEMIHOSTING_CMD_LINE = 256  # the FVP truncates longer semihosting command lines

_ERROR_RE = re.compile(
    r"(^[EF][: ].*$)|(^.*Hard fault.*$)|(^.*Assertion.*$)"
    r"|(^Info: Simulation is stopping\. Reason: CPU time has been exceeded\..*$)",
    re.MULTILINE,
)


class FvpNotFoundError(FileNotFoundError):
    """No FVP or no arm_executor_runner ELF was found; the message says what to set."""


class FvpRunError(RuntimeError):
    """The simulation ran but the log reports a failure."""


def _family(target: str) -> str:
    family = target.lower().rsplit("-", 1)[0]
    if family not in FVP_BINARIES:
        raise ValueError(
            f"no Corstone FVP for target {target!r}; expected ethos-u55/u65/u85-<macs>"
        )
    return family


def _resolve_executable(candidate: str, name: str) -> Optional[pathlib.Path]:
    path = pathlib.Path(candidate).expanduser()
    if path.is_dir():
        matches = sorted(p for p in path.rglob(name) if p.is_file() and os.access(p, os.X_OK))
        return matches[0] if matches else None
    if path.is_file():
        return path
    found = shutil.which(candidate)
    return pathlib.Path(found) if found else None


def find_fvp(target: str, fvp: "str | os.PathLike | None" = None) -> pathlib.Path:
    """The FVP executable for `target`: argument, then its environment variable, then PATH."""
    env_var, name = FVP_BINARIES[_family(target)]
    tried = []
    for source, candidate in (
        ("argument", fvp),
        (env_var, os.environ.get(env_var)),
        ("PATH", name),
    ):
        if candidate:
            tried.append(f"{source}={candidate}")
            found = _resolve_executable(str(candidate), name)
            if found:
                return found
    raise FvpNotFoundError(
        f"no {name} found for {target} (tried {', '.join(tried)}). Install Arm's Corstone FVP and "
        f"set {env_var} to the {name} executable (or its install directory), pass it with "
        f"--fvp, or put {name} on PATH."
    )


def find_runner(runner: "str | os.PathLike | None" = None) -> pathlib.Path:
    """ExecuTorch's semihosting arm_executor_runner ELF: argument, then $ARM_EXECUTOR_RUNNER."""
    for candidate in (runner, os.environ.get(RUNNER_ENV)):
        if candidate and pathlib.Path(candidate).expanduser().is_file():
            return pathlib.Path(candidate).expanduser()
    raise FvpNotFoundError(
        f"no arm_executor_runner ELF found (argument={runner!r}, {RUNNER_ENV}="
        f"{os.environ.get(RUNNER_ENV)!r}). Build ExecuTorch's semihosting runner for the target "
        f"(backends/arm/test/setup_testing.sh) and set {RUNNER_ENV} to the ELF or pass --runner."
    )


def semihosting_cmd_line(num_inputs: int, pte_name: str = "program.pte", out: str = "out") -> str:
    """The argv the runner sees: `executor_runner -m program.pte -o out -i i0.bin ...`."""
    cmd = f"executor_runner -m {pte_name} -o {out}" + "".join(
        f" -i i{k}.bin" for k in range(num_inputs)
    )
    if len(cmd) > MAX_SEMIHOSTING_CMD_LINE:
        raise ValueError(f"semihosting command line longer than {MAX_SEMIHOSTING_CMD_LINE}: {cmd}")
    return cmd


def fvp_command(
    fvp: "str | os.PathLike",
    runner_elf: "str | os.PathLike",
    target: str,
    workdir: "str | os.PathLike",
    cmd_line: str,
    timeout_s: int = 600,
) -> list[str]:
    """FVP argv for a semihosting run of `runner_elf` on `target` (e.g. "ethos-u55-128")."""
    family = _family(target)
    num_macs = int(target.rsplit("-", 1)[1])
    if family in ("ethos-u55", "ethos-u65"):
        cpu, board, npu = "cpu0", "mps3_board", "ethosu"
        board_flags = [
            f"{board}.visualisation.disable-visualisation=1",
            f"{board}.telnetterminal0.start_telnet=0",
            f"{board}.uart0.out_file='-'",
            f"{board}.uart0.shutdown_on_eot=1",
        ]
    else:
        cpu, board, npu = "mps4_board.subsystem.cpu0", "mps4_board", "mps4_board.subsystem.ethosu"
        board_flags = [
            f"{board}.visualisation.disable-visualisation=1",
            "vis_hdlcd.disable_visualisation=1",
            f"{board}.telnetterminal0.start_telnet=0",
            f"{board}.uart0.out_file='-'",
            f"{board}.uart0.unbuffered_output=1",
            f"{board}.uart0.shutdown_on_eot=1",
        ]
    configs = [
        f"{npu}.num_macs={num_macs}",
        *board_flags,
        f"{cpu}.semihosting-enable=1",
        f"{cpu}.semihosting-stack_base=0",
        f"{cpu}.semihosting-heap_limit=0",
        f"{cpu}.semihosting-cwd={workdir}",
        f"{npu}.extra_args='--fast'",
        f"{cpu}.semihosting-cmd_line='{cmd_line}'",
    ]
    argv = [str(fvp)]
    for c in configs:
        argv += ["-C", c]
    return argv + ["-a", str(runner_elf), "--timelimit", str(timeout_s)]


@dataclasses.dataclass(frozen=True)
class PmuReport:
    """The runner's performance report (arm_perf_monitor.cpp); cycle totals over all inferences."""

    inferences: Optional[int] = None
    delegations: Optional[int] = None
    npu_cycles: Optional[int] = None  # ethosu_pmu_cycle_cntr: NPU active cycles (cycle accurate)
    ethosu_backend_cpu_cycles: Optional[int] = None  # "ethos-u : cycle_cnt"
    inference_cpu_cycles: Optional[int] = None  # "Inference runtime" (not accurate on an FVP)
    counters: tuple = ()  # (event name or "cntr<k>", value) in counter order


@dataclasses.dataclass(frozen=True)
class FvpLog:
    errors: list
    pmu: PmuReport
    output_files: list
    model_ok: Optional[bool]


_INT = r"(\d+)"


def _search_int(pattern: str, text: str) -> Optional[int]:
    m = re.search(pattern, text, re.MULTILINE)
    return int(m.group(1)) if m else None


def parse_log(text: str) -> FvpLog:
    """Failures, PMU figures, output files and the final "Model run" status of an FVP log."""
    text = text.replace("\r\n", "\n")
    errors = [m.group(0).strip() for m in _ERROR_RE.finditer(text)]
    counters = {int(k): int(v) for k, v in re.findall(r"ethosu_pmu_cntr(\d+)\s*:\s*(\d+)", text)}
    events_m = re.search(r"Ethos-U PMU Events:\[([^\]]*)\]", text)
    events = [e.strip() for e in events_m.group(1).split(",")] if events_m else []
    named = tuple(
        (events[k] if k < len(events) else f"cntr{k}", counters[k]) for k in sorted(counters)
    )
    pmu = PmuReport(
        inferences=_search_int(r"NPU Inferences\s*:\s*" + _INT, text),
        delegations=_search_int(r"NPU delegations:\s*" + _INT, text),
        npu_cycles=_search_int(r"ethosu_pmu_cycle_cntr\s*:\s*" + _INT, text),
        ethosu_backend_cpu_cycles=_search_int(r"ethos-u\s*:\s*cycle_cnt\s*:\s*" + _INT, text),
        inference_cpu_cycles=_search_int(r"Inference runtime:\s*" + _INT, text),
        counters=named,
    )
    outputs = re.findall(r"Writing output to file:\s*(\S+)", text)
    model_run = _search_int(r"Model run:\s*" + _INT, text)
    return FvpLog(errors, pmu, outputs, None if model_run is None else bool(model_run))


@dataclasses.dataclass(frozen=True)
class FvpResult:
    outputs: list  # list[np.ndarray]
    log: FvpLog
    command: list
    text: str


def run_fvp(
    pte: "bytes | str | os.PathLike",
    inputs: Sequence[np.ndarray],
    output_specs: Sequence[tuple],
    target: str = "ethos-u55-128",
    fvp: "str | os.PathLike | None" = None,
    runner: "str | os.PathLike | None" = None,
    workdir: "str | os.PathLike | None" = None,
    timeout_s: int = 600,
) -> FvpResult:
    """Run `pte` on the FVP for `target` and read its outputs.

    `inputs` are written raw (the dtype the program's inputs take, e.g. float32 when the
    quantize node stays on the CPU); `output_specs` gives (shape, numpy dtype) per output, since
    the runner writes raw bytes. Raises FvpNotFoundError when no FVP/runner is configured and
    FvpRunError when the log reports a failure.
    """
    fvp_path = find_fvp(target, fvp)
    runner_path = find_runner(runner)
    work = pathlib.Path(workdir or tempfile.mkdtemp(prefix="fvp_"))
    work.mkdir(parents=True, exist_ok=True)
    pte_bytes = pte if isinstance(pte, (bytes, bytearray)) else pathlib.Path(pte).read_bytes()
    (work / "program.pte").write_bytes(pte_bytes)
    for k, x in enumerate(inputs):
        (work / f"i{k}.bin").write_bytes(np.ascontiguousarray(x).tobytes())
    argv = fvp_command(
        fvp_path, runner_path, target, work, semihosting_cmd_line(len(inputs)), timeout_s
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 60)
    text = proc.stdout + proc.stderr
    log = parse_log(text)
    if log.errors:
        raise FvpRunError(f"FVP run failed: {log.errors}\n{text[-4000:]}")
    if log.model_ok is not True:
        raise FvpRunError(
            f"FVP exited with {proc.returncode} and no 'Model run: 1' line\n{text[-4000:]}"
        )
    outputs = []
    for k, (shape, dtype) in enumerate(output_specs):
        path = work / f"out-{k}.bin"
        if not path.exists():
            raise FvpRunError(f"runner wrote no {path.name}\n{text[-4000:]}")
        outputs.append(np.fromfile(path, dtype=dtype).reshape(shape))
    return FvpResult(outputs, log, argv, text)
