"""Lints the checked-out sources: ruff (check and format) for Python, buildifier for Bazel files.

It reads the working tree itself (resolved through the WORKSPACE runfile), so the target is
tagged local and external: never sandboxed, never cached.
"""

import os
import pathlib
import subprocess
import sys


def _source_root() -> pathlib.Path:
    runfile = pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "WORKSPACE")
    return runfile.resolve().parent


def _tracked(root: pathlib.Path, *patterns: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if (root / line).exists()]


def main() -> int:
    root = _source_root()
    python = [str(root / ".venv/bin/python"), "-m", "ruff"]
    buildifier = str(root / ".tools/node_modules/.bin/buildifier")
    bazel_files = _tracked(root, "*BUILD.bazel", "*.bzl", "WORKSPACE", "*/WORKSPACE")
    checks = [
        python + ["check", "--no-cache", "."],
        python + ["format", "--check", "--no-cache", "."],
        [
            buildifier,
            "--mode=check",
            "--lint=warn",
            "--warnings=-native-py,-native-sh",
            *bazel_files,
        ],
    ]
    failed = 0
    for cmd in checks:
        result = subprocess.run(cmd, cwd=root)
        if result.returncode != 0:
            print(f"FAILED: {' '.join(cmd[:4])} ... (exit {result.returncode})", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
