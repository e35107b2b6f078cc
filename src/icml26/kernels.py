"""Kernels on a pooled two-sample data set.

Every kernel-based two-sample test starts the same way: stack the two samples into one pooled
sample $Z = (X, Y)$, measure pairwise distances, pick a bandwidth, and build kernel matrices.
This module does exactly that and nothing else, so later chapters can reuse it.

The one rule that keeps permutation tests exact: **anything data-dependent (here, the
bandwidth) must be a function of the pooled sample only**. Relabelling points then leaves every
kernel matrix unchanged up to the same reordering of rows and columns.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

DTYPE = torch.float64

# The default bank: Gaussian and Laplace kernels at five multiples of the median distance.
DEFAULT_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
DEFAULT_BANK_SPECS = tuple(
    (family, scale) for family in ("gauss", "laplace") for scale in DEFAULT_SCALES
)
KERNEL_FAMILIES = ("gauss", "laplace", "energy")


def as_points(data, name: str = "data") -> torch.Tensor:
    """Validate one sample and return it as an `(n, d)` float64 tensor.

    A 1-D input is read as `n` points in one dimension.
    """
    if isinstance(data, np.ndarray):
        if data.dtype == object or not np.issubdtype(data.dtype, np.number):
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        if np.iscomplexobj(data):
            raise TypeError(f"{name} must be real, got dtype {data.dtype}")
        points = torch.from_numpy(np.asarray(data, dtype=np.float64))
    elif isinstance(data, torch.Tensor):
        if data.is_complex() or data.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        points = data.detach().to(device="cpu", dtype=DTYPE)
    else:
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(data).__name__}")
    if points.ndim == 1:
        points = points[:, None]
    if points.ndim != 2:
        raise ValueError(f"{name} must be 1-D or 2-D (points x features), got {points.ndim}-D")
    if points.shape[0] < 2:
        raise ValueError(f"{name} needs at least two points, got {points.shape[0]}")
    if points.shape[1] < 1:
        raise ValueError(f"{name} needs at least one feature")
    if not torch.isfinite(points).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return points


def as_samples(X, Y) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a pair of samples: same feature dimension, two or more points each, finite."""
    X, Y = as_points(X, "X"), as_points(Y, "Y")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(
            f"X and Y must have the same number of features, got {X.shape[1]} and {Y.shape[1]}"
        )
    return X, Y


def pairwise_distances(X, Y=None, p: int = 2) -> torch.Tensor:
    r"""All distances $\|x_i - y_j\|_p$; with `Y=None`, the distances within `X`.

    The direct (non-matmul) algorithm keeps the diagonal exactly zero.
    """
    if p not in (1, 2):
        raise ValueError(f"p must be 1 (Manhattan) or 2 (Euclidean), got {p}")
    X = as_points(X, "X")
    Y = X if Y is None else as_points(Y, "Y")
    if X.shape[1] != Y.shape[1]:
        raise ValueError(
            f"X and Y must have the same number of features, got {X.shape[1]} and {Y.shape[1]}"
        )
    return torch.cdist(X, Y, p=p, compute_mode="donot_use_mm_for_euclid_dist")


def middle_ranks(count: int) -> tuple[int, int]:
    """1-based ranks whose average is the median of `count` sorted values."""
    return (count + 1) // 2, count // 2 + 1


def off_diagonal_median(distances: torch.Tensor) -> float:
    """Median of the distinct pairs $i < j$ of a symmetric distance matrix."""
    rows, cols = torch.triu_indices(*distances.shape, offset=1)
    pairs = distances[rows, cols]
    # The two middle order statistics (equal when the count is odd); selection, not sorting.
    lower, upper = (pairs.kthvalue(k).values.item() for k in middle_ranks(len(pairs)))
    median = (lower + upper) / 2
    if median <= 0:
        raise ValueError("median inter-point distance is 0 (too many repeated points)")
    return median


def median_distance(Z, p: int = 2) -> float:
    r"""Median heuristic (mod-test, eq-gaussian): the median $\ell_p$ distance over pooled pairs
    $i \ne j$."""
    return off_diagonal_median(pairwise_distances(Z, p=p))


def check_bandwidth(bandwidth: float) -> float:
    """A bandwidth must be a finite positive number."""
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float | np.floating):
        raise TypeError(f"bandwidth must be a real number, got {type(bandwidth).__name__}")
    if not np.isfinite(bandwidth) or bandwidth <= 0:
        raise ValueError(f"bandwidth must be finite and positive, got {bandwidth}")
    return float(bandwidth)


def gaussian_kernel(distances: torch.Tensor, bandwidth: float) -> torch.Tensor:
    r"""Gaussian kernel (mod-test, eq-gaussian), $\exp(-\|x-y\|_2^2 / 2h^2)$, from Euclidean
    distances."""
    h = check_bandwidth(bandwidth)
    return torch.exp(-(distances**2) / (2 * h**2))


def laplace_kernel(distances: torch.Tensor, bandwidth: float) -> torch.Tensor:
    r"""Laplace kernel of the fused bank (mod-test, eq-fused), $\exp(-\|x-y\|_1 / h)$, from
    Manhattan distances."""
    h = check_bandwidth(bandwidth)
    return torch.exp(-distances / h)


def distance_kernel(distances: torch.Tensor) -> torch.Tensor:
    r"""Energy-distance kernel (mod-test, eq-energy), $k(x, y) = -\|x - y\|_2$."""
    return -distances


@dataclass(frozen=True)
class KernelBank:
    """A stack of kernel matrices on one pooled sample.

    `matrices` has shape `(L, N, N)`; `names[l]` and `bandwidths[l]` describe kernel `l`
    (the energy kernel has no bandwidth and stores `nan`).
    """

    matrices: torch.Tensor
    names: tuple[str, ...]
    bandwidths: tuple[float, ...]

    def index(self, name: str) -> int:
        """Position of the kernel called `name`."""
        if name not in self.names:
            raise KeyError(f"kernel {name!r} is not in the bank {self.names}")
        return self.names.index(name)

    def __len__(self) -> int:
        return len(self.names)


def kernel_name(family: str, scale: float) -> str:
    """Readable label such as `"gauss x0.5"`; the energy kernel is just `"energy"`."""
    return "energy" if family == "energy" else f"{family} x{scale:g}"


def check_specs(specs: Sequence) -> tuple[tuple[str, float], ...]:
    """Validate `(family, scale)` pairs; scales are multiples of the median distance."""
    if isinstance(specs, str) or not isinstance(specs, Sequence) or len(specs) == 0:
        raise TypeError("specs must be a non-empty sequence of (family, scale) pairs")
    checked = []
    for spec in specs:
        if isinstance(spec, str) or not isinstance(spec, Sequence) or len(spec) != 2:
            raise TypeError(f"each kernel spec must be a (family, scale) pair, got {spec!r}")
        family, scale = spec
        if family not in KERNEL_FAMILIES:
            raise ValueError(f"unknown kernel family {family!r}; choose from {KERNEL_FAMILIES}")
        checked.append((family, check_bandwidth(scale)))
    names = [kernel_name(*spec) for spec in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"kernel specs repeat a kernel: {names}")
    return tuple(checked)


def kernel_bank(Z, specs: Sequence = DEFAULT_BANK_SPECS) -> KernelBank:
    """Build the `(L, N, N)` kernel stack (mod-test, eq-gaussian, eq-fused) on the pooled `Z`.

    Gaussian bandwidths are `scale x` the median Euclidean distance, Laplace bandwidths
    `scale x` the median Manhattan distance; both medians use the pooled sample only.
    """
    Z = as_points(Z, "Z")
    specs = check_specs(specs)
    distances, medians = {}, {}
    matrices, names, bandwidths = [], [], []
    for family, scale in specs:
        p = 1 if family == "laplace" else 2
        if p not in distances:
            distances[p] = pairwise_distances(Z, p=p)
        if family == "energy":
            matrices.append(distance_kernel(distances[p]))
            bandwidths.append(float("nan"))
        else:
            if p not in medians:
                medians[p] = off_diagonal_median(distances[p])
            h = scale * medians[p]
            kernel = gaussian_kernel if family == "gauss" else laplace_kernel
            matrices.append(kernel(distances[p], h))
            bandwidths.append(h)
        names.append(kernel_name(family, scale))
    return KernelBank(torch.stack(matrices), tuple(names), tuple(bandwidths))
