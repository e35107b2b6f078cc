"""Exercise rabit-ex-scale: the output-error-optimal scalar scale."""

import torch

OK_FORMAT = False
name = "rabit-ex-scale"
points = 2


def test_minimises_the_output_error(output_optimal_scale):
    generator = torch.Generator().manual_seed(3)
    for n in (5, 40):
        w = torch.randn(n, generator=generator, dtype=torch.float64)
        b = torch.where(w >= 0, 1.0, -1.0).to(torch.float64)
        A = torch.randn(n, n, generator=generator, dtype=torch.float64)
        sigma = A @ A.T / n + 0.1 * torch.eye(n, dtype=torch.float64)
        alpha = float(output_optimal_scale(w, b, sigma))
        grid = torch.linspace(alpha - 0.5, alpha + 0.5, 2001, dtype=torch.float64)
        errors = torch.stack([(w - a * b) @ sigma @ (w - a * b) for a in grid])
        assert abs(grid[errors.argmin()].item() - alpha) <= 1e-3, (n, alpha)


def test_identity_covariance_gives_mean_absolute_value(output_optimal_scale):
    w = torch.tensor([0.3, -1.2, 0.5, -0.1], dtype=torch.float64)
    b = torch.sign(w)
    alpha = float(output_optimal_scale(w, b, torch.eye(4, dtype=torch.float64)))
    assert abs(alpha - w.abs().mean().item()) < 1e-12
