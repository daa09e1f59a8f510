"""Checkouts of this repository and consumer workspaces driven by a nested Bazel: what the
consumer tests share.

A checkout is a copy of the working tree's tracked files at a path of its own, as a second
clone would be. The pinned environment is this repository's .venv, offered to the nested
Bazel under its id in a directory named by RECURRENT_LOWERING_PYTHON_ENVS, the way a machine
that made it once (or a remote executor's image) offers it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

REQUIREMENTS = ("requirements.txt", "requirements-nodeps.txt")


def source_root() -> pathlib.Path:
    """The working tree this test was built from (it reads files Bazel does not declare)."""
    runfile = pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "WORKSPACE")
    return runfile.resolve().parent


def tracked_files(repo: pathlib.Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if (repo / line).is_file()]


def checkout(repo: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of `repo`'s tracked files (their working-tree content) at `dest`."""
    for name in tracked_files(repo):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, dest / name)
    return dest


def offer_environment(repo: pathlib.Path, checkout_root: pathlib.Path, envs: pathlib.Path) -> str:
    """Puts repo/.venv under envs/<id of checkout_root's requirements> and returns the id.

    When the checkout's requirements differ from the ones .venv was made from only in bytes
    that install nothing (a comment), the environment is the same packages: it is offered as
    a virtualenv of links to .venv stamped with the edited requirements' hash."""
    venv = repo / ".venv"
    helper = repo / "bazel" / "python_env.py"
    requirements = [str(checkout_root / name) for name in REQUIREMENTS]
    described = subprocess.run(
        [str(venv / "bin" / "python3"), str(helper), "describe", *requirements],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    env_id = described.split("\n", 1)[0]
    target = envs / env_id
    envs.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        return env_id
    stamp = subprocess.run(
        [str(venv / "bin" / "python3"), str(helper), "check", str(venv), *requirements],
        capture_output=True,
    )
    if stamp.returncode == 0:
        target.symlink_to(venv)
        return env_id
    target.mkdir()
    for name in ("bin", "lib", "include"):
        if (venv / name).exists():
            (target / name).symlink_to(venv / name)
    shutil.copy2(venv / "pyvenv.cfg", target / "pyvenv.cfg")
    digest = hashlib.sha256()
    for path in requirements:
        digest.update(pathlib.Path(path).read_bytes())
    (target / ".requirements.sha256").write_text(digest.hexdigest() + "\n")
    return env_id


@dataclasses.dataclass
class Spawn:
    """One NpuLower action of a build: which model, and whether a cache served it."""

    model: str  # the npu_model label, e.g. //models:kws_gru_u55
    cache_hit: bool
    runner: str


class Workspace:
    """A Bazel workspace with its own output base, driven by `bazel` subprocesses."""

    def __init__(self, root: pathlib.Path, output_base: pathlib.Path, env: dict[str, str]):
        self.root = root
        self.output_base = output_base
        self.env = env
        self.log = output_base.parent / f"{output_base.name}.exec.json"

    def bazel(self, *args: str) -> int:
        return self.bazel_output(*args)[0]

    def bazel_output(self, *args: str) -> tuple[int, str]:
        """(exit code, what Bazel printed); the output is passed on to this test's log."""
        cmd = ["bazel", f"--output_base={self.output_base}", "--max_idle_secs=120", *args]
        print("$", " ".join(cmd), flush=True)
        done = subprocess.run(
            cmd, cwd=self.root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        text = done.stdout.decode(errors="replace")
        print(text, flush=True)
        return done.returncode, text

    def lowering(self, *args: str) -> list[Spawn]:
        """`bazel build ARGS` (asserted to pass); the NpuLower spawns it ran or fetched."""
        code = self.bazel("build", f"--execution_log_json_file={self.log}", *args)
        assert code == 0, f"bazel build {' '.join(args)} failed ({code})"
        spawns = []
        for entry in _json_stream(self.log.read_text()):
            if entry.get("mnemonic") != "NpuLower":
                continue
            outputs = [o["path"] for o in entry["actualOutputs"]]
            report = next(path for path in outputs if path.endswith(".report.json"))
            package, _, name = report.split("/bin/", 1)[1].rpartition("/")
            spawns.append(
                Spawn(
                    model=f"//{package}:{name.removesuffix('.report.json')}",
                    cache_hit=bool(entry.get("remoteCacheHit")),
                    runner=entry.get("runner", ""),
                )
            )
        return sorted(spawns, key=lambda s: s.model)

    def bin(self) -> pathlib.Path:
        return self.root / "bazel-bin"

    def shutdown(self) -> None:
        self.bazel("shutdown")


def _json_stream(text: str):
    """The objects of a file of concatenated JSON objects (Bazel's JSON execution log)."""
    decoder = json.JSONDecoder()
    index = 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return
        value, index = decoder.raw_decode(text, index)
        yield value


def nested_env(envs: pathlib.Path) -> dict[str, str]:
    """The test's environment minus Bazel's test variables, plus where environments are."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEST_", "BUILD_", "RUNFILES"))}
    env["RECURRENT_LOWERING_PYTHON_ENVS"] = str(envs)
    return env
