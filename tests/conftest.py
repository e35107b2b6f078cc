"""Shared fixtures: one smoke-tier build of the whole book per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from icml26.toolchain import pipeline

SMOKE_RECORDS: list[pipeline.RunRecord] = []


@pytest.fixture(scope="session")
def smoke_build(tmp_path_factory) -> tuple[list[pipeline.RunRecord], Path]:
    """Execute every chapter at smoke tier (fresh, no shared cache), one at a time since their
    times are measured, and render the strict book. The real model's float32 cache is written
    first, untimed: it is set-up done once per checkout (like `make env`), not a chapter's cost."""
    from icml26 import llm

    llm.load()
    out_root = tmp_path_factory.mktemp("book")
    records = pipeline.build("smoke", 0, out_root=out_root, report=print, jobs=1)
    SMOKE_RECORDS.extend(records)
    return records, out_root / "_build" / "html"


def pytest_terminal_summary(terminalreporter):
    """Print every chapter's measured smoke-tier time at the end of the run."""
    if SMOKE_RECORDS:
        terminalreporter.section("smoke-tier execution times (budget 20 s each)")
        for record in SMOKE_RECORDS:
            terminalreporter.write_line(f"{record.slug:<28} {record.seconds:6.1f} s")


@pytest.fixture(scope="session")
def built_html(smoke_build) -> Path:
    return smoke_build[1]


@pytest.fixture(scope="session")
def student_html(smoke_build) -> Path:
    """The student edition, rendered from the smoke build's cached notebooks."""
    out_root = smoke_build[1].parents[1]
    pipeline.build("smoke", 0, out_root=out_root, student=True, report=print)
    return pipeline.student_html_dir(out_root)
