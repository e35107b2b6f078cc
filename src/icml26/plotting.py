"""The book-wide matplotlib style and small figure helpers.

Every chapter calls :func:`use_book_style` once in its setup cell, so figures share fonts, sizes
and a colour-blind-safe palette, and each method keeps one colour across a chapter's figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Circle, FancyArrowPatch

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


DAG_NODE_RADIUS = 0.32
"""Radius of a node in :func:`draw_dag`, in data units (nodes sit about 1.6 apart)."""


def draw_dag(ax, graph, cut=(), highlight=(), title: str | None = None) -> None:
    """Draw a causal graph (DAG) on ``ax``: circles with labels, arrows between their rims.

    ``graph`` is ``{"nodes": {label: (x, y)}, "edges": [(parent, child), ...]}``. Edges in
    ``cut`` (those an intervention removes) are dashed grey; nodes in ``highlight`` are filled.
    """
    nodes, edges = graph["nodes"], list(graph["edges"])
    unknown = {n for edge in [*edges, *cut] for n in edge} - set(nodes)
    unknown |= set(highlight) - set(nodes)
    if unknown:
        raise ValueError(f"edges or highlights name unknown nodes: {sorted(unknown)}")
    if set(cut) - set(edges):
        raise ValueError(f"cut edges must be edges of the graph: {sorted(set(cut) - set(edges))}")
    for label, (x, y) in nodes.items():
        filled = label in highlight
        ax.add_patch(Circle((x, y), DAG_NODE_RADIUS, facecolor=PALETTE[0] if filled else "white",
                            edgecolor=PALETTE[0], linewidth=1.5, zorder=2))
        ax.text(x, y, label, ha="center", va="center", zorder=3,
                color="white" if filled else "black", fontsize=11)
    for parent, child in edges:
        start, end = np.asarray(nodes[parent], float), np.asarray(nodes[child], float)
        unit = (end - start) / np.linalg.norm(end - start)
        is_cut = (parent, child) in cut
        ax.add_patch(FancyArrowPatch(tuple(start + DAG_NODE_RADIUS * unit),
                                     tuple(end - DAG_NODE_RADIUS * unit),
                                     arrowstyle="-|>", mutation_scale=12, linewidth=1.3,
                                     color="0.6" if is_cut else "black",
                                     linestyle="--" if is_cut else "-", zorder=1))
    xs, ys = zip(*nodes.values(), strict=True)
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
