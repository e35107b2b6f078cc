"""The chapter's settings as causal graphs (DAGs), for :func:`icml26.plotting.draw_dag`.

A graph is a dict of node positions and a list of (parent, child) edges.
"""

from __future__ import annotations

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
