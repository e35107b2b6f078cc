"""Saving a chapter from JupyterLab without reformatting it.

Jupytext writes a notebook's metadata as YAML (the front matter, every code cell's options) in
its own layout: a caption wrapped by hand in the source comes back re-wrapped and re-quoted, and
an unchanged chapter would be rewritten on every save. :func:`keep_layout` puts back the source's
own text of every metadata block whose data did not change, so a save changes exactly what the
notebook changed; :class:`BookContentsManager` (what ``icml26 lab`` serves) applies it to every
MyST file it saves and leaves a file whose text is unchanged untouched.
"""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from pathlib import Path

import yaml
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

from icml26.toolchain import livetext

# The front matter, a code cell's YAML options, or a Markdown cell's JSON metadata.
METADATA_BLOCK = re.compile(
    r"\A---\n(?P<header>.*?)\n---\n"
    r"|^(?:`{3,}|~{3,})\{code-cell\}[^\n]*\n---\n(?P<options>.*?)\n---\n"
    r"|^\+\+\+ (?P<markdown>\{[^\n]*\})$",
    re.MULTILINE | re.DOTALL)


def _blocks(text: str) -> list[tuple[re.Match, str, str]]:
    """Every metadata block of ``text``: its match, which group, and its data as canonical JSON
    (blocks that do not parse are left out: they are never reused)."""
    found = []
    for match in METADATA_BLOCK.finditer(text):
        group = match.lastgroup
        try:
            data = (json.loads if group == "markdown" else yaml.safe_load)(match.group(group))
        except (ValueError, yaml.YAMLError):
            continue
        found.append((match, group, json.dumps(data, sort_keys=True, default=str)))
    return found


def keep_layout(old: str, new: str) -> str:
    """``new`` (jupytext's text of a notebook) with each metadata block whose data equals a block
    of ``old`` (the file it replaces) written as ``old`` writes it."""
    if not isinstance(old, str) or not isinstance(new, str):
        raise TypeError("keep_layout takes the old and the new text as strings")
    spare: dict[tuple[str, str], list[str]] = defaultdict(list)
    for match, group, data in _blocks(old):
        spare[group, data].append(match.group(group))
    pieces, end = [], 0
    for match, group, data in _blocks(new):
        if spare[group, data]:
            start, stop = match.span(group)
            pieces += [new[end:start], spare[group, data].pop(0)]
            end = stop
    return "".join(pieces) + new[end:]


class _KeepLayout(AsyncLargeFileManager):
    """Writes MyST files through :func:`keep_layout`; an unchanged text is not written at all."""

    async def _save_file(self, os_path, content, format):
        path = Path(os_path)
        if format == "text" and path.suffix == ".md" and path.is_file():
            old = path.read_text(encoding="utf-8")
            content = keep_layout(old, content)
            if content == old:
                return
        await super()._save_file(os_path, content, format)


_JupytextManager = build_async_jupytext_contents_manager_class(_KeepLayout)


class BookContentsManager(_JupytextManager):
    """Jupytext's contents manager over :class:`_KeepLayout`: chapters open as notebooks whose
    prose shows live numbers and citations (:mod:`icml26.toolchain.livetext`), and save back to
    MyST with the book's glue and citation roles, changing only what changed."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model["type"] == "notebook" and model.get("content") and path.endswith(".md"):
            livetext.notebook_to_lab(model["content"])
        return model

    async def save(self, model, path=""):
        if model.get("type") == "notebook" and model.get("content") and path.endswith(".md"):
            model = {**model, "content": copy.deepcopy(model["content"])}
            livetext.notebook_from_lab(model["content"])
        return await super().save(model, path)
