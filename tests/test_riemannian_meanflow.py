"""Tests for icml26.riemannian_meanflow: geometry against geoopt and flow_matching, identities on
an analytic flow, bad input, the samplers and the losses."""

import math

import geoopt
import numpy as np
import pytest
import torch
from torch.func import jvp

import icml26.riemannian_meanflow as rm

F64 = torch.float64


def _tangent(x, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return rm.proju(x, scale * torch.randn(x.shape, generator=g, dtype=x.dtype))


@pytest.fixture
def points():
    return rm.uniform_sphere(200, seed=1), rm.uniform_sphere(200, seed=2)


def test_exp_and_log_agree_with_geoopt(points):
    x, y = points
    sphere = geoopt.Sphere()
    for scale in (1e-9, 1e-3, 0.5, 2.0):
        u = _tangent(x, scale, 3)
        assert torch.allclose(rm.expmap(x, u), sphere.expmap(x, u), atol=1e-12)
    assert torch.allclose(rm.logmap(x, y), sphere.logmap(x, y), atol=1e-10)
    assert torch.allclose(rm.dist(x, y), sphere.dist(x, y), atol=1e-10)


def test_exp_log_round_trip_and_distance(points):
    x, y = points
    log = rm.logmap(x, y)
    assert torch.allclose(rm.expmap(x, log), y, atol=1e-12)
    assert torch.allclose(log.norm(dim=-1), torch.arccos((x * y).sum(-1).clamp(-1, 1)), atol=1e-10)
    assert torch.allclose((x * log).sum(-1), torch.zeros(len(x), dtype=F64), atol=1e-12)


def test_geodesic_path_matches_flow_matching_library(points):
    from flow_matching.path import GeodesicProbPath
    from flow_matching.path.scheduler import CondOTScheduler
    from flow_matching.utils.manifolds import Sphere

    x0, x1 = points
    t = torch.rand(len(x0), generator=torch.Generator().manual_seed(5), dtype=F64) * 0.98
    sample = GeodesicProbPath(CondOTScheduler(), Sphere()).sample(x_0=x0, x_1=x1, t=t)
    xt = rm.geodesic(x0, x1, t)
    assert torch.allclose(xt, sample.x_t, atol=1e-9)
    assert torch.allclose(rm.conditional_velocity(xt, x1, t), sample.dx_t, atol=1e-7)


def test_dlog_jvp_matches_the_jacobi_closed_form(points):
    x, y = points
    v = _tangent(x, 1.0, 7)
    keep = (x * y).sum(-1) > -0.99  # away from the cut locus
    x, y, v = x[keep], y[keep], v[keep]
    _, dlog = jvp(lambda z: rm.logmap(z, y), (x,), (v,))
    assert torch.allclose(-rm.proju(x, dlog), rm.dlog_closed_form(x, y, v), atol=1e-8)
    # at y = x the derivative is exactly -v (the Euclidean value), with no NaN
    _, at_zero = jvp(lambda z: rm.logmap(z, x), (x,), (v,))
    assert torch.allclose(rm.proju(x, at_zero), -v, atol=1e-12)


def test_identities_hold_on_the_rotation_flow():
    flow = rm.RotationFlow()
    x = rm.uniform_sphere(100, seed=11)
    g = torch.Generator().manual_seed(12)
    t = torch.rand(100, generator=g, dtype=F64) * 0.5
    s = t + torch.rand(100, generator=g, dtype=F64) * 0.5
    u, target = rm.eulerian_target(flow.average_velocity, x, t, s, flow.velocity(x, t))
    assert (u - target).norm(dim=-1).max() < 1e-10
    r = s + (1 - s) * torch.rand(100, generator=g, dtype=F64)
    assert rm.semigroup_residual(flow.average_velocity, x, t, s, r).max() < 1e-12
    # the exact average velocity reproduces the exact flow map in any number of jumps
    assert torch.allclose(rm.flow_map_from_velocity(flow.average_velocity, x, t, s),
                          flow.flow(x, t, s), atol=1e-12)


def test_eulerian_identity_fails_for_a_wrong_velocity():
    """The check can fail: the average velocity of one field does not solve the identity of
    another, and dropping the log-derivative term (the Euclidean shortcut) also breaks it."""
    flow = rm.RotationFlow()
    x = rm.uniform_sphere(50, seed=13)
    t, s = torch.full((50,), 0.1, dtype=F64), torch.full((50,), 0.9, dtype=F64)
    v = flow.velocity(x, t)
    u, target = rm.eulerian_target(flow.average_velocity, x, t, s, 1.2 * v)
    assert (u - target).norm(dim=-1).max() > 1e-2
    u, du_dt = jvp(lambda z, tt: flow.average_velocity(z, tt, s), (x, t), (v, torch.ones_like(t)))
    euclidean = v + (s - t)[:, None] * rm.proju(x, du_dt)
    assert (u - euclidean).norm(dim=-1).max() > 1e-3


def test_boundary_condition_average_velocity_tends_to_velocity():
    flow = rm.RotationFlow()
    x = rm.uniform_sphere(20, seed=14)
    errors = []
    for h in (1e-2, 1e-3, 1e-4):
        u = flow.average_velocity(x, 0.3, 0.3 + h)
        errors.append(float((u - flow.velocity(x, 0.3)).norm(dim=-1).max()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[1] / errors[2] == pytest.approx(10, rel=0.2)  # first order in h


def test_bad_input_raises_clear_errors():
    x = rm.uniform_sphere(4, seed=0)
    with pytest.raises(ValueError, match="off the unit sphere"):
        rm.expmap(2 * x, torch.zeros_like(x))
    with pytest.raises(ValueError, match="not tangent"):
        rm.expmap(x, x)
    with pytest.raises(ValueError, match="antipodal"):
        rm.logmap(x, -x)
    assert torch.equal(rm.logmap(x, -x, at_cut="zero"), torch.zeros_like(x))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rm.geodesic(x, x, 1.5)
    with pytest.raises(ValueError, match="t < 1"):
        rm.conditional_velocity(x, x, 1.0)
    model = rm.FlowMapNet(hidden=8, depth=1).double()
    with pytest.raises(ValueError, match="s >= t"):
        model.flow_map(x, 0.6, 0.2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        model.flow_map(x, -0.1, 0.2)
    with pytest.raises(TypeError):
        rm.expmap(x.numpy(), x.numpy())
    with pytest.raises(ValueError):
        rm.FlowMapNet(head="other")
    with pytest.raises(ValueError):
        rm.train(rm.spiral(10), "unknown")
    with pytest.raises(ValueError):
        rm.sample_guided(model, x, 2, lambda z: z[:, 0], 1.0, mode="sideways")
    flow = rm.RotationFlow()
    t, s = torch.full((4,), 0.2, dtype=F64), torch.full((4,), 0.7, dtype=F64)
    with pytest.raises(ValueError, match="not tangent"):
        rm.eulerian_target(flow.average_velocity, x, t, s, x)
    with pytest.raises(ValueError, match="s >= t"):
        rm.eulerian_target(flow.average_velocity, x, s, t, flow.velocity(x, s))
    with pytest.raises(ValueError, match="off the unit sphere"):
        rm.flow_map_from_velocity(flow.average_velocity, 1.5 * x, t, s)


def test_zero_tangent_vectors_are_finite_under_forward_mode():
    x = rm.uniform_sphere(5, seed=0)
    zero = torch.zeros_like(x)
    direction = _tangent(x, 1.0, 1)
    y, dy = jvp(lambda u: rm.expmap(x, u), (zero,), (direction,))
    assert torch.equal(y, x) and torch.isfinite(dy).all()
    assert torch.allclose(dy, direction, atol=1e-12)  # d exp_x at 0 is the identity
    y = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(rm.sq_dist(x, y).sum(), y)
    assert torch.isfinite(grad).all() and grad.abs().max() < 1e-12  # d^2 is flat at y = x


def test_vmf_sampler_has_the_closed_form_mean_cosine():
    kappa, n = 8.0, 20000
    mu = rm.VMF_MEANS[0]
    x = rm.sample_vmf(mu, kappa, n, torch.Generator().manual_seed(0))
    x, mu = x.numpy(), mu.numpy()
    cosines = x @ mu
    exact = 1 / math.tanh(kappa) - 1 / kappa
    assert abs(cosines.mean() - exact) < 4 * cosines.std() / math.sqrt(n)
    tangent = x - np.outer(cosines, mu)
    assert np.abs(tangent.mean(0)).max() < 4 / math.sqrt(n)  # isotropic around mu


def test_mmd_is_a_metric_on_samples():
    a, b = rm.spiral(600, seed=0), rm.spiral(600, seed=1)
    far = rm.vmf_mixture(600, seed=2)
    assert rm.mmd(a, a) == pytest.approx(0, abs=1e-7)
    assert rm.mmd(a, b) < rm.mmd(a, far)
    gram = rm.vmf_kernel(a[:300], a[:300]).numpy()
    assert np.linalg.eigvalsh(gram).min() > -1e-9  # positive definite kernel


def test_losses_are_finite_and_train_every_parameter():
    data = rm.spiral(256, seed=0, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    batch = rm.make_batch(data, g)
    for head in ("velocity", "endpoint"):
        model = rm.FlowMapNet(hidden=16, depth=2, head=head)
        for loss in rm.LOSSES.values():
            model.zero_grad()
            value = loss(model, batch)
            value.backward()
            assert torch.isfinite(value)
            assert all(p.grad is not None and torch.isfinite(p.grad).all()
                       for p in model.parameters())


def test_eulerian_loss_vanishes_for_the_exact_average_velocity():
    """With the true marginal velocity (not the conditional one) the exact flow has zero loss."""
    flow = rm.RotationFlow()
    x = rm.uniform_sphere(30, seed=3)
    t = torch.full((30,), 0.2, dtype=F64)
    s = torch.full((30,), 0.8, dtype=F64)
    u, target = rm.eulerian_target(flow.average_velocity, x, t, s, flow.velocity(x, t))
    assert float(((u - target) ** 2).sum(-1).mean()) < 1e-20


def test_samplers_stay_on_the_sphere_and_guidance_zero_is_unguided():
    torch.manual_seed(0)
    model = rm.FlowMapNet(hidden=16, depth=2)
    x0 = rm.uniform_sphere(50, seed=4).float()
    for sampler in (rm.sample_flow_map, rm.sample_euler):
        out = sampler(model, x0, 3)
        assert torch.allclose(out.norm(dim=-1), torch.ones(50), atol=1e-5)
    plain = rm.sample_flow_map(model, x0, 2)
    m = rm.VMF_MEANS[1].float()
    unguided = rm.sample_guided(model, x0, 2, lambda z: z @ m, 0.0, mode="lookahead")
    assert torch.allclose(plain, unguided, atol=1e-6)
    pulled = rm.sample_guided(model, x0, 2, lambda z: z @ m, 2.0, mode="current")
    assert (pulled @ m).mean() > (plain @ m).mean()


def test_training_is_reproducible_and_reduces_the_loss():
    data = rm.spiral(512, seed=0, dtype=torch.float32)
    a = rm.train(data, "rfm", steps=60, batch_size=64, seed=3, hidden=32, depth=2)
    b = rm.train(data, "rfm", steps=60, batch_size=64, seed=3, hidden=32, depth=2)
    assert np.array_equal(a.losses, b.losses)
    assert a.losses[-20:].mean() < a.losses[:20].mean()


def test_time_samplers_have_the_stated_distributions():
    """Flow-matching times are uniform (KS test), boundary rows come at the stated rate (binomial
    bound), and semigroup triples are midpoints at least ``min_gap`` apart without boundary rows."""
    from scipy import stats

    data = rm.spiral(4000, seed=0, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    fm = rm.make_batch(data, g, boundary_ratio=1.0)
    assert torch.equal(fm.t, fm.s) and torch.equal(fm.t_fm, fm.t)
    assert stats.kstest(fm.t.double().numpy(), "uniform").pvalue > 1e-3
    eul = rm.make_batch(data, g, boundary_ratio=0.75)
    n_boundary = int((eul.s == eul.t).sum())
    assert stats.binomtest(n_boundary, len(data), 0.75).pvalue > 1e-3
    assert bool((eul.s >= eul.t).all())
    three = rm.make_batch(data, g, boundary_ratio=0.0, times="three")
    assert bool((three.r - three.t >= 0.01 - 1e-6).all()) and bool((three.r <= 1).all())
    assert torch.allclose(three.s, (three.t + three.r) / 2)
    # the flow-matching term of the semigroup loss gets its own uniform time, independent of t
    assert stats.kstest(three.t_fm.double().numpy(), "uniform").pvalue > 1e-3
    assert abs(stats.pearsonr(three.t_fm.numpy(), three.t.numpy())[0]) < 4 / math.sqrt(len(data))
    with pytest.raises(ValueError, match="times"):
        rm.make_batch(data, g, times="four")
    with pytest.raises(ValueError, match="boundary_ratio"):
        rm.make_batch(data, g, boundary_ratio=1.5)


def test_batch_paths_match_the_geodesic_and_its_velocity():
    data = rm.vmf_mixture(300, seed=2, dtype=torch.float32)
    batch = rm.make_batch(data, torch.Generator().manual_seed(3), boundary_ratio=0.0,
                          times="three")
    x0, x1 = batch.x0.double(), batch.x1.double()
    for t, xt, v in ((batch.t, batch.xt, batch.v), (batch.t_fm, batch.xt_fm, batch.v_fm)):
        t = t.double()
        expected = rm.geodesic(x0, x1, t)
        assert torch.allclose(xt.double(), expected, atol=1e-5)
        assert torch.allclose(v.double(), rm.conditional_velocity(expected, x1, t), atol=1e-3)


def test_semigroup_loss_is_flow_matching_plus_a_nonnegative_term():
    """RMF's loss contains exactly the RFM baseline's loss: the difference is the semigroup term,
    which vanishes for the exact flow map and is positive for an untrained network."""
    data = rm.spiral(256, seed=0, dtype=torch.float32)
    batch = rm.make_batch(data, torch.Generator().manual_seed(4), boundary_ratio=0.0,
                          times="three")
    torch.manual_seed(0)
    model = rm.FlowMapNet(hidden=16, depth=2)
    extra = rm.semigroup_loss(model, batch) - rm.flow_matching_loss(model, batch)
    assert extra.item() > 0


def test_rfm_training_uses_only_boundary_rows():
    assert rm.TIME_SETTINGS["rfm"] == ("pair", 1.0)
    assert rm.TIME_SETTINGS["semigroup"][0] == "three"


def test_matched_norm_lookahead_has_the_current_state_norm():
    """With one jump, x_out = exp_x(u + eta g), so log_x(x_out) - u recovers eta g: its norm must
    equal the norm of the current-state vector P_x m when match_norm is set."""
    torch.manual_seed(1)
    model = rm.FlowMapNet(hidden=16, depth=2).double()
    x0 = rm.uniform_sphere(40, seed=6)
    m = rm.VMF_MEANS[2]
    eta = 0.3
    with torch.no_grad():
        u = model.average_velocity(x0, 0.0, 1.0)
    current_norm = rm.proju(x0, m.expand_as(x0)).norm(dim=-1)
    outs = {match: rm.sample_guided(model, x0, 1, lambda z: z @ m, eta, mode="lookahead",
                                    match_norm=match) for match in (False, True)}
    g_matched = (rm.logmap(x0, outs[True]) - u) / eta
    assert torch.allclose(g_matched.norm(dim=-1), current_norm, atol=1e-8)
    g_plain = (rm.logmap(x0, outs[False]) - u) / eta
    assert not torch.allclose(g_plain.norm(dim=-1), current_norm, atol=1e-3)
    # the direction is the look-ahead direction in both cases
    cos = (g_plain * g_matched).sum(-1) / (g_plain.norm(dim=-1) * g_matched.norm(dim=-1))
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-8)


def test_stacked_network_equals_its_units_and_the_plain_network():
    """Unit i of the stacked network is FlowMapNet under manual_seed(seeds[i]), for both heads."""
    seeds = [5, 17, 29]
    x = rm.uniform_sphere(3 * 40, seed=4).float().reshape(3, 40, 3)
    g = torch.Generator().manual_seed(0)
    t = torch.rand(3, 40, generator=g) * 0.9
    s = t + (1 - t) * torch.rand(3, 40, generator=g)
    for head in ("velocity", "endpoint"):
        stacked = rm.StackedFlowMapNet(seeds, hidden=16, depth=2, head=head)
        out = stacked.average_velocity(x, t, s)
        for i, seed in enumerate(seeds):
            torch.manual_seed(seed)
            plain = rm.FlowMapNet(hidden=16, depth=2, head=head)
            expected = plain.average_velocity(x[i], t[i], s[i])
            assert torch.allclose(out[i], expected, atol=1e-6)
            assert torch.allclose(stacked.unit(i).average_velocity(x[i], t[i], s[i]), expected,
                                  atol=1e-6)
    with pytest.raises(ValueError, match="units"):
        stacked.average_velocity(x[:2], t[:2], s[:2])
    part = stacked.subset([2, 0])
    assert torch.allclose(part.average_velocity(x[[2, 0]], t[[2, 0]], s[[2, 0]]), out[[2, 0]],
                          atol=1e-6)
    with pytest.raises(ValueError, match="indices"):
        stacked.subset([3])


def test_stacked_training_keeps_units_independent():
    """A loss of one unit gives exactly zero gradient to every other unit's weights, so the sum of
    the units' losses trains each unit as if it were alone; the trainer calls back at the
    checkpoints and checks its inputs."""
    data = torch.stack([rm.spiral(300, seed=i, dtype=torch.float32) for i in range(2)])
    model = rm.StackedFlowMapNet([1, 2], hidden=16, depth=2)
    g = torch.Generator().manual_seed(0)
    batch = rm.make_batch(data.reshape(-1, 3)[:64], g, boundary_ratio=1.0)
    batch = rm.Batch(*(f.reshape(2, 32, *f.shape[1:]) for f in (
        batch.x0, batch.x1, batch.xt, batch.v, batch.t, batch.s, batch.r, batch.t_fm,
        batch.xt_fm, batch.v_fm)))
    # loss of unit 0 only: every gradient of unit 1 is exactly zero
    err = model.velocity(batch.xt_fm, batch.t_fm)[0] - batch.v_fm[0]
    (err**2).sum().backward()
    for w in list(model.weights) + list(model.biases):
        assert w.grad[0].abs().sum() > 0
        assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))
    seen = []
    result = rm.train_stacked(data, "semigroup", [1, 2], steps=40, batch_size=32, hidden=16,
                              depth=2, checkpoints=(20, 40),
                              callback=lambda step, m: seen.append(step))
    assert np.isfinite(result.losses).all() and result.losses.shape == (40,)
    assert seen == [20, 40]
    with pytest.raises(ValueError, match="one seed per unit"):
        rm.train_stacked(data, "rfm", [1], steps=2)


def test_point_target_is_tight_and_hard_spiral_is_longer():
    point = rm.point_target(2000, seed=0)
    spread = rm.dist(point, rm.VMF_MEANS[0].expand(2000, 3))
    assert float(spread.mean()) < 0.1
    hard = rm.hard_spiral(2000, seed=0)
    assert float(hard[:, 2].min()) < float(rm.spiral(2000, seed=0)[:, 2].min())
    with pytest.raises(ValueError, match="polar"):
        rm.spiral(10, polar=(0.5, 0.2))


def test_one_euler_step_is_the_exact_flow_map_for_a_point_mass():
    """The control's premise: towards a point mass m the marginal velocity is log_x(m)/(1 - t), so
    one exponential-map Euler step from any time lands exactly on m, and the average velocity
    u_{t,1} equals the velocity v_t (nothing for a flow map to learn beyond it)."""
    x0 = rm.uniform_sphere(300, seed=3)
    m = rm.VMF_MEANS[0].expand(300, 3).contiguous()
    for t in (0.0, 0.3, 0.8):
        xt = rm.geodesic(x0, m, t)
        v = rm.conditional_velocity(xt, m, t)
        landed = rm.expmap(xt, (1 - t) * v)
        assert float(rm.dist(landed, m).max()) < 1e-7
