"""Working in a chapter live: JupyterLab at the repository, chapters opening as notebooks.

Jupytext's contents manager reads each MyST chapter as a notebook and writes it back as MyST
Markdown, which stores no outputs (:mod:`icml26.toolchain.saving`: an unchanged chapter is saved
byte-identical; ``jupytext.toml`` keeps the header to what the chapters declare); jupyterlab-myst
renders the chapters' directives, exercises and equations. The one setting JupyterLab needs, that
Markdown files open with the Jupytext notebook viewer, lives in ``lab/overrides.json`` and is
installed into the environment's JupyterLab settings here. The kernel the chapters declare
(``python3``, "Python 3") is ``lab/jupyter/kernels/python3``, found first through
``JUPYTER_PATH``, so that starting it leaves the chapter's metadata as it was.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from icml26.toolchain.chapters import CHAPTER_DIR, ROOT

OVERRIDES = ROOT / "lab" / "overrides.json"
JUPYTER_DATA = ROOT / "lab" / "jupyter"  # holds kernels/python3, the kernel chapters declare
CONTENTS_MANAGER = "icml26.toolchain.saving.BookContentsManager"


def settings_dir(prefix: Path | None = None) -> Path:
    """JupyterLab's application settings folder of the environment at ``prefix``."""
    return Path(prefix or sys.prefix) / "share" / "jupyter" / "lab" / "settings"


def install_settings(prefix: Path | None = None) -> Path:
    """Merge the book's JupyterLab overrides into the environment's; return the file written."""
    target = settings_dir(prefix) / "overrides.json"
    merged = json.loads(target.read_text()) if target.exists() else {}
    for plugin, settings in json.loads(OVERRIDES.read_text()).items():
        merged.setdefault(plugin, {}).update(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(merged, indent=2) + "\n")
    return target


def lab_command(extra: list[str]) -> list[str]:
    """``jupyter lab`` at the repository, opening on the chapters; ``extra`` options win."""
    jupyter = Path(sys.executable).with_name("jupyter")
    defaults = {"--ServerApp.root_dir": str(ROOT),
                "--LabApp.default_url": f"/lab/tree/{CHAPTER_DIR}",
                "--ServerApp.contents_manager_class": CONTENTS_MANAGER}
    given = {option.split("=", 1)[0] for option in extra}
    root = ["--allow-root"] if os.geteuid() == 0 else []  # containers and CI machines run as root
    return [str(jupyter), "lab", *(f"{key}={value}" for key, value in defaults.items()
                                   if key not in given), *root, *extra]


def lab_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default this process's) with :data:`JUPYTER_DATA` first on ``JUPYTER_PATH``."""
    env = dict(os.environ if environ is None else environ)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(JUPYTER_DATA),
                                                       env.get("JUPYTER_PATH")]))
    return env


def start_lab(extra: list[str]) -> None:
    """Install the settings, then replace this process by JupyterLab."""
    install_settings()
    command = lab_command(extra)
    os.execve(command[0], command, lab_environment())
