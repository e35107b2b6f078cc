"""Keep the built book self-contained: a vendored MathJax 3 and a scan for remote assets."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from bs4 import BeautifulSoup

MATHJAX_VERSION = "3.2.2"
# Output of `npm view mathjax@3.2.2 dist.integrity`.
MATHJAX_INTEGRITY = (
    "sha512-"
    "Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
)
# Tarball paths (below `package/`) to keep: the TeX+CHTML bundle, the fonts it loads,
# the TeX extensions it autoloads or `\require`s at runtime, and the licence.
_KEEP_FILES = {"LICENSE", "es5/tex-chtml.js"}
_KEEP_DIRS = ("es5/output/chtml/fonts/woff-v2/", "es5/input/tex/extensions/")

_REPO_ROOT = Path(__file__).resolve().parents[3]
_REMOTE = ("http://", "https://", "//")
_CSS_URL = re.compile(r"""@import\s+["']([^"']+)["']|url\(\s*["']?([^"')]+?)["']?\s*\)""")


def mathjax_dir() -> Path:
    """Return the vendored MathJax root (it holds ``es5/tex-chtml.js``), fetching it if missing."""
    vendor = Path(os.environ.get("ICML26_VENDOR_DIR") or _REPO_ROOT / "_build" / "vendor")
    dest = vendor / f"mathjax-{MATHJAX_VERSION}"
    if not (dest / "es5" / "tex-chtml.js").is_file():
        _vendor_mathjax(dest)
    return dest


def _vendor_mathjax(dest: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"npm is needed to vendor mathjax@{MATHJAX_VERSION} into {dest}; install Node.js/npm "
            "or point ICML26_VENDOR_DIR at a directory that already holds "
            f"mathjax-{MATHJAX_VERSION}/"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run(
            [npm, "pack", f"mathjax@{MATHJAX_VERSION}", "--silent"],
            cwd=tmp,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        tarball = Path(tmp, f"mathjax-{MATHJAX_VERSION}.tgz")
        digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if f"sha512-{digest}" != MATHJAX_INTEGRITY:
            raise RuntimeError(f"{tarball.name} does not match pinned {MATHJAX_INTEGRITY}")
        staging = Path(tmp, "mathjax")
        _extract(tarball, staging)
        # Rename is atomic, so a half-written copy is never visible; losing a race is fine.
        try:
            staging.rename(dest)
        except OSError:
            if not (dest / "es5" / "tex-chtml.js").is_file():
                raise


def _extract(tarball: Path, out: Path) -> None:
    """Copy the kept regular files out of ``tarball``; paths are rebuilt, never trusted."""
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            path = PurePosixPath(member.name)
            if not member.isfile() or path.parts[:1] != ("package",) or ".." in path.parts:
                continue
            rel = PurePosixPath(*path.parts[1:])
            if str(rel) not in _KEEP_FILES and not str(rel).startswith(_KEEP_DIRS):
                continue
            target = out.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    if not (out / "es5" / "tex-chtml.js").is_file():
        raise RuntimeError(f"{tarball.name} has no es5/tex-chtml.js")


def remote_assets(html_dir: Path | str) -> list[tuple[str, str, str]]:
    """List ``(file, tag, url)`` for each script, stylesheet, preload or CSS url off the site."""
    root = Path(html_dir)
    found = []
    for page in sorted(root.rglob("*.html")):
        rel = page.relative_to(root).as_posix()
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        urls = [("script", tag["src"]) for tag in soup.find_all("script", src=True)]
        for tag in soup.find_all("link", href=True):
            if {"stylesheet", "preload", "modulepreload"} & set(tag.get("rel", [])):
                urls.append(("link", tag["href"]))
        css = [("style", tag.get_text()) for tag in soup.find_all("style")]
        css += [(f"{tag.name}[style]", tag["style"]) for tag in soup.find_all(style=True)]
        for name, text in css:
            urls += [(name, a or b) for a, b in _CSS_URL.findall(text)]
        found += [(rel, name, url) for name, url in urls if url.strip().lower().startswith(_REMOTE)]
    return found
