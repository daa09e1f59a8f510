"""Under `bazel run` a script starts in its runfiles tree; the paths on its command line
(`--out=docs/...`) mean the directory bazel was run from, as they would without Bazel."""

import os


def enter() -> None:
    os.chdir(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()))
