"""Grading that survives real students: one kernel per submission, limits, points, a gradebook.

Each submission runs in a fresh kernel of its own (nbclient), in a scratch working directory, with
the network refused (the offline socket guard), a wall-clock limit per cell and per submission, and
a memory limit (``RLIMIT_AS``, set inside the kernel before any student code runs). The grader's
process never executes student code: it sends cells, and reads back only what the check cells
display, one result per exercise. Whatever a submission does to its own kernel (an exception, a
syntax error, an endless loop, a memory hog, rebinding ``numpy.allclose``) changes only its own
exercises' results:

* a solution cell that raises fails its exercise with the error's last line and the cell number;
* a cell that runs over its time limit, or a kernel that dies, fails that exercise with the reason;
  the kernel is restarted and the cells that worked are replayed, so later exercises are still
  graded (one that needs a function the failed exercise should have defined says "define f first");
* past the submission's time limit, the remaining exercises fail with that reason.

:func:`grade_folder` grades a class: every file of a folder in parallel, one row per submission
(a file that is not an exported notebook gets a row saying why), written as a CSV gradebook.
"""

from __future__ import annotations

import csv
import json
import os
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

from icml26.toolchain.chapters import find_chapter
from icml26.toolchain.labs import META, LabError, check_files, load_check_module, run_check
from icml26.toolchain.pipeline import PrivateKernelManager, ipc_config, offline_kernel_env

RESULT_MIME = "application/vnd.icml26.check+json"


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
    exercise: str
    passed: bool
    message: str
    points: float
    max_points: float


@dataclass
class SubmissionGrade:
    """One submission's grades; ``error`` says why a file could not be graded at all."""

    file: str
    exercises: list[ExerciseGrade] = field(default_factory=list)
    error: str | None = None

    @property
    def total(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_total(self) -> float:
        return sum(e.max_points for e in self.exercises)


# --- Inside the kernel ---------------------------------------------------------------------


def report_check(label: str, path: str) -> None:
    """Run one exercise's checks on the kernel's namespace and display the result (kernel side)."""
    import __main__  # noqa: I001 - the kernel's namespace, where the student's cells ran

    from IPython.display import display

    result = run_check(Path(path), vars(__main__))
    display({RESULT_MIME: {"exercise": label, "passed": result.passed,
                           "message": result.message},
             "text/plain": f"{'PASS' if result.passed else 'FAIL'} {label}: {result.message}"},
            raw=True)


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
        return f"{error.ename}: {error.evalue}".strip().splitlines()[-1]
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
        self.env = {**offline_kernel_env(), "MPLBACKEND": "Agg"}
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
            reason = ("the kernel died (out of memory?)" if isinstance(error, DeadKernelError)
                      else _error_line(error))
            self.restart()
            return None, reason
        if remember:
            self.replay.append(source)
        return cell, None


def _exercise_plan(notebook: nbformat.NotebookNode,
                   tier: str) -> tuple[list[str], list[tuple[str, list]]]:
    """Setup sources (the parameters cell set to ``tier``), and for each exercise (in check
    order) the numbered solution cells."""
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
            setup.append(source)
        elif role == "solution":
            solutions.setdefault(meta["exercise"], []).append((number, cell.source))
        elif role == "check":
            order.append(meta["exercise"])
    return setup, [(label, solutions.get(label, [])) for label in order]


def _read_submission(path: Path) -> nbformat.NotebookNode:
    try:
        notebook = nbformat.read(path, as_version=4)
    except (json.JSONDecodeError, nbformat.reader.NotJSONError, UnicodeDecodeError) as error:
        raise LabError(f"not a notebook: {_error_line(error)}") from None
    except Exception as error:  # nbformat's validation errors and their kin
        raise LabError(f"not a readable notebook: {_error_line(error)}") from None
    if not any(cell.metadata.get(META) for cell in notebook.cells):
        raise LabError("not a notebook exported by `icml26 export`")
    return notebook


def grade_submission(slug: str, path: Path, tier: str = "smoke",
                     limits: Limits | None = None) -> SubmissionGrade:
    """Grade one submission in its own kernel; never raises for what the submission contains."""
    limits = limits or Limits()
    find_chapter(slug)
    files = check_files(slug)
    grade = SubmissionGrade(Path(path).name)
    try:
        notebook = _read_submission(Path(path))
        setup, plan = _exercise_plan(notebook, tier)
        unknown = [label for label, _ in plan if label not in files]
        if unknown:
            raise LabError(f"exercises {unknown} are not exercises of {slug}")
    except (LabError, OSError) as error:
        grade.error = str(error)
        return grade
    points = {label: float(getattr(load_check_module(files[label]), "points", 1))
              for label, _ in plan}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="icml26-grade-") as scratch, \
            tempfile.TemporaryDirectory(prefix="icml26-kernel-") as sockets:
        session = _Session(limits, Path(scratch), sockets)
        try:
            session.start()
            for source in setup:
                session.run(source)
            for label, cells in plan:
                if time.perf_counter() - start > limits.submission_seconds:
                    message = (f"not graded: the submission ran over its "
                               f"{limits.submission_seconds:g} s limit")
                    grade.exercises.append(ExerciseGrade(label, False, message, 0.0,
                                                         points[label]))
                    continue
                grade.exercises.append(_grade_exercise(session, label, cells, files[label],
                                                       points[label]))
        except (RuntimeError, OSError, TimeoutError) as error:  # the kernel would not start
            grade.error = f"could not run the submission: {_error_line(error)}"
        finally:
            session.stop()
    return grade


def _grade_exercise(session: _Session, label: str, cells: list, check_file: Path,
                    max_points: float) -> ExerciseGrade:
    for number, source in cells:
        _, failure = session.run(source)
        if failure is not None and failure.startswith("NotImplementedError"):
            return ExerciseGrade(label, False, f"not implemented yet (cell {number})", 0.0,
                                 max_points)
        if failure is not None:
            return ExerciseGrade(label, False, f"cell {number} raised {failure}", 0.0, max_points)
    code = (f"from icml26.toolchain.grading import report_check\n"
            f"report_check({label!r}, {str(check_file)!r})")
    cell, failure = session.run(code, remember=False)
    if failure is not None:
        return ExerciseGrade(label, False, f"the check could not run: {failure}", 0.0, max_points)
    results = [o["data"][RESULT_MIME] for o in cell.outputs
               if o.get("output_type") == "display_data" and RESULT_MIME in o.get("data", {})]
    if not results:
        return ExerciseGrade(label, False, "the check reported nothing", 0.0, max_points)
    result = results[-1]
    return ExerciseGrade(label, bool(result["passed"]), str(result["message"]),
                         max_points if result["passed"] else 0.0, max_points)


# --- A class at once ---------------------------------------------------------------------------


def grade_folder(slug: str, folder: Path, *, tier: str = "smoke", limits: Limits | None = None,
                 jobs: int | None = None,
                 report: Callable[[str], None] = print) -> list[SubmissionGrade]:
    """Grade every file in ``folder`` (sorted by name), ``jobs`` at a time (default: half the
    cores, each submission's kernel taking about two)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"no such folder: {folder}")
    find_chapter(slug)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"no submissions in {folder}")
    jobs = jobs or max(1, (os.cpu_count() or 1) // 2)

    def one(path: Path) -> SubmissionGrade:
        grade = grade_submission(slug, path, tier, limits)
        report(f"{path.name}: " + (grade.error or f"{grade.total:g} / {grade.max_total:g}"))
        return grade

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, files))


def write_gradebook(grades: list[SubmissionGrade], target: Path) -> Path:
    """A CSV with one row per submission: each exercise's result, points and message, the total."""
    labels: list[str] = []
    for grade in grades:
        labels += [e.exercise for e in grade.exercises if e.exercise not in labels]
    header = ["file"]
    for label in labels:
        header += [f"{label}", f"{label} points", f"{label} message"]
    header += ["total", "max total", "error"]
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for grade in grades:
            by_label = {e.exercise: e for e in grade.exercises}
            row = [grade.file]
            for label in labels:
                e = by_label.get(label)
                row += ["pass" if e and e.passed else "fail", f"{e.points:g}" if e else "0",
                        e.message if e else ""]
            row += [f"{grade.total:g}", f"{grade.max_total:g}", grade.error or ""]
            writer.writerow(row)
    return target


def summary_table(grades: list[SubmissionGrade]) -> str:
    """The gradebook as a terminal table: submission, points per exercise, total."""
    labels: list[str] = []
    for grade in grades:
        labels += [e.exercise for e in grade.exercises if e.exercise not in labels]
    width = max([len("submission"), *(len(g.file) for g in grades)])
    lines = [f"{'submission':<{width}}  " + "  ".join(labels) + "  total"]
    for grade in grades:
        if grade.error:
            lines.append(f"{grade.file:<{width}}  not graded: {grade.error}")
            continue
        by_label = {e.exercise: e for e in grade.exercises}
        cells = [f"{by_label[label].points:g}/{by_label[label].max_points:g}".rjust(len(label))
                 if label in by_label else "-".rjust(len(label)) for label in labels]
        lines.append(f"{grade.file:<{width}}  " + "  ".join(cells)
                     + f"  {grade.total:g}/{grade.max_total:g}")
    return "\n".join(lines)
