"""Offline set-up for a workspace that builds or depends on recurrent_lowering.

Bazel 4's defaults download rules_cc, rules_java and the coverage tools; the stand-ins
below are written locally, so nothing is fetched. The Python toolchain points at a
virtualenv (this repository's `.venv` unless `python_interpreter` is given).

Use from a WORKSPACE:
    load("@recurrent_lowering//bazel:repositories.bzl", "recurrent_lowering_setup")
    recurrent_lowering_setup()
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

_NO_COVERAGE = """#!/bin/sh
echo "coverage is not available in this offline workspace" >&2
exit 0
"""

_COVERAGE_BUILD = """
sh_binary(name = "coverage_report_generator", srcs = ["no_coverage.sh"], visibility = ["//visibility:public"])
sh_binary(name = "lcov_merger", srcs = ["no_coverage.sh"], visibility = ["//visibility:public"])
"""

def _python_venv_impl(rctx):
    interpreter = rctx.attr.interpreter
    if not interpreter:
        root = rctx.path(Label("@recurrent_lowering//:WORKSPACE")).realpath.dirname
        interpreter = "%s/.venv/bin/python3" % root
    if not rctx.path(interpreter).exists:
        fail("Python interpreter %s not found: run ./bazelw (it creates .venv) or pass " % interpreter +
             "python_interpreter to recurrent_lowering_setup().")
    rctx.file("BUILD.bazel", """load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "runtime",
    interpreter_path = "{interp}",
    python_version = "PY3",
    stub_shebang = "#!{interp}",
)

py_runtime_pair(name = "runtime_pair", py3_runtime = ":runtime")

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(interp = interpreter))

_python_venv = repository_rule(
    implementation = _python_venv_impl,
    attrs = {"interpreter": attr.string()},
    local = True,
    doc = "A Python toolchain whose interpreter is a virtualenv's python3.",
)

def recurrent_lowering_setup(python_interpreter = ""):  # buildifier: disable=unnamed-macro
    """Declares the offline stand-ins and registers the virtualenv Python toolchain.

    Args:
      python_interpreter: absolute path of the Python 3.11 interpreter to build with;
        empty means recurrent_lowering's own `.venv/bin/python3`.
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
            "no_coverage.sh": _NO_COVERAGE,
        })
    _python_venv(name = "recurrent_lowering_python", interpreter = python_interpreter)
    native.register_toolchains("@recurrent_lowering_python//:toolchain")
