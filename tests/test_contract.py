"""The chapter contract of CONTRIBUTING.md, checked on every chapter in the table of contents."""

import ast
import re

import pytest

from icml26.toolchain.chapters import ROOT, chapters, read_source

SECTIONS = [
    "At a glance", "Learning objectives", "Prerequisites", "Setup", "Background", "Notation",
    "Derivation", "Implementation", "Experiments", "Claims check", "Fidelity to the paper",
    "Exercises", "Summary", "References",
]

CHAPTERS = chapters()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_chapter_follows_the_contract(chapter):
    text = chapter.source.read_text(encoding="utf-8")
    notebook = read_source(chapter.source)
    assert notebook.metadata["jupytext"]["text_representation"]["format_name"] == "myst"
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == SECTIONS, f"sections must be exactly, in order: {SECTIONS}"
    code = [c for c in notebook.cells if c.cell_type == "code"]
    parameters = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1, "exactly one cell tagged 'parameters'"
    assert re.search(r"^TIER = \"(smoke|book|full)\"", parameters[0].source, re.MULTILINE)
    assert re.search(r"^SEED = \d+", parameters[0].source, re.MULTILINE)
    assert "glue_number(" in text and "{glue:text}" in text, "glue numbers and quote them"
    assert "{exercise}" in text and "{solution" in text, "exercises with solutions"
    assert any(re.search(r"\bexplore\(", c.source) for c in code), \
        "one explore cell: icml26.plotting.explore(...) over the parameter the chapter is about"
    assert re.search(r"\$\$ \(eq-", text) or "\\label{" in text, "numbered equations"
    assert all(not c.get("outputs") for c in code), "sources carry no outputs"


def test_no_notebooks_with_outputs_are_committed():
    stray = list((ROOT / "book").rglob("*.ipynb"))
    assert not stray, f"chapters are MyST sources; remove {stray}"


def test_equation_labels_are_unique_across_chapters():
    """Sphinx labels are global: two chapters defining eq-x break the strict build."""
    owners: dict[str, str] = {}
    for chapter in CHAPTERS:
        text = chapter.source.read_text(encoding="utf-8")
        for label in set(re.findall(r"^\$\$ \((eq-[\w-]+)\)", text, re.MULTILINE)):
            assert label not in owners, f"{label}: in {owners.get(label)} and {chapter.slug}"
            owners[label] = chapter.slug


def _section(notebook, title: str) -> list:
    """The cells under the ``## title`` heading, up to the next ``##`` heading."""
    cells, inside = [], False
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            headings = re.findall(r"^## (.+)$", cell.source, re.MULTILINE)
            if headings:
                inside = headings[-1].strip() == title
                continue
        if inside:
            cells.append(cell)
    return cells


# Theory papers whose claims are theorems: their finite signatures are exact verifications.
THEOREM_CHAPTERS = {"transductive-online"}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_claims_check_uses_only_the_claim_helpers(chapter):
    """One ClaimsCheck table with at least one paper claim; no bare asserts or ad-hoc checks."""
    code = "\n".join(c.source for c in _section(read_source(chapter.source), "Claims check")
                     if c.cell_type == "code")
    assert "ClaimsCheck(" in code and ".show()" in code, "the claims check is one ClaimsCheck table"
    if chapter.slug not in THEOREM_CHAPTERS:
        assert re.search(r"\.paper\(", code), "at least one claim of the paper (kind 'paper')"
    for banned in (r"^\s*assert\b", r"\braise\b", r"check_claim\(", r"\bprint\("):
        assert not re.search(banned, code, re.MULTILINE), f"claims check uses {banned!r}"


INTERNAL_WORDS = re.compile(
    r"research notes?|\bnotes? (of|for) (this|the) (chapter|paper)|\bthe issue\b|\bissue #?\d+|"
    r"\btickets?\b|\bsessions?\b|\bhelper agents?\b|\bthe brief\b", re.IGNORECASE)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_prose_speaks_to_readers_only(chapter):
    """No mention of the project's internal material (notes, issues, sessions) in chapter prose."""
    prose = "\n".join(c.source for c in read_source(chapter.source).cells
                      if c.cell_type == "markdown")
    found = sorted({m.group(0) for m in INTERNAL_WORDS.finditer(prose)})
    assert not found, f"prose mentions internal material: {found}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_figure_cells_show_only_their_figure(chapter):
    """myst-nb wraps every output of a figure cell in the figure: a glue or print there makes a
    second target with the same name, which the strict build rejects."""
    for cell in read_source(chapter.source).cells:
        if cell.cell_type == "code" and cell.metadata.get("mystnb", {}).get("figure"):
            extra = re.findall(r"^\s*(?:_ = )?(glue_number|glue_text|print|display|verify)\(",
                               cell.source, re.MULTILINE)
            name = cell.metadata["mystnb"]["figure"].get("name", "a figure")
            assert not extra, f"{name}: move {sorted(set(extra))} to a cell of its own"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_figure_cells_end_without_a_value(chapter):
    """A figure cell's last line must not be an expression that displays a value (a table, a
    figure object): it would be a second output in the figure."""
    for cell in read_source(chapter.source).cells:
        if cell.cell_type != "code" or not cell.metadata.get("mystnb", {}).get("figure"):
            continue
        last = ast.parse(cell.source).body[-1]
        shows_nothing = isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) and (
            getattr(last.value.func, "attr", "") == "show"
            or getattr(last.value.func, "id", "") == "explore")
        assert not isinstance(last, ast.Expr) or shows_nothing, (
            f"{cell.metadata['mystnb']['figure'].get('name')}: the cell ends with a value")
