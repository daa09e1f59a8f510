"""Build macros shared by this repository's packages."""

def py_pytest(name, srcs, deps = [], data = [], args = [], **kwargs):
    """A py_test that runs pytest on `srcs` (pytest's parametrize and fixtures, Bazel's caching)."""
    native.py_test(
        name = name,
        srcs = srcs + ["@recurrent_lowering//bazel:pytest_main.py"],
        main = "@recurrent_lowering//bazel:pytest_main.py",
        args = ["$(rootpath %s)" % src for src in srcs] + args,
        deps = deps,
        data = data,
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
