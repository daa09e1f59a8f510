"""The pinned Python environment lowering actions run in: its identity, and making it.

An environment is a virtualenv made from the requirements files (the first installed with
dependencies, the others with --no-deps, as bazel/setup_env.sh does). Its id hashes the
files' bytes and the interpreter's version and platform, so it names the same environment on
every machine and at every path; it never hashes a path. bazel/repositories.bzl uses it for
@recurrent_lowering_python, and a remote executor's image runs `create` to hold the
environment at <envs>/<id> (docs/bazel.md).

  PYTHON python_env.py describe REQ...      id, then the environment.txt text, for PYTHON
  PYTHON python_env.py check ENV REQ...     fails unless the virtualenv ENV was made from REQ
  PYTHON python_env.py create ENVS REQ...   the virtualenv ENVS/<id>, made with pip if missing
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile

STAMP = ".requirements.sha256"  # written by setup_env.sh and by `create`


def requirements_sha256(requirements: list[str]) -> str:
    """The hash setup_env.sh stamps .venv with: sha256 of the files concatenated."""
    digest = hashlib.sha256()
    for path in requirements:
        digest.update(pathlib.Path(path).read_bytes())
    return digest.hexdigest()


def describe(requirements: list[str]) -> tuple[str, str]:
    """(id, environment.txt) for the running interpreter and these requirements."""
    text = (
        "# The Python environment of recurrent_lowering's actions (bazel/python_env.py).\n"
        f"requirements sha256 {requirements_sha256(requirements)}\n"
        f"python {platform.python_version()} {sys.platform} {platform.machine()}\n"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:20], text


def check(env: pathlib.Path, requirements: list[str]) -> str | None:
    """Why `env` is not the environment of `requirements`, or None when it is."""
    if not (env / "bin" / "python3").exists():
        return f"{env}: no bin/python3 (not a virtualenv)"
    stamp = env / STAMP
    want = requirements_sha256(requirements)
    if not stamp.exists():
        return f"{env}: no {STAMP}, so which requirements made it is unknown"
    if stamp.read_text().strip() != want:
        return f"{env}: made from other requirements ({STAMP} is not {want})"
    return None


def create(envs: pathlib.Path, requirements: list[str]) -> pathlib.Path:
    """ENVS/<id>: made in a temporary directory beside it and renamed, so a failed or
    concurrent install never leaves a half-made environment under the id."""
    env_id, _ = describe(requirements)
    target = envs / env_id
    if check(target, requirements) is None:
        return target
    if target.exists():
        raise SystemExit(f"{check(target, requirements)}: remove it to have it made again")
    envs.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{env_id}-", dir=envs))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(work)], check=True)
        pip = [str(work / "bin" / "python3"), "-m", "pip", "install", "-q"]
        first, *rest = requirements
        subprocess.run([*pip, "-r", first], check=True)
        for path in rest:
            subprocess.run([*pip, "--no-deps", "-r", path], check=True)
        (work / STAMP).write_text(requirements_sha256(requirements) + "\n")
        # Renamed whole: its bin/pip scripts keep the temporary path; `python3 -m pip` works.
        try:
            os.replace(work, target)
        except OSError:  # made concurrently by another process: use that one if it is right
            if check(target, requirements) is not None:
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "describe":
        env_id, text = describe(args)
        sys.stdout.write(f"{env_id}\n{text}")
    elif command == "check":
        problem = check(pathlib.Path(args[0]), args[1:])
        if problem:
            print(problem, file=sys.stderr)
            return 1
    elif command == "create":
        print(create(pathlib.Path(args[0]), args[1:]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
