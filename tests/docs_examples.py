"""The Python examples of README.md and the site's pages (docs/), read as programs.

Each Python block is a program, complete as pasted, unless an HTML comment right before
it (blank lines between allowed) says otherwise:

- ``<!-- example: fragment -->``: it continues the block before it on the same page
  (the two run as one program, in order);
- ``<!-- example: skip REASON -->``: it is not run (it needs the network, an API key, a
  Ray cluster...), and REASON says why; a fragment of a skipped block is skipped too.

A ``text`` block marked ``<!-- example: output -->`` is what the program before it
prints, exactly: the outputs of a program and its fragments, in order, are its stdout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*example:\s*(?P<kind>fragment|skip|output)\b\s*(?P<reason>.*?)\s*-->\s*\Z", re.S)


@dataclass
class Example:
    """One program: a page's block and the fragments that continue it."""

    path: Path
    line: int
    code: str
    skip: str | None = None
    output: str | None = None
    parts: int = 1

    @property
    def id(self) -> str:
        return f"{_name(self.path)}:{self.line}"


@dataclass
class _Page:
    examples: list[Example] = field(default_factory=list)


def doc_files() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _dedent(body: str, indent: str) -> str:
    return "".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines(True))


def examples(path: Path) -> list[Example]:
    """The programs of one page, in order. Raises ``ValueError`` naming the line for a
    marker that cannot apply (a fragment with nothing before it, an output with no
    program, a marker before a block of another language)."""
    text = path.read_text()
    page = _Page()
    previous_end = 0
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[previous_end:match.start()].rstrip()
        previous_end = match.end()
        marker = MARKER.search(before[-300:])
        kind = marker["kind"] if marker else None
        lang, body = match["lang"], _dedent(match["body"], match["indent"])
        where = f"{_name(path)}:{line}"
        if lang == "python":
            if kind == "fragment":
                if not page.examples:
                    raise ValueError(f"{where}: a fragment with no Python block before it")
                last = page.examples[-1]
                last.code += "\n" + body
                last.parts += 1
            elif kind == "output":
                raise ValueError(f"{where}: an output marker before a Python block")
            else:
                reason = (marker["reason"] or None) if marker is not None and kind == "skip" else None
                if kind == "skip" and not reason:
                    raise ValueError(f"{where}: a skip marker must say why")
                page.examples.append(Example(path, line, body, skip=reason))
        elif kind == "output":
            if not page.examples:
                raise ValueError(f"{where}: an output with no Python block before it")
            last = page.examples[-1]
            last.output = (last.output or "") + body
        elif kind is not None:
            raise ValueError(f"{where}: a {kind} marker before a {lang or 'plain'} block")
    return page.examples


def all_examples() -> list[Example]:
    return [example for path in doc_files() for example in examples(path)]
