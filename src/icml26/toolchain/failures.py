"""A chapter that fails to execute: where it failed, and the page it gets.

The page of a failed chapter is the chapter itself, as far as it executed: the cells above the
failing one keep their outputs, an error box stands at the failing cell (the whole message
wrapped), and the text below follows without results. Without a partial notebook (the kernel
died) the page is the source without outputs, the box after the title. Quotes of numbers that were
never glued become a note, and figures that never ran get a placeholder image, so the strict build
still renders the page, search indexes its words and its download is the whole notebook.
"""

from __future__ import annotations

import html
import io
import re
from functools import cache
from pathlib import Path

import nbformat

from icml26.toolchain.chapters import PipelineError, read_source

ERROR_MARKER_TAG = "papermill-error-cell-tag"  # papermill's banners above and at the failing cell
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`]+)`")
CODE_CELL_FENCE = re.compile(r"^(`{3,}|~{3,})\{code-cell\}")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ChapterError(PipelineError):
    """A chapter raised or its kernel died; carries the notebook as far as it executed (``.ipynb``
    bytes, or None when nothing was written) and where the failing cell starts in the source."""

    def __init__(self, message: str, notebook: bytes | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.notebook = notebook
        self.line = line

    def __reduce__(self):  # pickled between processes and Dask workers
        return type(self), (str(self), self.notebook, self.line)


def code_cell_line(source: Path, number: int) -> int:
    """The 1-based line of ``source`` (a MyST notebook) where its ``number``-th code cell (1-based)
    starts; a ``ValueError`` when the source has fewer code cells."""
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"number must be a positive integer, got {number!r}")
    fences = [i for i, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1)
              if CODE_CELL_FENCE.match(line)]
    if number > len(fences):
        raise ValueError(f"{source} has {len(fences)} code cells, not {number}")
    return fences[number - 1]


def failing_code_cell(notebook: nbformat.NotebookNode) -> int | None:
    """The 1-based number, among the source's code cells, of the first cell of an executed
    ``notebook`` with an error output (papermill's injected parameters not counted), or None."""
    number = 0
    for cell in notebook.cells:
        if cell.cell_type != "code" or "injected-parameters" in cell.metadata.get("tags", []):
            continue
        number += 1
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return number
    return None


def glued_names(notebook: nbformat.NotebookNode) -> set[str]:
    """Names glued by the outputs of ``notebook`` (myst-nb stores them under ``scrapbook``)."""
    return {output["metadata"]["scrapbook"]["name"]
            for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.get("outputs", [])
            if "scrapbook" in output.get("metadata", {})}


def _unglued_to_notes(text: str, glued: set[str]) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1).split(":", 1)[0].strip()
        return match.group(0) if name in glued else f"*[{name}: not computed]*"

    return GLUE_ROLE.sub(replace, text)


@cache
def placeholder_png() -> str:
    """A small PNG (base64) that stands in for a figure whose cell never ran."""
    import base64

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 1))
    ax.axis("off")
    ax.text(0.5, 0.5, "not computed: the chapter failed before this figure",
            ha="center", va="center", fontsize=9, color="#7F7F7F")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _has_image(cell: nbformat.NotebookNode) -> bool:
    return any(key.startswith("image/") for output in cell.get("outputs", [])
               for key in output.get("data", {}))


def error_box(message: str, traceback: str = "") -> nbformat.NotebookNode:
    """A Markdown cell with the error admonition: the message, then the traceback, wrapped."""
    detail = f"{message}\n\n{traceback}".strip()
    text = ("````{error} This chapter failed to execute here.\n"
            "The cells above ran; the text below is shown without its results. The build ran "
            "every other chapter and rendered the book.\n\n"
            '<pre class="icml26-error" style="white-space: pre-wrap; overflow-wrap: anywhere">'
            f"{html.escape(detail)}</pre>\n````")
    return nbformat.v4.new_markdown_cell(text, metadata={"tags": ["icml26-error"]})


def failed_page(source: Path, message: str,
                partial: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """The page of a chapter that failed with ``message``: ``partial`` (the notebook as far as it
    executed) or, without it, the chapter source without outputs; see the module docstring."""
    notebook = partial if partial is not None else read_source(source)
    notebook.cells = [cell for cell in notebook.cells
                      if ERROR_MARKER_TAG not in cell.metadata.get("tags", [])]
    failing, traceback = None, ""
    for index, cell in enumerate(notebook.cells):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            failing = index
            traceback = ANSI_ESCAPE.sub("", "\n".join(errors[0].get("traceback", [])))
            cell.outputs = [o for o in cell.outputs if o.get("output_type") != "error"]
            break
    notebook.cells.insert(1 if failing is None else failing + 1, error_box(message, traceback))
    glued = glued_names(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = _unglued_to_notes(cell.source, glued)
        elif cell.metadata.get("mystnb", {}).get("figure") and not _has_image(cell):
            cell.outputs = [*cell.get("outputs", []), nbformat.v4.new_output(
                "display_data", data={"image/png": placeholder_png(),
                                      "text/plain": "<figure not computed>"})]
    notebook.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                                "language": "python"})
    return notebook
