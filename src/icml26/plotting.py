"""The book-wide matplotlib style and small figure helpers.

Every chapter calls :func:`use_book_style` once in its setup cell, so figures share fonts, sizes
and a colour-blind-safe palette, and each method keeps one colour across a chapter's figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
"""Okabe-Ito colours, distinguishable under the common colour-vision deficiencies."""

BOOK_STYLE = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.8,
    "lines.markersize": 5,
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
}


def use_book_style() -> None:
    """Apply the book-wide style to every figure drawn afterwards."""
    mpl.rcParams.update(BOOK_STYLE)


def method_colors(methods: Iterable[str]) -> dict[str, str]:
    """Give each method a fixed palette colour, in order, so figures of one chapter agree."""
    methods = list(methods)
    if len(set(methods)) != len(methods):
        raise ValueError(f"method names must be distinct, got {methods}")
    if len(methods) > len(PALETTE):
        raise ValueError(f"at most {len(PALETTE)} methods can get distinct colours")
    return dict(zip(methods, PALETTE, strict=False))


def subplots_grid(count: int, columns: int = 3, width: float = 3.2, height: float = 2.8):
    """A row-major grid of ``count`` panels sized per panel; unused panels are hidden."""
    if count < 1 or columns < 1:
        raise ValueError("count and columns must be positive")
    rows = -(-count // columns)
    cols = min(columns, count)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat: list[Axes] = list(axes.ravel())
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def explore(function: Callable, **controls):
    """A chapter's explore cell: ``ipywidgets.interact`` live, the default state in the book.

    ``controls`` are ``interact``'s abbreviations (``(low, high, step)``, a list of choices, a
    bool); the initial values are ``function``'s own defaults, which every control needs. When the
    book's pipeline executes the chapter (``ICML26_OFFLINE=1``, no widget frontend) the function
    runs once at those defaults, so the rendered page shows a static figure; in Jupyter the
    controls move it live. Returns None, so the cell shows nothing else (a second output of a
    figure cell would break the strict build).
    """
    import inspect
    import os

    signature = inspect.signature(function)
    missing = [name for name in controls
               if name not in signature.parameters
               or signature.parameters[name].default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"explore: give {function.__name__} a default for {missing}")
    if os.environ.get("ICML26_OFFLINE") == "1":
        function()
        return None
    from ipywidgets import interact

    interact(function, **controls)  # displays the controls and the live output itself
    return None
