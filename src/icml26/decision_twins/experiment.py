"""The pendulum experiment: replicates of (data, policies, FQE, twins), trained in one batch.

Each replicate draws its own training and unseen controllers, behaviour controllers and offline
data from the true pendulum. Every twin variant (a twin class and a ranking weight, with FQE or
true values as ranking labels) is trained for every replicate; all models of one twin class are
one batched module, so a whole study costs one training loop per twin class.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from icml26.decision_twins.env import (
    OfflineData,
    check_gamma,
    check_horizon,
    collect_offline,
    reset_states,
    sample_gains,
    true_values,
)
from icml26.decision_twins.ope import fitted_q_evaluation
from icml26.decision_twins.twins import (
    BatchedTwin,
    LinearTwin,
    MLPTwin,
    check_weights,
    decision_regret,
    kendall_tau,
    one_step_loss,
    pairwise_accuracy,
    train_dt2,
    twin_values,
)


@dataclass(frozen=True)
class Config:
    """Sizes of one study; the defaults are the book tier."""

    replicates: int = 6
    n_train: int = 12
    n_unseen: int = 16
    n_behaviour: int = 3
    episodes: int = 200
    steps: int = 50
    heldout_episodes: int = 50
    noise: float = 1.0
    horizon: int = 30
    gamma: float = 0.99
    truth_starts: int = 1024
    fqe_features: int = 200
    linear_weights: tuple[float, ...] = (0.0, 0.3, 1.0, 3.0, 10.0)
    mlp_weights: tuple[float, ...] = (0.0, 1.0, 3.0)
    dt2_weight: float = 1.0
    linear_steps: int = 200
    mlp_pretrain: int = 600
    mlp_steps: int = 200
    hidden: int = 32
    n_starts: int = 32
    run_mlp: bool = True

    def __post_init__(self):
        check_horizon(self.horizon)
        check_gamma(self.gamma)
        check_weights(self.linear_weights)
        check_weights(self.mlp_weights)
        check_weights([self.dt2_weight])
        for name in ("replicates", "n_train", "n_unseen", "n_behaviour", "episodes", "steps",
                     "heldout_episodes", "truth_starts", "fqe_features", "n_starts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_train < 2 or self.n_unseen < 2:
            raise ValueError("rankings need at least two training and two unseen policies")
        if 0.0 not in self.linear_weights or self.dt2_weight not in self.linear_weights:
            raise ValueError("linear_weights must contain 0 (the MSE twin) and dt2_weight")
        if self.run_mlp and (0.0 not in self.mlp_weights
                             or self.dt2_weight not in self.mlp_weights):
            raise ValueError("mlp_weights must contain 0 (the MSE twin) and dt2_weight")


@dataclass
class Replicate:
    """One draw of policies and data, with true and FQE values of every policy."""

    train_gains: torch.Tensor
    unseen_gains: torch.Tensor
    data: OfflineData
    heldout: OfflineData
    true_train: torch.Tensor
    true_unseen: torch.Tensor
    fqe_train: torch.Tensor
    fqe_unseen: torch.Tensor


def make_replicate(seed: int, config: Config) -> Replicate:
    """Draw the controllers and the offline data of one replicate and evaluate the policies."""
    rng = np.random.default_rng(seed)
    train, unseen = sample_gains(config.n_train, rng), sample_gains(config.n_unseen, rng)
    behaviour = sample_gains(config.n_behaviour, rng)
    data = collect_offline(behaviour, config.episodes, config.steps, config.noise, rng)
    heldout = collect_offline(behaviour, config.heldout_episodes, config.steps, config.noise, rng)
    mc_starts = reset_states(config.truth_starts, rng)
    truth = true_values(torch.cat([train, unseen]), mc_starts, config.horizon, config.gamma)
    fqe = fitted_q_evaluation(data, torch.cat([train, unseen]), config.horizon, config.gamma,
                              n_features=config.fqe_features, rng=rng)
    k = config.n_train
    return Replicate(train, unseen, data, heldout, truth[:k], truth[k:], fqe[:k], fqe[k:])


@dataclass(frozen=True)
class Variant:
    """A twin trained with ranking weight ``weight`` against ``labels`` (``"fqe"`` or ``"true"``)."""

    twin: str
    weight: float
    labels: str = "fqe"

    @property
    def name(self) -> str:
        if self.weight == 0:
            return f"{self.twin} MSE"
        tag = "oracle DT²" if self.labels == "true" else "DT²"
        return f"{self.twin} {tag} λ={self.weight:g}"


@dataclass
class Study:
    """Per-variant, per-replicate metrics (arrays of length ``replicates``) and value estimates."""

    config: Config
    replicates: list[Replicate]
    metrics: dict[Variant, dict[str, np.ndarray]] = field(default_factory=dict)
    values: dict[Variant, dict[str, np.ndarray]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def metric(self, twin: str, weight: float, name: str, labels: str = "fqe") -> np.ndarray:
        return self.metrics[Variant(twin, float(weight), labels)][name]

    def proxy_metrics(self) -> dict[str, np.ndarray]:
        """Decision metrics of FQE itself (the proxy labels) on unseen and training policies."""
        out = {}
        for split in ("train", "unseen"):
            out[f"kendall_{split}"] = np.array(
                [kendall_tau(getattr(r, f"fqe_{split}"), getattr(r, f"true_{split}"))
                 for r in self.replicates])
            out[f"regret_{split}"] = np.array(
                [decision_regret(getattr(r, f"fqe_{split}"), getattr(r, f"true_{split}"))
                 for r in self.replicates])
            out[f"pairacc_{split}"] = np.array(
                [pairwise_accuracy(getattr(r, f"fqe_{split}"), getattr(r, f"true_{split}"))
                 for r in self.replicates])
        return out


def _stack(reps: list[Replicate], variants: int, attr: str, field_name: str) -> torch.Tensor:
    tensors = [getattr(getattr(r, attr), field_name) for r in reps]
    return torch.stack(tensors).repeat_interleave(variants, dim=0)


def _delta_scale(reps: list[Replicate]) -> torch.Tensor:
    deltas = torch.cat([r.data.next_states - r.data.states for r in reps])
    return deltas.std(dim=0).float()


def _evaluate(study: Study, twin: BatchedTwin, variants: list[Variant]) -> None:
    reps, config = study.replicates, study.config
    V = len(variants)
    starts = _stack(reps, V, "data", "starts")
    with torch.no_grad():
        est = {split: twin_values(twin, getattr(reps[0], f"{split}_gains") if False else None,
                                  starts, config.horizon, config.gamma)
               for split in ()}
        heldout = one_step_loss(twin, _stack(reps, V, "heldout", "states"),
                                _stack(reps, V, "heldout", "actions"),
                                _stack(reps, V, "heldout", "next_states")).numpy()
        for split in ("train", "unseen"):
            # policies differ between replicates: evaluate replicate by replicate
            est[split] = np.zeros((len(reps) * V, getattr(config, f"n_{split}")))
            for r, rep in enumerate(reps):
                values = twin_values(twin, getattr(rep, f"{split}_gains"), starts,
                                     config.horizon, config.gamma)
                est[split][r * V:(r + 1) * V] = values[r * V:(r + 1) * V].numpy()
    for v, variant in enumerate(variants):
        rows = [r * V + v for r in range(len(reps))]
        m: dict[str, np.ndarray] = {"heldout_mse": heldout[rows]}
        vals: dict[str, np.ndarray] = {}
        for split in ("train", "unseen"):
            pred = est[split][rows]
            true = np.stack([getattr(rep, f"true_{split}").numpy() for rep in reps])
            vals[split] = pred
            m[f"regret_{split}"] = np.array([decision_regret(p, t) for p, t in zip(pred, true)])
            m[f"pairacc_{split}"] = np.array([pairwise_accuracy(p, t)
                                              for p, t in zip(pred, true)])
            m[f"kendall_{split}"] = np.array([kendall_tau(p, t) for p, t in zip(pred, true)])
        study.metrics[variant] = m
        study.values[variant] = vals


def _train_batch(study: Study, twin: BatchedTwin, variants: list[Variant], steps: int,
                 generator: torch.Generator) -> None:
    """Train one batched twin: models ordered replicate-major, variant-minor. Each replicate has
    its own training policies, so the ranking term is computed replicate by replicate inside one
    loss: we train with one call per replicate sharing the optimiser-free parameters."""
    reps, config = study.replicates, study.config
    V = len(variants)
    weights = torch.tensor([v.weight for v in variants] * len(reps))
    reference = []
    for rep in reps:
        for v in variants:
            reference.append(rep.true_train if v.labels == "true" else rep.fqe_train)
    reference = torch.stack(reference)
    transitions = (_stack(reps, V, "data", "states"), _stack(reps, V, "data", "actions"),
                   _stack(reps, V, "data", "next_states"))
    gains = torch.stack([rep.train_gains for rep in reps])  # (R, P, 3)
    train_dt2(_PerModelGains(twin, gains, V), transitions, gains[0], reference, weights,
              _stack(reps, V, "data", "starts"), horizon=config.horizon, gamma=config.gamma,
              steps=steps, n_starts=config.n_starts, generator=generator)


class _PerModelGains(BatchedTwin):
    """Unused placeholder (kept private); see :func:`run_study`."""

    def __init__(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError


def run_study(seed: int, config: Config | None = None) -> Study:
    """Run the whole experiment for one outer seed; see the module docstring."""
    raise NotImplementedError


__all__ = ["Config", "Replicate", "Study", "Variant", "make_replicate", "run_study", "replace"]
