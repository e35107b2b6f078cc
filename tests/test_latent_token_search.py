"""Tests of icml26.latent_token_search: FSQ against the library, costs, bad input, road world."""

import math

import numpy as np
import pytest
import torch
import vector_quantize_pytorch as vqp

from icml26 import latent_token_search as lts


@pytest.fixture(scope="module")
def data():
    d = lts.generate_futures(3000, np.random.default_rng(0))
    return torch.tensor(d["positions"]), torch.tensor(d["speed"]), d["primitive"]


@pytest.fixture(scope="module")
def tokenizer(data):
    positions, speed, _ = data
    return lts.train_tokenizer(positions, speed, nested=True, steps=150, seed=0, hidden=64)


@pytest.mark.parametrize("levels", [(8, 5, 5), (7, 5, 5, 5), (8, 6)])
def test_fsq_matches_vector_quantize_pytorch(levels):
    torch.manual_seed(0)
    z = torch.randn(4000, len(levels)) * 2
    ours = lts.FSQ(levels)
    lib = vqp.FSQ(levels=list(levels))
    assert torch.allclose(ours(z), lib.quantize(z), atol=1e-6)
    assert torch.equal(ours.codes_to_indices(ours(z)), lib.codes_to_indices(lib.quantize(z)).long())
    codes = ours.all_codes()
    assert torch.allclose(codes, lib.indices_to_codes(torch.arange(ours.codebook_size)), atol=1e-6)
    assert torch.equal(ours.codes_to_indices(codes), torch.arange(ours.codebook_size))


def test_fsq_straight_through_gradient():
    fsq = lts.FSQ((8, 5, 5))
    z = torch.randn(50, 3, requires_grad=True)
    fsq(z).sum().backward()
    half_l = (torch.tensor([8.0, 5, 5]) - 1) * (1 + 1e-3) / 2
    offset = torch.tensor([0.5, 0, 0])
    shift = torch.atanh(offset / half_l)
    expected = (1 - torch.tanh(z.detach() + shift) ** 2) * half_l / torch.tensor([4.0, 2, 2])
    assert torch.allclose(z.grad, expected, atol=1e-5)


def test_generator_shapes_speeds_and_primitives(data):
    positions, speed, kind = data
    assert positions.shape == (3000, lts.HORIZON, 2)
    assert set(np.unique(kind)) == set(range(len(lts.PRIMITIVES)))
    # first step moves about speed * dt along +x
    assert torch.allclose(positions[:, 0, 0], speed * lts.DT, atol=0.2)
    # lane changes end on the correct side, braking ends slower than keeping lane
    assert positions[kind == 1, -1, 1].mean() > 2.0 and positions[kind == 2, -1, 1].mean() < -2.0
    dist = positions[:, -1, 0] / speed
    assert dist[kind == 4].mean() < dist[kind == 0].mean() < dist[kind == 3].mean()


def test_idm_free_road_and_stopping():
    assert lts.idm_acceleration(10.0, np.inf, 0.0, 10.0) == pytest.approx(0.0)
    assert lts.idm_acceleration(5.0, np.inf, 0.0, 10.0) > 0
    assert lts.idm_acceleration(10.0, 5.0, 5.0, 10.0) < -2.0


def test_bicycle_straight_and_circle():
    state = np.array([0.0, 0.0, 0.0, 10.0])
    assert np.allclose(lts.bicycle_step(state, 0.0, 0.0), [2.5, 0, 0, 10])
    # constant steering: heading rate v tan(delta) / L
    out = lts.bicycle_step(state, 0.0, 0.1)
    assert out[2] == pytest.approx(10 * math.tan(0.1) / lts.WHEELBASE * lts.DT)


def test_rollout_constant_curvature_is_a_circle():
    controls = torch.zeros(1, 400, 2)
    controls[..., 1] = 1.0  # curvature CURVATURE_SCALE
    p = lts.rollout(controls, 2.0)[0]  # small steps: Euler stays near the circle
    radius = 1 / lts.CURVATURE_SCALE
    centre = torch.tensor([0.0, radius])
    dist = (p - centre).norm(dim=-1)
    assert float(dist.std()) < 0.2 and abs(float(dist.mean()) - radius) < 0.5


def test_decode_masks_tokens_after_prefix(tokenizer, data):
    positions, speed, _ = data
    codes = tokenizer.encode(positions[:20], speed[:20])
    other = codes.clone()
    other[:, 2:] = -codes[:, 2:]
    with torch.no_grad():
        a = tokenizer.decode(codes, speed[:20], 2)
        b = tokenizer.decode(other, speed[:20], 2)
        c = tokenizer.decode(other, speed[:20], 3)
    assert torch.allclose(a, b)
    assert not torch.allclose(a, c)
    idx = tokenizer.fsq.codes_to_indices(codes[:, :2])
    with torch.no_grad():
        assert torch.allclose(tokenizer.decode_indices(idx, speed[:20]), a, atol=1e-5)


@pytest.mark.parametrize("prefix", [0, 7, -1])
def test_bad_prefix(tokenizer, prefix):
    with pytest.raises(ValueError, match="prefix length"):
        tokenizer.check_prefix(prefix)


def test_goal_inside_obstacle_rejected():
    with pytest.raises(ValueError, match="inside the obstacle"):
        lts.Scenario(speed=10.0, goal=(30.0, 0.5), obstacle=(30.0, 0.0))


def test_budget_smaller_than_one_beam_step(tokenizer):
    scenario = lts.make_scenarios(1, np.random.default_rng(1))[0]
    with pytest.raises(ValueError, match="smaller than one beam step"):
        lts.beam_search(tokenizer, scenario, budget=199)
    with pytest.raises(ValueError, match="width-1 beam"):
        lts.beam_search(tokenizer, scenario, budget=1000)


def test_beam_search_spends_its_stated_cost(tokenizer):
    scenario = lts.make_scenarios(1, np.random.default_rng(2))[0]
    budget = lts.beam_cost(6, 200, 2) + 150
    plan = lts.beam_search(tokenizer, scenario, budget)
    assert plan.evaluations == lts.beam_cost(6, 200, 2) <= budget
    assert plan.positions.shape == (lts.HORIZON, 2)


def test_beam_width_one_is_exhaustive_coordinate_greedy(tokenizer):
    """Width-1 beam equals a brute-force greedy loop over codes, one position at a time."""
    scenario = lts.make_scenarios(1, np.random.default_rng(3))[0]
    plan = lts.beam_search(tokenizer, scenario, lts.beam_cost(6, 200, 1))
    prefix = torch.zeros(0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(6):
            costs = [float(lts.task_cost(tokenizer.decode_indices(
                torch.cat([prefix, torch.tensor([c])])[None], scenario.speed), scenario)[0])
                for c in range(200)]
            prefix = torch.cat([prefix, torch.tensor([int(np.argmin(costs))])])
    assert plan.cost == pytest.approx(min(costs), rel=1e-5)


def test_task_cost_terms():
    scenario = lts.Scenario(speed=10.0, goal=(40.0, 3.5), obstacle=(20.0, 0.0), radius=2.5)
    t = torch.arange(1, lts.HORIZON + 1) * lts.DT
    straight = torch.stack([10 * t, torch.zeros_like(t)], -1)[None]
    # constant velocity: zero jerk; the goal term is the squared distance over GOAL_SCALE^2
    goal_term = ((40.0 - 40.0) ** 2 + 3.5**2) / lts.GOAL_SCALE**2
    dist = (straight[0] - torch.tensor([20.0, 0.0])).norm(dim=-1)
    coll = float((2.5 - dist).clamp_min(0).pow(2).sum())
    expected = goal_term + 10 * coll
    assert float(lts.task_cost(straight, scenario)) == pytest.approx(expected, rel=1e-5)
    assert float(lts.jerk(straight, 10.0).abs().max()) < 1e-3


def test_waypoints_and_cem_respect_budget(data):
    positions, speed, _ = data
    vae = lts.train_tokenizer(positions, speed, nested=False, steps=30, seed=0,
                              model=lts.TrajectoryVAE(positions, speed, hidden=32))
    scenario = lts.make_scenarios(1, np.random.default_rng(4))[0]
    gen = torch.Generator().manual_seed(0)
    assert lts.cem_vae(vae, scenario, 1000, gen).evaluations == 1000
    plan = lts.optimise_waypoints(scenario, 400, gen)
    assert plan.evaluations == 400
    start = lts.optimise_waypoints(scenario, 8, torch.Generator().manual_seed(0))
    assert plan.cost < start.cost


def test_prefix_error_decreases_with_nested_dropout(tokenizer, data):
    positions, speed, _ = data
    errs = [float(tokenizer.prefix_mse(positions[:1000], speed[:1000], k).mean())
            for k in range(1, 7)]
    assert errs[-1] < errs[1] < errs[0]


def test_closed_loop_runs_and_follows_plan():
    scenario = lts.make_scenarios(1, np.random.default_rng(5))[0]

    def planner(local):
        return lts.optimise_waypoints(local, 800, torch.Generator().manual_seed(0))

    out = lts.closed_loop(planner, scenario.speed, scenario.goal, scenario.obstacle)
    assert out["path"].shape == (lts.HORIZON, 2)
    assert out["agent"].shape == (lts.HORIZON, 2)
    with pytest.raises(ValueError, match="divide"):
        lts.closed_loop(planner, 10.0, (40.0, 3.5), (20.0, 0.0), replan_every=5)


@pytest.mark.parametrize("n_tokens,codebook", [(6, 200), (3, 25), (1, 10)])
def test_beam_width_for_is_the_widest_affordable_beam(n_tokens, codebook):
    """Brute force: the widest B with beam_cost(K, C, B) <= budget, for every budget in a range."""
    for budget in range(max(codebook, codebook * n_tokens), codebook * n_tokens * 6, 7):
        width = lts.beam_width_for(budget, n_tokens, codebook)
        assert lts.beam_cost(n_tokens, codebook, width) <= budget
        if n_tokens > 1:
            assert lts.beam_cost(n_tokens, codebook, width + 1) > budget


def test_token_prior_nll_and_sampling(tokenizer, data):
    positions, speed, _ = data
    prior = lts.TokenPrior(tokenizer, positions, speed)
    assert torch.allclose(prior.log_prob.exp().sum(1), torch.ones(tokenizer.n_tokens))
    idx = torch.tensor([[3, 7, 0], [199, 1, 5]])
    brute = torch.tensor([-sum(float(prior.log_prob[k, int(i)]) for k, i in enumerate(row))
                          for row in idx])
    assert torch.allclose(prior.nll(idx), brute)
    # sampled frequencies of the first position match the prior (many draws, 5 s.e. band)
    draws = prior.sample(40_000, torch.Generator().manual_seed(0))[:, 0]
    freq = torch.bincount(draws, minlength=200).float() / len(draws)
    p = prior.log_prob[0].exp()
    assert float(((freq - p).abs() - 5 * (p * (1 - p) / len(draws)).sqrt()).max()) < 0


def test_best_of_n_is_the_argmin_of_its_samples(tokenizer, data):
    positions, speed, _ = data
    prior = lts.TokenPrior(tokenizer, positions, speed)
    scenario = lts.make_scenarios(1, np.random.default_rng(6))[0]
    plan = lts.best_of_n(tokenizer, scenario, 300, prior, torch.Generator().manual_seed(3), 0.05)
    idx = prior.sample(300, torch.Generator().manual_seed(3))
    with torch.no_grad():
        plans = tokenizer.decode_indices(idx, scenario.speed)
        score = lts.task_cost(plans, scenario) + 0.05 * prior.nll(idx)
    assert plan.evaluations == 300
    assert torch.allclose(plan.positions, plans[score.argmin()])


def test_cem_and_waypoints_reject_small_budgets(data):
    positions, speed, _ = data
    vae = lts.TrajectoryVAE(positions, speed, hidden=16)
    scenario = lts.make_scenarios(1, np.random.default_rng(8))[0]
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="CEM population"):
        lts.cem_vae(vae, scenario, 199, gen)
    with pytest.raises(ValueError, match="restarts"):
        lts.optimise_waypoints(scenario, 7, gen)
    with pytest.raises(TypeError, match="integer"):
        lts.beam_width_for(1000.5, 6, 200)


@pytest.fixture(scope="module")
def joint(tokenizer, data):
    positions, speed, _ = data
    return lts.JointPrior(tokenizer, positions[:1500], speed[:1500])


def test_joint_prior_conditional_matches_brute_force_counts(joint, tokenizer, data):
    positions, speed, _ = data
    with torch.no_grad():
        raw = tokenizer.fsq.codes_to_indices(tokenizer.encode(positions[:1500], speed[:1500]))
    raw = raw.numpy()
    prefix = raw[:3, :2]
    probs = joint.conditional(prefix)
    for row, p in zip(prefix, probs, strict=True):
        match = raw[(raw[:, :2] == row).all(1)]
        counts = np.bincount(match[:, 2], minlength=joint.size)
        expected = (counts + joint.marginal[2]) / (len(match) + 1.0)
        assert np.allclose(p, expected)
        assert p.sum() == pytest.approx(1.0)
    # the chain of conditionals gives the log-probability of a full tuple
    tup = raw[:2]
    chain = sum(np.log(joint.conditional(tup[:, :k])[np.arange(2), tup[:, k]])
                for k in range(1, tokenizer.n_tokens))
    first = np.log((np.bincount(raw[:, 0], minlength=joint.size)[tup[:, 0]]
                    + joint.marginal[0, tup[:, 0]]) / (len(raw) + 1.0))
    assert np.allclose(joint.log_prob(tup), chain + first)


def test_joint_prior_completion_keeps_prefix_and_reversed_order(joint, tokenizer, data):
    positions, speed, _ = data
    rng = np.random.default_rng(0)
    prefixes = joint.tuples[[0, 10, 100], :3]
    full = joint.complete(prefixes, rng)
    assert np.array_equal(full[:, :3], prefixes)
    rows = {tuple(r) for r in joint.tuples}
    assert all(tuple(r) in rows for r in full)  # completed from tuples that share the prefix
    rev = lts.JointPrior(tokenizer, positions[:1500], speed[:1500], order=[5, 4, 3, 2, 1, 0])
    assert np.array_equal(rev.to_positions(rev.tuples[:, ::-1][:, ::-1]),
                          rev.to_positions(rev.tuples))
    assert np.array_equal(np.sort(rev.to_positions(rev.tuples), 0), np.sort(joint.tuples, 0))
    with pytest.raises(ValueError, match="permutation"):
        lts.JointPrior(tokenizer, positions[:10], speed[:10], order=[0, 0, 1, 2, 3, 4])


def test_decode_known_agrees_with_prefix_decode(tokenizer, data):
    positions, speed, _ = data
    with torch.no_grad():
        idx = tokenizer.fsq.codes_to_indices(tokenizer.encode(positions[:10], speed[:10]))
        known = torch.zeros_like(idx, dtype=torch.bool)
        known[:, :3] = True
        a = tokenizer.decode_known(idx, known, speed[:10])
        b = tokenizer.decode_indices(idx[:, :3], speed[:10])
    assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="shape"):
        tokenizer.decode_known(idx[:, :3], known[:, :3], speed[:10])


@pytest.mark.parametrize("score", ["mask", "complete"])
def test_token_beam_spends_its_cost_and_width_one_is_greedy(tokenizer, joint, score):
    scenario = lts.make_scenarios(1, np.random.default_rng(9))[0]

    def cost_fn(p):
        return lts.task_cost(p, scenario)

    plan = lts.token_beam(tokenizer, scenario.speed, cost_fn, joint, 3, 5, score=score,
                          rng=np.random.default_rng(0))
    assert plan.evaluations == lts.topm_cost(6, 5, 3) == 5 * (1 + 5 * 3) == plan.trace[-1][0]
    wide = lts.token_beam(tokenizer, scenario.speed, cost_fn, joint, 7, 2, score=score,
                          rng=np.random.default_rng(0))  # wider than M: 2 + 4 + 8 + 14 + 14 + 14
    assert wide.evaluations == lts.topm_cost(6, 2, 7) == 56
    assert plan.cost == pytest.approx(plan.trace[-1][1], rel=1e-5)
    if score == "mask":  # brute force: width 1 keeps the best of the top-M at each step
        greedy = lts.token_beam(tokenizer, scenario.speed, cost_fn, joint, 1, 4)
        prefix = np.zeros((1, 0), np.int64)
        with torch.no_grad():
            for _ in range(6):
                top = np.argsort(-joint.conditional(prefix)[0], kind="stable")[:4]
                costs = [float(cost_fn(tokenizer.decode_indices(
                    torch.tensor(np.append(prefix[0], c))[None], scenario.speed))[0])
                    for c in top]
                prefix = np.append(prefix[0], top[int(np.argmin(costs))])[None]
        assert greedy.cost == pytest.approx(min(costs), rel=1e-5)
    with pytest.raises(ValueError, match="rng"):
        lts.token_beam(tokenizer, scenario.speed, cost_fn, joint, 1, 4, score="complete")
    with pytest.raises(ValueError, match="width-1"):
        lts.topm_width_for(20, 6, 4)


@pytest.mark.parametrize("n_tokens,top_m", [(1, 4), (8, 4), (8, 8), (8, 16), (3, 2)])
def test_topm_width_for_is_the_widest_affordable_beam(n_tokens, top_m):
    for budget in (64, 232, 464, 800):
        if lts.topm_cost(n_tokens, top_m, 1) > budget:
            continue
        width = lts.topm_width_for(budget, n_tokens, top_m)
        assert lts.topm_cost(n_tokens, top_m, width) <= budget
        if n_tokens > 1 and width < top_m ** (n_tokens - 1):
            assert lts.topm_cost(n_tokens, top_m, width + 1) > budget


def test_cut_in_cost_and_success():
    c = lts.CutIn(ego_speed=10.0, start=(0.0, lts.LANE), speed=10.0)
    t = torch.arange(1, lts.HORIZON + 1) * lts.DT
    straight = torch.stack([10 * t, torch.zeros_like(t)], -1)[None]  # stays in its own lane
    goal = ((c.gap) ** 2 + lts.LANE**2) / lts.GOAL_SCALE**2
    assert float(c.cost(straight)) == pytest.approx(goal, rel=1e-4)
    assert not bool(c.success(straight)[0])
    # ending exactly at the target in the ego's lane, never closer than the radius
    ahead = torch.stack([10 * t + c.gap * t / t[-1], -lts.LANE * t / t[-1]], -1)[None]
    assert bool(c.success(ahead)[0])


def test_placebo_cost_is_deterministic_standard_normal_and_unpredictable():
    gen = torch.Generator().manual_seed(0)
    plans = torch.randn(4000, lts.HORIZON, 2, generator=gen) * 10
    cost = lts.placebo_cost(7)
    log_j = torch.log(cost(plans))
    assert torch.equal(cost(plans), cost(plans.clone()))  # the same plan, the same value
    assert abs(float(log_j.mean())) < 0.1 and abs(float(log_j.std()) - 1) < 0.1
    # plans a few centimetres apart, or another key, give unrelated values
    near = torch.log(cost(plans + 0.03 * torch.randn(plans.shape, generator=gen)))
    other = torch.log(lts.placebo_cost(8)(plans))
    for values in (near, other):
        assert abs(float(torch.corrcoef(torch.stack([log_j, values]))[0, 1])) < 0.1
    with pytest.raises(ValueError):
        lts.placebo_cost(-1)
