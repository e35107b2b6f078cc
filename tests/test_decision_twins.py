"""Tests of icml26.decision_twins: gymnasium as the oracle for the pendulum, brute force for the
losses and metrics, closed forms for the counterexample, scikit-learn for FQE's regressions."""

import math

import gymnasium
import numpy as np
import pytest
import torch
from scipy import stats

from icml26 import decision_twins as dt


def _gym_env(seed):
    env = gymnasium.make("Pendulum-v1")
    env.reset(seed=seed)
    return env


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pendulum_matches_gymnasium_step_by_step(seed):
    """From gymnasium's state at every step, our step gives its next state, reward, observation.

    Gymnasium multiplies the float32 torque in float32 (NumPy 2 promotion rules), so agreement is
    to float32 rounding of that term, about 1e-8, not to float64 precision.
    """
    env = _gym_env(seed)
    rng = np.random.default_rng(seed)
    for _ in range(100):
        state = torch.tensor(np.array(env.unwrapped.state, dtype=np.float64))
        action = rng.uniform(-3.0, 3.0, size=1).astype(np.float32)  # also outside [-2, 2]
        obs, reward, *_ = env.step(action)
        nxt, ours = dt.pendulum_step(state, torch.tensor(float(action[0]), dtype=torch.float64))
        np.testing.assert_allclose(nxt.numpy(), env.unwrapped.state, rtol=0, atol=1e-6)
        assert abs(float(ours) - float(reward)) < 1e-6
        mine = np.array([math.cos(nxt[0]), math.sin(nxt[0]), float(nxt[1])], np.float32)
        np.testing.assert_allclose(mine, obs, atol=1e-6)


def test_vectorised_rollouts_match_gymnasium_policies():
    """Policy rollouts in batch equal gymnasium episodes run one at a time."""
    rng = np.random.default_rng(5)
    gains = dt.sample_gains(3, rng)
    starts = dt.reset_states(4, rng)
    horizon, gamma = 25, 0.97
    values = dt.true_values(gains, starts, horizon, gamma).numpy()
    for p in range(3):
        returns = []
        for b in range(4):
            env = _gym_env(0)
            env.unwrapped.state = starts[b].numpy().copy()
            total = 0.0
            for t in range(horizon):
                s = torch.tensor(env.unwrapped.state).reshape(1, 1, 2)
                u = dt.policy_torque(gains[p:p + 1], s).reshape(1).numpy()
                _, reward, *_ = env.step(u.astype(np.float32))
                total += gamma**t * reward
            returns.append(total)
        assert abs(values[p] - np.mean(returns)) < 1e-4 * max(1.0, abs(values[p]))


def test_offline_transitions_follow_the_dynamics():
    rng = np.random.default_rng(0)
    data = dt.collect_offline(dt.sample_gains(2, rng), 20, 10, 0.5, rng)
    assert data.size == 200
    nxt, reward = dt.pendulum_step(data.states, data.actions)
    torch.testing.assert_close(nxt, data.next_states)
    torch.testing.assert_close(reward, data.rewards)
    assert (data.states[:, 0].abs() <= math.pi).all()
    assert (data.actions.abs() <= dt.MAX_TORQUE).all()
    gentle = dt.collect_offline(dt.sample_gains(2, rng), 20, 10, 0.5, rng, 1.0, 0.5, 1.0)
    assert (gentle.actions.abs() <= 1.0).all() and gentle.actions.abs().max() > 0.9
    nxt, _ = dt.pendulum_step(gentle.states, gentle.actions, 1.0)
    torch.testing.assert_close(nxt, gentle.next_states)


class _TrueTwin(dt.BatchedTwin):
    """The real pendulum written as a twin: its rollout values must equal the truth."""

    def scaled_delta(self, state, torque):
        nxt, _ = dt.pendulum_step(state.double(), torque.double())
        return ((nxt - state.double()) / self.delta_scale.double()).float()


def test_twin_rollouts_of_the_true_dynamics_equal_true_values():
    rng = np.random.default_rng(1)
    gains, starts = dt.sample_gains(5, rng), dt.reset_states(16, rng)
    twin = _TrueTwin(2, torch.tensor([0.3, 0.7]))
    ours = dt.twin_values(twin, gains, starts, 20, 0.99)
    truth = dt.true_values(gains, starts, 20, 0.99).float()
    torch.testing.assert_close(ours, truth.expand(2, -1), rtol=1e-4, atol=1e-3)


def test_batched_models_are_independent():
    """Values and gradients of model m in a batch equal those of model m trained alone."""
    rng = np.random.default_rng(2)
    gains = dt.sample_gains(4, rng)
    starts = dt.reset_states(8, rng)
    scale = torch.tensor([0.2, 0.5])
    batch = dt.MLPTwin(3, scale, hidden=8, generator=torch.Generator().manual_seed(0))
    reference = torch.tensor([[3.0, 1.0, 2.0, 0.0]] * 3)
    loss = dt.ranking_loss(dt.twin_values(batch, gains, starts, 6, 0.99), reference, 1.0)
    loss.sum().backward()
    for m in range(3):
        alone = dt.MLPTwin(1, scale, hidden=8)
        with torch.no_grad():
            for p_alone, p_batch in zip(alone.parameters(), batch.parameters(), strict=True):
                p_alone.copy_(p_batch[m:m + 1])
        single = dt.ranking_loss(dt.twin_values(alone, gains, starts, 6, 0.99),
                                 reference[:1], 1.0)
        torch.testing.assert_close(single[0], loss[m])
        single.sum().backward()
        for p_alone, p_batch in zip(alone.parameters(), batch.parameters(), strict=True):
            torch.testing.assert_close(p_alone.grad[0], p_batch.grad[m], rtol=1e-4, atol=1e-6)


def test_least_squares_twin_is_the_mse_minimiser():
    rng = np.random.default_rng(3)
    data = dt.collect_offline(dt.sample_gains(3, rng), 30, 20, 1.0, rng)
    scale = (data.next_states - data.states).std(dim=0).float()
    twin = dt.LinearTwin(1, scale)
    transitions = (data.states[None], data.actions[None], data.next_states[None])
    twin.fit_least_squares(*transitions)
    X = dt.LinearTwin.features(data.states, data.actions).numpy()
    Y = ((data.next_states - data.states) / scale.double()).numpy()
    expected = np.linalg.lstsq(X, Y, rcond=None)[0]
    np.testing.assert_allclose(twin.weight[0].detach().numpy(), expected, atol=1e-4)
    dt.one_step_loss(twin, *transitions).sum().backward()
    assert twin.weight.grad.abs().max() < 1e-4


def test_ranking_loss_matches_a_loop_and_its_limits():
    gen = torch.Generator().manual_seed(0)
    pred, ref = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)
    tau = torch.tensor([0.5, 2.0])
    ours = dt.ranking_loss(pred, ref, tau)
    for m in range(2):
        terms = [math.log1p(math.exp(-(pred[m, i] - pred[m, j]) / tau[m]))
                 for i in range(6) for j in range(6) if ref[m, i] > ref[m, j]]
        assert abs(float(ours[m]) - np.mean(terms)) < 1e-5
    flat = dt.ranking_loss(torch.zeros(1, 6), ref[:1], 1.0)
    assert abs(float(flat) - math.log(2)) < 1e-6
    perfect = dt.ranking_loss(100 * ref[:1], ref[:1], 1.0)
    reversed_ = dt.ranking_loss(-100 * ref[:1], ref[:1], 1.0)
    assert float(perfect) < 1e-3 < float(reversed_)


def test_pairwise_accuracy_kendall_and_regret():
    rng = np.random.default_rng(4)
    for _ in range(20):
        true, pred = rng.normal(size=9), rng.normal(size=9)
        tau = dt.kendall_tau(pred, true)
        assert abs(dt.pairwise_accuracy(pred, true) - (tau + 1) / 2) < 1e-12  # no ties
        assert abs(tau - stats.kendalltau(pred, true).statistic) < 1e-12
        regret = dt.decision_regret(pred, true)
        assert regret == true.max() - true[np.argmax(pred)] and regret >= 0
    assert dt.decision_regret(true, true) == 0 and dt.pairwise_accuracy(true, true) == 1
    assert dt.pairwise_accuracy(-true, true) == 0


def test_fqe_bellman_iterations_match_scikit_learn_ridge():
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(6)
    data = dt.collect_offline(dt.sample_gains(3, rng), 40, 20, 1.0, rng)
    gains = dt.sample_gains(2, rng)
    ours = dt.fitted_q_evaluation(data, gains, 4, 0.9, n_features=30,
                                  rng=np.random.default_rng(7))
    features = dt.FourierFeatures(30, 0.5, np.random.default_rng(7))
    phi = features(data.states, data.actions).numpy()
    gram_mean = float((phi**2).sum(axis=0).mean())
    for p in range(2):
        k = gains[p:p + 1]
        nxt = features(data.next_states, dt.policy_torque(k, data.next_states[None])[0]).numpy()
        start = features(data.starts, dt.policy_torque(k, data.starts[None])[0]).numpy()
        model = None
        for _ in range(4):
            cont = 0.0 if model is None else model.predict(nxt)
            model = Ridge(alpha=1e-3 * gram_mean, fit_intercept=False)
            model.fit(phi, data.rewards.numpy() + 0.9 * cont)
        assert abs(model.predict(start).mean() - float(ours[p])) < 1e-6 * max(1, abs(ours[p]))


def test_fqe_ranks_well_covered_policies():
    taus = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        gains = dt.sample_gains(8, rng)
        data = dt.collect_offline(dt.sample_gains(3, rng), 100, 50, 1.0, rng)
        truth = dt.true_values(gains, dt.reset_states(512, rng), 30, 0.99)
        fqe = dt.fitted_q_evaluation(data, gains, 30, 0.99, n_features=100, rng=rng)
        taus.append(dt.kendall_tau(fqe, truth))
    assert np.mean(taus) > 0.5


def test_counterexample_closed_forms():
    ce = dt.Counterexample()
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, 400_000)
    for theta in (0.0, 0.6, 1.0):
        mc = np.mean((a**3 - theta * a) ** 2)
        assert abs(mc - ce.one_step_mse(theta)) < 3e-3
    grid = np.linspace(0, 1.5, 15001)
    assert abs(grid[np.argmin(ce.one_step_mse(grid))] - ce.theta_mse) < 1e-3
    assert not ce.ranks_correctly(ce.theta_mse)
    assert ce.ranks_correctly(1.0)
    # correct order exactly for theta above 2 target / (action_a + action_b) (and theta < 0)
    boundary = 2 * ce.target / (ce.action_a + ce.action_b)
    assert ce.ranks_correctly(boundary + 1e-6) and not ce.ranks_correctly(boundary - 1e-6)
    assert ce.ranks_correctly(ce.dt2_theta(10.0)) and not ce.ranks_correctly(ce.dt2_theta(0.0))


def test_small_study_runs_and_is_reproducible():
    config = dt.Config(replicates=2, n_train=4, n_unseen=3, episodes=10, steps=10,
                       heldout_episodes=5, horizon=5, truth_starts=32, fqe_features=20,
                       linear_weights=(0.0, 1.0), linear_steps=3,
                       mlp_pretrain=3, mlp_steps=3, hidden=4, n_starts=4)
    first, second = dt.run_study(3, config), dt.run_study(3, config)
    assert len(first.metrics) == 7  # linear MSE, DT², oracle; control MSE, oracle; MLP MSE, DT²
    for variant, metrics in first.metrics.items():
        for name, values in metrics.items():
            assert values.shape == (2,)
            again = second.metrics[variant][name]
            if (variant.setting, variant.twin, variant.weight, name) == (
                    "control", "linear", 0.0, "heldout_mse"):
                # the control's least-squares twin is exact: its held-out error is float32
                # rounding (about 5e-5), whose digits can change between two runs on one machine
                # (BLAS blocking depends on memory alignment), so it is checked to be rounding-sized
                assert values.max() < 1e-3 and again.max() < 1e-3
                continue
            np.testing.assert_allclose(values, again, rtol=1e-5, atol=1e-7)


def test_actuator_is_gymnasium_at_zero_and_cubic_at_one():
    u = torch.linspace(-3.0, 3.0, 61, dtype=torch.float64)
    clipped = u.clamp(-dt.MAX_TORQUE, dt.MAX_TORQUE)
    torch.testing.assert_close(dt.actuator(u, 0.0), clipped)
    torch.testing.assert_close(dt.actuator(u, 1.0), 2 * (clipped / 2) ** 3)
    torch.testing.assert_close(dt.actuator(u, 0.5), 0.5 * clipped + (clipped / 2) ** 3)
    state = dt.reset_states(5, np.random.default_rng(0))
    torque = torch.full((5,), 0.5, dtype=torch.float64)
    weak, _ = dt.pendulum_step(state, torque, 1.0)
    full, _ = dt.pendulum_step(state, torque, 0.0)
    # with the cubic actuator a command u = 0.5 delivers 2 (1/4)^3 = 1/32, a sixteenth of it
    free, _ = dt.pendulum_step(state, torch.zeros(5, dtype=torch.float64), 0.0)
    ratio = (weak[:, 1] - free[:, 1]) / (full[:, 1] - free[:, 1])
    torch.testing.assert_close(ratio, torch.full((5,), 0.0625, dtype=torch.float64))
    with pytest.raises(ValueError, match="cubic"):
        dt.actuator(u, 1.5)


def test_linear_twin_is_exact_for_the_linear_actuator():
    """The falsification control's premise: with cubic = 0 the least-squares linear twin equals
    the pendulum (away from the speed clip); with cubic = 1 it does not."""
    rng = np.random.default_rng(8)
    behaviour = dt.sample_gains(3, rng)
    errors = {}
    for cubic in (0.0, 1.0):
        data = dt.collect_offline(behaviour, 30, 20, 0.5, np.random.default_rng(9), cubic, 0.5)
        scale = (data.next_states - data.states).std(dim=0).float()
        twin = dt.LinearTwin(1, scale)
        transitions = (data.states[None], data.actions[None], data.next_states[None])
        twin.fit_least_squares(*transitions)
        errors[cubic] = float(dt.one_step_loss(twin, *transitions))
    assert errors[0.0] < 1e-3 < errors[1.0]


def test_bad_input_raises_clear_errors():
    rng = np.random.default_rng(0)
    data = dt.collect_offline(dt.sample_gains(2, rng), 5, 5, 0.5, rng)
    empty = torch.zeros(0, 3, dtype=torch.float64)
    starts = dt.reset_states(4, rng)
    twin = dt.LinearTwin(1, torch.ones(2))
    with pytest.raises(ValueError, match="empty"):
        dt.true_values(empty, starts, 5, 0.99)
    with pytest.raises(ValueError, match="empty"):
        dt.twin_values(twin, empty, starts, 5, 0.99)
    with pytest.raises(ValueError, match="empty"):
        dt.fitted_q_evaluation(data, empty, 5, 0.99)
    with pytest.raises(ValueError, match="empty"):
        dt.decision_regret([], [])
    gains = dt.sample_gains(3, rng)
    for horizon in (0, -2):
        with pytest.raises(ValueError, match="horizon"):
            dt.true_values(gains, starts, horizon, 0.99)
        with pytest.raises(ValueError, match="horizon"):
            dt.twin_values(twin, gains, starts, horizon, 0.99)
    with pytest.raises(ValueError, match="horizon"):
        dt.Config(horizon=0)
    for command in (0.0, 2.5):
        with pytest.raises(ValueError, match="max_command"):
            dt.collect_offline(gains, 2, 2, 0.5, rng, max_command=command)
        with pytest.raises(ValueError, match="max_command"):
            dt.Config(max_command=command)
    for share in (-0.1, 1.5):
        with pytest.raises(ValueError, match="full_share"):
            dt.collect_offline(gains, 2, 2, 0.5, rng, full_share=share)
        with pytest.raises(ValueError, match="full_share"):
            dt.Config(full_share=share)
    bad = data.states.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        dt.OfflineData(bad, data.actions, data.rewards, data.next_states, data.starts)
    with pytest.raises(ValueError, match="NaN"):
        dt.train_dt2(twin, (bad[None], data.actions[None], data.next_states[None]), gains,
                     torch.zeros(1, 3), [1.0], starts[None], horizon=3, gamma=0.99, steps=1)
    with pytest.raises(ValueError, match="non-negative"):
        dt.train_dt2(twin, (data.states[None], data.actions[None], data.next_states[None]),
                     gains, torch.zeros(1, 3), [-0.5], starts[None], horizon=3, gamma=0.99,
                     steps=1)
    with pytest.raises(ValueError, match="non-negative"):
        dt.Config(linear_weights=(0.0, -1.0, 1.0))
    with pytest.raises(ValueError, match="non-negative"):
        dt.Counterexample().dt2_theta(-1.0)
    with pytest.raises(TypeError):
        dt.policy_torque([[1.0, 2.0, 3.0]], starts)


def test_full_share_mixes_full_range_commands_into_gentle_logging():
    """The mixture logs a share of full-range commands; without it every command is gentle."""
    gains = dt.sample_gains(3, np.random.default_rng(1))
    gentle = dt.collect_offline(gains, 20, 20, 0.5, np.random.default_rng(2), cubic=1.0,
                                explore=0.5, max_command=1.0)
    mixed = dt.collect_offline(gains, 20, 20, 0.5, np.random.default_rng(2), cubic=1.0,
                               explore=0.5, max_command=1.0, full_share=0.2)
    assert float(gentle.actions.abs().max()) <= 1.0
    share = float((mixed.actions.abs() > 1.0).double().mean())
    assert 0.05 < share < 0.2  # half of the full-range draws land outside [-1, 1]
