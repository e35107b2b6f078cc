"""Grading real, broken submissions: each in its own kernel, errors per exercise, a gradebook."""

from __future__ import annotations

import csv
import re
import shutil

import nbformat
import pytest

from icml26.toolchain import cli, grading, labs
from icml26.toolchain.chapters import find_chapter

SLUG = "mod-test"
LIMITS = grading.Limits(cell_seconds=30, submission_seconds=600, memory_mib=4096)

BROKEN_FIRST_EXERCISE = {
    "name_error": "undefined_name + 1",
    "syntax_error": "def population_terms(:\n    pass",
    "endless_loop": "while True:\n    pass",
    "memory_hog": "hog = bytearray(64 * 2**30)",
    "network": "import socket\nsocket.create_connection(('203.0.113.7', 80), timeout=2)",
}
# Rebinds numpy.allclose in its own kernel, and answers wrongly everywhere.
EVIL = "import numpy\nnumpy.allclose = lambda *args, **kwargs: True\n"


@pytest.fixture(scope="module")
def instructor(tmp_path_factory):
    out = tmp_path_factory.mktemp("exported")
    path = labs.export_chapter(find_chapter(SLUG), out, student=False)
    return nbformat.read(path, as_version=4)


def _order(notebook) -> list[str]:
    return [c.metadata[labs.META]["exercise"] for c in notebook.cells
            if c.metadata.get(labs.META, {}).get("role") == "check"]


def _with_first_solution(notebook, source: str):
    """A copy whose first exercise's first solution cell is replaced by ``source``."""
    edited = nbformat.from_dict(notebook)
    first = _order(edited)[0]
    cell = next(c for c in edited.cells if c.metadata.get(labs.META, {}) ==
                {"role": "solution", "exercise": first})
    cell.source = source
    return edited


@pytest.fixture(scope="module")
def graded(instructor, tmp_path_factory):
    """A class folder with broken submissions, an evil one, a stubbed one and corrupted files."""
    folder = tmp_path_factory.mktemp("submissions")
    for name, source in BROKEN_FIRST_EXERCISE.items():
        nbformat.write(_with_first_solution(instructor, source), folder / f"{name}.ipynb")
    student = labs.export_notebook(labs.read_source(find_chapter(SLUG).source), student=True)
    evil = nbformat.from_dict(student)
    evil.cells.insert(0, nbformat.v4.new_code_cell(EVIL))
    evil.cells[0].metadata[labs.META] = {"role": "setup"}
    nbformat.write(evil, folder / "evil.ipynb")
    nbformat.write(student, folder / "untouched.ipynb")
    (folder / "corrupted.ipynb").write_text('{"cells": [ {"cell_type": "code", ')
    (folder / "notes.txt").write_text("not a notebook")
    plain = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(plain, folder / "plain.ipynb")
    grades = grading.grade_folder(SLUG, folder, limits=LIMITS, jobs=2, report=lambda line: None)
    return folder, {g.file: g for g in grades}


def _results(grade):
    return {e.exercise: e for e in grade.exercises}


def test_an_error_in_exercise_one_leaves_the_others_graded(graded, instructor):
    _, grades = graded
    first, *rest = _order(instructor)
    for name, expected in [("name_error", "NameError: name 'undefined_name' is not defined"),
                           ("syntax_error", "SyntaxError"),
                           ("network", "network access is disabled"),
                           ("memory_hog", "MemoryError"),
                           ("endless_loop", "ran over its 30 s limit")]:
        results = _results(grades[f"{name}.ipynb"])
        assert not results[first].passed, name
        assert expected in results[first].message and "cell " in results[first].message, (
            name, results[first].message)
        assert all(results[label].passed for label in rest), (name, results)
        assert grades[f"{name}.ipynb"].total == sum(r.max_points for r in results.values()
                                                    if r.exercise != first)


def test_rebinding_numpy_cannot_change_another_submissions_grade(graded):
    _, grades = graded
    untouched = _results(grades["untouched.ipynb"])
    assert untouched and not any(r.passed for r in untouched.values())
    assert all("not implemented" in r.message for r in untouched.values())
    assert grades["untouched.ipynb"].total == 0


def test_bad_files_get_a_row_that_says_why(graded):
    folder, grades = graded
    assert set(grades) == {p.name for p in folder.iterdir()}
    assert "not a notebook" in grades["corrupted.ipynb"].error
    assert "not a notebook" in grades["notes.txt"].error
    assert "not a notebook exported by `icml26 export`" in grades["plain.ipynb"].error


def test_gradebook_has_one_row_per_submission_with_points(graded, tmp_path, instructor):
    _, grades = graded
    target = grading.write_gradebook(list(grades.values()), tmp_path / "grades.csv")
    rows = list(csv.DictReader(target.open()))
    assert {r["file"] for r in rows} == set(grades)
    first = _order(instructor)[0]
    name_error = next(r for r in rows if r["file"] == "name_error.ipynb")
    assert name_error[first] == "fail" and name_error[f"{first} points"] == "0"
    assert "NameError" in name_error[f"{first} message"]
    assert float(name_error["max total"]) == grades["name_error.ipynb"].max_total > 3
    table = grading.summary_table(list(grades.values()))
    assert re.search(r"corrupted\.ipynb\s+not graded: not a notebook", table)
    assert re.search(r"name_error\.ipynb\s+0/2\s+3/3\s+2/2\s+5/7", table)


def test_cli_grade_writes_the_gradebook(graded, tmp_path, capsys, monkeypatch):
    folder, _ = graded
    small = tmp_path / "class"
    small.mkdir()
    shutil.copy(folder / "corrupted.ipynb", small)
    shutil.copy(folder / "plain.ipynb", small)
    assert cli.main(["grade", SLUG, str(small), "--out", str(tmp_path / "g.csv")]) == 0
    out = capsys.readouterr().out
    assert "not graded" in out and (tmp_path / "g.csv").exists()
    assert cli.main(["grade", SLUG, str(small), "--timeout", "-1"]) == 1
    assert "--timeout must be a positive number" in capsys.readouterr().err


def test_limits_reject_bad_values():
    with pytest.raises(ValueError, match="cell_seconds"):
        grading.Limits(cell_seconds=0)
    with pytest.raises(ValueError, match="memory_mib"):
        grading.Limits(memory_mib=-5)
