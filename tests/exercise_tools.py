"""Run a chapter's exercise solutions outside the notebook, so tests can check them."""

from __future__ import annotations

import re

from icml26.pipeline import find_chapter, read_source


def _setup_cells(cells) -> list[str]:
    """Code cells of the chapter's Setup section (parameters, imports, settings)."""
    code, inside = [], False
    for cell in cells:
        if cell.cell_type == "markdown" and re.search(r"^## ", cell.source, re.MULTILINE):
            inside = bool(re.search(r"^## Setup\b", cell.source, re.MULTILINE))
        elif inside and cell.cell_type == "code":
            code.append(cell.source)
    return code


def _solution_cells(cells, label: str) -> list[str]:
    """Code cells between ``{solution-start} label`` and the next ``{solution-end}``."""
    code, inside = [], False
    for cell in cells:
        if cell.cell_type == "markdown":
            if re.search(r"\{solution-start\}\s+" + re.escape(label) + r"\b", cell.source):
                inside = True
            elif "{solution-end}" in cell.source:
                inside = False
        elif inside:
            code.append(cell.source)
    if not code:
        raise LookupError(f"no solution code for exercise {label!r}")
    return code


def solution_namespace(slug: str, label: str, tier: str = "smoke", seed: int = 0) -> dict:
    """Execute the chapter's setup and one exercise's solution; return the resulting namespace."""
    cells = read_source(find_chapter(slug).source).cells
    namespace: dict = {"__name__": f"solution_{label.replace('-', '_')}"}
    setup = _setup_cells(cells)
    for source in setup[:1] + [f"TIER = {tier!r}\nSEED = {seed}"] + setup[1:]:
        exec(compile(source, f"<{slug} setup>", "exec"), namespace)
    for source in _solution_cells(cells, label):
        exec(compile(source, f"<{slug} {label}>", "exec"), namespace)
    return namespace
