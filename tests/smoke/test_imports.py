"""The project's modules form no import cycle, and none takes a private name of another.

Read from the checked-out source (function-level imports included, which a cycle hides
behind), so a cycle fails here even when import order happens to work. Tests may reach
into private names; the rest may not.
"""

from __future__ import annotations

import ast
import os
import pathlib


def _root() -> pathlib.Path:
    """The checked-out sources: under Bazel, where the WORKSPACE runfile points."""
    if "TEST_SRCDIR" in os.environ:
        runfile = pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "WORKSPACE")
        return runfile.resolve().parent
    return pathlib.Path(__file__).resolve().parents[2]


ROOT = _root()
PACKAGE = "recurrent_lowering"
SKIP = {"tests", "bazel", ".venv", ".tools", ".cache"}


def _modules() -> dict:
    """module name -> path, for every non-test module of the repository."""
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP or rel.parts[0].startswith("bazel-"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([PACKAGE, *parts])] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: pathlib.Path, modules: dict):
    """(imported project module, private names taken from it) per import statement."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    aliases = {}  # local name -> project module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    aliases[(a.asname or a.name).split(".")[0]] = a.name
                    yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in modules:
                    aliases[a.asname or a.name] = sub
                    yield sub, []
                elif source in modules:
                    yield source, [a.name] if a.name.startswith("_") else []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            if target and node.attr.startswith("_") and not node.attr.startswith("__"):
                yield target, [node.attr]


def _graph():
    modules = _modules()
    edges, private = {}, []
    for name, path in modules.items():
        for target, names in _imports(name, path, modules):
            if target != name:
                edges.setdefault(name, set()).add(target)
            private += [f"{name} takes {target}.{n}" for n in names if target != name]
    return modules, edges, private


def _cycles(nodes, edges) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def test_the_checks_see_the_project():
    modules, edges, _ = _graph()
    assert f"{PACKAGE}.passes.graph" in modules and f"{PACKAGE}.tools.lower" in modules
    assert f"{PACKAGE}.passes.graph" in edges[f"{PACKAGE}.passes.program"]


def test_no_import_cycle():
    modules, edges, _ = _graph()
    assert _cycles(modules, edges) == []


def test_no_private_name_of_another_module():
    _, _, private = _graph()
    assert private == []


def test_a_cycle_is_found():
    """The check itself, on a made-up graph."""
    assert _cycles(["a", "b", "c"], {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(["a", "b"], {"a": {"b"}}) == []


LIBRARIES = ("executorch", "torchao", "onnx2torch", "tosa_serializer")


def _in_compat(name: str) -> bool:
    return ".compat" in name or name.endswith(".compat")


def _reaches_into_libraries(path: pathlib.Path) -> list:
    """Private names taken from the libraries we extend, and assignments to their objects'
    attributes, in one module."""
    tree = ast.parse(path.read_text())
    found, aliases = [], set()

    def private(parts) -> bool:
        return any(p.startswith("_") and not p.startswith("__") for p in parts)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES:
                    aliases.add((a.asname or a.name).split(".")[0])
                    if private(a.name.split(".")):
                        found.append(f"import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in LIBRARIES:
                for a in node.names:
                    aliases.add(a.asname or a.name)
                    if private([*node.module.split("."), a.name]):
                        found.append(f"from {node.module} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in aliases and private([node.attr]):
                found.append(f"{node.value.id}.{node.attr}")
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets += [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            root = t
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(t, ast.Attribute) and isinstance(root, ast.Name) and root.id in aliases:
                found.append(f"assigns {ast.unparse(t)}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Name) and first.id in aliases:
                found.append(f"setattr({first.id}, ...)")
    return found


def test_only_compat_reaches_into_the_libraries_we_extend():
    """What extends or changes ExecuTorch, torchao, onnx2torch or tosa_serializer lives in
    an adapter's compat package: elsewhere, no private name of theirs and no assignment to
    their modules' or classes' attributes."""
    outside = {
        name: found
        for name, path in _modules().items()
        if not _in_compat(name) and (found := _reaches_into_libraries(path))
    }
    assert outside == {}


def test_the_library_check_sees_private_names(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from executorch.backends.arm._passes import arm_pass_manager as apm\n"
        "from torchao.quantization.pt2e import observer\n"
        "observer.HistogramObserver.calculate_qparams = None\n"
        "x = observer._private\n"
    )
    assert sorted(_reaches_into_libraries(module)) == [
        "assigns observer.HistogramObserver.calculate_qparams",
        "from executorch.backends.arm._passes import arm_pass_manager",
        "observer._private",
    ]
