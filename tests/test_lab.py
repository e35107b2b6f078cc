"""Working live: a real JupyterLab opens a chapter as a notebook, runs its first code cells, and
saves it back as MyST Markdown without outputs."""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import jupytext
import pytest
from test_site import CHROMIUM, CHROMIUM_ARGS

from icml26.toolchain import lab, livetext, saving
from icml26.toolchain.chapters import CHAPTER_DIR, ROOT, chapters

SLUG = "mod-test"
TIMEOUT_MS = 240_000  # the first kernel start imports torch; generous on a loaded machine
QUEUE_WAIT_MS, QUEUE_ATTEMPTS = 10_000, 6


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_lab_settings_open_markdown_as_notebooks(tmp_path):
    target = lab.install_settings(prefix=tmp_path)
    written = target.read_text()
    assert '"markdown": "Jupytext Notebook"' in written and '"myst": "Jupytext Notebook"' in written
    command = lab.lab_command(["--no-browser"])
    assert command[1] == "lab" and command[-1] == "--no-browser"
    assert f"--ServerApp.root_dir={ROOT}" in command
    assert f"--ServerApp.contents_manager_class={lab.CONTENTS_MANAGER}" in command


def test_the_lab_kernel_is_the_one_every_chapter_declares():
    """Starting a kernel in the lab writes its spec into the notebook: it must be the chapters'."""
    env = lab.lab_environment({"JUPYTER_PATH": "/elsewhere"})
    assert env["JUPYTER_PATH"] == os.pathsep.join([str(lab.JUPYTER_DATA), "/elsewhere"])
    spec = json.loads((lab.JUPYTER_DATA / "kernels" / "python3" / "kernel.json").read_text())
    for chapter in chapters():
        declared = jupytext.read(chapter.source).metadata["kernelspec"]
        assert declared == {"name": "python3", "display_name": spec["display_name"],
                            "language": spec["language"]}, chapter.slug


async def _open_and_save(root: Path, path: str, edit=None) -> None:
    manager = saving.BookContentsManager(root_dir=str(root))
    model = await manager.get(path)
    content = model["content"]
    if edit:
        edit(content)
    await manager.save({"type": "notebook", "format": "json", "content": content}, path)


def _copy_chapter(source: Path, root: Path) -> Path:
    target = root / CHAPTER_DIR / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    shutil.copy(ROOT / "jupytext.toml", root / "jupytext.toml")
    return target


@pytest.mark.parametrize("chapter", chapters(), ids=lambda c: c.slug)
def test_saving_an_unchanged_chapter_leaves_it_byte_identical(chapter, tmp_path):
    target = _copy_chapter(chapter.source, tmp_path)
    before = target.stat().st_mtime_ns
    asyncio.run(_open_and_save(tmp_path, f"{CHAPTER_DIR}/{target.name}"))
    assert target.read_bytes() == chapter.source.read_bytes()
    assert target.stat().st_mtime_ns == before, "an unchanged chapter is not even rewritten"


def test_saving_an_edited_chapter_changes_only_the_edit(tmp_path):
    source = ROOT / CHAPTER_DIR / f"{SLUG}.md"
    target = _copy_chapter(source, tmp_path)

    def edit(notebook):
        cell = next(c for c in notebook["cells"] if c["metadata"].get("mystnb"))
        cell["source"] += "\n# an edit"

    asyncio.run(_open_and_save(tmp_path, f"{CHAPTER_DIR}/{target.name}", edit))
    diff = [line for line in difflib.unified_diff(source.read_text().splitlines(),
                                                  target.read_text().splitlines(), n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert diff == ["+# an edit"]


def test_chapters_open_with_live_numbers_and_citations_and_save_them_back(tmp_path):
    source = ROOT / CHAPTER_DIR / f"{SLUG}.md"
    target = _copy_chapter(source, tmp_path)
    seen = {}

    def run_markdown_as_jupyterlab_myst_does(notebook):
        prose = "\n".join(c["source"] for c in notebook["cells"] if c["cell_type"] == "markdown")
        seen["prose"] = prose
        cell = next(c for c in notebook["cells"] if "glue_value(" in c["source"])
        cell["metadata"]["user_expressions"] = [{"expression": "glue_value(\"x\")", "result": {
            "status": "ok", "data": {"text/plain": "'0.43'"}, "metadata": {}}}]
        cell["metadata"]["trusted"] = True

    asyncio.run(_open_and_save(tmp_path, f"{CHAPTER_DIR}/{target.name}",
                               run_markdown_as_jupyterlab_myst_does))
    prose = seen["prose"]
    assert '{eval}`glue_value("power_mod_location", ".2f")`' in prose
    assert "Gretton et al. (2012)" in prose and "{glue:" not in prose and "{cite:" not in prose
    assert target.read_bytes() == source.read_bytes(), "the values JupyterLab shows are not saved"


def test_live_text_round_trips_and_formats_citations():
    bibliography = {"a": ("Ames", "2020"), "b": ("Bo and Cy", "2021")}
    text = ("Power {glue:text}`p_mod:.2f`, list {glue:text}`names`, {cite:p}`a,b`; "
            "{cite:t}`b` and {cite:t}`unknown`.")
    lab_text = livetext.to_lab(text, bibliography)
    assert lab_text == ('Power {eval}`glue_value("p_mod", ".2f")`, list {eval}`glue_value("names")`'
                        ", {abbr}`(Ames, 2020; Bo and Cy, 2021) (cite:p:a,b)`; "
                        "{abbr}`Bo and Cy (2021) (cite:t:b)` and {abbr}`unknown (cite:t:unknown)`.")
    assert livetext.from_lab(lab_text) == text
    spaced = "{cite:p}`a, b`"  # a link cannot hold the space: left as it is
    assert livetext.to_lab(spaced, bibliography) == spaced
    assert livetext.author_years()["szekely2013energy"] == ("Székely and Rizzo", "2013")
    with pytest.raises(ValueError, match="style"):
        livetext.citation_text("x", "a", bibliography)
    with pytest.raises(TypeError):
        livetext.to_lab(None)


def test_keep_layout_reuses_only_blocks_whose_data_is_unchanged():
    cell = "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: %s\n---\nx\n```\n"
    old, same = cell % "A cap\n      tion.", cell % "A cap tion."
    other = same.replace("A cap tion.", "Another.")
    assert saving.keep_layout(old, same) == old
    assert saving.keep_layout(old, other) == other
    with pytest.raises(TypeError):
        saving.keep_layout(old, None)


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab started as `make lab` starts it, on a copy of one chapter."""
    root = tmp_path_factory.mktemp("lab")
    chapter = root / "book" / "chapters" / f"{SLUG}.md"
    chapter.parent.mkdir(parents=True)
    shutil.copy(ROOT / "book" / "chapters" / f"{SLUG}.md", chapter)
    shutil.copy(ROOT / "jupytext.toml", root / "jupytext.toml")
    port, token = _free_port(), secrets.token_hex(16)
    icml26 = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "icml26"
    command = [str(icml26 if icml26.exists() else shutil.which("icml26")), "lab",
               "--no-browser", f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.root_dir={root}",
               f"--IdentityProvider.token={token}", "--ServerApp.disable_check_xsrf=False"]
    # Every cell in the page (JupyterLab otherwise attaches only the cells in view), so that the
    # tests can read any cell; a user setting, in a folder of the test's own.
    settings = root / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    log = (root / "lab.log").open("w")
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(root / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces")}  # no tabs from other runs
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"JupyterLab exited: {(root / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start within 60 s")
        yield url, token, chapter
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _selected_prompt_matches(page, pattern: str, timeout_ms: int) -> None:
    page.wait_for_function(
        "pattern => new RegExp(pattern).test(document.querySelector('.jp-NotebookPanel "
        ".jp-Cell.jp-mod-selected .jp-InputPrompt')?.textContent ?? '')",
        arg=pattern, timeout=timeout_ms)


def _run_selected_cell(page, timeout_error: type[Exception]) -> None:
    """Ctrl+Enter on the selected cell, then wait for its own prompt to show a number.

    A keystroke sent while the freshly opened notebook is still wiring its kernel can be dropped
    (the prompt stays `[ ]`), so the key is pressed again until the cell is queued or running."""
    for _ in range(QUEUE_ATTEMPTS):
        page.keyboard.press("Control+Enter")  # runs the selected cell, keeps it selected
        try:
            _selected_prompt_matches(page, r"\[(\*|\d+)\]", QUEUE_WAIT_MS)
            break
        except timeout_error:
            continue
    else:
        pytest.fail(f"the selected cell was not queued after {QUEUE_ATTEMPTS} Ctrl+Enter")
    _selected_prompt_matches(page, r"\[\d+\]", TIMEOUT_MS)


def _run_all(page, prompts: str, timeout_error: type[Exception]) -> None:
    """Run > Run All Cells, again until the first cell is queued or running: like a keystroke,
    a menu command given while the notebook is still wiring its kernel can be dropped."""
    for _ in range(QUEUE_ATTEMPTS):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(
                "selector => /\\[(\\*|\\d+)\\]/.test("
                "document.querySelector(selector)?.textContent ?? '')",
                arg=prompts, timeout=QUEUE_WAIT_MS)
            return
        except timeout_error:
            continue
    pytest.fail(f"Run All Cells queued nothing after {QUEUE_ATTEMPTS} attempts")


def test_chapter_opens_runs_and_saves_without_outputs(lab_server):
    if not CHROMIUM:
        pytest.skip("Chromium not found at /usr/bin/chromium or on PATH")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    url, token, chapter = lab_server
    original, original_bytes = jupytext.read(chapter), chapter.read_bytes()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{url}/lab/tree/book/chapters/{SLUG}.md?token={token}")
            # opened as a notebook (Jupytext's viewer), not as a text file
            page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell")
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            code_cells = page.locator(".jp-NotebookPanel .jp-CodeCell")
            code_cells.nth(0).locator(".jp-InputArea-editor").click()
            page.keyboard.press("Escape")
            for _ in range(2):  # the parameters cell, then the setup cell
                _run_selected_cell(page, sync_api.TimeoutError)
                page.keyboard.press("j")  # next cell
                while "jp-CodeCell" not in (page.locator(".jp-Cell.jp-mod-selected")
                                            .first.get_attribute("class") or ""):
                    page.keyboard.press("j")
            # an output node is attached before its text renders: wait for the text itself
            page.wait_for_function(
                "() => { const cell = document.querySelectorAll('.jp-NotebookPanel "
                ".jp-CodeCell')[1]; return [...cell.querySelectorAll('.jp-OutputArea-output')]"
                ".some(o => o.innerText.trim()); }")
            outputs = code_cells.nth(1).locator(".jp-OutputArea-output")
            shown = next((text for text in outputs.all_inner_texts() if text.strip()), "")
            assert shown.strip(), "the setup cell showed no output"
            page.keyboard.press("Control+s")
            page.wait_for_function(
                "() => !document.querySelector('.jp-mod-current .jp-mod-dirty')")
            time.sleep(1)
        finally:
            browser.close()
    saved = chapter.read_text()
    assert shown.strip().splitlines()[0] not in saved, "an output was saved into the chapter"
    assert "outputs" not in saved and "execution_count" not in saved
    again = jupytext.read(chapter)
    assert [c.source for c in again.cells] == [c.source for c in original.cells]
    assert chapter.read_bytes() == original_bytes, "running and saving changed the chapter"


def test_run_all_shows_the_glued_numbers_in_the_prose(lab_server):
    """Run All at smoke tier: a sentence that quotes a glued number shows it as digits."""
    if not CHROMIUM:
        pytest.skip("Chromium not found at /usr/bin/chromium or on PATH")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    url, token, chapter = lab_server
    live = chapter.with_name(f"{SLUG}-live.md")
    text = chapter.read_text()
    assert '\nTIER = "book"\n' in text
    live.write_text(text.replace('\nTIER = "book"\n', '\nTIER = "smoke"\n', 1))
    current = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the tab in front
    sentence = f"{current} .jp-MarkdownCell .myst"  # jupyterlab-myst's rendering of a Markdown cell
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{url}/lab/tree/book/chapters/{live.name}?token={token}")
            page.wait_for_selector(f"{current} .jp-CodeCell")
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            page.wait_for_function(
                "selector => [...document.querySelectorAll(selector)].some(cell => "
                "cell.innerText.includes('Gretton et al. (2012)'))", arg=sentence)
            try:  # focus the notebook; Run All applies to the notebook in front either way
                page.locator(f"{current} .jp-CodeCell .jp-InputArea-editor").first.click(
                    timeout=QUEUE_WAIT_MS)
                page.keyboard.press("Escape")
            except sync_api.TimeoutError:  # an editor not yet rendered (windowed notebook)
                pass
            _run_all(page, f"{current} .jp-CodeCell .jp-InputPrompt", sync_api.TimeoutError)
            page.wait_for_function(
                "selector => [...document.querySelectorAll(selector)].some(cell => "
                "/MOD rejects in \\d\\.\\d\\d of the data/.test(cell.innerText))", arg=sentence)
            quoted = [text for text in page.locator(sentence).all_inner_texts()
                      if "MOD rejects in" in text]
        finally:
            browser.close()
    assert quoted and not any("glue_value(" in text or "run the cells" in text for text in quoted)
