r"""Gaussian kernels and their integrals against a Gaussian measure (chapter ``eq-igp-r-matrix``,
``eq-igp-r-closed``, ``eq-igp-bayesimp``).

Every kernel here is the ARD Gaussian kernel
$k(x, y) = s^2 \exp(-\tfrac12 \sum_d (x_d - y_d)^2 / \ell_d^2)$, and every measure is a product
Gaussian $\nu = \mathcal N(m, \operatorname{diag}(\sigma_d^2))$. Chains of such kernels integrated
against $\nu$ stay Gaussian, so the integral operator matrix $R$ of IMPspec, the nuclear-dominant
kernel $r$ of BayesIMP and the traces $\tau = \int k(u, u)\,\nu(du)$ all have closed forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DTYPE = torch.float64


def as_matrix(data, name: str, min_rows: int = 1) -> torch.Tensor:
    """Validate ``data`` and return it as an ``(n, d)`` float64 tensor (1-D input is one column)."""
    if isinstance(data, np.ndarray):
        if not np.issubdtype(data.dtype, np.number) or np.iscomplexobj(data):
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        data = torch.from_numpy(np.asarray(data, dtype=np.float64))
    elif isinstance(data, torch.Tensor):
        if data.is_complex() or data.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
    else:
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(data).__name__}")
    data = data.detach().to(dtype=DTYPE)
    if data.ndim == 1:
        data = data[:, None]
    if data.ndim != 2:
        raise ValueError(f"{name} must be 1-D or 2-D (points x features), got {data.ndim}-D")
    if data.shape[0] < min_rows or data.shape[1] < 1:
        raise ValueError(f"{name} needs at least {min_rows} rows and one column, got {data.shape}")
    if not torch.isfinite(data).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return data


@dataclass(frozen=True)
class GaussianKernel:
    """ARD Gaussian kernel: ``lengthscale`` (one per input dimension) and ``outputscale`` $s^2$."""

    lengthscale: torch.Tensor
    outputscale: float

    def __post_init__(self):
        lengthscale = torch.as_tensor(self.lengthscale, dtype=DTYPE).detach().reshape(-1)
        if not (torch.isfinite(lengthscale).all() and (lengthscale > 0).all()):
            raise ValueError(f"lengthscales must be positive and finite, got {lengthscale}")
        if not (np.isfinite(self.outputscale) and self.outputscale > 0):
            raise ValueError(f"outputscale must be positive and finite, got {self.outputscale}")
        object.__setattr__(self, "lengthscale", lengthscale)
        object.__setattr__(self, "outputscale", float(self.outputscale))

    @property
    def dim(self) -> int:
        return self.lengthscale.numel()

    def gram(self, X, Y=None) -> torch.Tensor:
        """$k(X, Y)$ (``eq-igp-kernel``); with ``Y=None`` the square matrix on ``X``."""
        X = self._points(X, "X")
        Y = X if Y is None else self._points(Y, "Y")
        return self.outputscale * unit_gaussian_gram(X, Y, self.lengthscale)

    def _points(self, data, name: str) -> torch.Tensor:
        data = as_matrix(data, name)
        if data.shape[1] != self.dim:
            raise ValueError(f"{name} has {data.shape[1]} columns, the kernel expects {self.dim}")
        return data


def unit_gaussian_gram(X: torch.Tensor, Y: torch.Tensor, lengthscale: torch.Tensor):
    """$\\exp(-\\tfrac12 \\sum_d (x_d - y_d)^2 / \\ell_d^2)$ for all pairs (differentiable)."""
    return torch.exp(-0.5 * scaled_square_distance(X, Y, lengthscale))


def scaled_square_distance(X: torch.Tensor, Y: torch.Tensor, lengthscale: torch.Tensor):
    r"""$\sum_d (x_d - y_d)^2 / \ell_d^2$ for all pairs as $|x|^2 + |y|^2 - 2 x^\top y$ after
    centring and scaling: one matrix product, no ``(n, m, d)`` array of differences, and a gradient
    that stays finite at zero distance (no square root)."""
    centre = X.mean(0).detach()
    x, y = (X - centre) / lengthscale, (Y - centre) / lengthscale
    square = (x**2).sum(-1)[:, None] + (y**2).sum(-1)[None, :] - 2 * x @ y.T
    if Y is X:  # exactly symmetric with a zero diagonal
        square = 0.5 * (square + square.T)
        square = square - torch.diag_embed(torch.diagonal(square))
    return square.clamp_min(0.0)


@dataclass(frozen=True)
class GaussianMeasure:
    """Product Gaussian measure $\\nu = \\mathcal N(m, \\operatorname{diag}\\sigma^2)$."""

    mean: torch.Tensor
    sd: torch.Tensor

    def __post_init__(self):
        mean = torch.as_tensor(self.mean, dtype=DTYPE).detach().reshape(-1)
        sd = torch.as_tensor(self.sd, dtype=DTYPE).detach().reshape(-1)
        if mean.shape != sd.shape:
            raise ValueError(f"mean and sd must have the same length, got {mean.shape}, {sd.shape}")
        if not (torch.isfinite(mean).all() and torch.isfinite(sd).all() and (sd > 0).all()):
            raise ValueError(f"the measure needs a finite mean and positive finite sds, got {sd}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sd", sd)

    def sample(self, size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(size, self.mean.numel(), dtype=DTYPE, generator=generator)
        return self.mean + self.sd * noise


def data_measure(V, scale: float) -> GaussianMeasure:
    """The measure the chapter uses: mean and ``scale`` times the sd of each column of ``V``."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"the measure scale must be a real number, got {type(scale).__name__}")
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"the measure scale must be positive and finite, got {scale}")
    V = as_matrix(V, "V", min_rows=2)
    return GaussianMeasure(V.mean(0), float(scale) * V.std(0).clamp_min(1e-12))


def _check_pair(kernel: GaussianKernel, measure: GaussianMeasure) -> None:
    if kernel.dim != measure.mean.numel():
        raise ValueError(
            f"kernel has {kernel.dim} input dimensions, the measure {measure.mean.numel()}"
        )


def integral_operator_gram(kernel: GaussianKernel, measure: GaussianMeasure, X, Y=None):
    r"""$R(x, y) = \int k(x, u)\,k(u, y)\,\nu(du)$ in closed form (``eq-igp-r-closed``).

    Per dimension: $\sqrt{\ell^2 / (\ell^2 + 2\sigma^2)}\,
    \exp(-(x - y)^2 / 4\ell^2 - ((x + y)/2 - m)^2 / (\ell^2 + 2\sigma^2))$, times $s^4$.
    """
    _check_pair(kernel, measure)
    X = kernel._points(X, "X")
    Y = X if Y is None else kernel._points(Y, "Y")
    return integral_operator_tensor(
        X, Y, kernel.lengthscale, kernel.outputscale, measure.mean, measure.sd
    )


def integral_operator_tensor(X, Y, lengthscale, outputscale, mean, sd) -> torch.Tensor:
    """``eq-igp-r-closed`` on raw tensors, differentiable in every argument (used to learn
    BayesIMP)."""
    ell2, var = lengthscale**2, sd**2
    spread = ell2 + 2 * var
    # With x, y centred at m, (x - y)^2 / 4l^2 + (x + y)^2 / 4(l^2 + 2s^2) = a x^2 + a y^2 - 2 b x y
    # per dimension, so the exponent is two squared norms and one matrix product: no (n, n, d)
    # array (this matrix is rebuilt for every measure scale and bootstrap of the calibration).
    a, b = (1 / ell2 + 1 / spread) / 4, (1 / ell2 - 1 / spread) / 4
    x, y = X - mean, Y - mean
    exponent = (x**2 @ a)[:, None] + (y**2 @ a)[None, :] - 2 * (x * b) @ y.T
    if Y is X:  # exactly symmetric, as the matrix product alone need not be
        exponent = 0.5 * (exponent + exponent.T)
    factor = torch.sqrt(ell2 / spread).prod()
    return outputscale**2 * factor * torch.exp(-exponent)


def kernel_chain_gram(kernel: GaussianKernel, measure: GaussianMeasure, X, Y=None, depth=1):
    r"""$\int k(x, u_1) k(u_1, u_2) \cdots k(u_p, y)\,\nu(du_1)\cdots\nu(du_p)$, $p$ = ``depth``.

    Depth 0 is $k$, depth 1 is $R$ (``eq-igp-r-closed``), depth 3 is the matrix $S$ of exact
    BayesIMP
    (``eq-igp-bayesimp``). Per dimension the $p$ integrals are one Gaussian integral with a
    tridiagonal
    precision matrix $P$; with $b = (x e_1 + y e_p) / \ell^2$ (centred at $m$) it equals
    $\sigma^{-p} |P|^{-1/2} \exp(\tfrac12 b^\top P^{-1} b - (x^2 + y^2) / 2\ell^2)$.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be a non-negative integer, got {depth!r}")
    _check_pair(kernel, measure)
    X = kernel._points(X, "X")
    Y = X if Y is None else kernel._points(Y, "Y")
    if depth == 0:
        return kernel.gram(X, Y)
    ell2, var = kernel.lengthscale**2, measure.sd**2
    eye = torch.eye(depth, dtype=DTYPE)
    off = torch.diag(torch.ones(depth - 1, dtype=DTYPE), 1)
    precision = (
        (2 / ell2 + 1 / var)[:, None, None] * eye - (off + off.T) / ell2[:, None, None]
    )  # (dims, depth, depth)
    cov = torch.linalg.inv(precision)
    first, last, corner = cov[:, 0, 0], cov[:, -1, -1], cov[:, 0, -1]
    x = X[:, None, :] - measure.mean
    y = Y[None, :, :] - measure.mean
    exponent = 0.5 * (x**2 * first + y**2 * last + 2 * x * y * corner) / ell2**2
    exponent = exponent - (x**2 + y**2) / (2 * ell2)
    factor = (measure.sd ** (-depth) * torch.linalg.det(precision) ** -0.5).prod()
    return kernel.outputscale ** (depth + 1) * factor * torch.exp(exponent.sum(-1))


def kernel_chain_trace(kernel: GaussianKernel, measure: GaussianMeasure, depth=0) -> float:
    r"""$\int\!\cdots\!\int k(u_0, u_1) \cdots k(u_p, u_0)\,\nu(du_0)\cdots\nu(du_p)$.

    Depth 0 is $\tau = \int k(u, u)\,\nu(du) = s^2$ (``eq-igp-r-matrix``); depth 1 is
    $\int\!\int k(u, u')^2\,\nu\,\nu = s^4 \prod_d \ell_d / \sqrt{\ell_d^2 + 4\sigma_d^2}$, the
    trace of the nuclear-dominant kernel $r$.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be a non-negative integer, got {depth!r}")
    _check_pair(kernel, measure)
    if depth == 0:
        return kernel.outputscale
    size = depth + 1
    ell2, var = kernel.lengthscale**2, measure.sd**2
    adjacency = torch.zeros(size, size, dtype=DTYPE)
    for i in range(size):
        adjacency[i, (i + 1) % size] += 1.0
        adjacency[(i + 1) % size, i] += 1.0
    eye = torch.eye(size, dtype=DTYPE)
    precision = (2 / ell2 + 1 / var)[:, None, None] * eye - adjacency / ell2[:, None, None]
    factor = (measure.sd ** (-size) * torch.linalg.det(precision) ** -0.5).prod()
    return float(kernel.outputscale**size * factor)


def stable_cholesky(matrix: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of a symmetric PSD matrix, adding the smallest needed diagonal jitter.

    Tries no jitter, then ``1e-10`` up to ``1e-4`` times the mean diagonal; differentiable.
    """
    matrix = 0.5 * (matrix + matrix.T)
    level = matrix.diagonal().mean().abs().clamp_min(1e-300)
    eye = torch.eye(len(matrix), dtype=matrix.dtype)
    for jitter in (0.0, 1e-10, 1e-8, 1e-6, 1e-4):
        chol, info = torch.linalg.cholesky_ex(matrix + jitter * level * eye)
        if int(info) == 0:
            return chol
    raise ValueError("matrix is not positive semi-definite, even with jitter 1e-4 x its scale")


def median_lengthscales(X) -> torch.Tensor:
    """Per-dimension median of $|x_{id} - x_{jd}|$ over pairs, the usual starting lengthscale."""
    X = as_matrix(X, "X", min_rows=2)
    rows, cols = torch.triu_indices(X.shape[0], X.shape[0], offset=1)
    median = (X[rows] - X[cols]).abs().median(0).values
    return median.clamp_min(1e-3 * X.std(0).clamp_min(1e-12))
