"""Anisotropy of transformer representations across training (the anisotropy chapter).

* :mod:`~icml26.anisotropy.metrics`: mean cosine, top-direction share, effective rank,
  partition-function isotropy, and the entropy quantities that drive them;
* :mod:`~icml26.anisotropy.geometry`: the curvature-visibility toy model;
* :mod:`~icml26.anisotropy.tangent`: semi-NMF tangent proxies and gradient-energy tests;
* :mod:`~icml26.anisotropy.training`: tiny transformers on languages with an entropy knob,
  checkpoints, and per-layer measurements;
* :mod:`~icml26.anisotropy.smollm`: the proxy-against-gradient test on SmolLM2-135M-Instruct;
* :mod:`~icml26.anisotropy.circle`: a language on a circle, where the tangent is known.
"""

from icml26.anisotropy.circle import (
    circle_model,
    circle_plane,
    circle_source,
    direction_share,
    shuffled_source,
    subspace_capture,
    tangent_and_normal,
)
from icml26.anisotropy.geometry import parabola_sample, visible_curvature_ratio
from icml26.anisotropy.metrics import (
    all_metrics,
    as_points,
    collision_probability,
    cone_cosine,
    effective_rank,
    mean_cosine,
    partition_isotropy,
    rank_correlation_test,
    shannon_entropy,
    spectrum,
    stratified_rank_test,
    top_share,
)
from icml26.anisotropy.tangent import (
    anisotropy_share,
    control_energy_share,
    energy_share,
    gradient_anisotropy,
    orthonormal_basis,
    pca_basis,
    permutation_chance_share,
    random_complement_basis,
    semi_nmf,
)
from icml26.anisotropy.training import (
    activations_and_gradients,
    entropy_sources,
    evaluation_batch,
    layer_names,
    layer_states,
    measure_checkpoint,
    tangent_test,
    train_stacked,
    train_with_checkpoints,
)

__all__ = [
    "activations_and_gradients", "all_metrics", "circle_model", "circle_plane", "circle_source",
    "direction_share", "rank_correlation_test", "shuffled_source", "stratified_rank_test",
    "subspace_capture", "tangent_and_normal",
    "anisotropy_share", "as_points",
    "collision_probability", "cone_cosine", "control_energy_share", "effective_rank",
    "energy_share", "entropy_sources", "evaluation_batch", "gradient_anisotropy", "layer_names",
    "layer_states", "mean_cosine", "measure_checkpoint", "orthonormal_basis", "parabola_sample",
    "partition_isotropy", "pca_basis", "permutation_chance_share", "random_complement_basis",
    "semi_nmf", "shannon_entropy",
    "spectrum", "tangent_test", "top_share", "train_stacked", "train_with_checkpoints",
    "visible_curvature_ratio",
]
