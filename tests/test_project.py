"""The project stands alone: its plan agrees with the table of contents, its data register with
what the chapters load."""

from __future__ import annotations

import hashlib
import re

import pytest
import yaml

from icml26.toolchain import pipeline
from icml26.toolchain.chapters import PACKAGE_DIR, ROOT, chapters

CHAPTERS = chapters()


def _plan() -> dict[str, tuple[str, str]]:
    """``{slug: (part, module)}`` from the book plan in CONTRIBUTING.md."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## The book plan", 1)[1].split("\n## ", 1)[0]
    plan, part = {}, None
    for line in section.splitlines():
        if line.startswith("### "):
            part = line[4:].strip()
        elif match := re.match(r"\| `([\w-]+)` \| .* \| `(icml26\.\w+)` \|$", line):
            plan[match[1]] = (part, match[2])
    return plan


def test_nothing_points_outside_the_repository():
    for name in ("CONTRIBUTING.md", "README.md", "_toc.yml", "data/README.md",
                 "tests/labs/README.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "../shared" not in text and "BOOK_PLAN" not in text, name


def test_the_plan_fixes_every_chapter_of_the_table_of_contents():
    plan = _plan()
    assert len(plan) >= len(CHAPTERS)
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    for part in toc["parts"]:
        for entry in part["chapters"]:
            slug = entry["file"].removeprefix("book/chapters/")
            if entry["file"].startswith("book/chapters/"):
                assert slug in plan, f"{slug} is not in the book plan"
                assert plan[slug][0] == part["caption"], slug
    for slug, (_, module) in plan.items():
        name = module.removeprefix("icml26.")
        assert (PACKAGE_DIR / f"{name}.py").is_file() or (PACKAGE_DIR / name).is_dir(), slug


# --- The data register ---------------------------------------------------------------------

LOADERS = [  # what a chapter loads from outside its code, and the name the register uses
    (r"from sklearn\.datasets import \(?([\w, ]+)", "sklearn.datasets.{}"),
    (r"sklearn\.datasets\.(\w+)", "sklearn.datasets.{}"),
    (r"from statsmodels\.datasets import \(?([\w, ]+)", "statsmodels.datasets.{}"),
    (r"statsmodels\.datasets\.(\w+)", "statsmodels.datasets.{}"),
    (r"^\s*import (gt_\w+)", "{}"),  # model weights shipped as a package
]


def _register() -> list[dict[str, str]]:
    text = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]  # past the header
    keys = ["dataset", "used by", "source", "licence", "size", "checksum"]
    return [dict(zip(keys, (c.strip() for c in row.strip("|").split(" | ")), strict=True))
            for row in rows]


def _loads(chapter) -> set[str]:
    """Names of the data sets, models and data files a chapter (and its modules) loads."""
    code = pipeline._code_cells(chapter.source)
    texts = [code, *(p.read_text(encoding="utf-8") for p in pipeline.module_closure(code))]
    found = set()
    for text in texts:
        for pattern, form in LOADERS:
            for match in re.finditer(pattern, text, re.MULTILINE):
                found |= {form.format(n.strip()) for n in match[1].split(",") if n.strip()}
    found |= {f"data/{p.name}" for p in pipeline.data_files(texts)}
    return found


def _mentions(row: dict[str, str], name: str) -> bool:
    text = row["dataset"] + row["source"]
    return name in text or name.replace("_", "-") in text


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_the_register_lists_what_the_chapter_loads(chapter):
    rows = [r for r in _register() if f"`{chapter.slug}`" in r["used by"]]
    assert rows, f"data/README.md has no row for {chapter.slug}"
    for name in _loads(chapter):
        assert any(_mentions(r, name) for r in rows), \
            f"{chapter.slug} loads {name}, which data/README.md does not list for it"


def test_the_register_names_only_chapters_of_the_book():
    """A row is used by chapters of the book, or by a shared block (a model the chapters load
    through ``icml26.llm``)."""
    slugs = {c.slug for c in CHAPTERS}
    blocks = {f"icml26.{p.stem}" for p in (ROOT / "src" / "icml26").glob("*.py")}
    for row in _register():
        named = set(re.findall(r"`([\w.-]+)`", row["used by"]))
        assert named and named <= slugs | blocks, row["dataset"]


def test_every_stored_file_is_listed_with_its_checksum():
    stored = [p for p in (ROOT / "data").iterdir()
              if p.is_file() and p.suffix not in (".md", ".py")]
    listed = {}
    for row in _register():
        if row["checksum"].startswith("sha256"):
            listed[re.search(r"`data/([\w.-]+)`", row["source"])[1]] = row["checksum"]
    assert sorted(listed) == sorted(p.name for p in stored)
    for path in stored:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert listed[path.name] == f"sha256 `{digest}`", path.name
    text = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    assert "No file is stored" not in text
