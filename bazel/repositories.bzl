"""Workspace set-up for recurrent_lowering and for workspaces that depend on it.

    load("@<name>//bazel:repositories.bzl", "recurrent_lowering_setup")
    recurrent_lowering_setup()

declares two things, under any name the workspace gives this repository:
- offline stand-ins for what Bazel 4 otherwise downloads (rules_cc, rules_java and the
  coverage tools, whose lcov merger here concatenates the tests' lcov files);
- @recurrent_lowering_python, the pinned Python environment every npu_model action runs in
  (bazel/python_env.py): a `python3` launcher whose content is the environment's id, never a
  path, so actions are cached alike across checkouts and machines, and `environment.txt`
  (requirements hash, Python version), an input of every action.

Its Python toolchain is not registered: a workspace opts in for its own py_* targets with
    register_toolchains("@recurrent_lowering_python//:toolchain")
npu_model and npu_model_test run the launcher directly and need no toolchain.
"""

def _standin_impl(rctx):
    for path, content in rctx.attr.files.items():
        rctx.file(path, content, executable = path.endswith(".sh"))

_standin = repository_rule(
    implementation = _standin_impl,
    attrs = {"files": attr.string_dict()},
    doc = "A repository made of the given files: an offline stand-in for one Bazel fetches.",
)

def _forwarders(rules):
    """A defs.bzl whose functions forward to Bazel's native rules of the same name."""
    return "".join([
        "def {r}(**kwargs):\n    native.{r}(**kwargs)\n\n".format(r = r)
        for r in rules
    ])

_FORWARD_CC = _forwarders([
    "cc_binary",
    "cc_import",
    "cc_library",
    "cc_proto_library",
    "cc_test",
    "cc_toolchain",
    "cc_toolchain_suite",
    "fdo_prefetch_hints",
    "fdo_profile",
    "objc_import",
    "objc_library",
])

_FORWARD_JAVA = _forwarders([
    "java_binary",
    "java_import",
    "java_library",
    "java_lite_proto_library",
    "java_package_configuration",
    "java_plugin",
    "java_proto_library",
    "java_runtime",
    "java_test",
    "java_toolchain",
])

# Bazel's own merger is a Java tool it downloads. Both scripts take Bazel's flags and
# concatenate lcov files (several records of one source file are valid lcov).
_LCOV_MERGER = """#!/bin/sh
# Called by collect_coverage.sh: --coverage_dir=D --output_file=F; the test's *.dat files in D.
for arg; do
  case $arg in --coverage_dir=*) dir=${arg#*=} ;; --output_file=*) out=${arg#*=} ;; esac
done
find "$dir" -name '*.dat' ! -name "$(basename "$out")" -exec cat {} + > "$out.tmp"
mv "$out.tmp" "$out"
"""

_REPORT_GENERATOR = """#!/bin/sh
# bazel coverage --combined_report=lcov: --reports_file=LIST --output_file=F.
for arg; do
  case $arg in --reports_file=*) list=${arg#*=} ;; --output_file=*) out=${arg#*=} ;; esac
done
: > "$out"
while read -r report; do cat "$report" >> "$out"; done < "$list"
"""

_COVERAGE_BUILD = """
sh_binary(name = "lcov_merger", srcs = ["lcov_merger.sh"], visibility = ["//visibility:public"])
sh_binary(
    name = "coverage_report_generator",
    srcs = ["report_generator.sh"],
    visibility = ["//visibility:public"],
)
"""

# Runs the environment's python3: locally the virtualenv `venv` beside this file's real path
# (Bazel links inputs to it), on a remote executor <envs>/<id> in its image. PATH is only
# read by this shell (unset in actions), never passed on.
_LAUNCHER = """#!/bin/sh
# recurrent_lowering's pinned Python environment {id} (environment.txt beside this file).
PATH=${{PATH:-/usr/bin:/bin}}
here=$(dirname "$(readlink -f "$0")")
for env in "$here/venv" "${{RECURRENT_LOWERING_PYTHON_ENVS:-/opt/recurrent_lowering/python}}/{id}"; do
  if [ -x "$env/bin/python3" ]; then exec "$env/bin/python3" "$@"; fi
done
echo "recurrent_lowering: Python environment {id} not found: neither $here/venv nor" \\
  "${{RECURRENT_LOWERING_PYTHON_ENVS:-/opt/recurrent_lowering/python}}/{id} (docs/bazel.md)" >&2
exit 127
"""

_ENV_BUILD = """load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

exports_files(["python3", "environment.txt"], visibility = ["//visibility:public"])

# What an action needs to run Python in this environment: the launcher and the identity.
filegroup(
    name = "python",
    srcs = ["python3", "environment.txt"],
    visibility = ["//visibility:public"],
)

# `bazel coverage` runs tests through coverage_main.py when given
# --test_env=PYTHON_COVERAGE=../recurrent_lowering_python/coverage_main.py (docs/bazel.md).
py_runtime(
    name = "runtime",
    interpreter = "python3",
    files = [
        "coverage_main.py",
        "environment.txt",
    ],
    python_version = "PY3",
    stub_shebang = "#!/usr/bin/env python3",
)

py_runtime_pair(name = "runtime_pair", py3_runtime = ":runtime")

# Opt in for a workspace's own py_* targets: register_toolchains("@recurrent_lowering_python//:toolchain").
toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _run(rctx, args, what, quiet = True):
    result = rctx.execute(args, quiet = quiet, timeout = 7200)
    if result.return_code != 0:
        fail("%s failed (%d):\n%s%s" % (what, result.return_code, result.stdout, result.stderr))
    return result.stdout

def _python_env_impl(rctx):
    requirements = [str(rctx.path(r)) for r in rctx.attr.requirements]
    helper = str(rctx.path(rctx.attr._helper))
    root = rctx.path(rctx.attr.requirements[0]).realpath.dirname
    env = rctx.attr.python_env
    if not env and rctx.path("%s/.venv/bin/python3" % root).exists:
        checked = rctx.execute(["%s/.venv/bin/python3" % root, helper, "check", "%s/.venv" % root] + requirements)
        if checked.return_code == 0:
            env = "%s/.venv" % root  # a checkout's own, made by ./bazelw
    if not env:
        python = rctx.which(rctx.attr.python)
        if not python:
            fail("%s not found: recurrent_lowering_setup(python = ...) names the interpreter " % rctx.attr.python +
                 "to make the environment with, or python_env = an existing one")
        envs = rctx.os.environ.get("RECURRENT_LOWERING_PYTHON_ENVS") or (
            "%s/.cache/recurrent_lowering/python" % rctx.os.environ["HOME"]
        )
        rctx.report_progress("making the Python environment under %s (pip, once per machine)" % envs)
        env = _run(rctx, [python, helper, "create", envs] + requirements, "making the environment", quiet = False).strip()
    python3 = "%s/bin/python3" % env
    _run(rctx, [python3, helper, "check", env] + requirements, "checking " + env)
    env_id, text = _run(rctx, [python3, helper, "describe"] + requirements, "describing " + env).split("\n", 1)
    rctx.symlink(env, "venv")
    rctx.file("environment.txt", text, executable = False)
    rctx.file("python3", _LAUNCHER.format(id = env_id), executable = True)
    rctx.template("coverage_main.py", rctx.attr._coverage_main, executable = False)
    rctx.file("WORKSPACE", "")
    rctx.file("BUILD.bazel", _ENV_BUILD)

_python_env = repository_rule(
    implementation = _python_env_impl,
    attrs = {
        "requirements": attr.label_list(allow_files = True, mandatory = True),
        "python_env": attr.string(),
        "python": attr.string(default = "python3.11"),
        "_helper": attr.label(default = Label("//bazel:python_env.py")),
        "_coverage_main": attr.label(default = Label("//bazel:coverage_main.py")),
    },
    environ = ["RECURRENT_LOWERING_PYTHON_ENVS"],
    doc = "@recurrent_lowering_python: the pinned environment's launcher, identity and toolchain.",
)

def recurrent_lowering_setup(python_env = "", python = "python3.11"):  # buildifier: disable=unnamed-macro
    """Declares the offline stand-ins and @recurrent_lowering_python.

    The environment is, in this order: `python_env`; the `.venv` of this repository's checkout
    when made from its requirements (./bazelw makes it); else <envs>/<id>, made once per machine
    with pip from the pinned requirements (envs: $RECURRENT_LOWERING_PYTHON_ENVS, default
    ~/.cache/recurrent_lowering/python). Each must have been made from the same requirements.

    Args:
      python_env: absolute path of a virtualenv made from this repository's requirements.
      python: the Python 3.11 interpreter to make the environment with, when it is made here.
    """
    if not native.existing_rule("rules_cc"):
        _standin(name = "rules_cc", files = {
            "WORKSPACE": "",
            "BUILD.bazel": "",
            "cc/BUILD.bazel": "",
            "cc/defs.bzl": _FORWARD_CC,
        })
    if not native.existing_rule("rules_java"):
        _standin(name = "rules_java", files = {
            "WORKSPACE": "",
            "BUILD.bazel": "",
            "java/BUILD.bazel": "",
            "java/defs.bzl": _FORWARD_JAVA,
        })
    if not native.existing_rule("remote_coverage_tools"):
        _standin(name = "remote_coverage_tools", files = {
            "WORKSPACE": "",
            "BUILD.bazel": _COVERAGE_BUILD,
            "lcov_merger.sh": _LCOV_MERGER,
            "report_generator.sh": _REPORT_GENERATOR,
        })
    _python_env(
        name = "recurrent_lowering_python",
        requirements = [Label("//:requirements.txt"), Label("//:requirements-nodeps.txt")],
        python_env = python_env,
        python = python,
    )
