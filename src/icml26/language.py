r"""Synthetic languages with a known entropy rate, so that perplexity has an exact floor.

A :class:`MarkovSource` of order $k$ over a vocabulary of $V$ symbols draws the next symbol from a
table $P(\cdot \mid c)$ indexed by the context $c = (x_{t-k}, \dots, x_{t-1})$. Each row is Zipfian
over its own ranking of the vocabulary,

$$
P(j \mid c) \propto r_c(j)^{-s / T_c}, \qquad T_c = T e^{\sigma z_c},\ z_c \sim \mathcal N(0, 1),
$$

where $s$ is the Zipf exponent, $T$ a temperature (higher $T$: flatter rows, higher entropy) and
$\sigma$ spreads the temperatures, so that some contexts are far more predictable than others.
The rankings $r_c$ are Plackett–Luce draws from one global Zipf($s$) popularity, so popular symbols
tend to rank high in every context and the symbol frequencies are themselves Zipf-like.

Because the chain is finite and every transition has positive probability, it has a unique
stationary distribution $\pi$ over contexts, and its **entropy rate** is exact:

$$
H = \sum_c \pi(c)\, \Bigl(-\sum_j P(j \mid c) \log P(j \mid c)\Bigr) \quad \text{(nats)}.
$$

No model can have a lower expected next-token loss on positions with at least $k$ tokens of
context, so $e^{H}$ is the perplexity floor. Everything is deterministic given the seed.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import spsolve

from icml26.core import check_count, check_positive

MAX_CONTEXTS = 2**22
"""Largest number of contexts $V^k$ a source may have (the table has $V^{k+1}$ entries)."""


def zipf_rows(rankings: np.ndarray, exponent: float, temperatures: np.ndarray) -> np.ndarray:
    r"""Rows $P(j \mid c) \propto r_c(j)^{-s/T_c}$ for rankings $r_c(j) \in \{1, \dots, V\}$."""
    sharpness = exponent / np.asarray(temperatures, dtype=np.float64).reshape(-1, 1)
    logits = -sharpness * np.log(rankings.astype(np.float64))
    logits -= logits.max(axis=1, keepdims=True)
    rows = np.exp(logits)
    return rows / rows.sum(axis=1, keepdims=True)


def plackett_luce_rankings(rng: np.random.Generator, contexts: int, vocab: int,
                           exponent: float) -> np.ndarray:
    """One ranking of the vocabulary per context, drawn from a global Zipf popularity.

    Sorting log-popularity plus Gumbel noise samples a Plackett–Luce ranking; entry ``[c, j]`` is
    the rank (1 = most likely) of symbol ``j`` in context ``c``.
    """
    log_popularity = -exponent * np.log(np.arange(1, vocab + 1))
    scores = log_popularity + rng.gumbel(size=(contexts, vocab))
    order = np.argsort(-scores, axis=1)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, vocab + 1)[None, :], axis=1)
    return ranks


def row_entropies(rows: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of every row of a row-stochastic matrix."""
    safe = np.where(rows > 0, rows, 1.0)
    return -(rows * np.log(safe)).sum(axis=1)


@dataclass(frozen=True)
class MarkovSource:
    """An order-``order`` Markov chain over ``vocab_size`` symbols with Zipfian transition rows.

    ``transition[c]`` is the next-symbol distribution after context ``c``, where the context
    $(x_{t-k}, \\dots, x_{t-1})$ is encoded as the base-$V$ integer with $x_{t-1}$ as the last
    digit. Build one with :func:`zipf_markov_source`.
    """

    vocab_size: int
    order: int
    transition: np.ndarray
    stationary: np.ndarray

    @property
    def num_contexts(self) -> int:
        return self.vocab_size**self.order

    @property
    def entropy_rate(self) -> float:
        """Exact entropy rate $H$ in nats per symbol (the module equation)."""
        return float(self.stationary @ row_entropies(self.transition))

    @property
    def perplexity_floor(self) -> float:
        """$e^{H}$: the lowest expected perplexity on positions with a full context."""
        return float(np.exp(self.entropy_rate))

    @property
    def unigram(self) -> np.ndarray:
        """Stationary symbol frequencies: the last digit of the stationary context."""
        return self.stationary.reshape(-1, self.vocab_size).sum(axis=0)

    def next_context(self, contexts: np.ndarray, symbols: np.ndarray) -> np.ndarray:
        """Shift ``symbols`` into ``contexts`` (drop the oldest digit)."""
        return (contexts * self.vocab_size) % self.num_contexts + symbols

    def encode(self, tokens: np.ndarray) -> np.ndarray:
        """Context codes of the last ``order`` symbols along the final axis of ``tokens``."""
        codes = np.zeros(tokens.shape[:-1], dtype=np.int64)
        for position in range(self.order):
            codes = codes * self.vocab_size + tokens[..., position]
        return codes

    def sample(self, num_sequences: int, length: int, seed: int) -> np.ndarray:
        """``num_sequences`` independent stationary sequences of ``length`` symbols (int64).

        Each sequence starts from a context drawn from the stationary distribution, so every
        position has the stationary marginal. Sequences are generated in parallel, one position
        at a time, by inverting the cumulative transition rows.
        """
        num_sequences = check_count(num_sequences, "num_sequences", 1)
        length = check_count(length, "length", self.order)
        rng = np.random.default_rng(check_count(seed, "seed", 0))
        start = rng.choice(self.num_contexts, size=num_sequences, p=self.stationary)
        tokens = np.empty((num_sequences, length), dtype=np.int64)
        for position in range(self.order):
            digit = self.order - 1 - position
            tokens[:, position] = (start // self.vocab_size**digit) % self.vocab_size
        cumulative = np.cumsum(self.transition, axis=1)
        contexts = start
        uniforms = rng.random((length - self.order, num_sequences))
        for step, u in enumerate(uniforms):
            rows = cumulative[contexts]
            symbols = np.minimum((rows < u[:, None]).sum(axis=1), self.vocab_size - 1)
            tokens[:, self.order + step] = symbols
            contexts = self.next_context(contexts, symbols)
        return tokens

    def log_prob(self, tokens: np.ndarray) -> np.ndarray:
        """True $\\log P(x_t \\mid x_{t-k:t})$ for every position $t \\ge k$ of each row."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.shape[1] <= self.order:
            raise ValueError(f"tokens must be 2-D with more than {self.order} columns, "
                             f"got shape {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"tokens must lie in [0, {self.vocab_size})")
        windows = np.lib.stride_tricks.sliding_window_view(tokens, self.order + 1, axis=1)
        contexts = self.encode(windows[..., :-1])
        return np.log(self.transition[contexts, windows[..., -1]])


def stationary_distribution(transition: np.ndarray, order: int) -> np.ndarray:
    """Stationary distribution over the $V^k$ contexts, solved exactly on the context chain.

    Context $c$ moves to $(cV \\bmod V^k) + j$ with probability ``transition[c, j]``. Every
    transition is positive, so the chain is irreducible and $\\pi$ is the unique solution of
    $\\pi^\\top (P - I) = 0$, $\\sum_c \\pi_c = 1$: a sparse linear system with one balance
    equation replaced by the normalisation. (Power iteration stalls on near-deterministic rows.)
    """
    contexts, vocab = transition.shape
    sources = np.repeat(np.arange(contexts), vocab)
    shifted = (np.arange(contexts)[:, None] * vocab) % contexts
    targets = (shifted + np.arange(vocab)[None, :]).ravel()
    chain = sparse.csr_matrix((transition.ravel(), (targets, sources)), shape=(contexts, contexts))
    system = (chain - sparse.identity(contexts, format="csr")).tolil()
    system[0, :] = 1.0
    rhs = np.zeros(contexts)
    rhs[0] = 1.0
    pi = spsolve(system.tocsc(), rhs)
    if not np.all(np.isfinite(pi)) or pi.min() < -1e-12:
        raise RuntimeError(f"stationary distribution could not be solved (order {order})")
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def zipf_markov_source(vocab_size: int = 64, order: int = 2, exponent: float = 1.0,
                       temperature: float = 1.0, spread: float = 0.5,
                       seed: int = 0) -> MarkovSource:
    """A seeded :class:`MarkovSource` with Plackett–Luce Zipfian rows (see the module docstring).

    ``temperature`` is the entropy knob $T$ and ``spread`` the log-temperature spread $\\sigma$
    across contexts (0 gives every row the same entropy).
    """
    vocab_size = check_count(vocab_size, "vocab_size", 2)
    order = check_count(order, "order", 1)
    exponent = check_positive(exponent, "exponent")
    temperature = check_positive(temperature, "temperature")
    if isinstance(spread, bool) or not isinstance(spread, numbers.Real) or not 0 <= spread < 10:
        raise ValueError(f"spread must be a number in [0, 10), got {spread!r}")
    if vocab_size**order > MAX_CONTEXTS:
        raise ValueError(f"vocab_size**order = {vocab_size**order} contexts is more than "
                         f"{MAX_CONTEXTS}; use a smaller vocabulary or order")
    rng = np.random.default_rng(check_count(seed, "seed", 0))
    rankings = plackett_luce_rankings(rng, vocab_size**order, vocab_size, exponent)
    temperatures = temperature * np.exp(spread * rng.standard_normal(vocab_size**order))
    transition = zipf_rows(rankings, exponent, temperatures)
    return MarkovSource(vocab_size, order, transition, stationary_distribution(transition, order))


def source_with_entropy_rate(target: float, vocab_size: int = 64, order: int = 2,
                             exponent: float = 1.0, spread: float = 0.5, seed: int = 0,
                             tol: float = 1e-6) -> MarkovSource:
    """The source of :func:`zipf_markov_source` whose temperature gives entropy rate ``target``.

    Bisection on $\\log T$ over $T \\in [0.1, 50]$; the rankings and the spread depend only on
    the seed, so the entropy rate is a continuous, increasing function of the temperature.
    """
    target = check_positive(target, "target")
    if target >= np.log(vocab_size):
        raise ValueError(f"target entropy rate must be below log(vocab_size) = "
                         f"{np.log(vocab_size):.4f} nats, got {target}")
    low, high = np.log(0.1), np.log(50.0)
    for end in (low, high):
        rate = zipf_markov_source(vocab_size, order, exponent, float(np.exp(end)), spread,
                                  seed).entropy_rate
        if (end == low and rate > target) or (end == high and rate < target):
            raise ValueError(f"target {target} is outside the reachable entropy rates "
                             f"(rate {rate:.4f} at temperature {np.exp(end):.3g})")
    while high - low > tol:
        middle = 0.5 * (low + high)
        rate = zipf_markov_source(vocab_size, order, exponent, float(np.exp(middle)), spread,
                                  seed).entropy_rate
        low, high = (middle, high) if rate < target else (low, middle)
    temperature = float(np.exp(0.5 * (low + high)))
    return zipf_markov_source(vocab_size, order, exponent, temperature, spread, seed)


@dataclass(frozen=True)
class Corpus:
    """Train, validation and test sequences (int64 arrays of shape ``(sequences, length)``)."""

    source: MarkovSource
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray


def make_corpus(source: MarkovSource, train_tokens: int, test_tokens: int, length: int = 64,
                seed: int = 0, valid_tokens: int | None = None) -> Corpus:
    """Independent stationary sequences of ``length`` symbols for each split.

    The splits are drawn from separate random streams spawned from ``seed``, so a larger
    training split leaves the test split unchanged. ``valid_tokens`` defaults to
    ``test_tokens``.
    """
    length = check_count(length, "length", source.order + 1)
    streams = np.random.SeedSequence(check_count(seed, "seed", 0)).generate_state(3)
    valid_tokens = test_tokens if valid_tokens is None else valid_tokens
    splits = {}
    for stream, (name, tokens) in zip(
            streams, (("train", train_tokens), ("valid", valid_tokens), ("test", test_tokens)),
            strict=True):
        tokens = check_count(tokens, f"{name}_tokens", length)
        splits[name] = source.sample(tokens // length, length, seed=int(stream))
    return Corpus(source, **splits)
