"""ruff over the package, the tests, the benchmarks and every chapter's code cells."""

import subprocess
import sys

import jupytext

from icml26.toolchain.chapters import ROOT, chapters, read_source


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", *args], cwd=ROOT,
                          capture_output=True, text=True, check=False)


def test_ruff_on_python_sources():
    result = _ruff("src", "tests", "benchmarks", "book/_ext")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_on_chapter_code_cells(tmp_path):
    for chapter in chapters():
        jupytext.write(read_source(chapter.source), tmp_path / f"{chapter.slug}.ipynb")
    result = _ruff(str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
