"""The pendulum experiment: replicates of (data, policies, FQE, twins), trained in one batch.

Each replicate draws its own training and unseen controllers, behaviour controllers and offline
data from the true pendulum with the cubic actuator of Eq. ``eq-dt2-actuator``; the data are
logged mostly with commands of at most ``Config.max_command`` (gentle logging: the cubic is flat
there), plus a share ``Config.full_share`` of full-range commands, so that FQE sees them.
Every twin variant (a twin class and a ranking weight, with FQE or true values as ranking
labels) is trained for every replicate; all models of one twin class are one batched module, so
a whole study costs one training loop per twin class. The falsification control repeats the
linear-twin variants on the same controllers with gymnasium's linear actuator, a system inside
the linear twin's class.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from icml26.decision_twins.env import (
    MAX_TORQUE,
    OfflineData,
    check_cubic,
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

    replicates: int = 24
    n_train: int = 12
    n_unseen: int = 16
    n_behaviour: int = 3
    episodes: int = 60
    steps: int = 50
    heldout_episodes: int = 50
    noise: float = 0.5
    explore: float = 0.5
    max_command: float = 1.0
    full_share: float = 0.1
    horizon: int = 60
    gamma: float = 0.99
    cubic: float = 1.0
    control_cubic: float = 0.0
    truth_starts: int = 512
    fqe_features: int = 150
    fqe_lengthscale: float = 2.0
    linear_weights: tuple[float, ...] = (0.0, 0.3, 1.0, 3.0)
    dt2_weight: float = 1.0
    linear_steps: int = 60
    linear_lr: float = 1e-2
    mlp_pretrain: int = 300
    mlp_steps: int = 60
    mlp_lr: float = 3e-3
    hidden: int = 32
    n_starts: int = 8
    run_mlp: bool = True
    run_control: bool = True
    seed_stride: int = 1000

    def __post_init__(self):
        check_horizon(self.horizon)
        check_gamma(self.gamma)
        check_weights(self.linear_weights)
        check_weights([self.dt2_weight])
        check_cubic(self.cubic)
        check_cubic(self.control_cubic)
        if not 0.0 <= self.full_share <= 1.0:
            raise ValueError(f"full_share must lie in [0, 1], got {self.full_share}")
        if not 0.0 < self.max_command <= MAX_TORQUE:
            raise ValueError(f"max_command must lie in (0, {MAX_TORQUE}], got {self.max_command}")
        for name in ("replicates", "n_train", "n_unseen", "n_behaviour", "episodes", "steps",
                     "heldout_episodes", "truth_starts", "fqe_features", "n_starts",
                     "seed_stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seed_stride < self.replicates:
            raise ValueError("seed_stride must be at least the number of replicates, so that "
                             "the replicates of different seeds are disjoint")
        if self.n_train < 2 or self.n_unseen < 2:
            raise ValueError("rankings need at least two training and two unseen policies")
        if 0.0 not in self.linear_weights or self.dt2_weight not in self.linear_weights:
            raise ValueError("linear_weights must contain 0 (the MSE twin) and dt2_weight")


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


def make_replicate(seed: int, config: Config, cubic: float | None = None,
                   fqe: bool = True) -> Replicate:
    """Draw the controllers and the offline data of one replicate and evaluate the policies.

    ``cubic`` (default ``config.cubic``) is the true system's actuator; the controllers, the
    behaviour controllers and the start states depend on ``seed`` only, so the control replicate
    (``cubic = config.control_cubic``) of a seed has the same controllers as its main replicate.
    ``fqe=False`` skips FQE (its values are NaN): the control trains with true-value labels only.
    """
    cubic = config.cubic if cubic is None else check_cubic(cubic)
    rng = np.random.default_rng(seed)
    train, unseen = sample_gains(config.n_train, rng), sample_gains(config.n_unseen, rng)
    behaviour = sample_gains(config.n_behaviour, rng)
    data = collect_offline(behaviour, config.episodes, config.steps, config.noise, rng, cubic,
                           config.explore, config.max_command, config.full_share)
    heldout = collect_offline(behaviour, config.heldout_episodes, config.steps, config.noise,
                              rng, cubic, config.explore, config.max_command, config.full_share)
    mc_starts = reset_states(config.truth_starts, rng)
    truth = true_values(torch.cat([train, unseen]), mc_starts, config.horizon, config.gamma,
                        cubic)
    if fqe:
        fqe = fitted_q_evaluation(data, torch.cat([train, unseen]), config.horizon, config.gamma,
                                  n_features=config.fqe_features,
                                  lengthscale=config.fqe_lengthscale, rng=rng)
    else:
        fqe = torch.full((config.n_train + config.n_unseen,), float("nan"), dtype=torch.float64)
    k = config.n_train
    return Replicate(train, unseen, data, heldout, truth[:k], truth[k:], fqe[:k], fqe[k:])


@dataclass(frozen=True)
class Variant:
    """A twin class with ranking weight ``weight``, ``labels`` ``"fqe"`` or ``"true"``, trained on
    the main system (``setting="main"``, cubic actuator) or on the control (``"control"``)."""

    twin: str
    weight: float
    labels: str = "fqe"
    setting: str = "main"

    @property
    def name(self) -> str:
        where = " (control)" if self.setting == "control" else ""
        if self.weight == 0:
            return f"{self.twin} MSE{where}"
        tag = "oracle DT²" if self.labels == "true" else "DT²"
        return f"{self.twin} {tag} λ={self.weight:g}{where}"


@dataclass
class Study:
    """Per-variant, per-replicate metrics (arrays of length ``replicates``) and value estimates."""

    config: Config
    replicates: list[Replicate]
    control: list[Replicate] = field(default_factory=list)
    metrics: dict[Variant, dict[str, np.ndarray]] = field(default_factory=dict)
    values: dict[Variant, dict[str, np.ndarray]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    logs: dict = field(default_factory=dict)

    def metric(self, twin: str, weight: float, name: str, labels: str = "fqe",
               setting: str = "main") -> np.ndarray:
        return self.metrics[Variant(twin, float(weight), labels, setting)][name]

    def proxy_metrics(self, setting: str = "main") -> dict[str, np.ndarray]:
        """Decision metrics of FQE itself (the proxy labels) on unseen and training policies."""
        if setting != "main":
            raise ValueError("FQE runs on the main replicates only (the control uses true labels)")
        reps = self.replicates
        out = {}
        for split in ("train", "unseen"):
            pairs = [(getattr(r, f"fqe_{split}").numpy(), getattr(r, f"true_{split}").numpy())
                     for r in reps]
            for name, value in _decision_metrics(pairs).items():
                out[f"{name}_{split}"] = value
        return out


def _decision_metrics(pairs) -> dict[str, np.ndarray]:
    """Regret, normalised regret (regret over the range of true values), pairwise accuracy and
    Kendall's tau of each ``(predicted, true)`` pair of value vectors."""
    pairs = list(pairs)
    regret = np.array([decision_regret(p, t) for p, t in pairs])
    spread = np.array([t.max() - t.min() for _, t in pairs])
    return {"regret": regret, "nregret": regret / np.maximum(spread, 1e-12),
            "pairacc": np.array([pairwise_accuracy(p, t) for p, t in pairs]),
            "kendall": np.array([kendall_tau(p, t) for p, t in pairs])}


def _stack(reps: list[Replicate], variants: int, attr: str, name: str) -> torch.Tensor:
    """``getattr(rep, attr).name`` stacked over replicates, repeated for each variant."""
    tensors = [getattr(getattr(r, attr), name) if name else getattr(r, attr) for r in reps]
    return torch.stack(tensors).repeat_interleave(variants, dim=0)


def _delta_scale(reps: list[Replicate]) -> torch.Tensor:
    deltas = torch.cat([r.data.next_states - r.data.states for r in reps])
    return deltas.std(dim=0).float()


def _transitions(reps: list[Replicate], V: int, attr: str = "data"):
    return tuple(_stack(reps, V, attr, name) for name in ("states", "actions", "next_states"))


def _replicates_of(study: Study, variants: list[Variant]) -> list[Replicate]:
    settings = {v.setting for v in variants}
    if len(settings) != 1:
        raise ValueError("the variants of one batched twin must share one setting")
    return study.replicates if settings.pop() == "main" else study.control


def evaluate(study: Study, twin: BatchedTwin, variants: list[Variant]) -> None:
    """Decision metrics and held-out one-step error of every model of ``twin`` (models ordered
    replicate-major, variant-minor) against the true values."""
    reps, config = _replicates_of(study, variants), study.config
    V = len(variants)
    starts = _stack(reps, V, "data", "starts")
    with torch.no_grad():
        heldout = one_step_loss(twin, *_transitions(reps, V, "heldout")).numpy()
        est = {split: twin_values(twin, _stack(reps, V, f"{split}_gains", ""), starts,
                                  config.horizon, config.gamma).numpy()
               for split in ("train", "unseen")}
    for v, variant in enumerate(variants):
        rows = [r * V + v for r in range(len(reps))]
        metrics: dict[str, np.ndarray] = {"heldout_mse": heldout[rows]}
        values: dict[str, np.ndarray] = {}
        for split in ("train", "unseen"):
            pred = est[split][rows]
            true = np.stack([getattr(rep, f"true_{split}").numpy() for rep in reps])
            values[split] = pred
            for name, value in _decision_metrics(zip(pred, true, strict=True)).items():
                metrics[f"{name}_{split}"] = value
        study.metrics[variant] = metrics
        study.values[variant] = values


def train_variants(study: Study, twin: BatchedTwin, variants: list[Variant], steps: int,
                   generator: torch.Generator, lr: float = 3e-3):
    """Train every model of ``twin`` with its variant's ranking weight and labels (Eq.
    ``eq-dt2-loss``); each replicate ranks its own training policies."""
    reps, config = _replicates_of(study, variants), study.config
    V = len(variants)
    weights = torch.tensor([v.weight for v in variants] * len(reps))
    # lambda = 0 ignores its labels (the control has no FQE values): give it the true ones
    reference = torch.stack([rep.true_train if v.labels == "true" or v.weight == 0
                             else rep.fqe_train for rep in reps for v in variants])
    return train_dt2(twin, _transitions(reps, V), _stack(reps, V, "train_gains", ""),
                     reference, weights, _stack(reps, V, "data", "starts"),
                     horizon=config.horizon, gamma=config.gamma, steps=steps,
                     n_starts=config.n_starts, lr=lr, generator=generator)


def _expand(twin: MLPTwin, V: int) -> None:
    """Repeat each pretrained model ``V`` times in place (replicate-major order)."""
    with torch.no_grad():
        for p in twin.parameters():
            p.data = p.data.repeat_interleave(V, dim=0)
    twin.n_models *= V


def _linear(study: Study, variants: list[Variant], generator: torch.Generator):
    reps, config = _replicates_of(study, variants), study.config
    twin = LinearTwin(len(reps) * len(variants), _delta_scale(reps))
    twin.fit_least_squares(*_transitions(reps, len(variants)))
    log = train_variants(study, twin, variants, config.linear_steps, generator, config.linear_lr)
    evaluate(study, twin, variants)
    return log


def replicate_seeds(seed: int, config: Config) -> list[int]:
    """Seeds of the replicates of outer seed ``seed``: ``seed_stride * seed + r``, so that the
    replicates of different outer seeds never overlap."""
    return [config.seed_stride * int(seed) + r for r in range(config.replicates)]


def run_study(seed: int, config: Config | None = None) -> Study:
    """The whole experiment for one outer seed (see the module docstring).

    Linear twins start from the least-squares MSE minimiser; MLP twins from one MSE-pretrained
    network per replicate. Every variant of a twin class then gets the same number of Adam steps
    on its own loss (``lambda = 0``: the conventional twin), so the budgets match.
    """
    import time

    config = Config() if config is None else config
    generator = torch.Generator().manual_seed(int(seed))
    start = time.perf_counter()
    seeds = replicate_seeds(seed, config)
    reps = [make_replicate(s, config) for s in seeds]
    control = ([make_replicate(s, config, config.control_cubic, fqe=False) for s in seeds]
               if config.run_control else [])
    study = Study(config, reps, control)
    study.seconds["data, truth and FQE"] = time.perf_counter() - start

    start = time.perf_counter()
    linear = [Variant("linear", float(w)) for w in config.linear_weights]
    linear.append(Variant("linear", float(config.dt2_weight), "true"))
    study.logs = {"linear": _linear(study, linear, generator)}
    study.seconds["linear twins"] = time.perf_counter() - start
    if config.run_control:
        start = time.perf_counter()
        variants = [Variant("linear", 0.0, setting="control"),
                    Variant("linear", float(config.dt2_weight), "true", setting="control")]
        study.logs["control"] = _linear(study, variants, generator)
        study.seconds["control twins"] = time.perf_counter() - start

    if config.run_mlp:
        start = time.perf_counter()
        mlp = [Variant("MLP", w) for w in sorted({0.0, float(config.dt2_weight)})]
        twin = MLPTwin(len(reps), _delta_scale(reps), config.hidden, generator=generator)
        train_variants(study, twin, [Variant("MLP", 0.0)], config.mlp_pretrain, generator,
                       config.mlp_lr)
        _expand(twin, len(mlp))
        study.logs["MLP"] = train_variants(study, twin, mlp, config.mlp_steps, generator,
                                          config.mlp_lr)
        evaluate(study, twin, mlp)
        study.seconds["MLP twins"] = time.perf_counter() - start
    return study


__all__ = ["Config", "Replicate", "Study", "Variant", "evaluate", "make_replicate", "replace",
           "replicate_seeds", "run_study", "train_variants"]
