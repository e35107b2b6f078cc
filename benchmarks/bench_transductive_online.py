"""Wall-clock benchmark of the exact minimax recursion of the transductive-online chapter.

1. Thresholds on the first 2^10 dyadic points (1025 hypotheses): the deterministic and the
   randomized value, with and without memoization on reduced classes.
2. All binary functions on 14 points (16384 hypotheses), where the memo collapses every version
   space of a round to a single state.

Run from the repository root:
    python benchmarks/bench_transductive_online.py [--points 1024] [--all-functions 14]
"""

import argparse
import time

from icml26.transductive_online import MinimaxSolver, all_functions, dyadic_points, thresholds


def timed(cls, kind: str, memoize: bool):
    """Seconds, value and number of expanded states of one solve on a fresh solver."""
    solver = MinimaxSolver(memoize=memoize)
    start = time.perf_counter()
    value = getattr(solver, kind)(cls)
    return time.perf_counter() - start, value, solver.expanded


def report(title: str, cls, kinds=("deterministic", "randomized")) -> None:
    print(title)
    for kind in kinds:
        with_memo = timed(cls, kind, memoize=True)
        without = timed(cls, kind, memoize=False)
        assert with_memo[1] == without[1], "memoization changed the value"
        print(f"  {kind:<13} value {str(with_memo[1]):>11}   "
              f"memo {with_memo[0]:7.3f} s ({with_memo[2]:>6} states)   "
              f"no memo {without[0]:7.3f} s ({without[2]:>6} states)   "
              f"speed-up {without[0] / with_memo[0]:6.1f} x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2**10, help="dyadic points for thresholds")
    parser.add_argument("--all-functions", type=int, default=14, help="points for all functions")
    args = parser.parse_args()
    report(f"thresholds on {args.points} dyadic points", thresholds(dyadic_points(args.points)))
    report(f"all binary functions on {args.all_functions} points",
           all_functions(args.all_functions), kinds=("deterministic",))


if __name__ == "__main__":
    main()
