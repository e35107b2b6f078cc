"""The information geometry of softmax: probes, Euclidean steering and dual steering.

Chapter ``dual-steering`` of the book. A softmax head with unembedding ``G`` (one row
``gamma(y)`` per token) turns a representation ``lam`` into the exponential family
``p_lam(y) = exp(<gamma(y), lam> - A(lam))`` (Eq. ``eq-dst-family``). This module holds

* the geometry: the log-partition ``A`` (``eq-dst-family``), the mean parameter ``mu = grad A``
  (``eq-dst-mean``), the Fisher metric ``grad^2 A`` (``eq-dst-fisher``), the Bregman divergence
  of ``A`` as a KL divergence (``eq-dst-bregman``), the map back from mean to natural
  coordinates (``eq-dst-mapback``), primal and dual interpolation (``eq-dst-interp``) and the KL
  projection onto a probe level set (``eq-dst-projection``);
* probes (logistic regression and mean difference) and the concept metrics (target ratio,
  off-target KL with counterfactual pairs merged, rank changes);
* steering: Euclidean steering along the probe and ridge-regularised dual (natural-gradient)
  steering (``eq-dst-steer``), vectorised over contexts and stopped at a target ratio;
* the bilingual toy language and a tiny next-token model with a low-dimensional representation
  and an untied unembedding.

Every array of representations is ``(n, d)`` or ``(d,)``; probabilities are ``(n, V)`` or
``(V,)``. Bad input raises ``ValueError`` or ``TypeError``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog, minimize
from scipy.special import logsumexp, softmax

from .core import check_count, check_positive

# --- input checks -----------------------------------------------------------------------------


def check_unembedding(G) -> np.ndarray:
    """A finite ``(V, d)`` unembedding with ``V >= 2`` and ``d >= 1``, as float64."""
    if isinstance(G, torch.Tensor):
        G = G.detach().cpu().numpy()
    G = np.asarray(G, dtype=float)
    if G.ndim != 2 or G.shape[0] < 2 or G.shape[1] < 1:
        raise ValueError(f"the unembedding must be a (V, d) matrix with V >= 2, got {G.shape}")
    if not np.all(np.isfinite(G)):
        raise ValueError("the unembedding contains NaN or infinite entries")
    return G


def check_representation(G: np.ndarray, lam) -> np.ndarray:
    """``lam`` as float64 of shape ``(d,)`` or ``(n, d)`` matching the width of ``G``."""
    if isinstance(lam, torch.Tensor):
        lam = lam.detach().cpu().numpy()
    lam = np.asarray(lam, dtype=float)
    if lam.ndim not in (1, 2):
        raise ValueError(f"a representation is a vector or a batch of vectors, got {lam.shape}")
    if lam.shape[-1] != G.shape[1]:
        raise ValueError(f"the representation has width {lam.shape[-1]}, "
                         f"but the unembedding expects width {G.shape[1]}")
    if not np.all(np.isfinite(lam)):
        raise ValueError("the representation contains NaN or infinite entries")
    return lam


def check_direction(w, d: int) -> np.ndarray:
    """A probe direction of width ``d`` with a positive, finite norm."""
    if isinstance(w, torch.Tensor):
        w = w.detach().cpu().numpy()
    w = np.asarray(w, dtype=float)
    if w.shape != (d,):
        raise ValueError(f"the probe direction must have shape ({d},), got {w.shape}")
    norm = np.linalg.norm(w)
    if not np.isfinite(norm):
        raise ValueError("the probe direction contains NaN or infinite entries")
    if norm < 1e-12:
        raise ValueError("the probe direction has zero norm: it defines no concept")
    return w


def check_probabilities(p, name: str = "p") -> np.ndarray:
    """Rows of non-negative numbers summing to one."""
    p = np.asarray(p, dtype=float)
    if p.ndim not in (1, 2) or p.shape[-1] < 2:
        raise ValueError(f"{name} must be a distribution or a batch of them, got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    if not np.allclose(p.sum(axis=-1), 1.0, atol=1e-8):
        raise ValueError(f"every row of {name} must sum to one")
    return p


# --- the exponential family -------------------------------------------------------------------


def log_partition(G, lam) -> np.ndarray | float:
    """``A(lam) = log sum_y exp(<gamma(y), lam>)``, Eq. ``eq-dst-family``."""
    G = check_unembedding(G)
    lam = check_representation(G, lam)
    out = logsumexp(lam @ G.T, axis=-1)
    return float(out) if lam.ndim == 1 else out


def probabilities(G, lam) -> np.ndarray:
    """``p_lam = softmax(G lam)``, Eq. ``eq-dst-family``."""
    G = check_unembedding(G)
    lam = check_representation(G, lam)
    return softmax(lam @ G.T, axis=-1)


def mean_parameter(G, lam) -> np.ndarray:
    """The dual coordinate ``mu(lam) = grad A(lam) = G^T p_lam``, Eq. ``eq-dst-mean``."""
    G = check_unembedding(G)
    return probabilities(G, lam) @ G


def fisher_metric(G, lam) -> np.ndarray:
    """``grad^2 A(lam) = Cov_{p_lam}[gamma(Y)] = G^T (diag p - p p^T) G``, Eq. ``eq-dst-fisher``.

    Returns ``(d, d)`` for one representation and ``(n, d, d)`` for a batch.
    """
    G = check_unembedding(G)
    p = probabilities(G, lam)
    mu = p @ G
    if p.ndim == 1:
        second = (G.T * p) @ G
    elif len(p):  # one BLAS product per context: faster than a broadcast batched matmul
        second = np.stack([(G.T * row) @ G for row in p])
    else:
        second = np.zeros((0, G.shape[1], G.shape[1]))
    return second - mu[..., :, None] * mu[..., None, :]


def kl_divergence(p, q) -> np.ndarray | float:
    """``KL(p || q) = sum_y p(y) log(p(y) / q(y))`` row by row (``0 log 0 = 0``)."""
    p = check_probabilities(p, "p")
    q = check_probabilities(q, "q")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q live on different supports: {p.shape} and {q.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    out = terms.sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def bregman_divergence(G, lam_a, lam_b) -> np.ndarray | float:
    """``D_A(lam_a, lam_b) = A(lam_a) - A(lam_b) - <mu(lam_b), lam_a - lam_b>``.

    Eq. ``eq-dst-bregman``: it equals ``KL(p_{lam_b} || p_{lam_a})`` (note the order).
    """
    G = check_unembedding(G)
    lam_a = check_representation(G, lam_a)
    lam_b = check_representation(G, lam_b)
    gap = log_partition(G, lam_a) - log_partition(G, lam_b)
    return gap - np.sum(mean_parameter(G, lam_b) * (lam_a - lam_b), axis=-1)


def entropy(p) -> np.ndarray | float:
    """Shannon entropy in nats, row by row."""
    p = check_probabilities(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


# --- the map back from mean to natural coordinates --------------------------------------------


def hull_margin(G, mu) -> float:
    """The largest ``t`` with ``mu = G^T p``, ``p >= t``, ``sum p = 1`` (a linear program).

    ``mu`` is in the interior of the convex hull of the unembedding rows (the range of the mean
    map, Eq. ``eq-dst-mapback``) when the margin is positive; it is negative outside the hull.
    """
    G = check_unembedding(G)
    mu = check_representation(G, mu)
    if mu.ndim != 1:
        raise ValueError("hull_margin takes one mean vector")
    V, d = G.shape
    # variables (p_1..p_V, t); maximise t subject to p_y - t >= 0, G^T p = mu, 1^T p = 1
    c = np.zeros(V + 1)
    c[-1] = -1.0
    A_ub = np.hstack([-np.eye(V), np.ones((V, 1))])
    A_eq = np.vstack([np.hstack([G.T, np.zeros((d, 1))]), np.hstack([np.ones(V), 0.0])])
    b_eq = np.append(mu, 1.0)
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(V), A_eq=A_eq, b_eq=b_eq,
                  bounds=[(None, None)] * (V + 1), method="highs")
    if res.status != 0:
        return -math.inf
    return float(-res.fun)


def dual_to_primal(G, mu, *, init=None, method: str = "lbfgs", tol: float = 1e-10,
                   max_iter: int = 500, check_range: bool = True) -> np.ndarray:
    """Solve ``grad A(lam) = mu`` for ``lam``: the map back of Eq. ``eq-dst-mapback``.

    ``method="lbfgs"`` minimises the convex function ``A(lam) - <mu, lam>`` with L-BFGS (its
    gradient is ``mu(lam) - mu``); ``method="newton"`` runs damped Newton steps with the Fisher
    metric, fast from a warm start ``init``. The solution exists and is unique when ``mu`` is in
    the interior of the convex hull of the rows of ``G`` and ``G`` has full column rank after
    centring; a ``mu`` outside raises ``ValueError``.
    """
    G = check_unembedding(G)
    mu = check_representation(G, mu)
    if mu.ndim != 1:
        raise ValueError("dual_to_primal takes one mean vector")
    if method not in ("lbfgs", "newton"):
        raise ValueError(f"method must be 'lbfgs' or 'newton', got {method!r}")
    if check_range and hull_margin(G, mu) <= 1e-12:
        raise ValueError("the target mean lies outside the attainable range (the interior of "
                         "the convex hull of the unembedding rows); no representation maps to it")
    lam = np.zeros(G.shape[1]) if init is None else check_representation(G, init).copy()
    if method == "lbfgs":
        def objective(x):
            z = G @ x
            m = z.max()
            e = np.exp(z - m)
            s = e.sum()
            return m + math.log(s) - mu @ x, G.T @ (e / s) - mu

        res = minimize(objective, lam, jac=True, method="L-BFGS-B",
                       options=dict(maxiter=max_iter, gtol=tol, ftol=0.0, maxcor=20))
        lam = res.x
    else:
        for _ in range(max_iter):
            grad = mean_parameter(G, lam) - mu
            if np.linalg.norm(grad) < tol:
                break
            step = np.linalg.solve(fisher_metric(G, lam), grad)
            f0 = log_partition(G, lam) - mu @ lam
            t = 1.0
            while t > 1e-8:
                trial = lam - t * step
                if log_partition(G, trial) - mu @ trial <= f0 - 0.25 * t * grad @ step:
                    break
                t /= 2
            lam = lam - t * step
    residual = np.linalg.norm(mean_parameter(G, lam) - mu)
    if residual > 1e-5 * max(1.0, np.linalg.norm(mu)):
        raise ValueError(f"the map back did not converge (|grad A - mu| = {residual:.2e}); the "
                         "target mean is at or near the edge of the attainable range")
    return lam


def primal_interpolation(G, lam0, lam1, s) -> np.ndarray:
    """``p_s`` on the straight line in natural coordinates, Eq. ``eq-dst-interp`` (product)."""
    G = check_unembedding(G)
    lam0, lam1 = check_representation(G, lam0), check_representation(G, lam1)
    s = np.atleast_1d(np.asarray(s, dtype=float))
    return probabilities(G, (1 - s)[:, None] * lam0 + s[:, None] * lam1)


def dual_interpolation(G, lam0, lam1, s) -> np.ndarray:
    """``p_s`` on the straight line in mean coordinates, Eq. ``eq-dst-interp`` (mixture).

    Each point solves the map back for ``mu = (1 - s) mu_0 + s mu_1`` with warm-started Newton.
    """
    G = check_unembedding(G)
    lam0, lam1 = check_representation(G, lam0), check_representation(G, lam1)
    s = np.atleast_1d(np.asarray(s, dtype=float))
    if np.any((s < 0) | (s > 1)):
        raise ValueError("dual interpolation is defined for s in [0, 1]")
    mu0, mu1 = mean_parameter(G, lam0), mean_parameter(G, lam1)
    out, lam = [], lam0.copy()
    for t in s:
        lam = dual_to_primal(G, (1 - t) * mu0 + t * mu1, init=lam, method="newton",
                             check_range=False)
        out.append(probabilities(G, lam))
    return np.array(out)


def kl_projection(G, lam0, w, level: float, *, tol: float = 1e-12) -> np.ndarray:
    """``argmin_lam KL(p_{lam0} || p_lam)`` s.t. ``<w, lam> = level``, Eq. ``eq-dst-projection``.

    Solved directly (L-BFGS over the hyperplane, coordinates ``lam = level w/|w|^2 + B z`` with
    ``B`` an orthonormal basis of the complement of ``w``), without using the theorem that the
    answer lies on the dual line; the chapter checks that it does.
    """
    G = check_unembedding(G)
    lam0 = check_representation(G, lam0)
    if lam0.ndim != 1:
        raise ValueError("kl_projection takes one representation")
    w = check_direction(w, G.shape[1])
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not np.isfinite(level):
        raise ValueError(f"the probe level must be a finite real number, got {level!r}")
    d = G.shape[1]
    basis = np.linalg.svd(np.eye(d) - np.outer(w, w) / (w @ w))[0][:, : d - 1]
    anchor = level * w / (w @ w)
    mu0 = mean_parameter(G, lam0)
    z0 = basis.T @ (lam0 - anchor)

    def objective(z):
        lam = anchor + basis @ z
        logits_ = G @ lam
        m = logits_.max()
        e = np.exp(logits_ - m)
        s = e.sum()
        value = m + math.log(s) - mu0 @ lam
        return value, basis.T @ (G.T @ (e / s) - mu0)

    res = minimize(objective, z0, jac=True, method="L-BFGS-B",
                   options=dict(maxiter=2000, gtol=tol, ftol=0.0, maxcor=30))
    return anchor + basis @ res.x


def pythagorean_residual(G, lam0, lam_star, lam_other) -> float:
    """``KL(p0 || p'') - KL(p0 || p*) - KL(p* || p'')``, Eq. ``eq-dst-pythagoras`` (0 in theory)."""
    G = check_unembedding(G)
    p0, ps, po = (probabilities(G, x) for x in (lam0, lam_star, lam_other))
    return float(kl_divergence(p0, po) - kl_divergence(p0, ps) - kl_divergence(ps, po))


def dual_line_residual(G, lam0, lam, w) -> float:
    """``|P_perp(mu(lam) - mu(lam0))| / |mu(lam) - mu(lam0)|``: 0 on the dual line through lam0."""
    G = check_unembedding(G)
    w = check_direction(w, G.shape[1])
    delta = mean_parameter(G, lam) - mean_parameter(G, lam0)
    perp = delta - (delta @ w) / (w @ w) * w
    return float(np.linalg.norm(perp) / max(np.linalg.norm(delta), 1e-300))


# --- probes and concept metrics ---------------------------------------------------------------


def _check_xy(X, y):
    X = np.asarray(X, dtype=float)
    y = np.asarray(y)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"need X (n, d) and labels (n,), got {X.shape} and {y.shape}")
    if set(np.unique(y).tolist()) != {0, 1}:
        raise ValueError("labels must be 0 and 1, both present")
    return X, y.astype(int)


def mean_difference_probe(X, y) -> np.ndarray:
    """The probe direction ``mean(X | y=1) - mean(X | y=0)``."""
    X, y = _check_xy(X, y)
    return X[y == 1].mean(axis=0) - X[y == 0].mean(axis=0)


def logistic_probe(X, y, C: float = 1.0) -> tuple[np.ndarray, float]:
    """A logistic-regression probe ``sigma(<w, x> + b)``; returns ``(w, b)``.

    Minimises ``C * sum_i log(1 + exp(-s_i (<w, x_i> + b))) + |w|^2 / 2`` with ``s_i = 2 y_i - 1``
    (the intercept is not penalised) by L-BFGS: the objective of scikit-learn's
    ``LogisticRegression(C=C)``, which the unit tests use as the oracle.
    """
    X, y = _check_xy(X, y)
    C = check_positive(C, "C")
    sign = 2.0 * y - 1.0
    Xb = np.hstack([X, np.ones((X.shape[0], 1))])

    def objective(theta):
        margin = sign * (Xb @ theta)
        loss = C * np.logaddexp(0.0, -margin).sum() + 0.5 * theta[:-1] @ theta[:-1]
        weight = -C * sign * np.exp(-np.logaddexp(0.0, margin))  # d loss / d score
        grad = Xb.T @ weight
        grad[:-1] += theta[:-1]
        return loss, grad

    res = minimize(objective, np.zeros(Xb.shape[1]), jac=True, method="L-BFGS-B",
                   options=dict(maxiter=5000, gtol=1e-10, ftol=0.0))
    return res.x[:-1].copy(), float(res.x[-1])


def probe_accuracy(X, y, w, b: float = 0.0) -> float:
    """Share of rows where ``<w, x> + b > 0`` agrees with the label."""
    X, y = _check_xy(X, y)
    w = check_direction(w, X.shape[1])
    return float(np.mean((X @ w + b > 0).astype(int) == y))


def check_pairs(base, target, V: int) -> tuple[np.ndarray, np.ndarray]:
    """Counterfactual pairs ``(base[k], target[k])``: disjoint, distinct token ids in ``[0, V)``."""
    base = np.asarray(base, dtype=int)
    target = np.asarray(target, dtype=int)
    if base.ndim != 1 or base.shape != target.shape or base.size == 0:
        raise ValueError("base and target must be equally long, non-empty lists of token ids")
    both = np.concatenate([base, target])
    if both.min() < 0 or both.max() >= V:
        raise ValueError(f"token ids must lie in [0, {V})")
    if np.unique(both).size != both.size:
        raise ValueError("the base and target tokens must all be distinct")
    return base, target


def target_ratio(p, base, target) -> np.ndarray | float:
    """``P(target forms) / (P(base forms) + P(target forms))``: the behavioural concept value."""
    p = np.asarray(p, dtype=float)
    base, target = check_pairs(base, target, p.shape[-1])
    pt = p[..., target].sum(axis=-1)
    return pt / (p[..., base].sum(axis=-1) + pt)


def merge_pairs(p, base, target) -> np.ndarray:
    """Merge each counterfactual pair into one outcome: the distribution with the concept removed.

    The merged outcome ``k`` carries ``p(base_k) + p(target_k)``; every other token keeps its
    own probability. Output columns: the merged pairs, then the remaining tokens in id order.
    """
    p = np.asarray(p, dtype=float)
    base, target = check_pairs(base, target, p.shape[-1])
    rest = np.setdiff1d(np.arange(p.shape[-1]), np.concatenate([base, target]))
    return np.concatenate([p[..., base] + p[..., target], p[..., rest]], axis=-1)


def offtarget_kl(p0, p, base, target) -> np.ndarray | float:
    """``KL(q_0 || q)`` of the merged distributions (forward, from the start)."""
    return kl_divergence(merge_pairs(p0, base, target), merge_pairs(p, base, target))


def rank_change(p0, p, base, target, top: int = 10) -> np.ndarray | float:
    """Mean absolute rank change, in the merged distribution, of the ``top`` outcomes of ``p0``."""
    q0 = np.atleast_2d(merge_pairs(p0, base, target))
    q = np.atleast_2d(merge_pairs(p, base, target))
    top = check_count(top, "top", 1)
    ranks0 = np.argsort(np.argsort(-q0, axis=-1), axis=-1)
    ranks = np.argsort(np.argsort(-q, axis=-1), axis=-1)
    best = np.argsort(-q0, axis=-1)[:, :top]
    out = np.abs(np.take_along_axis(ranks, best, -1) - np.take_along_axis(ranks0, best, -1))
    out = out.mean(axis=-1)
    return float(out[0]) if np.ndim(p0) == 1 and np.ndim(p) == 1 else out


# --- steering ---------------------------------------------------------------------------------


def steering_direction(G, lam, w, alpha: float) -> np.ndarray:
    """Unit step directions of Eq. ``eq-dst-steer``: ``normalize((F(lam) + alpha I)^{-1} w)``.

    ``alpha = inf`` gives Euclidean steering ``w / |w|``; ``alpha = 0`` gives exact dual
    (natural-gradient) steering, whose mean moves along ``w``. ``lam`` may be a batch.
    """
    G = check_unembedding(G)
    lam = check_representation(G, lam)
    w = check_direction(w, G.shape[1])
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or alpha < 0 \
            or math.isnan(alpha):
        raise ValueError(f"alpha must be a non-negative number or inf, got {alpha!r}")
    batch = np.atleast_2d(lam)
    if math.isinf(alpha):
        out = np.broadcast_to(w / np.linalg.norm(w), batch.shape).copy()
    else:
        F = fisher_metric(G, batch) + alpha * np.eye(G.shape[1])
        out = np.linalg.solve(F, np.broadcast_to(w, batch.shape)[..., None])[..., 0]
        out /= np.linalg.norm(out, axis=-1, keepdims=True)
    return out if lam.ndim == 2 else out[0]


@dataclass
class SteeringResult:
    """Where steering stopped for each context: the representation, whether the target ratio was
    reached, the steps taken, and the Euclidean distance ``|lam - lam0|`` from the start (not the
    arc length of the path)."""

    lam: np.ndarray
    reached: np.ndarray
    steps: np.ndarray
    distance: np.ndarray


def steer_to_ratio(G, lam0, w, base, target, *, ratio: float = 0.9, alpha: float = math.inf,
                   step: float = 0.05, max_steps: int = 2000, correct: bool = True,
                   bisections: int = 30) -> SteeringResult:
    """Steer every context along Eq. ``eq-dst-steer`` until the target ratio reaches ``ratio``.

    Steps of arc length ``step`` along ``steering_direction``; the crossing inside the last step
    is found by bisection on the segment. With ``alpha = 0`` and ``correct=True`` each step is
    followed by one Newton correction back onto the dual line ``mu(lam) = mu_0 + nu w`` (removing
    the discretisation drift). Contexts that do not reach the ratio within ``max_steps`` keep their
    last point with ``reached = False``. The target ratio must lie strictly between 0 and 1.
    """
    G = check_unembedding(G)
    lam0 = np.atleast_2d(check_representation(G, lam0))
    w = check_direction(w, G.shape[1])
    base, target = check_pairs(base, target, G.shape[0])
    n = lam0.shape[0]
    if isinstance(ratio, bool) or not isinstance(ratio, (numbers.Real, np.ndarray, list, tuple)):
        raise TypeError(f"the target ratio must be a number or an array, got {ratio!r}")
    ratio = np.asarray(ratio, dtype=float)
    if ratio.ndim == 0:
        ratio = np.full(n, float(ratio))
    if ratio.shape != (n,):
        raise ValueError(f"need one target ratio or one per context ({n}), got shape {ratio.shape}")
    if not np.all((ratio > 0) & (ratio < 1)):
        raise ValueError("the target ratio must lie strictly between 0 and 1; a ratio of 0 or 1 "
                         "is outside the attainable range of the softmax")
    step = check_positive(step, "step")
    max_steps = check_count(max_steps, "max_steps", 1)
    lam = lam0.copy()
    mu0 = mean_parameter(G, lam0)
    what = w / np.linalg.norm(w)
    steps = np.zeros(n, dtype=int)
    reached = target_ratio(probabilities(G, lam), base, target) >= ratio
    active = ~reached
    for _ in range(max_steps):
        if not active.any():
            break
        idx = np.flatnonzero(active)
        cur = lam[idx]
        new = cur + step * steering_direction(G, cur, w, alpha)
        if alpha == 0 and correct:
            delta = mean_parameter(G, new) - mu0[idx]
            off = delta - (delta @ what)[:, None] * what
            new = new - np.linalg.solve(fisher_metric(G, new), off[..., None])[..., 0]
        r_new = target_ratio(probabilities(G, new), base, target)
        hit = r_new >= ratio[idx]
        for j in np.flatnonzero(hit):
            lo, hi = cur[j], new[j]
            for _b in range(bisections):
                mid = 0.5 * (lo + hi)
                if target_ratio(probabilities(G, mid), base, target) >= ratio[idx[j]]:
                    hi = mid
                else:
                    lo = mid
            new[j] = hi
        lam[idx] = new
        steps[idx] += 1
        reached[idx[hit]] = True
        active[idx[hit]] = False
    distance = np.linalg.norm(lam - lam0, axis=-1)
    return SteeringResult(lam, reached, steps, distance)


def steering_path(G, lam0, w, *, alpha: float = math.inf, step: float = 0.05,
                  steps: int = 100) -> np.ndarray:
    """The whole path ``(steps + 1, d)`` of one context under Eq. ``eq-dst-steer`` (no stopping)."""
    G = check_unembedding(G)
    lam = check_representation(G, lam0)
    if lam.ndim != 1:
        raise ValueError("steering_path takes one representation")
    steps = check_count(steps, "steps", 1)
    step = check_positive(step, "step")
    path = [lam.copy()]
    for _ in range(steps):
        lam = lam + step * steering_direction(G, lam, w, alpha)
        path.append(lam.copy())
    return np.array(path)


# --- the bilingual toy language ---------------------------------------------------------------


@dataclass
class BilingualLanguage:
    """A toy language with a known binary concept (the language bit) and topics.

    Token ids: ``n_verbs`` English verbs, their ``n_verbs`` French forms, ``n_topics`` topic cues,
    ``n_cues`` English and ``n_cues`` French function words, ``n_fillers`` neutral fillers, and a
    padding id ``vocab_size`` that is never predicted. A sequence draws a topic and a language;
    its context (of random length) mixes topic cues, language cues, verbs of the topic in the
    sequence's form, and fillers, each corrupted with small probabilities; the next token is a
    verb of the topic in the sequence's form (probability ``1 - filler_prob``) or a filler.
    """

    n_verbs: int = 24
    n_topics: int = 6
    n_cues: int = 3
    n_fillers: int = 8
    max_context: int = 10
    topic_concentration: float = 0.3
    filler_prob: float = 0.25
    noise: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_verbs", "n_topics", "n_cues", "n_fillers", "max_context"):
            check_count(getattr(self, name), name, 1)
        check_positive(self.topic_concentration, "topic_concentration")
        if not 0 <= self.filler_prob < 1 or not 0 <= self.noise < 0.5:
            raise ValueError("filler_prob must lie in [0, 1) and noise in [0, 0.5)")
        rng = np.random.default_rng(self.seed)
        self.topic_verbs = rng.dirichlet(np.full(self.n_verbs, self.topic_concentration),
                                         size=self.n_topics)
        self.filler_dist = rng.dirichlet(np.full(self.n_fillers, 2.0))

    @property
    def vocab_size(self) -> int:
        return 2 * self.n_verbs + self.n_topics + 2 * self.n_cues + self.n_fillers

    @property
    def pad(self) -> int:
        return self.vocab_size

    @property
    def english(self) -> np.ndarray:
        return np.arange(self.n_verbs)

    @property
    def french(self) -> np.ndarray:
        return np.arange(self.n_verbs, 2 * self.n_verbs)

    def _offsets(self):
        topic0 = 2 * self.n_verbs
        cue0 = topic0 + self.n_topics
        filler0 = cue0 + 2 * self.n_cues
        return topic0, cue0, filler0

    def sample(self, n: int, rng: np.random.Generator, language=None, min_context: int = 1):
        """``n`` sequences: contexts ``(n, max_context)`` (padded), next tokens, languages, topics.

        ``language`` fixes the language bit (0 English, 1 French); ``None`` draws it fairly.
        """
        n = check_count(n, "n", 1)
        min_context = check_count(min_context, "min_context", 1)
        if min_context > self.max_context:
            raise ValueError("min_context exceeds max_context")
        topic0, cue0, filler0 = self._offsets()
        topics = rng.integers(self.n_topics, size=n)
        lang = rng.integers(2, size=n) if language is None else np.full(n, int(language))
        lengths = rng.integers(min_context, self.max_context + 1, size=n)
        shape = (n, self.max_context)
        kind = rng.choice(4, size=shape, p=[0.3, 0.2, 0.3, 0.2])
        flip = rng.random(shape) < self.noise
        t, z = topics[:, None], lang[:, None]
        zz = np.where(flip, 1 - z, z)
        topic_tok = topic0 + np.where(flip, rng.integers(self.n_topics, size=shape), t)
        cue_tok = cue0 + zz * self.n_cues + rng.integers(self.n_cues, size=shape)
        cum = np.cumsum(self.topic_verbs[topics], axis=1)
        verb = np.minimum((cum[:, None, :] < rng.random(shape)[..., None]).sum(-1),
                          self.n_verbs - 1)
        verb_tok = zz * self.n_verbs + verb
        filler_tok = filler0 + np.minimum(
            np.searchsorted(np.cumsum(self.filler_dist), rng.random(shape)), self.n_fillers - 1)
        ctx = np.choose(kind, [topic_tok, cue_tok, verb_tok, filler_tok]).astype(np.int64)
        ctx[np.arange(self.max_context)[None, :] >= lengths[:, None]] = self.pad
        is_filler = rng.random(n) < self.filler_prob
        verbs = np.minimum((cum < rng.random(n)[:, None]).sum(-1), self.n_verbs - 1)
        fillers = filler0 + np.minimum(
            np.searchsorted(np.cumsum(self.filler_dist), rng.random(n)), self.n_fillers - 1)
        nxt = np.where(is_filler, fillers, lang * self.n_verbs + verbs)
        return ctx, nxt, lang, topics


class BagModel(torch.nn.Module):
    """Mean of token embeddings -> MLP -> representation ``lam`` in R^d -> untied unembedding ``G``.

    ``logits = G lam`` with no bias, so the head is exactly the exponential family of
    Eq. ``eq-dst-family``.
    """

    def __init__(self, vocab_size: int, width: int = 32, hidden: int = 64, d: int = 12,
                 seed: int = 0) -> None:
        super().__init__()
        check_count(vocab_size, "vocab_size", 2)
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab_size + 1, width, padding_idx=vocab_size)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(),
                                       torch.nn.Linear(hidden, d))
        self.unembed = torch.nn.Linear(d, vocab_size, bias=False)
        self.pad = vocab_size

    def representation(self, ctx: torch.Tensor) -> torch.Tensor:
        mask = (ctx != self.pad).unsqueeze(-1).float()
        pooled = (self.embed(ctx) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.mlp(pooled)

    def forward(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.representation(ctx))

    @property
    def G(self) -> np.ndarray:  # noqa: N802 - the chapter's symbol for the unembedding
        return self.unembed.weight.detach().double().numpy().copy()


def train_bag_model(language: BilingualLanguage, *, d: int = 12, steps: int = 1500,
                    batch_size: int = 256, lr: float = 3e-3,
                    seed: int = 0) -> tuple[BagModel, list]:
    """Train :class:`BagModel` with Adam on samples of ``language``; returns (model, losses)."""
    steps = check_count(steps, "steps", 1)
    rng = np.random.default_rng(seed + 1)
    model = BagModel(language.vocab_size, d=check_count(d, "d", 2), seed=seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=check_positive(lr, "lr"))
    ctx, nxt, _, _ = language.sample(steps * batch_size // 4 + batch_size, rng)
    ctx_t, nxt_t = torch.from_numpy(ctx), torch.from_numpy(nxt)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(ctx_t), (batch_size,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(ctx_t[idx]), nxt_t[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    return model, losses


def representations(model: BagModel, ctx) -> np.ndarray:
    """The representations ``lam`` of contexts, as float64 ``(n, d)``."""
    with torch.no_grad():
        return model.representation(torch.as_tensor(ctx)).double().numpy()


def pair_spread_head(G, base, target, spread: float) -> np.ndarray:
    """A copy of ``G`` whose pair differences are ``delta + spread * (g_target - g_base - delta)``.

    ``delta`` is the mean pair difference. ``spread = 1`` returns ``G``; ``spread = 0`` makes every
    counterfactual pair differ by the same vector, so that the target ratio is exactly
    ``sigmoid(<delta, lam>)`` (Eq. ``eq-dst-parallel``). Base rows and all other rows are kept.
    """
    G = check_unembedding(G).copy()
    base, target = check_pairs(base, target, G.shape[0])
    if isinstance(spread, bool) or not isinstance(spread, numbers.Real) or spread < 0:
        raise ValueError(f"spread must be a non-negative number, got {spread!r}")
    diff = G[target] - G[base]
    delta = diff.mean(axis=0)
    G[target] = G[base] + delta + spread * (diff - delta)
    return G


def pair_direction(G, base, target) -> np.ndarray:
    """The mean pair difference ``delta = mean_k (g(target_k) - g(base_k))`` of the unembedding."""
    G = check_unembedding(G)
    base, target = check_pairs(base, target, G.shape[0])
    return (G[target] - G[base]).mean(axis=0)


def steering_trace(G, lam0, w, base, target, *, alpha: float = math.inf, step: float = 0.1,
                   steps: int = 100) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steer a batch of contexts for a fixed number of steps of Eq. ``eq-dst-steer``.

    Returns ``(ratio, offtarget, full)``, each ``(steps + 1, n)``: the target ratio, the
    off-target KL and the full KL from the start after every step (no Newton correction).
    """
    G = check_unembedding(G)
    lam = np.atleast_2d(check_representation(G, lam0)).copy()
    base, target = check_pairs(base, target, G.shape[0])
    steps = check_count(steps, "steps", 1)
    step = check_positive(step, "step")
    p0 = probabilities(G, lam)
    ratios, off, full = [], [], []
    for k in range(steps + 1):
        if k:
            lam = lam + step * steering_direction(G, lam, w, alpha)
        p = probabilities(G, lam)
        ratios.append(target_ratio(p, base, target))
        off.append(offtarget_kl(p0, p, base, target))
        full.append(kl_divergence(p0, p))
    return np.array(ratios), np.array(off), np.array(full)


# --- several model seeds at once ----------------------------------------------------------------


def train_bag_models(language: BilingualLanguage, seeds, *, d: int = 12, steps: int = 1500,
                     batch_size: int = 256, lr: float = 3e-3) -> tuple[list[BagModel], np.ndarray]:
    """Train one :class:`BagModel` per seed in ``seeds``, all in one stacked network.

    Every seed gets exactly what :func:`train_bag_model` would give it (the same initial weights,
    training samples and mini-batches, and Adam, which acts entry by entry): the parameters of
    the ``S`` models are stacked along a leading axis and the summed loss of the ``S`` models is
    minimised, so one batched forward and backward pass per step replaces ``S``. Returns the
    trained models and the losses ``(steps, S)``.
    """
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds}")
    steps = check_count(steps, "steps", 1)
    batch_size = check_count(batch_size, "batch_size", 1)
    d = check_count(d, "d", 2)
    models = [BagModel(language.vocab_size, d=d, seed=s) for s in seeds]
    names = [name for name, _ in models[0].named_parameters()]
    stacked = {name: torch.stack([dict(m.named_parameters())[name].detach() for m in models])
               .clone().requires_grad_(True) for name in names}
    optimiser = torch.optim.Adam(stacked.values(), lr=check_positive(lr, "lr"))
    data = [language.sample(steps * batch_size // 4 + batch_size, np.random.default_rng(s + 1))
            for s in seeds]
    ctx_all = torch.stack([torch.from_numpy(c) for c, *_ in data])  # (S, N, L)
    nxt_all = torch.stack([torch.from_numpy(n) for _, n, *_ in data])  # (S, N)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    S, pad = len(seeds), language.pad
    rows = torch.arange(S)[:, None, None]
    losses = np.zeros((steps, S))
    for k in range(steps):
        idx = torch.stack([torch.randint(ctx_all.shape[1], (batch_size,), generator=g)
                           for g in gens])
        ctx = torch.gather(ctx_all, 1, idx[..., None].expand(-1, -1, ctx_all.shape[2]))
        nxt = torch.gather(nxt_all, 1, idx)
        mask = (ctx != pad).unsqueeze(-1).float()
        emb = stacked["embed.weight"][rows, ctx]  # (S, B, L, width)
        pooled = (emb * mask).sum(2) / mask.sum(2).clamp(min=1)
        h = torch.nn.functional.gelu(pooled @ stacked["mlp.0.weight"].transpose(1, 2)
                                     + stacked["mlp.0.bias"][:, None])
        lam = h @ stacked["mlp.2.weight"].transpose(1, 2) + stacked["mlp.2.bias"][:, None]
        logits = lam @ stacked["unembed.weight"].transpose(1, 2)  # (S, B, V)
        per_seed = torch.nn.functional.cross_entropy(
            logits.reshape(S * batch_size, -1), nxt.reshape(-1), reduction="none"
        ).reshape(S, batch_size).mean(1)
        optimiser.zero_grad()
        per_seed.sum().backward()
        optimiser.step()
        losses[k] = per_seed.detach().numpy()
    with torch.no_grad():
        for j, m in enumerate(models):
            for name, param in m.named_parameters():
                param.copy_(stacked[name][j])
    return models, losses


def dual_mean_difference_probe(G, X, y) -> np.ndarray:
    """The authors' ``dual_md``: the mean difference of the mean parameters ``mu = G^T p_lam``.

    ``primal_md`` (:func:`mean_difference_probe`) averages the representations ``lam``;
    ``dual_md`` maps each to its mean coordinate first, then takes the same difference.
    """
    G = check_unembedding(G)
    X = check_representation(G, X)
    return mean_difference_probe(mean_parameter(G, np.atleast_2d(X)), y)


def pair_r2(G, base, target) -> float:
    """Share of the energy of the pair differences ``g(target_k) - g(base_k)`` that their mean
    ``delta`` explains: ``1 - sum_k |diff_k - delta|^2 / sum_k |diff_k|^2`` (1: parallel pairs)."""
    G = check_unembedding(G)
    base, target = check_pairs(base, target, G.shape[0])
    diffs = G[target] - G[base]
    return float(1 - ((diffs - diffs.mean(0)) ** 2).sum() / (diffs**2).sum())


def spread_for_pair_r2(r2_head: float, r2: float) -> float:
    """The spread factor ``kappa`` of :func:`pair_spread_head` that turns a head with pair R^2
    ``r2_head`` into one with pair R^2 ``r2`` (``kappa = 1`` keeps the head; 0 is parallel)."""
    for value, name in ((r2_head, "r2_head"), (r2, "r2")):
        if not 0 < value < 1:
            raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return float(math.sqrt(r2_head / (1 - r2_head) * (1 - r2) / r2))


def reciprocal_rank_change(p0, p, base, target, top_p: float = 0.999) -> np.ndarray | float:
    """The authors' rank metric (``get_rank_diff``) between a start and an end distribution.

    Both are merged (:func:`merge_pairs`); the support is the union of the smallest sets of
    merged outcomes holding ``top_p`` of the mass of each; ranks are taken inside that support,
    and the result is ``sum_y q0(y) |1/rank(y) - 1/rank0(y)|`` with ``q0`` renormalised on it.
    The authors take the union over 20 points of the whole path; we take its two ends.
    """
    q0 = np.atleast_2d(merge_pairs(p0, base, target))
    q = np.atleast_2d(merge_pairs(p, base, target))
    if q0.shape != q.shape:
        raise ValueError(f"p0 and p must have the same shape, got {q0.shape} and {q.shape}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
    out = np.empty(len(q0))
    for i, (a, b) in enumerate(zip(q0, q, strict=True)):
        keep = np.zeros(a.size, dtype=bool)
        for row in (a, b):
            order = np.argsort(-row, kind="stable")
            before = np.cumsum(row[order]) - row[order]
            keep[order[before < top_p]] = True
        a_k, b_k = a[keep], b[keep]
        r0 = np.empty(a_k.size)
        r0[np.argsort(-a_k, kind="stable")] = np.arange(1, a_k.size + 1)
        r1 = np.empty(b_k.size)
        r1[np.argsort(-b_k, kind="stable")] = np.arange(1, b_k.size + 1)
        out[i] = (a_k / a_k.sum()) @ np.abs(1 / r1 - 1 / r0)
    return float(out[0]) if np.ndim(p0) == 1 and np.ndim(p) == 1 else out


# --- a real unembedding: steering on the top logits, batched in torch ---------------------------


def top_logit_support(G, lam0, base, target, k: int) -> np.ndarray:
    """Token ids of one restricted family shared by the contexts: the ``m`` base forms, the ``m``
    target forms, then the union over contexts of each one's ``k`` largest remaining logits at the
    start (in id order). The authors' conjugate-gradient step also works on the top logits."""
    G = check_unembedding(G)
    lam0 = np.atleast_2d(check_representation(G, lam0))
    base, target = check_pairs(base, target, G.shape[0])
    k = check_count(k, "k", 1)
    pair_ids = np.concatenate([base, target])
    if k > G.shape[0] - pair_ids.size:
        raise ValueError(f"k = {k} exceeds the {G.shape[0] - pair_ids.size} tokens outside "
                         "the pairs")
    logits = lam0 @ G.T
    logits[:, pair_ids] = -np.inf
    top = np.unique(np.argpartition(-logits, k - 1, axis=1)[:, :k])
    return np.concatenate([pair_ids, top])


def steer_restricted(G, lam0, w, n_pairs: int, *, ratio: float = 0.9, alpha: float = math.inf,
                     step: float = 1.0, max_steps: int = 200, cg_iters: int = 20,
                     bisections: int = 20) -> SteeringResult:
    """Steer contexts to ``ratio`` in the family of the rows of ``G`` (a restricted unembedding,
    its first ``n_pairs`` rows the base forms and the next ``n_pairs`` the target forms, as
    :func:`top_logit_support` orders them).

    ``alpha = inf`` is Euclidean steering; a finite ``alpha`` is the authors' ridge-regularised
    dual step ``normalize((F + alpha I)^{-1} w)``, with ``(F + alpha I) x = w`` solved by
    ``cg_iters`` matrix-free conjugate-gradient iterations, as in the authors' ``m_steering``,
    batched over contexts in float32 torch. Steps have length ``step``; the crossing inside the
    last step is found by bisection, as in :func:`steer_to_ratio`.
    """
    G = check_unembedding(G)
    lam0 = np.atleast_2d(check_representation(G, lam0))
    w = check_direction(w, G.shape[1])
    n_pairs = check_count(n_pairs, "n_pairs", 1)
    if G.shape[0] <= 2 * n_pairs:
        raise ValueError("the restricted unembedding needs rows beyond the pairs")
    if not 0 < ratio < 1:
        raise ValueError("the target ratio must lie strictly between 0 and 1")
    step = check_positive(step, "step")
    Gt = torch.from_numpy(G).float()  # (U, d)
    lam = torch.from_numpy(lam0).float()
    what = torch.from_numpy(w / np.linalg.norm(w)).float()
    m = n_pairs

    def ratio_of(x):
        logp = torch.log_softmax(x @ Gt.T, dim=-1)
        return torch.sigmoid(torch.logsumexp(logp[:, m:2 * m], -1)
                             - torch.logsumexp(logp[:, :m], -1))

    def direction(x):
        if math.isinf(alpha):
            return what.expand_as(x)
        p = torch.softmax(x @ Gt.T, dim=-1)
        mu = p @ Gt

        def matvec(v):
            return ((p * (v @ Gt.T)) @ Gt - mu * (mu * v).sum(-1, keepdim=True) + alpha * v)

        r = what.expand_as(x).clone()
        sol, direc, rs = torch.zeros_like(r), r.clone(), (r * r).sum(-1)
        for _ in range(cg_iters):
            ad = matvec(direc)
            a = rs / (direc * ad).sum(-1).clamp(min=1e-30)
            sol = sol + a[:, None] * direc
            r = r - a[:, None] * ad
            rs_new = (r * r).sum(-1)
            direc = r + (rs_new / rs.clamp(min=1e-30))[:, None] * direc
            rs = rs_new
        return sol / sol.norm(dim=-1, keepdim=True)

    n = lam.shape[0]
    steps = np.zeros(n, dtype=int)
    reached = (ratio_of(lam) >= ratio).numpy()
    active = ~reached
    for _ in range(check_count(max_steps, "max_steps", 1)):
        if not active.any():
            break
        idx = np.flatnonzero(active)
        cur = lam[idx]
        new = cur + step * direction(cur)
        hit = (ratio_of(new) >= ratio).numpy()
        if hit.any():
            lo, hi = cur[hit], new[hit]
            for _b in range(bisections):
                mid = 0.5 * (lo + hi)
                up = (ratio_of(mid) >= ratio)[:, None]
                hi, lo = torch.where(up, mid, hi), torch.where(up, lo, mid)
            new[hit] = hi
        lam[idx] = new
        steps[idx] += 1
        reached[idx[hit]] = True
        active[idx[hit]] = False
    out = lam.double().numpy()
    return SteeringResult(out, reached, steps, np.linalg.norm(out - lam0, axis=-1))


# --- English present/past verb pairs for a real tokenizer ---------------------------------------

VERB_PAST_PAIRS = (
    ("walk", "walked"), ("talk", "talked"), ("play", "played"), ("work", "worked"),
    ("look", "looked"), ("want", "wanted"), ("need", "needed"), ("call", "called"),
    ("ask", "asked"), ("help", "helped"), ("start", "started"), ("turn", "turned"),
    ("move", "moved"), ("live", "lived"), ("open", "opened"), ("close", "closed"),
    ("love", "loved"), ("like", "liked"), ("use", "used"), ("try", "tried"), ("stay", "stayed"),
    ("wait", "waited"), ("watch", "watched"), ("learn", "learned"), ("change", "changed"),
    ("show", "showed"), ("follow", "followed"), ("cook", "cooked"), ("jump", "jumped"),
    ("pull", "pulled"), ("push", "pushed"), ("add", "added"), ("pass", "passed"),
    ("kill", "killed"), ("reach", "reached"), ("plan", "planned"), ("stop", "stopped"),
    ("end", "ended"), ("fill", "filled"), ("climb", "climbed"), ("go", "went"), ("come", "came"),
    ("see", "saw"), ("take", "took"), ("make", "made"), ("get", "got"), ("give", "gave"),
    ("find", "found"), ("think", "thought"), ("tell", "told"), ("become", "became"),
    ("leave", "left"), ("feel", "felt"), ("bring", "brought"), ("begin", "began"),
    ("keep", "kept"), ("hold", "held"), ("write", "wrote"), ("stand", "stood"), ("hear", "heard"),
    ("run", "ran"), ("meet", "met"), ("pay", "paid"), ("sit", "sat"), ("speak", "spoke"),
    ("lie", "lay"), ("lead", "led"), ("grow", "grew"), ("lose", "lost"), ("fall", "fell"),
    ("send", "sent"), ("build", "built"), ("eat", "ate"), ("win", "won"), ("buy", "bought"),
    ("sell", "sold"), ("drive", "drove"), ("break", "broke"), ("sing", "sang"), ("swim", "swam"),
    ("drink", "drank"), ("fly", "flew"), ("teach", "taught"), ("catch", "caught"),
    ("choose", "chose"), ("draw", "drew"), ("wear", "wore"),
)
"""Common English verbs with their simple past (regular and irregular), for the tense concept."""


def single_token_pairs(tokenizer, pairs=VERB_PAST_PAIRS, prefix: str = " ") -> tuple:
    """The pairs whose two forms (after ``prefix``, a leading space) are single, distinct tokens:
    ``(kept pairs, base ids, target ids)``."""
    kept, base, target = [], [], []
    for a, b in pairs:
        ia = tokenizer.encode(prefix + a, add_special_tokens=False)
        ib = tokenizer.encode(prefix + b, add_special_tokens=False)
        if len(ia) == 1 and len(ib) == 1 and ia != ib:
            kept.append((a, b))
            base.append(ia[0])
            target.append(ib[0])
    if len(set(base + target)) != 2 * len(kept):
        raise ValueError("a token appears in two pairs")
    return kept, np.array(base), np.array(target)
