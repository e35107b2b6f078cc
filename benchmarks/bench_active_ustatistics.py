"""Wall-clock benchmark of the order-2 AIPW U-statistic (a script, not a test).

Compares, on one population with about ``budget`` Poisson-sampled labels:

1. a naive double loop over all pairs i < j, four kernel terms each (Eq. eq-pair-expansion);
2. the vectorised atom form (Eq. eq-atoms) with a generic kernel (no closed form used);
3. the same with the Gini kernel's sorted shortcut for the prediction-only row sums;
4. the generic path for Kendall's tau (records of a covariate and the label).

Run from the repository root:
    python benchmarks/bench_active_ustatistics.py [--n 5000] [--budget 500] [--naive-rows ROWS]

``--naive-rows`` times the double loop on the first ROWS values of i only and scales the time by
the number of pairs (the full loop at n = 5000 takes several seconds).
"""

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from icml26 import active_ustatistics as au


def seconds(run, repeats=1):
    """Best wall-clock time of ``repeats`` calls, and the last result."""
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def naive_pair_sum(y, y_hat, w, rows):
    """Sum of the AIPW pair values over i < j for the first ``rows`` values of i, in pure Python."""
    y, y_hat, w = y.tolist(), y_hat.tolist(), w.tolist()
    n, total = len(y), 0.0
    for i in range(rows):
        yi, hi, wi = y[i], y_hat[i], w[i]
        for j in range(i + 1, n):
            yj, hj, wj = y[j], y_hat[j], w[j]
            total += ((1 - wi) * (1 - wj) * abs(hi - hj) + wi * (1 - wj) * abs(yi - hj)
                      + (1 - wi) * wj * abs(hi - yj) + wi * wj * abs(yi - yj))
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="population size")
    parser.add_argument("--budget", type=float, default=500, help="expected number of labels")
    parser.add_argument("--naive-rows", type=int, default=None,
                        help="time the double loop on this many rows and extrapolate")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.n
    a = rng.standard_normal(n)
    y = a + rng.standard_normal(n)
    y_hat = a + 0.3 * rng.standard_normal(n)
    pi = au.practical_inclusion(np.abs(rng.standard_normal(n)), args.budget)
    sampled = rng.uniform(size=n) < pi
    labels = np.where(sampled, y, np.nan)
    w = np.where(sampled, 1 / pi, 0.0)
    print(f"n = {n}, {sampled.sum()} labels (expected {args.budget:.0f}), one thread")

    with threadpool_limits(1):
        def generic(u, v):
            return au.gini_kernel(u, v)  # a different object: the sorted shortcut is not used

        generic_time, generic_result = seconds(
            lambda: au.aipw_ustatistic(labels, y_hat, pi, sampled, generic), repeats=3)
        sorted_time, sorted_result = seconds(
            lambda: au.aipw_ustatistic(labels, y_hat, pi, sampled, au.gini_kernel), repeats=3)
        kendall_time, _ = seconds(lambda: au.aipw_ustatistic(
            au.kendall_records(a, labels), au.kendall_records(a, y_hat), pi, sampled,
            au.kendall_kernel), repeats=3)

    rows = n if args.naive_rows is None else min(args.naive_rows, n)
    naive_time, naive_sum = seconds(lambda: naive_pair_sum(y, y_hat, w, rows))
    pairs_done = rows * n - rows * (rows + 1) / 2
    scale = (n * (n - 1) / 2) / pairs_done
    naive_time *= scale
    if rows == n:
        naive_estimate = naive_sum / (n * (n - 1) / 2)
        agreement = f"|naive - vectorised| = {abs(naive_estimate - generic_result.estimate):.1e}"
    else:
        agreement = f"(extrapolated from {rows} of {n} rows)"

    print(f"naive double loop (Gini)       : {naive_time:9.3f} s   {agreement}")
    print(f"vectorised, generic kernel     : {generic_time:9.3f} s   "
          f"estimate {generic_result.estimate:.10f} +- {generic_result.std_error:.4f}")
    print(f"vectorised, Gini sorted sums   : {sorted_time:9.3f} s   "
          f"estimate {sorted_result.estimate:.10f}")
    print(f"vectorised, Kendall tau        : {kendall_time:9.3f} s")
    print(f"speed-up of the generic path over the double loop : {naive_time / generic_time:8.0f} x")
    print(f"speed-up of the sorted path over the double loop  : {naive_time / sorted_time:8.0f} x")


if __name__ == "__main__":
    main()
