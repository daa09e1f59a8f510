"""The example consumer workspace (tests/consumer/) from two checkouts at different paths,
with nested Bazels sharing a disk cache and a BuildGrid remote cache and executor.

What a team depending on this repository relies on, checked in order:
1. `bazel test //...` passes, lowering every model in sandboxed actions that print nothing
   (checkout A).
2. A second checkout at another path, with its own output base, gets every NpuLower action
   from the shared disk cache, then every one from BuildGrid's action cache: action keys
   hold no path.
3. Re-executed (--noremote_accept_cached) on BuildGrid's worker, in an empty directory with
   only the declared inputs and the pinned environment, every action gives byte-identical
   files (artifact, report, .tosa, Vela CSV, plot) to checkout A's local run.
4. Every action's inputs include the environment's launcher and environment.txt.
5. An edit re-runs only what it reaches: the ONNX adapter only the model rewritten to ONNX,
   the ExecuTorch adapter only the .pt2 models (not the ONNX one), the requirements every
   lowering, a model only its own action.
6. A threshold beyond what a model reaches fails its test; `bazel coverage` reports the lines
   a py_test ran, in this repository's files and the consumer's.
7. The rule's .tosa is the one `flow.lower` writes for the same model and options, in a
   Python process of its own: the rule, the command line it runs and the API are one path.
The checkouts are copies, so the working tree stays untouched. This script lives in a
directory of its own: Python puts a script's directory first on sys.path, and tests/ holds
packages (tests/onnx) named like the libraries imported here.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import onnx
from remote_service import BuildGrid
from workspaces import Workspace, checkout, nested_env, offer_environment, source_root

MODELS = ("//models:kws_gru_aten", "//models:kws_gru_onnx", "//models:kws_gru_u55")
ONNX_MODELS = ("//models:kws_gru_onnx",)
# What each model's action writes that must be the same bytes wherever it runs (not the log
# and timings).
REPRODUCIBLE = {
    "kws_gru_aten": (".pt2", ".report.json"),
    "kws_gru_onnx": (".onnx", ".report.json"),
    "kws_gru_u55": (".pte", ".report.json", ".tosa", ".vela_summary.csv", ".error.png"),
}


def consumer(repo: pathlib.Path, dep: pathlib.Path, root: pathlib.Path, envs) -> Workspace:
    """tests/consumer copied to root/consumer, its recurrent_lowering the checkout `dep`."""
    path = root / "consumer"
    shutil.copytree(repo / "tests" / "consumer", path, ignore=shutil.ignore_patterns("bazel-*"))
    workspace = path / "WORKSPACE"
    workspace.write_text(workspace.read_text().replace('path = "../.."', f'path = "{dep}"'))
    return Workspace(path, root / "output_base", nested_env(envs))


def ran(spawns) -> list[str]:
    return [s.model for s in spawns if not s.cache_hit]


def artifacts(workspace: Workspace) -> dict[str, bytes]:
    models = workspace.bin() / "models"
    names = [name + ext for name, exts in REPRODUCIBLE.items() for ext in exts]
    return {name: (models / name).read_bytes() for name in names}


def append(path: pathlib.Path, line: str) -> None:
    path.write_text(path.read_text() + line)


def check_caches_and_remote(a: Workspace, b: Workspace, grid: BuildGrid, disk_cache: str):
    caches = (f"--disk_cache={disk_cache}", f"--remote_cache={grid.url}")
    code, shown = a.bazel_output("test", "//...", *caches)
    assert code == 0, "bazel test //... failed in checkout A"
    assert "From Lowering" not in shown, "a lowering action printed to Bazel's console"
    code = a.bazel("test", "//models:kws_gru_u55_too_strict", *caches)
    assert code == 3, f"a threshold beyond the model's SQNR must fail the test ({code})"
    built_a = artifacts(a)

    from_disk = b.lowering(*MODELS, f"--disk_cache={disk_cache}")
    assert [s.model for s in from_disk] == list(MODELS), from_disk
    assert ran(from_disk) == [], f"checkout B missed the disk cache: {from_disk}"

    assert b.bazel("clean") == 0
    from_grid = b.lowering(*MODELS, f"--remote_cache={grid.url}")
    assert len(from_grid) == 3 and ran(from_grid) == [], f"missed BuildGrid: {from_grid}"

    assert b.bazel("clean") == 0
    remote = b.lowering(
        *MODELS,
        f"--remote_executor={grid.url}",
        "--spawn_strategy=remote",
        "--noremote_accept_cached",
    )
    assert ran(remote) == list(MODELS) and {s.runner for s in remote} == {"remote"}, remote
    executed = [json.loads(line) for line in grid.journal.read_text().splitlines()]
    assert len(executed) == 3 and all(e["exit_code"] == 0 for e in executed), executed
    built_b = artifacts(b)
    differ = [name for name in built_a if built_a[name] != built_b.get(name)]
    assert not differ, f"re-executed remotely, these differ from checkout A's: {differ}"


def check_inputs(b: Workspace) -> None:
    out = subprocess.run(
        ["bazel", f"--output_base={b.output_base}", "aquery", "mnemonic(NpuLower, //models:all)"],
        cwd=b.root,
        env=b.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    actions = out.split("action '")[1:]
    assert len(actions) == 3, out
    for action in actions:
        for name in ("python3", "environment.txt"):
            name = f"recurrent_lowering_python/{name}"
            assert name in action, f"not an input of every NpuLower action: {name}\n{action}"


def check_edits(repo: pathlib.Path, b: Workspace, dep: pathlib.Path, envs) -> None:
    cheap = ("//models:kws_gru_aten", "//models:kws_gru_onnx")  # not the U55 model: time
    append(dep / "backends" / "onnx" / "folding.py", "# edited by consumer_test\n")
    assert ran(b.lowering(*MODELS)) == list(ONNX_MODELS), "an ONNX-adapter edit re-lowered more"
    append(dep / "backends" / "executorch_arm" / "flow.py", "# edited by consumer_test\n")
    assert ran(b.lowering(*cheap)) == ["//models:kws_gru_aten"], "an adapter edit re-lowered ONNX"
    append(dep / "requirements.txt", "# edited by consumer_test\n")
    offer_environment(repo, dep, envs)
    assert ran(b.lowering(*cheap)) == list(cheap), "a requirements edit did not re-lower"

    model = b.root / "models" / "kws_gru.onnx"
    proto = onnx.load(str(model))
    proto.doc_string = "changed"
    onnx.save(proto, str(model))
    assert ran(b.lowering(*cheap)) == list(ONNX_MODELS), "a model edit re-lowered others"


_FLOW = """
import hashlib, sys, tempfile, torch
from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.exported import as_module
ep = torch.export.load(sys.argv[1])
result = flow.lower(as_module(ep), ep.example_inputs[0], "ethos-u55-128", tempfile.mkdtemp())
print(hashlib.sha256(result.tosa_files[0].read_bytes()).hexdigest())
"""


def check_same_as_flow(a: Workspace, dep: pathlib.Path, tmp: pathlib.Path) -> None:
    """The rule's kws_gru_u55.tosa against flow.lower's on the same .pt2 and options."""
    imports = tmp / "imports"
    imports.mkdir()
    (imports / "recurrent_lowering").symlink_to(dep)
    flow = subprocess.run(
        [sys.executable, "-c", _FLOW, str(a.root / "models" / "kws_gru.pt2")],
        env={**nested_env(tmp / "envs"), "PYTHONPATH": str(imports)},
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    assert flow.returncode == 0, flow.stderr[-3000:]
    rule = hashlib.sha256((a.bin() / "models" / "kws_gru_u55.tosa").read_bytes()).hexdigest()
    # the last sha256 printed: the TOSA reference model (auto's verification) writes a line
    # of its own to stdout from C++, which may come after Python's buffered print
    printed = re.findall(r"\b[0-9a-f]{64}\b", flow.stdout)
    assert printed and printed[-1] == rule, "the rule's .tosa is not flow.lower's"


def check_coverage(a: Workspace) -> None:
    assert a.bazel("coverage", "//tests:uses_core_test") == 0
    lcov = (a.root / "bazel-testlogs" / "tests" / "uses_core_test" / "coverage.dat").read_text()
    covered = {
        block.split("\n", 1)[0]: block
        for block in lcov.split("SF:")[1:]
        if "\nLH:0\n" not in block and "\nLH:" in block
    }
    for source in ("tools/greeting.py", "external/recurrent_lowering/passes/spec.py"):
        assert source in covered, f"no lines covered in {source}: {sorted(covered)}"


def main() -> int:
    repo = source_root()
    with tempfile.TemporaryDirectory(prefix="consumer-") as tmp:
        tmp = pathlib.Path(tmp)
        envs = tmp / "envs"
        dep_a = checkout(repo, tmp / "a" / "recurrent_lowering")
        dep_b = checkout(repo, tmp / "b" / "checkouts" / "recurrent_lowering")
        offer_environment(repo, dep_a, envs)
        a = consumer(repo, dep_a, tmp / "a", envs)
        b = consumer(repo, dep_b, tmp / "b", envs)
        try:
            with BuildGrid(repo, envs, tmp / "executed.jsonl") as grid:
                try:
                    check_caches_and_remote(a, b, grid, str(tmp / "disk_cache"))
                except AssertionError:
                    print(grid.logs(), file=sys.stderr)
                    raise
            check_same_as_flow(a, dep_a, tmp)
            check_inputs(b)
            check_edits(repo, b, dep_b, envs)
            check_coverage(a)
        finally:
            a.shutdown()
            b.shutdown()
    print("consumer example: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
