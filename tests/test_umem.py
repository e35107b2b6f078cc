"""Tests for the UMEM chapter: the neighbourhood lemma, retrieval and neighbourhoods against brute
force and scikit-learn, the fast candidate reward against a brute-force bank copy, the closed-form
expected reward against a scalar loop and against Monte Carlo, GRPO's advantages, clipping and KL
estimator, the ablation masks, the management statistics, the learned executor (stacked training
against one-at-a-time, its NumPy form against the torch model, its candidate reward against a
brute-force bank copy, and an executor that ignores memories), and bad input."""

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

import icml26.umem as um


@pytest.fixture(scope="module")
def world():
    return um.make_world(n_families=4, n_heldout_families=1, queries_per_family=20, seed=3)


def test_world_is_well_formed(world):
    assert np.allclose(np.linalg.norm(world.embeddings, axis=1), 1)
    assert np.allclose(np.linalg.norm(world.rules, axis=1), 1)
    assert not set(world.train) & set(world.test)
    assert set(world.family[world.ood]) == {4}
    assert set(world.family[world.train]) == set(world.family[world.test]) == {0, 1, 2, 3}
    # within-family cosines are larger than between-family ones on average
    sims = world.embeddings @ world.embeddings.T
    same = world.family[:, None] == world.family[None, :]
    assert sims[same & ~np.eye(len(sims), dtype=bool)].mean() > sims[~same].mean() + 0.3


def test_neighbourhood_matches_sklearn(world):
    pool = world.train
    ours = um.semantic_neighbourhood(world.embeddings, pool, 3)
    nn = NearestNeighbors(n_neighbors=4, metric="cosine").fit(world.embeddings[pool])
    _, idx = nn.kneighbors(world.embeddings[pool])
    for row, q in enumerate(pool):
        theirs = [pool[j] for j in idx[row] if pool[j] != q][:3]
        assert set(ours[row]) == set(theirs)
        assert q not in ours[row]


def test_lemma_holds_and_is_tight():
    rng = np.random.default_rng(0)
    for dim in (2, 5, 16):
        for _ in range(200):
            e1, e2 = (v / np.linalg.norm(v) for v in rng.normal(size=(2, dim)))
            keys = rng.normal(size=(20, dim))
            keys /= np.linalg.norm(keys, axis=1, keepdims=True)
            gap, bound = um.lemma_gap(e1, e2, keys)
            assert np.all(gap <= bound + 1e-12)
            np.testing.assert_allclose(bound, np.linalg.norm(e1 - e2), rtol=1e-10)
            tight, _ = um.lemma_gap(e1, e2, (e1 - e2) / np.linalg.norm(e1 - e2))
            np.testing.assert_allclose(tight[0], bound, rtol=1e-9)


def test_lemma_rejects_non_unit_vectors():
    with pytest.raises(ValueError, match="unit"):
        um.lemma_gap(np.array([2.0, 0]), np.array([1.0, 0]), np.eye(2))
    with pytest.raises(ValueError, match="shapes"):
        um.lemma_gap(np.array([1.0, 0]), np.array([1.0, 0]), np.eye(3))


def _random_bank(world, rng, size, exclude=-1, limit=None):
    """A bank of distinct source queries (distinct keys: no exact ties in retrieval)."""
    bank = um.MemoryBank(world.dim, 2, limit=limit)
    for q in rng.choice(world.train[world.train != exclude], size, replace=False):
        q = int(q)
        alpha = float(rng.choice(um.ALPHAS))
        value = um.extract_memory(alpha, world.rules[world.family[q]], world.shortcuts[q])
        bank.write(world.embeddings[q], value, q, alpha, float(value @ world.shortcuts[q]))
    return bank


def test_retrieval_matches_brute_force(world):
    rng = np.random.default_rng(1)
    bank = _random_bank(world, rng, 30)
    for q in world.test[:20]:
        e = world.embeddings[q]
        sims = bank.keys[: len(bank)] @ e
        brute = [sims[i] for i in np.argsort(-sims, kind="stable")[:3] if sims[i] >= 0.5]
        np.testing.assert_allclose(sims[bank.retrieve(e)], brute)  # ties may swap indices


def test_bank_bad_input(world):
    bank = um.MemoryBank(world.dim)
    with pytest.raises(ValueError, match="empty memory bank"):
        bank.retrieve(world.embeddings[0])
    with pytest.raises(ValueError, match="shape"):
        bank.write(np.ones(world.dim + 1), np.ones(world.dim), 0, 1.0, 0.0)
    bank.write(world.embeddings[0], world.rules[0], 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="shape"):
        bank.retrieve(np.ones(world.dim - 1))
    with pytest.raises(ValueError, match="cannot update"):
        bank.write(world.embeddings[0], world.rules[0], 0, 1.0, 0.0, slot=5)


def test_marginal_utility_formulas():
    for c_mem in (0, 1):
        for c_ref in (0, 1):
            paper = um.marginal_utility(c_mem, c_ref, 60.0, 100.0, "paper")
            code = um.marginal_utility(c_mem, c_ref, 60.0, 100.0, "code")
            expected_paper = c_mem - c_ref + (0.4 if c_mem and c_ref else 0.0)
            expected_code = 0.0 if not c_mem else (1.0 if not c_ref else 0.4)
            assert paper == pytest.approx(expected_paper) and code == pytest.approx(expected_code)
            assert um._gain(c_mem, c_ref, 60.0, 100.0, "paper") == pytest.approx(paper)
            assert um._gain(c_mem, c_ref, 60.0, 100.0, "code") == pytest.approx(code)
    assert um.marginal_utility(1, 1, 150.0, 100.0, "code") == 0.0  # longer run: no bonus
    assert um.marginal_utility(0, 1, 150.0, 100.0, "paper") == -1.0  # the paper's penalty
    with pytest.raises(ValueError):
        um.marginal_utility(1, 1, 1.0, 1.0, "other")


def test_common_random_numbers_give_the_probability_difference():
    rng = np.random.default_rng(2)
    p_ref, p_mem = 0.35, 0.6
    u = rng.uniform(size=200_000)
    gain = (u < p_mem).astype(float) - (u < p_ref)
    assert abs(gain.mean() - (p_mem - p_ref)) < 4 * gain.std() / np.sqrt(u.size)
    assert gain.min() >= 0  # with CRN a better memory never loses on the same draw


def _brute_rewards(world, ex, bank, q, step, ext, man, targets, uniforms, noises, kind):
    out = np.zeros(len(ext))
    for g in range(len(ext)):
        if ext[g] == um.MALFORMED:
            continue
        trial = bank.copy() if kind == "paper" else um.MemoryBank(world.dim)
        um.apply_action(trial, world, q, step, int(ext[g]), int(man[g]) if kind == "paper" else 0)
        gains = []
        for t, target in enumerate(targets):
            e = world.embeddings[target]
            ref = (bank.retrieve(e) if kind == "paper" and len(bank) else np.zeros(0, int))
            new = trial.retrieve(e) if kind == "paper" else np.array([0])
            c_ref, l_ref, _ = ex.run(world, target, bank.values[ref], bank.source[ref],
                                     bank.weight[ref], uniforms[t], noises[t])
            c_mem, l_mem, _ = ex.run(world, target, trial.values[new], trial.source[new],
                                     trial.weight[new], uniforms[t], noises[t])
            gains.append(um.marginal_utility(c_mem, c_ref, l_mem, l_ref, kind))
        out[g] = 1 + np.mean(gains)
    return out


@pytest.mark.parametrize(("kind", "limit"), [("paper", None), ("code", None), ("paper", 6)])
def test_fast_candidate_rewards_match_a_brute_force_bank_copy(world, kind, limit):
    ex = um.Executor()
    rng = np.random.default_rng(4)
    targets_all = um.semantic_neighbourhood(world.embeddings, world.train, 4)
    for _ in range(25):
        row = int(rng.integers(len(world.train)))
        q = int(world.train[row])
        bank = _random_bank(world, rng, int(rng.integers(0, 25)), exclude=q, limit=limit)
        step = um.observe(world, ex, bank, q, rng)
        ext = rng.integers(0, um.N_EXTRACT, size=8)
        man = np.array([rng.integers(0, 1 + step.retrieved.size) for _ in range(8)])
        targets = np.append(targets_all[row], q)
        seed = int(rng.integers(1 << 30))
        fast = um.candidate_rewards(world, ex, bank, q, step, ext, man, targets,
                                    np.random.default_rng(seed), kind=kind)
        draws = np.random.default_rng(seed)
        uniforms, noises = draws.uniform(size=len(targets)), draws.normal(size=len(targets))
        brute = _brute_rewards(world, ex, bank, q, step, ext, man, targets, uniforms, noises,
                               kind)
        np.testing.assert_allclose(fast, brute, atol=1e-12)


def test_group_advantages():
    rng = np.random.default_rng(5)
    r = rng.normal(size=(10, 8))
    a = um.group_advantages(r)
    np.testing.assert_allclose(a.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(a.std(axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(um.group_advantages(r, normalise=False),
                               r - r.mean(axis=1, keepdims=True))
    assert np.all(um.group_advantages(np.ones(8)) == 0)
    with pytest.raises(ValueError, match="group size"):
        um.group_advantages(np.ones((3, 1)))


def test_grpo_loss_gradient_clipping_and_kl():
    torch.manual_seed(0)
    logits = torch.randn(6, requires_grad=True)
    actions = torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])
    adv = torch.randn(8)
    logp = torch.log_softmax(logits, -1)[actions]
    old = logp.detach()
    loss = um.grpo_loss(logp, old, old, adv, kl_coef=0.0)
    (grad,) = torch.autograd.grad(loss, logits)
    logp2 = torch.log_softmax(logits, -1)[actions]
    (pg,) = torch.autograd.grad(-(adv * logp2).mean(), logits)
    torch.testing.assert_close(grad, pg)  # at ratio 1 GRPO is the policy gradient
    # a ratio beyond 1 + eps with positive advantage gives no gradient
    lp = torch.tensor([0.0], requires_grad=True)
    um.grpo_loss(lp, torch.tensor([-0.5]), torch.tensor([0.0]), torch.tensor([1.0]),
                 kl_coef=0.0).backward()
    assert lp.grad.item() == 0.0
    # the k3 estimator is unbiased for KL(pi || ref) under pi
    p = torch.softmax(torch.randn(5, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(5, dtype=torch.float64), -1)
    log_ratio = torch.log(q) - torch.log(p)
    k3 = torch.exp(log_ratio) - log_ratio - 1
    exact = torch.distributions.kl_divergence(torch.distributions.Categorical(p),
                                              torch.distributions.Categorical(q))
    torch.testing.assert_close((p * k3).sum(), exact)
    with pytest.raises(ValueError, match="shape"):
        um.grpo_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(4))


def test_numpy_forward_matches_torch(world):
    torch.manual_seed(1)
    policy = um.MemPolicy(world.dim)
    with torch.no_grad():
        for p in policy.parameters():
            p.normal_()
    policy.refresh()
    rng = np.random.default_rng(6)
    x = rng.normal(size=um.n_features(world.dim))
    mask = np.array([True, True, False, False])
    p_ext, p_man = policy.probabilities(x, mask)
    xt = torch.as_tensor(x, dtype=torch.float32)[None].repeat(um.N_EXTRACT, 1)
    mt = torch.as_tensor(mask)[None].repeat(um.N_EXTRACT, 1)
    lp = policy.log_prob(xt, mt, torch.arange(um.N_EXTRACT), torch.zeros(um.N_EXTRACT,
                         dtype=torch.long), use_manage=False)
    np.testing.assert_allclose(np.exp(lp.detach().numpy()), p_ext, rtol=1e-5)
    assert p_man[2] == 0 and p_man[3] == 0
    with pytest.raises(ValueError, match="width|shape"):
        policy.probabilities(np.zeros(3), mask)


def test_masked_head_stays_frozen(world):
    ex = um.Executor()
    for flag, frozen in (("train_extract", "extract"), ("train_manage", "manage")):
        torch.manual_seed(0)
        start = um.MemPolicy(world.dim)
        before = [p.detach().clone() for p in getattr(start, frozen).parameters()]
        cfg = um.TrainConfig(epochs=1, **{flag: False})
        result = um.train_policy(world, ex, cfg, seed=0, policy=start)
        after = list(getattr(result.policy, frozen).parameters())
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        other = "manage" if frozen == "extract" else "extract"
        assert any(not torch.equal(a, b) for a, b in zip(
            getattr(um.MemPolicy(world.dim), other).parameters(),
            getattr(result.policy, other).parameters(), strict=True))


def test_no_memory_stream_is_the_base_rate(world):
    ex = um.Executor()
    result = um.stream(world, ex, None, world.test, seed=0)
    np.testing.assert_allclose(result.probability, 1 / (1 + np.exp(-ex.b0)))
    assert np.all(np.isnan(result.alpha))


def test_neighbourhood_reward_learns_abstraction_and_source_reward_does_not():
    """A statistical check of the mechanism on a small world (few seeds, generous margin)."""
    ex = um.Executor()
    w = um.make_world(n_heldout_families=0, seed=7)
    snm = um.train_policy(w, ex, um.TrainConfig(neighbourhood=3, epochs=2), seed=1)
    src = um.train_policy(w, ex, um.TrainConfig(neighbourhood=0, epochs=2), seed=1)
    assert snm.mean_alpha[-1] > src.mean_alpha[-1] + 0.2
    assert snm.mean_reward[-1] > snm.mean_reward[0]  # GRPO raised the neighbourhood reward


def test_bad_configuration():
    with pytest.raises(ValueError, match="group size"):
        um.TrainConfig(group_size=1)
    with pytest.raises(ValueError):
        um.TrainConfig(neighbourhood=-1)
    with pytest.raises(ValueError, match="reward"):
        um.TrainConfig(reward="other")
    w = um.make_world(n_families=2, n_heldout_families=0, queries_per_family=10)
    with pytest.raises(ValueError, match="at least 1"):
        um.semantic_neighbourhood(w.embeddings, w.train, 0)
    with pytest.raises(TypeError):
        um.semantic_neighbourhood(w.embeddings, w.train, 1.5)
    with pytest.raises(ValueError, match="alpha"):
        um.extract_memory(1.5, w.rules[0], w.shortcuts[0])
    with pytest.raises(TypeError):
        um.train_policy(w, um.Executor(), {"neighbourhood": 3})
    with pytest.raises(ValueError, match="non-empty"):
        um.stream(w, um.Executor(), None, [])


def _loop_gain(world, ex, q, insight, targets, efficiency, threshold=0.5):
    """Brute force of lone_memory_gains for one insight, through the scalar executor."""
    p_ref = ex.success_probability(0.0, 0.0, 0.0)
    out = np.zeros(len(um.ALPHAS))
    for a, alpha in enumerate(um.ALPHAS):
        value = um.extract_memory(alpha, insight, world.shortcuts[q])
        weight = float(value @ world.shortcuts[q])
        for t in targets:
            if world.embeddings[t] @ world.embeddings[q] < threshold:
                continue
            r, h, w = um._aggregate([float(value @ world.rules[world.family[t]])],
                                    [int(t) == q], [weight])
            p = ex.success_probability(r, h, w)
            gain = p - p_ref
            if efficiency:  # lengths with the same noise draw: the noise cancels in the ratio
                gain += min(p, p_ref) * (1 - ex.length(r, w, 0.3) / ex.length(0, 0, 0.3))
            out[a] += gain
    return out / len(targets)


def test_lone_memory_gains_match_a_scalar_loop(world):
    ex = um.Executor()
    rng = np.random.default_rng(8)
    nbrs = um.semantic_neighbourhood(world.embeddings, world.train, 3)
    for row in rng.choice(len(world.train), 6, replace=False):
        q = int(world.train[row])
        insights = np.stack([ex.insight(world, q, 1, rng) for _ in range(3)])
        for targets in ([q], nbrs[row], world.test[:5]):
            for eff in (False, True):
                fast = um.lone_memory_gains(world, ex, q, insights, targets, eff)
                brute = np.stack([_loop_gain(world, ex, q, u, targets, eff) for u in insights])
                np.testing.assert_allclose(fast, brute, atol=1e-12)


def test_lone_memory_reward_is_the_mean_of_the_sampled_reward(world):
    """Closed form against Monte Carlo: candidate_rewards on an empty bank, many CRN draws."""
    ex = um.Executor()
    q = int(world.train[2])
    targets = np.append(um.semantic_neighbourhood(world.embeddings, world.train, 3)[2], q)
    insight = ex.insight(world, q, 1, np.random.default_rng(9))
    step = um.Step(np.zeros(um.n_features(world.dim)), np.array([1, 0, 0, 0], bool),
                   np.zeros(0, int), 1, 1000.0, 0.4, insight)
    ext, man = np.arange(len(um.ALPHAS)), np.zeros(len(um.ALPHAS), int)
    bank = um.MemoryBank(world.dim)
    rng = np.random.default_rng(10)
    draws = np.stack([um.candidate_rewards(world, ex, bank, q, step, ext, man, targets, rng)
                      for _ in range(6000)]) - 1.0
    exact = um.lone_memory_gains(world, ex, q, insight, targets, efficiency=True)[0]
    se = draws.std(axis=0, ddof=1) / np.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - exact) < 4 * se + 1e-12)
    # and a source-only target set: a pure shortcut beats a pure rule on its own query
    src = um.lone_memory_gains(world, ex, q, insight, [q], efficiency=True)[0]
    assert src[0] > src[-1]


def test_neighbourhood_reward_equals_held_out_utility_in_expectation(world):
    """The design fact behind the forced claims: neighbours and held-out queries of a family
    see the same expected success gain from a lone memory (same rule, foreign shortcut)."""
    ex = um.Executor()
    q = int(world.train[0])
    fam = world.family[q]
    nbrs = [int(t) for t in world.train if world.family[t] == fam and t != q][:3]
    tests = [int(t) for t in world.test if world.family[t] == fam][:3]
    a = um.expected_gain_by_alpha(world, ex, q, nbrs, draws=50, threshold=-1.0)
    b = um.expected_gain_by_alpha(world, ex, q, tests, draws=50, threshold=-1.0)
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_lemma_check_matches_pairwise_lemma_gap(world):
    rng = np.random.default_rng(11)
    pairs = rng.integers(0, len(world.embeddings), size=(40, 2))
    keys = world.embeddings[world.test]
    violations, tested, ratio = um.lemma_check(world.embeddings, pairs, keys)
    brute = [um.lemma_gap(world.embeddings[i], world.embeddings[j], keys) for i, j in pairs]
    assert violations == sum(int(np.sum(g > b + 1e-12)) for g, b in brute) == 0
    assert tested == 40 * len(keys)
    assert ratio == pytest.approx(max(float(np.max(g / b)) for g, b in brute if b > 0))
    assert ratio <= 1 + 1e-12
    with pytest.raises(ValueError, match="shape"):
        um.lemma_check(world.embeddings, pairs[:, :1], keys)
    with pytest.raises(ValueError, match="width"):
        um.lemma_check(world.embeddings, pairs, keys[:, :3])
    with pytest.raises(ValueError, match="unit"):
        um.lemma_check(world.embeddings, pairs, 2 * keys)


def test_lone_memory_gains_bad_input(world):
    ex = um.Executor()
    with pytest.raises(ValueError, match="width"):
        um.lone_memory_gains(world, ex, 0, np.ones((2, world.dim + 1)), [1])
    with pytest.raises(ValueError, match="empty"):
        um.lone_memory_gains(world, ex, 0, world.rules[:1], [])
    with pytest.raises(ValueError, match="draws"):
        um.expected_gain_by_alpha(world, ex, 0, [1], draws=0)


def test_add_rate_follows_the_management_head(world):
    ex = um.Executor()
    assert np.isnan(um.evaluate(world, ex, None, 1, 0).add_rate)
    for favoured, expected in ((0, 1.0), (1, 0.0)):
        torch.manual_seed(0)
        policy = um.MemPolicy(world.dim)
        with torch.no_grad():
            policy.manage[2].bias.fill_(-30.0)
            policy.manage[2].bias[favoured] = 30.0
            policy.extract[2].bias.fill_(-30.0)
            policy.extract[2].bias[len(um.ALPHAS) - 1] = 30.0  # always alpha = 1
        policy.refresh()
        result = um.stream(world, ex, policy, world.test, seed=1)
        ops = result.operation[result.operation >= 0]
        assert ops.size > 0 and np.all((ops == 0) == bool(expected))
        assert um.evaluate(world, ex, policy, 1, 0).add_rate == expected


def test_capped_bank_evicts_the_oldest_entry_on_add(world):
    bank = um.MemoryBank(world.dim, limit=3)
    ids = [int(q) for q in world.train[:5]]
    for q in ids[:3]:
        bank.write(world.embeddings[q], world.shortcuts[q], q, 0.0, 1.0)
    assert bank.full and bank.add_slot() == 0
    bank.write(world.embeddings[ids[0]], world.rules[0], ids[0], 1.0, 0.0, slot=0)  # UPDATE
    assert bank.add_slot() == 1  # an update refreshes its entry
    bank.write(world.embeddings[ids[3]], world.shortcuts[ids[3]], ids[3], 0.0, 1.0)
    assert len(bank) == 3 and list(bank.source) == [ids[0], ids[3], ids[2]]
    with pytest.raises(ValueError):
        um.MemoryBank(world.dim, limit=0)


def test_independent_draws_change_the_reward_not_its_mean(world):
    ex = um.Executor()
    q = int(world.train[0])
    targets = um.semantic_neighbourhood(world.embeddings, world.train, 3)[0]
    step = um.Step(np.zeros(um.n_features(world.dim)), np.array([True, False, False, False]),
                   np.zeros(0, dtype=int), 1, ex.length0, 0.5, world.rules[world.family[q]])
    bank = um.MemoryBank(world.dim)
    ext, man = np.full(8, 4), np.zeros(8, int)  # eight identical candidates
    rng = np.random.default_rng(0)
    crn = um.candidate_rewards(world, ex, bank, q, step, ext, man, targets, rng)
    assert np.ptp(crn) == 0  # common random numbers: identical candidates, identical rewards
    draws = np.stack([um.candidate_rewards(world, ex, bank, q, step, ext, man, targets, rng,
                                           common=False) for _ in range(300)])
    assert np.ptp(draws[0]) > 0 or np.ptp(draws[1]) > 0
    # exact mean with independent draws: (p - p0) + p p0 (1 - e^{0.01} lambda / lambda0)
    v = um.extract_memory(1.0, step.insight, world.shortcuts[q])
    p0, lam0 = ex.success_probability(0, 0, 0), ex.length(0, 0, 0)
    gains = []
    for t in targets:
        if world.embeddings[t] @ world.embeddings[q] < 0.5:
            gains.append(0.0)
            continue
        r, h, w = ex.features(world, int(t), v[None], np.array([q]),
                              np.array([v @ world.shortcuts[q]]))
        p = ex.success_probability(r, h, w)
        gains.append(p - p0 + p * p0 * (1 - np.exp(0.01) * ex.length(r, w, 0) / lam0))
    se = draws.mean(1).std(ddof=1) / np.sqrt(len(draws))
    assert abs((draws - 1).mean() - np.mean(gains)) < 4 * se


def test_sibling_families_lower_neighbour_purity():
    def purity(w):
        nb = um.semantic_neighbourhood(w.embeddings, w.train, 3)
        return float(np.mean(w.family[nb] == w.family[w.train][:, None]))

    assert purity(um.make_world(seed=0)) > 0.9
    assert 0.55 < purity(um.make_world(seed=0, sibling_spread=0.4)) < 0.9


def test_stale_entries_mislead_until_an_update_overwrites_them(world):
    ex = um.Executor()
    bank = um.MemoryBank(world.dim)
    um.seed_stale(bank, world, 2, seed=5)
    assert len(bank) == 2 * world.rules.shape[0] and np.all(bank.source[: len(bank)] == -1)
    again = um.MemoryBank(world.dim)
    um.seed_stale(again, world, 2, seed=5)
    np.testing.assert_array_equal(bank.values, again.values)  # deterministic given the seed
    rng = np.random.default_rng(0)
    p0 = ex.success_probability(0, 0, 0)
    first_stale, probs = [], []
    for q in world.test:
        step = um.observe(world, ex, bank, int(q), rng)
        first_stale.append(step.retrieved.size > 0 and bank.source[step.retrieved[0]] == -1)
        probs.append(step.probability)
    assert np.mean(first_stale) > 0.9 and np.mean(probs) < p0  # retrieved first, and misleading
    q = int(world.test[0])
    step = um.observe(world, ex, bank, q, rng)
    added = bank.copy()
    um.apply_action(added, world, q, step, len(um.ALPHAS) - 1, 0)  # ADD keeps every stale entry
    assert np.sum(added.source[: len(added)] == -1) == len(bank)
    updated = bank.copy()
    um.apply_action(updated, world, q, step, len(um.ALPHAS) - 1, 1)  # UPDATE overwrites one
    assert np.sum(updated.source[: len(updated)] == -1) == len(bank) - 1


def test_rule_management_overwrites_the_weakest_entry_when_it_should(world):
    torch.manual_seed(0)
    policy = um.MemPolicy(world.dim)
    rule = um.RuleManagement(policy)
    q = int(world.train[0])
    mask = np.array([True, True, True, False])
    for alphas, full, expected in (((1.0, 0.25), False, 2), ((1.0, 0.75), False, 0),
                                   ((1.0, 0.75), True, 2), ((), False, 0)):
        x = um.policy_features(world, q, 1, 900.0, 1000.0, np.full(len(alphas), 0.7),
                               np.array(alphas), full)
        p_ext, p_man = rule.probabilities(x, mask)
        np.testing.assert_allclose(p_ext, policy.probabilities(x, mask)[0])
        assert p_man[expected] == 1.0 and p_man.sum() == 1.0


def test_online_evolution_clears_the_training_families_stale_entries(world):
    config = um.TrainConfig(stale=4, epochs=2, batch_queries=8)
    result = um.train_policy(world, um.Executor(), config, seed=0)
    held_out_families = world.rules.shape[0] - len(np.unique(world.family[world.train]))
    assert result.stale_left <= 4 * held_out_families + 2
    with pytest.raises(ValueError):
        um.TrainConfig(stale=-1)


def test_learned_executor_is_deterministic_and_learns_to_use_memories(world):
    a = um.train_executor(world, episodes=500, steps=100, seed=1)
    b = um.train_executor(world, episodes=500, steps=100, seed=1)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    np.testing.assert_allclose(np.linalg.norm(um.answers(world), axis=1), 1.0)
    probe = world.test
    none = um.learned_success(a, world, probe)
    answer = um.learned_success(a, world, probe, um.answers(world)[probe], 1.0)
    assert answer.mean() > none.mean() + 0.1
    # no memory: the values are ignored, whatever they are
    e = torch.as_tensor(world.embeddings[probe], dtype=torch.float32)
    y = torch.as_tensor(um.answers(world)[probe], dtype=torch.float32)
    junk = torch.randn(probe.size, um.TOP_K, world.dim)
    with torch.no_grad():
        p = a.success_probability(e, junk, torch.zeros(probe.size, um.TOP_K),
                                  torch.zeros(probe.size, um.TOP_K), y)
    np.testing.assert_allclose(p.double().numpy(), none, rtol=1e-6)


def test_learned_reward_curves_match_a_direct_computation(world):
    model = um.train_executor(world, episodes=300, steps=50, seed=2)
    curves = um.learned_reward_curves(model, world, (1, 3), draws=2, seed=4)
    assert set(curves) == {"source", 1, 3, "held-out"}
    rng = np.random.default_rng(4)
    s = um.Executor().insight_noise_success
    insights = um._unit(world.rules[world.family[world.train]][:, None, :]
                        + s * rng.normal(size=(world.train.size, 2, world.dim))
                        / np.sqrt(world.dim))
    for a, alpha in enumerate(um.ALPHAS):
        total = 0.0
        for row, q in enumerate(world.train):
            for k in range(2):
                v = um.extract_memory(alpha, insights[row, k], world.shortcuts[q])
                total += (um.learned_success(model, world, [q], v, 1.0)
                          - um.learned_success(model, world, [q]))[0]
        assert curves["source"][a] == pytest.approx(total / (2 * world.train.size), abs=1e-6)


def _torch_success(model, world, queries, values, sims, mask):
    queries = np.asarray(queries)
    as_t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)  # noqa: E731
    with torch.no_grad():
        return model.success_probability(as_t(world.embeddings[queries]), as_t(values),
                                         as_t(sims), as_t(mask),
                                         as_t(um.answers(world)[queries])).double().numpy()


def test_stacked_executor_training_equals_one_at_a_time(world):
    other = um.make_world(n_families=4, n_heldout_families=1, queries_per_family=20, seed=8)
    stacked = um.train_executors([world, other], episodes=300, steps=40, lr=0.04, seeds=[1, 6])
    for w, s, model in ((world, 1, stacked[0]), (other, 6, stacked[1])):
        alone = um.train_executor(w, episodes=300, steps=40, lr=0.04, seed=s)
        for p, q in zip(alone.parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        um.train_executors([world, other], seeds=[1])
    with pytest.raises(ValueError):
        um.train_executors([])


def test_memory_executor_matches_the_torch_model(world):
    model = um.train_executor(world, episodes=300, steps=40, seed=2)
    ex = um.MemoryExecutor.from_model(model)
    rng = np.random.default_rng(3)
    n = 30
    queries = rng.choice(world.train, size=n)
    values = um._unit(rng.normal(size=(n, um.TOP_K, world.dim)))
    sims = rng.uniform(0.5, 1.0, size=(n, um.TOP_K))
    mask = (np.arange(um.TOP_K)[None, :] < rng.integers(0, um.TOP_K + 1, size=n)[:, None])
    values = values * mask[..., None]
    ours = ex.success(world, queries, values, np.where(mask, sims, -1.0), mask)
    np.testing.assert_allclose(ours, _torch_success(model, world, queries, values,
                                                    np.where(mask, sims, -1.0), mask),
                               rtol=1e-4, atol=1e-5)
    # an executor that ignores its memories: success does not depend on them
    blind = um.MemoryExecutor.from_model(model, ignore_memories=True)
    none = blind.success(world, queries, values * 0, sims, np.zeros_like(sims))
    np.testing.assert_allclose(blind.success(world, queries, values, sims, mask), none)
    with pytest.raises(TypeError):
        um.MemoryExecutor.from_model(um.Executor())


def _brute_learned_rewards(world, ex, bank, q, step, ext, man, targets, uniforms):
    def success(b, target):
        idx = b.retrieve(world.embeddings[target]) if len(b) else np.zeros(0, int)
        values, sims, mask = (np.zeros((um.TOP_K, world.dim)), np.zeros(um.TOP_K),
                              np.zeros(um.TOP_K))
        values[: idx.size] = b.values[idx]
        sims[: idx.size] = b.similarities(world.embeddings[target])[idx]
        mask[: idx.size] = 1
        return float(ex.success(world, target, values, sims, mask))

    out = np.zeros(len(ext))
    for g in range(len(ext)):
        if ext[g] == um.MALFORMED:
            continue
        trial = bank.copy()
        um.apply_action(trial, world, q, step, int(ext[g]), int(man[g]))
        gains = [float(u < success(trial, t)) - float(u < success(bank, t))
                 for t, u in zip(targets, uniforms, strict=True)]
        out[g] = 1 + np.mean(gains)
    return out


@pytest.mark.parametrize("limit", [None, 6])
def test_learned_candidate_rewards_match_a_brute_force_bank_copy(world, limit):
    ex = um.MemoryExecutor.from_model(um.train_executor(world, episodes=300, steps=40, seed=2))
    rng = np.random.default_rng(4)
    targets_all = um.semantic_neighbourhood(world.embeddings, world.train, 4)
    for _ in range(20):
        row = int(rng.integers(len(world.train)))
        q = int(world.train[row])
        bank = _random_bank(world, rng, int(rng.integers(0, 25)), exclude=q, limit=limit)
        step = um.observe(world, ex, bank, q, rng)
        assert step.length == ex.length0
        ext = rng.integers(0, um.N_EXTRACT, size=8)
        man = np.array([rng.integers(0, 1 + step.retrieved.size) for _ in range(8)])
        targets = np.append(targets_all[row], q)
        seed = int(rng.integers(1 << 30))
        fast = um.learned_candidate_rewards(world, ex, bank, q, step, ext, man, targets,
                                            np.random.default_rng(seed), common=True)
        uniforms = np.random.default_rng(seed).uniform(size=len(targets))
        brute = _brute_learned_rewards(world, ex, bank, q, step, ext, man, targets, uniforms)
        np.testing.assert_allclose(fast, brute, atol=1e-12)
        # independent draws: the same support, a noisier estimate
        noisy = um.learned_candidate_rewards(world, ex, bank, q, step, ext, man, targets,
                                             np.random.default_rng(seed))
        assert np.all((noisy == 0) == (ext == um.MALFORMED))
        assert np.all(np.abs(noisy[ext != um.MALFORMED] - 1) <= 1)


def test_training_with_an_executor_that_ignores_memories_cannot_change_accuracy(world):
    model = um.train_executor(world, episodes=300, steps=40, seed=2)
    blind = um.MemoryExecutor.from_model(model, ignore_memories=True)
    config = um.TrainConfig(epochs=1, batch_queries=8, capacity=6)
    torch.manual_seed(0)
    initial = um.MemPolicy(world.dim)
    trained = um.train_policy(world, blind, config, 0, policy=um.copy.deepcopy(initial))
    a = um.stream(world, blind, trained.policy, world.test, seed=1, capacity=6)
    b = um.stream(world, blind, initial, world.test, seed=1, capacity=6)
    np.testing.assert_array_equal(a.probability, b.probability)
    # with the memories read, the same training does move accuracy
    sighted = um.MemoryExecutor.from_model(model)
    trained = um.train_policy(world, sighted, config, 0, policy=um.copy.deepcopy(initial))
    a = um.stream(world, sighted, trained.policy, world.test, seed=1, capacity=6)
    b = um.stream(world, sighted, initial, world.test, seed=1, capacity=6)
    assert not np.array_equal(a.probability, b.probability)
    with pytest.raises(ValueError):
        um.train_policy(world, sighted, um.TrainConfig(epochs=1, reward="code"))


def test_skipping_held_out_families_leaves_held_out_queries_unchanged(world):
    torch.manual_seed(0)
    policy = um.MemPolicy(world.dim)
    full = um.evaluate(world, um.Executor(), policy, 2, seed=3, capacity=6)
    short = um.evaluate(world, um.Executor(), policy, 2, seed=3, capacity=6, ood=False)
    assert short.accuracy == full.accuracy and short.alpha == full.alpha
    assert short.accuracy_ood == short.accuracy and full.accuracy_ood != full.accuracy
