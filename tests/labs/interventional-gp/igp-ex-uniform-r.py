"""Exercise igp-ex-uniform-r: the integral operator matrix for a uniform measure."""

import numpy as np

OK_FORMAT = False
name = "igp-ex-uniform-r"
points = 3


def test_matches_monte_carlo(uniform_integral_gram):
    rng = np.random.default_rng(5)
    low, high = np.array([-0.5, 0.0, 1.0]), np.array([1.0, 0.5, 3.0])
    ell, scale = np.array([0.6, 0.4, 1.2]), 0.8
    X, Y = rng.uniform(low - 0.3, high + 0.3, (4, 3)), rng.uniform(low, high, (5, 3))
    U = rng.uniform(low, high, (400_000, 3))

    def gram(P):
        return scale * np.exp(-0.5 * (((P[:, None, :] - U[None]) / ell) ** 2).sum(-1))

    mc = gram(X) @ gram(Y).T / len(U)
    exact = np.asarray(uniform_integral_gram(X, Y, ell, scale, low, high))
    assert exact.shape == (4, 5), f"expected a 4 x 5 matrix, got {exact.shape}"
    assert np.abs(exact - mc).max() < 0.01 * np.abs(mc).max(), (exact, mc)


def test_is_symmetric_psd(uniform_integral_gram, rng):
    X = rng.uniform(-2, 3, (40, 2))
    R = np.asarray(uniform_integral_gram(X, X, np.array([0.5, 0.8]), 1.3, np.array([0.0, 0.0]),
                                         np.array([1.0, 2.0])))
    assert np.allclose(R, R.T, atol=1e-14)
    assert np.linalg.eigvalsh(R).min() > -1e-10 * np.abs(R).max()
