"""The built book is self-contained, and every chapter typesets cleanly in a real browser."""

import functools
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from icml26.toolchain.offline import remote_assets

CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else shutil.which("chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000

# "" once MathJax has typeset the page and its fonts settled, else what went wrong.
MATHJAX_DONE_JS = f"""() => Promise.race([
    MathJax.startup.promise.then(() => document.fonts.ready)
        .then(() => "", (err) => `MathJax failed: ${{err}}`),
    new Promise((done) => setTimeout(() => done("MathJax timed out"), {TIMEOUT_MS})),
])"""
# TeX errors, plus unknown macros, which the noundefined extension shows as red text instead.
MATH_ERRORS = "mjx-merror, [data-mjx-error], mjx-assistive-mml mtext[mathcolor=red]"
MATH_ERRORS_JS = "els => [...new Set(els.map(e => e.dataset.mjxError || e.textContent))]"
# Sources of images that fail to load (lazy ones are forced eager; waits at most TIMEOUT_MS).
BROKEN_IMAGES_JS = f"""async () => {{
    const imgs = [...document.images];
    imgs.forEach((img) => {{ img.loading = "eager"; }});
    await Promise.all(imgs.map((img) => img.complete ? null : new Promise((done) => {{
        img.addEventListener("load", done);
        img.addEventListener("error", done);
        setTimeout(done, {TIMEOUT_MS});
    }})));
    return imgs.filter((img) => !(img.complete && img.naturalWidth > 0))
        .map((img) => img.currentSrc || img.src);
}}"""


def test_no_remote_assets(built_html):
    offenders = remote_assets(built_html)
    listing = "\n".join(f"  {page}: <{tag}> {url}" for page, tag, url in offenders)
    assert offenders == [], f"built HTML loads remote assets:\n{listing}"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # e.g. the browser dropping a connection mid-response


@pytest.fixture(scope="module")
def site_url(built_html):
    handler = functools.partial(_QuietHandler, directory=str(built_html))
    with _QuietServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_port}"
        server.shutdown()


def _check_page(browser, url, math=True, selector=None):
    """Load one page and return a list of human-readable problems.

    ``math``: the page must typeset equations; ``selector``: an element the page must show.
    """
    problems = []

    def route(route):
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            problems.append(f"blocked off-site request: {route.request.url}")
            route.abort()

    def on_console(msg):
        if msg.type == "error":
            problems.append(f"console error: {msg.text} ({msg.location.get('url')})")

    def on_response(resp):
        if resp.status >= 400:
            problems.append(f"HTTP {resp.status}: {resp.url}")

    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.route("**/*", route)
        page.on("console", on_console)
        page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
        page.on("response", on_response)
        page.goto(url, wait_until="load")
        if selector and page.locator(selector).count() == 0:
            problems.append(f"no {selector} on the page")
        if not math:
            problems += [f"broken image: {src}" for src in page.evaluate(BROKEN_IMAGES_JS)]
            return problems
        if not page.evaluate("() => !!(window.MathJax && MathJax.startup)"):
            return [*problems, "MathJax did not load"]
        if mathjax_error := page.evaluate(MATHJAX_DONE_JS):
            problems.append(mathjax_error)
        if page.locator("mjx-container").count() == 0:
            problems.append("no <mjx-container>: nothing was typeset")
        for err in page.eval_on_selector_all(MATH_ERRORS, MATH_ERRORS_JS):
            problems.append(f"MathJax error: {err}")
        problems += [f"broken image: {src}" for src in page.evaluate(BROKEN_IMAGES_JS)]
    finally:
        context.close()
    return problems


def test_chapter_renders_in_browser(built_html, site_url):
    if not CHROMIUM:
        pytest.skip("Chromium not found at /usr/bin/chromium or on PATH")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chapters = sorted((built_html / "book" / "chapters").glob("*.html"))
    assert chapters, f"no chapter pages under {built_html / 'book' / 'chapters'}"
    failures = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for path in chapters:
                url = f"{site_url}/{path.relative_to(built_html).as_posix()}"
                try:
                    problems = _check_page(browser, url)
                except sync_api.Error as exc:
                    problems = [f"playwright error: {exc}"]
                failures += [f"{url}: {problem}" for problem in problems]
        finally:
            browser.close()
    assert not failures, "chapters failed in the browser:\n" + "\n".join(failures)


def test_ledger_page_renders_in_browser(built_html, site_url):
    """The "What reproduced" page opens with the summary table, then lists every chapter with
    its forest plot (images that load) and a table of its claims."""
    if not CHROMIUM:
        pytest.skip("Chromium not found at /usr/bin/chromium or on PATH")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    page = built_html / "book" / "appendix" / "reproduced.html"
    text = page.read_text(encoding="utf-8")
    chapters = sorted(p.stem for p in (built_html / "book" / "chapters").glob("*.html"))
    assert all(f"../chapters/{slug}.html" in text for slug in chapters), "a section per chapter"
    summary = text.index("<strong>book</strong>")
    assert summary < text.index('alt="Forest plot of the claims of'), "summary before the plots"
    assert text.count('alt="Forest plot of the claims of') >= 1
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            problems = _check_page(browser, f"{site_url}/book/appendix/reproduced.html",
                                   math=False, selector="table tbody tr")
        finally:
            browser.close()
    assert not problems, "the ledger page failed in the browser:\n" + "\n".join(problems)


def test_search_works_from_disk_without_console_errors(built_html):
    """Opened as files (no server), search finds chapters and the console stays clean."""
    if not CHROMIUM:
        pytest.skip("Chromium not found at /usr/bin/chromium or on PATH")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    errors = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto((built_html / "search.html").as_uri() + "?q=kernel")
            page.wait_for_selector("#search-results ul.search li a")
            found = page.locator("#search-results ul.search li").count()
            page.wait_for_timeout(1000)  # summaries, were they requested, would fail by now
        finally:
            browser.close()
    assert found >= 1 and not errors, errors
