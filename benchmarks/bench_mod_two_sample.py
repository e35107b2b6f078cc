"""Wall-clock benchmark of the MOD chapter's permutation engine (a script, not a test).

1. hyppo's MMD permutation test against our single-kernel MMD test: same data, same number of
   permutations, same Gaussian kernel at the pooled median bandwidth, one worker / thread each.
2. Our engine with the 10-kernel bank in one call against 10 separate single-kernel calls.
   Both compute MMD^2 and MOD for all 10 kernels, including building the kernels from data.

Run from the repository root:
    python benchmarks/bench_mod_two_sample.py [--n 500] [--d 10] [--permutations 1000] [--threads 1]
"""

import argparse
import time
import warnings

import numpy as np
import torch
from hyppo.ksample import MMD

from icml26.data import two_sample
from icml26.kernels import DEFAULT_BANK_SPECS
from icml26.mod_two_sample import two_sample_test

BANK_TESTS = ("mod_fused", "mmd_fuse")


def seconds(run):
    """Wall-clock time of one call, and its result."""
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def hyppo_mmd_p_value(X, Y, permutations, threads):
    np.random.seed(0)  # hyppo's MMD draws its permutations from numpy's global generator
    return MMD().test(X, Y, reps=permutations, workers=threads, auto=False).pvalue


def warm_up(threads):
    """Compile hyppo's numba kernels and touch torch's thread pool outside the timings."""
    X, Y = two_sample("null", 20, 20, 2, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hyppo_mmd_p_value(X, Y, 10, threads)
    two_sample_test(X, Y, n_permutations=10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="points per sample (n = m)")
    parser.add_argument("--d", type=int, default=10, help="dimension")
    parser.add_argument("--permutations", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads = hyppo workers")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warm_up(args.threads)
    X, Y = two_sample("scale", args.n, args.n, args.d, 1.1, seed=0)
    B = args.permutations
    print(f"n = m = {args.n}, d = {args.d}, {B} permutations, {args.threads} thread(s)")

    hyppo_time, hyppo_p = seconds(lambda: hyppo_mmd_p_value(X, Y, B, args.threads))
    ours_time, ours = seconds(lambda: two_sample_test(X, Y, tests=("mmd",), n_permutations=B))
    print(f"hyppo MMD permutation test : {hyppo_time:8.2f} s   p = {hyppo_p:.4f}")
    print(f"our single-kernel MMD      : {ours_time:8.2f} s   p = {ours.p_values['mmd']:.4f}")
    print(f"speed-up over hyppo        : {hyppo_time / ours_time:8.1f} x")

    bank_time, _ = seconds(lambda: two_sample_test(X, Y, tests=BANK_TESTS, n_permutations=B))
    separate_time, _ = seconds(
        lambda: [
            two_sample_test(X, Y, tests=BANK_TESTS, n_permutations=B, bank=[spec])
            for spec in DEFAULT_BANK_SPECS
        ]
    )
    print(f"10-kernel bank, one call   : {bank_time:8.2f} s")
    print(f"10 single-kernel calls     : {separate_time:8.2f} s")
    print(f"speed-up of the bank       : {separate_time / bank_time:8.1f} x")


if __name__ == "__main__":
    main()
