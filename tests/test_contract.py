"""The chapter contract of CONTRIBUTING.md, checked on every chapter in the table of contents."""

import re

import pytest

from icml26.pipeline import ROOT, chapters, read_source

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
    assert "check_claim(" in text.split("## Claims check")[1].split("## Fidelity")[0]
    assert "{exercise}" in text and "{solution" in text, "exercises with solutions"
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
