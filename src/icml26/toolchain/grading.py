"""Grading that survives real students: the checks run where the student cannot reach them.

Each submission runs in a fresh kernel of its own (nbclient), in a scratch working directory, with
the network refused (the offline socket guard), a wall-clock limit per cell and per submission, and
a memory limit (``RLIMIT_AS``, set inside the kernel before any student code runs). That kernel
runs only the submission's setup and solution cells and answers requests for values
(:mod:`icml26.toolchain.wire`): call this function on these inputs, what is this name. Answers
come back as data (JSON, arrays as ``.npy``), never pickle, with a size limit and the cell's time
limit. The check files, loaded before any submission starts, run here in the grader's process
(:mod:`icml26.toolchain.checks`): they draw inputs from a grading seed the submission never sees,
compare, and give points and messages. So whatever a submission does to its own kernel (rebinding
the grader's functions or ``numpy.allclose``, an input transformer, a fake result on display, an
answer whose ``__eq__`` always says yes, exiting) can only make its own answers wrong:

* a solution cell that raises fails its exercise with the error's last line and the cell number;
* a cell that runs over its time limit, or a kernel that dies, fails that exercise with the reason;
  the kernel is restarted and the cells that worked are replayed, so later exercises are still
  graded (one that needs a function the failed exercise should have defined says "define f first");
* past the submission's time limit, the remaining exercises fail with that reason.

:func:`grade_folder` grades a class: every file of a folder in parallel, one row per submission
(a file that cannot be graded keeps its row, "not graded", with the reason), written as a CSV
gradebook with a student identifier and a percentage.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import secrets
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from icml26.toolchain.chapters import find_chapter, read_source
from icml26.toolchain.checks import CheckFile, SubmissionError, load_check, run_check, unwrap
from icml26.toolchain.labs import META, LabError, check_files, exercise_labels
from icml26.toolchain.pipeline import PrivateKernelManager, ipc_config, offline_kernel_env
from icml26.toolchain.wire import ANSWER_MIME, DataError, Request, decode


@dataclass(frozen=True)
class Limits:
    """Wall-clock seconds per cell and per submission, and the kernel's address space in MiB."""

    cell_seconds: float = 120.0
    submission_seconds: float = 900.0
    memory_mib: int = 4096

    def __post_init__(self) -> None:
        for name in ("cell_seconds", "submission_seconds", "memory_mib"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class ExerciseGrade:
    """One exercise of one submission; ``graded=False`` when the file could not be graded."""

    exercise: str
    passed: bool
    message: str
    points: float
    max_points: float
    graded: bool = True

    @property
    def status(self) -> str:
        return "not graded" if not self.graded else ("pass" if self.passed else "fail")


@dataclass
class SubmissionGrade:
    """One submission's grades; ``error`` says why a file could not be graded at all (its
    exercises are then listed as not graded, with their maximum points)."""

    file: str
    exercises: list[ExerciseGrade] = field(default_factory=list)
    error: str | None = None
    seed: int | None = None
    student: str = ""

    @property
    def total(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_total(self) -> float:
        return sum(e.max_points for e in self.exercises)

    @property
    def percent(self) -> float:
        return 100.0 * self.total / self.max_total if self.max_total else 0.0


def student_id(file_name: str, slug: str | None = None) -> str:
    """The student's identifier from a submission's file name: the stem without the chapter's
    slug or a ``student``/``submission`` tag (``alice_transductive-online.ipynb`` -> ``alice``)."""
    stem = Path(file_name).stem
    for tag in filter(None, (slug, "student", "submission", "lab")):
        stem = re.sub(rf"(^|[-_ .]){re.escape(tag)}($|[-_ .])", r"\1", stem, flags=re.IGNORECASE)
    return stem.strip("-_ .") or Path(file_name).name


# --- Inside the kernel -------------------------------------------------------------------------


def _memory_cell(limits: Limits) -> str:
    limit = int(limits.memory_mib) * 2**20
    return ("import resource as _resource\n"
            f"_resource.setrlimit(_resource.RLIMIT_AS, ({limit}, {limit}))\n"
            "del _resource")


# --- Running one submission ----------------------------------------------------------------


def _cell(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source)


def _error_line(error: Exception) -> str:
    if isinstance(error, CellExecutionError):
        text = f"{error.ename}: {error.evalue}" if str(error.evalue).strip() else error.ename
        return text.strip().splitlines()[-1]
    return traceback.format_exception_only(error)[-1].strip()


class _Session:
    """A kernel for one submission: runs cells, remembers those that worked, restarts on demand."""

    def __init__(self, limits: Limits, scratch: Path, sockets: str) -> None:
        self.limits = limits
        notebook = nbformat.v4.new_notebook()
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                           "language": "python"}
        self.client = NotebookClient(
            notebook, kernel_name="python3", timeout=limits.cell_seconds, allow_errors=False,
            interrupt_on_timeout=True, kernel_manager_class=PrivateKernelManager,
            config=ipc_config(sockets), resources={"metadata": {"path": str(scratch)}},
            error_on_timeout={"ename": "TimeoutError",
                              "evalue": f"the cell ran over its {limits.cell_seconds:g} s limit"},
        )
        # the grader's own working directory is none of the submission's business
        self.env = {k: v for k, v in offline_kernel_env().items() if k not in ("PWD", "OLDPWD")}
        self.env["MPLBACKEND"] = "Agg"
        self.scratch = scratch
        self.replay: list[str] = []

    def start(self) -> None:
        self.client.km = self.client.create_kernel_manager()
        self.client.start_new_kernel(env=self.env, cwd=str(self.scratch))
        self.client.start_new_kernel_client()
        self._run(_memory_cell(self.limits))

    def stop(self) -> None:
        if self.client.km is not None:
            self.client._cleanup_kernel()

    def restart(self) -> None:
        """A fresh kernel with the limits set and every cell that worked replayed."""
        self.stop()
        self.start()
        for source in self.replay:
            try:
                self._run(source)
            except (CellExecutionError, CellTimeoutError, DeadKernelError):
                continue

    def _run(self, source: str) -> nbformat.NotebookNode:
        cell = _cell(source)
        self.client.nb.cells.append(cell)
        return self.client.execute_cell(cell, len(self.client.nb.cells) - 1)

    def run(self, source: str, remember: bool = True) -> tuple[nbformat.NotebookNode | None,
                                                             str | None]:
        """Execute ``source``; return the cell and, if it failed, why (restarting if needed)."""
        try:
            cell = self._run(source)
        except CellExecutionError as error:
            if error.ename == "TimeoutError":  # interrupted; the kernel may still be stuck
                self.restart()
            return None, _error_line(error)
        except (CellTimeoutError, DeadKernelError) as error:
            reason = ("the kernel died (out of memory, or the code exited it)"
                      if isinstance(error, DeadKernelError) else _error_line(error))
            self.restart()
            return None, reason
        if remember:
            self.replay.append(source)
        return cell, None


class KernelSubmission:
    """A submission's kernel answering the grader's requests (see :mod:`icml26.toolchain.wire`).

    Each request is one cell, ``serve(nonce, request)``, under the cell's time limit; the answer
    is the one display of :data:`ANSWER_MIME` carrying that request's fresh nonce, decoded as data.
    Anything else the cell shows or prints is ignored.
    """

    def __init__(self, session: _Session, deadline: float) -> None:
        self.session, self.deadline = session, deadline

    def ask(self, request: Request) -> object:
        what = request.subject
        if time.perf_counter() > self.deadline:
            raise SubmissionError(f"the submission ran over its "
                                  f"{self.session.limits.submission_seconds:g} s limit")
        nonce = secrets.token_hex(16)
        code = (f"from icml26.toolchain.wire import serve\n"
                f"serve({nonce!r}, {request.pack()!r})")
        cell, failure = self.session.run(code, remember=False)
        if failure is not None:
            raise SubmissionError(f"{what} could not answer: {failure}")
        answers = [output["data"][ANSWER_MIME] for output in cell.outputs
                   if output.get("output_type") == "display_data"
                   and ANSWER_MIME in output.get("data", {})]
        answers = [a for a in answers if isinstance(a, dict) and a.get("nonce") == nonce]
        if len(answers) != 1:
            raise SubmissionError(f"{what} gave {'no' if not answers else 'more than one'} "
                                  "answer (something in the notebook interferes with the check)")
        try:
            return unwrap(what, decode(answers[0].get("answer")))
        except DataError as error:
            raise SubmissionError(f"{what} did not answer with data: {error}") from None


def _exercise_plan(notebook: nbformat.NotebookNode,
                   tier: str) -> tuple[list[tuple[int, str]], list[tuple[str, list]]]:
    """Numbered setup sources (the parameters cell set to ``tier``), and for each exercise (in
    check order) the numbered solution cells."""
    setup, solutions, order = [], {}, []
    for number, cell in enumerate(notebook.cells, start=1):
        meta = cell.metadata.get(META, {})
        if cell.cell_type != "code":
            continue
        role = meta.get("role")
        if role == "setup":
            source = cell.source
            if "parameters" in cell.metadata.get("tags", []):
                source += f"\nTIER = {tier!r}"
            setup.append((number, source))
        elif role == "solution":
            solutions.setdefault(meta.get("exercise"), []).append((number, cell.source))
        elif role == "check":
            order.append(meta.get("exercise"))
    return setup, [(label, solutions.get(label, [])) for label in order]


def _not_a_notebook(path: Path, raw: bytes) -> str:
    """Why ``raw`` is not a notebook, in words a student can act on."""
    text = raw[:4000].decode("utf-8", errors="replace").lstrip()
    if b"\0" in raw[:4000] or raw[:4] in (b"PK\x03\x04", b"%PDF"):
        return ("not a notebook: this is a binary file (a zip, a PDF?); submit the exported "
                ".ipynb")
    if text.startswith("---") and ("jupytext" in text or "{code-cell}" in text):
        return ("not a notebook: this looks like the chapter's Markdown source; submit the "
                "exported .ipynb")
    if text.startswith("{"):
        return ("not a notebook: the file is cut off or damaged (it is not valid JSON); save "
                "the notebook again in Jupyter and resubmit it")
    if not text:
        return "not a notebook: the file is empty"
    return f"not a notebook: {path.name} is not a Jupyter notebook; submit the exported .ipynb"


def _read_submission(path: Path) -> nbformat.NotebookNode:
    raw = path.read_bytes()
    try:
        notebook = nbformat.reads(raw.decode("utf-8"), as_version=4)
    except (json.JSONDecodeError, nbformat.reader.NotJSONError, UnicodeDecodeError):
        raise LabError(_not_a_notebook(path, raw)) from None
    except Exception:  # nbformat's validation errors and their kin
        raise LabError("not a readable notebook: it is JSON but not in Jupyter's notebook "
                       "format; save it again in Jupyter and resubmit it") from None
    if not any(cell.metadata.get(META) for cell in notebook.cells):
        raise LabError("not the lab notebook: this notebook was not exported by `icml26 "
                       "export`; start from the chapter's student notebook")
    return notebook


def load_checks(slug: str) -> dict[str, CheckFile]:
    """Every check of a chapter, in the chapter's exercise order, loaded with their imports."""
    chapter = find_chapter(slug)
    files = check_files(slug)
    order = [label for label in exercise_labels(read_source(chapter.source)) if label in files]
    order += [label for label in files if label not in order]
    return {label: load_check(files[label]) for label in order}


def _forbidden_use(check: CheckFile, cells: list[tuple[int, str]]) -> str | None:
    """Where a function of the submission names one of ``check.forbid``'s library functions."""
    names = {target.rsplit(".", 1)[-1] for target in check.forbid}
    for number, source in cells if names else ():
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(function):
                used = (node.attr if isinstance(node, ast.Attribute) else
                        node.id if isinstance(node, ast.Name) else
                        node.value if isinstance(node, ast.Constant) else None)
                if isinstance(used, str) and used in names:
                    return (f"this exercise asks for your own implementation, but a function in "
                            f"cell {number} uses the library's {used}")
    return None


def grade_submission(slug: str, path: Path, tier: str = "smoke", limits: Limits | None = None,
                     *, seed: int | None = None,
                     checks: dict[str, CheckFile] | None = None) -> SubmissionGrade:
    """Grade one submission in its own kernel; never raises for what the submission contains.

    ``seed`` draws the checks' random inputs (default: a fresh one, kept in the grade);
    ``checks`` are the chapter's loaded checks (default: :func:`load_checks`, before any kernel
    starts).
    """
    limits = limits or Limits()
    checks = load_checks(slug) if checks is None else checks
    seed = secrets.randbits(32) if seed is None else seed
    grade = SubmissionGrade(Path(path).name, seed=seed, student=student_id(Path(path).name, slug))

    def not_graded(reason: str) -> SubmissionGrade:
        grade.error = reason
        grade.exercises = [ExerciseGrade(label, False, "not graded", 0.0, check.points, False)
                           for label, check in checks.items()]
        return grade

    try:
        notebook = _read_submission(Path(path))
        setup, plan = _exercise_plan(notebook, tier)
        unknown = [label for label, _ in plan if label not in checks]
        if unknown:
            raise LabError(f"exercises {unknown} are not exercises of {slug}: was this notebook "
                           "exported for another chapter?")
    except (LabError, OSError) as error:
        return not_graded(str(error))
    planned = {label for label, _ in plan}
    plan += [(label, []) for label in checks if label not in planned]  # check cells deleted
    runnable = setup + [cell for _, cells in plan for cell in cells]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="icml26-grade-") as scratch, \
            tempfile.TemporaryDirectory(prefix="icml26-kernel-") as sockets:
        session = _Session(limits, Path(scratch), sockets)
        submission = KernelSubmission(session, start + limits.submission_seconds)
        try:
            session.start()
            for _, source in setup:
                session.run(source)
            for label, cells in plan:
                check = checks[label]
                if time.perf_counter() - start > limits.submission_seconds:
                    message = (f"not graded: the submission ran over its "
                               f"{limits.submission_seconds:g} s limit")
                    grade.exercises.append(ExerciseGrade(label, False, message, 0.0,
                                                         check.points))
                    continue
                grade.exercises.append(_grade_exercise(session, submission, check, cells,
                                                       runnable, seed))
        except (RuntimeError, OSError, TimeoutError) as error:  # the kernel would not start
            return not_graded(f"the grader could not run a kernel: {_error_line(error)}")
        finally:
            session.stop()
    return grade


def _grade_exercise(session: _Session, submission: KernelSubmission, check: CheckFile,
                    cells: list, runnable: list[tuple[int, str]], seed: int) -> ExerciseGrade:
    def failed(message: str) -> ExerciseGrade:
        return ExerciseGrade(check.label, False, message, 0.0, check.points)

    for number, source in cells:
        _, failure = session.run(source)
        if failure is not None and failure.startswith("NotImplementedError"):
            return failed(f"not implemented yet (cell {number})")
        if failure is not None:
            return failed(f"cell {number} raised {failure}")
    if (misuse := _forbidden_use(check, runnable)) is not None:
        return failed(misuse)
    result = run_check(check, submission, seed)
    return ExerciseGrade(check.label, result.passed, result.message,
                         check.points if result.passed else 0.0, check.points)


# --- A class at once ---------------------------------------------------------------------------


def grade_folder(slug: str, folder: Path, *, tier: str = "smoke", limits: Limits | None = None,
                 jobs: int | None = None, seed: int | None = None,
                 report: Callable[[str], None] = print) -> list[SubmissionGrade]:
    """Grade every file in ``folder`` (sorted by name), ``jobs`` at a time (default: half the
    cores, each submission's kernel taking about two). The checks are loaded once, before any
    submission runs; every submission gets its own grading seed unless ``seed`` is given."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"no such folder: {folder}")
    checks = load_checks(slug)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"no submissions in {folder}")
    jobs = jobs or max(1, (os.cpu_count() or 1) // 2)

    def one(path: Path) -> SubmissionGrade:
        grade = grade_submission(slug, path, tier, limits, seed=seed, checks=checks)
        report(f"{path.name}: " + (f"not graded: {grade.error}" if grade.error else
                                   f"{grade.total:g} / {grade.max_total:g}"))
        return grade

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, files))


def _labels(grades: list[SubmissionGrade]) -> list[str]:
    labels: list[str] = []
    for grade in grades:
        labels += [e.exercise for e in grade.exercises if e.exercise not in labels]
    return labels


def write_gradebook(grades: list[SubmissionGrade], target: Path) -> Path:
    """A CSV with one row per submission: the student, each exercise's result, points and
    message, the total, the maximum, the percentage, the grading seed and any note."""
    labels = _labels(grades)
    header = ["student", "file"]
    for label in labels:
        header += [f"{label}", f"{label} points", f"{label} message"]
    header += ["total", "max total", "percent", "grading seed", "note"]
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for grade in grades:
            by_label = {e.exercise: e for e in grade.exercises}
            row = [grade.student, grade.file]
            for label in labels:
                e = by_label.get(label)
                row += [e.status, f"{e.points:g}", e.message] if e else ["", "", ""]
            row += [f"{grade.total:g}", f"{grade.max_total:g}", f"{grade.percent:.1f}",
                    "" if grade.seed is None else str(grade.seed),
                    f"not graded: {grade.error}" if grade.error else ""]
            writer.writerow(row)
    return target


def summary_table(grades: list[SubmissionGrade]) -> str:
    """The gradebook as a terminal table: student, points per exercise, total, percentage."""
    labels = _labels(grades)
    width = max([len("student"), *(len(g.student) for g in grades)])
    lines = [f"{'student':<{width}}  " + "  ".join(labels) + "  total      %"]
    for grade in grades:
        by_label = {e.exercise: e for e in grade.exercises}
        cells = [(f"{by_label[label].points:g}/{by_label[label].max_points:g}"
                  if by_label[label].graded else "-").rjust(len(label))
                 if label in by_label else "".rjust(len(label)) for label in labels]
        line = (f"{grade.student:<{width}}  " + "  ".join(cells)
                + f"  {grade.total:g}/{grade.max_total:g}".ljust(8) + f"{grade.percent:5.1f}")
        if grade.error:
            line += f"  not graded: {grade.error}"
        lines.append(line)
    return "\n".join(lines)
