"""Claims that can fail: paired comparisons, exact rate checks, and one table per chapter.

Every check a chapter displays has a **kind**:

* ``verification``: an identity, a closed form against Monte Carlo, our code against a library.
  It can fail only through a bug, so it is always enforced.
* ``paper``: a claim of the paper, tested on our runs.
* ``finding``: our own result, where it disagrees with the paper or adds to it.

The evidence behind a check is one of three objects, each computed by a function of this module
and each showing every number behind its verdict:

* :func:`paired_comparison`: two methods on the same seeds, data sets or replicates. The claim
  "A beats B by more than ``margin``" holds when the mean paired difference exceeds the margin by
  ``z`` standard errors. :data:`Z_RULE` is the one multiplier of the whole book.
* :func:`rate_family`: sizes or coverages against a nominal rate, as a family. Each rate gets an
  exact one-sided binomial test; Holm's (or Bonferroni's) correction keeps the chance that a
  correct family fails anywhere at most ``level``.
* :func:`threshold`: a plain inequality, for quantities without seed noise (exact values,
  identities, errors against a closed form).

A chapter's claims check collects them in a :class:`ClaimsCheck` and shows one table::

    claims = ClaimsCheck(enforce=TIER != "smoke")
    claims.paper("MOD beats MMD under a scale shift",
                 paired_comparison(power_mod, power_mmd, names=("MOD", "MMD"), margin=0.1))
    claims.finding("MMD beats MOD under a location shift",
                   paired_comparison(power_mmd_loc, power_mod_loc, names=("MMD", "MOD")))
    claims.show()

The table's output metadata (key :data:`CLAIMS_METADATA_KEY`) carries each row's kind,
statement, numbers and verdict; the build gathers them into the book's "What reproduced" page.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

import numpy as np
from scipy import stats

KINDS = ("verification", "paper", "finding")
"""The kinds of check, in the order the ledger lists them."""

Z_RULE = 2.0
"""Standard errors by which a paired difference must clear its margin: one rule for the book."""

FAMILY_LEVEL = 0.05
"""Family-wise level of :func:`rate_family`: a correct family fails with at most this chance."""

CLAIMS_METADATA_KEY = "icml26_claims"
"""Output-metadata key under which a displayed check carries its rows (read by the build)."""

_OPERATORS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
              "==": operator.eq}
_SIDES = {"at_most": "greater", "at_least": "less"}  # claim side -> binomial alternative
_CORRECTIONS = ("holm", "bonferroni")


class ClaimError(AssertionError):
    """An enforced check did not have the expected verdict; the message shows the numbers."""


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} is NaN")
    return value


def _format(value: float) -> str:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return f"{float(value):.4g}"


# --- Evidence -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedComparison:
    """Mean paired difference of two methods, its standard error, and the verdict of the rule."""

    names: tuple[str, str]
    mean_a: float
    mean_b: float
    mean_difference: float
    standard_error: float
    pairs: int
    margin: float
    z: float
    direction: str
    holds: bool

    def numbers(self) -> dict[str, float]:
        a, b = self.names
        return {f"mean {a}": self.mean_a, f"mean {b}": self.mean_b,
                f"{a} - {b}": self.mean_difference, "s.e.": self.standard_error,
                "pairs": self.pairs, "margin": self.margin, "z": self.z}

    def rule(self) -> str:
        a, b = self.names
        bound = f"{self.margin:g} + {self.z:g} s.e." if self.margin else f"{self.z:g} s.e."
        if self.direction == "greater":
            return f"mean({a} - {b}) > {bound}"
        return f"mean({a} - {b}) < -({bound})" if self.margin else f"mean({a} - {b}) < -{bound}"


def paired_comparison(
    a: Sequence[float], b: Sequence[float], *, names: tuple[str, str] = ("A", "B"),
    direction: str = "greater", margin: float = 0.0, z: float = Z_RULE,
) -> PairedComparison:
    """Compare two methods measured on the same seeds, data sets or replicates.

    With ``d_i = a_i - b_i``, ``direction="greater"`` holds when ``mean(d) - margin > z * se``
    and ``direction="less"`` when ``mean(d) + margin < -z * se``, where ``se = sd(d) / sqrt(n)``
    (sample standard deviation, ``n - 1`` degrees of freedom). A negative margin states
    non-inferiority ("A is at most |margin| worse than B"). When every difference is the same,
    ``se`` is zero and the verdict is the plain inequality.
    """
    if direction not in ("greater", "less"):
        raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}")
    margin, z = _real(margin, "margin"), _real(z, "z")
    if not math.isfinite(margin):
        raise ValueError(f"margin must be finite, got {margin}")
    if not math.isfinite(z) or z < 0:
        raise ValueError(f"z must be a non-negative number, got {z}")
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
    mean = float(diff.mean())
    se = float(diff.std(ddof=1) / math.sqrt(diff.size))
    if direction == "greater":
        holds = mean - margin > z * se if se > 0 else mean - margin > 0
    else:
        holds = mean + margin < -z * se if se > 0 else mean + margin < 0
    return PairedComparison(tuple(names), float(a_arr.mean()), float(b_arr.mean()), mean, se,
                            int(diff.size), margin, z, direction, bool(holds))


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

    def numbers(self) -> dict[str, float]:
        rates = [c.rate for c in self.checks]
        worst = min(self.checks, key=lambda c: c.adjusted_p_value)
        pick = max if self.side == "at_most" else min
        return {"checks": len(self.checks), "nominal": self.nominal,
                ("largest rate" if self.side == "at_most" else "smallest rate"): pick(rates),
                "trials": min(c.trials for c in self.checks),
                f"min {self.correction} p": worst.adjusted_p_value, "level": self.level}

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
    level: float = FAMILY_LEVEL, correction: str = "holm",
) -> RateFamily:
    """Check rates (sizes, coverages) as one family with exact binomial tests.

    ``counts`` maps a name to ``(successes, trials)``. For ``side="at_most"`` (a size) each rate
    is tested against the alternative "rate > nominal", for ``side="at_least"`` (a coverage)
    against "rate < nominal"; a check fails when its adjusted p-value is below ``level``. If every
    true rate is at its nominal bound, the family fails with probability at most ``level``.
    """
    if side not in _SIDES:
        raise ValueError(f"side must be one of {', '.join(_SIDES)}, got {side!r}")
    if correction not in _CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(_CORRECTIONS)}, got {correction!r}")
    nominal, level = _real(nominal, "nominal"), _real(level, "level")
    if not 0 <= nominal <= 1:
        raise ValueError(f"nominal rate must lie in [0, 1], got {nominal}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
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


@dataclass(frozen=True)
class Threshold:
    """A plain inequality ``value op bound``, for quantities that carry no seed noise."""

    value: float
    op: str
    bound: float
    holds: bool
    context: dict[str, float] = field(default_factory=dict)

    def numbers(self) -> dict[str, float]:
        return {"value": self.value, "bound": self.bound, **self.context}

    def rule(self) -> str:
        return f"value {self.op} bound"


def threshold(value: float, op: str, bound: float, **context: float) -> Threshold:
    """``value op bound`` with ``op`` one of ``> >= < <= ==``; ``context`` numbers are shown too."""
    if op not in _OPERATORS:
        raise ValueError(f"unknown comparison {op!r}; choose one of {', '.join(_OPERATORS)}")
    value, bound = _real(value, "value"), _real(bound, "bound")
    shown = {key: _real(val, key) for key, val in context.items()}
    return Threshold(value, op, bound, bool(_OPERATORS[op](value, bound)), shown)


Evidence = PairedComparison | RateFamily | Threshold


# --- Displaying checks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One displayed check: its kind, statement, evidence and the verdict it was expected to get."""

    kind: str
    statement: str
    evidence: Evidence
    expect: bool | None

    @property
    def holds(self) -> bool:
        return self.evidence.holds

    @property
    def verdict(self) -> str:
        if self.kind == "paper":
            return "reproduced" if self.holds else "not reproduced"
        return "holds" if self.holds else "does not hold"

    @property
    def as_expected(self) -> bool:
        return self.expect is None or self.holds == self.expect

    def record(self) -> dict:
        """The row as plain data: what the output metadata and the ledger carry."""
        return {"kind": self.kind, "statement": self.statement, "rule": self.evidence.rule(),
                "numbers": {k: float(v) for k, v in self.evidence.numbers().items()},
                "holds": self.holds, "verdict": self.verdict, "expected": self.expect}

    def text(self) -> str:
        numbers_text = ", ".join(f"{k}={_format(v)}" for k, v in self.evidence.numbers().items())
        note = "" if self.as_expected else " (UNEXPECTED)"
        return (f"[{self.kind}] {self.verdict}{note}: {self.statement} "
                f"({self.evidence.rule()}; {numbers_text})")


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown claim kind {kind!r}; choose one of {', '.join(KINDS)}")
    return kind


def _make_row(kind: str, statement: str, evidence: Evidence, expect: bool | None) -> Row:
    _check_kind(kind)
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("a claim needs a statement in words")
    if not isinstance(evidence, (PairedComparison, RateFamily, Threshold)):
        raise TypeError("evidence must come from paired_comparison, rate_family or threshold, "
                        f"got {type(evidence).__name__}")
    if expect not in (True, False, None):
        raise TypeError(f"expect must be True, False or None, got {expect!r}")
    if kind == "verification" and expect is not True:
        raise ValueError("a verification is always expected to hold")
    return Row(kind, statement.strip(), evidence, expect)


def _html_table(rows: list[Row]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("statement", "kind", "numbers", "verdict"))
    body = []
    for row in rows:
        numbers_html = "<br>".join(f"{escape(k)} = {_format(v)}"
                                   for k, v in row.evidence.numbers().items())
        verdict = row.verdict + ("" if row.as_expected else " (unexpected)")
        if row.expect is None:
            verdict += " (reported, not asserted)"
        body.append(f"<tr><td>{escape(row.statement)}<br><small>{escape(row.evidence.rule())}"
                    f"</small></td><td>{row.kind}</td><td>{numbers_html}</td>"
                    f"<td><b>{escape(verdict)}</b></td></tr>")
    return (f'<table class="icml26-claims"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _display(rows: list[Row], enforced: bool) -> None:
    from IPython.display import display

    text = "\n".join(row.text() for row in rows)
    metadata = {CLAIMS_METADATA_KEY: {"rows": [row.record() for row in rows],
                                      "enforced": enforced}}
    display({"text/plain": text, "text/html": _html_table(rows)}, raw=True, metadata=metadata)


def _raise_unexpected(rows: list[Row]) -> None:
    wrong = [row for row in rows if not row.as_expected]
    if wrong:
        raise ClaimError("; ".join(row.text() for row in wrong))


def verify(statement: str, evidence: Evidence) -> Row:
    """Show one verification in place (a derivation's numeric check) and raise if it fails."""
    row = _make_row("verification", statement, evidence, True)
    _display([row], enforced=True)
    _raise_unexpected([row])
    return row


class ClaimsCheck:
    """A chapter's claims check: collect rows by kind, then :meth:`show` them as one table.

    ``enforce=False`` (the smoke tier, whose sizes are too small for the claims) shows every
    verdict without raising; verifications are enforced at every tier. ``expect=False`` records a
    paper claim that our runs do not reproduce (or a finding that a tempting claim fails); it is
    then enforced the other way round. ``expect=None`` reports a verdict without asserting it:
    use it only for a result the chapter shows to lie within noise.
    """

    def __init__(self, *, enforce: bool = True) -> None:
        if not isinstance(enforce, bool):
            raise TypeError(f"enforce must be a bool, got {type(enforce).__name__}")
        self.enforce = enforce
        self.rows: list[Row] = []

    def add(self, kind: str, statement: str, evidence: Evidence,
            expect: bool | None = True) -> Row:
        row = _make_row(kind, statement, evidence, expect)
        self.rows.append(row)
        return row

    def verification(self, statement: str, evidence: Evidence) -> Row:
        return self.add("verification", statement, evidence, True)

    def paper(self, statement: str, evidence: Evidence, expect: bool | None = True) -> Row:
        return self.add("paper", statement, evidence, expect)

    def finding(self, statement: str, evidence: Evidence, expect: bool | None = True) -> Row:
        return self.add("finding", statement, evidence, expect)

    def show(self) -> list[Row]:
        """Display the table (one output) and raise :class:`ClaimError` on an unexpected verdict.

        Verifications are enforced at every tier; paper claims and findings when ``enforce``.
        """
        if not self.rows:
            raise ValueError("the claims check has no rows")
        _display(self.rows, self.enforce)
        _raise_unexpected([r for r in self.rows if self.enforce or r.kind == "verification"])
        return self.rows


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
