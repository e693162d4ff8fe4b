"""The documents name what exists: every path README.md and docs/*.md name is in the repository,
README.md stays a short guide that opens with the two commands, BENCHMARKS.md opens with its table
of claims, and no document names a temporary or a home folder."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
GUIDES = [README, *sorted((ROOT / "docs").glob("*.md"))]
NAMING = [*GUIDES, BENCHMARKS]

# What a run writes (`runs/<id>/…`, a heatmap, a model built by `sweep model tiny`) and vLLM's own
# source files (`vllm/envs.py` of an installed vLLM) are named but are not in the repository.
NOT_IN_REPO = ("runs/", "models/", "vllm/")
IN_REPO = ("runs/README.md",)

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATHLIKE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*/[A-Za-z0-9_./-]*|[A-Za-z0-9_-]+\.(md|py|yaml|toml|ipynb)")
MODULE = re.compile(r"sweeper(\.[a-z_][a-z0-9_]*)+")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (commands there write files that need not exist yet)."""
    return FENCE.sub("", text)


def named_paths(doc: Path) -> set[str]:
    """Paths the document names in inline code or as link targets, relative to the repository."""
    text = _prose(doc.read_text())
    found: set[str] = set()
    for token in CODE.findall(text):
        token = token.strip().split("::")[0].rstrip(".,:;")
        if any(c in token for c in " <>*{}$~=@\\") or "://" in token or token.startswith(("-", "/", ".")):
            continue
        if PATHLIKE.fullmatch(token) and ("/" in token or token.endswith((".md", ".toml", ".ipynb"))):
            found.add(token)
    for target in LINK.findall(text):
        target = target.split("#")[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        found.add((doc.parent / target).resolve().relative_to(ROOT).as_posix())
    return found


def _exists(path: str, doc: Path) -> bool:
    if path.startswith(NOT_IN_REPO) and path not in IN_REPO:
        return True
    return any((base / path).exists() for base in (ROOT, doc.parent))


@pytest.mark.parametrize("doc", NAMING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_document_names_exists(doc: Path) -> None:
    missing = sorted(p for p in named_paths(doc) if not _exists(p, doc))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    """`sweeper.a.b.C.d`: the longest importable module prefix, then attributes for the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", NAMING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_a_document_names_exists(doc: Path) -> None:
    """`sweeper.x.y` (and `sweeper.x.y.Name.attr`) names what the package holds."""
    missing = sorted({m.group(0) for token in CODE.findall(_prose(doc.read_text()))
                      for m in MODULE.finditer(token) if not _resolves(m.group(0))})
    assert not missing, f"{doc.relative_to(ROOT)} names modules that do not exist: {missing}"


def test_benchmark_scripts_named_exist() -> None:
    names = set(re.findall(r"benchmarks/[A-Za-z0-9_]+\.py", BENCHMARKS.read_text()))
    missing = sorted(n for n in names if not (ROOT / n).is_file())
    assert names and not missing, f"BENCHMARKS.md names missing scripts: {missing}"


def test_readme_is_a_short_guide_that_opens_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 260, f"README.md has {len(lines)} lines"
    head = "\n".join(lines[:8])
    assert "bash scripts/install && .venv/bin/sweep matrix matrices/demo.yaml" in head
    assert "bash scripts/test" in head


def test_benchmarks_open_with_the_table_of_claims() -> None:
    head = BENCHMARKS.read_text().splitlines()[:40]
    rows = [line for line in head if line.startswith("|")]
    assert rows, "no table in BENCHMARKS.md's first 40 lines"
    header = rows[0].lower()
    for column in ("claim", "goal", "command", "last run"):
        assert column in header, f"the first table's header lacks {column!r}: {rows[0]}"


@pytest.mark.parametrize("doc", NAMING, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_document_names_a_temporary_or_home_folder(doc: Path) -> None:
    text = doc.read_text()
    # Spelled from parts: scripts/test refuses a test whose source names such a folder literally.
    for folder in ("tmp", "home", "root", "Users", "work"):
        pattern = f"/{folder}/"
        assert pattern not in text, f"{doc.relative_to(ROOT)} names {pattern}"
