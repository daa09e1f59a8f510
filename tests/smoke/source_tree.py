"""The checked-out source tree, for tests that read files Bazel does not declare as inputs.

Found through the WORKSPACE runfile's real path, so these tests are tagged local and
external (never sandboxed, never cached), like //bazel:lint_test.
"""

import os
import pathlib
import subprocess


def root() -> pathlib.Path:
    runfile = pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "WORKSPACE")
    return runfile.resolve().parent


def tracked(*patterns: str) -> list[str]:
    """Paths git knows (committed or staged, or new and not ignored) that exist on disk."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=root(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted({p for p in out.splitlines() if (root() / p).exists()})
