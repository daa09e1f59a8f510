"""Build macros shared by this repository's packages."""

_PYTEST_MAIN = str(Label("//bazel:pytest_main.py"))
_IMPORT_ROOT = str(Label("//bazel/import_root"))

def py_pytest(name, srcs, deps = [], data = [], args = [], **kwargs):
    """A py_test that runs pytest on `srcs` (pytest's parametrize and fixtures, Bazel's caching)."""
    native.py_test(
        name = name,
        srcs = srcs + [_PYTEST_MAIN],
        main = _PYTEST_MAIN,
        args = ["$(rootpath %s)" % src for src in srcs] + args,
        deps = deps + [_IMPORT_ROOT],
        data = data,
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
