"""What an executed chapter shows its readers: only what is meant for them, figures described.

:func:`with_alt_text` gives every figure the alt text a screen reader says: its caption, as
plain text. :func:`with_live_notes` says under each explore cell's static figure how to move its
controls.

:func:`reader_problems` lists what a page must not show: an object's repr (``Row(...)``,
``<... object at 0x...>``), anything a cell writes to stderr (warnings, with the kernel's temporary
paths), an error, and any output after the claims table in the "Claims check" section (glued
values, which the page never shows, aside).
"""

from __future__ import annotations

import re

import nbformat

from icml26.claims import CLAIMS_METADATA_KEY

REPR = re.compile(r"\bRow\(|<[\w.]+ object at 0x[0-9a-fA-F]+>")
CLAIMS_SECTION = "Claims check"


def _text(output: nbformat.NotebookNode) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return "\n".join(str(data.get(mime, "")) for mime in ("text/plain", "text/html",
                                                           "text/markdown"))


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:120]


def _heading(cell: nbformat.NotebookNode) -> str | None:
    """The last ``##`` heading of a Markdown cell, or None."""
    if cell.cell_type != "markdown":
        return None
    headings = re.findall(r"^## (.+)$", cell.source, re.MULTILINE)
    return headings[-1].strip() if headings else None


def reader_problems(notebook: nbformat.NotebookNode) -> list[str]:
    """Every output of an executed ``notebook`` that is not meant for readers, one line each
    (empty when the page is clean)."""
    if not isinstance(notebook, dict) or "cells" not in notebook:
        raise TypeError("reader_problems takes an executed notebook (nbformat node)")
    problems, section, table_shown = [], None, False
    for number, cell in enumerate(notebook.cells, start=1):
        section = _heading(cell) or section
        for output in cell.get("outputs", []):
            kind, text = output.get("output_type"), _text(output)
            where = f"cell {number}"
            if kind == "error":
                problems.append(f"{where}: an error ({output.get('ename')})")
            elif kind == "stream" and output.get("name") == "stderr":
                problems.append(f"{where}: stderr: {_first_line(text)}")
            elif match := REPR.search(text):
                problems.append(f"{where}: an object's repr: {_first_line(text[match.start():])}")
            glue = "scrapbook" in output.get("metadata", {})  # never shown on the page
            if section == CLAIMS_SECTION and not glue and kind != "error":
                if table_shown:
                    problems.append(f"{where}: output after the claims table: "
                                    f"{_first_line(text) or kind}")
                table_shown |= CLAIMS_METADATA_KEY in output.get("metadata", {})
    return problems


ROLE = re.compile(r"\{[\w:-]+\}`([^`]*)`")


def plain_caption(caption: str) -> str:
    """A caption as plain text: roles reduced to their content, no emphasis or math markers."""
    if not isinstance(caption, str):
        raise TypeError(f"a caption is a string, got {type(caption).__name__}")
    text = ROLE.sub(lambda m: m.group(1).split(":", 1)[0] if m.group(0).startswith("{glue")
                    else m.group(1), caption)
    return " ".join(text.replace("**", "").replace("*", "").replace("$", "").split())


def with_alt_text(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` with every figure cell's image alt text (``mystnb.image.alt``) set to its
    caption (:func:`plain_caption`), unless the cell sets one itself."""
    for cell in notebook.cells:
        options = cell.metadata.get("mystnb", {})
        caption = options.get("figure", {}).get("caption")
        if cell.cell_type == "code" and caption and "alt" not in options.get("image", {}):
            options.setdefault("image", {})["alt"] = plain_caption(caption)
    return notebook


LIVE_NOTE = (
    "```{tip}\n"
    "The figure above shows the explore cell's default settings. Its sliders move it live when "
    "the chapter runs in Jupyter: `make lab` opens the chapter as a notebook, or download it with "
    "the button at the top of this page.\n"
    "```"
)
_LIVE = "icml26-live-note"


def with_live_notes(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` with :data:`LIVE_NOTE` after every code cell that calls ``explore(``, once
    (a notebook that has its notes keeps them as they are)."""
    cells = []
    for index, cell in enumerate(notebook.cells):
        cells.append(cell)
        following = notebook.cells[index + 1] if index + 1 < len(notebook.cells) else None
        has_note = following is not None and following.metadata.get(_LIVE)
        explores = cell.cell_type == "code" and re.search(r"^explore\(", cell.source, re.M)
        if explores and not has_note:
            cells.append(nbformat.v4.new_markdown_cell(LIVE_NOTE, metadata={_LIVE: True}))
    notebook.cells = cells
    return notebook
