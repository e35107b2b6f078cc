"""Course labs from one source: student and instructor notebooks, and autograding checks.

A chapter's exercises use sphinx-exercise's ``{exercise}`` directive; each solution is *gated*
between ``{solution-start} LABEL`` and ``{solution-end}``, and everything inside the gate (prose
and code cells) is the solution. From that one source:

* the **instructor** notebook keeps the solutions;
* the **student** notebook drops the solution prose and replaces each solution code cell by a stub:
  every function keeps its signature and docstring and raises ``NotImplementedError``;
* both get a ``check("LABEL")`` cell after each exercise, which runs the checks kept in
  ``tests/labs/<slug>/<label>.py`` against the notebook's namespace (see
  :mod:`icml26.toolchain.checks`; grading runs the same checks outside the student's kernel).
"""

from __future__ import annotations

import ast
import copy
import inspect
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat

from icml26.toolchain import livetext
from icml26.toolchain.chapters import ROOT, Chapter, chapters, read_source
from icml26.toolchain.checks import CheckResult, LocalSubmission, load_check, run_check

LABS_DIR = ROOT / "tests" / "labs"
META = "icml26"  # cell metadata key: {"role": "setup" | "solution" | "check", "exercise": label}
_START = re.compile(r"^(?P<fence>`{3,}|:{3,})\{solution-start\}\s+(?P<label>[\w-]+)\s*$")
_END = re.compile(r"^(?P<fence>`{3,}|:{3,})\{solution-end\}\s*$")
_EXERCISE = re.compile(r"^(`{3,}|:{3,})\{exercise\}.*\n:label:\s*(?P<label>[\w-]+)", re.MULTILINE)


class LabError(ValueError):
    """A chapter's exercises or a submitted notebook do not have the expected structure."""


# --- Splitting a chapter into public cells and gated solutions ------------------------------


@dataclass
class _Gate:
    label: str | None = None
    closing: str | None = None  # fence line that closes the directive currently being skipped


def _split_markdown(source: str, gate: _Gate) -> str:
    """The part of a markdown cell that lies outside solution gates; updates ``gate``."""
    kept = []
    for line in source.splitlines():
        if gate.closing is not None:  # inside a start/end directive's own fences
            if line.strip() == gate.closing:
                gate.closing = None
            continue
        if start := _START.match(line.strip()):
            if gate.label is not None:
                raise LabError(f"solution {start['label']!r} starts inside {gate.label!r}")
            gate.label, gate.closing = start["label"], start["fence"]
        elif end := _END.match(line.strip()):
            if gate.label is None:
                raise LabError("{solution-end} without a {solution-start}")
            gate.label, gate.closing = None, end["fence"]
        elif gate.label is None:
            kept.append(line)
    return "\n".join(kept).strip("\n")


def _annotated_cells(notebook: nbformat.NotebookNode) -> Iterator[tuple[object, str | None]]:
    """Each cell with its role: a solution's label, "setup", or None (markdown comes trimmed)."""
    gate, section = _Gate(), None
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            if headings := re.findall(r"^## (.+)$", cell.source, re.MULTILINE):
                section = headings[-1].strip()
            trimmed = copy.deepcopy(cell)
            trimmed.source = _split_markdown(cell.source, gate)
            yield trimmed, None
        else:
            role = "setup" if section == "Setup" else None
            yield cell, gate.label or role
    if gate.label is not None:
        raise LabError(f"solution {gate.label!r} has no {{solution-end}}")


def exercise_labels(notebook: nbformat.NotebookNode) -> list[str]:
    """Labels of the chapter's exercises, in order."""
    text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    return [match["label"] for match in _EXERCISE.finditer(text)]


# --- Stubs -----------------------------------------------------------------------------------


def stub_source(code: str, label: str) -> str:
    """Replace every top-level function body in ``code`` by ``raise NotImplementedError``.

    Signatures, decorators and docstrings stay, so the student sees what to implement. Other
    top-level statements stay as they are: they exercise the functions once implemented.
    """
    tree = ast.parse(code)
    lines = code.splitlines()
    pieces, position = [], 0
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        first = node.body[0]
        has_docstring = ast.get_docstring(node, clean=False) is not None
        keep_until = first.end_lineno if has_docstring else first.lineno - 1
        indent = " " * first.col_offset
        message = f"exercise {label}: implement {node.name}"
        pieces.append("\n".join(lines[position:keep_until]))
        pieces.append(f"{indent}# Your code here.\n{indent}raise NotImplementedError({message!r})")
        position = node.end_lineno
    pieces.append("\n".join(lines[position:]))
    return "\n".join(piece for piece in pieces if piece)


def function_signatures(code: str) -> dict[str, str]:
    """``{name: signature}`` of the top-level functions in ``code`` (compared by tests)."""
    tree = ast.parse(code)
    return {node.name: ast.unparse(node.args) for node in tree.body
            if isinstance(node, ast.FunctionDef)}


# --- Exporting notebooks ---------------------------------------------------------------------


def _check_cell(label: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(f'from icml26.toolchain.labs import check\n\ncheck("{label}")')
    cell.metadata[META] = {"role": "check", "exercise": label}
    return cell


def export_notebook(notebook: nbformat.NotebookNode, student: bool) -> nbformat.NotebookNode:
    """The instructor (``student=False``) or student version of a chapter notebook.

    Works on sources and on executed notebooks alike: outputs of public cells are kept; solution
    cells lose theirs in the student version.
    """
    labels = exercise_labels(notebook)
    exported = copy.deepcopy(notebook)
    exported.cells = []
    solved: list[str] = []
    for cell, label in _annotated_cells(notebook):
        if cell.cell_type == "markdown":
            if cell.source.strip():
                exported.cells.append(cell)
            continue
        cell = copy.deepcopy(cell)
        if label == "setup":
            cell.metadata[META] = {"role": "setup"}
        elif label is not None:
            if label not in labels:
                raise LabError(f"solution {label!r} has no matching {{exercise}} label")
            cell.metadata[META] = {"role": "solution", "exercise": label}
            if student:
                cell.source = stub_source(cell.source, label)
                cell.outputs, cell.execution_count = [], None
        exported.cells.append(cell)
        if label in labels and label not in solved:
            solved.append(label)
    missing = [label for label in labels if label not in solved]
    if missing:
        raise LabError(f"exercises without solution code: {missing}")
    return _insert_check_cells(exported, labels)


def _insert_check_cells(
    notebook: nbformat.NotebookNode, labels: list[str]
) -> nbformat.NotebookNode:
    """Put a ``check`` cell after the last solution cell of each exercise."""
    last = {}
    for index, cell in enumerate(notebook.cells):
        meta = cell.metadata.get(META, {})
        if meta.get("role") == "solution":
            last[meta["exercise"]] = index
    for label in sorted(labels, key=lambda lab: last[lab], reverse=True):
        notebook.cells.insert(last[label] + 1, _check_cell(label))
    return notebook


def export_chapter(chapter: Chapter, out_dir: Path, student: bool) -> Path:
    """Write ``<slug>.ipynb`` (student or instructor version) into ``out_dir``, its prose
    showing live numbers and citations in JupyterLab (:func:`livetext.notebook_to_lab`)."""
    notebook = export_notebook(read_source(chapter.source), student)
    livetext.notebook_to_lab(notebook)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{chapter.slug}.ipynb"
    nbformat.write(notebook, target)
    return target


# --- Checks ---------------------------------------------------------------------------------


def check_files(slug: str) -> dict[str, Path]:
    """``{exercise label: check file}`` of a chapter, from ``tests/labs/<slug>/``."""
    folder = LABS_DIR / slug
    if not folder.is_dir():
        raise LabError(f"no checks for chapter {slug!r} (expected {folder})")
    return {path.stem: path for path in sorted(folder.glob("*.py"))}


def _find_check_file(label: str) -> Path:
    for chapter in chapters():
        folder = LABS_DIR / chapter.slug
        if (folder / f"{label}.py").exists():
            return folder / f"{label}.py"
    raise LabError(f"no check for exercise {label!r} under {LABS_DIR}")


def check(label: str, namespace: dict | None = None, seed: int | None = None) -> CheckResult:
    """Check one exercise from inside a notebook: ``check("mod-ex-statistic")``.

    Feedback for the notebook's author: the checks run here, against this namespace, through the
    same wire as grading (answers must be data). Grades come from ``icml26 check`` and
    ``icml26 grade``, which run the checks outside the submission's kernel.
    """
    if namespace is None:
        namespace = inspect.currentframe().f_back.f_globals
    seed = secrets.randbits(32) if seed is None else seed
    result = run_check(load_check(_find_check_file(label)), LocalSubmission(namespace), seed)
    print(f"{'PASS' if result.passed else 'FAIL'} {result.exercise}: {result.message}")
    return result
