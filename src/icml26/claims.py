"""Claims that can fail, with three verdicts: reproduced, contradicted or inconclusive.

Every check a chapter displays has a **kind**:

* ``verification``: an identity, a closed form against Monte Carlo, our code against a library.
  It can fail only through a bug (or, for a statistical check, by a chance of at most
  :data:`VERIFICATION_LEVEL`), so its verdict is ``holds`` or ``fails`` and a failure always stops
  the chapter.
* ``paper``: a claim of the paper, tested on our runs.
* ``finding``: our own result, where it disagrees with the paper or adds to it.

Paper claims and findings get one of :data:`VERDICTS`, each from a confidence interval under one
rule for the book: a two-sided interval at level :data:`LEVEL` (each one-sided bound at 97.5%).

* :func:`paired_comparison`: "A beats B by more than ``margin``", from the Student-t interval of the
  mean paired difference (``n - 1`` degrees of freedom). Reproduced when the interval lies above
  the margin, contradicted when it lies below ``smallest_effect`` (the smallest effect the claim is
  about, stated in advance; default the margin), inconclusive otherwise. A negative margin states
  non-inferiority; ``direction="equivalent"`` states "A and B agree within +-margin" (two one-sided
  tests: reproduced when the interval lies inside, contradicted when it lies outside).
* :func:`rate_claim`: "the rate is at most (at least) p", from the exact Clopper-Pearson interval,
  with the burden of proof on the claim.
* :func:`rate_family`: sizes or coverages checked as a family of exact binomial tests with Holm's
  correction at family-wise level :data:`VERIFICATION_LEVEL`: the burden of proof on a violation,
  right for checking that a procedure is valid, wrong for a paper's claim that a rate is low.
* :func:`threshold`: a plain inequality, for quantities without seed noise.

Every interval also gives the **minimal detectable effect** of its design (the smallest true effect
reproduced with probability :data:`POWER`) and a **fragile** flag: the verdict would change if the
estimate moved by :data:`FRAGILE_SHIFT` standard errors. With ``paper_effect=`` (the paper's own
effect) a row is **underpowered** when the design cannot detect an effect of the paper's size.

A chapter collects its rows in a :class:`ClaimsCheck` and shows one table::

    claims = ClaimsCheck(enforce=TIER != "smoke")
    claims.paper("MOD beats MMD under a scale shift",
                 paired_comparison(power_mod, power_mmd, names=("MOD", "MMD"), margin=0.1),
                 expect="reproduced")
    claims.show()

A verdict other than ``expect`` does not stop the chapter: the table marks it *unexpected* and the
build lists it (``icml26 build --strict-claims`` fails on it). The table's output metadata (key
:data:`CLAIMS_METADATA_KEY`) carries every row; the build gathers them into the ledger.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import numpy as np
from scipy import optimize, stats

KINDS = ("verification", "paper", "finding")
"""The kinds of check, in the order the ledger lists them."""

VERDICTS = ("reproduced", "contradicted", "inconclusive")
"""The verdicts of a paper claim or a finding."""

LEVEL = 0.05
"""Two-sided level of every interval behind a verdict: one rule for the book."""

VERIFICATION_LEVEL = 0.001
"""Family-wise level of a statistical verification: a correct chapter fails on one seed in 1000."""

POWER = 0.8
"""Power at which the minimal detectable effect is quoted."""

FRAGILE_SHIFT = 0.5
"""A verdict is fragile when moving the estimate by this many standard errors would change it."""

CLAIMS_METADATA_KEY = "icml26_claims"
"""Output-metadata key under which a displayed check carries its rows (read by the build)."""

_OPERATORS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
              "==": operator.eq}
_SIDES = {"at_most": "greater", "at_least": "less"}  # claim side -> binomial alternative
_CORRECTIONS = ("holm", "bonferroni")
_DIRECTIONS = ("greater", "less", "equivalent")


class ClaimError(AssertionError):
    """A verification failed; the message shows the numbers."""


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} is NaN")
    return value


def _finite(value, name: str) -> float:
    value = _real(value, name)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _check_level(level: float) -> float:
    level = _real(level, "level")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


def _json_number(value: float) -> float | None:
    """A number as JSON can carry it: an infinite or undefined value (an effect no design of this
    size can detect) becomes None."""
    value = float(value)
    return value if math.isfinite(value) else None


def _format(value: float) -> str:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return f"{float(value):.4g}"


def _interval_verdict(lower: float, upper: float, margin: float, smallest: float) -> str:
    """The claim "effect > margin" from an interval of the effect (eq-claims-verdict)."""
    if lower > margin:
        return "reproduced"
    if upper < smallest:
        return "contradicted"
    return "inconclusive"


def _equivalence_verdict(lower: float, upper: float, bound: float) -> str:
    """The claim "|effect| < bound": inside is reproduced, wholly outside is contradicted."""
    if -bound < lower and upper < bound:
        return "reproduced"
    if lower >= bound or upper <= -bound:
        return "contradicted"
    return "inconclusive"


# --- Paired comparisons ---------------------------------------------------------------------


def t_critical(pairs: int, level: float = LEVEL) -> float:
    """The Student-t quantile ``t_{1 - level/2, pairs - 1}`` behind every paired interval."""
    return float(stats.t.ppf(1 - level / 2, pairs - 1))


def detectable_noncentrality(pairs: int, level: float = LEVEL, power: float = POWER) -> float:
    """The noncentrality ``delta`` at which the one-sided t test at ``level / 2`` has ``power``.

    The minimal detectable effect of a paired design is ``delta * se`` above its margin: a true
    effect that large is reproduced with probability ``power`` (exactly, for normal differences
    with standard error ``se``; the noncentral t, not the normal approximation).
    """
    df, critical = pairs - 1, t_critical(pairs, level)

    def gap(delta: float) -> float:
        return float(stats.nct.sf(critical, df, delta)) - power

    return float(optimize.brentq(gap, 0.0, critical + 50.0 * (1 + stats.t.ppf(power, df))))


@dataclass(frozen=True)
class PairedComparison:
    """Mean paired difference of two methods, its Student-t interval, and the verdict.

    The **effect** is the difference in the claim's direction: ``mean(A - B)`` for ``greater`` and
    ``equivalent``, ``mean(B - A)`` for ``less``; ``lower`` and ``upper`` bound the effect.
    """

    names: tuple[str, str]
    mean_a: float
    mean_b: float
    mean_difference: float  # mean(A - B), whatever the direction
    standard_error: float
    pairs: int
    margin: float
    smallest_effect: float
    direction: str
    level: float = LEVEL
    paper_effect: float | None = None

    @property
    def effect(self) -> float:
        return -self.mean_difference if self.direction == "less" else self.mean_difference

    @property
    def critical(self) -> float:
        return t_critical(self.pairs, self.level)

    @property
    def lower(self) -> float:
        return self.effect - self.critical * self.standard_error

    @property
    def upper(self) -> float:
        return self.effect + self.critical * self.standard_error

    def verdict_at(self, effect: float) -> str:
        """The verdict an estimate ``effect`` would get with this design's interval width."""
        half = self.critical * self.standard_error
        if self.direction == "equivalent":
            return _equivalence_verdict(effect - half, effect + half, self.margin)
        return _interval_verdict(effect - half, effect + half, self.margin, self.smallest_effect)

    @property
    def verdict(self) -> str:
        return self.verdict_at(self.effect)

    @property
    def holds(self) -> bool:
        return self.verdict == "reproduced"

    @property
    def fragile(self) -> bool:
        shift = FRAGILE_SHIFT * self.standard_error
        return any(self.verdict_at(self.effect + s) != self.verdict for s in (-shift, shift))

    @property
    def mde(self) -> float:
        """Minimal detectable effect: the smallest true effect reproduced with :data:`POWER`.

        For an equivalence claim, the smallest bound shown with that power when A and B agree
        exactly (normal approximation, both one-sided tests).
        """
        if self.direction == "equivalent":
            return (self.critical + float(stats.t.ppf(1 - (1 - POWER) / 2, self.pairs - 1))) \
                * self.standard_error
        return self.margin + detectable_noncentrality(self.pairs, self.level) * self.standard_error

    @property
    def underpowered(self) -> bool:
        if self.paper_effect is None:
            return False
        if self.direction == "equivalent":
            return self.mde > self.margin
        return self.mde > self.paper_effect

    def numbers(self) -> dict[str, float]:
        a, b = self.names
        shown = {"estimate": self.effect, "lower": self.lower, "upper": self.upper,
                 "pairs": self.pairs, "s.e.": self.standard_error, "mde": self.mde,
                 f"mean {a}": self.mean_a, f"mean {b}": self.mean_b}
        if self.direction != "equivalent":
            shown["margin"] = self.margin
            if self.smallest_effect != self.margin:
                shown["smallest effect"] = self.smallest_effect
        else:
            shown["bound"] = self.margin
        if self.paper_effect is not None:
            shown["paper_effect"] = self.paper_effect
        return shown

    def rule(self) -> str:
        a, b = self.names
        effect = f"mean({b} - {a})" if self.direction == "less" else f"mean({a} - {b})"
        interval = f"{100 * (1 - self.level):g}% t interval of {effect}"
        if self.direction == "equivalent":
            return f"{interval} inside (-{self.margin:g}, {self.margin:g})"
        rule = f"{interval} above {self.margin:g}"
        if self.smallest_effect != self.margin:
            rule += f"; contradicted below {self.smallest_effect:g}"
        return rule

    def plot_interval(self) -> dict[str, float]:
        """The effect, its interval and the reference lines a forest plot draws."""
        return {"estimate": self.effect, "lower": self.lower, "upper": self.upper,
                "margin": self.margin if self.direction != "equivalent" else -self.margin,
                "smallest_effect": (self.smallest_effect if self.direction != "equivalent"
                                    else self.margin)}


def paired_comparison(
    a: Sequence[float], b: Sequence[float], *, names: tuple[str, str] = ("A", "B"),
    direction: str = "greater", margin: float = 0.0, smallest_effect: float | None = None,
    paper_effect: float | None = None, level: float = LEVEL,
) -> PairedComparison:
    """Compare two methods measured on the same seeds, data sets or replicates (eq-claims-t).

    With ``d_i = a_i - b_i``, the effect is ``mean(d)`` (``direction="greater"``: "A beats B by
    more than ``margin``") or ``-mean(d)`` (``"less"``: "A is below B by more than ``margin``"),
    and its interval is ``effect +- t_{1 - level/2, n-1} sd(d) / sqrt(n)``. A negative margin states
    non-inferiority ("A is at most |margin| worse than B"). ``direction="equivalent"`` states
    ``|mean(d)| < margin``. ``smallest_effect`` (at least the margin) is the effect below which the
    claim is contradicted; ``paper_effect`` the paper's own effect in the claim's direction.
    """
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(_DIRECTIONS)}, got {direction!r}")
    margin, level = _finite(margin, "margin"), _check_level(level)
    smallest = margin if smallest_effect is None else _finite(smallest_effect, "smallest_effect")
    if smallest < margin:
        raise ValueError(f"smallest_effect ({smallest}) must be at least the margin ({margin})")
    if direction == "equivalent" and (margin <= 0 or smallest_effect is not None):
        raise ValueError("an equivalence claim needs a positive margin (its bound) and no "
                         "smallest_effect")
    paper = None if paper_effect is None else _finite(paper_effect, "paper_effect")
    if len(names) != 2 or not all(isinstance(n, str) for n in names):
        raise TypeError("names must be a pair of strings")
    a_arr = np.asarray(a, dtype=float).ravel()
    b_arr = np.asarray(b, dtype=float).ravel()
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"paired samples need equal lengths, got {a_arr.size} and {b_arr.size}")
    if a_arr.size < 2:
        raise ValueError(f"a paired comparison needs at least two pairs, got {a_arr.size}")
    if not (np.all(np.isfinite(a_arr)) and np.all(np.isfinite(b_arr))):
        raise ValueError("paired samples contain NaN or infinite values")
    diff = a_arr - b_arr
    se = float(diff.std(ddof=1) / math.sqrt(diff.size))
    return PairedComparison(tuple(names), float(a_arr.mean()), float(b_arr.mean()),
                            float(diff.mean()), se, int(diff.size), margin, smallest, direction,
                            level, paper)


# --- Rates as claims ------------------------------------------------------------------------


def clopper_pearson(successes: float, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact two-sided interval of a binomial rate (``successes`` may be fractional)."""
    lower = 0.0 if successes <= 0 else float(stats.beta.ppf(level / 2, successes,
                                                            trials - successes + 1))
    upper = 1.0 if successes >= trials else float(stats.beta.ppf(1 - level / 2, successes + 1,
                                                                 trials - successes))
    return lower, upper


def _clopper_pearson_all(trials: int, level: float = LEVEL) -> np.ndarray:
    """:func:`clopper_pearson` for every count ``0..trials`` at once, shape ``(trials + 1, 2)``."""
    counts = np.arange(trials + 1, dtype=float)
    lower = np.concatenate([[0.0], stats.beta.ppf(level / 2, counts[1:], trials - counts[1:] + 1)])
    upper = np.concatenate([stats.beta.ppf(1 - level / 2, counts[:-1] + 1, trials - counts[:-1]),
                            [1.0]])
    return np.stack([lower, upper], axis=1)


@dataclass(frozen=True)
class RateClaim:
    """A rate claimed to be at most (or at least) ``bound``, with its Clopper-Pearson interval."""

    name: str
    successes: int
    trials: int
    bound: float
    side: str
    level: float = LEVEL
    paper_effect: float | None = None

    @property
    def rate(self) -> float:
        return self.successes / self.trials

    def _verdict_for(self, successes: float) -> str:
        lower, upper = clopper_pearson(successes, self.trials, self.level)
        effect_lower, effect_upper = ((self.bound - upper, self.bound - lower)
                                      if self.side == "at_most"
                                      else (lower - self.bound, upper - self.bound))
        return _interval_verdict(effect_lower, effect_upper, 0.0, 0.0)

    @property
    def verdict(self) -> str:
        return self._verdict_for(self.successes)

    @property
    def holds(self) -> bool:
        return self.verdict == "reproduced"

    @property
    def fragile(self) -> bool:
        shift = FRAGILE_SHIFT * math.sqrt(self.successes * (self.trials - self.successes)
                                          / self.trials)
        return any(self._verdict_for(min(max(self.successes + s, 0.0), float(self.trials)))
                   != self.verdict for s in (-shift, shift))

    @property
    def mde(self) -> float:
        """The distance from the bound at which the claim is reproduced with :data:`POWER`."""
        n = self.trials
        counts = np.arange(n + 1)
        bounds = _clopper_pearson_all(n, self.level)
        if self.side == "at_most":
            wins = counts[bounds[:, 1] < self.bound]
            if wins.size == 0:
                return math.inf
            edge = int(wins.max())
            return self.bound - optimize.brentq(
                lambda q: stats.binom.cdf(edge, n, q) - POWER, 0.0, self.bound)
        wins = counts[bounds[:, 0] > self.bound]
        if wins.size == 0:
            return math.inf
        edge = int(wins.min())
        return optimize.brentq(lambda q: stats.binom.sf(edge - 1, n, q) - POWER,
                               self.bound, 1.0) - self.bound

    @property
    def underpowered(self) -> bool:
        return self.paper_effect is not None and self.mde > self.paper_effect

    def interval(self) -> tuple[float, float]:
        return clopper_pearson(self.successes, self.trials, self.level)

    def numbers(self) -> dict[str, float]:
        lower, upper = self.interval()
        shown = {"estimate": self.rate, "lower": lower, "upper": upper,
                 "successes": self.successes, "trials": self.trials, "bound": self.bound,
                 "mde": self.mde}
        if self.paper_effect is not None:
            shown["paper_effect"] = self.paper_effect
        return shown

    def rule(self) -> str:
        side = "below" if self.side == "at_most" else "above"
        return (f"{100 * (1 - self.level):g}% Clopper-Pearson interval of the {self.name} "
                f"{side} {self.bound:g}")

    def plot_interval(self) -> dict[str, float]:
        lower, upper = self.interval()
        if self.side == "at_most":
            lower, upper = self.bound - upper, self.bound - lower
        else:
            lower, upper = lower - self.bound, upper - self.bound
        estimate = (self.bound - self.rate if self.side == "at_most" else self.rate - self.bound)
        return {"estimate": estimate, "lower": lower, "upper": upper, "margin": 0.0,
                "smallest_effect": 0.0}


def rate_claim(
    successes: int, trials: int, *, at_most: float | None = None, at_least: float | None = None,
    name: str = "rate", paper_effect: float | None = None, level: float = LEVEL,
) -> RateClaim:
    """The claim "the rate is at most ``at_most``" (or at least ``at_least``), burden on the claim.

    Reproduced when the exact interval lies on the claimed side of the bound, contradicted when it
    lies wholly on the other side, inconclusive otherwise: 13 of 400 is inconclusive for "at most
    2%". ``paper_effect`` is a distance from the bound (the paper's own margin), in rate units.
    """
    if (at_most is None) == (at_least is None):
        raise ValueError("give exactly one of at_most and at_least")
    side, bound = ("at_most", at_most) if at_most is not None else ("at_least", at_least)
    bound, level = _real(bound, side), _check_level(level)
    if not 0 <= bound <= 1:
        raise ValueError(f"{side} must lie in [0, 1], got {bound}")
    for value, what in ((successes, "successes"), (trials, "trials")):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{what} must be an integer, got {value!r}")
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of "
                         f"{trials}")
    paper = None if paper_effect is None else _finite(paper_effect, "paper_effect")
    return RateClaim(str(name), int(successes), int(trials), bound, side, level, paper)


# --- Rate families (validity checks) --------------------------------------------------------


@dataclass(frozen=True)
class RateCheck:
    """One observed rate against its nominal value: the exact binomial p-value, raw and adjusted."""

    name: str
    successes: int
    trials: int
    nominal: float
    side: str
    p_value: float
    adjusted_p_value: float
    holds: bool

    @property
    def rate(self) -> float:
        return self.successes / self.trials


def violation_rate(nominal: float, side: str) -> float:
    """The rate a validity check must still catch: twice the nominal size, or twice the nominal
    miscoverage."""
    return min(1.0, 2 * nominal) if side == "at_most" else max(0.0, 1 - 2 * (1 - nominal))


def _detection_power(trials: int, nominal: float, side: str, level: float) -> float:
    """Chance that one exact test at ``level`` flags a true rate of :func:`violation_rate`."""
    counts = np.arange(trials + 1)
    alternative = violation_rate(nominal, side)
    if side == "at_most":
        flagged = counts[stats.binom.sf(counts - 1, trials, nominal) < level]
        if not flagged.size:
            return 0.0
        return float(stats.binom.sf(flagged.min() - 1, trials, alternative))
    flagged = counts[stats.binom.cdf(counts, trials, nominal) < level]
    return float(stats.binom.cdf(flagged.max(), trials, alternative)) if flagged.size else 0.0


@dataclass(frozen=True)
class RateFamily:
    """Rates checked together; the family holds when no adjusted p-value falls below ``level``."""

    checks: tuple[RateCheck, ...]
    nominal: float
    side: str
    level: float
    correction: str

    @property
    def holds(self) -> bool:
        return all(check.holds for check in self.checks)

    @property
    def verdict(self) -> str:
        return "reproduced" if self.holds else "contradicted"

    fragile = False
    underpowered = False

    @property
    def power(self) -> float:
        """Smallest chance, over the family, that a rate at :func:`violation_rate` is flagged
        (each test at the Bonferroni level, a lower bound for Holm's)."""
        per_test = self.level / len(self.checks)
        return min(_detection_power(c.trials, self.nominal, self.side, per_test)
                   for c in self.checks)

    def numbers(self) -> dict[str, float]:
        rates = [c.rate for c in self.checks]
        worst = min(self.checks, key=lambda c: c.adjusted_p_value)
        pick = max if self.side == "at_most" else min
        return {"checks": len(self.checks), "nominal": self.nominal,
                ("largest rate" if self.side == "at_most" else "smallest rate"): pick(rates),
                "trials": min(c.trials for c in self.checks),
                f"min {self.correction} p": worst.adjusted_p_value, "level": self.level,
                "power at 2x": self.power}

    def rule(self) -> str:
        sign = "<=" if self.side == "at_most" else ">="
        return (f"every rate {sign} {self.nominal:g}: exact binomial tests, "
                f"{self.correction} family-wise level {self.level:g}")

    def rows(self) -> list[dict[str, float | str]]:
        """One dict per rate: name, successes, trials, rate, p-value, adjusted p-value, holds."""
        return [{"name": c.name, "successes": c.successes, "trials": c.trials, "rate": c.rate,
                 "p": c.p_value, "adjusted p": c.adjusted_p_value, "holds": c.holds}
                for c in self.checks]


def _adjust(p_values: np.ndarray, correction: str) -> np.ndarray:
    """Holm's step-down or Bonferroni's adjusted p-values (capped at 1)."""
    m = p_values.size
    if correction == "bonferroni":
        return np.minimum(1.0, p_values * m)
    order = np.argsort(p_values)
    stepped = np.maximum.accumulate((m - np.arange(m)) * p_values[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(1.0, stepped)
    return adjusted


def rate_family(
    counts: Mapping[str, tuple[int, int]], nominal: float, *, side: str = "at_most",
    level: float = VERIFICATION_LEVEL, correction: str = "holm",
) -> RateFamily:
    """Check that a procedure is valid: rates (sizes, coverages) as one family of exact tests.

    ``counts`` maps a name to ``(successes, trials)``. For ``side="at_most"`` (a size) each rate
    is tested against the alternative "rate > nominal", for ``side="at_least"`` (a coverage)
    against "rate < nominal"; a check fails when its adjusted p-value is below ``level``. If every
    true rate is at its nominal bound, the family fails with probability at most ``level``.
    """
    if side not in _SIDES:
        raise ValueError(f"side must be one of {', '.join(_SIDES)}, got {side!r}")
    if correction not in _CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(_CORRECTIONS)}, got {correction!r}")
    nominal, level = _real(nominal, "nominal"), _check_level(level)
    if not 0 <= nominal <= 1:
        raise ValueError(f"nominal rate must lie in [0, 1], got {nominal}")
    if not counts:
        raise ValueError("a rate family needs at least one rate")
    names, successes, trials = [], [], []
    for name, pair in counts.items():
        if len(pair) != 2:
            raise ValueError(f"rate {name!r} must be (successes, trials), got {pair!r}")
        k, n = pair
        for value, what in ((k, "successes"), (n, "trials")):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{what} of rate {name!r} must be an integer, got {value!r}")
        if n < 1 or not 0 <= k <= n:
            raise ValueError(f"rate {name!r}: need 0 <= successes <= trials and trials >= 1, "
                             f"got {k} of {n}")
        names.append(str(name))
        successes.append(int(k))
        trials.append(int(n))
    alternative = _SIDES[side]
    p = np.array([stats.binomtest(k, n, nominal, alternative=alternative).pvalue
                  for k, n in zip(successes, trials, strict=True)])
    adjusted = _adjust(p, correction)
    checks = tuple(RateCheck(name, k, n, nominal, side, float(pv), float(adj), bool(adj >= level))
                   for name, k, n, pv, adj in zip(names, successes, trials, p, adjusted,
                                                  strict=True))
    return RateFamily(checks, nominal, side, level, correction)


# --- Noise-free quantities ------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """A plain inequality ``value op bound``, for quantities that carry no seed noise."""

    value: float
    op: str
    bound: float
    holds: bool
    context: dict[str, float] = field(default_factory=dict)

    fragile = False
    underpowered = False

    @property
    def verdict(self) -> str:
        return "reproduced" if self.holds else "contradicted"

    def numbers(self) -> dict[str, float]:
        return {"estimate": self.value, "bound": self.bound, **self.context}

    def rule(self) -> str:
        return f"value {self.op} bound"


def threshold(value: float, op: str, bound: float, **context: float) -> Threshold:
    """``value op bound`` with ``op`` one of ``> >= < <= ==``; ``context`` numbers are shown too."""
    if op not in _OPERATORS:
        raise ValueError(f"unknown comparison {op!r}; choose one of {', '.join(_OPERATORS)}")
    value, bound = _real(value, "value"), _real(bound, "bound")
    shown = {key: _real(val, key) for key, val in context.items()}
    return Threshold(value, op, bound, bool(_OPERATORS[op](value, bound)), shown)


Evidence = PairedComparison | RateClaim | RateFamily | Threshold
_EVIDENCE = (PairedComparison, RateClaim, RateFamily, Threshold)


# --- Displaying checks ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One displayed check: its kind, statement, evidence and the verdict it was expected to get."""

    kind: str
    statement: str
    evidence: Evidence
    expect: str | None

    @property
    def verdict(self) -> str:
        """One of :data:`VERDICTS` for a paper claim or finding; ``holds``/``fails`` otherwise.

        A verification holds when its evidence holds: an interval that clears its margin, a rate
        family with no significant violation, an inequality that is true.
        """
        if self.kind == "verification":
            return "holds" if self.evidence.holds else "fails"
        return self.evidence.verdict

    @property
    def fragile(self) -> bool:
        return self.kind != "verification" and self.evidence.fragile

    @property
    def underpowered(self) -> bool:
        return self.kind != "verification" and self.evidence.underpowered

    @property
    def unexpected(self) -> bool:
        if self.kind == "verification":
            return self.verdict == "fails"
        return self.expect is not None and self.verdict != self.expect

    def record(self) -> dict:
        """The row as plain data: what the output metadata and the ledger carry."""
        record = {"kind": self.kind, "statement": self.statement, "rule": self.evidence.rule(),
                  "numbers": {k: _json_number(v) for k, v in self.evidence.numbers().items()},
                  "verdict": self.verdict, "expected": self.expect, "fragile": self.fragile,
                  "underpowered": self.underpowered, "unexpected": self.unexpected}
        if hasattr(self.evidence, "plot_interval"):
            record["interval"] = self.evidence.plot_interval()
        return record

    def flags(self) -> list[str]:
        flags = []
        if self.unexpected:
            flags.append("UNEXPECTED" if self.kind != "verification" else "FAILED")
        if self.kind != "verification" and self.expect is None:
            flags.append("not asserted")
        if self.fragile:
            flags.append("fragile")
        if self.underpowered:
            flags.append("underpowered")
        return flags

    def text(self) -> str:
        numbers_text = ", ".join(f"{k}={_format(v)}" for k, v in self.evidence.numbers().items())
        flags = self.flags()
        note = f" ({', '.join(flags)})" if flags else ""
        expected = f", expected {self.expect}" if self.unexpected and self.expect else ""
        return (f"[{self.kind}] {self.verdict}{note}{expected}: {self.statement} "
                f"({self.evidence.rule()}; {numbers_text})")


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown claim kind {kind!r}; choose one of {', '.join(KINDS)}")
    return kind


def _make_row(kind: str, statement: str, evidence: Evidence, expect: str | None) -> Row:
    _check_kind(kind)
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("a claim needs a statement in words")
    if not isinstance(evidence, _EVIDENCE):
        raise TypeError("evidence must come from paired_comparison, rate_claim, rate_family or "
                        f"threshold, got {type(evidence).__name__}")
    if kind == "verification":
        if expect is not None:
            raise ValueError("a verification is always expected to hold: give no expect")
        if isinstance(evidence, (PairedComparison, RateClaim)) and \
                evidence.level > VERIFICATION_LEVEL:
            raise ValueError(f"a statistical verification runs at level {VERIFICATION_LEVEL:g} "
                             f"(got {evidence.level:g}), so that a correct chapter fails by chance "
                             "at most that often; pass level=VERIFICATION_LEVEL, or make it a "
                             "finding")
    elif expect is not None and (not isinstance(expect, str) or expect not in VERDICTS):
        raise TypeError(f"expect must be one of {', '.join(VERDICTS)} (or None: reported, not "
                        f"asserted), got {expect!r}")
    return Row(kind, statement.strip(), evidence, expect)


def _html_table(rows: list[Row]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("statement", "kind", "numbers", "verdict"))
    body = []
    for row in rows:
        numbers_html = "<br>".join(f"{escape(k)} = {_format(v)}"
                                   for k, v in row.evidence.numbers().items())
        flags = row.flags()
        verdict = f"<b>{escape(row.verdict)}</b>"
        if flags:
            verdict += "<br><small>" + escape(", ".join(flags)) + "</small>"
        if row.unexpected and row.expect:
            verdict += f"<br><small>expected {escape(row.expect)}</small>"
        css = (' class="icml26-unexpected" style="background-color: #fbe3d6"'
               if row.unexpected else "")
        body.append(f"<tr{css}><td>{escape(row.statement)}<br><small>"
                    f"{escape(row.evidence.rule())}</small></td><td>{row.kind}</td>"
                    f"<td>{numbers_html}</td><td>{verdict}</td></tr>")
    return (f'<table class="icml26-claims"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _display(rows: list[Row], enforced: bool) -> None:
    from IPython.display import display

    text = "\n".join(row.text() for row in rows)
    metadata = {CLAIMS_METADATA_KEY: {"rows": [row.record() for row in rows],
                                      "enforced": enforced}}
    display({"text/plain": text, "text/html": _html_table(rows)}, raw=True, metadata=metadata)


def _raise_failed_verifications(rows: list[Row]) -> None:
    failed = [row for row in rows if row.kind == "verification" and row.unexpected]
    if failed:
        raise ClaimError("; ".join(row.text() for row in failed))


def verify(statement: str, evidence: Evidence) -> None:
    """Show one verification in place (a derivation's numeric check) and raise if it fails."""
    row = _make_row("verification", statement, evidence, None)
    _display([row], enforced=True)
    _raise_failed_verifications([row])


class ClaimsCheck:
    """A chapter's claims check: collect rows by kind, then :meth:`show` them as one table.

    Each paper claim and finding states the verdict it is expected to get (``expect=``, one of
    :data:`VERDICTS`; ``None`` reports a verdict without asserting one). An unexpected verdict is
    marked in the table and listed by the build, never raised here; a failed verification raises
    :class:`ClaimError`. ``enforce=False`` (the smoke tier, whose sizes are too small for the
    claims) keeps the rows out of the strict build's count.
    """

    def __init__(self, *, enforce: bool = True) -> None:
        if not isinstance(enforce, bool):
            raise TypeError(f"enforce must be a bool, got {type(enforce).__name__}")
        self.enforce = enforce
        self.rows: list[Row] = []

    def add(self, kind: str, statement: str, evidence: Evidence,
            expect: str | None = None) -> Row:
        row = _make_row(kind, statement, evidence, expect)
        self.rows.append(row)
        return row

    def verification(self, statement: str, evidence: Evidence) -> Row:
        return self.add("verification", statement, evidence)

    def paper(self, statement: str, evidence: Evidence, *, expect: str | None) -> Row:
        return self.add("paper", statement, evidence, expect)

    def finding(self, statement: str, evidence: Evidence, *, expect: str | None) -> Row:
        return self.add("finding", statement, evidence, expect)

    def show(self) -> None:
        """Display the table (one output); raise :class:`ClaimError` if a verification fails."""
        if not self.rows:
            raise ValueError("the claims check has no rows")
        _display(self.rows, self.enforce)
        _raise_failed_verifications(self.rows)


def collect_rows(notebook) -> list[dict]:
    """Every row of every displayed check in an executed notebook (``nbformat`` node or dict)."""
    rows = []
    for cell in notebook["cells"]:
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            entry = output.get("metadata", {}).get(CLAIMS_METADATA_KEY)
            if entry:
                rows.extend(dict(row, enforced=entry.get("enforced", True))
                            for row in entry["rows"])
    return rows


def strict_problems(rows: list[dict]) -> list[str]:
    """What ``--strict-claims`` fails on: enforced rows with an unexpected verdict, or an expected
    verdict that is fragile."""
    problems = []
    for row in rows:
        if not row.get("enforced", True) or row["kind"] == "verification":
            continue
        if row["unexpected"]:
            problems.append(f"unexpected {row['verdict']} (expected {row['expected']}): "
                            f"{row['statement']}")
        elif row["expected"] is not None and row["fragile"]:
            problems.append(f"fragile {row['verdict']}: {row['statement']}")
    return problems


# --- Stored runs ----------------------------------------------------------------------------


def load_stored_run(path: str | Path, chapter: str, tier: str = "full") -> dict:
    """A chapter's claims rows from one stored run (a JSON file written by a script in ``data/``):
    its ``commit``, ``seed``, ``wall_minutes``, some ``glued`` values and the ``rows`` (each with
    ``kind``, ``statement``, ``verdict`` and, for an interval, ``estimate``, ``lower``,
    ``upper``, ``mde``). Raises if the file is another chapter's or another tier's."""
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    if record.get("chapter") != chapter or record.get("tier") != tier:
        raise ValueError(f"{path} is not a {tier}-tier run of the {chapter} chapter")
    return record


def stored_row(record: Mapping, prefix: str) -> dict:
    """The one row of a stored run whose statement starts with ``prefix``."""
    found = [row for row in record["rows"] if row["statement"].startswith(prefix)]
    if len(found) != 1:
        raise ValueError(f"{len(found)} stored rows start with {prefix!r}, expected one")
    return found[0]
