"""Exercise pm-ex-fractions: the active FFN fractions a shared + routed split can reach."""

import pytest

import icml26.prism_moe as pm

OK_FORMAT = False
name = "pm-ex-fractions"
points = 1


def test_fractions_match_the_formula(reachable_fractions):
    for width, shared, experts in ((128, 32, 12), (64, 16, 6), (96, 0, 8)):
        got = reachable_fractions(width, shared, experts)
        want = [pm.active_fraction(width, shared, experts, k) for k in range(1, experts + 1)]
        assert len(got) == experts
        assert all(abs(a - b) < 1e-12 for a, b in zip(got, want, strict=True))
    assert 0.375 in reachable_fractions(128, 32, 12)
    with pytest.raises(ValueError):
        reachable_fractions(128, 32, 7)
