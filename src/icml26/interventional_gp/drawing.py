"""Small causal graphs (DAGs) for the chapter's settings, drawn in the book's style.

A graph is a dict of node positions and a list of edges; :func:`draw_dag` draws circles with
labels and arrows between their rims, and greys out the arrows an intervention cuts.
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Circle, FancyArrowPatch

from icml26.plotting import PALETTE

RADIUS = 0.32

MEDIATOR_CHAIN = {"nodes": {"$A$": (0, 0), "$V$": (1.6, 0), "$Y$": (3.2, 0)},
                  "edges": [("$A$", "$V$"), ("$V$", "$Y$")]}
"""The chain $A \\to V \\to Y$ with no hidden common causes."""

BENCHMARK_CHAIN = {"nodes": {"$Z$": (0, 0), "$V_1$": (1.6, 1.0), "$V_j$": (1.6, 0.0),
                             "$V_d$": (1.6, -1.0), "$Y$": (3.2, 0)},
                   "edges": [("$Z$", "$V_1$"), ("$Z$", "$V_j$"), ("$Z$", "$V_d$"),
                             ("$V_1$", "$Y$"), ("$V_j$", "$Y$"), ("$V_d$", "$Y$")]}
"""The benchmark: treatment $Z$, $d$ mediators in parallel, one outcome."""

BACKDOOR_GRAPH = {"nodes": {"$W$": (1.6, 1.1), "$A$": (0, 0), "$V$": (1.6, 0), "$Y$": (3.2, 0)},
                  "edges": [("$W$", "$A$"), ("$W$", "$V$"), ("$A$", "$V$"), ("$V$", "$Y$")]}
"""Observed covariates $W$ cause $A$ and $V$; no arrow $W \\to Y$."""


def draw_dag(ax, graph, cut=(), highlight=(), title: str | None = None) -> None:
    """Draw ``graph`` on ``ax``; edges in ``cut`` are dashed grey, nodes in ``highlight`` filled.

    ``graph`` is ``{"nodes": {label: (x, y)}, "edges": [(parent, child), ...]}``.
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
        ax.add_patch(Circle((x, y), RADIUS, facecolor=PALETTE[0] if filled else "white",
                            edgecolor=PALETTE[0], linewidth=1.5, zorder=2))
        ax.text(x, y, label, ha="center", va="center", zorder=3,
                color="white" if filled else "black", fontsize=11)
    for parent, child in edges:
        start, end = np.asarray(nodes[parent], float), np.asarray(nodes[child], float)
        unit = (end - start) / np.linalg.norm(end - start)
        is_cut = (parent, child) in cut
        ax.add_patch(FancyArrowPatch(tuple(start + RADIUS * unit), tuple(end - RADIUS * unit),
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
