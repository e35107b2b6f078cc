r"""Tangent proxies from concepts, and the gradient energy they capture (our reconstruction).

The paper fits low-rank concept dictionaries to activations during training and asks how much of
the backpropagated gradient lies in their span. Its exact definitions were not available to us;
these follow the chapter's equations `eq-semi-nmf` to `eq-aniso-share`:

* :func:`semi_nmf`: $H \approx Z D$ with non-negative codes $Z$ (Ding, Li and Jordan's updates);
* :func:`orthonormal_basis`: the tangent proxy $Q_T$, an orthonormal basis of the concept span;
* :func:`energy_share`: $E(Q) = \lVert G Q \rVert_F^2 / \lVert G \rVert_F^2$;
* :func:`control_energy_share`: the exact mean of $E$ over random rank-$k$ subspaces of the
  orthogonal complement of $Q_T$ (the matched-rank normal control);
* :func:`anisotropy_share`: the share of the anisotropic part of the gradient covariance that a
  subspace captures, relative to the best rank-$k$ subspace (an affine function of the
  energy share, `eq-aniso-share-energy`).
"""

from __future__ import annotations

import numbers

import numpy as np

from icml26.anisotropy.metrics import _check_rank, as_points


def _positive_part(A: np.ndarray) -> np.ndarray:
    return (np.abs(A) + A) / 2


def _negative_part(A: np.ndarray) -> np.ndarray:
    return (np.abs(A) - A) / 2


def _dictionary(H: np.ndarray, Z: np.ndarray, ridge: float = 1e-10) -> np.ndarray:
    """Least-squares concepts $D = (Z^\\top Z)^{-1} Z^\\top H$ (a tiny ridge keeps it solvable)."""
    gram = Z.T @ Z
    return np.linalg.solve(gram + ridge * np.trace(gram) * np.eye(len(gram)), Z.T @ H)


def semi_nmf(H, k: int, iterations: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    r"""Semi-NMF $H \approx Z D$ with $Z \ge 0$ of shape $(N, k)$ and $D$ of any sign
    (`eq-semi-nmf`).

    Alternates the exact least-squares $D$ with Ding, Li and Jordan's multiplicative update
    $Z \leftarrow Z \odot \sqrt{([HD^\top]^+ + Z[DD^\top]^-) / ([HD^\top]^- + Z[DD^\top]^+)}$,
    which never increases $\lVert H - ZD \rVert_F$. $Z$ starts from a nearest-centre assignment
    to $k$ random rows plus 0.2, as in their k-means initialisation.
    """
    H = as_points(H)
    k = _check_rank(k, min(H.shape))
    if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) \
            or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    rng = np.random.default_rng(seed)
    centres = H[rng.choice(H.shape[0], size=k, replace=False)]
    nearest = ((H[:, None, :] - centres[None]) ** 2).sum(axis=-1).argmin(axis=1)
    Z = np.eye(k)[nearest] + 0.2
    tiny = 1e-12 * max(np.abs(H).max(), 1e-300)
    for _ in range(iterations):
        D = _dictionary(H, Z)
        HD, DD = H @ D.T, D @ D.T
        Z = Z * np.sqrt((_positive_part(HD) + Z @ _negative_part(DD) + tiny)
                        / (_negative_part(HD) + Z @ _positive_part(DD) + tiny))
    return Z, _dictionary(H, Z)


def orthonormal_basis(D) -> np.ndarray:
    """An orthonormal basis $Q$ (shape ``(d, k)``) of the row space of the ``(k, d)`` matrix D."""
    D = np.asarray(D, dtype=np.float64)
    if D.ndim != 2 or not 1 <= D.shape[0] <= D.shape[1] or not np.isfinite(D).all():
        raise ValueError(f"D must be a finite (k, d) matrix with k <= d, got shape {D.shape}")
    Q, R = np.linalg.qr(D.T)
    if np.abs(np.diag(R)).min() <= 1e-10 * np.abs(np.diag(R)).max():
        raise ValueError("the concept directions are linearly dependent")
    return Q


def pca_basis(H, k: int) -> np.ndarray:
    """The top-$k$ principal directions of the centred ``H`` (the PCA baseline proxy)."""
    H = as_points(H)
    k = _check_rank(k, min(H.shape))
    return np.linalg.svd(H - H.mean(axis=0), full_matrices=False)[2][:k].T


def _check_pair(G, Q) -> tuple[np.ndarray, np.ndarray]:
    G = as_points(G, "G")
    Q = np.asarray(Q, dtype=np.float64)
    if Q.ndim != 2 or Q.shape[0] != G.shape[1] or not 1 <= Q.shape[1] < G.shape[1]:
        raise ValueError(f"Q must have shape (d, k) with d = {G.shape[1]} and 1 <= k < d, "
                         f"got {Q.shape}")
    if not np.allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-8):
        raise ValueError("the columns of Q must be orthonormal")
    if not (G**2).sum() > 0:
        raise ValueError("the gradients are all zero")
    return G, Q


def energy_share(G, Q) -> float:
    r"""Gradient energy share $E(Q) = \lVert GQ \rVert_F^2 / \lVert G \rVert_F^2$
    (`eq-energy-share`)."""
    G, Q = _check_pair(G, Q)
    return float(((G @ Q) ** 2).sum() / (G**2).sum())


def control_energy_share(G, Q) -> float:
    r"""Mean of $E$ over random rank-$k$ subspaces of $Q^\perp$: $\frac{k}{d-k}(1 - E(Q))$.

    `eq-control`: a uniformly random $k$-dimensional subspace of an $m$-dimensional space keeps a
    fraction $k/m$ of any vector's squared length on average; here $m = d - k$.
    """
    G, Q = _check_pair(G, Q)
    d, k = Q.shape
    return k / (d - k) * (1 - energy_share(G, Q))


def permutation_chance_share(G, Q) -> float:
    r"""Mean of $E(PQ)$ over all $d!$ permutations $P$ of the coordinates (`eq-aniso-permutation`).

    The average of $PQQ^\top P^\top$ commutes with every permutation, so it is
    $\omega_0 I + \omega_1 \mathbf 1\mathbf 1^\top$ with $d\omega_0 + d\omega_1 = k$ and
    $d\omega_0 + d^2\omega_1 = s = \lVert Q^\top \mathbf 1\rVert^2$; the mean share is
    $\omega_0 + \omega_1 \lVert G\mathbf 1\rVert^2 / \lVert G\rVert_F^2$. It is the chance
    level of a subspace scored on gradients whose law is invariant under permuting coordinates.
    """
    G, Q = _check_pair(G, Q)
    d, k = Q.shape
    s = float((Q.sum(axis=0) ** 2).sum())
    omega_1 = (s - k) / (d * (d - 1))
    omega_0 = k / d - omega_1
    return float(omega_0 + omega_1 * (G.sum(axis=1) ** 2).sum() / (G**2).sum())


def random_complement_basis(Q, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random orthonormal $k$-frame of the orthogonal complement of span Q."""
    Q = np.asarray(Q, dtype=np.float64)
    d, k = Q.shape
    if not 1 <= k < d:
        raise ValueError(f"Q must have shape (d, k) with 1 <= k < d, got {Q.shape}")
    draws = rng.standard_normal((d, k))
    draws -= Q @ (Q.T @ draws)
    return np.linalg.qr(draws)[0]


def gradient_anisotropy(G) -> np.ndarray:
    r"""Traceless gradient covariance $A_G = \Sigma_G - \frac{\operatorname{tr}\Sigma_G}{d} I$.

    $\Sigma_G = \frac1N G^\top G$ (`eq-aniso-share`).
    """
    G = as_points(G, "G")
    sigma = G.T @ G / G.shape[0]
    return sigma - np.trace(sigma) / G.shape[1] * np.eye(G.shape[1])


def anisotropy_share(G, Q) -> tuple[float, float]:
    r"""Shares of gradient anisotropy captured by span Q and by the normal control
    (`eq-aniso-share`).

    Both are $\operatorname{tr}(P A_G P)$ for the subspace's projector $P$, divided by the best
    rank-$k$ value $\sum_{i \le k} \lambda_i^+(A_G)$; the control's numerator is its exact mean
    $\frac{k}{d-k} \operatorname{tr}(P_\perp A_G P_\perp)$ over random subspaces of $Q^\perp$.
    For fixed ``G`` the first share is an increasing affine function of :func:`energy_share`,
    $\frac{\operatorname{tr}\Sigma_G}{\text{best}}\,(E(Q) - k/d)$ (`eq-aniso-share-energy`), so
    it orders subspaces exactly as the energy share does.
    """
    G, Q = _check_pair(G, Q)
    d, k = Q.shape
    A = gradient_anisotropy(G)
    best = np.clip(np.linalg.eigvalsh(A)[::-1][:k], 0, None).sum()
    if best <= 0:
        raise ValueError("the gradient covariance is isotropic: no anisotropy to share")
    complement = np.eye(d) - Q @ Q.T
    proxy = np.trace(Q.T @ A @ Q)
    control = k / (d - k) * np.trace(complement @ A @ complement)
    return float(proxy / best), float(control / best)
