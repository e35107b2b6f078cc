"""The claims machinery: three verdicts from intervals, power, fragility and the one table."""

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.weightstats import ttost_paired

from icml26.claims import (
    CLAIMS_METADATA_KEY,
    LEVEL,
    POWER,
    VERIFICATION_LEVEL,
    ClaimError,
    ClaimsCheck,
    clopper_pearson,
    collect_rows,
    detectable_noncentrality,
    paired_comparison,
    rate_claim,
    rate_family,
    strict_problems,
    threshold,
    verify,
)

# --- Paired comparisons -------------------------------------------------------------------------


def test_paired_interval_matches_scipy_ttest_rel():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 12)
    b = a - rng.normal(0.3, 0.5, 12)
    result = paired_comparison(a, b, names=("MOD", "MMD"))
    interval = stats.ttest_rel(a, b).confidence_interval(confidence_level=1 - LEVEL)
    assert (result.lower, result.upper) == pytest.approx((interval.low, interval.high))
    assert result.mean_difference == pytest.approx(np.mean(a - b))
    assert result.standard_error == pytest.approx(np.std(a - b, ddof=1) / math.sqrt(12))
    assert result.numbers()["estimate"] == pytest.approx(np.mean(a - b))
    assert result.numbers()["pairs"] == 12


def test_three_verdicts_on_hand_made_cases():
    clear = paired_comparison([0.9, 0.8, 0.85, 0.95], [0.5, 0.6, 0.55, 0.45], margin=0.1)
    assert clear.verdict == "reproduced"  # d = .4 .2 .3 .5: interval (.14, .56) above .1
    worse = paired_comparison([0.5, 0.6, 0.55, 0.45], [0.9, 0.8, 0.85, 0.95])
    assert worse.verdict == "contradicted"
    noisy = paired_comparison([1.0, 0.0, 1.2, -0.1], [0.5, 0.5, 0.5, 0.5])
    assert noisy.verdict == "inconclusive"
    # an effect confirmed positive but ruled out at the paper's size: reproduced as stated
    small = paired_comparison([1.01, 1.02, 1.01, 1.02], [1, 1, 1, 1], smallest_effect=0.5)
    assert small.verdict == "reproduced"
    # "beats by 0.5": the interval (.0077, .0223) lies below the smallest effect of interest
    assert paired_comparison([1.01, 1.02, 1.01, 1.02], [1, 1, 1, 1],
                             margin=0.5).verdict == "contradicted"


def test_direction_less_and_non_inferiority_margin():
    errors_new, errors_old = [1.0, 1.1, 0.9, 1.0], [2.0, 2.1, 1.8, 2.2]
    assert paired_comparison(errors_new, errors_old, direction="less").verdict == "reproduced"
    assert paired_comparison(errors_new, errors_old).verdict == "contradicted"
    # "new is at most 0.2 worse than old": a negative margin states non-inferiority
    close = [1.05, 1.12, 0.95, 1.02]
    assert paired_comparison(close, errors_new, direction="less",
                             margin=-0.2).verdict == "reproduced"
    assert paired_comparison(close, errors_new, direction="less").verdict != "reproduced"


def test_non_inferiority_agrees_with_a_one_sided_t_test():
    rng = np.random.default_rng(5)
    for _ in range(50):
        a, b = rng.normal(0, 1, 8), rng.normal(0.2, 1, 8)
        result = paired_comparison(a, b, margin=-0.5)
        p = stats.ttest_rel(a + 0.5, b, alternative="greater").pvalue
        assert (result.verdict == "reproduced") == (p < LEVEL / 2)


@pytest.mark.parametrize("seed", range(20))
def test_equivalence_is_two_one_sided_tests_as_in_statsmodels(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(0, 1, 15)
    b = a + rng.normal(rng.uniform(-0.4, 0.4), 0.3, 15)
    result = paired_comparison(a, b, direction="equivalent", margin=0.3)
    p_value = ttost_paired(a, b, -0.3, 0.3)[0]
    assert (result.verdict == "reproduced") == (p_value < LEVEL / 2)


def test_equivalence_outside_the_bound_is_contradicted():
    assert paired_comparison([2.0, 2.1, 2.05], [1, 1, 1], direction="equivalent",
                             margin=0.3).verdict == "contradicted"


def test_with_no_true_effect_reproduced_at_most_two_and_a_half_percent():
    rng = np.random.default_rng(2)
    runs, n = 4000, 6
    reproduced = sum(paired_comparison(rng.normal(size=n), rng.normal(size=n)).verdict
                     == "reproduced" for _ in range(runs))
    rate = reproduced / runs
    assert rate <= LEVEL / 2 + 3 * math.sqrt(LEVEL / 2 * (1 - LEVEL / 2) / runs)
    assert rate > 0.01  # and not far below: the interval is exact, not conservative


@pytest.mark.parametrize("pairs", [3, 5, 12])
def test_a_true_effect_at_the_minimal_detectable_effect_is_reproduced_80_percent(pairs):
    """Normal differences with known sd: the design's MDE (from sigma / sqrt(n)) has 80% power."""
    rng = np.random.default_rng(pairs)
    sigma, runs = 1.0, 4000
    effect = detectable_noncentrality(pairs) * sigma / math.sqrt(pairs)
    hits = sum(paired_comparison(rng.normal(effect, sigma, pairs), np.zeros(pairs)).verdict
               == "reproduced" for _ in range(runs))
    assert abs(hits / runs - POWER) < 4 * math.sqrt(POWER * (1 - POWER) / runs)


def test_reported_mde_is_margin_plus_noncentrality_times_se():
    result = paired_comparison([1.0, 1.3, 0.8, 1.1, 0.9], [0.5, 0.6, 0.4, 0.7, 0.5], margin=0.1)
    assert result.mde == pytest.approx(0.1 + detectable_noncentrality(5) * result.standard_error)
    # large samples: the normal approximation (z_.975 + z_.8) se
    assert detectable_noncentrality(2000) == pytest.approx(1.96 + 0.8416, abs=0.01)


def test_two_pairs_reproduce_nothing_unless_they_agree_almost_exactly():
    assert paired_comparison([1.0, 1.5], [0.0, 0.0]).verdict == "inconclusive"
    assert paired_comparison([1.0, 3.0], [0.0, 0.0]).verdict == "inconclusive"
    assert paired_comparison([1.0, 1.01], [0.0, 0.0]).verdict == "reproduced"


def test_paper_effect_flags_an_underpowered_design():
    noisy = paired_comparison([1.0, -0.5, 0.8, 0.1], [0.0, 0.0, 0.0, 0.0], paper_effect=0.2)
    assert noisy.underpowered and noisy.numbers()["paper_effect"] == 0.2
    tight = paired_comparison(np.linspace(0.29, 0.31, 20), np.zeros(20), paper_effect=0.2)
    assert not tight.underpowered


def test_fragile_when_half_a_standard_error_changes_the_verdict():
    rng = np.random.default_rng(7)
    diffs = rng.normal(0, 1, 10)
    diffs -= diffs.mean()
    se = diffs.std(ddof=1) / math.sqrt(10)
    critical = stats.t.ppf(1 - LEVEL / 2, 9)
    on_edge = paired_comparison(diffs + critical * se * 1.1, np.zeros(10))
    assert on_edge.verdict == "reproduced" and on_edge.fragile
    far = paired_comparison(diffs + critical * se * 3, np.zeros(10))
    assert far.verdict == "reproduced" and not far.fragile


def test_zero_variance_differences_give_a_point_interval():
    assert paired_comparison([2.0, 3.0], [1.0, 2.0]).verdict == "reproduced"
    assert paired_comparison([2.0, 3.0], [1.0, 2.0], margin=1.0).verdict == "inconclusive"


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "error", "match"),
    [
        ([1, 2, 3], [1, 2], {}, ValueError, "equal lengths"),
        ([1], [0], {}, ValueError, "at least two pairs"),
        ([1, float("nan")], [0, 0], {}, ValueError, "NaN"),
        ([1, 2], [0, 0], {"direction": "up"}, ValueError, "direction"),
        ([1, 2], [0, 0], {"level": 1.5}, ValueError, "level"),
        ([1, 2], [0, 0], {"margin": float("inf")}, ValueError, "margin"),
        ([1, 2], [0, 0], {"margin": "0.1"}, TypeError, "margin"),
        ([1, 2], [0, 0], {"margin": 0.2, "smallest_effect": 0.1}, ValueError, "at least"),
        ([1, 2], [0, 0], {"direction": "equivalent"}, ValueError, "positive margin"),
    ],
)
def test_paired_comparison_rejects_bad_input(a, b, kwargs, error, match):
    with pytest.raises(error, match=match):
        paired_comparison(a, b, **kwargs)


# --- Rate claims --------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "n"), [(0, 50), (13, 400), (70, 400), (400, 400), (7, 9)])
def test_clopper_pearson_matches_scipy(k, n):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - LEVEL, method="exact")
    assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high))


def test_rate_claims_put_the_burden_on_the_claim():
    assert rate_claim(13, 400, at_most=0.02).verdict == "inconclusive"
    assert rate_claim(70, 400, at_least=0.2).verdict != "reproduced"
    assert rate_claim(1, 400, at_most=0.02).verdict == "reproduced"
    assert rate_claim(40, 400, at_most=0.02).verdict == "contradicted"
    assert rate_claim(120, 400, at_least=0.2).verdict == "reproduced"


def test_rate_claim_mde_has_the_stated_power():
    claim = rate_claim(3, 400, at_most=0.05)
    rng = np.random.default_rng(11)
    true_rate = 0.05 - claim.mde
    hits = np.mean([rate_claim(int(k), 400, at_most=0.05).verdict == "reproduced"
                    for k in rng.binomial(400, true_rate, 3000)])
    assert abs(hits - POWER) < 0.03
    assert rate_claim(0, 10, at_most=0.01).mde == math.inf  # ten trials can never show 1%


def test_an_undetectable_effect_travels_as_json_null(displayed):
    import json

    claims = ClaimsCheck()
    claims.paper("rare", rate_claim(0, 10, at_most=0.01), expect="inconclusive")
    claims.show()
    row = displayed[0][1][CLAIMS_METADATA_KEY]["rows"][0]
    assert row["numbers"]["mde"] is None
    assert json.loads(json.dumps(row, allow_nan=False)) == row


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((1, 10), {}, ValueError, "exactly one"),
        ((1, 10), {"at_most": 0.1, "at_least": 0.2}, ValueError, "exactly one"),
        ((11, 10), {"at_most": 0.1}, ValueError, "successes <= trials"),
        ((1.0, 10), {"at_most": 0.1}, TypeError, "integer"),
        ((1, 10), {"at_most": 1.5}, ValueError, r"\[0, 1\]"),
    ],
)
def test_rate_claim_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        rate_claim(*args, **kwargs)


# --- Rate families (validity checks) ------------------------------------------------------------


def test_rate_family_uses_exact_binomial_p_values_and_holm():
    family = rate_family({"a": (9, 100), "b": (5, 100), "c": (13, 100)}, 0.05, level=0.05)
    p = [stats.binomtest(k, 100, 0.05, alternative="greater").pvalue for k in (9, 5, 13)]
    assert [c.p_value for c in family.checks] == pytest.approx(p)
    order = np.argsort(p)
    stepped = np.maximum.accumulate([(3 - i) * p[j] for i, j in enumerate(order)])
    holm = np.empty(3)
    holm[order] = np.minimum(1, stepped)
    assert [c.adjusted_p_value for c in family.checks] == pytest.approx(holm)
    assert family.holds == all(holm >= 0.05)


def test_coverage_side_tests_the_lower_tail():
    family = rate_family({"interval": (160, 200)}, 0.9, side="at_least")
    assert family.checks[0].p_value == pytest.approx(
        stats.binomtest(160, 200, 0.9, alternative="less").pvalue)
    assert not family.holds  # 80% coverage over 200 trials is evidence against 90% at .001
    assert rate_family({"interval": (178, 200)}, 0.9, side="at_least").holds


def test_a_correct_family_fails_at_most_at_the_verification_level():
    """Fifteen exact 5% sizes over 60 trials: a correct chapter fails on ~1 seed in 1000."""
    rng = np.random.default_rng(3)
    runs = 4000
    rejections = rng.binomial(60, 0.05, size=(runs, 15))
    failures = sum(not rate_family({f"t{i}": (int(k), 60) for i, k in enumerate(row)},
                                   0.05).holds for row in rejections)
    assert failures / runs <= VERIFICATION_LEVEL + 3 * math.sqrt(VERIFICATION_LEVEL / runs)


def test_power_against_twice_the_nominal_size():
    small = rate_family({"a": (3, 60)}, 0.05)
    large = rate_family({"a": (30, 1500)}, 0.05)
    assert small.power < 0.2 < 0.8 < large.power
    rng = np.random.default_rng(4)
    caught = np.mean([not rate_family({"a": (int(k), 1500)}, 0.05).holds
                      for k in rng.binomial(1500, 0.10, 400)])
    assert abs(caught - large.power) < 0.06


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
    assert threshold(1e-9, "<", 1e-7, draws=1000).verdict == "reproduced"
    assert threshold(2.0, "<=", 1.0).verdict == "contradicted"
    assert threshold(3, "==", 3).numbers() == {"estimate": 3.0, "bound": 3.0}
    with pytest.raises(ValueError, match="comparison"):
        threshold(1, "=>", 0)
    with pytest.raises(ValueError, match="NaN"):
        threshold(float("nan"), "<", 0)


@pytest.fixture
def displayed(monkeypatch):
    """Collect what the claims module displays: (data, metadata) pairs."""
    shown = []

    def fake_display(data, raw=False, metadata=None):
        shown.append((data, metadata or {}))

    import IPython.display

    monkeypatch.setattr(IPython.display, "display", fake_display)
    return shown


def test_claims_check_shows_one_table_with_verdicts_and_numbers(displayed):
    claims = ClaimsCheck(enforce=True)
    claims.paper("A beats B", paired_comparison([3, 4, 5, 4], [1, 2, 2.5, 2], names=("A", "B")),
                 expect="reproduced")
    claims.finding("C beats B", paired_comparison([1, 2, 3], [1.1, 2.1, 2.8]),
                   expect="inconclusive")
    claims.verification("identity", threshold(1e-12, "<", 1e-8))
    claims.paper("rate", rate_claim(2, 400, at_most=0.05), expect="reproduced")
    assert claims.show() is None
    assert len(displayed) == 1
    data, metadata = displayed[0]
    assert "<table" in data["text/html"] and "[paper] reproduced: A beats B" in data["text/plain"]
    records = metadata[CLAIMS_METADATA_KEY]["rows"]
    assert [r["kind"] for r in records] == ["paper", "finding", "verification", "paper"]
    assert [r["verdict"] for r in records] == ["reproduced", "inconclusive", "holds",
                                              "reproduced"]
    first = records[0]
    assert {"estimate", "lower", "upper", "pairs", "mde"} <= set(first["numbers"])
    assert first["expected"] == "reproduced" and first["fragile"] is False
    assert {"estimate", "lower", "upper", "trials", "mde"} <= set(records[3]["numbers"])


def test_unexpected_verdicts_are_marked_not_raised(displayed):
    claims = ClaimsCheck(enforce=True)
    claims.paper("B beats A", paired_comparison([1, 2, 2.5], [3, 4, 5]), expect="reproduced")
    claims.show()
    data, metadata = displayed[0]
    assert "UNEXPECTED" in data["text/plain"] and "icml26-unexpected" in data["text/html"]
    row = metadata[CLAIMS_METADATA_KEY]["rows"][0]
    assert row["unexpected"] and row["verdict"] == "contradicted"
    assert strict_problems(collect_rows({"cells": [
        {"cell_type": "code", "outputs": [{"metadata": metadata}]}]}))


def test_strict_problems_lists_unexpected_and_fragile_expected_rows():
    base = {"kind": "paper", "statement": "s", "verdict": "reproduced", "expected": "reproduced",
            "fragile": False, "unexpected": False, "enforced": True}
    assert strict_problems([base]) == []
    assert strict_problems([dict(base, fragile=True)]) == ["fragile reproduced: s"]
    assert strict_problems([dict(base, fragile=True, expected=None)]) == []
    assert len(strict_problems([dict(base, unexpected=True, verdict="inconclusive")])) == 1
    assert strict_problems([dict(base, unexpected=True, enforced=False)]) == []


def test_failed_verifications_raise_after_the_table_is_shown(displayed):
    claims = ClaimsCheck(enforce=False)
    claims.paper("B beats A", paired_comparison([1, 2, 2.5], [3, 4, 5]), expect="reproduced")
    claims.show()  # no error: claims never raise
    claims.verification("broken identity", threshold(1.0, "<", 1e-8))
    with pytest.raises(ClaimError, match="broken identity"):
        claims.show()
    assert len(displayed) == 2  # the reader sees the numbers before the error


def test_verify_displays_one_verification_returns_nothing_and_raises_on_failure(displayed):
    assert verify("closed form equals Monte Carlo", threshold(0.01, "<", 0.05)) is None
    row = displayed[0][1][CLAIMS_METADATA_KEY]["rows"][0]
    assert row["kind"] == "verification" and row["verdict"] == "holds"
    with pytest.raises(ClaimError):
        verify("closed form equals Monte Carlo", threshold(0.1, "<", 0.05))


def test_claims_reject_bad_kinds_statements_evidence_and_expectations():
    claims = ClaimsCheck()
    with pytest.raises(ValueError, match="kind"):
        claims.add("anecdote", "x", threshold(1, "<", 2))
    with pytest.raises(ValueError, match="statement"):
        claims.paper("  ", threshold(1, "<", 2), expect="reproduced")
    with pytest.raises(TypeError, match="evidence"):
        claims.paper("x", 0.9, expect="reproduced")
    with pytest.raises(TypeError, match="expect"):
        claims.paper("x", threshold(1, "<", 2), expect=True)
    with pytest.raises(TypeError, match="expect"):
        claims.finding("x", threshold(1, "<", 2), expect="not reproduced")
    with pytest.raises(ValueError, match="always expected"):
        claims.add("verification", "x", threshold(1, "<", 2), expect="reproduced")
    with pytest.raises(ValueError, match="level 0.001"):
        claims.verification("x", paired_comparison([3, 4, 5], [1, 2, 3]))
    assert claims.verification("x", paired_comparison([3, 4, 5], [1, 2, 3.1],
                                                       level=VERIFICATION_LEVEL)).verdict == "holds"
    with pytest.raises(ValueError, match="no rows"):
        ClaimsCheck().show()
    with pytest.raises(TypeError, match="enforce"):
        ClaimsCheck(enforce="yes")


def test_collect_rows_reads_every_displayed_check(displayed):
    verify("v", threshold(0, "<", 1))
    claims = ClaimsCheck(enforce=False)
    claims.paper("p", threshold(2, ">", 1), expect="reproduced")
    claims.show()
    notebook = {"cells": [
        {"cell_type": "markdown", "source": "text"},
        {"cell_type": "code", "outputs": [{"metadata": m} for _, m in displayed[:1]]},
        {"cell_type": "code", "outputs": [{"metadata": {}}, {"metadata": displayed[1][1]}]},
    ]}
    rows = collect_rows(notebook)
    assert [(r["kind"], r["enforced"]) for r in rows] == [("verification", True),
                                                          ("paper", False)]


@pytest.mark.parametrize("n", [1, 2, 17, 400])
def test_clopper_pearson_for_every_count_equals_one_by_one(n):
    from icml26.claims import _clopper_pearson_all

    table = _clopper_pearson_all(n, 0.1)
    assert table.shape == (n + 1, 2)
    for k in range(n + 1):
        assert tuple(table[k]) == pytest.approx(clopper_pearson(k, n, 0.1), abs=1e-15)


def test_stored_run_reads_back_and_checks_its_source(tmp_path):
    import json

    from icml26.claims import load_stored_run, stored_row

    record = dict(chapter="demo", tier="full", seed=0, commit="abc", wall_minutes=1.0,
                  glued={"n_models": 32.0},
                  rows=[dict(kind="paper", statement="under attack A beats B",
                             verdict="reproduced", estimate=0.2, lower=0.1, upper=0.3, mde=0.05),
                        dict(kind="paper", statement="under attack A beats C",
                             verdict="inconclusive", estimate=0.0, lower=-0.1, upper=0.1,
                             mde=0.05)])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    loaded = load_stored_run(path, "demo")
    assert stored_row(loaded, "under attack A beats B")["estimate"] == 0.2
    with pytest.raises(ValueError, match="2 stored rows"):
        stored_row(loaded, "under attack A beats")
    with pytest.raises(ValueError, match="0 stored rows"):
        stored_row(loaded, "the cache")
    with pytest.raises(ValueError, match="not a full-tier run of the other chapter"):
        load_stored_run(path, "other")
    path.write_text(json.dumps(dict(record, tier="book")))
    with pytest.raises(ValueError, match="not a full-tier run"):
        load_stored_run(path, "demo")
