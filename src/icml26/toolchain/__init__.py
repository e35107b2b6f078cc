"""The machinery that builds the book, apart from the library that chapters import.

:mod:`~icml26.toolchain.chapters` reads the table of contents, :mod:`~icml26.toolchain.pipeline`
executes and renders (in parallel or on Dask), :mod:`~icml26.toolchain.kernel` is the kernel it
starts, :mod:`~icml26.toolchain.ledger` gathers the claims into "What reproduced",
:mod:`~icml26.toolchain.labs` exports course labs and :mod:`~icml26.toolchain.grading` grades them
in isolated kernels, running the checks (:mod:`~icml26.toolchain.checks`) in its own process on
answers that cross :mod:`~icml26.toolchain.wire` as data, :mod:`~icml26.toolchain.lab` starts
JupyterLab,
:mod:`~icml26.toolchain.offline` vendors MathJax, and :mod:`~icml26.toolchain.cli` is the
``icml26`` command. Nothing in the library imports this subpackage.
"""
