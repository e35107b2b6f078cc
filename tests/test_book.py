"""The whole book at smoke tier: every chapter runs within budget and renders strictly."""

import nbformat

from icml26.toolchain.chapters import chapters

SMOKE_BUDGET_SECONDS = 20.0


def test_every_chapter_runs_at_smoke_tier_within_budget(smoke_build):
    records, _ = smoke_build
    print("\nsmoke-tier runtimes:")
    for record in records:
        print(f"  {record.slug:<24} {record.seconds:6.1f} s")
    assert [r.slug for r in records] == [c.slug for c in chapters()]
    slow = {r.slug: r.seconds for r in records if r.seconds > SMOKE_BUDGET_SECONDS}
    assert not slow, f"over the {SMOKE_BUDGET_SECONDS:.0f} s smoke budget: {slow}"


def test_strict_build_renders_every_chapter_and_the_status_page(smoke_build):
    records, html = smoke_build
    for record in records:
        page = html / "book" / "chapters" / f"{record.slug}.html"
        assert page.exists(), f"{page} was not rendered"
        assert f"{record.slug}.ipynb" in page.read_text(), "the page offers its executed notebook"
    status = (html / "book" / "appendix" / "status.html").read_text()
    assert all(r.slug in status for r in records)


def test_glued_numbers_exist_in_executed_notebooks(smoke_build):
    _, html = smoke_build
    stage = html.parent / "stage" / "book" / "chapters"
    for chapter in chapters():
        notebook = nbformat.read(stage / f"{chapter.slug}.ipynb", as_version=4)
        glued = [o for c in notebook.cells for o in c.get("outputs", [])
                 if "scrapbook" in o.get("metadata", {})]
        assert glued, f"{chapter.slug} glues no number"
