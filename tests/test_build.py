"""Building a small book: keep going past a failing chapter, parallel jobs, a Dask cluster,
kernels over Unix sockets only, and bad build options."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml
from test_pipeline import NOTEBOOK_HEADER as HEADER

from icml26.toolchain import cli, pipeline

PARAMETERS = "```{code-cell} ipython3\n:tags: [parameters]\nTIER = 'smoke'\nSEED = 0\n```\n"
CLAIMS = """```{code-cell} ipython3
from icml26.claims import ClaimsCheck, threshold
claims = ClaimsCheck(enforce=False)
claims.paper("SEED is small", threshold(SEED, "<", 100), expect="reproduced")
claims.show()
```
"""
# A claim enforced at every tier whose verdict is off the expected one.
OFF_CLAIM = """```{code-cell} ipython3
from icml26.claims import ClaimsCheck, paired_comparison, threshold
claims = ClaimsCheck(enforce=True)
claims.paper("the seed is huge", threshold(SEED, ">", 100), expect="reproduced")
claims.finding("A beats B", paired_comparison([3, 4, 5, 4], [1, 2, 2.5, 2]),
               expect="reproduced")
claims.verification("an identity", threshold(0.0, "==", 0.0))
claims.show()
```
"""
# Listening TCP sockets of the kernel process, read from /proc (no extra package needed).
NO_TCP_CELL = """```{code-cell} ipython3
import json, os
from ipykernel import get_connection_info
inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:  # the descriptor listdir itself used
        continue
    if target.startswith("socket:"):
        inodes.add(target[8:-1])
listening = []
for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # state 0A: LISTEN
            listening.append(fields[1])
print("transport", json.loads(get_connection_info())["transport"], "tcp", listening)
```
"""

# What sets the kernel's torch threads: unset, every chapter keeps its own default.
THREADS_CELL = ("```{code-cell} ipython3\nimport os\n"
                "print('threads', os.environ.get('ICML26_THREADS', 'chapter default'))\n```\n")

# The third code cell raises; the text and cells after it quote a number never glued and refer
# to a figure never drawn.
BROKEN_CELLS = (
    "```{code-cell} ipython3\nfrom icml26.core import glue_number\nprint('the second cell ran')\n"
    "_ = glue_number('early', 1.25)\n```\n",
    "```{code-cell} ipython3\nraise RuntimeError('deliberately broken')\n```\n",
    "The zanzibar text after the failure quotes {glue:text}`early:.2f` and "
    "{glue:text}`late:.1f`, and shows {numref}`fig-broken-late`.\n",
    "```{code-cell} ipython3\n_ = glue_number('late', 2.0)\n```\n",
    "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: A late figure.\n"
    "    name: fig-broken-late\n---\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\n"
    "plt.show()\n```\n",
)


def _chapter(title: str, *cells: str) -> str:
    return HEADER + f"# {title}\n\nSome text.\n\n" + PARAMETERS + "\n".join(cells)


@pytest.fixture
def small_book(tmp_path):
    """A three-chapter book beside the real one: ok, failing (cell 3) and ok."""
    root = tmp_path / "book-root"
    real = pipeline.ROOT
    (root / "book" / "chapters").mkdir(parents=True)
    (root / "book" / "appendix").mkdir()
    (root / "requirements").mkdir()
    shutil.copy(real / "_config.yml", root / "_config.yml")
    shutil.copytree(real / "book" / "_ext", root / "book" / "_ext",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(real / "book" / "references.bib", root / "book" / "references.bib")
    for page in ("status.md", "reproduced.md"):
        shutil.copy(real / "book" / "appendix" / page, root / "book" / "appendix" / page)
    (root / "book" / "intro.md").write_text("# A small book\n\nThree chapters.\n")
    chapters = root / "book" / "chapters"
    (chapters / "alpha.md").write_text(_chapter("Alpha", NO_TCP_CELL, CLAIMS))
    (chapters / "broken.md").write_text(_chapter("Broken", *BROKEN_CELLS))
    (chapters / "gamma.md").write_text(_chapter("Gamma", THREADS_CELL, CLAIMS))
    toc = {"format": "jb-book", "root": "book/intro", "parts": [
        {"caption": "Part", "numbered": True, "chapters": [{"file": f"book/chapters/{s}"}
                                         for s in ("alpha", "broken", "gamma")]},
        {"caption": "Appendix", "chapters": [{"file": "book/appendix/reproduced"},
                                             {"file": "book/appendix/status"}]}]}
    (root / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return root


def _build(root: Path, out: Path, **options) -> tuple[list[str], str]:
    lines: list[str] = []
    with pytest.raises(pipeline.PipelineError) as failure:
        pipeline.build("smoke", 0, out_root=out, root=root, report=lines.append, **options)
    return lines, str(failure.value)


def _outputs(out: Path, slug: str) -> list[str]:
    notebook = nbformat.read(out / "_build" / "stage" / "book" / "chapters" / f"{slug}.ipynb", 4)
    return [o.get("text", "") for c in notebook.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "stream"]


def test_a_failing_chapter_does_not_stop_the_build(small_book, tmp_path, capsys):
    out = tmp_path / "out"
    lines, error = _build(small_book, out, jobs=1)
    source = small_book / "book" / "chapters" / "broken.md"
    line = source.read_text().splitlines().index("raise RuntimeError('deliberately broken')")
    assert "1 of 3 chapters failed" in error
    assert f"broken: cell 4 of the source (line {line} of broken.md)" in error
    assert "deliberately broken" in error
    executed = [ln for ln in lines if "fresh run" in ln]
    assert len(executed) == 2, lines  # alpha and gamma both ran
    assert any("broken: FAILED" in ln for ln in lines)
    table = next(ln for ln in lines if ln.startswith("| chapter"))
    assert "**FAILED**" in table and "broken](../chapters/broken): cell 4 of the source" in table
    html = out / "_build" / "html" / "book" / "chapters"
    page = (html / "broken.html").read_text()
    # the chapter as far as it executed: outputs above, the error box, the text below
    ran, box = page.index("the second cell ran"), page.index("failed to execute here")
    assert ran < box < page.index("deliberately broken", box) < page.index("zanzibar text")
    assert "1.25" in page and "late: not computed" in page
    assert "Fig. 2.1" in page and 'alt="A late figure."' in page  # numbered in chapter 2
    assert "Traceback" not in page[:box]
    assert "zanzibar" in (out / "_build" / "html" / "searchindex.js").read_text()
    download = nbformat.read(out / "_build" / "stage" / "book" / "chapters" / "broken.ipynb", 4)
    assert len([c for c in download.cells if c.cell_type == "code"]) >= 5  # the whole notebook
    assert "Some text" in (html / "gamma.html").read_text()
    # the ledger and `icml26 claims` say it failed, with the reason
    ledger = json.loads((out / "_build" / "claims.json").read_text())
    assert "deliberately broken" in ledger["broken"]["error"]
    assert cli.main(["claims", "--out-root", str(out)]) == 0
    claims = capsys.readouterr().out
    assert re.search(r"^broken +FAILED: cell 4", claims, re.MULTILINE)
    assert re.search(r"^broken \(tier smoke, seed 0\): FAILED: .*deliberately broken", claims,
                     re.MULTILINE)
    # the kernel talked over Unix sockets and listened on no TCP port
    assert any("transport ipc tcp []" in text for text in _outputs(out, "alpha"))
    # failures are not cached: a rebuild runs the broken chapter again, the others from cache
    lines, _ = _build(small_book, out, jobs=1)
    assert sum("(cache)" in ln for ln in lines) == 2
    assert any("broken: FAILED" in ln for ln in lines)
    history = pipeline.load_history(out)
    assert "deliberately broken" in history["broken"]["smoke"]["error"]


def test_an_unexpected_verdict_renders_and_only_the_strict_build_fails(small_book, tmp_path):
    chapters = small_book / "book" / "chapters"
    (chapters / "broken.md").write_text(_chapter("Off", OFF_CLAIM))
    out = tmp_path / "out"
    lines: list[str] = []
    records = pipeline.build("smoke", 0, out_root=out, root=small_book, report=lines.append,
                             jobs=1)
    assert not any(r.error for r in records)
    listed = next(ln for ln in lines if ln.startswith("claims not as expected"))
    assert "broken: unexpected contradicted (expected reproduced): the seed is huge" in listed
    assert "A beats B" not in listed
    page = (out / "_build" / "html" / "book" / "chapters" / "broken.html").read_text()
    assert "the seed is huge" in page and "UNEXPECTED" in page
    status = (out / "_build" / "html" / "book" / "appendix" / "status.html").read_text()
    assert "Unexpected verdicts" in status and "the seed is huge" in status
    assert cli.main(["claims", "--out-root", str(out)]) == 0
    with pytest.raises(pipeline.PipelineError, match="--strict-claims: 1 claims"):
        pipeline.build("smoke", 0, out_root=out, root=small_book, report=lines.append, jobs=1,
                       strict_claims=True)


def test_parallel_jobs_give_the_same_book(small_book, tmp_path):
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    _build(small_book, serial, jobs=1)
    lines, error = _build(small_book, parallel, jobs=2)
    assert "1 of 3 chapters failed" in error
    assert sum("fresh run" in ln for ln in lines) == 2
    for slug in ("alpha", "gamma"):
        assert _outputs(serial, slug) == _outputs(parallel, slug)
    assert "threads chapter default\n" in _outputs(parallel, "gamma")  # same numbers as serial
    serial_ledger = (serial / "_build" / "claims.json").read_text()
    assert serial_ledger == (parallel / "_build" / "claims.json").read_text()


def test_dask_cluster_executes_the_chapters(small_book, tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("ICML26_ROOT", str(small_book))  # the workers' checkout
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        out = tmp_path / "dask"
        lines, error = _build(small_book, out, dask=cluster.scheduler_address)
    assert "1 of 3 chapters failed" in error and "deliberately broken" in error
    assert sum("on the Dask cluster" in ln for ln in lines) == 3
    assert sum("fresh run" in ln for ln in lines) == 2
    assert any("SEED is small" in text or "transport ipc" in text
               for text in _outputs(out, "alpha"))
    assert (out / "_build" / "html" / "book" / "chapters" / "gamma.html").exists()


@pytest.mark.parametrize(("argv", "reason"), [
    (["build", "--jobs", "0"], "jobs must be a positive integer, got '0'"),
    (["build", "--jobs", "abc"], "jobs must be a positive integer, got 'abc'"),
    (["build", "--dask", "tcp://127.0.0.1:9"], "cannot reach the Dask scheduler at tcp://127.0.0.1:9"),
])
def test_bad_build_options_fail_in_one_line_without_touching_the_cache(argv, reason, capsys,
                                                                        tmp_path):
    cache = pipeline.cache_dir(tmp_path)
    assert cli.main([*argv, "--out-root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err
    assert not cache.exists() and not (tmp_path / "_build").exists()


@pytest.mark.parametrize(("cores", "jobs"), [(1, 1), (2, 2), (3, 2), (4, 2), (16, 8)])
def test_default_jobs_use_half_the_cores_and_two_from_two_cores(monkeypatch, cores, jobs):
    monkeypatch.setattr(pipeline.os, "cpu_count", lambda: cores)
    assert pipeline.default_jobs() == jobs


def test_a_dask_worker_running_other_source_is_refused_before_any_chapter(tmp_path):
    distributed = pytest.importorskip("distributed")
    edited = tmp_path / "icml26"
    shutil.copytree(pipeline.PACKAGE_DIR, edited, ignore=shutil.ignore_patterns("__pycache__"))
    with (edited / "core.py").open("a") as handle:
        handle.write("\n# edited on the worker only\n")

    def use_edited_source(path):  # inside the worker process: its icml26 is the edited copy
        from icml26.toolchain import pipeline as worker_pipeline

        worker_pipeline.PACKAGE_DIR = Path(path)

    out = tmp_path / "out"
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        client.run(use_edited_source, str(edited))
        with pytest.raises(pipeline.PipelineError) as refused:
            pipeline.build("smoke", 0, out_root=out, dask=cluster.scheduler_address,
                           report=lambda line: None)
    message = str(refused.value)
    assert "\n" not in message
    assert re.fullmatch(r"Dask worker tcp://\S+ refused: it differs from the caller in icml26 "
                        r"source hash \([0-9a-f]{12} there, [0-9a-f]{12} here\); run every "
                        r"worker on the caller's commit, pins and icml26 source", message), message
    assert not out.exists()
