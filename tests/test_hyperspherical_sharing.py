"""Tests of icml26.hyperspherical_sharing: geoopt as the oracle for Riemannian steps, autograd and
torch's weight_norm for the radial/tangential identity, PettingZoo's own API test for the
environment wrapper, brute-force loops for the batched policy and the agreement statistics."""

import math

import geoopt
import numpy as np
import pytest
import torch

from icml26 import hyperspherical_sharing as hs


def test_hand_written_riemannian_sgd_equals_geoopt():
    gen = torch.Generator().manual_seed(0)
    u0 = hs.unit_rows(torch.randn(3, 5, 7, generator=gen))
    egrad = torch.randn(3, 5, 7, generator=gen)
    point = geoopt.ManifoldParameter(u0.clone(), manifold=geoopt.Sphere())
    opt = geoopt.optim.RiemannianSGD([point], lr=0.3)
    point.grad = egrad.clone()
    opt.step()
    ours = hs.riemannian_sgd_step(u0, egrad, 0.3)
    torch.testing.assert_close(ours, point.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(hs.tangent_project(u0, egrad),
                               geoopt.Sphere().egrad2rgrad(u0, egrad), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.linalg.vector_norm(ours, dim=-1), torch.ones(3, 5))


def test_riemannian_adam_keeps_rows_on_the_sphere_and_moves_tangentially():
    gen = torch.Generator().manual_seed(1)
    policy = hs.AgentPolicy("hps", 3, n_seeds=2, hidden=8, seed=0)
    opt = geoopt.optim.RiemannianAdam(policy.sphere_params, lr=0.05)
    obs = torch.randn(2, 3, 16, 2, generator=gen)
    for _ in range(5):
        opt.zero_grad()
        policy(obs).pow(2).sum().backward()
        opt.step()
    for p in policy.sphere_params:
        torch.testing.assert_close(torch.linalg.vector_norm(p.detach(), dim=-1),
                                   torch.ones(p.shape[:-1]), atol=1e-5, rtol=0)


def test_radial_part_is_the_scale_gradient_weight_norm():
    """Lemma eq-hps-polar: dL/d(rho) = <u, grad_w L>, checked with torch's weight_norm."""
    gen = torch.Generator().manual_seed(2)
    layer = torch.nn.Linear(6, 4)
    torch.nn.utils.parametrizations.weight_norm(layer, dim=0)
    x = torch.randn(32, 6, generator=gen)
    layer(x).tanh().sum().backward()
    g_scale = layer.parametrizations.weight.original0.grad.view(-1)
    w = layer.weight.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(x, w, layer.bias.detach()).tanh().sum().backward()
    r, tan = hs.decompose(w.detach(), w.grad)
    torch.testing.assert_close(r, g_scale, atol=1e-5, rtol=1e-5)
    # the direction gradient of weight_norm is (|w| / |v|) times the tangential part
    v = layer.parametrizations.weight.original1
    ratio = (torch.linalg.vector_norm(w.detach(), dim=1)
             / torch.linalg.vector_norm(v.detach(), dim=1)).unsqueeze(1)
    torch.testing.assert_close(v.grad, ratio * tan, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((tan * hs.unit_rows(w.detach())).sum(1), torch.zeros(4),
                               atol=1e-6, rtol=0)


def test_scaled_modes_start_as_the_same_function_and_nops_matches_separate_nets():
    obs = torch.randn(2, 4, 10, 2, generator=torch.Generator().manual_seed(3))
    ref = hs.AgentPolicy("fups", 4, n_seeds=2, hidden=16, seed=5)(obs)
    for method in ("hps", "scale_only", "sphere_only", "hps_adam", "mask", "hyper", "film_id"):
        torch.testing.assert_close(hs.AgentPolicy(method, 4, n_seeds=2, hidden=16, seed=5)(obs),
                                   ref, atol=1e-5, rtol=1e-5)
    nops = hs.AgentPolicy("nops", 4, n_seeds=2, hidden=16, seed=5)
    out = nops(obs)
    for s in range(2):
        for k in range(4):
            h = obs[s, k]
            for i, layer in enumerate(nops.layers):
                h = h @ layer.weight[s, k].T + layer.bias[s, k]
                h = torch.tanh(h) if i < len(nops.layers) - 1 else h
            torch.testing.assert_close(out[s, k], h, atol=1e-5, rtol=1e-5)


def test_parameter_counts_by_formula():
    n, hidden = 4, 32
    layers = [(2, hidden), (hidden, hidden), (hidden, 2)]
    base = sum(i * o + o for i, o in layers)
    outs = sum(o for _, o in layers)
    assert hs.AgentPolicy("fups", n, hidden=hidden).parameter_count() == base
    assert hs.AgentPolicy("nops", n, hidden=hidden).parameter_count() == n * base
    assert hs.AgentPolicy("fups_id", n, hidden=hidden).parameter_count() == base + n * hidden
    assert hs.AgentPolicy("hps", n, hidden=hidden).parameter_count() == base + n * outs
    assert hs.AgentPolicy("sphere_only", n, hidden=hidden).parameter_count() == base + outs
    assert hs.AgentPolicy("hps_adam", n, hidden=hidden).parameter_count() == base + n * outs
    assert hs.AgentPolicy("mask", n, hidden=hidden).parameter_count() == base + n * sum(
        i * o for i, o in layers)
    assert hs.AgentPolicy("film_id", n, hidden=hidden).parameter_count() == base + 2 * n * (
        2 * hidden)
    assert hs.AgentPolicy("hyper", n, hidden=hidden).parameter_count() == base + n * (
        hs.HYPER_EMBED) + hs.HYPER_EMBED * (hidden + 1) * 2


def test_seeds_in_one_batch_train_independently():
    """Seed 1 of a two-seed run equals seed 1 alone: the batched loop couples nothing."""
    gains = (0.5, 2.0)
    both = hs.AgentPolicy("hps", 2, n_seeds=2, hidden=8, seed=0)
    alone = hs.AgentPolicy("hps", 2, n_seeds=1, hidden=8, seed=0)
    with torch.no_grad():
        for a, b in zip(alone.parameters(), both.parameters(), strict=True):
            a.copy_(b[1:2])
    env = hs.GainReach(gains)
    g_both = hs.per_agent_gradients(both, env, 64, torch.Generator().manual_seed(0))
    env1 = hs.GainReach(gains)
    gen = torch.Generator().manual_seed(0)
    # replay the same random numbers for seed 1 only: draw the two-seed tensors and slice them
    obs = env1.reset(2, 64, gen)
    logps, rewards = [], []
    for _ in range(env1.horizon):
        mean = alone(obs[1:2])
        noise = torch.randn((2, *mean.shape[1:]), generator=gen)[1:2]
        action = (mean + 0.1 * noise).detach()
        logps.append(-((action - mean) ** 2).sum(-1) / (2 * 0.1**2))
        full = torch.cat([torch.zeros_like(action), action])
        obs, reward, _ = env1.step(full)
        rewards.append(reward[1:2])
    losses = hs.agent_losses(torch.stack(logps), torch.stack(rewards))
    for k in range(2):
        grads = torch.autograd.grad(losses[k], [layer.weight for layer in alone.layers],
                                    retain_graph=True)
        for i, g in enumerate(grads):
            torch.testing.assert_close(g[0, 0], g_both[i][k, 1], atol=1e-5, rtol=1e-4)


def test_oracle_scores_one_and_zero_policy_scores_zero():
    env = hs.GainReach(hs.CONFLICT_GAINS)
    gen = torch.Generator().manual_seed(4)
    env.reset(3, 50, gen)
    zero = -env.horizon * env.distances().mean(dim=(1, 2))
    total = torch.zeros(3)
    for _ in range(env.horizon):
        _, reward, _ = env.step(env.oracle_actions())
        total += reward.mean(-1)
    assert float(total.abs().max()) < 1e-5
    assert float(zero.max()) < 0

    class Zero(hs.AgentPolicy):
        def forward(self, obs, weights=None):
            return torch.zeros_like(obs)

    value = hs.normalised_return(Zero("fups", 4, n_seeds=3), env, 50, gen)
    torch.testing.assert_close(value, torch.zeros(3))


def test_pettingzoo_parallel_api():
    from pettingzoo.test import parallel_api_test

    env = hs.GainReachParallelEnv()
    parallel_api_test(env, num_cycles=20)
    obs, _ = env.reset(seed=7)
    for _ in range(env._core.horizon):
        gains = env._core.gains.numpy()
        actions = {a: obs[a] / gains[k] for k, a in enumerate(env.possible_agents)}
        obs, rewards, term, trunc, _ = env.step(actions)
    assert all(trunc.values()) and not any(term.values())
    assert abs(rewards["agent_0"]) < 1e-5 and len(set(rewards.values())) == 1


def test_agreement_statistics_against_loops():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(2, 3, 4, generator=gen)
    grads = torch.randn(3, 2, 3, 4, generator=gen)
    stats = hs.agreement(w, grads)
    for s in range(2):
        tan_vals, rad_vals = [], []
        for j in range(3):
            u = w[s, j] / w[s, j].norm()
            parts = [(float(u @ grads[k, s, j]), grads[k, s, j] - (u @ grads[k, s, j]) * u)
                     for k in range(3)]
            for a in range(3):
                for b in range(a + 1, 3):
                    tan_vals.append(float(torch.nn.functional.cosine_similarity(
                        parts[a][1], parts[b][1], dim=0)))
                    rad_vals.append(math.copysign(1, parts[a][0] * parts[b][0]))
        assert abs(stats.tan[s] - np.mean(tan_vals)) < 1e-5
        assert abs(stats.rad[s] - np.mean(rad_vals)) < 1e-5
    # identical gradients agree perfectly
    same = hs.agreement(w, grads[:1].expand(3, -1, -1, -1))
    np.testing.assert_allclose(same.tan, 1, atol=1e-5)
    np.testing.assert_allclose(same.c_rad, 1, atol=1e-5)


def test_hps_learns_scales_ordered_by_inverse_gain():
    result = hs.train("hps", hs.CONFLICT_GAINS, n_seeds=2, updates=60, batch=128, hidden=16,
                      eval_every=60, eval_batch=64)
    corr = hs.scale_gain_correlation(result.policy, hs.CONFLICT_GAINS)
    assert corr.min() > 0.5
    assert result.final.min() > 0.3


def test_bad_input():
    with pytest.raises(ValueError, match="at least 1"):
        hs.AgentPolicy("hps", 0)
    with pytest.raises(ValueError, match="at least one agent"):
        hs.GainReach([])
    with pytest.raises(ValueError, match="finite"):
        hs.GainReach([1.0, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        hs.GainReach([1.0, float("inf")])
    with pytest.raises(ValueError, match="positive"):
        hs.GainReach([1.0, -2.0])
    with pytest.raises(ValueError, match="unknown method"):
        hs.AgentPolicy("kaleidoscope", 2)
    policy = hs.AgentPolicy("hps", 2, n_seeds=1, hidden=4)
    with pytest.raises(ValueError, match="observation width"):
        policy(torch.zeros(1, 2, 5, 3))
    with pytest.raises(ValueError, match="shape"):
        policy(torch.zeros(1, 3, 5, 2))
    with pytest.raises(TypeError):
        hs.AgentPolicy("hps", 2.5)
    with pytest.raises(ValueError, match="no shared weights"):
        hs.per_agent_gradients(hs.AgentPolicy("nops", 2), hs.GainReach([1.0, 2.0]), 4,
                               torch.Generator())
    with pytest.raises(ValueError, match="variant"):
        hs.variant_gains("other")
    with pytest.raises(ValueError, match="eval_every"):
        hs.train("hps", (1.0, 2.0), eval_every=0)
    with pytest.raises(ValueError, match="sigma"):
        hs.train("hps", (1.0, 2.0), sigma=0.0)
    with pytest.raises(ValueError, match="updates"):
        hs.train("hps", (1.0, 2.0), updates=-1)


def test_precomputed_weights_give_the_same_actions():
    obs = torch.randn(2, 3, 5, 2, generator=torch.Generator().manual_seed(6))
    for method in hs.METHODS:
        policy = hs.AgentPolicy(method, 3, n_seeds=2, hidden=8, seed=1)
        torch.testing.assert_close(policy(obs, policy.effective_weights()), policy(obs),
                                   atol=0, rtol=0)
        with pytest.raises(ValueError, match="weight tensors"):
            policy(obs, policy.effective_weights()[:1])


def test_seed_adam_equals_torch_adam_and_geoopt_riemannian_adam():
    obs = torch.randn(3, 4, 10, 2, generator=torch.Generator().manual_seed(8))
    for method in ("hps", "fups", "film_id"):
        ours = hs.AgentPolicy(method, 4, n_seeds=3, hidden=8, seed=1)
        ref = hs.AgentPolicy(method, 4, n_seeds=3, hidden=8, seed=1)
        opt = hs.SeedAdam(ours, 0.01)
        refs = [torch.optim.Adam(ref.euclid_params, lr=0.01)] + [
            geoopt.optim.RiemannianAdam([p], lr=0.01 * math.sqrt(p.shape[-1]))
            for p in ref.sphere_params]
        for _ in range(5):
            for policy, opts in ((ours, [opt]), (ref, refs)):
                for o in opts:
                    o.zero_grad()
                policy(obs).pow(2).sum().backward()
                for o in opts:
                    o.step()
        for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_seed_adam_per_seed_rates_match_separate_runs():
    """A two-seed run with rates (a, b) equals seed-by-seed runs at a and at b."""
    obs = torch.randn(2, 3, 6, 2, generator=torch.Generator().manual_seed(9))
    both = hs.AgentPolicy("hps", 3, n_seeds=2, hidden=8, seed=2)
    singles = [hs.AgentPolicy("hps", 3, n_seeds=2, hidden=8, seed=2) for _ in range(2)]
    opts = [hs.SeedAdam(both, [0.01, 0.05])] + [
        hs.SeedAdam(p, lr) for p, lr in zip(singles, (0.01, 0.05), strict=True)]
    for _ in range(4):
        for policy, opt in zip([both, *singles], opts, strict=True):
            opt.zero_grad()
            policy(obs).pow(2).sum().backward()
            opt.step()
    for s, single in enumerate(singles):
        for a, b in zip(both.parameters(), single.parameters(), strict=True):
            torch.testing.assert_close(a[s], b[s], atol=1e-6, rtol=1e-5)


def test_hps_adam_rows_stay_on_the_sphere_and_gradients_are_tangential():
    policy = hs.AgentPolicy("hps_adam", 3, n_seeds=2, hidden=8, seed=0)
    obs = torch.randn(2, 3, 6, 2, generator=torch.Generator().manual_seed(10))
    policy(obs).pow(2).sum().backward()
    for p in policy.unit_params:
        torch.testing.assert_close((p.grad * p.detach()).sum(-1), torch.zeros(p.shape[:-1]),
                                   atol=1e-5, rtol=0)
    opt = hs.SeedAdam(policy, 0.05)
    opt.step()
    policy.renormalise()
    for p in policy.unit_params:
        torch.testing.assert_close(torch.linalg.vector_norm(p.detach(), dim=-1),
                                   torch.ones(p.shape[:-1]), atol=1e-6, rtol=0)


def test_rotation_and_embedding_variants_keep_the_oracle():
    for name in hs.VARIANTS:
        task = hs.variant(name, 4, gains=hs.CONFLICT_GAINS)
        env = hs.GainReach(task["gains"], angles=task["angles"], obs_dim=16, distractors=8)
        gen = torch.Generator().manual_seed(11)
        obs = env.reset(2, 20, gen)
        assert obs.shape == (2, 4, 20, 16)
        # the signal part is an isometric image of goal - pos
        torch.testing.assert_close(torch.linalg.vector_norm(obs[..., :8], dim=-1),
                                   env.distances(), atol=1e-5, rtol=1e-5)
        for _ in range(env.horizon):
            _, reward, _ = env.step(env.oracle_actions())
        assert float(reward.abs().max()) < 1e-5
    rot = hs.variant("rotation", 4)
    assert rot["gains"] == (1.0,) * 4 and len(rot["angles"]) == 4
    # a rotated agent moved by the unrotated action ends up elsewhere
    env = hs.GainReach((1.0,), angles=(math.pi / 2,))
    env.reset(1, 1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(env.moves(torch.tensor([[[[1.0, 0.0]]]])),
                               torch.tensor([[[[0.0, 1.0]]]]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="angles"):
        hs.GainReach((1.0, 1.0), angles=(0.0,))
    with pytest.raises(ValueError, match="signal"):
        hs.GainReach((1.0,), obs_dim=3, distractors=2)
    with pytest.raises(ValueError, match="variant"):
        hs.variant("other")


def test_split_half_agreement_against_loops():
    gen = torch.Generator().manual_seed(12)
    weights = [torch.randn(2, 3, 4, generator=gen), torch.randn(2, 2, 3, generator=gen)]
    first = [torch.randn(3, 2, 3, 4, generator=gen), torch.randn(3, 2, 2, 3, generator=gen)]
    second = [torch.randn(3, 2, 3, 4, generator=gen), torch.randn(3, 2, 2, 3, generator=gen)]
    stats = hs.split_half_agreement(weights, first, second)

    def parts(grads, k, s):
        rads, tans = [], []
        for w, g in zip(weights, grads, strict=True):
            for j in range(w.shape[1]):
                u = w[s, j] / w[s, j].norm()
                r = float(u @ g[k, s, j])
                rads.append(r)
                tans.append(g[k, s, j] - r * u)
        return torch.tensor(rads), torch.cat(tans)

    cos = torch.nn.functional.cosine_similarity
    for s in range(2):
        a = [parts(first, k, s) for k in range(3)]
        b = [parts(second, k, s) for k in range(3)]
        for i, name in ((1, "tan"), (0, "rad")):
            between = np.mean([float(cos(a[k][i], b[m][i], dim=0))
                               for k in range(3) for m in range(3) if k != m])
            within = np.mean([float(cos(a[k][i], b[k][i], dim=0)) for k in range(3)])
            assert abs(getattr(stats, f"{name}_between")[s] - between) < 1e-5
            assert abs(getattr(stats, f"{name}_within")[s] - within) < 1e-5
    same = hs.split_half_agreement(weights, first, first)
    np.testing.assert_allclose(same.tan_within, 1, atol=1e-5)


def test_calibrated_ggda_and_select_lr_run():
    out = hs.calibrated_ggda(hs.CONFLICT_GAINS, n_seeds=2, checkpoints=(0, 2), batch=16,
                             ggda_batch=64, hidden=8)
    assert set(out) == {0, 2} and out[2].tan.shape == (2,)
    lr, means = hs.select_lr("hps", (1.0, 2.0), (1e-3, 1e-2), n_seeds=1, updates=3, batch=8,
                             hidden=4, eval_every=3, eval_batch=8)
    assert lr in (1e-3, 1e-2) and means.shape == (2,)
    assert hs.select_lr("hps", (1.0, 2.0), (3e-3,))[0] == 3e-3


def _spread_against_mpe2(scales, seed, crowd):
    """Run mpe2's simple_spread_v3 and our Spread side by side (float64) for one episode."""
    env = hs.mpe2_spread(scales)
    obs, _ = env.reset(seed=seed)
    world = env.unwrapped.world
    if crowd:  # start the agents overlapping, so that contact forces and penalties act
        for k, agent in enumerate(world.agents):
            agent.state.p_pos = np.array([0.1 * k, 0.05 * k])
        obs = {a: env.unwrapped.observe(a) for a in env.agents}
    pos = torch.tensor(np.array([a.state.p_pos for a in world.agents])).view(1, -1, 1, 2)
    marks = torch.tensor(np.array([m.state.p_pos for m in world.landmarks])).view(1, -1, 1, 2)
    ours = hs.Spread(scales, dtype=torch.float64)
    o = ours.set_state(pos, marks)
    np.testing.assert_allclose(o[0, :, 0].numpy(), np.stack([obs[a] for a in env.agents]),
                               atol=1e-6)
    rng = np.random.default_rng(seed)
    collisions, steps = 0.0, 0
    while env.agents:
        act = rng.normal(0.0, 1.0, (len(scales), 2)).astype(np.float32)
        if crowd and steps < 5:
            act[:] = -np.sign(np.array([a.state.p_pos for a in world.agents]))  # huddle
        obs, rew, _, trunc, _ = env.step({a: hs.mpe2_action(act[k])
                                          for k, a in enumerate(env.agents)})
        o, r, done = ours.step(torch.tensor(act, dtype=torch.float64).view(1, -1, 1, 2))
        names = list(obs)
        np.testing.assert_allclose(o[0, :, 0].numpy(), np.stack([obs[a] for a in names]),
                                   atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(r[0, :, 0].numpy(), np.array([rew[a] for a in names]),
                                   atol=1e-9)
        dist = torch.linalg.vector_norm(ours.landmarks.unsqueeze(1) - ours.pos.unsqueeze(2), dim=-1)
        coverage = -dist.min(dim=1).values.sum(1)[0, 0]
        collisions += float((0.5 * coverage - r[0, :, 0]).sum() / 0.5)   # penalties this step
        steps += 1
        assert done == all(trunc.values())
    assert steps == ours.horizon == 25
    return collisions


@pytest.mark.parametrize("scales", [(1.0, 1.0, 1.0), (0.25, 1.0, 4.0)])
@pytest.mark.parametrize("crowd", [False, True])
def test_spread_matches_mpe2_step_by_step(scales, crowd):
    pytest.importorskip("mpe2")
    collisions = sum(_spread_against_mpe2(scales, seed, crowd) for seed in (0, 1))
    if crowd:
        assert collisions >= 2     # the contact forces and penalties were exercised


def test_spread_collisions_and_rewards_by_hand():
    env = hs.Spread((1.0, 2.0, 1.0))
    pos = torch.tensor([[0.0, 0.0], [0.2, 0.0], [1.0, 1.0]]).view(1, 3, 1, 2)
    marks = torch.tensor([[0.0, 0.0], [1.0, 1.0], [-1.0, 0.0]]).view(1, 3, 1, 2)
    obs = env.set_state(pos, marks)
    assert obs.shape == (1, 3, 1, env.obs_dim) and env.obs_dim == 18
    # agents 0 and 1 overlap (0.2 < 0.3): each loses 1; coverage: 0 + 0 + 1
    torch.testing.assert_close(env.rewards()[0, :, 0],
                               0.5 * torch.tensor(-1.0) + 0.5 * torch.tensor([-1.0, -1.0, 0.0]))
    # agent 2 (no contact) with action (1, -3): clipped to (1, -1), force 5 * (1, -1)
    act = torch.zeros(1, 3, 1, 2)
    act[0, 2, 0] = torch.tensor([1.0, -3.0])
    env.step(act)
    torch.testing.assert_close(env.vel[0, 2, 0], torch.tensor([0.5, -0.5]))
    torch.testing.assert_close(env.pos[0, 2, 0], torch.tensor([1.0, 1.0]))  # old velocity 0
    assert env.vel[0, 0, 0, 0] < 0 < env.vel[0, 1, 0, 0]                  # pushed apart
    with pytest.raises(ValueError, match="at least two"):
        hs.Spread((1.0,))


def test_per_agent_rewards_equal_team_rewards_when_identical():
    gen = torch.Generator().manual_seed(0)
    logps = torch.randn(5, 2, 3, 7, generator=gen)
    team = torch.randn(5, 2, 7, generator=gen)
    torch.testing.assert_close(hs.agent_losses(logps, team),
                               hs.agent_losses(logps, team.unsqueeze(2).expand(5, 2, 3, 7)))


def test_calibrated_ggda_on_spread_records_returns():
    out = hs.calibrated_ggda(env=hs.Spread((0.25, 1.0, 4.0), horizon=5), n_seeds=2, seed=0,
                             checkpoints=(0, 1), batch=4, ggda_batch=8, hidden=4, sigma=0.3)
    assert set(out) == {0, 1}
    for st in out.values():
        assert st.episode_return.shape == st.tan_between.shape == (2,)
        assert np.all(st.episode_return < 0)
    with pytest.raises(ValueError, match="either gains or env"):
        hs.calibrated_ggda((1.0, 2.0), env=hs.Spread())


@pytest.mark.parametrize("task", ["gainreach", "spread"])
def test_calibrated_ggda_one_backward_pass_equals_one_per_agent(task):
    kwargs = (dict(gains=hs.CONFLICT_GAINS) if task == "gainreach"
              else dict(env=hs.Spread((0.25, 1.0, 4.0), horizon=6)))
    runs = [hs.calibrated_ggda(**kwargs, n_seeds=3, seed=1, checkpoints=(0, 2), batch=8,
                               ggda_batch=32, hidden=8, one_pass=one_pass)
            for one_pass in (True, False)]
    for update in (0, 2):
        for name in ("tan_between", "tan_within", "rad_between", "rad_within", "episode_return"):
            np.testing.assert_allclose(getattr(runs[0][update], name),
                                       getattr(runs[1][update], name), atol=1e-4, rtol=1e-4)
