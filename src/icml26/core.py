"""Shared helpers every chapter uses: seeding, devices, tiers, timing and claims.

A chapter's ``parameters`` cell sets ``TIER`` and ``SEED``. :func:`tier_settings` turns the tier
into the chapter's sizes, :func:`set_seed` makes the run repeatable, :func:`glue_number` publishes a
headline number to the text, and :func:`check_claim` asserts a claim of the paper while showing the
numbers behind it.
"""

from __future__ import annotations

import inspect
import numbers
import operator
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

TIERS = ("smoke", "book", "full")
"""Run sizes: ``smoke`` (CI, <= 20 s), ``book`` (<= 120 s) and ``full`` (the paper's scale)."""

CLAIM_METADATA_KEY = "icml26_claim"
"""Key of the output metadata by which the build counts a chapter's checked claims."""

_OPERATORS = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


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


def configure_threads(default: int = 2) -> int:
    """Set torch's intra-op threads (``ICML26_THREADS`` overrides ``default``); return the count."""
    threads = int(os.environ.get("ICML26_THREADS", default))
    if threads < 1:
        raise ValueError(f"thread count must be positive, got {threads}")
    torch.set_num_threads(threads)
    return threads


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


def glue_number(name: str, value: float, display: bool = False) -> float:
    """Glue a headline number under ``name``; the text quotes it with ``{glue:text}`name:.3f```."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        raise TypeError(f"glued value {name!r} must be a real number, got {type(value).__name__}")
    from myst_nb import glue

    value = float(value)
    glue(name, value, display=display)
    return value


def glue_text(name: str, text: str, display: bool = False) -> str:
    """Glue a short text (say, a list of values) under ``name``: ``{glue:text}`name```."""
    if not isinstance(text, str):
        raise TypeError(f"glued text {name!r} must be a string, got {type(text).__name__}")
    from myst_nb import glue

    glue(name, text, display=display)  # stored quoted; myst-nb's glue role strips the quotes
    return text


class ClaimError(AssertionError):
    """A claim of the paper did not hold in this run; the message shows the numbers."""


@dataclass(frozen=True)
class Claim:
    """The outcome of one claim check."""

    statement: str
    lhs: float
    op: str
    rhs: float
    holds: bool
    enforced: bool

    def describe(self) -> str:
        mark = "holds" if self.holds else "DOES NOT HOLD"
        note = "" if self.enforced or self.holds else " (not enforced at this tier)"
        return f"{mark}: {self.statement} [{self.lhs:.4g} {self.op} {self.rhs:.4g}]{note}"


def check_claim(
    statement: str, lhs: float, op: str, rhs: float, *, enforce: bool = True, **context: float
) -> Claim:
    """Check ``lhs op rhs`` for a claim stated in words; raise :class:`ClaimError` if it fails.

    ``context`` holds the numbers behind ``lhs`` (for example both powers of a difference); they
    appear in the message. With ``enforce=False`` (smoke tier) a failed claim is shown, not raised.
    """
    if op not in _OPERATORS:
        raise ValueError(f"unknown comparison {op!r}; choose one of {', '.join(_OPERATORS)}")
    lhs, rhs = float(lhs), float(rhs)
    if np.isnan(lhs) or np.isnan(rhs):
        raise ValueError(f"claim {statement!r} compares NaN: lhs={lhs}, rhs={rhs}")
    claim = Claim(statement, lhs, op, rhs, bool(_OPERATORS[op](lhs, rhs)), enforce)
    details = ", ".join(f"{key}={float(val):.4g}" for key, val in context.items())
    message = claim.describe() + (f"; {details}" if details else "")
    if enforce and not claim.holds:
        raise ClaimError(message)
    _display_claim(claim, message)
    return claim


def _display_claim(claim: Claim, message: str) -> None:
    """Show the claim in the notebook, tagged so the build can count checked claims."""
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with the pinned environment
        print(message)
        return
    metadata = {CLAIM_METADATA_KEY: {"statement": claim.statement, "holds": claim.holds,
                                     "enforced": claim.enforced}}
    display({"text/plain": message}, raw=True, metadata=metadata)


def show_source(obj: object):
    """Display the source of a function or class from ``icml26`` as a highlighted code block."""
    from IPython.display import Markdown

    try:
        source = inspect.getsource(obj)
    except TypeError as error:
        raise TypeError(f"cannot show the source of {obj!r}: {error}") from None
    return Markdown(f"```python\n{source}```")
