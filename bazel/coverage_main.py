"""`bazel coverage` for py_test in the pinned environment: coverage.py runs the test, lcov out.

Bazel 4's Python launcher, given PYTHON_COVERAGE=<this file>, runs
`python3 <this file> run -a --branch MAIN ARGS...` and collects the lcov file it expects at
$PYTHON_LCOV_FILE. Stock coverage.py writes no such file, so this script runs coverage.py's
own command line and then writes it, naming sources as Bazel does: `pkg/mod.py` in the
workspace, `external/<repo>/pkg/mod.py` in another repository.
"""

import os
import sys

from coverage.cmdline import main


def _runfiles_names() -> dict[str, str]:
    """Real path -> Bazel's name for every file of the runfiles tree: coverage.py reports files
    by their real paths, which the runfiles' symlinks hide."""
    workspace = os.getcwd()  # the launcher runs tests in <runfiles>/<workspace>
    runfiles = os.path.dirname(workspace)
    names = {}
    for top, _, files in os.walk(runfiles):
        for name in files:
            path = os.path.join(top, name)
            relative = os.path.relpath(path, workspace)
            if relative.startswith(".." + os.sep):  # another repository's file
                relative = "external" + relative[2:]
            names[os.path.realpath(path)] = relative
    return names


def _lcov_paths(path: str) -> None:
    names = _runfiles_names()
    with open(path) as f:
        lines = [
            f"SF:{names.get(os.path.realpath(line[3:].rstrip()), line[3:].rstrip())}\n"
            if line.startswith("SF:")
            else line
            for line in f
        ]
    with open(path, "w") as f:
        f.writelines(lines)


def run(argv: list[str]) -> int:
    data = os.path.join(os.environ["COVERAGE_DIR"], "python.coverage")
    try:
        status = main(["run", f"--data-file={data}", *argv[1:]])  # argv[0] is "run"
    except SystemExit as e:  # the test's own sys.exit
        status = e.code if isinstance(e.code, int) else 1
    lcov = os.environ["PYTHON_LCOV_FILE"]
    main(["lcov", f"--data-file={data}", "-o", lcov, "-q"])
    _lcov_paths(lcov)
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
