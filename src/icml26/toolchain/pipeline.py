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
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import nbformat
import papermill
import yaml
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from papermill.exceptions import PapermillExecutionError
from traitlets.config import Config

from icml26 import claims
from icml26.core import check_tier
from icml26.toolchain import failures, ledger, pages
from icml26.toolchain.chapters import (
    CHAPTER_DIR,
    PACKAGE_DIR,
    ROOT,
    Chapter,
    PipelineError,
    chapters,
    find_chapter,
    read_source,
)
from icml26.toolchain.labs import export_notebook

LOCK_FILE = ROOT / "requirements" / "lock.txt"
NODEPS_FILE = ROOT / "requirements" / "nodeps.txt"  # data packages, installed without deps
DATA_DIR = ROOT / "data"
PIPELINE_VERSION = "4"  # bump to invalidate every cached notebook
CACHE_RUNS_PER_CHAPTER = 8  # cached runs kept per chapter (seeds and tiers), least recent out
STATUS_TABLE = "book/appendix/_status_table.md"  # written by the build, included by status.md


@dataclass
class RunRecord:
    """One chapter's execution: when, how long, its checks per kind, and its error if it failed."""

    slug: str
    tier: str
    seed: int
    seconds: float
    claims: dict[str, int]  # checks displayed, per kind (see icml26.claims)
    cached: bool
    key: str
    finished: str
    error: str | None = field(default=None)


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


def data_files(texts: list[str]) -> list[Path]:
    """The data files (``data/``, not its README or scripts) whose names ``texts`` mention."""
    if not DATA_DIR.is_dir():
        return []
    files = [p for p in sorted(DATA_DIR.iterdir())
             if p.is_file() and p.suffix not in (".md", ".py") and not p.name.startswith(".")]
    return [p for p in files if any(p.name in text for text in texts)]


def cache_key(chapter: Chapter, tier: str, seed: int) -> str:
    """Hash of the chapter source, its ``icml26`` modules, the data files they read (by
    content), the pins and the parameters."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    add("pipeline", PIPELINE_VERSION.encode())
    add("python", platform.python_version().encode())
    add("chapter", chapter.source.read_bytes())
    for label, pins in (("lock", LOCK_FILE), ("nodeps", NODEPS_FILE)):
        add(label, pins.read_bytes() if pins.exists() else b"")
    add("parameters", json.dumps({"TIER": tier, "SEED": seed}).encode())
    code = _code_cells(chapter.source)
    modules = module_closure(code)
    for file in modules:
        add(str(file.relative_to(PACKAGE_DIR)), file.read_bytes())
    texts = [code, *(file.read_text(encoding="utf-8") for file in modules)]
    for file in data_files(texts):
        add(f"data/{file.name}", file.read_bytes())
    return digest.hexdigest()


# --- Execution ------------------------------------------------------------------------------


def offline_kernel_env() -> dict[str, str]:
    """The environment a chapter's or a submission's kernel runs in: this process's, plus the
    socket guard on PYTHONPATH, hubs offline, and OpenMP threads that sleep instead of spinning
    while they wait."""
    guard = str(Path(__file__).resolve().parent / "offline_guard")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [guard, env.get("PYTHONPATH")]))
    env.update({"ICML26_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see icml26/__init__.py
    return env


@contextlib.contextmanager
def _offline_kernel_environment() -> Iterator[None]:
    """:func:`offline_kernel_env` in ``os.environ`` while papermill starts the kernel."""
    saved = dict(os.environ)
    os.environ.update(offline_kernel_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class PrivateKernelManager(AsyncKernelManager):
    """Starts :mod:`icml26.toolchain.kernel` (ipykernel without its TCP pipe) instead of
    ``ipykernel_launcher``; with the IPC transport the kernel opens no TCP port."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        command = super().format_kernel_cmd(extra_arguments)
        return ["icml26.toolchain.kernel" if part == "ipykernel_launcher" else part
                for part in command]


def ipc_config(socket_dir: str) -> Config:
    """Kernel channels as Unix sockets in ``socket_dir`` (a fresh directory only we can enter)."""
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(Path(socket_dir) / "kernel")
    return config


def validate_parameters(tier: str, seed: object) -> int:
    """Check ``tier`` and ``seed`` from the command line or a caller; return the seed as int."""
    check_tier(tier)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


def execute_notebook(
    source: Path, output: Path, tier: str, seed: int, label: str = "") -> float:
    """Execute a MyST or ipynb notebook with papermill; return its wall-clock seconds.

    The kernel talks over Unix sockets in a private directory (no TCP port) and keeps the
    chapter's own thread count (``configure_threads``), however many notebooks run at once, so
    a run's numbers do not depend on how it was scheduled. A cell that raises becomes a
    :class:`PipelineError` naming the notebook and the cell.
    """
    notebook = read_source(source)
    if not any("parameters" in cell.metadata.get("tags", []) for cell in notebook.cells):
        raise PipelineError(f"{label or source}: no cell is tagged 'parameters'")
    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with _offline_kernel_environment(), tempfile.TemporaryDirectory() as sockets:
            papermill.execute_notebook(
                notebook, str(output), parameters={"TIER": tier, "SEED": seed},
                kernel_name="python3", language="python", cwd=str(source.parent),
                progress_bar=False, request_save_on_cell_execute=False,
                # every output is in once the last cell ends; a graceful shutdown would add
                # about 3 s of waiting for the kernel to exit to every chapter's time
                shutdown_kernel="immediate",
                kernel_manager_class=PrivateKernelManager, config=ipc_config(sockets),
            )
    except PapermillExecutionError as error:
        first_line = next((ln for ln in error.source.splitlines() if ln.strip()), "")
        cell = _source_cell_number(output, error.cell_index)
        partial = nbformat.read(output, as_version=4)
        line = _source_line(source, failures.failing_code_cell(partial))
        where = f" (line {line} of {source.name})" if line else ""
        raise failures.ChapterError(
            f"{label or source}: cell {cell} of the source{where} "
            f"(starting {first_line!r}) raised {error.ename}: {error.evalue}",
            output.read_bytes(), line,
        ) from None
    except (DeadKernelError, CellTimeoutError) as error:
        message = f"{label or source}: the kernel stopped ({error}); out of memory?"
        raise failures.ChapterError(message) from None
    seconds = time.perf_counter() - start
    _record_input_path(output, source)
    return seconds


def _source_line(source: Path, code_cell: int | None) -> int | None:
    """The line of a MyST ``source`` where its ``code_cell``-th code cell starts (None for a
    plain notebook or an unknown cell)."""
    if code_cell is None or source.suffix != ".md":
        return None
    try:
        return failures.code_cell_line(source, code_cell)
    except ValueError:
        return None


def _record_input_path(executed: Path, source: Path) -> None:
    """Papermill stores an in-memory input notebook whole; keep only the source's path."""
    notebook = nbformat.read(executed, as_version=4)
    notebook.metadata["papermill"]["input_path"] = str(source)
    nbformat.write(notebook, executed)


def _source_cell_number(executed: Path, cell_index: int) -> int:
    """1-based number of a cell in the source, discounting the cells papermill added: the
    injected parameters, and the error banners it writes after execution (which shift indices)."""
    cells = [cell for cell in nbformat.read(executed, as_version=4).cells
             if "papermill-error-cell-tag" not in cell.metadata.get("tags", [])]
    injected = [i for i, cell in enumerate(cells)
                if "injected-parameters" in cell.metadata.get("tags", [])]
    return cell_index + 1 - sum(i < cell_index for i in injected)


def count_claims(notebook_path: Path) -> dict[str, int]:
    """Checks an executed notebook displays, per kind (see ``icml26.claims``)."""
    return ledger.count_kinds(ledger.chapter_rows(notebook_path))


def cache_dir(out_root: Path = ROOT) -> Path:
    return out_root / "_build" / "cache"


def _cached_notebook(chapter: Chapter, tier: str, key: str, cache: Path) -> Path:
    return cache / f"{chapter.slug}-{tier}-{key[:20]}.ipynb"


def cached_run(chapter: Chapter, tier: str, seed: int, output: Path,
               cache: Path) -> RunRecord | None:
    """Copy a valid cached run of ``chapter`` to ``output`` and return its record, or None."""
    key = cache_key(chapter, tier, seed)
    notebook = _cached_notebook(chapter, tier, key, cache)
    record_file = notebook.with_suffix(".json")
    if not (notebook.exists() and record_file.exists()):
        return None
    _copy_if_changed(notebook, output)
    record = RunRecord(**json.loads(record_file.read_text()))
    record.cached = True
    os.utime(record_file)  # recently used: evicted last
    return record


def failed_record(chapter: Chapter, tier: str, seed: int, seconds: float,
                  error: str) -> RunRecord:
    """The record of a run of ``chapter`` that failed with ``error`` (never cached)."""
    finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return RunRecord(chapter.slug, tier, seed, round(seconds, 2), ledger.count_kinds([]), False,
                     "", finished, error)


def store_run(chapter: Chapter, tier: str, seed: int, output: Path, seconds: float,
              cache: Path) -> RunRecord:
    """Record a fresh execution in ``output`` and keep a copy in the cache."""
    key = cache_key(chapter, tier, seed)
    finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    record = RunRecord(chapter.slug, tier, seed, round(seconds, 2), count_claims(output), False,
                       key, finished)
    cache.mkdir(parents=True, exist_ok=True)
    cached = _cached_notebook(chapter, tier, key, cache)
    shutil.copyfile(output, cached)
    cached.with_suffix(".json").write_text(json.dumps(asdict(record), indent=1))
    _evict(chapter, cache)
    return record


def _evict(chapter: Chapter, cache: Path, keep: int | None = None) -> None:
    """Keep the ``keep`` (default :data:`CACHE_RUNS_PER_CHAPTER`) most recently used runs of
    ``chapter``, over every tier and seed; remove the rest."""
    keep = CACHE_RUNS_PER_CHAPTER if keep is None else keep
    pattern = re.compile(rf"{re.escape(chapter.slug)}-[a-z]+-[0-9a-f]{{20}}\.json")
    records = [p for p in cache.glob(f"{chapter.slug}-*.json") if pattern.fullmatch(p.name)]
    records.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for stale in records[keep:]:
        stale.with_suffix(".ipynb").unlink(missing_ok=True)
        stale.unlink()


def run_chapter(
    chapter: Chapter, tier: str, seed: int, output: Path, *, use_cache: bool = True,
    cache: Path | None = None,
) -> RunRecord:
    """Execute ``chapter`` into ``output`` (an ``.ipynb``), reusing a cached run when valid.

    A failure raises :class:`~icml26.toolchain.failures.ChapterError`; ``output`` then holds the
    notebook as far as it executed, when the kernel wrote one."""
    seed = validate_parameters(tier, seed)
    cache = cache or cache_dir()
    output.parent.mkdir(parents=True, exist_ok=True)
    if use_cache and (record := cached_run(chapter, tier, seed, output, cache)):
        return record
    output.unlink(missing_ok=True)  # after a failure, what is there is the partial notebook
    seconds = execute_notebook(chapter.source, output, tier, seed, label=f"chapter {chapter.slug}")
    return store_run(chapter, tier, seed, output, seconds, cache)


def execute_chapter_task(slug: str, tier: str, seed: int,
                         root: str | None = None) -> tuple[float, bytes]:
    """Execute one chapter of the book at ``root`` (default: this checkout); return its seconds
    and the executed notebook.

    This is what a worker runs, in a process pool or on a Dask worker with its own checkout and
    the same environment; the caller keeps the cache and the staged book.
    """
    chapter = find_chapter(slug, Path(root) if root else ROOT)
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / f"{slug}.ipynb"
        seconds = execute_notebook(chapter.source, output, tier, seed, label=f"chapter {slug}")
        return seconds, output.read_bytes()


# --- Run history ----------------------------------------------------------------------------


def _history_file(out_root: Path) -> Path:
    return out_root / "_build" / "runs.json"


def load_history(out_root: Path = ROOT) -> dict[str, dict[str, dict]]:
    """The last run of every chapter and tier, failed or not: ``{slug: {tier: record}}``."""
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


def summary_table(records: list[RunRecord], chapter_list: list[Chapter],
                  book_ledger: dict[str, dict] | None = None) -> str:
    """A Markdown table (chapter, part, tier, seed, seconds, checks per kind, unexpected verdicts,
    cache use), then failures and unexpected verdicts, each listed in full."""
    parts = {c.slug: c.part for c in chapter_list}
    book_ledger = book_ledger or {}
    rows = ["| chapter | part | tier | seed | seconds | paper / finding / verification "
            "| unexpected | executed |",
            "|---|---|---|---|---|---|---|---|"]
    for r in records:
        when = f"{r.finished[:10]} (cached)" if r.cached else r.finished[:10]
        if r.error:
            when = "**FAILED** (below)"
        unexpected = ledger.count_verdicts(book_ledger.get(r.slug, {}).get("rows", []))
        rows.append(f"| [{r.slug}](../chapters/{r.slug}) | {parts.get(r.slug, '')} | {r.tier} | "
                    f"{r.seed} | {r.seconds:.1f} | {_claims_summary(r.claims)} | "
                    f"{unexpected['unexpected']} | {when} |")
    failed = [r for r in records if r.error]
    if failed:
        rows += ["", "**Failed chapters**", ""]
        rows += [f"- [{r.slug}](../chapters/{r.slug}): {_one_line(r.error)}" for r in failed]
    surprises = ledger.unexpected_rows(book_ledger)
    if surprises:
        rows += ["", "**Unexpected verdicts** (the chapter rendered; the strict build fails)", ""]
        rows += [f"- [{slug}](../chapters/{slug}): {row['verdict']}, expected {row['expected']}: "
                 f"{_one_line(row['statement'])}" for slug, row in surprises]
    return "\n".join(rows) + "\n"


def _one_line(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("*", "\\*")


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
        relative = path.relative_to(stage)
        if relative not in wanted | generated and relative.parent != Path(ledger.FOREST_DIR):
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


def default_jobs() -> int:
    """Chapters executed at once by default: one per two cores, and two from two cores up (most
    chapters keep one core busy, so a second chapter fills the other)."""
    cores = os.cpu_count() or 1
    return max(min(cores, 2), cores // 2)


def validate_jobs(jobs: object) -> int:
    """``jobs`` as a positive integer, else a ``ValueError`` that says what was wrong."""
    given = jobs
    if isinstance(jobs, str):
        jobs = int(jobs) if jobs.strip().isdigit() else None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {given!r}")
    return jobs


def environment_fingerprint(root: Path = ROOT) -> dict[str, str]:
    """What a run depends on besides its chapter: the commit of the book at ``root``, its pins
    (``requirements/lock.txt`` and ``nodeps.txt``), the Python version and the imported
    ``icml26`` source (every module, by content)."""
    source = hashlib.sha256()
    for file in sorted(PACKAGE_DIR.rglob("*.py")):
        if "__pycache__" not in file.parts:
            source.update(str(file.relative_to(PACKAGE_DIR)).encode() + b"\0"
                          + hashlib.sha256(file.read_bytes()).digest())
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=False,
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    pins = b"".join(path.read_bytes() for path in (root / "requirements" / "lock.txt",
                                                  root / "requirements" / "nodeps.txt")
                    if path.exists())
    return {"commit": commit or "unknown", "python": platform.python_version(),
            "pins": hashlib.sha256(pins).hexdigest(), "icml26 source hash": source.hexdigest()}


def check_workers(client, root: Path = ROOT) -> None:
    """Refuse a Dask cluster any of whose workers (each with its own checkout) runs another
    environment than this process building ``root`` (:func:`environment_fingerprint`): a
    one-line :class:`PipelineError` naming the difference."""
    here = environment_fingerprint(root)
    workers = client.run(environment_fingerprint)
    if not workers:
        raise PipelineError("the Dask cluster has no workers")
    for address, theirs in sorted(workers.items()):
        differences = [f"{name} ({str(theirs.get(name))[:12]} there, {value[:12]} here)"
                       for name, value in here.items() if theirs.get(name) != value]
        if differences:
            raise PipelineError(f"Dask worker {address} refused: it differs from the caller in "
                                f"{'; '.join(differences)}; run every worker on the caller's "
                                f"commit, pins and icml26 source")


def connect_dask(address: str, timeout: float = 10.0, root: Path = ROOT):
    """A client of the Dask scheduler at ``address`` whose workers all run this environment
    (:func:`check_workers`); an unreachable scheduler or a different worker is a PipelineError."""
    from distributed import Client

    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as error:
        raise PipelineError(f"cannot reach the Dask scheduler at {address}: {error}") from None
    try:
        check_workers(client, root)
    except BaseException:
        client.close()
        raise
    return client


def execute_chapters(
    selected: list[Chapter], tier: str, seed: int, stage: Path, cache: Path, *,
    use_cache: bool = True, jobs: int = 1, client=None, report: Callable[[str], None] = print,
    root: Path = ROOT,
) -> list[RunRecord]:
    """Execute ``selected`` into ``stage``: cached runs reused, the rest run ``jobs`` at a time
    (or on the Dask ``client``'s workers). A chapter that fails does not stop the others: its
    record carries the error and its page is the chapter as far as it executed, with the error at
    the failing cell (:func:`~icml26.toolchain.failures.failed_page`). Records come back in book
    order."""
    total = len(selected)
    position = {c.slug: i for i, c in enumerate(selected, start=1)}
    records: dict[str, RunRecord] = {}

    def output(chapter: Chapter) -> Path:
        return stage / CHAPTER_DIR / f"{chapter.slug}.ipynb"

    def done(chapter: Chapter, record: RunRecord) -> None:
        records[chapter.slug] = record
        prefix = f"[{position[chapter.slug]}/{total}] {chapter.slug}"
        if record.error:
            report(f"{prefix}: FAILED after {record.seconds:.1f} s: {record.error}")
        else:
            source = "cache" if record.cached else "fresh run"
            report(f"{prefix}: {record.seconds:.1f} s ({source}), checks (paper / finding / "
                   f"verification): {_claims_summary(record.claims)}")

    pending = []
    for chapter in selected:
        output(chapter).parent.mkdir(parents=True, exist_ok=True)
        record = cached_run(chapter, tier, seed, output(chapter), cache) if use_cache else None
        if record:
            done(chapter, record)
        else:
            pending.append(chapter)

    def finish(chapter: Chapter, run: Callable[[], tuple[float, bytes]], start: float) -> None:
        try:
            seconds, notebook = run()
        except PipelineError as error:
            message = str(error).removeprefix(f"chapter {chapter.slug}: ")
            partial = getattr(error, "notebook", None)
            page = failures.failed_page(chapter.source, message, partial and nbformat.reads(
                partial.decode("utf-8"), as_version=4))
            nbformat.write(pages.with_live_notes(pages.with_alt_text(page)), output(chapter))
            done(chapter, failed_record(chapter, tier, seed, time.perf_counter() - start,
                                        message))
            return
        page = pages.with_live_notes(pages.with_alt_text(
            nbformat.reads(notebook.decode("utf-8"), as_version=4)))
        nbformat.write(page, output(chapter))
        done(chapter, store_run(chapter, tier, seed, output(chapter), seconds, cache))

    def started(chapter: Chapter) -> None:
        where = " on the Dask cluster" if client else ""
        report(f"[{position[chapter.slug]}/{total}] {chapter.slug}: executing at {tier} tier, "
               f"seed {seed}{where}")

    if client is None and jobs == 1:
        for chapter in pending:
            started(chapter)
            start = time.perf_counter()
            finish(chapter, lambda c=chapter: execute_chapter_task(c.slug, tier, seed, str(root)),
                   start)
    elif pending:
        pool = None if client else ProcessPoolExecutor(jobs, mp_context=get_context("spawn"))
        try:
            futures: dict[Future, tuple[Chapter, float]] = {}
            for chapter in pending:
                started(chapter)
                if client:
                    future = client.submit(execute_chapter_task, chapter.slug, tier, seed,
                                           pure=False)
                else:
                    future = pool.submit(execute_chapter_task, chapter.slug, tier, seed, str(root))
                futures[future] = (chapter, time.perf_counter())
            completed = client_as_completed(client, futures) if client else as_completed(futures)
            for future in completed:
                chapter, start = futures[future]
                finish(chapter, future.result, start)
        finally:
            if pool:
                pool.shutdown()
    return [records[c.slug] for c in selected]


def client_as_completed(client, futures):
    """Dask futures in the order they finish."""
    from distributed import as_completed as dask_as_completed

    with client.as_current():
        yield from dask_as_completed(list(futures))


def build(
    tier: str = "book", seed: int = 0, *, out_root: Path = ROOT, use_cache: bool = True,
    student: bool = False, report: Callable[[str], None] = print, jobs: int | None = None,
    dask: str | None = None, root: Path = ROOT, strict_claims: bool = False,
) -> list[RunRecord]:
    """Execute every chapter at ``tier`` and render the book into ``out_root/_build/html``.

    ``jobs`` chapters execute at once (default :func:`default_jobs`), or, with ``dask`` (a
    scheduler address), one task per chapter on that cluster's workers, each executing its own
    checkout of the book. ``root`` is the book to build (default: this checkout). A failing
    chapter does not stop the others: the book renders with its page as far as it executed, and
    the build then raises :class:`PipelineError` listing every failure. A claim whose verdict is not
    the expected one is rendered and listed, not a failure, unless ``strict_claims``: then an
    unexpected verdict, or an expected one that is fragile, fails the build too. With
    ``student=True`` the same executed chapters, with every exercise solution removed, are
    rendered into :func:`student_html_dir`.
    """
    validate_parameters(tier, seed)
    jobs = default_jobs() if jobs is None else validate_jobs(jobs)
    client = connect_dask(dask, root=root) if dask else None  # before anything touches the cache
    selected = chapters(root)
    stage = out_root / "_build" / ("student-stage" if student else "stage")
    total = time.perf_counter()
    try:
        records = execute_chapters(selected, tier, seed, stage, cache_dir(out_root),
                                   use_cache=use_cache, jobs=jobs, client=client, report=report,
                                   root=root)
    finally:
        if client is not None:
            client.close()
    save_history(records, out_root)
    errors = {r.slug: r.error for r in records if r.error}
    book_ledger = {c.slug: {"title": c.title, "tier": tier, "seed": seed,
                            "rows": ledger.chapter_rows(stage / CHAPTER_DIR / f"{c.slug}.ipynb"),
                            "error": errors.get(c.slug)}
                   for c in selected}
    table = summary_table(records, selected, book_ledger)
    stage_sources(stage, selected, root)
    _write_if_changed(stage / STATUS_TABLE, table)
    plots = ledger.write_forest_plots(book_ledger, stage)
    _write_if_changed(stage / ledger.LEDGER_TABLE, ledger.ledger_markdown(book_ledger, plots))
    _add_substitutions(stage, ledger.substitutions(book_ledger) | run_substitutions(records, jobs))
    if student:
        _make_student_edition(stage, selected)
    else:
        ledger.save_ledger(book_ledger, out_root)
    edition = "student edition" if student else "book"
    report(f"rendering the {edition} with Jupyter Book (-n -W --keep-going)")
    html_dir = render_html(stage, out_root / "_build" / "student" if student else out_root)
    report(table)
    problems = [f"  {slug}: {problem}" for slug, entry in book_ledger.items()
                for problem in claims.strict_problems(entry["rows"])]
    if problems:
        report("claims not as expected (rendered and listed on the status page):\n"
               + "\n".join(problems))
    failed = [r for r in records if r.error]
    if failed:
        lines = "\n".join(f"  {r.slug}: {r.error}" for r in failed)
        raise PipelineError(f"{len(failed)} of {len(records)} chapters failed (the book was "
                            f"rendered, each of them as far as it executed: "
                            f"{html_dir / 'index.html'}):\n{lines}")
    if strict_claims and problems:
        raise PipelineError(f"--strict-claims: {len(problems)} claims are unexpected or fragile "
                            f"(the book was rendered: {html_dir / 'index.html'}):\n"
                            + "\n".join(problems))
    report(f"{edition} built in {time.perf_counter() - total:.1f} s: {html_dir / 'index.html'}")
    return records


def run_substitutions(records: list[RunRecord], jobs: int = 1) -> dict[str, str]:
    """What this build measured, for the building appendix (``{{ build_seconds }}``...): the
    chapters, their tier, how many executed at once, and their execution seconds in all, on
    average and at most (a cached chapter counts the seconds its run took)."""
    if not records:
        raise ValueError("no run records")
    slowest = max(records, key=lambda r: r.seconds)
    total = sum(r.seconds for r in records)
    return {"build_chapters": str(len(records)), "build_tier": records[0].tier,
            "build_jobs": str(jobs),
            "build_seconds": f"{total:.0f}", "build_mean_seconds": f"{total / len(records):.0f}",
            "build_max_seconds": f"{slowest.seconds:.0f}", "build_max_chapter": slowest.slug}


def _add_substitutions(stage: Path, values: dict[str, str]) -> None:
    """Put the book-wide counts into the staged configuration, for the introduction and the
    building appendix."""
    config_file = stage / "_config.yml"
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    config.setdefault("parse", {})["myst_substitutions"] = values
    _write_if_changed(config_file, yaml.safe_dump(config, sort_keys=False))
