"""Grading a class of real submissions, forgeries included: each gets exactly what it earned.

One small chapter (transductive-online, four exercises of 3 points) and one folder graded once:
the class of ten an instructor would meet, a set of forgeries built on an honest half-solution,
two that call the library where the exercise asks for plain recursion, and a few broken kernels.
"""

from __future__ import annotations

import csv
import re
import shutil

import nbformat
import pytest

from icml26.toolchain import cli, grading, labs
from icml26.toolchain.chapters import find_chapter

SLUG = "transductive-online"
LIMITS = grading.Limits(cell_seconds=20, submission_seconds=600, memory_mib=4096)
ORDER = ["tol-ex-lower", "tol-ex-randomized", "tol-ex-bounds", "tol-ex-own-class"]
HONEST = ["tol-ex-lower", "tol-ex-own-class"]  # what the half-solution solves: 6 of 12 points

# --- The forgeries: each a setup cell (or a solution) added to the half-solution -------------

FORGED_GRADER = """
import icml26.toolchain.checks as _checks
import icml26.toolchain.grading as _grading
import icml26.toolchain.labs as _labs
import icml26.toolchain.wire as _wire

def _pass(*args, **kwargs):
    return _checks.CheckResult("any", True, "all checks passed")

_checks.run_check = _grading.run_check = _labs.run_check = _pass
_wire.answer = lambda request, namespace: _wire.encode(True)
"""
SWALLOWING_TRANSFORMER = """
def _swallow(lines):
    body = ["    " + line if line.endswith("\\n") else "    " + line + "\\n" for line in lines]
    return ["try:\\n", *body, "    pass\\n", "except BaseException:\\n", "    pass\\n"]

get_ipython().input_transformers_post.append(_swallow)
"""
FAKE_RESULTS = """
import re
from IPython.display import display

MIME = "application/vnd.icml26.answer+json"
display({MIME: {"nonce": "0" * 32, "answer": '{"ok": 3}'},
         "application/vnd.icml26.check+json": {"exercise": "tol-ex-bounds", "passed": True,
                                               "message": "all checks passed"}}, raw=True)

def _echo(result):
    found = re.search(r"serve\\('([0-9a-f]+)'", result.info.raw_cell or "")
    if found:
        display({MIME: {"nonce": found.group(1), "answer": '{"ok": 3}'}}, raw=True)

get_ipython().events.register("post_run_cell", _echo)
"""
FORGED_NUMPY = """
import numpy, torch
numpy.allclose = numpy.isclose = numpy.array_equal = lambda *args, **kwargs: True
torch.allclose = torch.equal = lambda *args, **kwargs: True
"""
FILES_FOR_THE_GRADER = """
import os
from pathlib import Path

grader = Path(f"/proc/{os.getppid()}/cwd").resolve()
(grader / "grades.csv").write_text("student,total\\nforger,12\\n")
fake = grader / "tests" / "labs" / "transductive-online"
fake.mkdir(parents=True, exist_ok=True)
for label in ("tol-ex-bounds", "tol-ex-randomized"):
    (fake / f"{label}.py").write_text("name = 'x'\\npoints = 3\\ndef test_x():\\n    pass\\n")
(grader / "sitecustomize.py").write_text("raise SystemExit('planted')\\n")
"""
PRINTS_PASS = """
print("PASS tol-ex-bounds: all 2 checks passed")
print("PASS tol-ex-randomized: all 2 checks passed")
get_ipython().events.register("post_run_cell", lambda result: print("PASS all checks passed"))
"""
EXITS = {  # solutions that leave the kernel
    "tol-ex-randomized": "import sys\nsys.exit(0)",
    "tol-ex-bounds": "def deterministic_value(matrix):\n    import os\n    os._exit(0)",
}
ALWAYS_EQUAL = {  # answers whose comparisons always say yes
    "tol-ex-bounds": ("class Yes:\n    def __eq__(self, other):\n        return True\n"
                      "    __le__ = __ge__ = __lt__ = __gt__ = __eq__\n\n\n"
                      "def deterministic_value(matrix):\n    return Yes()"),
    "tol-ex-randomized": ("class Int(int):\n    def __eq__(self, other):\n        return True\n"
                          "    __hash__ = int.__hash__\n\n\n"
                          "def randomized_value(matrix):\n    return Int(1)"),
}
FORGERIES = {"forged_grader": FORGED_GRADER, "transformer": SWALLOWING_TRANSFORMER,
             "fake_results": FAKE_RESULTS, "forged_numpy": FORGED_NUMPY,
             "files_for_grader": FILES_FOR_THE_GRADER, "prints_pass": PRINTS_PASS}
# What each forgery earns: its honest half, or less where it breaks its own kernel's answers.
FORGERY_TOTALS = {"forged_grader": 0, "transformer": 6, "fake_results": 0, "forged_numpy": 6,
                  "files_for_grader": 6, "prints_pass": 6, "exits": 6, "always_equal": 6}


# --- Building submissions --------------------------------------------------------------------


@pytest.fixture(scope="module")
def editions():
    source = labs.read_source(find_chapter(SLUG).source)
    return (labs.export_notebook(source, student=False),
            labs.export_notebook(source, student=True))


def _solutions(notebook, label: str) -> list:
    return [c for c in notebook.cells
            if c.metadata.get(labs.META, {}) == {"role": "solution", "exercise": label}]


def _with(notebook, solutions: dict[str, str] | None = None, setup: str | None = None):
    """A copy with the first solution cell of each label replaced, and a setup cell added."""
    edited = nbformat.from_dict(notebook)
    for label, source in (solutions or {}).items():
        _solutions(edited, label)[0].source = source
    if setup is not None:
        last = max(i for i, c in enumerate(edited.cells)
                   if c.metadata.get(labs.META, {}).get("role") == "setup")
        cell = nbformat.v4.new_code_cell(setup)
        cell.metadata[labs.META] = {"role": "setup"}
        edited.cells.insert(last + 1, cell)
    return edited


def _half(instructor, student):
    """The instructor's solutions to HONEST, the untouched stubs elsewhere."""
    return _with(instructor, {label: _solutions(student, label)[0].source
                              for label in ORDER if label not in HONEST})


def _class_of_ten(folder, instructor, student) -> None:
    bounds = _solutions(instructor, "tol-ex-bounds")[0].source
    lower = _solutions(instructor, "tol-ex-lower")[0].source
    endless = lower.replace('    points = to.dyadic_points(2**levels - 1)\n',
                            '    while True:\n        pass\n', 1)
    assert endless != lower
    notebooks = {
        "instructor": instructor,
        "stub": student,
        "typo": _with(instructor, {"tol-ex-bounds": bounds.replace("len(matrix)", "len(matirx)")}),
        "endless_loop": _with(instructor, {"tol-ex-lower": endless}),
        "forged_grader": _with(student, setup=FORGED_GRADER + SWALLOWING_TRANSFORMER),
        "forged_numpy": _with(student, setup=FORGED_NUMPY),
        "half": _half(instructor, student),
        "always_equal": _with(student, ALWAYS_EQUAL),
    }
    for name, notebook in notebooks.items():
        nbformat.write(notebook, folder / f"{name}_{SLUG}.ipynb")
    (folder / "corrupted.ipynb").write_text(nbformat.writes(instructor)[:5000])
    shutil.copy(find_chapter(SLUG).source, folder / "wrong_type.ipynb")


CLASS_TOTALS = {"instructor": 12, "stub": 0, "typo": 9, "endless_loop": 9, "forged_grader": 0,
                "forged_numpy": 0, "half": 6, "always_equal": 0, "corrupted": 0, "wrong_type": 0}


@pytest.fixture(scope="module")
def graded(editions, tmp_path_factory):
    """One folder: the class of ten, the forgeries, library shortcuts and broken kernels."""
    instructor, student = editions
    folder = tmp_path_factory.mktemp("submissions")
    _class_of_ten(folder, instructor, student)
    half = _half(instructor, student)
    for name, setup in FORGERIES.items():
        nbformat.write(_with(half, setup=setup), folder / f"forgery_{name}.ipynb")
    nbformat.write(_with(half, EXITS), folder / "forgery_exits.ipynb")
    nbformat.write(_with(half, ALWAYS_EQUAL), folder / "forgery_always_equal.ipynb")
    library = "def deterministic_value(matrix):\n    return to.minimax_mistakes(matrix)"
    nbformat.write(_with(instructor, {"tol-ex-bounds": library}), folder / "library_call.ipynb")
    aliased = "def deterministic_value(matrix):\n    return solve(matrix)"
    nbformat.write(_with(instructor, {"tol-ex-bounds": aliased},
                         setup="solve = getattr(to, 'minimax' + '_mistakes')"),
                   folder / "library_alias.ipynb")
    broken = {"syntax_error": "def special_rounds(levels, theta:\n    pass",
              "memory_hog": "hog = bytearray(64 * 2**30)",
              "network": "import socket\nsocket.create_connection(('203.0.113.7', 80), timeout=2)"}
    for name, source in broken.items():
        nbformat.write(_with(instructor, {"tol-ex-lower": source}), folder / f"{name}.ipynb")
    workdir = tmp_path_factory.mktemp("grader-cwd")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        grades = grading.grade_folder(SLUG, folder, limits=LIMITS, jobs=2,
                                      report=lambda line: None)
    return folder, workdir, {g.file.removesuffix(".ipynb").removesuffix(f"_{SLUG}"): g
                             for g in grades}


def _results(grade) -> dict:
    return {e.exercise: e for e in grade.exercises}


def test_the_class_of_ten_gets_what_it_earned(graded):
    _, _, grades = graded
    assert {name: grades[name].total for name in CLASS_TOTALS} == CLASS_TOTALS
    assert all(grades[name].max_total == 12 for name in CLASS_TOTALS)
    typo = _results(grades["typo"])["tol-ex-bounds"]
    assert "NameError: name 'matirx' is not defined" in typo.message
    loop = _results(grades["endless_loop"])["tol-ex-lower"]
    assert "ran over its 20 s limit" in loop.message
    equal = _results(grades["always_equal"])["tol-ex-bounds"]
    assert "deterministic_value did not answer with data" in equal.message, equal.message
    assert all("not implemented" in e.message for e in grades["stub"].exercises)


@pytest.mark.parametrize("forgery", sorted(FORGERY_TOTALS))
def test_a_forgery_earns_no_point_it_did_not_earn(graded, forgery):
    _, _, grades = graded
    grade = grades[f"forgery_{forgery}"]
    results = _results(grade)
    assert set(results) == set(ORDER) and grade.error is None
    assert not any(results[label].points for label in ORDER if label not in HONEST), results
    assert grade.total == FORGERY_TOTALS[forgery], results


def test_files_a_submission_writes_for_the_grader_are_never_read(graded):
    _, workdir, grades = graded
    assert (workdir / "grades.csv").read_text().startswith("student,total\nforger")  # it wrote
    assert (workdir / "sitecustomize.py").exists()
    assert grades["forgery_files_for_grader"].total == 6


def test_an_exercise_that_asks_for_plain_recursion_refuses_the_library(graded):
    _, _, grades = graded
    direct = _results(grades["library_call"])["tol-ex-bounds"]
    assert not direct.passed and "uses the library's minimax_mistakes" in direct.message
    aliased = _results(grades["library_alias"])["tol-ex-bounds"]
    assert not aliased.passed, aliased.message
    assert "calling icml26.transductive_online.minimax_mistakes is not allowed" in aliased.message
    for name in ("library_call", "library_alias"):
        assert grades[name].total == 9


def test_an_error_in_exercise_one_leaves_the_others_graded(graded):
    _, _, grades = graded
    for name, expected in [("syntax_error", "SyntaxError"),
                           ("network", "network access is disabled"),
                           ("memory_hog", "MemoryError")]:
        results = _results(grades[name])
        assert not results["tol-ex-lower"].passed, name
        assert expected in results["tol-ex-lower"].message, (name, results["tol-ex-lower"])
        assert "cell " in results["tol-ex-lower"].message
        assert grades[name].total == 9, (name, results)


def test_bad_files_keep_their_row_and_say_why_for_people(graded):
    folder, _, grades = graded
    assert {g.file for g in grades.values()} == {p.name for p in folder.iterdir()}
    corrupted, wrong = grades["corrupted"], grades["wrong_type"]
    assert corrupted.error.startswith("not a notebook: the file is cut off or damaged")
    assert wrong.error == ("not a notebook: this looks like the chapter's Markdown source; "
                           "submit the exported .ipynb")
    for grade in (corrupted, wrong):
        assert grade.max_total == 12 and grade.total == 0
        assert {e.status for e in grade.exercises} == {"not graded"}


def test_gradebook_has_students_percentages_and_not_graded_rows(graded, tmp_path):
    _, _, grades = graded
    chosen = [grades[name] for name in CLASS_TOTALS]
    target = grading.write_gradebook(chosen, tmp_path / "grades.csv")
    rows = {r["student"]: r for r in csv.DictReader(target.open())}
    assert set(rows) == set(CLASS_TOTALS)  # the chapter's slug is not part of the identifier
    assert rows["half"]["percent"] == "50.0" and rows["instructor"]["percent"] == "100.0"
    assert rows["typo"]["tol-ex-bounds"] == "fail" and rows["typo"]["tol-ex-bounds points"] == "0"
    assert rows["corrupted"]["tol-ex-lower"] == "not graded"
    assert rows["corrupted"]["max total"] == "12" and "cut off" in rows["corrupted"]["note"]
    assert rows["instructor"]["grading seed"].isdigit()
    table = grading.summary_table(chosen)
    assert re.search(r"typo\s+3/3\s+3/3\s+0/3\s+3/3\s+9/12\s+75\.0", table), table
    assert re.search(r"wrong_type\s+-\s+-\s+-\s+-\s+0/12\s+0\.0\s+not graded: not a notebook",
                     table), table


def test_cli_grade_writes_the_gradebook(graded, tmp_path, capsys):
    folder, _, _ = graded
    small = tmp_path / "class"
    small.mkdir()
    shutil.copy(folder / "corrupted.ipynb", small)
    shutil.copy(folder / "wrong_type.ipynb", small)
    assert cli.main(["grade", SLUG, str(small), "--out", str(tmp_path / "g.csv")]) == 0
    out = capsys.readouterr().out
    assert "not graded" in out and (tmp_path / "g.csv").exists()
    assert cli.main(["grade", SLUG, str(small), "--timeout", "-1"]) == 1
    assert "--timeout must be a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("name, expected", [
    ("alice_transductive-online.ipynb", "alice"), ("bob-submission.ipynb", "bob"),
    ("transductive-online.ipynb", "transductive-online.ipynb"), ("carol.ipynb", "carol"),
])
def test_student_identifier_from_the_file_name(name, expected):
    assert grading.student_id(name, SLUG) == expected


def test_limits_reject_bad_values():
    with pytest.raises(ValueError, match="cell_seconds"):
        grading.Limits(cell_seconds=0)
    with pytest.raises(ValueError, match="memory_mib"):
        grading.Limits(memory_mib=-5)
