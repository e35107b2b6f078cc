"""ICML 2026 in Code: the tested implementations behind the book's chapters.

Shared building blocks live in :mod:`icml26.core`, :mod:`icml26.claims`, :mod:`icml26.plotting`,
:mod:`icml26.kernels`, :mod:`icml26.data`, :mod:`icml26.language`, :mod:`icml26.nn` and
:mod:`icml26.llm`; each chapter has one module named after it (``from icml26 import
mod_two_sample``). The machinery that builds the book lives apart in :mod:`icml26.toolchain`,
driven by the ``icml26`` command.
"""

import os

# OpenMP threads that spin while waiting make torch up to 30x slower when the cores are shared
# (measured on 2 cores); sleeping threads cost nothing when they are not. This takes effect only
# if icml26 is imported before torch; the pipeline and the Makefile also set it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
