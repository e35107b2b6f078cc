"""Tests for the fictitious-play chapter: nashpy as oracle, the regret bound, the Gibbs variational
principle, the exact simulation score against Monte Carlo and brute force, and bad input."""

import itertools

import nashpy as nash
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

import icml26.fictitious_play as fp
from icml26.fictitious_play import incontext as ic

GAMES = {"rps": fp.rock_paper_scissors, "shapley": fp.shapley_game}


# --- matrix games -----------------------------------------------------------------------------


@pytest.mark.parametrize("game", sorted(GAMES))
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_fictitious_play_matches_nashpy_draw_for_draw(game, seed):
    A, B = GAMES[game]()
    iterations = 300
    np.random.seed(seed)
    theirs = list(nash.Game(A, B).fictitious_play(iterations=iterations))
    ours = fp.fictitious_play(A, B, iterations, rng=np.random.RandomState(seed)).counts
    for t in range(iterations):
        assert np.array_equal(theirs[t + 1][0], ours[0][t]), (game, seed, t)
        assert np.array_equal(theirs[t + 1][1], ours[1][t]), (game, seed, t)


@pytest.mark.parametrize("game", sorted(GAMES))
@pytest.mark.parametrize("epsilon_bar", [0.0, 0.05])
def test_stochastic_fictitious_play_matches_nashpy(game, epsilon_bar):
    A, B = GAMES[game]()
    iterations, tau, seed = 300, 0.2, 3
    np.random.seed(seed)
    theirs = list(nash.Game(A, B).stochastic_fictitious_play(
        iterations=iterations, etha=tau, epsilon_bar=epsilon_bar))
    run = fp.stochastic_fictitious_play(A, B, iterations, tau=tau, epsilon_bar=epsilon_bar,
                                        rng=np.random.RandomState(seed))
    for t in range(iterations):
        counts, dists = theirs[t + 1]
        assert np.array_equal(counts[0], run.counts[0][t])
        assert np.array_equal(counts[1], run.counts[1][t])
        np.testing.assert_allclose(dists[0], run.strategies[0][t], atol=1e-12)
        np.testing.assert_allclose(dists[1], run.strategies[1][t], atol=1e-12)


def test_smooth_best_response_is_the_gibbs_maximiser():
    rng = np.random.default_rng(0)
    for _ in range(20):
        u = rng.normal(size=4)
        tau = rng.uniform(0.05, 2.0)
        best = fp.smooth_best_response(u, tau)
        value = best @ u + tau * fp.entropy(best)
        np.testing.assert_allclose(value, tau * np.log(np.exp(u / tau).sum()), rtol=1e-10)
        others = rng.dirichlet(np.ones(4), size=2000)
        vals = others @ u + tau * np.array([fp.entropy(p) for p in others])
        assert vals.max() <= value + 1e-12


def test_smooth_best_response_limits():
    u = np.array([0.1, 0.5, 0.3])
    np.testing.assert_allclose(fp.smooth_best_response(u, 1e-4), [0, 1, 0], atol=1e-12)
    np.testing.assert_allclose(fp.smooth_best_response(u, 1e4), np.full(3, 1 / 3), atol=1e-4)


@pytest.mark.parametrize("tau", [0.02, 0.1, 0.5])
def test_sfp_regret_bound_holds_at_every_step_against_the_adversary(tau):
    A, _ = fp.rock_paper_scissors()
    K = 800
    run = fp.against_adversary(A, K, tau=tau, rng=np.random.default_rng(1))
    regret = run.average_regret(0)
    bounds = np.array([fp.regret_bound(tau, 3, k, 2.0) for k in range(1, K + 1)])
    assert np.all(regret <= bounds + 1e-12)


def test_sfp_regret_bound_holds_against_random_and_self_play_opponents():
    rng = np.random.default_rng(2)
    for _ in range(5):
        A = rng.uniform(-1, 1, size=(4, 3))
        B = rng.uniform(-1, 1, size=(4, 3))
        run = fp.stochastic_fictitious_play(A, B, 400, tau=0.1, rng=rng)
        r_row = A.max() - A.min()
        r_col = B.max() - B.min()
        assert run.average_regret(0)[-1] <= fp.regret_bound(0.1, 4, 400, r_row)
        assert run.average_regret(1)[-1] <= fp.regret_bound(0.1, 3, 400, r_col)


def test_regret_bound_equals_the_terms_of_its_proof():
    # K * bound = r (first step) + log|A| / eta_K + (r^2 / 8) sum_{t=2}^K eta_t,
    # with eta_t = 1 / (tau (t - 1)): the telescoping sum of (eq-sfp-bound), term by term.
    cases = ((0.05, 3, 1, 2.0), (0.05, 3, 2, 2.0), (0.3, 4, 17, 1.5), (2.0, 2, 500, 1.0))
    for tau, n, K, r in cases:
        etas = [1.0 / (tau * (t - 1)) for t in range(2, K + 1)]
        log_term = np.log(n) * tau * (K - 1)
        total = r + log_term + r**2 / 8 * sum(etas)
        np.testing.assert_allclose(fp.regret_bound(tau, n, K, r) * K, total, rtol=1e-12)


@pytest.mark.parametrize("tau", [0.05, 0.5, 2.0, 10.0])
def test_regret_bound_holds_from_the_first_step_whatever_the_first_move(tau):
    # Large temperatures and K = 1, 2, ...: the regime where a bound that charges the first step
    # r^2 / (8 tau) instead of r fails (e.g. K = 1, tau = 1, payoffs (1, 0, 0)). sFP's first move
    # is the logit response to the uniform belief, which is not uniform in these random games.
    rng = np.random.default_rng(11)
    for _ in range(20):
        A = rng.uniform(-1, 1, size=(3, 4))
        B = rng.uniform(-1, 1, size=(3, 4))
        runs = [fp.stochastic_fictitious_play(A, B, 60, tau=tau, rng=rng),
                fp.against_adversary(A, 60, tau=tau, rng=rng)]
        r = A.max() - A.min()
        bounds = np.array([fp.regret_bound(tau, 3, k, r) for k in range(1, 61)])
        for run in runs:
            assert np.all(run.average_regret(0) <= bounds + 1e-12)
    single = fp.against_adversary(np.array([[1.0], [0.0], [0.0]]), 1, tau=1.0,
                                  rng=np.random.default_rng(0))
    assert single.average_regret(0)[0] <= fp.regret_bound(1.0, 3, 1, 1.0)
    assert single.average_regret(0)[0] > 1.0 / 8  # the old first-step charge r^2/(8 tau)


def test_plain_fictitious_play_is_exploited_by_the_adversary():
    A, _ = fp.rock_paper_scissors()
    run = fp.against_adversary(A, 600, tau=None, rng=np.random.default_rng(0))
    assert run.average_regret(0)[-1] > 0.5
    # it loses (payoff -1) whenever its best response is unique, and scores 0 at the uniform
    # belief of every third step: two losses in three
    expected = (run.strategies[0] * A[:, run.actions[1]].T).sum(axis=1)
    assert set(np.round(expected, 12)) <= {0.0, -1.0}
    np.testing.assert_allclose(np.mean(expected == -1.0), 2 / 3, atol=1e-2)


def test_average_regret_matches_a_direct_computation():
    A, B = fp.shapley_game()
    run = fp.stochastic_fictitious_play(A, B, 50, tau=0.3, rng=np.random.default_rng(4))
    a, b = run.actions
    best = max(sum(A[i, b[t]] for t in range(50)) for i in range(3))
    got = sum(run.strategies[0][t] @ A[:, b[t]] for t in range(50))
    np.testing.assert_allclose(run.average_regret(0)[-1], (best - got) / 50)
    got_real = sum(A[a[t], b[t]] for t in range(50))
    np.testing.assert_allclose(run.average_regret(0, realized=True)[-1], (best - got_real) / 50)
    best_col = max(sum(B[a[t], j] for t in range(50)) for j in range(3))
    got_col = sum(run.strategies[1][t] @ B[a[t], :] for t in range(50))
    np.testing.assert_allclose(run.average_regret(1)[-1], (best_col - got_col) / 50)


def test_matrix_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        fp.check_game(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="2-D"):
        fp.fictitious_play(np.zeros(3), np.zeros(3), 5)
    with pytest.raises(ValueError, match="NaN"):
        fp.check_game(np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="tau"):
        fp.stochastic_fictitious_play(*fp.rock_paper_scissors(), 5, tau=0.0)
    with pytest.raises(ValueError, match="tau"):
        fp.smooth_best_response([1.0, 2.0], -1.0)
    with pytest.raises(ValueError, match="tau"):
        fp.regret_bound(0.0, 3, 10, 1.0)
    with pytest.raises(ValueError, match="iterations"):
        fp.fictitious_play(*fp.rock_paper_scissors(), 0)
    with pytest.raises(TypeError):
        fp.fictitious_play(*fp.rock_paper_scissors(), 5, rng=3)
    with pytest.raises(ValueError, match="player"):
        fp.fictitious_play(*fp.rock_paper_scissors(), 5).average_regret(2)


# --- negotiation ------------------------------------------------------------------------------


def brute_force_utility(game, p, u):
    """Expected payoff by enumerating every accept/reject path of one negotiation."""
    total = 0.0
    for path in itertools.product([0, 1], repeat=game.rounds):
        prob = np.prod([p[h] if path[h] else 1 - p[h] for h in range(game.rounds)])
        first = path.index(1) if 1 in path else None
        total += prob * (u[first] if first is not None else 0.0)
    return total


@pytest.mark.parametrize("game, opponent", [
    (fp.PriceGame(), fp.Seller(0.7, 1.5)),
    (fp.ExchangeGame(), fp.Partner((0.3, 0.7), 0.5)),
])
def test_expected_utility_by_brute_force_and_monte_carlo(game, opponent):
    rng = np.random.default_rng(0)
    strategies = game.sample_strategies(rng, 6)
    exact = fp.expected_utility(game, opponent, strategies)
    offers = game.offers(strategies)
    p = opponent.accept_probability(game, offers)
    u = game.utility(offers)
    brute = [brute_force_utility(game, p[i], u[i]) for i in range(6)]
    np.testing.assert_allclose(exact, brute, rtol=1e-12)
    mc = fp.simulated_utility(game, opponent, strategies, 20000, rng)
    se = u.max() / np.sqrt(20000)
    assert np.all(np.abs(mc - exact) < 5 * se)


def test_play_episode_frequencies_match_the_expected_utility():
    game, seller = fp.PriceGame(), fp.Seller(0.6, 1.0)
    strategy = np.array([0.45, 0.05])
    rng = np.random.default_rng(3)
    payoffs = [fp.play_episode(game, seller, strategy, rng.random(game.rounds))[0]
               for _ in range(4000)]
    exact = fp.expected_utility(game, seller, strategy[None])[0]
    assert abs(np.mean(payoffs) - exact) < 5 * np.std(payoffs) / np.sqrt(4000)


def test_fit_logistic_matches_scikit_learn_with_weights():
    rng = np.random.default_rng(5)
    X = np.column_stack([np.ones(80), rng.normal(size=(80, 2))])
    y = (rng.random(80) < fp.sigmoid(X @ np.array([0.3, 1.5, -1.0]))).astype(float)
    c = rng.uniform(0.5, 2.0, size=80)
    ridge = 0.7
    ours = fp.fit_logistic(X, y, c, ridge=ridge)
    ref = LogisticRegression(C=1 / ridge, fit_intercept=False, tol=1e-12, max_iter=10000)
    ref.fit(X, y, sample_weight=c)
    np.testing.assert_allclose(ours, ref.coef_[0], atol=1e-5)


def test_soft_labels_equal_split_weights():
    rng = np.random.default_rng(6)
    X = np.column_stack([np.ones(30), rng.normal(size=30)])
    y = rng.uniform(size=30)
    soft = fp.fit_logistic(X, y, ridge=0.1)
    split = fp.fit_logistic(np.vstack([X, X]), np.r_[np.ones(30), np.zeros(30)],
                            np.r_[y, 1 - y], ridge=0.1)
    np.testing.assert_allclose(soft, split, atol=1e-8)


def test_fit_logistic_without_data_is_the_uniform_belief_and_survives_separation():
    assert np.all(fp.fit_logistic(np.zeros((0, 4)), np.zeros(0)) == 0)
    X = np.column_stack([np.ones(6), np.linspace(0, 1, 6)])
    w = fp.fit_logistic(X, np.r_[np.zeros(3), np.ones(3)], ridge=1e-3)
    assert np.all(np.isfinite(w)) and w[1] > 0


def test_bon_choice_probabilities_against_monte_carlo_and_kl_bound():
    rng = np.random.default_rng(7)
    base = rng.dirichlet(np.ones(6))
    scores = rng.normal(size=6)
    for n in (1, 2, 4, 16):
        probs = fp.bon_choice_probabilities(base, scores, n)
        np.testing.assert_allclose(probs.sum(), 1.0)
        draws = rng.choice(6, size=(20000, n), p=base)
        picks = draws[np.arange(20000), np.argmax(scores[draws], axis=1)]
        freq = np.bincount(picks, minlength=6) / 20000
        assert np.all(np.abs(freq - probs) < 5 * np.sqrt(probs * (1 - probs) / 20000) + 1e-9)
        kl = np.sum(probs[probs > 0] * np.log(probs[probs > 0] / base[probs > 0]))
        assert kl <= np.log(n) - (n - 1) / n + 1e-12
    np.testing.assert_allclose(fp.bon_choice_probabilities(base, scores, 1), base)


def test_run_repeated_common_random_numbers_and_nesting():
    game, seller = fp.PriceGame(), fp.Seller()
    base = fp.run_repeated(game, seller, "base", episodes=8, seed=[4])
    sfp1 = fp.run_repeated(game, seller, "sfp", episodes=8, n_candidates=1, seed=[4])
    np.testing.assert_array_equal(base.utilities, sfp1.utilities)
    again = fp.run_repeated(game, seller, "sfp", episodes=8, n_candidates=4, seed=[4])
    twice = fp.run_repeated(game, seller, "sfp", episodes=8, n_candidates=4, seed=[4])
    np.testing.assert_array_equal(again.utilities, twice.utilities)
    pool = fp.candidate_pool(game, [4], 8)
    for t in range(8):
        assert any(np.array_equal(again.strategies[t], c) for c in pool[t, :4])
    assert again.model_queries == 8 * 4 * game.rounds


def test_oracle_best_of_n_beats_the_base_policy_on_average():
    game, seller = fp.PriceGame(), fp.Seller()
    gains = []
    for r in range(10):
        pool = fp.candidate_pool(game, [r], 1)[0, :16]
        scores = fp.expected_utility(game, seller, pool)
        gains.append(scores[fp.best_of_n(scores)] - scores[0])
    assert np.all(np.array(gains) >= 0) and np.mean(gains) > 0.05


def test_switching_opponent_cycles_types():
    a, b = fp.Seller(0.75, 0.7), fp.Seller(0.55, 2.0)
    sw = fp.Switching((a, b), period=3)
    assert [sw.current(t) for t in range(7)] == [a, a, a, b, b, b, a]


def test_seller_thresholds_fall_to_the_floor():
    th = fp.Seller(0.8, 2.0, floor=0.3).thresholds(5)
    assert th[0] == pytest.approx(0.8) and np.all(np.diff(th) < 0) and th[-1] > 0.3


def test_negotiation_bad_input():
    game, seller = fp.PriceGame(), fp.Seller()
    with pytest.raises(ValueError, match="N"):
        fp.run_repeated(game, seller, "sfp", episodes=3, n_candidates=0)
    with pytest.raises(ValueError, match="method"):
        fp.run_repeated(game, seller, "greedy", episodes=3)
    with pytest.raises(ValueError, match="prior"):
        fp.run_repeated(game, seller, "prior", episodes=3)
    with pytest.raises(ValueError, match="feasible"):
        seller.accept_probability(game, np.full((1, 5, 1), 1.5))
    with pytest.raises(ValueError, match="feasible"):
        fp.ExchangeGame().utility(np.full((1, 4, 2), -0.1))
    with pytest.raises(ValueError, match="shape"):
        game.offers(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="N"):
        fp.bon_choice_probabilities([0.5, 0.5], [0.0, 1.0], 0)
    with pytest.raises(ValueError, match="rollouts"):
        fp.simulated_utility(game, seller, np.zeros((1, 2)), 0, np.random.default_rng())
    with pytest.raises(ValueError, match="weight"):
        fp.pseudo_data(game, game.threshold_model(0.3), -1.0)
    with pytest.raises(ValueError, match="steepness"):
        fp.Seller(steepness=0.0)
    with pytest.raises(ValueError, match="floor"):
        fp.Seller(theta0=0.2, floor=0.3)
    with pytest.raises(ValueError, match="weights"):
        fp.Partner(weights=(0.5, -0.1))
    with pytest.raises(ValueError, match="coefficients"):
        fp.LogisticModel(np.zeros(3)).accept_probability(game, game.offers(np.zeros((1, 2))))
    with pytest.raises(ValueError, match="uniforms"):
        fp.play_episode(game, seller, np.array([0.5, 0.0]), np.zeros(3))


# --- reactive sellers, forgetting beliefs and regret ---------------------------------------------


REACTIVE = {"tft": fp.TitForTat(), "fairness": fp.Fairness(), "hedge": fp.HedgeSeller()}


@pytest.mark.parametrize("name", sorted(REACTIVE))
def test_fixed_strategy_values_match_a_step_by_step_loop(name):
    game, seller = fp.PriceGame(), REACTIVE[name]
    strategies = fp.strategy_grid(game, 5)
    totals = fp.fixed_strategy_values(game, seller, strategies, 7)
    for i in (0, 7, 24):
        state, total = seller.initial(1), 0.0
        for _ in range(7):
            mix = seller.current(state)
            total += fp.expected_utility(game, mix, strategies[i:i + 1])[0]
            state = seller.update(state, game, game.offers(strategies[i:i + 1]))
        assert total == pytest.approx(totals[i], abs=1e-12)


def test_reactive_sellers_react_as_their_personas_say():
    game = fp.PriceGame()
    lowball, fair = game.offers(np.array([[0.2, 0.05]])), game.offers(np.array([[0.5, 0.0]]))
    tft = fp.TitForTat()
    assert tft.update(tft.initial(1), game, lowball)[0] == 0  # retaliates: hard type
    assert tft.update(np.zeros(1, int), game, fair)[0] == 1  # cooperates again
    fair_seller, state = fp.Fairness(), fp.Fairness().initial(1)
    for _ in range(6):
        state = fair_seller.update(state, game, lowball)
    assert state[0] == fair_seller.levels  # the grudge saturates
    assert fair_seller.update(state, game, fair)[0] == fair_seller.levels - 1
    hedge = fp.HedgeSeller()
    state = hedge.initial(1)
    for _ in range(10):
        state = hedge.update(state, game, game.offers(np.array([[0.5, 0.1]])))
    assert np.argmax(hedge.weights(state)[0]) == len(hedge.theta0s) - 1  # learns to hold out
    np.testing.assert_allclose(hedge.weights(state).sum(axis=1), 1.0)


def test_seller_surplus_by_brute_force():
    game, seller = fp.PriceGame(rounds=3), fp.Seller(theta0=0.6, beta=1.0)
    offers = game.offers(np.array([[0.4, 0.1]]))
    p = seller.accept_probability(game, offers)[0]
    x = offers[0, :, 0]
    brute = 0.0
    for outcome in itertools.product([0, 1], repeat=3):
        prob = np.prod([p[h] if o else 1 - p[h] for h, o in enumerate(outcome)])
        if any(outcome):
            brute += prob * (x[outcome.index(1)] - seller.floor)
    assert fp.seller_surplus(game, seller, offers)[0] == pytest.approx(brute, abs=1e-12)


def test_regret_definitions():
    game, seller = fp.PriceGame(), fp.TitForTat()
    grid = fp.strategy_grid(game, 9)
    run = fp.run_repeated(game, seller, "sfp", episodes=8, n_candidates=8, seed=3,
                          prior=game.threshold_model(0.3))
    assert run.mixtures.shape == (8, 2)
    # the expected utilities are those of the played strategies against the realised mixtures
    values = fp.type_values(game, seller, run.strategies)
    np.testing.assert_allclose(run.expected, (values * run.mixtures).sum(axis=1), atol=1e-12)
    external = fp.regret(game, seller, run, grid)
    manual = max(sum(fp.expected_utility(game, fp.Mixture(seller.types, w), s[None])[0]
                     for w in run.mixtures) for s in grid) - run.expected.sum()
    assert external == pytest.approx(manual / 8, abs=1e-12)
    policy = fp.regret(game, seller, run, grid, kind="policy")
    best = fp.fixed_strategy_values(game, seller, grid, 8).max()
    assert policy == pytest.approx((best - run.expected.sum()) / 8, abs=1e-12)
    with pytest.raises(ValueError, match="kind"):
        fp.regret(game, seller, run, grid, kind="swap")
    stationary = fp.run_repeated(game, fp.Seller(), "sfp", episodes=3, n_candidates=4, seed=0)
    with pytest.raises(ValueError, match="reactive"):
        fp.regret(game, seller, stationary, grid)


def test_forgetting_beliefs_reduce_to_the_known_ones():
    game, opp = fp.PriceGame(), fp.Switching((fp.Seller(), fp.Seller(0.55, 2.0)), period=2)
    prior = game.threshold_model(0.3)
    kw = dict(episodes=10, n_candidates=8, seed=5, prior=prior)
    sfp = fp.run_repeated(game, opp, "sfp", **kw)
    assert np.array_equal(fp.run_repeated(game, opp, "discount", discount=1.0, **kw).utilities,
                          sfp.utilities)
    assert np.array_equal(fp.run_repeated(game, opp, "window", window=10, **kw).utilities,
                          sfp.utilities)
    last = fp.run_repeated(game, opp, "last", **kw)
    window1 = fp.run_repeated(game, opp, "window", window=1, **kw)
    for a, b in zip(last.coefs, window1.coefs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="discount"):
        fp.run_repeated(game, opp, "discount", discount=0.0, **kw)
    with pytest.raises(ValueError, match="window"):
        fp.run_repeated(game, opp, "window", window=0, **kw)


def test_mixture_picks_by_inverse_cdf_and_rejects_bad_weights():
    types = (fp.Seller(0.5, 1.0), fp.Seller(0.7, 1.0))
    mix = fp.Mixture(types, np.array([0.25, 0.75]))
    assert mix.pick(0.1) is types[0] and mix.pick(0.3) is types[1]
    with pytest.raises(ValueError, match="probability"):
        fp.Mixture(types, np.array([0.5, 0.6]))


# --- the in-context opponent model -------------------------------------------------------------


def _episodes(n=6, episodes=4, seed=0):
    game = fp.PriceGame()
    theta = np.broadcast_to(np.where(np.arange(episodes) < episodes // 2, 0.75, 0.55),
                            (n, episodes))
    beta = np.broadcast_to(np.where(np.arange(episodes) < episodes // 2, 0.7, 2.0), (n, episodes))
    return game, ic.simulate_episodes(game, np.random.default_rng(seed), theta, beta)


def test_streams_are_left_aligned_and_reorder_whole_episodes():
    game, eps = _episodes()
    x, h, y, valid = ic.stream(game, eps)
    counts = eps.seen.sum(axis=(1, 2))
    assert np.array_equal(valid.sum(axis=1), counts)
    assert all(valid[i, :c].all() and not valid[i, c:].any() for i, c in enumerate(counts))
    # an episode ends at its first accept: every episode holds at most one accept, at its end
    assert np.all(eps.y.sum(axis=2) <= 1)
    rx, rh, ry, rv = ic.stream(game, eps, order=[2, 3, 0, 1])
    assert np.array_equal(rv.sum(axis=1), counts)
    first = eps.seen[0, 2].sum()
    assert np.allclose(rx[0, :first], eps.x[0, 2][eps.seen[0, 2]])
    assert np.array_equal(rh[0, :first], np.arange(first))


def test_attention_mask_sees_only_the_past():
    valid = torch.tensor([[True, True, True, False]])
    mask = ic.attention_mask(valid, np.array([0, 1, 2, 3, 3]))[0, 0]
    L = 4
    for t in range(3):  # the query of observation t sees observations before t, and itself
        assert mask[L + t, :L].tolist() == [j < t for j in range(L)]
        assert mask[L + t, L:].tolist() == [k == t for k in range(5)]
    assert mask[L + 4, :L].tolist() == [True, True, True, False]  # a probe: every valid one
    assert mask[1, :L].tolist() == [True, True, False, False]


def test_in_context_model_is_causal_and_probes_are_independent():
    game, eps = _episodes(n=3)
    model = ic.InContextEnsemble(game, 2, length=20, d_model=16, seed=1)
    x, h, y, valid = ic.stream(game, eps)
    with torch.no_grad():
        full = model(*(np.broadcast_to(a, (2,) + a.shape) for a in (x, h, y, valid, x, h)),
                     np.arange(x.shape[1]))
        y2 = y.copy()
        y2[:, 3:] = 1 - y2[:, 3:]  # change observations 3.. : predictions of 0..3 must not move
        moved = model(*(np.broadcast_to(a, (2,) + a.shape) for a in (x, h, y2, valid, x, h)),
                      np.arange(x.shape[1]))
    assert torch.allclose(full[..., :4], moved[..., :4])
    assert not torch.allclose(full[..., 5:], moved[..., 5:])
    px, ph = np.array([0.4, 0.6, 0.7]), np.array([0, 2, 4])
    together = ic.beliefs(model, x, h, y, valid, px, ph)
    alone = ic.beliefs(model, x, h, y, valid, px[1:2], ph[1:2])
    assert np.allclose(together[..., 1:2], alone, atol=1e-6)
    assert together.shape == (2, 3, 3) and np.all((together > 0) & (together < 1))


def test_recency_index_of_known_beliefs():
    qa, qb = np.array([0.1, 0.5, 0.9]), np.array([0.6, 0.9, 1.0])
    mix = 0.5 * (qa + qb)
    assert np.isclose(ic.recency_index(mix, mix, qa, qb), 0.0)
    assert np.isclose(ic.recency_index(qb, qa, qa, qb), 1.0)
    gamma, K = 0.8, 3  # a belief linear in discounted weights: (1 - g^K) / (1 + g^K)
    share = 1 / (1 + gamma**K)
    ab, ba = share * qb + (1 - share) * qa, share * qa + (1 - share) * qb
    assert np.isclose(ic.recency_index(ab, ba, qa, qb), (1 - gamma**K) / (1 + gamma**K))
    with pytest.raises(ValueError, match="differ"):
        ic.recency_index(ab, ba, qa, qa)


def test_incontext_inputs_are_checked():
    game, eps = _episodes(n=4, episodes=3)
    with pytest.raises(ValueError, match="order"):
        ic.stream(game, eps, order=[0, 1, 5])
    with pytest.raises(ValueError, match="shape"):
        ic.simulate_episodes(game, np.random.default_rng(0), np.full(3, 0.6), np.ones(3))
    with pytest.raises(ValueError, match="multiple of heads"):
        ic.InContextEnsemble(game, 2, length=6, d_model=10, heads=4)
    model = ic.InContextEnsemble(game, 2, length=6, d_model=8)
    with pytest.raises(ValueError, match="hazard"):
        ic.meta_train(model, np.random.default_rng(0), steps=1, batch=2, episodes=2,
                      hazard=[0.0, 1.5])


def test_time_averaged_logistic_belief_ignores_order_and_forgetting_does_not():
    game, eps = _episodes(n=16, episodes=6)
    px, ph = np.linspace(0.35, 0.8, 5), np.array([0, 1, 2, 3, 4])
    qa, qb = (fp.sigmoid((px - s.thresholds(5)[ph]) / 0.03)
              for s in (fp.Seller(0.75, 0.7), fp.Seller(0.55, 2.0)))
    orders = (np.arange(6), np.r_[3, 4, 5, 0, 1, 2])
    prior = game.threshold_model(0.3)
    rho = {}
    for name, w in {"all": np.ones(6), "window3": np.r_[0, 0, 0, 1.0, 1.0, 1.0]}.items():
        ab, ba = (ic.logistic_beliefs(game, eps, o, w, px, ph, prior=prior) for o in orders)
        rho[name] = ic.recency_index(ab, ba, qa, qb)
    assert np.max(np.abs(rho["all"])) < 1e-5
    assert rho["window3"].mean() > 0.3


def test_meta_training_is_deterministic_and_lowers_the_loss():
    game = fp.PriceGame()

    def run():
        model = ic.InContextEnsemble(game, 2, length=20, d_model=16, seed=0)
        torch.manual_seed(0)
        return ic.meta_train(model, np.random.default_rng(0), steps=30, batch=8, episodes=4,
                             hazard=[0.0, 0.3])

    first, second = run(), run()
    assert first.shape == (30, 2) and np.array_equal(first, second)
    assert np.all(first[-5:].mean(axis=0) < first[:5].mean(axis=0))


# --- alternating offers (counter-offers) ------------------------------------------------------

AO = fp.bargaining


def test_alternating_offers_exact_utility_matches_monte_carlo():
    game, types = AO.AlternatingGame(), AO.SellerTypes()
    rng = np.random.default_rng(0)
    plans = game.sample_strategies(rng, 4)
    exact = AO.type_utilities(game, types, plans)
    assert exact.shape == (4, types.n_types)
    for i, plan in enumerate(plans):
        for k in range(types.n_types):
            u = AO.simulate_utility(game, types, plan, k, 40000, rng)
            assert abs(u.mean() - exact[i, k]) < 5 * u.std(ddof=1) / np.sqrt(u.size) + 1e-9


def test_plan_utility_special_cases():
    game = AO.AlternatingGame(rounds=3, discount=0.5)
    x = np.array([[0.2, 0.3, 0.4]])
    # a seller that always accepts: the first offer is the deal
    u = AO.plan_utility(game, x, np.array([0.5]), np.ones((1, 3)), np.full((1, 3), 0.9), 0.05)
    assert np.isclose(u[0], 0.8)
    # a seller that never accepts and counters far above the threshold: no deal
    u = AO.plan_utility(game, x, np.array([0.3]), np.zeros((1, 3)), np.full((1, 3), 0.95), 0.01)
    assert abs(u[0]) < 1e-12
    # never accepts, counters far below the threshold: the first counter is taken
    u = AO.plan_utility(game, x, np.array([0.9]), np.zeros((1, 3)), np.full((1, 3), 0.4), 0.001)
    assert np.isclose(u[0], 0.6, atol=1e-6)


def test_self_simulation_mirrors_the_buyer():
    game = AO.AlternatingGame(rounds=1)
    plan = np.array([[0.3, 0.0, 0.8]])
    # mirrored around 0.5 the copy accepts offers above 2*0.5 - 0.8 = 0.2: the offer 0.3 goes
    high = AO.selfsim_utilities(game, plan, 0.5, 0.001, 0.05)
    assert np.isclose(high[0], 0.7, atol=1e-6)
    # around 0.55 it accepts above 0.3 = the offer (half the time, price 0.3) and otherwise
    # counters at 1.1 - 0.3 = 0.8 = a (taken half the time): 0.5 * 0.7 + 0.25 * 0.2
    mid = AO.selfsim_utilities(game, plan, 0.55, 0.001, 0.001)
    assert np.isclose(mid[0], 0.4, atol=0.01)
    # around 0.7 it wants more than 0.6 and counters above a: no deal
    assert abs(AO.selfsim_utilities(game, plan, 0.7, 0.001, 0.001)[0]) < 1e-9


def test_type_posterior_concentrates_and_redraw_belief_returns_to_prior():
    game, types = AO.AlternatingGame(), AO.SellerTypes()
    seeds = [[5, r] for r in range(24)]
    run = AO.run_bargaining(game, types, "sfp", seeds=seeds, episodes=12)
    true = AO.seller_sequence(types, seeds, 12, False)[:, 0]
    assert run.beliefs.shape == (24, 12, 3)
    assert np.allclose(run.beliefs.sum(-1), 1)
    assert run.beliefs[np.arange(24), -1, true].mean() > 0.8
    redraw = AO.run_bargaining(game, types, "sfp", seeds=seeds, episodes=12, redraw=True)
    assert np.abs(redraw.beliefs[:, -1].mean(0) - 1 / 3).max() < 0.1
    seq = AO.seller_sequence(types, seeds, 12, True)
    assert np.any(seq != seq[:, :1])


def test_bargaining_agents_share_candidates_and_order_as_expected():
    game, types = AO.AlternatingGame(), AO.SellerTypes()
    seeds = [[6, r] for r in range(32)]
    u = {m: AO.run_bargaining(game, types, m, seeds=seeds, episodes=10).mean()
         for m in AO.AO_METHODS}
    assert u["oracle"].mean() >= u["sfp"].mean() > u["prior"].mean() > u["base"].mean()
    # with one candidate every agent plays the same plan
    one = [AO.run_bargaining(game, types, m, seeds=seeds[:4], episodes=5, n_candidates=1)
           for m in AO.AO_METHODS]
    for run in one[1:]:
        assert np.array_equal(run.expected, one[0].expected)
    best, means = AO.tune(game, types, "judge", "bandwidth", (0.1, 0.3), seeds=seeds[:4],
                          episodes=5)
    assert best in (0.1, 0.3) and means.shape == (2,)


def test_judge_from_the_prior_tends_to_the_prior_agent():
    game, types = AO.AlternatingGame(), AO.SellerTypes()
    seeds = [[7, r] for r in range(8)]
    prior = AO.run_bargaining(game, types, "prior", seeds=seeds, episodes=6)
    wide = AO.run_bargaining(game, types, "judgeprior", seeds=seeds, episodes=6, bandwidth=1e6)
    assert np.allclose(wide.expected, prior.expected)
    narrow = AO.run_bargaining(game, types, "judgeprior", seeds=seeds, episodes=6,
                               bandwidth=0.05)
    assert np.array_equal(narrow.expected[:, 0], prior.expected[:, 0])  # same first pick
    # the mirror shift moves what self-simulation picks
    a, b = (AO.run_bargaining(game, types, "selfsim", seeds=seeds, episodes=6, mirror_shift=d)
            for d in (-0.15, 0.15))
    assert not np.array_equal(a.expected, b.expected)


def test_misspecified_sellers_play_their_own_types():
    game, types = AO.AlternatingGame(), AO.SellerTypes()
    seeds = [[8, r] for r in range(12)]
    same = AO.run_bargaining(game, types, "sfp", seeds=seeds, episodes=5, seller_types=types)
    default = AO.run_bargaining(game, types, "sfp", seeds=seeds, episodes=5)
    assert np.array_equal(same.expected, default.expected)
    off = AO.SellerTypes(theta0=(0.7, 0.62, 0.52, 0.4), beta=(0.8, 1.6, 0.7, 2.5),
                         markup=(0.15, 0.06, 0.12, 0.08))
    oracle = AO.run_bargaining(game, types, "oracle", seeds=seeds, episodes=5, seller_types=off)
    sellers = AO.seller_sequence(off, seeds, 5, False)
    pool = np.array([game.sample_strategies(np.random.default_rng([*s, 12]), (5, 64))
                     for s in seeds])[:, :, :16]
    best = AO.type_utilities(game, off, pool).max(axis=2)  # (R, T, J) best over candidates
    assert np.allclose(oracle.expected, np.take_along_axis(best, sellers[:, :, None], 2)[..., 0])


def test_bargaining_inputs_are_checked():
    game, types = AO.AlternatingGame(), AO.SellerTypes()
    with pytest.raises(ValueError, match="method"):
        AO.run_bargaining(game, types, "nope", seeds=[0], episodes=2)
    with pytest.raises(ValueError, match="prior"):
        AO.run_bargaining(game, types, "sfp", seeds=[0], episodes=2, prior=[0.5, 0.5])
    with pytest.raises(ValueError, match="prior_weight"):
        AO.run_bargaining(game, types, "sfp", seeds=[0], episodes=2, prior_weight=0)
    with pytest.raises(ValueError, match="replicate seed"):
        AO.run_bargaining(game, types, "sfp", seeds=[], episodes=2)
    with pytest.raises(ValueError, match="discount"):
        AO.AlternatingGame(discount=0)
    with pytest.raises(ValueError, match="one entry per type"):
        AO.SellerTypes(theta0=(0.8, 0.6), beta=(1.0,), markup=(0.1, 0.1))
    with pytest.raises(ValueError, match="plans"):
        game.offers(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="grid"):
        AO.tune(game, types, "sfp", "prior_weight", (), seeds=[0], episodes=2)
    with pytest.raises(ValueError, match="one type per row"):
        AO.play(game, types, np.zeros((2, 3)), np.zeros(3, dtype=int), np.zeros((2, 3)),
                np.zeros((2, 3)))
