"""The book's execution pipeline: MyST sources -> executed notebooks -> strict HTML build.

Each chapter (``book/chapters/<slug>.md``) is converted with jupytext and executed with papermill,
which injects ``TIER`` and ``SEED`` after the cell tagged ``parameters``. Executed notebooks are
cached under a key that hashes everything the result depends on: the chapter source, the
``icml26`` modules it imports (followed transitively), the pinned environment and the parameters.
Jupyter Book then renders the executed copies with execution off and warnings as errors.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as dt
import filecmp
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import jupytext
import nbformat
import papermill
import yaml
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from papermill.exceptions import PapermillExecutionError

from icml26.core import check_tier
from icml26.toolchain import ledger
from icml26.toolchain.chapters import (
    CHAPTER_DIR,
    PACKAGE_DIR,
    ROOT,
    Chapter,
    PipelineError,
    RunRecord,
    chapters,
    find_chapter,
    read_source,
)
from icml26.toolchain.labs import export_notebook

LOCK_FILE = ROOT / "requirements" / "lock.txt"
PIPELINE_VERSION = "3"  # bump to invalidate every cached notebook
STATUS_TABLE = "book/appendix/_status_table.md"  # written by the build, included by status.md


# --- Cache keys -----------------------------------------------------------------------------


def _code_cells(source: Path) -> str:
    notebook = read_source(source)
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")


def _imported_icml26_modules(code: str, package: str | None = None) -> set[str]:
    """Names of ``icml26`` modules imported by ``code`` (``package`` resolves relative imports)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # IPython magics: keep the import lines only
        lines = [ln for ln in code.splitlines() if re.match(r"\s*(from|import)\s", ln)]
        tree = ast.parse("\n".join(line.strip() for line in lines))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and package:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name == "icml26" or name.startswith("icml26.")}


def _module_file(name: str) -> Path | None:
    relative = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / relative / "__init__.py", PACKAGE_DIR / f"{relative}.py"):
        if candidate.is_file():
            return candidate
    return None  # a name imported from a module, not a module itself


def module_closure(code: str) -> list[Path]:
    """Files of every ``icml26`` module that ``code`` imports, directly or through other modules."""
    pending = _imported_icml26_modules(code) | {"icml26"}
    files: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        file = _module_file(name)
        if file is None or name in files:
            continue
        files[name] = file
        package = name if file.name == "__init__.py" else name.rsplit(".", 1)[0]
        pending |= _imported_icml26_modules(file.read_text(encoding="utf-8"), package) - set(files)
    return sorted(files.values())


def cache_key(chapter: Chapter, tier: str, seed: int) -> str:
    """Hash of the chapter source, its ``icml26`` modules, the pins and the parameters."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    add("pipeline", PIPELINE_VERSION.encode())
    add("python", platform.python_version().encode())
    add("chapter", chapter.source.read_bytes())
    add("lock", LOCK_FILE.read_bytes() if LOCK_FILE.exists() else b"")
    add("parameters", json.dumps({"TIER": tier, "SEED": seed}).encode())
    for file in module_closure(_code_cells(chapter.source)):
        add(str(file.relative_to(PACKAGE_DIR)), file.read_bytes())
    return digest.hexdigest()


# --- Execution ------------------------------------------------------------------------------


@contextlib.contextmanager
def _offline_kernel_environment() -> Iterator[None]:
    """Environment inherited by the kernel: the socket guard on PYTHONPATH, hubs offline, and
    OpenMP threads that sleep instead of spinning while they wait."""
    guard = str(Path(__file__).resolve().parent / "offline_guard")
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [guard, saved.get("PYTHONPATH")]))
    os.environ.update({"ICML26_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see icml26/__init__.py
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def validate_parameters(tier: str, seed: object) -> int:
    """Check ``tier`` and ``seed`` from the command line or a caller; return the seed as int."""
    check_tier(tier)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


def execute_notebook(source: Path, output: Path, tier: str, seed: int, label: str = "") -> float:
    """Execute a MyST or ipynb notebook with papermill; return its wall-clock seconds.

    A cell that raises becomes a :class:`PipelineError` naming the notebook and the cell.
    """
    notebook = read_source(source)
    if not any("parameters" in cell.metadata.get("tags", []) for cell in notebook.cells):
        raise PipelineError(f"{label or source}: no cell is tagged 'parameters'")
    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with _offline_kernel_environment():
            papermill.execute_notebook(
                notebook, str(output), parameters={"TIER": tier, "SEED": seed},
                kernel_name="python3", language="python", cwd=str(source.parent),
                progress_bar=False, request_save_on_cell_execute=False,
            )
    except PapermillExecutionError as error:
        first_line = next((ln for ln in error.source.splitlines() if ln.strip()), "")
        cell = _source_cell_number(output, error.cell_index)
        raise PipelineError(
            f"{label or source}: cell {cell} of the source "
            f"(starting {first_line!r}) raised {error.ename}: {error.evalue}"
        ) from None
    except (DeadKernelError, CellTimeoutError) as error:
        message = f"{label or source}: the kernel stopped ({error}); out of memory?"
        raise PipelineError(message) from None
    seconds = time.perf_counter() - start
    _record_input_path(output, source)
    return seconds


def _record_input_path(executed: Path, source: Path) -> None:
    """Papermill stores an in-memory input notebook whole; keep only the source's path."""
    notebook = nbformat.read(executed, as_version=4)
    notebook.metadata["papermill"]["input_path"] = str(source)
    nbformat.write(notebook, executed)


def _source_cell_number(executed: Path, cell_index: int) -> int:
    """1-based number of a cell in the source, discounting the cell papermill injected."""
    cells = nbformat.read(executed, as_version=4).cells
    tags = [cell.metadata.get("tags", []) for cell in cells]
    injected = [i for i, cell_tags in enumerate(tags) if "injected-parameters" in cell_tags]
    return cell_index + 1 - sum(i < cell_index for i in injected)


def count_claims(notebook_path: Path) -> dict[str, int]:
    """Checks an executed notebook displays, per kind (see ``icml26.claims``)."""
    return ledger.count_kinds(ledger.chapter_rows(notebook_path))


def cache_dir(out_root: Path = ROOT) -> Path:
    return out_root / "_build" / "cache"


def run_chapter(
    chapter: Chapter, tier: str, seed: int, output: Path, *, use_cache: bool = True,
    cache: Path | None = None,
) -> RunRecord:
    """Execute ``chapter`` into ``output`` (an ``.ipynb``), reusing a cached run when valid."""
    seed = validate_parameters(tier, seed)
    key = cache_key(chapter, tier, seed)
    cache = cache or cache_dir()
    cached_notebook = cache / f"{chapter.slug}-{tier}-{key[:20]}.ipynb"
    cached_record = cached_notebook.with_suffix(".json")
    output.parent.mkdir(parents=True, exist_ok=True)
    if use_cache and cached_notebook.exists() and cached_record.exists():
        _copy_if_changed(cached_notebook, output)
        record = RunRecord(**json.loads(cached_record.read_text()))
        record.cached = True
        return record
    seconds = execute_notebook(chapter.source, output, tier, seed, label=f"chapter {chapter.slug}")
    finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    record = RunRecord(chapter.slug, tier, seed, round(seconds, 2), count_claims(output), False,
                       key, finished)
    cache.mkdir(parents=True, exist_ok=True)
    for stale in cache.glob(f"{chapter.slug}-{tier}-*"):
        stale.unlink()
    shutil.copyfile(output, cached_notebook)
    cached_record.write_text(json.dumps(asdict(record), indent=1))
    return record


# --- Run history ----------------------------------------------------------------------------


def _history_file(out_root: Path) -> Path:
    return out_root / "_build" / "runs.json"


def load_history(out_root: Path = ROOT) -> dict[str, dict[str, dict]]:
    """The last run of every chapter and tier: ``{slug: {tier: record}}``."""
    path = _history_file(out_root)
    return json.loads(path.read_text()) if path.exists() else {}


def save_history(records: list[RunRecord], out_root: Path = ROOT) -> None:
    history = load_history(out_root)
    for record in records:
        history.setdefault(record.slug, {})[record.tier] = asdict(record)
    path = _history_file(out_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history, indent=1, sort_keys=True))


def _claims_summary(claims: dict[str, int]) -> str:
    return f"{claims['paper']} / {claims['finding']} / {claims['verification']}"


def summary_table(records: list[RunRecord], chapter_list: list[Chapter]) -> str:
    """A Markdown table: chapter, part, tier, seed, seconds, checks per kind, cache use."""
    parts = {c.slug: c.part for c in chapter_list}
    rows = ["| chapter | part | tier | seed | seconds | paper / finding / verification | executed |",
            "|---|---|---|---|---|---|---|"]
    for r in records:
        when = f"{r.finished[:10]} (cached)" if r.cached else r.finished[:10]
        rows.append(f"| [{r.slug}](../chapters/{r.slug}) | {parts.get(r.slug, '')} | {r.tier} | "
                    f"{r.seed} | {r.seconds:.1f} | {_claims_summary(r.claims)} | {when} |")
    return "\n".join(rows) + "\n"


# --- The book -------------------------------------------------------------------------------


def _copy_if_changed(source: Path, target: Path) -> None:
    """Copy only when contents differ, so Sphinx's incremental build sees no change otherwise."""
    if target.exists() and filecmp.cmp(source, target, shallow=False):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def _write_if_changed(target: Path, text: str) -> None:
    if target.exists() and target.read_text(encoding="utf-8") == text:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def stage_sources(stage: Path, chapter_list: list[Chapter], root: Path = ROOT) -> None:
    """Mirror the book's sources into ``stage``, leaving out chapter sources (executed instead)."""
    skip = {c.source.resolve() for c in chapter_list}
    sources = [root / "_config.yml", root / "_toc.yml"]
    sources += [p for p in sorted((root / "book").rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts and p.resolve() not in skip]
    wanted = {source.relative_to(root) for source in sources}
    for source in sources:
        _copy_if_changed(source, stage / source.relative_to(root))
    generated = {Path(CHAPTER_DIR) / f"{c.slug}.ipynb" for c in chapter_list}
    generated |= {Path(STATUS_TABLE), Path(ledger.LEDGER_TABLE)}
    for path in [p for p in stage.rglob("*") if p.is_file()]:
        if path.relative_to(stage) not in wanted | generated:
            path.unlink()


def render_html(stage: Path, out_root: Path) -> Path:
    """Run Jupyter Book on the staged, executed sources: strict, nitpicky, keep going."""
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book), "build", str(stage),
               "--path-output", str(out_root), "--warningiserror", "--nitpick", "--keep-going"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log = (result.stdout + result.stderr).strip().splitlines()
        problems = [ln for ln in log if "WARNING" in ln or "ERROR" in ln] or log[-30:]
        raise PipelineError("Jupyter Book build failed:\n" + "\n".join(problems))
    return out_root / "_build" / "html"


def student_html_dir(out_root: Path = ROOT) -> Path:
    """Where the student edition (solutions removed) is rendered."""
    return out_root / "_build" / "student" / "_build" / "html"


def _make_student_edition(stage: Path, selected: list[Chapter]) -> None:
    """Strip solutions from the staged notebooks and turn on sphinx-exercise's hide_solutions."""
    for chapter in selected:
        path = stage / CHAPTER_DIR / f"{chapter.slug}.ipynb"
        student = export_notebook(nbformat.read(path, as_version=4), student=True)
        _write_if_changed(path, nbformat.writes(student))
    config = yaml.safe_load((stage / "_config.yml").read_text(encoding="utf-8"))
    config["title"] += " (student edition)"
    config.setdefault("sphinx", {}).setdefault("config", {})["hide_solutions"] = True
    _write_if_changed(stage / "_config.yml", yaml.safe_dump(config, sort_keys=False))


def build(
    tier: str = "book", seed: int = 0, *, out_root: Path = ROOT, use_cache: bool = True,
    student: bool = False, report: Callable[[str], None] = print,
) -> list[RunRecord]:
    """Execute every chapter at ``tier`` and render the book into ``out_root/_build/html``.

    With ``student=True`` the same executed chapters, with every exercise solution removed, are
    rendered into :func:`student_html_dir` instead.
    """
    validate_parameters(tier, seed)
    selected = chapters()
    stage = out_root / "_build" / ("student-stage" if student else "stage")
    records = []
    total = time.perf_counter()
    for index, chapter in enumerate(selected, start=1):
        report(f"[{index}/{len(selected)}] {chapter.slug}: executing at {tier} tier, seed {seed}")
        record = run_chapter(chapter, tier, seed, stage / CHAPTER_DIR / f"{chapter.slug}.ipynb",
                             use_cache=use_cache, cache=cache_dir(out_root))
        source = "cache" if record.cached else "fresh run"
        report(f"[{index}/{len(selected)}] {chapter.slug}: {record.seconds:.1f} s ({source}), "
               f"checks (paper / finding / verification): {_claims_summary(record.claims)}")
        records.append(record)
    save_history(records, out_root)
    table = summary_table(records, selected)
    stage_sources(stage, selected)
    _write_if_changed(stage / STATUS_TABLE, table)
    book_ledger = {c.slug: {"title": c.title, "tier": tier, "seed": seed,
                            "rows": ledger.chapter_rows(stage / CHAPTER_DIR / f"{c.slug}.ipynb")}
                   for c in selected}
    _write_if_changed(stage / ledger.LEDGER_TABLE, ledger.ledger_markdown(book_ledger))
    if not student:
        ledger.save_ledger(book_ledger, out_root)
    if student:
        _make_student_edition(stage, selected)
    edition = "student edition" if student else "book"
    report(f"rendering the {edition} with Jupyter Book (-n -W --keep-going)")
    html = render_html(stage, out_root / "_build" / "student" if student else out_root)
    report(table)
    report(f"{edition} built in {time.perf_counter() - total:.1f} s: {html / 'index.html'}")
    return records
