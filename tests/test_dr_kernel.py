"""Tests for Dr. Kernel: turn-level advantages, the exact GRPO bias, PR/PRS and the mini gym."""

import itertools
import math

import numpy as np
import pytest
import torch

from icml26 import dr_kernel as drk


def test_trloo_equals_brute_force_leave_one_out():
    rng = np.random.default_rng(0)
    G = rng.normal(size=(50, 6))
    valid = rng.random((50, 6)) < 0.6
    adv = drk.group_advantages(G, valid, "trloo")
    for g, v, a in zip(G, valid, adv, strict=True):
        idx = np.flatnonzero(v)
        for i in range(6):
            if not v[i]:
                assert a[i] == 0
            elif len(idx) == 1:
                assert a[i] == pytest.approx(g[i])
            else:
                others = [g[j] for j in idx if j != i]
                assert a[i] == pytest.approx(g[i] - np.mean(others))


def test_grpo_is_trloo_shrunk_by_one_minus_one_over_n():
    """The identity G_i - mean(G) = (1 - 1/N)(G_i - mean_{-i} G) of eq-drk-identity."""
    rng = np.random.default_rng(1)
    G = rng.normal(size=(200, 5))
    valid = rng.random((200, 5)) < 0.7
    n = valid.sum(1, keepdims=True)
    grpo = drk.group_advantages(G, valid, "grpo")
    trloo = drk.group_advantages(G, valid, "trloo")
    expected = np.where(n >= 2, (1 - 1 / np.maximum(n, 1)) * trloo, 0.0)
    np.testing.assert_allclose(grpo, expected, atol=1e-12)


def test_grpo_std_has_unit_spread_within_a_group():
    G = np.random.default_rng(2).normal(size=(10, 8))
    adv = drk.group_advantages(G, np.ones_like(G, bool), "grpo_std")
    np.testing.assert_allclose(adv.std(1), 1.0, rtol=1e-4)


def test_returns_to_go_matches_a_loop():
    r = np.random.default_rng(3).random((4, 5))
    for gamma in (1.0, 0.7):
        G = drk.returns_to_go(r, gamma)
        for t in range(5):
            np.testing.assert_allclose(G[:, t], sum(gamma ** (k - t) * r[:, k]
                                                    for k in range(t, 5)))


def test_closed_form_matches_the_binomial_sum():
    proc = drk.RefinementProcess((0.2, 0.6, 0.4), (0.3, 0.6), 5)
    from scipy import stats
    for t, a in enumerate(proc.survival()):
        n = np.arange(6)
        pmf = stats.binom.pmf(n, 5, a)
        exact = np.sum(pmf * np.maximum(n - 1, 0)) / np.sum(pmf * n)  # E[(N-1)+] / E[N]
        assert proc.grpo_prediction()[t] == pytest.approx(exact)


def test_true_gradient_matches_finite_differences_of_the_objective():
    proc = drk.RefinementProcess((0.3, 0.5, 0.7), (0.5, 0.4), 4)
    theta = np.log(np.array(proc.success) / (1 - np.array(proc.success)))
    h = 1e-6
    for t in range(3):
        up, down = theta.copy(), theta.copy()
        up[t] += h
        down[t] -= h
        J = [drk.RefinementProcess(tuple(1 / (1 + np.exp(-v))), proc.termination, 4).objective()
             for v in (up, down)]
        assert (J[0] - J[1]) / (2 * h) == pytest.approx(proc.true_gradient()[t], rel=1e-6)


def test_monte_carlo_ratios_trloo_unbiased_and_grpo_closed_form():
    proc = drk.RefinementProcess()
    rng = np.random.default_rng(4)
    roll = proc.sample(60_000, rng)
    trloo = drk.gradient_ratio(proc, "trloo", 0, rng, rollouts=roll)
    grpo = drk.gradient_ratio(proc, "grpo", 0, rng, rollouts=roll)
    none = drk.gradient_ratio(proc, "none", 0, rng, rollouts=roll)
    assert np.all(np.abs(trloo.ratio - 1) < 4.5 * trloo.standard_error)
    assert np.all(np.abs(none.ratio - 1) < 4.5 * none.standard_error)
    assert np.all(np.abs(grpo.ratio - proc.grpo_prediction()) < 4.5 * grpo.standard_error)
    assert grpo.ratio[2] < 0.45  # the bias is large at the last turn, not a rounding effect


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="at least 2"):
        drk.RefinementProcess(group_size=1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        drk.RefinementProcess((0.3, 1.2, 0.5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        drk.RefinementProcess(termination=(0.5, -0.1))
    with pytest.raises(ValueError, match="termination"):
        drk.RefinementProcess(termination=(0.5,))
    with pytest.raises(ValueError, match="estimator"):
        drk.group_advantages(np.zeros((2, 3)), np.ones((2, 3), bool), "ppo")
    with pytest.raises(ValueError, match="at least 2"):
        drk.group_advantages(np.zeros((2, 1)), np.ones((2, 1), bool), "grpo")
    with pytest.raises(TypeError):
        drk.group_advantages(np.zeros((2, 3)), np.ones((2, 3)), "grpo")
    with pytest.raises(ValueError, match="at least 2"):
        drk.train_policy(drk.synthetic_outcomes, drk.RewardConfig(), steps=3, group_size=1,
                         rng=np.random.default_rng(0))


def test_prs_keep_probability_follows_the_ramp_and_spares_failures():
    cfg = drk.RewardConfig(rejection=True)
    cov = np.array([0.0, 0.3, 0.35, 0.4, 0.9, 0.35])
    out = drk.Outcomes(correct=np.array([True, True, True, True, True, False]),
                       measured_speedup=np.ones(6), true_speedup=np.ones(6), coverage=cov,
                       hacked=np.zeros(6, bool))
    np.testing.assert_allclose(drk.prs_keep_probability(out, cfg), [0, 0, 0.5, 1, 1, 1])
    np.testing.assert_allclose(drk.prs_keep_probability(out, drk.RewardConfig()), 1)


def test_rewards_hack_penalty_and_profiling_term():
    out = drk.Outcomes(correct=np.array([True, True, False]),
                       measured_speedup=np.array([5.0, 1.5, 2.0]),
                       true_speedup=np.array([1.0, 1.5, 2.0]), coverage=np.array([0, 0.8, 0.9]),
                       hacked=np.array([True, False, False]))
    np.testing.assert_allclose(drk.kernel_reward(out, drk.RewardConfig(hack_check=False)),
                               [4.0, 2.5, 0.0])
    np.testing.assert_allclose(drk.kernel_reward(out, drk.RewardConfig(profiling_reward=True)),
                               [-1.0, 2.9, 0.0])


def test_policy_gradient_step_is_unbiased_for_the_softmax():
    """With rewards fixed per arm, E[(1/K) sum_i A_i (e_a - pi)] = ((K-1)/K)... LOO is exact:
    the expected update equals the exact gradient of E_pi[r]."""
    pi = np.array([0.2, 0.5, 0.3])
    r = np.array([1.0, 2.0, 0.5])
    K = 3
    exact = pi * (r - pi @ r)
    expected = np.zeros(3)
    for combo in itertools.product(range(3), repeat=K):
        prob = np.prod(pi[list(combo)])
        adv = drk.group_advantages(r[list(combo)][None], np.ones((1, K), bool), "trloo")[0]
        expected += prob * sum(adv[i] * (np.eye(3)[combo[i]] - pi) for i in range(K)) / K
    np.testing.assert_allclose(expected, exact, atol=1e-12)


def test_e2_story_on_a_few_seeds():
    final = {}
    for name in ("no check", "check", "check + PR + PRS"):
        cfg = drk.RewardConfig(**drk.CONFIGS[name])
        runs = [drk.train_policy(drk.synthetic_outcomes, cfg, steps=200, lr=0.1,
                                 rng=np.random.default_rng(s)) for s in range(3)]
        final[name] = np.mean([r.final for r in runs], 0)
    assert final["no check"][2] > 0.8
    assert final["check"][0] > 0.8
    assert final["check + PR + PRS"][1] > final["check"][1] + 0.3


def test_mismatch_keep_band_and_veto():
    lr = np.log(np.full((3, 4), 0.5))
    lt = lr.copy()
    lt[1] += 0.01  # geometric ratio e^0.01 > 1.001
    lt[2, 0] = np.log(0.5 * 1e-5)  # one catastrophic token: vetoed
    lt[2, 1:] -= np.log(1e-5) / 3  # ... although the geometric mean is exactly 1
    keep, geo = drk.mismatch_keep(lt, lr)
    assert keep.tolist() == [True, False, False]
    assert geo[2] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        drk.mismatch_keep(lt, lr[:, :2])
    with pytest.raises(ValueError):
        drk.mismatch_keep(lt, lr, band=(1.1, 1.2))


# --- the mini gym ---------------------------------------------------------------------------------


def test_cost_model_counts_matmul_flops_and_skips_views():
    cm = drk.CostModel()
    x = torch.randn(8, 5)
    W = torch.randn(5, 3)
    with drk.OpLogger(cm) as log:
        _ = x @ W
        _ = x.T
    assert log.records[0].name == "mm" and len(log.records) == 2
    mm = log.records[0].cost
    moved = (40 + 15 + 24) * 4
    assert mm == pytest.approx(cm.launch_us + moved / cm.bytes_per_us + 2 * 8 * 5 * 3 /
                               cm.flops_per_us)
    assert log.records[1].cost == 0


@pytest.fixture(scope="module")
def table():
    return drk.build_table(2, 0)


def test_gym_verdicts(table):
    for e in table.evaluations:
        if e.strategy == "decoy":
            assert e.correct and e.hacked and e.kernels_executed == 0
            assert e.timer_speedup > 10 and e.speedup == pytest.approx(1.0, abs=0.05)
        elif e.correct:
            assert not e.hacked and e.kernels_executed == e.kernels_declared
            assert e.timer_speedup == pytest.approx(e.speedup)
        if e.strategy == "lazy":
            assert e.correct and e.coverage < 0.5 and e.speedup < 1.2
    fused_ok = [e for e in table.by_strategy("fuse") if e.correct]
    assert fused_ok and all(e.speedup >= 1.2 and e.coverage > 0.9 for e in fused_ok)
    assert any(not e.correct for e in table.by_strategy("fuse"))


def test_profiling_agrees_with_a_call_counter():
    """The cProfile check against a direct oracle: wrap the kernel and count its calls."""
    calls = []

    def kernel(x):
        calls.append(1)
        return torch.softmax(x, -1)

    task = drk.TASKS["softmax"]
    honest = drk.Candidate("softmax", "fuse", "honest", lambda x: kernel(x), (kernel,))
    skip = drk.Candidate("softmax", "decoy", "skip", lambda x: torch.softmax(x, -1), (kernel,))
    g = torch.Generator().manual_seed(0)
    e1 = drk.evaluate(honest, task, g)
    n1 = len(calls)
    e2 = drk.evaluate(skip, task, g)
    assert n1 > 0 and not e1.hacked
    assert len(calls) == n1 and e2.hacked  # the skipping candidate never called it


def test_failing_candidates_are_failures_not_crashes():
    task = drk.TASKS["gelu_tanh"]
    g = torch.Generator().manual_seed(1)

    def boom(x):
        raise ZeroDivisionError("nope")

    bad = [drk.Candidate("gelu_tanh", "fuse", "raises", boom, (boom,)),
           drk.Candidate("gelu_tanh", "fuse", "shape", lambda x: x[:, :3], ()),
           drk.Candidate("gelu_tanh", "fuse", "type", lambda x: x.numpy(), ()),
           drk.Candidate("gelu_tanh", "fuse", "none", lambda x: None, ())]
    for cand, word in zip(bad, ("ZeroDivisionError", "shape", "not a tensor", "not a tensor"),
                          strict=True):
        e = drk.evaluate(cand, task, g)
        assert not e.correct and word in e.error
    with pytest.raises(ValueError, match="task"):
        drk.evaluate(bad[0], drk.TASKS["softmax"], g)
    with pytest.raises(ValueError, match="strategy"):
        drk.Candidate("softmax", "magic", "x", boom)


def test_table_environment_feeds_the_learner(table):
    rng = np.random.default_rng(0)
    out = table.outcomes(np.array([0, 1, 2, 2]), rng)
    assert out.hacked[2] and out.hacked[3] and not out.hacked[0]
    assert math.isfinite(float(out.measured_speedup.sum()))


# --- the expected update (eq-drk-drift) and the PRS order ---------------------------------------


def _enumerated_update(pi, reward, keep_prob, K, mask_before_baseline=False):
    """Exact E[(1/K) sum_i m_i A_i (e_{a_i} - pi)] by enumerating every arm tuple and mask."""
    S = len(pi)
    total = np.zeros(S)
    for arms in itertools.product(range(S), repeat=K):
        p_arms = np.prod(pi[list(arms)])
        r = reward[list(arms)]
        for mask in itertools.product((False, True), repeat=K):
            m = np.array(mask)
            p_mask = np.prod(np.where(m, keep_prob[list(arms)], 1 - keep_prob[list(arms)]))
            if p_arms * p_mask == 0:
                continue
            members = m if mask_before_baseline else np.ones(K, bool)
            adv = drk.group_advantages(r[None], members[None], "trloo")[0]
            g = sum(m[i] * adv[i] * (np.eye(S)[arms[i]] - pi) for i in range(K)) / K
            total += p_arms * p_mask * g
    return total


def test_expected_update_matches_exhaustive_enumeration():
    """eq-drk-drift with the whole-group baseline, against a brute-force sum over groups."""
    pi = np.array([0.5, 0.3, 0.2])
    reward = np.array([2.0, 3.0, -1.0])
    keep = np.array([0.1, 1.0, 0.6])  # per-arm keep probabilities, rewards fixed per arm
    arms = drk.ArmStatistics(reward, keep * reward, keep, np.zeros(3), np.zeros(3))
    for K in (2, 3):
        exact = _enumerated_update(pi, reward, keep, K)
        np.testing.assert_allclose(drk.expected_update(pi, arms), exact, atol=1e-12)
    # without a mask the drift is the exact gradient of E_pi[r]
    plain = drk.ArmStatistics(reward, reward, np.ones(3), np.zeros(3), np.zeros(3))
    np.testing.assert_allclose(drk.expected_update(pi, plain), pi * (reward - pi @ reward))


def test_masking_before_the_baseline_changes_the_update():
    """With the mask first, a rejected sample no longer enters anyone's baseline."""
    pi = np.array([0.6, 0.4])
    reward = np.array([2.0, 1.5])
    keep = np.array([0.0, 1.0])  # arm 0 always rejected, arm 1 always kept
    released = _enumerated_update(pi, reward, keep, 3)
    first = _enumerated_update(pi, reward, keep, 3, mask_before_baseline=True)
    # released order: arm 1 is compared with arm 0's higher reward and pushed down
    assert released[1] < 0 < first[1]
    arms = drk.ArmStatistics(reward, keep * reward, keep, np.zeros(2), np.zeros(2))
    np.testing.assert_allclose(drk.expected_update(pi, arms), released, atol=1e-12)


def _monte_carlo_update(pi, seed, mask_before_baseline=False):
    """Mean policy gradient over 40,000 groups of 8 on the synthetic environment, its standard
    error, and the arm statistics (200,000 draws) the closed form needs."""
    cfg = drk.RewardConfig(**drk.CONFIGS["check + PR + PRS"],
                           mask_before_baseline=mask_before_baseline)
    rng = np.random.default_rng(seed)
    arms = drk.arm_statistics(drk.synthetic_outcomes, cfg, rng, draws=200_000)
    grads, _ = drk.policy_gradient(drk.synthetic_outcomes, cfg, np.tile(pi, (40_000, 1)),
                                   group_size=8, rng=rng)
    return grads.mean(0), grads.std(0, ddof=1) / np.sqrt(len(grads)), arms


def test_policy_gradient_mean_matches_expected_update():
    """Monte Carlo over many groups against eq-drk-drift on the synthetic environment."""
    pi = np.array([0.5, 0.3, 0.2])
    mean, se, arms = _monte_carlo_update(pi, seed=7)
    assert np.all(np.abs(mean - drk.expected_update(pi, arms)) < 4.5 * se + 2e-3)


def test_train_policies_replicates_and_bad_input():
    cfg = drk.RewardConfig(**drk.CONFIGS["check"])
    runs = drk.train_policies(drk.synthetic_outcomes, cfg, replicates=4, steps=20,
                              rng=np.random.default_rng(0))
    assert len(runs) == 4 and runs[0].policy.shape == (21, 3)
    np.testing.assert_allclose([r.policy.sum(1) for r in runs], 1.0)
    assert len({tuple(r.final.round(12)) for r in runs}) == 4  # independent replicates
    with pytest.raises(ValueError, match="replicates"):
        drk.train_policies(drk.synthetic_outcomes, cfg, replicates=0, steps=5,
                           rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="strategies"):
        drk.train_policies(drk.synthetic_outcomes, cfg, replicates=1, steps=5, strategies=1,
                           rng=np.random.default_rng(0))

    def flat(choice, rng):
        return drk.synthetic_outcomes(choice.ravel(), rng)

    with pytest.raises(ValueError, match="shape"):
        drk.train_policies(flat, cfg, replicates=2, steps=2, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="mask_before_baseline"):
        drk.RewardConfig(mask_before_baseline=1)
    with pytest.raises(ValueError, match="probability"):
        drk.policy_gradient(drk.synthetic_outcomes, cfg, np.array([[0.5, 0.7]]), group_size=4,
                            rng=np.random.default_rng(0))


def test_prs_treats_a_caught_decoy_as_a_failure():
    out = drk.Outcomes(correct=np.array([True, True]), measured_speedup=np.array([3.0, 1.0]),
                       true_speedup=np.ones(2), coverage=np.array([0.0, 0.0]),
                       hacked=np.array([True, False]))
    np.testing.assert_allclose(
        drk.prs_keep_probability(out, drk.RewardConfig(rejection=True)), [1.0, 0.0])
    # without the check the decoy is not caught, so PRS judges it by its coverage
    np.testing.assert_allclose(
        drk.prs_keep_probability(out, drk.RewardConfig(hack_check=False, rejection=True)),
        [0.0, 0.0])


def test_mask_first_baseline_matches_exhaustive_enumeration():
    """eq-drk-beta-first: the closed-form mean of the kept-only baseline, against brute force."""
    pi = np.array([0.5, 0.3, 0.2])
    reward = np.array([2.0, 3.0, -1.0])
    keep = np.array([0.1, 1.0, 0.6])
    arms = drk.ArmStatistics(reward, keep * reward, keep, np.zeros(3), np.zeros(3))
    for K in (2, 3, 4):
        exact = _enumerated_update(pi, reward, keep, K, mask_before_baseline=True)
        closed = drk.expected_update(pi, arms, mask_before_baseline=True, group_size=K)
        np.testing.assert_allclose(closed, exact, atol=1e-12)
    # with nothing masked, mask first is the released order
    plain = drk.ArmStatistics(reward, reward, np.ones(3), np.zeros(3), np.zeros(3))
    np.testing.assert_allclose(
        drk.expected_update(pi, plain, mask_before_baseline=True, group_size=5),
        drk.expected_update(pi, plain))
    with pytest.raises(ValueError, match="group size"):
        drk.expected_update(pi, arms, mask_before_baseline=True)


def test_mask_first_update_matches_monte_carlo():
    pi = np.array([0.6, 0.3, 0.1])
    mean, se, arms = _monte_carlo_update(pi, seed=11, mask_before_baseline=True)
    closed = drk.expected_update(pi, arms, mask_before_baseline=True, group_size=8)
    assert np.all(np.abs(mean - closed) < 4.5 * se + 2e-3)
    # and it differs from the released order's update at this policy
    assert np.abs(closed - drk.expected_update(pi, arms)).max() > 10 * se.max()


def test_success_mixture_and_fusion_basin():
    arms = drk.success_mixture([1.0, 0.5], [2.0, 3.0], [0.0, 3.0], [0.0, 1.0])
    np.testing.assert_allclose(arms.reward, [2.0, 1.5])
    np.testing.assert_allclose(arms.kept_reward, [0.0, 1.5])
    np.testing.assert_allclose(arms.keep_rate, [0.0, 1.0])
    # lazy: succeeds w.p. 0.9 with reward 2.3, always masked; fuse: 0.4 with 4.4, always kept
    arms = drk.success_mixture([0.9, 0.4], [2.3, 4.4], [0.0, 4.4], [0.0, 1.0])
    # released order: the gap drift is linear in the lazy mass and vanishes at one point
    beta_star = (arms.kept_reward[1] - arms.kept_reward[0]) / (arms.keep_rate[1]
                                                               - arms.keep_rate[0])
    lazy_star = (beta_star - arms.reward[1]) / (arms.reward[0] - arms.reward[1])
    assert 0.5 < lazy_star < 0.7
    # started just below the tipping point the flow reaches fusion, just above it turns lazy
    flows = {}
    for first in (False, True):
        for lz in (lazy_star - 0.05, lazy_star + 0.05):
            path = drk.mean_field_policy(arms, steps=400, lr=0.5, start=[lz, 1 - lz],
                                         mask_before_baseline=first, group_size=16)
            flows[first, lz > lazy_star] = path[-1, 1]
    assert flows[False, False] > 0.9 and flows[False, True] < 0.1
    # mask first: the kept lazy failures pull the baseline down, fusion gains from either start
    assert flows[True, False] > 0.9 and flows[True, True] > 0.9
    # no mask at all: the flow is gradient ascent on E_pi[r], lazy (2.07) beats fusion (1.76)
    plain = drk.success_mixture([0.9, 0.4], [2.3, 4.4], [2.3, 4.4], [1.0, 1.0])
    path = drk.mean_field_policy(plain, steps=400, lr=0.5)
    assert path[-1, 0] > 0.9 and np.all(np.diff(path[:, 0]) > 0)
    # a grid of environments moves at once, each as if alone
    grid = drk.success_mixture([[0.9, 0.4], [0.9, 0.9]], [2.3, 4.4], [0.0, 4.4], [0.0, 1.0])
    both = drk.mean_field_policy(grid, steps=50, lr=0.5)
    alone = drk.mean_field_policy(drk.success_mixture([0.9, 0.9], [2.3, 4.4], [0.0, 4.4],
                                                      [0.0, 1.0]), steps=50, lr=0.5)
    np.testing.assert_allclose(both[:, 1], alone, atol=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        drk.success_mixture([1.2, 0.5], 1.0, 1.0, 1.0)


def test_fuse_success_sets_the_fusion_rate_and_the_mixture_rebuilds_the_arms():
    from functools import partial

    rng = np.random.default_rng(12)
    out = drk.synthetic_outcomes(np.ones(200_000, dtype=int), rng, fuse_success=0.3)
    assert abs(out.correct.mean() - 0.3) < 0.005
    # the default is the E2 environment, draw for draw
    choice = np.random.default_rng(1).integers(0, 3, size=(50, 16))
    a = drk.synthetic_outcomes(choice, np.random.default_rng(2))
    b = drk.synthetic_outcomes(choice, np.random.default_rng(2), fuse_success=0.45)
    for field in ("correct", "measured_speedup", "true_speedup", "coverage", "hacked"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    # per-success statistics (fusion always correct) mixed at psi = the arms measured at psi
    cfg = drk.RewardConfig(**drk.CONFIGS["check + PR + PRS"])
    sure = drk.arm_statistics(partial(drk.synthetic_outcomes, fuse_success=1.0), cfg, rng,
                              draws=100_000)
    mixed = drk.success_mixture([1.0, 0.35, 1.0], sure.reward, sure.kept_reward, sure.keep_rate)
    direct = drk.arm_statistics(partial(drk.synthetic_outcomes, fuse_success=0.35), cfg, rng,
                                draws=100_000)
    np.testing.assert_allclose(mixed.reward, direct.reward, atol=5 * direct.reward_se.max())
    np.testing.assert_allclose(mixed.keep_rate, direct.keep_rate, atol=0.01)
    for bad, error in ((1.5, ValueError), (True, TypeError), ("0.4", TypeError)):
        with pytest.raises(error, match="fuse_success"):
            drk.synthetic_outcomes(choice, rng, fuse_success=bad)


def test_shared_toy_fixed_points_and_gradient():
    toy = drk.SharedParameterToy()
    theta = np.linspace(-2, 4, 7)
    h = 1e-6
    fd = (toy.objective(theta + h) - toy.objective(theta - h)) / (2 * h)
    np.testing.assert_allclose(toy.expected_update(theta, "trloo"), fd, rtol=1e-6, atol=1e-10)
    t_trloo, t_grpo = toy.fixed_point("trloo"), toy.fixed_point("grpo")
    assert toy.fixed_point("grpo_rescaled") == pytest.approx(t_trloo)
    assert t_grpo - t_trloo > 0.5  # late turns under-weighted: the optimum moves
    # between the two fixed points GRPO's expected update has the wrong sign
    mid = 0.5 * (t_trloo + t_grpo)
    assert toy.expected_update(mid, "grpo") > 0 > toy.expected_update(mid, "trloo")
    # the control: without early stopping every turn shrinks by 1 - 1/K and nothing moves
    flat = drk.SharedParameterToy(termination=(0.0, 0.0))
    assert flat.fixed_point("grpo") == pytest.approx(flat.fixed_point("trloo"), abs=1e-9)


def test_shared_toy_monte_carlo_matches_expected_update():
    toy = drk.SharedParameterToy()
    rng = np.random.default_rng(12)
    for method in drk.SHARED_METHODS:
        g = toy.gradient_estimates(np.full(20_000, 1.2), method, 5, rng)
        se = g.std(ddof=1) / np.sqrt(g.size)
        assert abs(g.mean() - toy.expected_update(1.2, method)) < 4.5 * se


def test_train_shared_reaches_each_fixed_point_and_rejects_bad_input():
    toy = drk.SharedParameterToy()
    for method in ("trloo", "grpo"):
        run = drk.train_shared(toy, method, replicates=8, steps=800, groups_per_step=8, lr=1.0,
                               rng=np.random.default_rng(13))
        assert run.path.shape == (801, 8)
        assert abs(run.average.mean() - toy.fixed_point(method)) < 0.15
    with pytest.raises(ValueError, match="method"):
        toy.expected_update(0.0, "ppo")
    with pytest.raises(ValueError, match="steps"):
        drk.train_shared(toy, "grpo", replicates=2, steps=0, groups_per_step=2, lr=1.0,
                         rng=np.random.default_rng(0))
    with pytest.raises(TypeError):
        drk.train_shared("toy", "grpo", replicates=2, steps=2, groups_per_step=2, lr=1.0,
                         rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="one weight and one offset"):
        drk.SharedParameterToy(weights=(1.0, -1.0), offsets=(0.0,))
    with pytest.raises(ValueError, match="at least 2"):
        drk.SharedParameterToy(group_size=1)
    with pytest.raises(ValueError, match="no interior fixed point"):
        drk.SharedParameterToy(weights=(1.0, 1.0, 1.0), offsets=(0.0, 0.0, 0.0)).fixed_point()


def test_rescaled_grpo_learning_curve_matches_trloo_in_expectation():
    proc = drk.RefinementProcess()
    curves = {m: np.mean([drk.train_refinement(proc, m, steps=60, groups_per_step=4, lr=3.0,
                                               rng=np.random.default_rng(s)) for s in range(6)],
                         0) for m in ("grpo", "grpo_rescaled", "trloo")}
    assert curves["grpo_rescaled"][60] > curves["grpo"][60]
    assert abs(curves["grpo_rescaled"][60] - curves["trloo"][60]) < 0.03


def test_sequential_scaling_stays_on_the_task_when_every_candidate_failed():
    def row(task, strategy, correct):
        return drk.Evaluation(task, f"{task}/{strategy}", strategy, correct, None, False, 1, 1,
                              0.9, 2.0 if correct else 0.0, 2.0 if correct else 0.0)

    # "a_fast" sorts first: a pick outside the episode's task would land on its fast candidates
    table = drk.GymTable(tuple(row(task, s, task == "a_fast") for task in ("a_fast", "z_broken")
                               for s in drk.STRATEGIES))
    res = drk.sequential_scaling(table, {"check": drk.RewardConfig()}, turns=4, episodes=300,
                                 rng=np.random.default_rng(3))
    # an episode is fast at every turn (task a_fast) or at none (task z_broken)
    np.testing.assert_array_equal(res.last, np.repeat(res.last[:, :1], 4, axis=1))
    assert 0.3 < res.last[:, 0].mean() < 0.7


def test_sequential_scaling_on_the_gym(table):
    configs = {"check": drk.RewardConfig(**drk.CONFIGS["check"]),
               "no check": drk.RewardConfig(**drk.CONFIGS["no check"])}
    res = drk.sequential_scaling(table, configs, turns=4, episodes=600,
                                 rng=np.random.default_rng(14))
    assert res.last.shape == (600, 4) and res.best["check"].shape == (600, 4)
    # one turn: selection has nothing to choose from
    np.testing.assert_array_equal(res.best["check"][:, 0], res.last[:, 0])
    # the checked selection never picks a slow candidate when a fast one was seen
    seen_fast = np.maximum.accumulate(res.last, axis=1)
    assert np.all(res.best["check"] <= seen_fast)
    assert res.best_rate("check")[-1] > res.last_rate()[-1]
    # a policy that only plays the decoy never yields a fast kernel
    decoy = drk.sequential_scaling(table, configs, turns=3, episodes=50, policy=(0, 0, 1),
                                   rng=np.random.default_rng(15))
    assert not decoy.last.any() and not decoy.best["no check"].any()
    with pytest.raises(ValueError, match="policy"):
        drk.sequential_scaling(table, configs, turns=2, episodes=5, policy=(0.5, 0.5),
                               rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="RewardConfig"):
        drk.sequential_scaling(table, {"x": 1}, turns=2, episodes=5,
                               rng=np.random.default_rng(0))
