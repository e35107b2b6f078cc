"""Course labs: instructor notebooks pass their checks, student notebooks fail them, no leaks."""

from __future__ import annotations

import html
import re
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbclient import NotebookClient

from icml26.toolchain import grading, labs
from icml26.toolchain.chapters import PACKAGE_DIR, chapters, read_source

CHAPTERS = chapters()
IDS = [c.slug for c in CHAPTERS]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``{(slug, edition): path}`` for both editions of every chapter."""
    out = tmp_path_factory.mktemp("labs")
    return {(c.slug, edition): labs.export_chapter(c, out / edition, edition == "student")
            for c in CHAPTERS for edition in ("student", "instructor")}


def _solution_cells(chapter):
    """Pairs (solution code, student stub) of every solution code cell."""
    source = read_source(chapter.source)
    solutions = labs.export_notebook(source, student=False)
    stubs = labs.export_notebook(source, student=True)
    return [(a.source, b.source) for a, b in zip(solutions.cells, stubs.cells, strict=True)
            if a.metadata.get(labs.META, {}).get("role") == "solution"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_every_exercise_has_a_check(chapter):
    labels = labs.exercise_labels(read_source(chapter.source))
    assert len(labels) >= 3, "every chapter has at least three exercises"
    assert sorted(labels) == sorted(labs.check_files(chapter.slug)), "one check file per exercise"


def _grade(slug, exported, edition):
    return grading.grade_submission(slug, exported[slug, edition]).exercises


def _student_run_errors(slug, exported):
    """The error names of the student notebook executed whole at smoke tier."""
    chapter = next(c for c in CHAPTERS if c.slug == slug)
    notebook = nbformat.read(exported[slug, "student"], as_version=4)
    for cell in notebook.cells:
        if "parameters" in cell.metadata.get("tags", []):
            cell.source += '\nTIER = "smoke"'
    NotebookClient(notebook, kernel_name="python3", allow_errors=True, timeout=120,
                   resources={"metadata": {"path": str(chapter.source.parent)}}).execute()
    return [o.ename for c in notebook.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "error"]


KERNEL_RUNS = {
    "test_instructor_notebook_passes_every_check":
        lambda slug, exported: _grade(slug, exported, "instructor"),
    "test_untouched_student_notebook_fails_every_check":
        lambda slug, exported: _grade(slug, exported, "student"),
    "test_student_notebook_runs_with_only_not_implemented_errors": _student_run_errors,
}


@pytest.fixture(scope="module")
def kernel_runs(request, exported):
    """The kernel runs the selected tests below need, two at a time (each kernel mostly uses one
    core): ``{(slug, test name): future}``; a test reads its own result, or its error."""
    wanted = [(item.callspec.params["chapter"].slug, item.originalname)
              for item in request.session.items
              if item.getparent(pytest.Module) is request.node and item.originalname in KERNEL_RUNS]
    pool = ThreadPoolExecutor(2)
    yield {key: pool.submit(KERNEL_RUNS[key[1]], key[0], exported) for key in wanted}
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_instructor_notebook_passes_every_check(chapter, kernel_runs, request):
    results = kernel_runs[chapter.slug, request.node.originalname].result()
    failed = [f"{r.exercise}: {r.message}" for r in results if not r.passed]
    assert results and not failed, failed


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_untouched_student_notebook_fails_every_check(chapter, kernel_runs, request):
    results = kernel_runs[chapter.slug, request.node.originalname].result()
    assert results and not any(r.passed for r in results)
    assert all("not implemented" in r.message for r in results), [r.message for r in results]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_stubs_keep_every_signature(chapter):
    for solution, stub in _solution_cells(chapter):
        assert labs.function_signatures(stub) == labs.function_signatures(solution)
        assert "raise NotImplementedError" in stub or not labs.function_signatures(solution)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_student_notebook_runs_with_only_not_implemented_errors(chapter, kernel_runs, request):
    errors = kernel_runs[chapter.slug, request.node.originalname].result()
    assert errors, "the untouched exercises should raise NotImplementedError"
    assert set(errors) == {"NotImplementedError"}, errors


def _fingerprints(chapter) -> list[str]:
    """Lines only a solution contains: absent from the student copy and from the library (which
    pages may show with ``show_source``), plus the solution prose."""
    student = labs.export_notebook(read_source(chapter.source), student=True)
    library = [p.read_text(encoding="utf-8") for p in PACKAGE_DIR.rglob("*.py")]
    public = {ln.strip() for text in [c.source for c in student.cells] + library
              for ln in text.splitlines()}
    lines = []
    for solution, _ in _solution_cells(chapter):
        lines += [ln.strip() for ln in solution.splitlines()
                  if len(ln.strip()) >= 20 and ln.strip() not in public]
    text = chapter.source.read_text(encoding="utf-8")
    for block in re.findall(r"\{solution-start\}.*?\n(?:`{3,}|:{3,})\n(.*?)\{solution-end\}",
                            text, re.DOTALL):
        prose = re.sub(r"```\{code-cell\}.*?```", "", block, flags=re.DOTALL)
        lines += [ln.strip() for ln in prose.splitlines() if len(ln.strip()) >= 20
                  and not ln.strip().startswith(("`", ":"))]
    return lines


def _site_text(site) -> str:
    pages = [BeautifulSoup(p.read_text(encoding="utf-8"), "html.parser").get_text()
             for p in site.rglob("*.html")]
    notebooks = [p.read_text(encoding="utf-8") for p in site.rglob("*.ipynb")]
    sources = [p.read_text(encoding="utf-8") for p in site.rglob("*.md")]
    return html.unescape("\n".join(pages + notebooks + sources))


def test_public_book_shows_solutions(built_html):
    text = _site_text(built_html)
    for chapter in CHAPTERS:
        fingerprints = _fingerprints(chapter)
        assert fingerprints and all(f in text or f.replace('"', '\\"') in text
                                    for f in fingerprints[:5])


def test_student_site_leaks_no_solution(student_html):
    text = _site_text(student_html)
    assert "student edition" in text
    for chapter in CHAPTERS:
        leaks = [f for f in _fingerprints(chapter) if f in text or f.replace('"', '\\"') in text]
        assert not leaks, f"{chapter.slug} leaks solution text into the student site: {leaks[:5]}"


def test_stub_source_keeps_signatures_and_docstrings():
    code = ('import math\n\n\n@staticmethod\ndef area(r: float, *, exact=True) -> float:\n'
            '    """Disc area."""\n    def helper():\n        return math.pi\n'
            '    return helper() * r**2\n\n\ndef twice(x):\n    return 2 * x\n\n\n'
            'print(twice(3))\n')
    stub = labs.stub_source(code, "ex-area")
    assert labs.function_signatures(stub) == labs.function_signatures(code)
    assert '"""Disc area."""' in stub and "helper" not in stub and "2 * x" not in stub
    assert stub.count("raise NotImplementedError") == 2 and "print(twice(3))" in stub
    namespace = {}
    with pytest.raises(NotImplementedError, match="exercise ex-area: implement twice"):
        exec(stub, namespace)


@pytest.mark.parametrize("markdown, problem", [
    ("````{solution-start} a\n````\n````{solution-start} b\n````\n", "starts inside"),
    ("````{solution-end}\n````\n", "without a"),
    ("````{solution-start} a\n````\ntext\n", "has no"),
])
def test_malformed_solution_gates_are_refused(markdown, problem):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(markdown)])
    with pytest.raises(labs.LabError, match=problem):
        labs.export_notebook(notebook, student=True)


def test_grading_refuses_a_notebook_that_was_not_exported(tmp_path):
    path = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    grade = grading.grade_submission(CHAPTERS[0].slug, path)
    assert grade.error.startswith("not the lab notebook: this notebook was not exported by")
    assert grade.exercises and not any(e.graded or e.points for e in grade.exercises)
    assert grade.max_total == sum(grading.load_checks(CHAPTERS[0].slug)[e.exercise].points
                                  for e in grade.exercises)


def test_cli_check_exit_code_and_summary(exported, capsys):
    from icml26.toolchain import cli

    slug = CHAPTERS[0].slug
    assert cli.main(["check", slug, str(exported[slug, "instructor"])]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(" passed, 0 failed")
    assert cli.main(["check", slug, str(exported[slug, "student"])]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("0 passed,") and lines[0].startswith("FAIL")
