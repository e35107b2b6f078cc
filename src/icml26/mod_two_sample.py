"""Kernel maximum-of-difference (MOD) two-sample tests, with MMD, MMD-FUSE and energy baselines.

The chapter's story in code:

* MMD splits into two differences, $D_X$ and $D_Y$ (eq-sum-of-differences), that cancel under a
  scale shift.
* The group-level MOD and its standardised form (eq-mod-group) keep them apart.
* The paper's MOD (eq-mod) goes one step further: it compares, **for every single point**, its
  average similarity to its own group with its average similarity to the other group
  (eq-point-means),
  standardises, and takes the maximum over points.
* Fused MOD (eq-fused) pools a bank of kernels, and every test is calibrated by permutations
  (eq-p-value).

Everything that depends on the labelling is a function of one product: the kernel matrix
(zero diagonal) times the 0/1 indicator of group $X$. The permutation engine computes that
product once for all kernels and all labellings, and reads every statistic off it.

Conventions: `K` is an `(N, N)` kernel matrix on the pooled sample (any diagonal; it is
ignored), `labels` is a length-`N` 0/1 or boolean vector with 1 marking group $X$.
"""

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from icml26.core import check_count
from icml26.data import two_sample
from icml26.kernels import (
    DEFAULT_BANK_SPECS,
    DTYPE,
    KernelBank,
    as_samples,
    check_specs,
    kernel_bank,
)

SINGLE_KERNEL = ("gauss", 1.0)
ENERGY_KERNEL = ("energy", 1.0)
SINGLE_KERNEL_TESTS = ("mmd", "mod", "mod_group", "smod_group")
FUSED_TESTS = ("mod_fused", "mmd_fuse")
ALL_TESTS = (*SINGLE_KERNEL_TESTS, *FUSED_TESTS, "energy")
DEFAULT_TESTS = ("mmd", "mod", "mod_fused", "mmd_fuse", "energy")
# Elements of one `(L, N, chunk)` block in the engine (2**22 float64 = 32 MiB).
CHUNK_ELEMENTS = 2**22
# A point whose row of kernel values varies less than this (relative) has no usable variance.
FLAT_ROW_TOLERANCE = 1e-12
# Largest relative asymmetry |K - K^T| accepted in a kernel matrix (rounding only).
SYMMETRY_TOLERANCE = 1e-10
# Relative slack so that statistics equal up to rounding count as ties in (eq-p-value).
TIE_TOLERANCE = 1e-12


# ---------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------


def zero_diagonal(K) -> torch.Tensor:
    r"""Validate a stack `(..., N, N)` of symmetric kernel matrices and zero their diagonals.

    Every statistic below uses only pairs $i \ne j$, so the diagonal is irrelevant.
    """
    if isinstance(K, np.ndarray):
        if not np.issubdtype(K.dtype, np.floating) and not np.issubdtype(K.dtype, np.integer):
            raise TypeError(f"kernel matrix must be real, got dtype {K.dtype}")
        K = torch.from_numpy(np.asarray(K, dtype=np.float64))
    elif isinstance(K, torch.Tensor):
        if K.is_complex() or K.dtype == torch.bool:
            raise TypeError(f"kernel matrix must be real, got dtype {K.dtype}")
        K = K.detach().to(device="cpu", dtype=DTYPE)
    else:
        raise TypeError(f"kernel matrix must be a numpy array or tensor, got {type(K).__name__}")
    if K.ndim < 2 or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"kernel matrix must be square, got shape {tuple(K.shape)}")
    if K.shape[-1] < 4:
        raise ValueError(f"need at least 4 pooled points, got {K.shape[-1]}")
    if not torch.isfinite(K).all():
        raise ValueError("kernel matrix contains NaN or infinite values")
    asymmetry = (K - K.transpose(-1, -2)).abs_().amax()
    if asymmetry > SYMMETRY_TOLERANCE * torch.maximum(K.amax(), -K.amin()):
        raise ValueError("kernel matrix must be symmetric")
    K = K.clone()
    K.diagonal(dim1=-2, dim2=-1).zero_()
    return K


def check_labels(labels, size: int) -> torch.Tensor:
    """Validate group labels (1 or True = group X) and return them as a boolean tensor."""
    if isinstance(labels, np.ndarray):
        labels = torch.from_numpy(labels.copy())
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a numpy array or tensor, got {type(labels).__name__}")
    if labels.ndim != 1 or labels.shape[0] != size:
        shape = tuple(labels.shape)
        raise ValueError(f"labels must be a vector of length {size}, got shape {shape}")
    if labels.is_complex() or not ((labels == 0) | (labels == 1)).all():
        raise ValueError("labels must be 0/1 or boolean (1 marks group X)")
    in_x = labels.to(torch.bool)
    n = int(in_x.sum())
    if n < 2 or size - n < 2:
        raise ValueError(f"each group needs at least two points, got {n} and {size - n}")
    return in_x


def first_n_labels(n: int, m: int) -> torch.Tensor:
    """Labels of the pooled sample $Z = (X, Y)$: the first `n` points belong to X."""
    return torch.arange(n + m) < n


def check_alpha(alpha) -> float:
    """A test level strictly between 0 and 1."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return float(alpha)


def check_tests(tests: Sequence[str]) -> tuple[str, ...]:
    """Known, non-repeated test names."""
    if isinstance(tests, str) or not isinstance(tests, Sequence) or len(tests) == 0:
        raise TypeError("tests must be a non-empty sequence of test names")
    unknown = [name for name in tests if name not in ALL_TESTS]
    if unknown:
        raise ValueError(f"unknown tests {unknown}; choose from {ALL_TESTS}")
    if len(set(tests)) != len(tests):
        raise ValueError(f"tests are repeated: {list(tests)}")
    return tuple(tests)


# ---------------------------------------------------------------------------------------------
# Group-level statistics: (eq-averages)-(eq-sum-of-differences), (eq-mod-group),
# (eq-cross-from-within)
# ---------------------------------------------------------------------------------------------


def kernel_averages(K, labels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""(eq-averages): within averages $\bar K_{XX}$, $\bar K_{YY}$ ($i \ne j$), cross
    $\bar K_{XY}$."""
    K0 = zero_diagonal(K)
    in_x = check_labels(labels, K0.shape[-1]).to(DTYPE)
    in_y = 1 - in_x
    n, m = in_x.sum(), in_y.sum()
    k_xx = in_x @ K0 @ in_x / (n * (n - 1))
    k_yy = in_y @ K0 @ in_y / (m * (m - 1))
    k_xy = in_x @ K0 @ in_y / (n * m)
    return k_xx, k_yy, k_xy


def mmd2_unbiased(K, labels) -> torch.Tensor:
    r"""(eq-mmd): $\widehat{\mathrm{MMD}}^2_u = \bar K_{XX} + \bar K_{YY} - 2 \bar K_{XY}$."""
    k_xx, k_yy, k_xy = kernel_averages(K, labels)
    return k_xx + k_yy - 2 * k_xy


def mmd_differences(K, labels) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(eq-sum-of-differences): $D_X = \bar K_{XX} - \bar K_{XY}$ and
    $D_Y = \bar K_{YY} - \bar K_{XY}$."""
    k_xx, k_yy, k_xy = kernel_averages(K, labels)
    return k_xx - k_xy, k_yy - k_xy


def group_mod(K, labels) -> torch.Tensor:
    r"""(eq-mod-group): group-level MOD, $\max(D_X^2, D_Y^2)$."""
    d_x, d_y = mmd_differences(K, labels)
    return torch.maximum(d_x**2, d_y**2)


def cross_average_from_within(total, k_xx, k_yy, n: int, m: int):
    r"""(eq-cross-from-within): $\bar K_{XY} = (S - n(n-1)\bar K_{XX} - m(m-1)\bar K_{YY}) / 2nm$.

    `total` is $S = \sum_{i \ne j} K_{ij}$ over the pooled sample, which no relabelling changes.
    """
    return (total - n * (n - 1) * k_xx - m * (m - 1) * k_yy) / (2 * n * m)


# ---------------------------------------------------------------------------------------------
# Exact permutation moments and the standardised group statistic: (eq-mod-moments), (eq-mod-group)
# ---------------------------------------------------------------------------------------------


def falling_factorial_ratio(top: int, bottom: int, order: int) -> float:
    r"""$(top)_k / (bottom)_k$ with the falling factorial $(a)_k = a(a-1)\cdots(a-k+1)$."""
    return math.prod((top - i) / (bottom - i) for i in range(order))


def pair_sums(K0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Sums over ordered distinct index pairs, triples and quadruples (eq-mod-moments).

    $A = \sum_{i \ne j} K_{ij}^2$ (pairs), $B = \sum_i (\sum_{j \ne i} K_{ij})^2 - A$
    (triples $i, j, k$ distinct, $K_{ij} K_{ik}$), and $C = S^2 - 2A - 4B$ (quadruples).
    """
    pairs = (K0**2).sum(dim=(-1, -2))
    row_sums = K0.sum(dim=-1)
    triples = (row_sums**2).sum(dim=-1) - pairs
    quadruples = K0.sum(dim=(-1, -2)) ** 2 - 2 * pairs - 4 * triples
    return pairs, triples, quadruples


def permutation_moments(K, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(eq-mod-moments): exact mean `(..., 2)` and covariance `(..., 2, 2)` of
    $(\bar K_{XX}, \bar K_{YY})$.

    The expectation is over uniformly random labellings with group sizes `n`, `m`. Both averages
    have mean $\bar K = S / N(N-1)$. Centring the off-diagonal entries at $\bar K$ first leaves the
    covariance unchanged and avoids cancellation; then $S = 0$ and
    $\mathrm{Var}\,\bar K_{XX} = (2A p_1 + 4B p_2 + C p_3) / (n(n-1))^2$ with
    $p_k = (n)_{k+1} / (N)_{k+1}$, and $\mathrm{Cov} = C / (N)_4$.
    """
    K0 = zero_diagonal(K)
    n, m = check_count(n, "n", 2), check_count(m, "m", 2)
    N = K0.shape[-1]
    if n + m != N:
        raise ValueError(f"n + m = {n + m} does not match the kernel size {N}")
    off_diagonal = 1 - torch.eye(N, dtype=DTYPE)
    mean = K0.sum(dim=(-1, -2)) / (N * (N - 1))
    pairs, triples, quadruples = pair_sums((K0 - mean[..., None, None]) * off_diagonal)

    def within_variance(size: int) -> torch.Tensor:
        p1, p2, p3 = (falling_factorial_ratio(size, N, k) for k in (2, 3, 4))
        return (2 * pairs * p1 + 4 * triples * p2 + quadruples * p3) / (size * (size - 1)) ** 2

    var_xx, var_yy = within_variance(n), within_variance(m)
    cov_xy = quadruples / (N * (N - 1) * (N - 2) * (N - 3))
    covariance = torch.stack(
        [torch.stack([var_xx, cov_xy], -1), torch.stack([cov_xy, var_yy], -1)], -2
    )
    return torch.stack([mean, mean], -1), covariance


def difference_map(n: int, m: int) -> torch.Tensor:
    r"""$W$ such that $(D_X, D_Y) = W (\bar K_{XX}, \bar K_{YY}) - S/2nm$:
    (eq-sum-of-differences) and (eq-cross-from-within)."""
    a, b = (n - 1) / (2 * m), (m - 1) / (2 * n)
    return torch.tensor([[1 + a, b], [a, 1 + b]], dtype=DTYPE)


def difference_moments(K, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Exact permutation mean and standard deviation of $(D_X, D_Y)$, from (eq-mod-moments).

    The mean is zero, as $\bar K_{XX}$, $\bar K_{YY}$ and $\bar K_{XY}$ all have permutation
    mean $\bar K$.
    """
    K0 = zero_diagonal(K)
    mean, covariance = permutation_moments(K0, n, m)
    W = difference_map(n, m)
    total = K0.sum(dim=(-1, -2))
    diff_mean = mean @ W.T - (total / (2 * n * m))[..., None]
    diff_var = torch.diagonal(W @ covariance @ W.T, dim1=-2, dim2=-1)
    if (diff_var <= 0).any():
        raise ValueError("kernel is constant off the diagonal: D_X, D_Y have no variance")
    return diff_mean, diff_var.sqrt()


def mmd2_permutation_sd(K, n: int, m: int) -> torch.Tensor:
    r"""Exact permutation standard deviation of $\widehat{\mathrm{MMD}}^2_u = D_X + D_Y$
    (eq-mod-noise), from the moments (eq-mod-moments); its permutation mean is zero.
    """
    K0 = zero_diagonal(K)
    _, covariance = permutation_moments(K0, n, m)
    w = torch.ones(2, dtype=DTYPE) @ difference_map(n, m)
    variance = torch.einsum("i,...ij,j->...", w, covariance, w)
    if (variance <= 0).any():
        raise ValueError("kernel is constant off the diagonal: MMD² has no variance")
    return variance.sqrt()


def standardise_differences(d_x, d_y, diff_mean, diff_sd) -> torch.Tensor:
    r"""(eq-mod-group): $\max(Z_X^2, Z_Y^2)$ with $Z = (D - E_\pi D) / \mathrm{sd}_\pi D$."""
    z_x = (d_x - diff_mean[..., 0, None]) / diff_sd[..., 0, None]
    z_y = (d_y - diff_mean[..., 1, None]) / diff_sd[..., 1, None]
    return torch.maximum(z_x**2, z_y**2)


def standardised_group_mod(K, labels) -> torch.Tensor:
    """(eq-mod-group): sMOD for one labelling, standardised by the exact moments
    (eq-mod-moments)."""
    K0 = zero_diagonal(K)
    in_x = check_labels(labels, K0.shape[-1])
    n = int(in_x.sum())
    d_x, d_y = mmd_differences(K0, in_x)
    diff_mean, diff_sd = difference_moments(K0, n, K0.shape[-1] - n)
    return standardise_differences(d_x[None], d_y[None], diff_mean, diff_sd)[0]


# ---------------------------------------------------------------------------------------------
# The paper's point-level MOD: (eq-point-means), (eq-mod)
# ---------------------------------------------------------------------------------------------


def within_between_means(K, labels) -> tuple[torch.Tensor, torch.Tensor]:
    """(eq-point-means): each point's mean kernel value to its own group ($p^{in}$) and to the
    other one."""
    K0 = zero_diagonal(K)
    in_x = check_labels(labels, K0.shape[-1])
    same_group = in_x[:, None] == in_x[None, :]
    group_size = torch.where(in_x, in_x.sum(), (~in_x).sum()).to(DTYPE)
    p_in = (K0 * same_group).sum(-1) / (group_size - 1)
    p_out = (K0 * ~same_group).sum(-1) / (K0.shape[-1] - group_size)
    return p_in, p_out


def point_variances(K0: torch.Tensor) -> torch.Tensor:
    r"""(eq-mod) denominator: $v_i$, the sample variance of row $i$ off the diagonal.

    With $\mu_i = \sum_j A_{ij} / (N-1)$ and $\delta_i = \sum_j A_{ij}^2 / (N-1) - \mu_i^2$,
    $v_i = \delta_i (N-1)/(N-2) = \sum_{j \ne i} (A_{ij} - \mu_i)^2 / (N-2)$; the centred form is
    the numerically stable one. It uses row $i$ only, so no relabelling changes it.
    """
    N = K0.shape[-1]
    row_mean = K0.sum(-1, keepdim=True) / (N - 1)
    deviations = K0 - row_mean
    deviations.diagonal(dim1=-2, dim2=-1).zero_()
    return (deviations**2).sum(-1) / (N - 2)


def inverse_point_variances(K0: torch.Tensor) -> torch.Tensor:
    """$1 / v_i$, set to 0 for flat rows ($v_i = 0$ up to rounding), whose terms (eq-mod) drops.

    (The authors' reference code adds $10^{-10}$ to $v_i$; we use $v_i$ as defined.)
    """
    variances = point_variances(K0)
    row_scale = K0.abs().amax(-1)
    flat = variances.sqrt() <= FLAT_ROW_TOLERANCE * row_scale
    return torch.where(flat, 0.0, 1 / torch.where(flat, 1.0, variances))


def mod_statistic(K, labels) -> torch.Tensor:
    r"""(eq-mod): the paper's MOD.

    $\max_i (p^{in}_i - p^{out}_i)^2 / [(1/(n_g - 1) + 1/(N - n_g))\, v_i]$, with $n_g$ the size
    of point $i$'s group.
    """
    K0 = zero_diagonal(K)
    in_x = check_labels(labels, K0.shape[-1])
    N = K0.shape[-1]
    p_in, p_out = within_between_means(K0, in_x)
    group_size = torch.where(in_x, in_x.sum(), (~in_x).sum()).to(DTYPE)
    scale = 1 / (group_size - 1) + 1 / (N - group_size)
    return ((p_in - p_out) ** 2 * inverse_point_variances(K0) / scale).max()


# ---------------------------------------------------------------------------------------------
# Fusion, p-values, MMD-FUSE and energy: (eq-fused)-(eq-energy)
# ---------------------------------------------------------------------------------------------


def fused_mod(mods: torch.Tensor) -> torch.Tensor:
    r"""(eq-fused): $\log \frac1L \sum_l \exp(\mathrm{MOD}_l)$ over the kernel axis (dim 0).

    Each $\mathrm{MOD}_l$ is already standardised, so no extra normaliser is needed.
    """
    return torch.logsumexp(mods, dim=0) - math.log(mods.shape[0])


def permutation_p_value(statistics: torch.Tensor) -> torch.Tensor:
    r"""(eq-p-value): $(1 + \#\{b \ge 1 : T_b \ge T_0\}) / (B + 1)$ along the last axis.

    Column 0 is the observed labelling. Values equal to $T_0$ up to rounding count as ties.
    """
    observed = statistics[..., :1]
    slack = TIE_TOLERANCE * observed.abs()
    exceed = (statistics[..., 1:] >= observed - slack).sum(-1)
    return (1 + exceed) / statistics.shape[-1]


def off_diagonal_rms(K0: torch.Tensor) -> torch.Tensor:
    """Root mean square of the off-diagonal entries of zero-diagonal kernel matrices."""
    N = K0.shape[-1]
    return (K0.square().sum(dim=(-1, -2)) / (N * (N - 1))).sqrt()


def fuse_normalisers(K) -> torch.Tensor:
    r"""(eq-mmd-fuse): $\hat N_l = \sqrt{\sum_{i \ne j} K_{l,ij}^2 / N(N-1)}$, pooled sample."""
    return off_diagonal_rms(zero_diagonal(K))


def fuse_temperature(n: int, m: int) -> float:
    r"""The exponent's scale in (eq-mmd-fuse): $\lambda = n'(n'-1)\sqrt{n'(n'-1) / N(N-1)}$,
    $n' = \min(n, m)$, $N = n + m$.

    With it, $\lambda\,\mathrm{MMD}^2_u / \hat N_l$ equals the exponent of the reference
    implementation (``mmdfuse``, lambda_multiplier 1), which for $n = m$ scales the quadratic form
    $n(n-1)\,\mathrm{MMD}^2_u$ by $\sqrt{n(n-1)} / \sqrt{\sum_{i \ne j} K_{ij}^2}$.
    """
    smaller, total = min(n, m), n + m
    return smaller * (smaller - 1) * math.sqrt(smaller * (smaller - 1) / (total * (total - 1)))


def mmd_fuse(mmd2: torch.Tensor, normalisers: torch.Tensor, n: int, m: int) -> torch.Tensor:
    r"""(eq-mmd-fuse): $\log \frac1L \sum_l \exp(\lambda \mathrm{MMD}^2_l/\hat N_l)$.

    `mmd2` is `(L, ...)`; $\lambda$ is :func:`fuse_temperature`. For $n \ne m$ the reference
    uses a different quadratic form in place of $\mathrm{MMD}^2_u$; we keep $\mathrm{MMD}^2_u$.
    """
    lam = fuse_temperature(n, m)
    scaled = lam * mmd2 / normalisers.reshape(-1, *([1] * (mmd2.ndim - 1)))
    return torch.logsumexp(scaled, dim=0) - math.log(mmd2.shape[0])


def energy_statistic(X, Y) -> torch.Tensor:
    r"""(eq-energy): $2\,\overline{\|X - Y\|} - \overline{\|X - X'\|} - \overline{\|Y - Y'\|}$.

    This is (eq-mmd) with $k(x, y) = -\|x - y\|$; the within averages skip $i = j$.
    """
    X, Y = as_samples(X, Y)
    bank = kernel_bank(torch.cat([X, Y]), [ENERGY_KERNEL])
    return mmd2_unbiased(bank.matrices[0], first_n_labels(len(X), len(Y)))


# ---------------------------------------------------------------------------------------------
# The permutation engine
# ---------------------------------------------------------------------------------------------


def permutation_indicators(
    n: int, m: int, n_permutations: int, generator: torch.Generator
) -> torch.Tensor:
    """0/1 indicators of group X, shape `(N, B + 1)`; column 0 is the observed labelling."""
    N = n + m
    observed = first_n_labels(n, m).to(DTYPE)[:, None]
    ranks = torch.rand(n_permutations, N, generator=generator, dtype=DTYPE).argsort(dim=1)
    shuffled = torch.zeros(n_permutations, N, dtype=DTYPE)
    shuffled.scatter_(1, ranks[:, :n], 1.0)
    return torch.cat([observed, shuffled.T], dim=1)


@dataclass(frozen=True)
class PermutationStatistics:
    r"""Statistics for every kernel (rows) and labelling (columns; column 0 = observed).

    `normalisers` holds each kernel's MMD-FUSE $\hat N_l$ (eq-mmd-fuse), which no labelling changes.
    """

    n: int
    m: int
    k_xx: torch.Tensor
    k_yy: torch.Tensor
    k_xy: torch.Tensor
    mod: torch.Tensor
    normalisers: torch.Tensor

    @property
    def mmd2(self) -> torch.Tensor:
        """(eq-mmd) for every kernel and labelling."""
        return self.k_xx + self.k_yy - 2 * self.k_xy

    @property
    def d_x(self) -> torch.Tensor:
        """$D_X$ of (eq-sum-of-differences)."""
        return self.k_xx - self.k_xy

    @property
    def d_y(self) -> torch.Tensor:
        """$D_Y$ of (eq-sum-of-differences)."""
        return self.k_yy - self.k_xy


def chunk_statistics(K0, row_sums, inverse_variances, indicators, n, m):
    r"""(eq-averages), (eq-point-means), (eq-mod) for a block of labellings, from $P = K_0 Z$ alone.

    $P_{ib}$ is point $i$'s kernel sum to group X under labelling $b$, and $r_i - P_{ib}$ its sum
    to group Y. For $i$ in X, $p^{in}_i - p^{out}_i = P_{ib}/(n-1) - (r_i - P_{ib})/m
    = c_X (P_{ib} - r_i / (m c_X))$ with $c_X = 1/(n-1) + 1/m$, the scale factor of (eq-mod).
    So each MOD term is $c_X (P_{ib} - t^X_i)^2 / v_i$, and likewise for Y with
    $c_Y = 1/(m-1) + 1/n$ and $t^Y_i = r_i / ((m-1) c_Y)$.
    """
    within_x = K0 @ indicators
    sum_xx = (indicators * within_x).sum(-2)
    sum_x_rows = row_sums @ indicators
    sum_yy = row_sums.sum(-1, keepdim=True) - 2 * sum_x_rows + sum_xx
    k_xx = sum_xx / (n * (n - 1))
    k_yy = sum_yy / (m * (m - 1))
    k_xy = (sum_x_rows - sum_xx) / (n * m)

    scale_x, scale_y = 1 / (n - 1) + 1 / m, 1 / (m - 1) + 1 / n
    in_x = indicators.bool()
    centre = torch.where(
        in_x, (row_sums / (m * scale_x))[..., None], (row_sums / ((m - 1) * scale_y))[..., None]
    )
    weight = (scale_y + (scale_x - scale_y) * indicators) * inverse_variances[..., None]
    terms = within_x.sub_(centre).square_().mul_(weight)
    return k_xx, k_yy, k_xy, terms.amax(-2)


def permutation_statistics(
    kernels, n: int, m: int, n_permutations: int = 200, generator: torch.Generator | None = None
) -> PermutationStatistics:
    """Run all `B + 1` labellings through every kernel of the `(L, N, N)` stack at once.

    The same labellings serve every kernel, which is what keeps fused tests exact. Labellings
    are processed in chunks so that one `(L, N, chunk)` block stays near `CHUNK_ELEMENTS`.
    """
    K0 = zero_diagonal(kernels)
    if K0.ndim == 2:
        K0 = K0[None]
    n, m = check_count(n, "n", 2), check_count(m, "m", 2)
    n_permutations = check_count(n_permutations, "n_permutations", 1)
    if K0.ndim != 3 or K0.shape[-1] != n + m:
        raise ValueError(f"kernels must have shape (L, {n + m}, {n + m}), got {tuple(K0.shape)}")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    indicators = permutation_indicators(n, m, n_permutations, generator)
    row_sums = K0.sum(-1)
    inverse_variances = inverse_point_variances(K0)
    chunk = max(1, CHUNK_ELEMENTS // (K0.shape[0] * K0.shape[1]))
    blocks = [
        chunk_statistics(K0, row_sums, inverse_variances, block, n, m)
        for block in indicators.split(chunk, dim=1)
    ]
    k_xx, k_yy, k_xy, mod = (torch.cat(parts, dim=-1) for parts in zip(*blocks, strict=True))
    return PermutationStatistics(n, m, k_xx, k_yy, k_xy, mod, off_diagonal_rms(K0))


# ---------------------------------------------------------------------------------------------
# Tests on data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoSampleTestResult:
    """Per test: the `(B + 1,)` statistics (entry 0 observed), the p-value and the decision."""

    statistics: dict[str, torch.Tensor]
    p_values: dict[str, float]
    reject: dict[str, bool]
    alpha: float
    kernel_names: tuple[str, ...]


def required_specs(tests: tuple[str, ...], bank_specs: Sequence) -> list:
    """Kernels the chosen tests need: the bank (fused tests), Gaussian x1, the energy kernel."""
    specs = list(bank_specs) if any(name in FUSED_TESTS for name in tests) else []
    if any(name in SINGLE_KERNEL_TESTS for name in tests) and SINGLE_KERNEL not in specs:
        specs.append(SINGLE_KERNEL)
    if "energy" in tests and ENERGY_KERNEL not in specs:
        specs.append(ENERGY_KERNEL)
    return specs


def assemble_statistics(
    tests: tuple[str, ...], stats: PermutationStatistics, kernels: KernelBank, bank_size: int
) -> dict[str, torch.Tensor]:
    """Pick each test's `(B + 1,)` row; the fused ones combine the first `bank_size` kernels."""
    out = {}
    if any(name in SINGLE_KERNEL_TESTS for name in tests):
        single = kernels.index("gauss x1")
        out |= {"mmd": stats.mmd2[single], "mod": stats.mod[single]}
        out["mod_group"] = torch.maximum(stats.d_x[single] ** 2, stats.d_y[single] ** 2)
        if "smod_group" in tests:
            diff_mean, diff_sd = difference_moments(kernels.matrices[single], stats.n, stats.m)
            out["smod_group"] = standardise_differences(
                stats.d_x[single][None], stats.d_y[single][None], diff_mean, diff_sd
            )[0]
    if any(name in FUSED_TESTS for name in tests):
        out["mod_fused"] = fused_mod(stats.mod[:bank_size])
        normalisers = stats.normalisers[:bank_size]
        out["mmd_fuse"] = mmd_fuse(stats.mmd2[:bank_size], normalisers, stats.n, stats.m)
    if "energy" in tests:
        out["energy"] = stats.mmd2[kernels.index("energy")]
    return {name: out[name] for name in tests}


def two_sample_test(
    X,
    Y,
    tests: Sequence[str] = DEFAULT_TESTS,
    n_permutations: int = 200,
    alpha: float = 0.05,
    seed: int = 0,
    bank: Sequence | None = None,
) -> TwoSampleTestResult:
    r"""Permutation tests of $P = Q$ from samples `X` `(n, d)` and `Y` `(m, d)`.

    `tests` picks from `ALL_TESTS`. `mmd`, `mod`, `mod_group`, `smod_group` use the Gaussian
    kernel at the median bandwidth; `mod_fused` and `mmd_fuse` use the bank given as
    `(family, scale)` specs (default: `DEFAULT_BANK_SPECS`); `energy` uses $-\|x - y\|$.
    All tests share the same `n_permutations` labellings drawn from `seed`.
    """
    X, Y = as_samples(X, Y)
    tests = check_tests(tests)
    alpha = check_alpha(alpha)
    seed = check_count(seed, "seed", 0)
    bank_specs = check_specs(DEFAULT_BANK_SPECS if bank is None else bank)
    kernels = kernel_bank(torch.cat([X, Y]), required_specs(tests, bank_specs))
    generator = torch.Generator().manual_seed(seed)
    stats = permutation_statistics(kernels.matrices, len(X), len(Y), n_permutations, generator)
    statistics = assemble_statistics(tests, stats, kernels, len(bank_specs))
    p_values = {name: permutation_p_value(values).item() for name, values in statistics.items()}
    reject = {name: p <= alpha for name, p in p_values.items()}
    return TwoSampleTestResult(statistics, p_values, reject, alpha, kernels.names)


@dataclass(frozen=True)
class PowerStudyResult:
    """Rejection rates over `trials` simulated data sets, with binomial standard errors."""

    rejection_rate: dict[str, float]
    standard_error: dict[str, float]
    p_values: dict[str, np.ndarray]
    trials: int


def trial_seeds(seed: int, trials: int) -> list[tuple[int, int]]:
    """Independent (data, permutation) seed pairs for each trial, derived from one base seed."""
    children = np.random.SeedSequence(seed).spawn(trials)
    return [tuple(int(s) for s in child.generate_state(2)) for child in children]


def power_study(
    kind: str,
    d: int,
    theta: float,
    n: int = 100,
    m: int = 100,
    trials: int = 200,
    n_permutations: int = 200,
    alpha: float = 0.05,
    seed: int = 0,
    tests: Sequence[str] = DEFAULT_TESTS,
    bank: Sequence | None = None,
) -> PowerStudyResult:
    """Rejection rate of each test on `trials` data sets from `two_sample(kind, ...)`.

    Under `kind="null"` the rate estimates the size, otherwise the power. Deterministic in `seed`.
    """
    trials = check_count(trials, "trials", 1)
    tests = check_tests(tests)
    seed = check_count(seed, "seed", 0)
    p_values = {name: np.empty(trials) for name in tests}
    for trial, (data_seed, permutation_seed) in enumerate(trial_seeds(seed, trials)):
        X, Y = two_sample(kind, n, m, d, theta, data_seed)
        result = two_sample_test(X, Y, tests, n_permutations, alpha, permutation_seed, bank)
        for name in tests:
            p_values[name][trial] = result.p_values[name]
    rate = {name: float(np.mean(p_values[name] <= alpha)) for name in tests}
    error = {name: math.sqrt(r * (1 - r) / trials) for name, r in rate.items()}
    return PowerStudyResult(rate, error, p_values, trials)
