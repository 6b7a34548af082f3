"""The integration guide's pointers into the repository stay true.

Every Markdown page under docs/ is read as plain text (prose, inline code, links and code blocks
alike) and every reference to a repository file in it is checked. The convention, also stated in
docs/index.md:

* A path is written from the repository root: `packages/openreg-core/csrc/runtime/OpenRegGuard.cpp`,
  `tools/bench/run.py`, `noxfile.py`. It must exist (a file, or a folder when it ends with `/` or
  names one). A path counts as a reference when its first component is one of ROOT_DIRS or it is
  one of ROOT_FILES.
* `path::symbol` also names something in that file. In a Python file the symbol is a chain of
  definitions separated by `::`, as in a pytest node id: `tests/x.py::TestClass::test_name`, a
  module-level function, class or assignment, or a method. In any other file the symbol's text
  must occur in the file: `.../OpenRegGuard.cpp::OpenRegGuardImpl::record`,
  `.../runtime.h::orMalloc`.
* A bare file name such as `OpenRegGuard.cpp` must be the name of some file in the repository.
* Links between pages, `[text](other.md)`, are left to Sphinx, which fails on a broken one.
* Anything else that looks like a source path (a `/` and a source suffix) but does not start at
  the repository root is an error: write the whole path. Files of PyTorch itself are named as
  headers in angle brackets (`<c10/core/impl/DeviceGuardImplInterface.h>`) or as Python modules
  (`torch.utils.backend_registration`), which this test leaves alone, as it does URLs.

The READMEs (the repository's, and each package's, which is also its PyPI description) are held to
the same rules, except that a README below the root may also write paths from its own folder
(`csrc/Module.cpp` in `packages/openreg-distributed/README.md`), as a reader of that package does.

No torch needed: `pytest tests/docs` (also run by `nox -s docs`, after the Sphinx build).
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

ROOT_DIRS = {"packages", "tools", "tests", "docs", "examples", ".ci"}
ROOT_FILES = {"noxfile.py", "README.md", "ruff.toml", ".gitignore", ".clang-format"}
SOURCE_SUFFIXES = (".py", ".cpp", ".cc", ".c", ".h", ".hpp", ".md", ".toml", ".txt", ".cfg", ".in")
# Folders that hold build output, caches or other checkouts, never documented files.
SKIP_DIRS = {".git", ".nox", "build", "dist", "_build", "__pycache__", ".pytest_cache", ".ruff_cache"}
# Pages that describe an implemented mechanism must point to at least one test.
MECHANISM_PAGES = DOCS / "mechanisms"

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
HEADER = re.compile(r"<[\w./+-]+\.(?:h|hpp|cuh)>")  # <c10/...h>: PyTorch's headers, not ours
# A Markdown link to another page, `[text](other.md#anchor)`: Sphinx checks those (-W).
PAGE_LINK = re.compile(r"\]\((?![A-Za-z][A-Za-z0-9+.-]*:)[^)\s]*\.md(?:#[^)\s]*)?\)")
TOKEN = re.compile(
    r"(?<![\w./+~-])"
    r"(?P<path>[\w.+-]+(?:/[\w.+-]+)*/?)"
    r"(?:::(?P<symbol>[A-Za-z_~][\w.:~]*))?"
)


@dataclass(frozen=True)
class Ref:
    line: int
    path: str
    symbol: str | None

    def __str__(self) -> str:
        return f"{self.path}::{self.symbol}" if self.symbol else self.path


def references(text: str, base: str = "") -> tuple[list[Ref], list[str]]:
    """The repository references in `text`, and the problems that need no file system to find.
    `base`: the folder (from the root) that a README's own paths start at; "" for the root."""
    refs: list[Ref] = []
    problems: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = PAGE_LINK.sub("]()", HEADER.sub(" ", URL.sub(" ", raw)))
        for m in TOKEN.finditer(line):
            path = m.group("path").rstrip(".")
            path = path[2:] if path.startswith("./") else path  # `pip install ./packages/x`
            symbol = (m.group("symbol") or "").rstrip(".:") or None
            if not path or path in (".", ".."):
                continue
            parts = path.strip("/").split("/")
            if any(p in SKIP_DIRS for p in parts):
                continue  # build output (e.g. the HTML under docs/) is not a documented file
            first = parts[0]
            rooted = ("/" in path and first in ROOT_DIRS) or path in ROOT_FILES
            looks_like_file = path.endswith(SOURCE_SUFFIXES) and not path.startswith(".")
            if base and "/" in path and (ROOT / base / first).exists():
                refs.append(Ref(lineno, f"{base}/{path}", symbol))  # the README's folder first
            elif rooted:
                refs.append(Ref(lineno, path, symbol))
            elif "/" in path and looks_like_file:
                problems.append(f"line {lineno}: `{path}` is not a path from the repository root: write it whole")
            elif "/" not in path and looks_like_file and re.search(r"[A-Za-z_]\.", path):
                if symbol:
                    problems.append(f"line {lineno}: `{path}::{symbol}`: give the file's whole path")
                else:
                    refs.append(Ref(lineno, path, None))
    return refs, problems


@lru_cache(maxsize=None)
def repo_file_names() -> frozenset[str]:
    """Base names of the files in the repository (build output and caches excluded)."""
    names = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        names.update(filenames)
    return frozenset(names)


def _statements(body: list[ast.stmt]):
    """The statements of a body, looking into `if`, `try` and `with` blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "handlers", "finalbody"):
                for child in getattr(node, block, []):
                    yield from _statements(child.body if isinstance(child, ast.ExceptHandler) else [child])


def python_symbol_exists(source: str, chain: list[str]) -> bool:
    """Whether `a::b::c` names nested definitions (class, function or assignment) in `source`."""
    body = ast.parse(source).body
    for i, name in enumerate(chain):
        found = None
        for node in _statements(body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets) and i == len(chain) - 1:
                    found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def check(ref: Ref) -> str | None:
    """None if the reference holds, else what is wrong with it."""
    if "/" not in ref.path and ref.path not in ROOT_FILES:
        if ref.path not in repo_file_names():
            return f"line {ref.line}: no file named `{ref.path}` in the repository"
        return None
    target = ROOT / ref.path
    if not target.exists():
        return f"line {ref.line}: `{ref.path}` does not exist"
    if ref.symbol is None:
        return None
    if not target.is_file():
        return f"line {ref.line}: `{ref}`: a symbol needs a file, `{ref.path}` is a folder"
    text = target.read_text(encoding="utf-8", errors="replace")
    if target.suffix == ".py":
        try:
            ok = python_symbol_exists(text, ref.symbol.split("::"))
        except SyntaxError as e:
            return f"line {ref.line}: `{ref.path}` does not parse ({e})"
        if not ok:
            return f"line {ref.line}: `{ref}`: no definition `{ref.symbol}` in {ref.path}"
    elif ref.symbol not in text:
        return f"line {ref.line}: `{ref}`: the text `{ref.symbol}` does not occur in {ref.path}"
    return None


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)


def problems_in(text: str, base: str = "") -> list[str]:
    refs, problems = references(text, base)
    return problems + [p for p in map(check, refs) if p]


def readmes() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "packages").glob("*/README.md"))]
    found += sorted((ROOT / "packages").glob("*/*/README.md"))  # e.g. the runtime's, libopenreg/
    return found


def test_docs_exist():
    assert (DOCS / "index.md").is_file(), "docs/index.md is missing"
    assert len(pages()) > 1, "docs/ has no pages besides the index"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_references_exist(page: Path):
    problems = problems_in(page.read_text(encoding="utf-8"))
    assert not problems, f"{page.relative_to(ROOT)}: stale pointers into the repository:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("readme", readmes(), ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_references_exist(readme: Path):
    base = readme.parent.relative_to(ROOT).as_posix()
    problems = problems_in(readme.read_text(encoding="utf-8"), "" if base == "." else base)
    assert not problems, f"{readme.relative_to(ROOT)}: stale pointers into the repository:\n  " + "\n  ".join(problems)


def _is_test_file(path: str) -> bool:
    parts = path.split("/")
    return path.endswith((".py", ".cpp")) and ("tests" in parts[:-1] or parts[-1].startswith("test_"))


@pytest.mark.parametrize("page", sorted(MECHANISM_PAGES.glob("*.md")), ids=lambda p: p.name)
def test_mechanism_pages_point_to_tests(page: Path):
    refs, _ = references(page.read_text(encoding="utf-8"))
    tests = [r for r in refs if _is_test_file(r.path)]
    assert tests, f"{page.relative_to(ROOT)} names no test (a file under a tests/ folder) that proves it"


def test_checker_rejects_made_up_references():
    """The checker itself: made-up paths, symbols and file names are reported; real ones are not.

    It points at files of the docs themselves, so that a rename elsewhere cannot break it.
    """
    me = "tests/docs/test_doc_links.py"
    good = [
        f"`{me}`",
        f"`{me}::Ref::line`, `{me}::test_docs_exist`, `{me}::ROOT_DIRS`",
        "`docs/conf.py::myst_heading_anchors`, `docs/index.md::toctree`, `tests/docs/`, `.gitignore`",
        "`conf.py`, `test_doc_links.py`, torch.openreg, e.g. and/or K/M/G, 2.13.0",
        "see <c10/core/impl/DeviceGuardImplInterface.h> and https://example.org/a/b.py",
        "open the HTML under docs/_build/html/index.html",
        "links to pages: [a](mechanisms/guard.md), [b](../index.md#reading-these-pages)",
    ]
    for text in good:
        assert problems_in(text) == [], text
    bad = {
        "`docs/mechanisms/no-such-page.md`": "does not exist",
        "run `python tools/bench/no_such_tool.py --quick` first.": "does not exist",
        "`docs/index.md::NoSuchWordInTheIndex`": "does not occur",
        f"`{me}::Ref::no_such_field`": "no definition",
        f"`{me}::line`": "no definition",
        "`tests/docs/`, `tests/no_such_folder/`": "does not exist",
        "`docs/index.md::toctree` in `mechanisms/runtime.md`": "not a path from the repository root",
        "`OpenRegMadeUp.cpp`": "no file named",
        "`conf.py::project`": "give the file's whole path",
    }
    for text, expected in bad.items():
        found = problems_in(text)
        assert len(found) == 1 and expected in found[0], (text, found)
    # A README's own folder: `docs/conf.py` read from tests/ (the README of tests/docs would write
    # `docs/test_doc_links.py`); a made-up file there is still reported.
    assert problems_in("`docs/test_doc_links.py::Ref`", base="tests") == []
    found = problems_in("`docs/no_such_file.py`", base="tests")
    assert len(found) == 1 and "does not exist" in found[0], found
