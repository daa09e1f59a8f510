"""The docs describe the repository as it is: nothing outside it is cited, and the links and
the repository paths they name resolve."""

import re

from recurrent_lowering.tests.smoke import source_tree

# Lab-notebook wording, and citations of files or checkouts outside the repository.
_OUTSIDE = re.compile(
    r"\bsessions? [0-9]|\(session [0-9]|ANCHORS\.md|\.\./shared/|[ (=]/[a-z]+/main\b"
    r"|PYTHONPATH=[/]",
    re.I,
)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_NAMED = re.compile(
    r"(?<![\w/.-])((?:docs|benchmarks|examples|tools)/[\w./-]+\.(?:md|py|jsonl|json|png))\b"
)


def _ours(*patterns: str) -> list[str]:
    """Tracked files, without the consumer example and its checks (a separate workspace,
    whose paths are its own)."""
    return [
        p
        for p in source_tree.tracked(*patterns)
        if not p.startswith(("tests/consumer/", "tests/consumer_check/"))
    ]


def test_nothing_outside_the_repository_is_cited():
    found = [
        f"{path}:{n}: {line.strip()}"
        for path in _ours("*.md", "*.py", "*.bzl")
        for n, line in enumerate((source_tree.root() / path).read_text().splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_links_and_named_paths_resolve():
    """Markdown links, and the docs, benchmarks, examples and tools files that docs and code
    name, exist."""
    root = source_tree.root()
    missing = []
    for path in _ours("*.md", "*.py", "*.bzl"):
        text = (root / path).read_text()
        missing += [f"{path}: {p}" for p in _NAMED.findall(text) if not (root / p).exists()]
        if path.endswith(".md"):
            links = [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]
            here = (root / path).parent
            missing += [f"{path}: {t}" for t in links if not here.joinpath(t).exists()]
    assert not missing, "\n".join(missing)
