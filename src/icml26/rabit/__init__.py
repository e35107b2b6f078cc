"""RaBiT: residual-aware binarization training (chapter ``rabit``).

:mod:`~icml26.rabit.binarize` holds the residual binary layer, its initialisations and the RTN
baseline; :mod:`~icml26.rabit.packed` the bit-packed matmul-free inference and the bytes-moved
model; :mod:`~icml26.rabit.experiment` quantises and trains a whole :class:`icml26.nn.TinyGPT`.
"""

from icml26.rabit.binarize import (
    MODES,
    STES,
    BinaryPaths,
    ResidualBinaryLinear,
    UniformQATLinear,
    binary_sign,
    check_activations,
    check_paths,
    check_weight,
    consistent_latent,
    function_aware_init,
    ordering_violations,
    output_error,
    path_ste,
    positive_scales,
    refit_out_scales,
    residual_svid,
    rtn_quantize,
    sign_ste,
    svid,
)
from icml26.rabit.experiment import (
    INITS,
    METHODS,
    QATRun,
    Replicates,
    build_quantized,
    initial_paths,
    latent_elements,
    model_bits_per_weight,
    optimizer_state_elements,
    path_output_correlation,
    pearson,
    qat_replicates,
    quantized_layers,
    rtn_model,
    run_qat,
    stacked_path_signs,
    start_gap,
    sweep_learning_rate,
    uniform_bits_per_weight,
)
from icml26.rabit.packed import (
    DecodeTraffic,
    PackedResidualBinary,
    bits_per_weight,
    llama_decode_traffic,
    median_time,
    pack_signs,
    packed_sign_matvec,
    subset_sum_table,
)

__all__ = [
    "INITS", "METHODS", "MODES", "BinaryPaths", "DecodeTraffic", "PackedResidualBinary",
    "QATRun", "Replicates", "qat_replicates", "stacked_path_signs",
    "ResidualBinaryLinear", "binary_sign", "bits_per_weight", "build_quantized",
    "check_activations", "check_paths", "check_weight", "consistent_latent",
    "function_aware_init", "initial_paths", "latent_elements", "llama_decode_traffic",
    "median_time", "model_bits_per_weight", "optimizer_state_elements", "output_error",
    "pack_signs", "packed_sign_matvec", "path_output_correlation", "pearson", "quantized_layers",
    "refit_out_scales", "residual_svid", "rtn_model", "rtn_quantize", "run_qat", "sign_ste",
    "start_gap", "subset_sum_table", "svid", "sweep_learning_rate", "STES", "UniformQATLinear",
    "ordering_violations", "path_ste", "positive_scales", "uniform_bits_per_weight",
]
