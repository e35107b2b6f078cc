r"""Cross-checks of our MMD and energy tests against `hyppo.ksample` (version 0.5.2).

How hyppo defines them (read from its source): both go through the k-sample -> independence
reduction. The pooled sample $Z$ is paired with a label column $v$ (0 for X, 1 for Y), so the
label distance is $L_{ij} = 1[v_i \ne v_j]$.

* `Energy.statistic` = unbiased dCov$(D, L) \cdot N^4 / (2 n^2 m^2)$, with $D$ the Euclidean
  distances and dCov$(A, B) = \langle \tilde A, \tilde B \rangle / N(N-3)$ ($\tilde{\ }$ is
  U-centring). Since U-centred matrices are orthogonal to row, column and constant terms,
  $\langle \tilde D, \tilde L \rangle = \langle \tilde D, L \rangle$, and the block sums give
  $\langle \tilde D, L \rangle = 2nm(n-1)(m-1) E_u / ((N-1)(N-2))$, with $E_u$ our Eq. (15).
* `MMD.statistic` = dCor$(1 - K, L_\text{kern}) \cdot 2n^2m^2/N^4$ with $K$ the Gaussian kernel
  at the pooled median bandwidth (our "gauss x1"). dCor divides dCov by
  $\sqrt{\text{dVar}_1 \text{dVar}_2}$; the same algebra with $-K$ in place of $D$ gives
  dCov $\propto$ MMD$^2_u$ (Eq. 2), and both variances are permutation invariant.
* `test(..., auto=False)` runs a permutation test on these statistics with
  $p = (1 + \#\{T_b \ge T_0\}) / (1 + B)$, the same rule as our Eq. (13). (With `auto=True`
  and $N > 20$ hyppo would use a chi-square approximation instead.) Its MMD ignores
  `random_state` and draws from numpy's global generator.
"""

import math

import numpy as np
import pytest
from hyppo.ksample import MMD, Energy

import icml26.mod_two_sample as mt
from icml26.data import two_sample
from icml26.kernels import kernel_bank

PERMUTATIONS = 1000


def u_centre(A):
    """U-centring of a matrix with zero diagonal (independent of the package's code)."""
    A = A.copy()
    np.fill_diagonal(A, 0)
    N = len(A)
    rows = A.sum(1)
    centred = A - rows[:, None] / (N - 2) - rows[None, :] / (N - 2) + A.sum() / ((N - 1) * (N - 2))
    np.fill_diagonal(centred, 0)
    return centred


def block_factor(n, m):
    """$2nm(n-1)(m-1) / (N(N-1)(N-2)(N-3))$: dCov against the label distance per unit MMD^2."""
    N = n + m
    return 2 * n * m * (n - 1) * (m - 1) / (N * (N - 1) * (N - 2) * (N - 3))


def trial_data(trial):
    """A mix of nulls and alternatives, n = m between 30 and 50."""
    kind, theta = [("null", 0.0), ("scale", 1.3), ("location", 0.8), ("corr", 0.5)][trial % 4]
    n = (30, 40, 50)[trial % 3]
    return two_sample(kind, n, n, 5, theta, seed=100 + trial)


@pytest.mark.parametrize("sizes", [(30, 30), (35, 48)])
def test_energy_statistic_equals_hyppo_after_rescaling(sizes):
    n, m = sizes
    X, Y = two_sample("scale", n, m, 4, 1.2, seed=n)
    N = n + m
    ours = mt.energy_statistic(X, Y).item()
    rescaled = block_factor(n, m) * ours * N**4 / (2 * n**2 * m**2)
    assert Energy().statistic(X, Y) == pytest.approx(rescaled, rel=1e-8)


@pytest.mark.parametrize("sizes", [(30, 30), (35, 48)])
def test_mmd_statistic_equals_hyppo_after_rescaling(sizes):
    n, m = sizes
    X, Y = two_sample("location", n, m, 4, 1.0, seed=m)
    N = n + m
    kernel = kernel_bank(np.vstack([X, Y]), [("gauss", 1.0)]).matrices[0]
    labels = mt.first_n_labels(n, m).numpy()
    ours = mt.mmd2_unbiased(kernel, labels).item()
    label_distance = (labels[:, None] != labels[None, :]).astype(float)
    variance_kernel = (u_centre(kernel.numpy()) ** 2).sum() / (N * (N - 3))
    variance_labels = (u_centre(label_distance) ** 2).sum() / (N * (N - 3))
    correlation = block_factor(n, m) * ours / math.sqrt(variance_kernel * variance_labels)
    rescaled = correlation * 2 * n**2 * m**2 / N**4
    assert MMD().statistic(X, Y) == pytest.approx(rescaled, rel=1e-8)


def test_permutation_decisions_agree_with_hyppo():
    trials, alpha = 40, 0.05
    agree = {"mmd": 0, "energy": 0}
    for trial in range(trials):
        X, Y = trial_data(trial)
        ours = mt.two_sample_test(
            X, Y, tests=("mmd", "energy"), n_permutations=PERMUTATIONS, alpha=alpha, seed=trial
        ).p_values
        np.random.seed(trial)  # hyppo's MMD permutations use numpy's global generator
        theirs = {
            "mmd": MMD().test(X, Y, reps=PERMUTATIONS, auto=False).pvalue,
            "energy": Energy().test(X, Y, reps=PERMUTATIONS, auto=False, random_state=trial).pvalue,
        }
        for name in agree:
            agree[name] += (ours[name] <= alpha) == (theirs[name] <= alpha)
            # Both estimate the same exact permutation p-value; allow 4 Monte Carlo s.e.
            p = (ours[name] + theirs[name]) / 2
            slack = 4 * math.sqrt(2 * p * (1 - p) / PERMUTATIONS) + 2 / PERMUTATIONS
            assert abs(ours[name] - theirs[name]) <= slack, (trial, name, ours, theirs)
    assert all(count >= 0.95 * trials for count in agree.values()), agree
