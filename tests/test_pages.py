"""Pages show readers only what is meant for them (icml26.toolchain.pages)."""

import pytest
from IPython.core.formatters import DisplayFormatter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from icml26.claims import CLAIMS_METADATA_KEY
from icml26.core import glue_number, glue_text
from icml26.toolchain.pages import (
    LIVE_NOTE,
    plain_caption,
    reader_problems,
    with_alt_text,
    with_live_notes,
)


def _cell(*outputs):
    return new_code_cell("x", outputs=list(outputs))


TABLE = new_output("display_data", data={"text/html": "<table/>", "text/plain": "table"},
                   metadata={CLAIMS_METADATA_KEY: {"rows": []}})
GLUE = new_output("display_data", data={"application/papermill.record/text/plain": "1.0"},
                  metadata={"scrapbook": {"name": "x", "mime_prefix": "application/papermill"}})


def _notebook(*cells):
    return new_notebook(cells=[new_markdown_cell("# Title\n\n## Setup"), *cells])


def test_a_clean_page_has_no_problems():
    notebook = _notebook(_cell(new_output("stream", name="stdout", text="42\n")),
                         new_markdown_cell("## Claims check"), _cell(TABLE, GLUE),
                         new_markdown_cell("## Fidelity to the paper"),
                         _cell(new_output("stream", name="stdout", text="after\n")))
    assert reader_problems(notebook) == []


@pytest.mark.parametrize(("output", "problem"), [
    (new_output("execute_result", data={"text/plain": "Row(kind='verification', ...)"},
                execution_count=1), "an object's repr: Row(kind="),
    (new_output("stream", name="stdout", text="[<icml26.umem.Item object at 0x7f3a>]\n"),
     "an object's repr: <icml26.umem.Item object at 0x7f3a>"),
    (new_output("stream", name="stderr", text="/tmp/ipykernel_1/2.py:8: DeprecationWarning\n"),
     "stderr: /tmp/ipykernel_1/2.py:8: DeprecationWarning"),
    (new_output("error", ename="ValueError", evalue="", traceback=[]), "an error (ValueError)"),
])
def test_reprs_stderr_and_errors_are_problems(output, problem):
    (found,) = reader_problems(_notebook(_cell(output)))
    assert found.startswith(f"cell 2: {problem}")


def test_any_output_after_the_claims_table_is_a_problem():
    late = new_output("execute_result", data={"text/plain": "24.27"}, execution_count=3)
    notebook = _notebook(new_markdown_cell("## Claims check"), _cell(TABLE, GLUE, late),
                         _cell(new_output("stream", name="stdout", text="done\n")))
    assert reader_problems(notebook) == ["cell 3: output after the claims table: 24.27",
                                         "cell 4: output after the claims table: done"]
    with pytest.raises(TypeError):
        reader_problems("not a notebook")


def test_glued_values_display_nothing_as_a_cells_last_line():
    number, text = glue_number("n", 3), glue_text("t", "a, b")
    assert number == 3.0 and number + 1 == 4.0 and text == "a, b"
    assert DisplayFormatter().format(number) == ({}, {}) == DisplayFormatter().format(text)


def test_figures_get_their_caption_as_alt_text():
    figure = new_code_cell("plt.show()", metadata={"mystnb": {"figure": {
        "caption": "Power at $d$ = {glue:text}`dim:.0f`, **bold** and {math}`x^2`.",
        "name": "fig-x"}}})
    own = new_code_cell("plt.show()", metadata={"mystnb": {"figure": {"caption": "C"},
                                                           "image": {"alt": "Own words."}}})
    notebook = with_alt_text(new_notebook(cells=[figure, own, new_code_cell("x")]))
    assert figure.metadata["mystnb"]["image"]["alt"] == "Power at d = dim, bold and x^2."
    assert own.metadata["mystnb"]["image"]["alt"] == "Own words."
    assert "mystnb" not in notebook.cells[2].metadata
    with pytest.raises(TypeError):
        plain_caption(None)


def test_each_explore_cell_says_once_how_to_run_it_live():
    cells = [new_code_cell("explore(view, k=(1, 5, 1))"), new_code_cell("x = explore_more"),
             new_code_cell("y = 1\nexplore(view)")]
    notebook = with_live_notes(new_notebook(cells=cells))
    sources = [c.source for c in notebook.cells]
    assert sources == [cells[0].source, LIVE_NOTE, cells[1].source, cells[2].source, LIVE_NOTE]
    assert [c.source for c in with_live_notes(notebook).cells] == sources, "notes are added once"
    assert "make lab" in LIVE_NOTE
