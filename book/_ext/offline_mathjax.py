"""Sphinx extension: the book works offline.

It serves the vendored MathJax 3 from ``_static/mathjax`` instead of a CDN, and turns off search
result summaries when a page is opened from disk (``file://``): the browser refuses the requests
for the other pages that summaries need there (one console error per result), while titles and
links work. Served over HTTP, search shows summaries as usual.
"""

import shutil
from pathlib import Path

from icml26.toolchain.offline import mathjax_dir

# sphinx.ext.mathjax resolves a relative mathjax_path against ``_static/``.
MATHJAX_PATH = "mathjax/tex-chtml.js"


def _use_local_mathjax(app, config):
    config.mathjax_path = MATHJAX_PATH


def _copy_mathjax(app):
    # Copied before pages are written so Sphinx can add its ``?v=`` checksum to the URL.
    if app.builder.format == "html":
        target = Path(app.outdir, "_static", "mathjax")
        shutil.copytree(mathjax_dir() / "es5", target, dirs_exist_ok=True)


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    # Sphinx 7.4 emits inline scripts added after builder init twice (filename None, then ""),
    # so sphinx-thebe's `const THEBE_JS_URL = ...` is declared twice: a page error.
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        key = (str(js.filename or ""), tuple(sorted(js.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


SEARCH_SUMMARIES_WHEN_SERVED = (
    'DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = window.location.protocol !== "file:";')


def setup(app):
    app.add_js_file(None, body=SEARCH_SUMMARIES_WHEN_SERVED, priority=210)
    app.connect("config-inited", _use_local_mathjax)
    app.connect("builder-inited", _copy_mathjax)
    app.connect("html-page-context", _drop_duplicate_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
