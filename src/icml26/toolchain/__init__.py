"""The machinery that builds the book, apart from the library that chapters import.

:mod:`~icml26.toolchain.chapters` reads the table of contents, :mod:`~icml26.toolchain.pipeline`
executes and renders, :mod:`~icml26.toolchain.labs` exports and grades course labs,
:mod:`~icml26.toolchain.offline` vendors MathJax, and :mod:`~icml26.toolchain.cli` is the
``icml26`` command. Nothing in the library imports this subpackage.
"""
