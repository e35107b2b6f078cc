"""The prose of a chapter as JupyterLab shows it: glued numbers live, citations as text.

The HTML build resolves ``{glue:text}`name:.3f``` and ``{cite:p}`key``` itself; JupyterLab does
not. So a chapter opened in ``icml26 lab`` (and every exported lab notebook) has its Markdown cells
rewritten by :func:`to_lab`, and a saved one is rewritten back by :func:`from_lab` before it is
written, so the file on disk keeps the book's one mechanism, glue:

* ``{glue:text}`name:.3f``` becomes ``{eval}`glue_value("name", ".3f")```, an inline expression
  that jupyterlab-myst evaluates in the kernel when the Markdown cell runs (Run All runs the
  cells in order); :func:`icml26.core.glue_value` formats the number glued under ``name``;
* ``{cite:p}`a,b``` becomes ``{abbr}`(Author et al., 2026; Other, 2025) (cite:p:a,b)```, which
  shows the text (read from the book's bibliography) with the keys as its tooltip, and
  ``{cite:t}`` likewise ``Author et al. (2026)``.

Both rewrites are exact inverses on every chapter (``tests/test_lab.py`` saves each one back
byte-identical through the contents manager).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from icml26.toolchain.chapters import ROOT

BIBLIOGRAPHY = ROOT / "book" / "references.bib"

_GLUE = re.compile(r"\{glue:text\}`(?P<name>[A-Za-z_]\w*)(?::(?P<spec>[^`]+))?`")
_EVAL = re.compile(
    r"\{eval\}`glue_value\(\"(?P<name>[A-Za-z_]\w*)\"(?:, \"(?P<spec>[^\"`]+)\")?\)`")
_CITE = re.compile(r"\{cite:(?P<style>[pt])\}`(?P<keys>[^`\s]+)`")
_CITE_ABBR = re.compile(r"\{abbr\}`[^`]*? \(cite:(?P<style>[pt]):(?P<keys>[^)`\s]+)\)`")


def _glue_to_eval(match: re.Match) -> str:
    spec = match.group("spec")
    arguments = f'"{match.group("name")}"' + (f', "{spec}"' if spec else "")
    return f"{{eval}}`glue_value({arguments})`"


def _eval_to_glue(match: re.Match) -> str:
    spec = match.group("spec")
    return f"{{glue:text}}`{match.group('name')}" + (f":{spec}`" if spec else "`")


@functools.cache
def author_years(path: Path = BIBLIOGRAPHY) -> dict[str, tuple[str, str]]:
    """``{key: (authors as cited, year)}`` of a BibTeX file: one surname, two joined by "and",
    three or more as "First et al."."""
    import codecs

    import latexcodec  # noqa: F401 (registers the "ulatex" codec)
    from pybtex.database import parse_file

    def plain(latex: str) -> str:
        return codecs.decode(latex, "ulatex").replace("{", "").replace("}", "")

    entries = {}
    for key, entry in parse_file(str(path), bib_format="bibtex").entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        surnames = [plain(" ".join(p.last_names)) for p in people]
        if not surnames:
            names = plain(entry.fields.get("title", key))
        elif len(surnames) == 1:
            names = surnames[0]
        elif len(surnames) == 2:
            names = f"{surnames[0]} and {surnames[1]}"
        else:
            names = f"{surnames[0]} et al."
        entries[key] = (names, entry.fields.get("year", "n.d."))
    return entries


def citation_text(style: str, keys: str, bibliography: dict[str, tuple[str, str]]) -> str:
    """``(A, 2026; B, 2025)`` for ``style == "p"``, ``A (2026) and B (2025)`` for ``"t"``; an
    unknown key is shown as itself."""
    if style not in ("p", "t"):
        raise ValueError(f"citation style must be 'p' or 't', got {style!r}")
    found = [bibliography.get(key.strip(), (key.strip(), "")) for key in keys.split(",")]
    if style == "p":
        return "(" + "; ".join(f"{names}, {year}" if year else names
                               for names, year in found) + ")"
    return " and ".join(f"{names} ({year})" if year else names for names, year in found)


def to_lab(markdown: str, bibliography: dict[str, tuple[str, str]] | None = None) -> str:
    """A Markdown cell's text as JupyterLab should show it (module docstring)."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown must be a string, got {type(markdown).__name__}")
    bibliography = author_years() if bibliography is None else bibliography
    markdown = _GLUE.sub(_glue_to_eval, markdown)
    return _CITE.sub(lambda m: f"{{abbr}}`{citation_text(m['style'], m['keys'], bibliography)}"
                               f" (cite:{m['style']}:{m['keys']})`", markdown)


def from_lab(markdown: str) -> str:
    """The inverse of :func:`to_lab`: the text the chapter file stores."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown must be a string, got {type(markdown).__name__}")
    markdown = _EVAL.sub(_eval_to_glue, markdown)
    return _CITE_ABBR.sub(lambda m: f"{{cite:{m['style']}}}`{m['keys']}`", markdown)


def _markdown_cells(notebook):
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            if not isinstance(cell["source"], str):  # nbformat allows a list of lines
                cell["source"] = "".join(cell["source"])
            yield cell


def notebook_to_lab(notebook) -> None:
    """Rewrite every Markdown cell of a notebook (nbformat node or its JSON) with
    :func:`to_lab`, in place."""
    for cell in _markdown_cells(notebook):
        cell["source"] = to_lab(cell["source"])


def notebook_from_lab(notebook) -> None:
    """Rewrite every Markdown cell with :func:`from_lab`, in place, and drop what
    jupyterlab-myst stores in a Markdown cell's metadata after running it (the expressions'
    values, its trust), so that a save writes no outputs."""
    for cell in _markdown_cells(notebook):
        cell["source"] = from_lab(cell["source"])
        for key in ("user_expressions", "trusted"):
            cell.get("metadata", {}).pop(key, None)
