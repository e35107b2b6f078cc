"""Shared helpers every chapter uses: seeding, devices, threads, tiers, timing and glue.

A chapter's ``parameters`` cell sets ``TIER`` and ``SEED``. :func:`tier_settings` turns the tier
into the chapter's sizes, :func:`set_seed` makes the run repeatable, :func:`configure_threads` sets
one thread policy for torch, BLAS and OpenMP, and :func:`glue_number` publishes a headline number
to the text. Claims are checked with :mod:`icml26.claims`.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

TIERS = ("smoke", "book", "full")
"""Run sizes: ``smoke`` (CI, <= 20 s), ``book`` (<= 120 s) and ``full`` (the paper's scale)."""

def check_count(value, name: str, minimum: int = 0) -> int:
    """An integer (not a bool) that is at least ``minimum``; otherwise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_positive(value, name: str) -> float:
    """A finite real number (not a bool) greater than zero; otherwise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return float(value)


def set_seed(seed: int) -> np.random.Generator:
    """Seed Python's, NumPy's and PyTorch's global generators; return a fresh NumPy generator."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    random.seed(int(seed))
    np.random.seed(int(seed) % 2**32)
    torch.manual_seed(int(seed))
    return np.random.default_rng(int(seed))


def get_device(preference: str = "auto") -> torch.device:
    """Return the torch device to use: ``"auto"`` picks CUDA when available, else the CPU."""
    if preference not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {preference!r}")
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    return torch.device(preference)


_THREAD_LIMITER = None  # kept alive: threadpoolctl's limit lasts as long as this object


def configure_threads(default: int = 2, *, blas: int = 1) -> int:
    """One thread policy for a chapter: torch's intra-op threads and the BLAS pools.

    torch gets ``ICML26_THREADS`` threads (``default`` when unset). NumPy's and SciPy's BLAS pools
    (OpenBLAS, MKL) get ``blas`` threads (``ICML26_BLAS_THREADS`` overrides it): many small SVDs
    and eigendecompositions thrash on shared cores with more. torch's own OpenMP pool is left to
    ``torch.set_num_threads``. Returns torch's thread count.
    """
    global _THREAD_LIMITER
    from threadpoolctl import threadpool_limits

    threads = int(os.environ.get("ICML26_THREADS", default))
    blas = int(os.environ.get("ICML26_BLAS_THREADS", blas))
    if threads < 1 or blas < 1:
        raise ValueError(f"thread counts must be positive, got torch={threads}, blas={blas}")
    torch.set_num_threads(threads)
    _THREAD_LIMITER = threadpool_limits(limits=blas, user_api="blas")
    return threads


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread inside the block, then restore the thread count.

    For a block of many small matrix operations (interventional-gp's fits, n of about 100 to
    450), where a second thread only adds synchronisation: on a loaded 2-core machine it
    multiplied the CPU time by up to ten (the same operations; results agree up to round-off).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_tier(tier: str) -> str:
    """Return ``tier`` if it is one of :data:`TIERS`, else raise ``ValueError``."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")
    return tier


def tier_settings(tier: str, **settings: Mapping[str, Any]) -> dict[str, Any]:
    """Pick the settings of ``tier`` from keyword arguments named after the tiers.

    ``full`` falls back to ``book`` when a chapter has no separate full setting, so that every
    chapter accepts every tier.
    """
    check_tier(tier)
    unknown = set(settings) - set(TIERS)
    if unknown:
        raise ValueError(f"settings given for unknown tiers {sorted(unknown)}; tiers are {TIERS}")
    if "smoke" not in settings or "book" not in settings:
        raise ValueError("settings for both 'smoke' and 'book' are required")
    chosen = settings.get(tier, settings["book"])
    return dict(chosen)


@dataclass
class Timer:
    """Context manager that measures wall-clock seconds: ``with Timer() as t: ...; t.seconds``."""

    seconds: float = 0.0

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


class _ShownByGlue:
    """A glued value: as a cell's last line it displays nothing more (the glue is its output,
    and the page quotes it in the text)."""

    def _ipython_display_(self) -> None:
        """IPython calls this instead of showing the value's repr: show nothing."""


class GluedNumber(_ShownByGlue, float):
    """The float :func:`glue_number` returns (arithmetic on it gives plain floats)."""


class GluedText(_ShownByGlue, str):
    """The string :func:`glue_text` returns."""


_GLUED: dict[str, float | str] = {}
"""Every value glued in this process, for :func:`glue_value`."""


GLUE_PREFIX = "application/papermill.record/"
"""Prefix of a glued value's MIME types, as myst-nb's glue role reads them."""


def _glue(name: str, value: float | str, display: bool) -> None:
    """The output ``myst_nb.glue`` writes, without importing it: its module pulls in nbformat and
    jsonschema, whose URI grammar alone takes over a second to build in every chapter's kernel
    (``tests/test_core.py`` checks that both write the same output)."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display as show

    bundle, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    show({prefix + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)


def _remember(name: str, value: float | str) -> None:
    """Keep a glued value for :func:`glue_value`, and make ``glue_value`` a name of the notebook's
    namespace, where JupyterLab evaluates the prose's inline expressions."""
    _GLUED[name] = value
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with every kernel
        return
    shell = get_ipython()
    if shell is not None:
        shell.user_ns.setdefault("glue_value", glue_value)


def glue_value(name: str, spec: str = "") -> str:
    """The value glued under ``name``, formatted by ``spec`` as ``{glue:text}`name:spec``` shows
    it: what ``{eval}`glue_value("name", ".3f")``` shows in JupyterLab, where chapters open with
    their glue roles rewritten so (:mod:`icml26.toolchain.livetext`). A name not glued yet says
    so, rather than raising in the middle of a sentence."""
    if not isinstance(name, str) or not isinstance(spec, str):
        raise TypeError("glue_value takes the glue name and a format spec as strings")
    if name not in _GLUED:
        return f"[{name}: run the cells above]"
    return format(_GLUED[name], spec)


def glue_number(name: str, value: float, display: bool = False) -> GluedNumber:
    """Glue a headline number under ``name``; the text quotes it with ``{glue:text}`name:.3f```.

    Returns the number, which a cell's last line does not display again."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        raise TypeError(f"glued value {name!r} must be a real number, got {type(value).__name__}")
    value = float(value)
    _glue(name, value, display)
    _remember(name, value)
    return GluedNumber(value)


def glue_text(name: str, text: str, display: bool = False) -> GluedText:
    """Glue a short text (say, a list of values) under ``name``: ``{glue:text}`name```; returns
    the text, which a cell's last line does not display again."""
    if not isinstance(text, str):
        raise TypeError(f"glued text {name!r} must be a string, got {type(text).__name__}")
    _glue(name, text, display)  # stored quoted; myst-nb's glue role strips the quotes
    _remember(name, text)
    return GluedText(text)


def show_source(obj: object):
    """Display the source of a function or class from ``icml26`` as a highlighted code block."""
    from IPython.display import Markdown

    try:
        source = inspect.getsource(obj)
    except TypeError as error:
        raise TypeError(f"cannot show the source of {obj!r}: {error}") from None
    return Markdown(f"```python\n{source}```")
