"""FVP runner: locating binaries, the command line, log parsing, and a run against a fake FVP.

The sample logs are reconstructed from ExecuTorch's runner sources (no FVP is installable here).
"""

import os
import pathlib
import stat
import sys

import numpy as np
import pytest

from recurrent_lowering.runtime import fvp

DATA = pathlib.Path(__file__).parent / "testdata"


def _executable(path: pathlib.Path, text: str = "#!/bin/sh\n") -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_fvp_env(monkeypatch, tmp_path):
    for var in ("FVP_CORSTONE_300", "FVP_CORSTONE_300_U65", "FVP_CORSTONE_320", fvp.RUNNER_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def test_missing_fvp_names_the_variable(no_fvp_env):
    with pytest.raises(
        fvp.FvpNotFoundError, match="FVP_CORSTONE_300.*FVP_Corstone_SSE-300_Ethos-U55"
    ):
        fvp.find_fvp("ethos-u55-128")
    with pytest.raises(fvp.FvpNotFoundError, match="FVP_CORSTONE_320"):
        fvp.find_fvp("ethos-u85-256")
    with pytest.raises(fvp.FvpNotFoundError, match="ARM_EXECUTOR_RUNNER"):
        fvp.find_runner()


def test_run_without_fvp_fails_before_running(no_fvp_env):
    with pytest.raises(fvp.FvpNotFoundError):
        fvp.run_fvp(b"pte", [np.zeros(2, np.float32)], [((2,), np.float32)])


def test_fvp_from_env_file_or_directory(no_fvp_env, monkeypatch, tmp_path):
    binary = _executable(tmp_path / "models" / "FVP_Corstone_SSE-320", "")
    monkeypatch.setenv("FVP_CORSTONE_320", str(binary))
    assert fvp.find_fvp("ethos-u85-256") == binary
    monkeypatch.setenv("FVP_CORSTONE_320", str(tmp_path))  # an install directory
    assert fvp.find_fvp("ethos-u85-256") == binary
    assert fvp.find_fvp("ethos-u85-256", fvp=binary) == binary


def test_corstone300_command():
    argv = fvp.fvp_command("FVP", "runner.elf", "ethos-u55-128", "/w", "executor_runner -m p")
    configs = [argv[i + 1] for i, a in enumerate(argv) if a == "-C"]
    assert argv[0] == "FVP"
    assert "ethosu.num_macs=128" in configs
    assert "mps3_board.visualisation.disable-visualisation=1" in configs
    assert "cpu0.semihosting-enable=1" in configs
    assert "cpu0.semihosting-cwd=/w" in configs
    assert "cpu0.semihosting-cmd_line='executor_runner -m p'" in configs
    assert argv[-4:] == ["-a", "runner.elf", "--timelimit", "600"]
    u65 = fvp.fvp_command("FVP", "r.elf", "ethos-u65-256", "/w", "x", timeout_s=5)
    assert "ethosu.num_macs=256" in u65 and u65[-1] == "5"


def test_corstone320_command():
    argv = fvp.fvp_command("FVP", "r.elf", "ethos-u85-256", "/w", "x")
    assert "mps4_board.subsystem.ethosu.num_macs=256" in argv
    assert "mps4_board.subsystem.cpu0.semihosting-cwd=/w" in argv
    assert "vis_hdlcd.disable_visualisation=1" in argv
    assert not any(a.startswith("ethosu.") for a in argv)


def test_semihosting_cmd_line():
    assert (
        fvp.semihosting_cmd_line(2) == "executor_runner -m program.pte -o out -i i0.bin -i i1.bin"
    )
    with pytest.raises(ValueError, match="longer than 256"):
        fvp.semihosting_cmd_line(40)


def test_parse_successful_log():
    log = fvp.parse_log((DATA / "fvp_corstone300_u55_sample.log").read_text())
    assert log.errors == []
    assert log.model_ok is True
    assert log.output_files == ["out-0.bin"]
    pmu = log.pmu
    assert (pmu.inferences, pmu.delegations) == (1, 1)
    assert pmu.npu_cycles == 1385227
    assert pmu.ethosu_backend_cpu_cycles == 1402318
    assert pmu.inference_cpu_cycles == 1418907
    assert pmu.counters[0] == ("ETHOSU_PMU_AXI0_RD_DATA_BEAT_RECEIVED", 52117)
    assert pmu.counters[3] == ("ETHOSU_PMU_NPU_IDLE", 4092)


def test_parse_failed_log():
    log = fvp.parse_log((DATA / "fvp_corstone300_u55_hardfault_sample.log").read_text())
    assert len(log.errors) == 3
    assert log.errors[0].startswith("E [executorch:memory_allocator.h")
    assert log.errors[1].startswith("F [executorch:arm_executor_runner.cpp")
    assert "CPU time has been exceeded" in log.errors[2]
    assert log.pmu.npu_cycles is None and log.model_ok is None


FAKE_FVP = """#!{python}
# Stands in for a Corstone FVP: echoes the sample log and writes out-0.bin = 2 * i0.bin.
import pathlib, sys
import numpy as np
args = sys.argv[1:]
configs = [args[i + 1] for i, a in enumerate(args) if a == "-C"]
cwd = pathlib.Path(next(c.split("=", 1)[1] for c in configs if "semihosting-cwd" in c))
assert (cwd / "program.pte").read_bytes() == b"PTE"
x = np.fromfile(cwd / "i0.bin", dtype=np.float32)
(2 * x).astype(np.float32).tofile(cwd / "out-0.bin")
print(pathlib.Path({log!r}).read_text())
"""


def test_run_against_fake_fvp(no_fvp_env, tmp_path):
    fake = _executable(
        tmp_path / "FVP_Corstone_SSE-300_Ethos-U55",
        FAKE_FVP.format(python=sys.executable, log=str(DATA / "fvp_corstone300_u55_sample.log")),
    )
    runner = _executable(tmp_path / "arm_executor_runner", "")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = fvp.run_fvp(
        b"PTE",
        [x],
        [((2, 3), np.float32)],
        "ethos-u55-128",
        fvp=fake,
        runner=runner,
        workdir=tmp_path / "work",
    )
    np.testing.assert_array_equal(result.outputs[0], 2 * x)
    assert result.log.pmu.npu_cycles == 1385227
    assert os.fspath(runner) in result.command


def test_failed_run_raises(no_fvp_env, tmp_path):
    fake = _executable(
        tmp_path / "fake_fvp",
        f"#!/bin/sh\n/bin/cat {DATA / 'fvp_corstone300_u55_hardfault_sample.log'}\n",
    )
    runner = _executable(tmp_path / "runner.elf", "")
    with pytest.raises(fvp.FvpRunError, match="Memory allocation failed"):
        fvp.run_fvp(b"P", [], [], "ethos-u55-128", fvp=fake, runner=runner, workdir=tmp_path / "w")


def test_run_that_never_finishes_raises(no_fvp_env, tmp_path):
    fake = _executable(tmp_path / "fake_fvp", "#!/bin/sh\necho 'Info: Simulation started'\n")
    runner = _executable(tmp_path / "runner.elf", "")
    with pytest.raises(fvp.FvpRunError, match="no 'Model run: 1'"):
        fvp.run_fvp(b"P", [], [], "ethos-u55-128", fvp=fake, runner=runner, workdir=tmp_path / "w")
