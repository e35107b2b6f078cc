"""The book's table of contents: where the repository is, and which chapters it lists."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat
import yaml

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The ``icml26`` package: the library chapters import (the toolchain lives inside it)."""
ROOT = Path(os.environ.get("ICML26_ROOT", PACKAGE_DIR.parents[1])).resolve()
"""The book: the checkout this package belongs to, or the folder ``ICML26_ROOT`` names (the
``icml26`` command first switches to the checkout it is run in: :func:`checkout_of`)."""
CHAPTER_DIR = "book/chapters"


def checkout_of(path: Path) -> Path | None:
    """The checkout of the book that contains ``path`` (the nearest folder at or above it with
    ``_toc.yml`` and ``src/icml26``), or None."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        package = folder / "src" / "icml26" / "__init__.py"
        if (folder / "_toc.yml").is_file() and package.is_file():
            return folder
    return None


class PipelineError(RuntimeError):
    """A chapter could not be executed or the book could not be built; the message says where."""


@dataclass(frozen=True)
class Chapter:
    slug: str
    part: str
    source: Path

    @property
    def title(self) -> str:
        match = re.search(r"^# (.+)$", self.source.read_text(encoding="utf-8"), re.MULTILINE)
        return match.group(1).strip() if match else self.slug


def chapters(root: Path = ROOT) -> list[Chapter]:
    """The chapters listed in ``_toc.yml``, in book order, with the part each belongs to."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    found = []
    for part in toc.get("parts", []):
        for entry in part.get("chapters", []):
            file = entry.get("file", "")
            if file.startswith(CHAPTER_DIR + "/"):
                source = root / f"{file}.md"
                if not source.exists():
                    raise PipelineError(f"_toc.yml lists {file}, but {source} does not exist")
                found.append(Chapter(Path(file).name, part.get("caption", ""), source))
    return found


def find_chapter(slug: str, root: Path = ROOT) -> Chapter:
    """The chapter called ``slug``; an unknown slug raises with the list of valid ones."""
    known = chapters(root)
    for chapter in known:
        if chapter.slug == slug:
            return chapter
    valid = ", ".join(c.slug for c in known)
    raise PipelineError(f"unknown chapter {slug!r}; valid chapters: {valid}")


def read_source(source: Path) -> nbformat.NotebookNode:
    """Read a chapter source: MyST Markdown (``.md``) or a plain notebook (``.ipynb``)."""
    return jupytext.read(source, fmt="md:myst" if source.suffix == ".md" else None)
