"""The claims machinery: paired comparisons, exact rate families, kinds and the one table."""

import math

import numpy as np
import pytest
from scipy import stats

from icml26.claims import (
    CLAIMS_METADATA_KEY,
    FAMILY_LEVEL,
    Z_RULE,
    ClaimError,
    ClaimsCheck,
    collect_rows,
    paired_comparison,
    rate_family,
    threshold,
    verify,
)

# --- Paired comparisons -------------------------------------------------------------------------


def test_paired_comparison_matches_a_hand_computation():
    a, b = [0.9, 0.8, 0.85, 0.95], [0.5, 0.6, 0.55, 0.45]
    diff = np.array(a) - np.array(b)  # 0.4, 0.2, 0.3, 0.5
    result = paired_comparison(a, b, names=("MOD", "MMD"), margin=0.1)
    assert result.mean_difference == pytest.approx(0.35)
    assert result.standard_error == pytest.approx(diff.std(ddof=1) / 2)
    assert result.pairs == 4 and result.mean_a == pytest.approx(0.875)
    assert result.holds == (Z_RULE * result.standard_error < 0.35 - 0.1)
    assert result.numbers()["MOD - MMD"] == pytest.approx(0.35)
    assert result.rule() == "mean(MOD - MMD) > 0.1 + 2 s.e."


def test_paired_standard_error_agrees_with_scipy_ttest():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 30)
    b = a - rng.normal(0.3, 0.5, 30)
    result = paired_comparison(a, b)
    t = stats.ttest_rel(a, b).statistic
    assert result.mean_difference / result.standard_error == pytest.approx(t)


def test_direction_less_and_non_inferiority_margin():
    errors_new, errors_old = [1.0, 1.1, 0.9, 1.0], [2.0, 2.1, 1.8, 2.2]
    assert paired_comparison(errors_new, errors_old, direction="less").holds
    assert not paired_comparison(errors_new, errors_old, direction="greater").holds
    # "new is at most 0.2 worse than old": a negative margin states non-inferiority
    close = [1.05, 1.12, 0.95, 1.02]
    assert paired_comparison(close, errors_new, direction="less", margin=-0.2).holds
    assert not paired_comparison(close, errors_new, direction="less", margin=0.0).holds


def test_overlapping_noise_does_not_pass():
    """Two methods that differ by a small fraction of their noise: the rule withholds the claim."""
    rng = np.random.default_rng(1)
    verdicts = []
    for _ in range(200):
        a = rng.normal(0.0, 1.0, 10)
        b = rng.normal(-0.05, 1.0, 10)  # unpaired noise, a tiny true edge
        verdicts.append(paired_comparison(a, b).holds)
    assert np.mean(verdicts) < 0.1


def test_equal_methods_pass_at_the_nominal_one_sided_rate():
    """Under no difference, z = 2 passes about P(t_{n-1} > 2) of the time (n = 50 pairs)."""
    rng = np.random.default_rng(2)
    trials, n = 4000, 50
    passes = sum(paired_comparison(rng.normal(size=n), rng.normal(size=n)).holds
                 for _ in range(trials))
    expected = stats.t.sf(Z_RULE, n - 1)
    assert abs(passes / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_zero_variance_differences_use_the_plain_inequality():
    assert paired_comparison([2.0, 3.0], [1.0, 2.0]).holds
    assert not paired_comparison([2.0, 3.0], [1.0, 2.0], margin=1.0).holds


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "error", "match"),
    [
        ([1, 2, 3], [1, 2], {}, ValueError, "equal lengths"),
        ([1], [0], {}, ValueError, "at least two pairs"),
        ([1, float("nan")], [0, 0], {}, ValueError, "NaN"),
        ([1, 2], [0, 0], {"direction": "up"}, ValueError, "direction"),
        ([1, 2], [0, 0], {"z": -1.0}, ValueError, "z"),
        ([1, 2], [0, 0], {"margin": float("inf")}, ValueError, "margin"),
        ([1, 2], [0, 0], {"margin": "0.1"}, TypeError, "margin"),
    ],
)
def test_paired_comparison_rejects_bad_input(a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        paired_comparison(a, b, **kwargs)


# --- Rate families -----------------------------------------------------------------------------


def test_rate_family_uses_exact_binomial_p_values_and_holm():
    family = rate_family({"a": (9, 100), "b": (5, 100), "c": (13, 100)}, 0.05)
    p = [stats.binomtest(k, 100, 0.05, alternative="greater").pvalue for k in (9, 5, 13)]
    assert [c.p_value for c in family.checks] == pytest.approx(p)
    # Holm: sort ascending (c, a, b), multiply by 3, 2, 1, running maximum, cap at 1
    order = np.argsort(p)
    stepped = np.maximum.accumulate([(3 - i) * p[j] for i, j in enumerate(order)])
    holm = np.empty(3)
    holm[order] = np.minimum(1, stepped)
    assert [c.adjusted_p_value for c in family.checks] == pytest.approx(holm)
    assert family.holds == all(holm >= FAMILY_LEVEL)


def test_bonferroni_is_more_conservative_than_holm():
    counts = {"a": (12, 100), "b": (11, 100), "c": (4, 100)}
    holm = rate_family(counts, 0.05)
    bonferroni = rate_family(counts, 0.05, correction="bonferroni")
    for h, b in zip(holm.checks, bonferroni.checks, strict=True):
        assert b.adjusted_p_value >= h.adjusted_p_value - 1e-12


def test_coverage_side_tests_the_lower_tail():
    family = rate_family({"interval": (170, 200)}, 0.9, side="at_least")
    assert family.checks[0].p_value == pytest.approx(
        stats.binomtest(170, 200, 0.9, alternative="less").pvalue)
    assert not family.holds  # 85% coverage over 200 trials is evidence against 90%
    assert rate_family({"interval": (178, 200)}, 0.9, side="at_least").holds


def test_a_family_of_ten_exact_size_checks_fails_at_most_at_the_family_level():
    """Ten tests whose true size is exactly 5%: the family fails in at most ~5% of runs."""
    rng = np.random.default_rng(3)
    runs, failures = 1000, 0
    for _ in range(runs):
        rejections = rng.binomial(200, 0.05, size=10)
        family = rate_family({f"t{i}": (int(k), 200) for i, k in enumerate(rejections)}, 0.05)
        failures += not family.holds
    rate = failures / runs
    assert rate <= FAMILY_LEVEL + 3 * math.sqrt(FAMILY_LEVEL * (1 - FAMILY_LEVEL) / runs)
    # without the correction, ten checks at 2 s.e. each fail together far more often
    naive = np.mean([np.any(rng.binomial(200, 0.05, 10) / 200
                            > 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)) for _ in range(runs)])
    assert naive > 2 * rate


def test_a_family_with_one_inflated_size_fails():
    rng = np.random.default_rng(4)
    caught = 0
    for _ in range(200):
        counts = {f"t{i}": (int(rng.binomial(400, 0.05)), 400) for i in range(9)}
        counts["bad"] = (int(rng.binomial(400, 0.15)), 400)
        caught += not rate_family(counts, 0.05).holds
    assert caught / 200 > 0.95


@pytest.mark.parametrize(
    ("counts", "kwargs", "error", "match"),
    [
        ({}, {}, ValueError, "at least one"),
        ({"a": (5, 4)}, {}, ValueError, "successes <= trials"),
        ({"a": (1, 0)}, {}, ValueError, "trials >= 1"),
        ({"a": (1.5, 10)}, {}, TypeError, "integer"),
        ({"a": (1, 10)}, {"nominal": 1.5}, ValueError, r"\[0, 1\]"),
        ({"a": (1, 10)}, {"side": "below"}, ValueError, "side"),
        ({"a": (1, 10)}, {"correction": "sidak"}, ValueError, "correction"),
        ({"a": (1, 10)}, {"level": 0.0}, ValueError, "level"),
    ],
)
def test_rate_family_rejects_bad_input(counts, kwargs, error, match):
    kwargs = {"nominal": 0.05, **kwargs}
    with pytest.raises(error, match=match):
        rate_family(counts, **kwargs)


# --- Thresholds, kinds and the table -------------------------------------------------------------


def test_threshold_and_its_errors():
    assert threshold(1e-9, "<", 1e-7, draws=1000).holds
    assert not threshold(2.0, "<=", 1.0).holds
    assert threshold(3, "==", 3).numbers() == {"value": 3.0, "bound": 3.0}
    with pytest.raises(ValueError, match="comparison"):
        threshold(1, "=>", 0)
    with pytest.raises(ValueError, match="NaN"):
        threshold(float("nan"), "<", 0)


def _table_outputs(capture):
    return [o for o in capture if CLAIMS_METADATA_KEY in o[1]]


@pytest.fixture
def displayed(monkeypatch):
    """Collect what the claims module displays: (data, metadata) pairs."""
    shown = []

    def fake_display(data, raw=False, metadata=None):
        shown.append((data, metadata or {}))

    import IPython.display

    monkeypatch.setattr(IPython.display, "display", fake_display)
    return shown


def test_claims_check_shows_one_table_with_kinds_and_numbers(displayed):
    claims = ClaimsCheck(enforce=True)
    claims.paper("A beats B", paired_comparison([3, 4, 5], [1, 2, 2.5], names=("A", "B")))
    claims.finding("C does not beat B", paired_comparison([1, 2, 3], [1.1, 2.1, 2.8]),
                   expect=False)
    claims.verification("identity", threshold(1e-12, "<", 1e-8))
    claims.paper("sizes", rate_family({"x": (5, 100)}, 0.05))
    rows = claims.show()
    assert len(displayed) == 1
    data, metadata = displayed[0]
    assert "<table" in data["text/html"] and "[paper] reproduced: A beats B" in data["text/plain"]
    records = metadata[CLAIMS_METADATA_KEY]["rows"]
    assert [r["kind"] for r in records] == ["paper", "finding", "verification", "paper"]
    assert records[0]["numbers"]["A - B"] == pytest.approx(np.mean([2, 2, 2.5]))
    assert records[1]["verdict"] == "does not hold" and records[1]["expected"] is False
    assert [r.holds for r in rows] == [True, False, True, True]


def test_unexpected_verdicts_raise_after_the_table_is_shown(displayed):
    claims = ClaimsCheck(enforce=True)
    claims.paper("B beats A", paired_comparison([1, 2, 2.5], [3, 4, 5]))
    with pytest.raises(ClaimError, match=r"not reproduced \(UNEXPECTED\): B beats A"):
        claims.show()
    assert len(displayed) == 1  # the reader sees the numbers before the error


def test_smoke_tier_reports_claims_but_still_enforces_verifications(displayed):
    claims = ClaimsCheck(enforce=False)
    claims.paper("B beats A", paired_comparison([1, 2, 2.5], [3, 4, 5]))
    claims.show()  # no error: not enforced
    claims.verification("broken identity", threshold(1.0, "<", 1e-8))
    with pytest.raises(ClaimError, match="broken identity"):
        claims.show()


def test_expect_none_reports_without_asserting(displayed):
    claims = ClaimsCheck(enforce=True)
    claims.paper("within noise", paired_comparison([1, 2, 3], [1.1, 1.9, 3.05]), expect=None)
    claims.show()
    assert displayed[0][1][CLAIMS_METADATA_KEY]["rows"][0]["expected"] is None


def test_verify_displays_one_verification_and_raises_on_failure(displayed):
    verify("closed form equals Monte Carlo", threshold(0.01, "<", 0.05))
    row = displayed[0][1][CLAIMS_METADATA_KEY]["rows"][0]
    assert row["kind"] == "verification" and row["holds"]
    with pytest.raises(ClaimError):
        verify("closed form equals Monte Carlo", threshold(0.1, "<", 0.05))


def test_claims_reject_bad_kinds_statements_and_evidence():
    claims = ClaimsCheck()
    with pytest.raises(ValueError, match="kind"):
        claims.add("anecdote", "x", threshold(1, "<", 2))
    with pytest.raises(ValueError, match="statement"):
        claims.paper("  ", threshold(1, "<", 2))
    with pytest.raises(TypeError, match="evidence"):
        claims.paper("x", 0.9)
    with pytest.raises(ValueError, match="always expected"):
        claims.add("verification", "x", threshold(1, "<", 2), expect=False)
    with pytest.raises(ValueError, match="no rows"):
        ClaimsCheck().show()
    with pytest.raises(TypeError, match="enforce"):
        ClaimsCheck(enforce="yes")


def test_collect_rows_reads_every_displayed_check(displayed):
    verify("v", threshold(0, "<", 1))
    claims = ClaimsCheck(enforce=False)
    claims.paper("p", threshold(2, ">", 1))
    claims.show()
    notebook = {"cells": [
        {"cell_type": "markdown", "source": "text"},
        {"cell_type": "code", "outputs": [{"metadata": m} for _, m in displayed[:1]]},
        {"cell_type": "code", "outputs": [{"metadata": {}}, {"metadata": displayed[1][1]}]},
    ]}
    rows = collect_rows(notebook)
    assert [(r["kind"], r["enforced"]) for r in rows] == [("verification", True),
                                                          ("paper", False)]
