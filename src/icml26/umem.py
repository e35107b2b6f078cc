"""UMEM in a toy world: a memory agent whose extraction and management are trained by GRPO.

The LLMs of the paper are replaced, the algorithm is kept:

* a **world** of query families: each family ``f`` has a hidden unit rule vector ``u_f``; a query
  has a unit embedding near its family's rule and its own instance-specific shortcut ``a_q`` (a
  random unit vector, "the answer to this one question") -- :func:`make_world`; families can come
  in overlapping sibling pairs (``eq-umem-world``), so that neighbourhoods mix families;
* a frozen stochastic **executor** whose chance of success depends on the memories retrieved for
  the query (:class:`Executor`, equation ``eq-umem-executor``): a memory aligned with the query's
  rule helps, the query's own shortcut helps a lot, a shortcut written for *another* query misleads;
* a **memory bank** of (key, value) pairs with top-``K`` cosine retrieval on keys above a
  similarity threshold (:class:`MemoryBank`, :meth:`MemoryBank.retrieve`), optionally capped, an
  ADD to a full bank evicting its oldest entry;
* a **Mem-Optimizer** (:class:`MemPolicy`): an extraction head choosing the abstraction level of the
  memory distilled from a trajectory (``eq-umem-extract``) and a management head choosing ADD or
  UPDATE of a retrieved entry;
* the **neighbourhood marginal-utility reward** (``eq-umem-gain``, ``eq-umem-reward``) over the
  semantic neighbourhood of a query (:func:`semantic_neighbourhood`), or over the source query
  alone (the ablation without Semantic Neighbourhood Modelling), with independent executor draws
  (as the released reward) or common random numbers (for the closed form);
* **GRPO** (:func:`group_advantages`, :func:`grpo_loss`, ``eq-umem-grpo``) with online memory
  evolution (:func:`train_policy`), and zero-reset streaming evaluation (:func:`stream`);
* a **learned executor** (:class:`LearnedExecutor`, ``eq-umem-learned``) trained once to answer
  from the query and its retrieved memories (:func:`train_executor`, or one per world at once:
  :func:`train_executors`), with the lone-memory curves it implies
  (:func:`learned_reward_curves`), and as the agent's executor (:class:`MemoryExecutor`), whose
  success on the retrieved memories is then the GRPO reward (:func:`learned_candidate_rewards`)
  and the streaming accuracy;
* closed forms that say what the world itself predicts: the exact expected reward of a lone
  memory of each abstraction level on any set of targets (:func:`lone_memory_gains`,
  :func:`expected_gain_by_alpha`), and the neighbourhood lemma on many pairs at once
  (:func:`lemma_check`, ``eq-umem-lemma``).
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from icml26.core import check_count, check_positive
from icml26.nn import AdamW

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Abstraction levels of the extraction head; index ``len(ALPHAS)`` is a malformed output."""

MALFORMED = len(ALPHAS)
N_EXTRACT = len(ALPHAS) + 1
TOP_K = 3
"""Memories retrieved per query (the paper's ``K = 3``)."""

N_MANAGE = 1 + TOP_K  # ADD, UPDATE_0 .. UPDATE_{K-1}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _check_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


# --- the world -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """Query families with hidden rules; ``train``/``test`` split by query, ``ood`` by family."""

    rules: np.ndarray  # (families, dim) unit rule vectors u_f
    embeddings: np.ndarray  # (queries, dim) unit query embeddings e(q)
    shortcuts: np.ndarray  # (queries, dim) unit instance shortcuts a_q
    family: np.ndarray  # (queries,) family of each query
    train: np.ndarray  # query ids used for training (and as neighbourhoods)
    test: np.ndarray  # held-out queries of the training families
    ood: np.ndarray  # queries of held-out families

    @property
    def dim(self) -> int:
        return self.embeddings.shape[1]

    @functools.cached_property
    def answer_vectors(self) -> np.ndarray:
        """:func:`answers`, computed once per world (read-only)."""
        out = _unit(self.rules[self.family] + self.shortcuts)
        out.flags.writeable = False
        return out


def make_world(n_families: int = 8, n_heldout_families: int = 2, queries_per_family: int = 40,
               dim: int = 16, spread: float = 0.8, test_fraction: float = 0.4,
               seed: int = 0, sibling_spread: float | None = None) -> World:
    """Generate a world: ``e(q) = normalise(u_f + spread * xi_q)``, ``xi_q ~ N(0, I/dim)``.

    With ``spread = s`` two queries of one family have cosine about ``1 / (1 + s^2)``; queries of
    different families are nearly orthogonal when ``dim`` is large. With ``sibling_spread = h``
    the families come in overlapping pairs (``eq-umem-world``): families ``2j`` and ``2j + 1``
    share a parent ``w_j`` and have rules ``u_f = normalise(w_j + h * zeta_f)``, so a query's
    nearest neighbours are sometimes from the sibling family (neighbour purity below 1).
    """
    n_families = check_count(n_families, "n_families", 1)
    n_heldout_families = check_count(n_heldout_families, "n_heldout_families", 0)
    queries_per_family = check_count(queries_per_family, "queries_per_family", 4)
    dim = check_count(dim, "dim", 2)
    spread = check_positive(spread, "spread")
    test_fraction = _check_real(test_fraction, "test_fraction")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    total = n_families + n_heldout_families
    if sibling_spread is None:
        rules = _unit(rng.normal(size=(total, dim)))
    else:
        sibling_spread = check_positive(sibling_spread, "sibling_spread")
        parents = _unit(rng.normal(size=((total + 1) // 2, dim)))
        rules = _unit(parents[np.arange(total) // 2]
                      + sibling_spread * rng.normal(size=(total, dim)) / np.sqrt(dim))
    family = np.repeat(np.arange(total), queries_per_family)
    noise = rng.normal(size=(family.size, dim)) / np.sqrt(dim)
    embeddings = _unit(rules[family] + spread * noise)
    shortcuts = _unit(rng.normal(size=(family.size, dim)))
    n_test = max(1, int(round(test_fraction * queries_per_family)))
    train, test = [], []
    for f in range(n_families):
        ids = rng.permutation(np.flatnonzero(family == f))
        test.extend(ids[:n_test])
        train.extend(ids[n_test:])
    ood = np.flatnonzero(family >= n_families)
    return World(rules, embeddings, shortcuts, family, np.sort(np.array(train)),
                 np.sort(np.array(test)), ood)


def semantic_neighbourhood(embeddings: np.ndarray, pool: np.ndarray, n: int) -> np.ndarray:
    """``NN_n(q)``: the ``n`` nearest pool queries of each pool query by cosine, ``q`` excluded.

    Returns an array of shape ``(len(pool), n)`` of query ids (rows follow ``pool``). Semantic
    Neighbourhood Modelling scores a memory on these queries instead of on ``q`` itself.
    """
    n = check_count(n, "neighbourhood size", 1)
    pool = np.asarray(pool)
    if n >= pool.size:
        raise ValueError(f"neighbourhood size {n} needs more than {pool.size} pool queries")
    sims = embeddings[pool] @ embeddings[pool].T
    np.fill_diagonal(sims, -np.inf)
    order = np.argsort(-sims, axis=1, kind="stable")[:, :n]
    return pool[order]


def lemma_gap(e1: np.ndarray, e2: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sides of the neighbourhood lemma ``eq-umem-lemma`` for unit vectors.

    Returns ``|e1.k - e2.k|`` for every row ``k`` of ``keys`` and the bound
    ``||e1 - e2|| = sqrt(2 - 2 e1.e2)``.
    """
    e1, e2, keys = (np.asarray(x, dtype=float) for x in (e1, e2, keys))
    keys = np.atleast_2d(keys)
    if e1.shape != e2.shape or e1.ndim != 1 or keys.shape[1] != e1.size:
        raise ValueError(f"shapes do not match: {e1.shape}, {e2.shape}, {keys.shape}")
    for name, x in (("e1", e1), ("e2", e2)):
        if abs(np.linalg.norm(x) - 1) > 1e-9:
            raise ValueError(f"{name} must be a unit vector")
    gap = np.abs(keys @ e1 - keys @ e2)
    bound = np.sqrt(max(0.0, 2 - 2 * float(e1 @ e2)))
    return gap, bound


# --- memories and the bank -----------------------------------------------------------------------


def extract_memory(alpha: float, insight: np.ndarray, shortcut: np.ndarray) -> np.ndarray:
    """The memory value of abstraction ``alpha``: ``normalise(alpha * insight + (1-alpha) * a_q)``.

    ``alpha = 1`` keeps only the insight (the trajectory's noisy estimate of the rule), ``alpha =
    0`` only the instance shortcut; this is ``eq-umem-extract``.
    """
    alpha = _check_real(alpha, "alpha")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return _unit(alpha * np.asarray(insight) + (1 - alpha) * np.asarray(shortcut))


class MemoryBank:
    """A bank of memories: key ``e(q)``, value vector, source query, abstraction level.

    ``capacity`` is the initial allocation (the bank grows past it) unless ``limit`` is set: a bank
    with a limit holds at most ``limit`` entries, and an ADD to a full bank evicts the entry
    written longest ago (first in, first out), so that ADD and UPDATE differ in what they destroy.
    """

    def __init__(self, dim: int, capacity: int = 64, limit: int | None = None):
        self.dim = check_count(dim, "dim", 1)
        capacity = check_count(capacity, "capacity", 1)
        if limit is not None:
            limit = check_count(limit, "limit", 1)
            capacity = limit
        self.limit = limit
        self.keys = np.zeros((capacity, dim))
        self.values = np.zeros((capacity, dim))
        self.source = np.zeros(capacity, dtype=int)
        self.alpha = np.zeros(capacity)
        self.weight = np.zeros(capacity)  # shortcut content <value, a_source>
        self.stamp = np.zeros(capacity, dtype=int)  # write counter of each entry
        self.writes = 0
        self.size = 0

    @property
    def full(self) -> bool:
        return self.limit is not None and self.size == self.limit

    def add_slot(self) -> int:
        """The entry an ADD writes: the next free one, or the oldest when the bank is full."""
        if self.full:
            return int(np.argmin(self.stamp[: self.size]))
        return self.size

    def __len__(self) -> int:
        return self.size

    def copy(self) -> MemoryBank:
        return copy.deepcopy(self)

    def _check_vector(self, x, name: str) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if x.shape != (self.dim,):
            raise ValueError(f"{name} must have shape ({self.dim},), got {x.shape}")
        return x

    def write(self, key, value, source: int, alpha: float, weight: float,
              slot: int | None = None) -> int:
        """ADD (``slot=None``) or overwrite entry ``slot`` (UPDATE); returns the entry index."""
        key, value = self._check_vector(key, "key"), self._check_vector(value, "value")
        if slot is None and self.full:
            slot = self.add_slot()  # evict the oldest entry
        elif slot is None:
            if self.size == self.keys.shape[0]:
                for name in ("keys", "values", "source", "alpha", "weight", "stamp"):
                    old = getattr(self, name)
                    setattr(self, name, np.concatenate([old, np.zeros_like(old)]))
            slot = self.size
            self.size += 1
        elif not 0 <= slot < self.size:
            raise ValueError(f"cannot update entry {slot} of a bank with {self.size} entries")
        self.keys[slot], self.values[slot] = key, value
        self.source[slot], self.alpha[slot], self.weight[slot] = source, alpha, weight
        self.writes += 1
        self.stamp[slot] = self.writes
        return slot

    def similarities(self, query) -> np.ndarray:
        """Cosine similarity of ``query`` to every key (keys and queries are unit vectors)."""
        query = self._check_vector(query, "query embedding")
        return self.keys[: self.size] @ query

    def retrieve(self, query, k: int = TOP_K, threshold: float = 0.5) -> np.ndarray:
        """Indices of the top-``k`` keys by cosine, keeping only those above ``threshold``."""
        k = check_count(k, "k", 1)
        if self.size == 0:
            raise ValueError("retrieval from an empty memory bank; check len(bank) first")
        return top_k(self.similarities(query), k, threshold)


def top_k(sims: np.ndarray, k: int, threshold: float) -> np.ndarray:
    """Indices of the ``k`` largest entries of ``sims`` that are ``>= threshold``, best first.

    Ties are broken by the lower index (the older entry), so retrieval is deterministic.
    """
    idx = np.argsort(-sims, kind="stable")[:k]
    return idx[sims[idx] >= threshold]


def seed_stale(bank: MemoryBank, world: World, per_family: int, seed: int = 0,
               spread: float = 0.3) -> None:
    """Write ``per_family`` stale, misleading entries for every family into ``bank`` (in place).

    Each entry is keyed near its family's rule, ``normalise(u_f + spread * xi)``, so the family's
    queries retrieve it ahead of the memories keyed at their own embeddings, and its value is the
    answer of a query that no longer exists (a random unit vector of shortcut content 1 and
    abstraction 0, source ``-1``): every query that retrieves it is misled. Only an UPDATE
    overwriting it removes it from an unbounded bank; the positive control for management.
    """
    per_family = check_count(per_family, "per_family", 0)
    rng = np.random.default_rng([int(seed), 7919])
    for f in range(world.rules.shape[0]):
        for _ in range(per_family):
            key = _unit(world.rules[f] + spread * rng.normal(size=world.dim) / np.sqrt(world.dim))
            value = _unit(rng.normal(size=world.dim))
            bank.write(key, value, -1, 0.0, 1.0)


# --- the executor --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Executor:
    """A frozen stochastic executor replacing the LLM (``eq-umem-executor``).

    Success probability ``sigmoid(b0 + b_rule R + b_own H - b_mislead W)`` with ``R`` the mean
    alignment of the retrieved values with the query's rule (clipped at 0), ``H`` the shortcut
    content of a retrieved memory written *for this query*, and ``W`` the shortcut content of
    memories written for *other* queries, averaged over the retrieved set.
    Length (the cost) ``L0 (1 - g_rule R) (1 + g_mislead W) exp(noise)``.
    A trajectory also yields an insight, a noisy estimate of the rule whose noise is smaller when
    the run succeeded.
    """

    b0: float = -0.4
    b_rule: float = 1.2
    b_own: float = 2.5
    b_mislead: float = 1.0
    length0: float = 1000.0
    g_rule: float = 0.4
    g_mislead: float = 0.3
    length_noise: float = 0.1
    insight_noise_success: float = 0.6
    insight_noise_failure: float = 1.2

    def features(self, world: World, query: int, values: np.ndarray, sources: np.ndarray,
                 weights: np.ndarray) -> tuple[float, float, float]:
        """``(R, H, W)`` of the retrieved memories for ``query`` (zeros when none).

        ``R``: mean alignment of the retrieved values with the query's rule, clipped at 0;
        ``H``: largest shortcut content among memories written for this query; ``W``: shortcut
        content of memories written for other queries, averaged over all retrieved memories.
        """
        if values.shape[0] == 0:
            return 0.0, 0.0, 0.0
        rule = world.rules[world.family[query]]
        return _aggregate(values @ rule, sources == query, weights)

    def success_probability(self, r: float, h: float, w: float) -> float:
        z = self.b0 + self.b_rule * r + self.b_own * h - self.b_mislead * w
        return 1 / (1 + math.exp(-z))

    def length(self, r: float, w: float, noise: float) -> float:
        return (self.length0 * (1 - self.g_rule * r) * (1 + self.g_mislead * w)
                * math.exp(self.length_noise * noise))

    def run(self, world: World, query: int, values, sources, weights, uniform: float,
            noise: float) -> tuple[int, float, float]:
        """One execution with common random numbers: ``(correct, length, success probability)``."""
        r, h, w = self.features(world, query, values, sources, weights)
        p = self.success_probability(r, h, w)
        return int(uniform < p), self.length(r, w, noise), p

    def insight(self, world: World, query: int, correct: int, rng: np.random.Generator):
        s = self.insight_noise_success if correct else self.insight_noise_failure
        return _unit(world.rules[world.family[query]] + s * rng.normal(size=world.dim)
                     / np.sqrt(world.dim))


# --- reward --------------------------------------------------------------------------------------


def marginal_utility(c_mem, c_ref, len_mem, len_ref, kind: str = "paper") -> np.ndarray:
    """Per-neighbour gain of a memory (``eq-umem-gain``).

    ``kind="paper"``: ``(c_mem - c_ref) + c_mem c_ref (1 - len_mem / len_ref)``, which can be
    negative. ``kind="code"`` (the released reward): 0 if the run with the memory fails, 1 if only
    it succeeds, ``max(0, 1 - len_mem / len_ref)`` if both succeed.
    """
    c_mem, c_ref = np.asarray(c_mem, dtype=float), np.asarray(c_ref, dtype=float)
    len_mem, len_ref = np.asarray(len_mem, dtype=float), np.asarray(len_ref, dtype=float)
    if np.any(len_ref <= 0) or np.any(len_mem <= 0):
        raise ValueError("lengths must be positive")
    efficiency = 1 - len_mem / len_ref
    if kind == "paper":
        return (c_mem - c_ref) + c_mem * c_ref * efficiency
    if kind == "code":
        return np.where(c_mem < 0.5, 0.0,
                        np.where(c_ref < 0.5, 1.0, np.maximum(0.0, efficiency)))
    raise ValueError(f"kind must be 'paper' or 'code', got {kind!r}")


# --- GRPO ----------------------------------------------------------------------------------------


def group_advantages(rewards, normalise: bool = True, eps: float = 1e-6) -> np.ndarray:
    """Group-relative advantages ``(r_g - mean r) / (std r + eps)`` (``eq-umem-grpo``).

    ``rewards`` has shape ``(groups, G)`` or ``(G,)``; a group whose rewards are all equal gets zero
    advantages (it carries no signal). ``normalise=False`` keeps ``r_g - mean r`` (no division by
    the group's spread).
    """
    r = np.asarray(rewards, dtype=float)
    if r.ndim not in (1, 2):
        raise ValueError(f"rewards must be 1-D or 2-D, got shape {r.shape}")
    if r.shape[-1] < 2:
        raise ValueError(f"GRPO needs a group size of at least 2, got {r.shape[-1]}")
    centred = r - r.mean(axis=-1, keepdims=True)
    if not normalise:
        return centred
    std = r.std(axis=-1, keepdims=True)
    return np.where(std > 0, centred / (std + eps), 0.0)


def grpo_loss(logp, logp_old, logp_ref, advantages, clip: float = 0.2,
              kl_coef: float = 0.001) -> torch.Tensor:
    """Clipped-ratio GRPO loss with the ``k3`` KL estimator to the reference policy.

    ``-mean(min(rho A, clip(rho, 1-eps, 1+eps) A)) + beta mean(exp(ref - logp) - (ref - logp) - 1)``
    with ``rho = exp(logp - logp_old)`` (``eq-umem-grpo``).
    """
    if logp.shape != advantages.shape:
        raise ValueError(f"log-probabilities {tuple(logp.shape)} and advantages "
                         f"{tuple(advantages.shape)} differ in shape")
    ratio = torch.exp(logp - logp_old)
    surrogate = torch.minimum(ratio * advantages,
                              torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)
    log_ratio_ref = logp_ref - logp
    kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
    return -surrogate.mean() + kl_coef * kl.mean()


# --- the Mem-Optimizer ---------------------------------------------------------------------------


def n_features(dim: int) -> int:
    """Width of the policy input: ``e(q)``, outcome, length, bank full, and 3 numbers per slot."""
    return dim + 3 + 3 * TOP_K


def policy_features(world: World, query: int, correct: int, length: float, length0: float,
                    slot_sims: np.ndarray, slot_alphas: np.ndarray,
                    full: bool = False) -> np.ndarray:
    """``[e(q), c, len/L0, full, (sim_k, alpha_k, occupied_k) for k < K]``: the policy's input.

    ``full`` says whether the bank is at its limit (an ADD would evict its oldest entry).
    """
    x = np.zeros(n_features(world.dim))
    x[: world.dim] = world.embeddings[query]
    x[world.dim] = correct
    x[world.dim + 1] = length / length0
    x[world.dim + 2] = float(full)
    for k in range(len(slot_sims)):
        base = world.dim + 3 + 3 * k
        x[base: base + 3] = slot_sims[k], slot_alphas[k], 1.0
    return x


class MemPolicy(nn.Module):
    """Two small MLPs: extraction (5 abstraction levels + malformed) and management (ADD/UPDATE_k).

    The heads have separate parameters, so masking one head's log-probability in the GRPO loss
    (the management-only and extraction-only ablations) freezes it exactly at its initial state.
    """

    def __init__(self, dim: int, hidden: int = 32):
        super().__init__()
        self.dim = check_count(dim, "dim", 1)
        width = n_features(self.dim)

        def mlp(out: int) -> nn.Sequential:
            net = nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, out))
            with torch.no_grad():
                net[2].weight.mul_(0.1)
                net[2].bias.zero_()
            return net

        self.extract = mlp(N_EXTRACT)
        self.manage = mlp(N_MANAGE)
        self._numpy = None

    def logits(self, x: torch.Tensor, manage_mask: torch.Tensor):
        if x.shape[-1] != n_features(self.dim):
            raise ValueError(f"features must have width {n_features(self.dim)}, got {x.shape[-1]}")
        ext = self.extract(x)
        man = self.manage(x).masked_fill(~manage_mask, -1e9)
        return ext, man

    def log_prob(self, x, manage_mask, ext_action, man_action, use_extract=True,
                 use_manage=True) -> torch.Tensor:
        ext, man = self.logits(x, manage_mask)
        total = torch.zeros(x.shape[0], dtype=x.dtype)
        if use_extract:
            total = total + torch.log_softmax(ext, -1).gather(-1, ext_action[:, None])[:, 0]
        if use_manage:
            total = total + torch.log_softmax(man, -1).gather(-1, man_action[:, None])[:, 0]
        return total

    @torch.no_grad()
    def probabilities(self, x: np.ndarray, manage_mask: np.ndarray):
        """Action probabilities for one feature vector (a NumPy forward pass, for speed)."""
        if self._numpy is None:
            self._numpy = [[p.detach().double().numpy().copy() for p in net.parameters()]
                           for net in (self.extract, self.manage)]
        x = np.asarray(x, dtype=float)
        if x.shape != (n_features(self.dim),):
            raise ValueError(f"features must have shape ({n_features(self.dim)},), got {x.shape}")
        out = []
        for (w1, b1, w2, b2), mask in zip(self._numpy, (None, manage_mask), strict=True):
            z = w2 @ np.tanh(w1 @ x + b1) + b2
            if mask is not None:
                z = np.where(mask, z, -np.inf)
            z = np.exp(z - z.max())
            out.append(z / z.sum())
        return out[0], out[1]

    def refresh(self) -> None:
        """Forget the cached NumPy weights (call after every optimiser step)."""
        self._numpy = None


def expected_alpha(p_extract: np.ndarray) -> float:
    """Mean abstraction level of an extraction distribution, malformed outputs excluded."""
    p = np.asarray(p_extract)[: len(ALPHAS)]
    return float(p @ np.array(ALPHAS) / p.sum())


class RuleManagement:
    """A trained policy's extraction head with a hand-written management rule in place of its own.

    The rule overwrites the retrieved entry of lowest abstraction level when that entry is
    shortcut-laden (level below ``keep``) or when an ADD would evict the bank's oldest entry, and
    adds otherwise. It reads only the policy's input features, so it sees what the management head
    sees; it is the management an informed designer would write, used to measure how much
    leverage management has in a world, apart from whether GRPO can learn it.
    """

    def __init__(self, policy: MemPolicy, keep: float = 0.5):
        self.policy = policy
        self.dim = policy.dim
        self.keep = _check_real(keep, "keep")

    def probabilities(self, x: np.ndarray, manage_mask: np.ndarray):
        p_ext, _ = self.policy.probabilities(x, manage_mask)
        x = np.asarray(x, dtype=float)
        slots = x[self.dim + 3:].reshape(TOP_K, 3)
        occupied = np.flatnonzero(slots[:, 2] > 0.5)
        p_man = np.zeros(N_MANAGE)
        if occupied.size:
            weakest = int(occupied[np.argmin(slots[occupied, 1])])
            if slots[weakest, 1] < self.keep or x[self.dim + 2] > 0.5:
                p_man[1 + weakest] = 1.0
                return p_ext, p_man
        p_man[0] = 1.0
        return p_ext, p_man


# --- one step of the agent -----------------------------------------------------------------------


@dataclass
class Step:
    """What the agent saw and did on one query."""

    features: np.ndarray
    manage_mask: np.ndarray
    retrieved: np.ndarray
    correct: int
    length: float
    probability: float
    insight: np.ndarray


def observe(world: World, executor: Executor | MemoryExecutor, bank: MemoryBank, query: int,
            rng: np.random.Generator, threshold: float = 0.5) -> Step:
    """Forward pass: retrieve, execute, and build the Mem-Optimizer's input.

    ``executor`` is the hand-set :class:`Executor` or a learned :class:`MemoryExecutor`.
    """
    if isinstance(executor, MemoryExecutor):
        return _observe_learned(world, executor, bank, query, rng, threshold)
    retrieved = (bank.retrieve(world.embeddings[query], TOP_K, threshold) if len(bank)
                 else np.zeros(0, dtype=int))
    c, length, p = executor.run(world, query, bank.values[retrieved], bank.source[retrieved],
                                bank.weight[retrieved], rng.uniform(), rng.normal())
    sims = bank.similarities(world.embeddings[query])[retrieved] if len(bank) else np.zeros(0)
    x = policy_features(world, query, c, length, executor.length0, sims, bank.alpha[retrieved],
                        bank.full)
    mask = np.zeros(N_MANAGE, dtype=bool)
    mask[: 1 + retrieved.size] = True
    return Step(x, mask, retrieved, c, length, p, executor.insight(world, query, c, rng))


def apply_action(bank: MemoryBank, world: World, query: int, step: Step, ext: int,
                 man: int) -> None:
    """Write the memory chosen by (extraction, management) into ``bank`` (in place)."""
    if ext == MALFORMED:
        return
    alpha = ALPHAS[ext]
    value = extract_memory(alpha, step.insight, world.shortcuts[query])
    weight = float(value @ world.shortcuts[query])
    slot = None if man == 0 else int(step.retrieved[man - 1])
    bank.write(world.embeddings[query], value, query, alpha, weight, slot)


# --- reward of candidate actions -----------------------------------------------------------------


def candidate_rewards(world: World, executor: Executor, bank: MemoryBank, query: int,
                      step: Step, ext: np.ndarray, man: np.ndarray, targets: np.ndarray,
                      rng: np.random.Generator, threshold: float = 0.5,
                      kind: str = "paper", common: bool = True) -> np.ndarray:
    """Reward ``r = r_fmt + mean_{q' in targets} gain(q')`` of each candidate (``eq-umem-reward``).

    Each candidate ``g`` gives a bank ``B_g = Apply(B, a_g)``; every target ``q'`` is executed on
    ``B`` (reference) and on ``B_g``. With ``common=True`` both executions of a target share their
    random draws (common random numbers, the setting of the closed form ``eq-umem-lone``); with
    ``common=False`` every rollout's execution of every target draws afresh, as the released
    reward samples its executor (one reference run per target is shared by the group).
    ``targets`` is the semantic neighbourhood (UMEM) or ``[query]`` (source-only). With
    ``kind="code"`` the reference has no memory and the test run sees only the new memory, as in
    the released reward. An ADD to a full bank evicts its oldest entry (:class:`MemoryBank`).

    Retrieval from ``B_g`` only needs the top ``K + 1`` entries of ``B``: an ADD can only push the
    new entry into them, an UPDATE removes one entry and adds the new one.
    """
    if kind not in ("paper", "code"):
        raise ValueError(f"kind must be 'paper' or 'code', got {kind!r}")
    G = len(ext)
    rewards = np.zeros(G)
    uniforms, noises = rng.uniform(size=len(targets)), rng.normal(size=len(targets))
    key = world.embeddings[query]
    refs = []
    for t, target in enumerate(targets):
        e = world.embeddings[target]
        if kind == "paper" and len(bank):
            sims = bank.similarities(e)
            top = top_k(sims, TOP_K + 1, threshold)
            ref_idx = top[:TOP_K]
        else:
            sims, top, ref_idx = np.zeros(0), np.zeros(0, int), np.zeros(0, int)
        c_ref, l_ref, _ = executor.run(world, target, bank.values[ref_idx],
                                       bank.source[ref_idx], bank.weight[ref_idx],
                                       uniforms[t], noises[t])
        rule = world.rules[world.family[target]]
        # (similarity, rule alignment, written for the target?, shortcut content, index) of the
        # entries that can still be retrieved once the candidate is applied
        base = [] if kind == "code" else [
            (float(sims[i]), float(bank.values[i] @ rule), bool(bank.source[i] == target),
             float(bank.weight[i]), int(i)) for i in top]
        refs.append((base, rule, float(e @ key), c_ref, l_ref))
    cache: dict = {}  # features (p, r, w) of each distinct action on every target
    for g in range(G):
        action = (int(ext[g]), int(man[g]) if kind == "paper" else 0)
        if action[0] == MALFORMED:
            continue  # r_fmt = 0 and the bank is unchanged: no gain either
        if action not in cache:
            value = extract_memory(ALPHAS[action[0]], step.insight, world.shortcuts[query])
            weight = float(value @ world.shortcuts[query])
            if action[1] > 0:
                replaced = int(step.retrieved[action[1] - 1])
            elif kind == "paper" and bank.full:
                replaced = bank.add_slot()  # ADD evicts the oldest entry
            else:
                replaced = -1
            new_index = len(bank) if replaced < 0 else replaced
            feats = []
            for t, target in enumerate(targets):
                base, rule, s_new, c_ref, l_ref = refs[t]
                entries = [entry for entry in base if entry[4] != replaced]
                entries.append((s_new if kind == "paper" else np.inf, float(value @ rule),
                                query == target, weight, new_index))
                entries = sorted((e for e in entries if e[0] >= threshold),
                                 key=lambda e: (-e[0], e[4]))
                r, h, w = _aggregate_entries(entries[:TOP_K])
                feats.append((executor.success_probability(r, h, w), r, w))
            cache[action] = feats
        total = 0.0
        for t, (p, r, w) in enumerate(cache[action]):
            c_ref, l_ref = refs[t][3], refs[t][4]
            u, z = (uniforms[t], noises[t]) if common else (rng.uniform(), rng.normal())
            total += _gain(int(u < p), c_ref, executor.length(r, w, z), l_ref, kind)
        rewards[g] = 1.0 + total / len(targets)
    return rewards


def _aggregate_entries(entries) -> tuple[float, float, float]:
    """:func:`_aggregate` of ``(sim, alignment, own, weight, index)`` tuples, in one pass."""
    if not entries:
        return 0.0, 0.0, 0.0
    total, foreign, own_best = 0.0, 0.0, None
    for _, align, own, weight, _ in entries:
        total += align
        if own:
            own_best = weight if own_best is None else max(own_best, weight)
        else:
            foreign += weight
    n = len(entries)
    return max(0.0, total / n), (0.0 if own_best is None else own_best), foreign / n


def _aggregate(aligns, own, weights) -> tuple[float, float, float]:
    n = len(aligns)
    r = max(0.0, float(sum(aligns)) / n)
    h = max((float(w) for w, o in zip(weights, own, strict=True) if o), default=0.0)
    w = sum(float(w) for w, o in zip(weights, own, strict=True) if not o) / n
    return r, h, w


def _gain(c_mem: int, c_ref: int, len_mem: float, len_ref: float, kind: str) -> float:
    """Scalar :func:`marginal_utility` (the same formula, without array overhead)."""
    efficiency = 1 - len_mem / len_ref
    if kind == "paper":
        return (c_mem - c_ref) + c_mem * c_ref * efficiency
    if not c_mem:
        return 0.0
    return 1.0 if not c_ref else max(0.0, efficiency)


# --- training ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """GRPO settings; ``neighbourhood=0`` means the source-only reward (no SNM).

    ``common_random_numbers=False`` (the released reward) draws every execution of the reward
    afresh; ``capacity`` caps the training bank (``None``: unbounded); ``stale`` seeds the
    training bank with that many misleading entries per family (:func:`seed_stale`).
    """

    neighbourhood: int = 3
    group_size: int = 8
    epochs: int = 3
    batch_queries: int = 16
    inner_steps: int = 2
    lr: float = 3e-3
    clip: float = 0.2
    kl_coef: float = 0.001
    normalise: bool = True
    train_extract: bool = True
    train_manage: bool = True
    threshold: float = 0.5
    reward: str = "paper"
    hidden: int = 32
    common_random_numbers: bool = False
    capacity: int | None = None
    stale: int = 0

    def __post_init__(self):
        check_count(self.neighbourhood, "neighbourhood", 0)
        if check_count(self.group_size, "group_size", 0) < 2:
            raise ValueError(f"GRPO needs a group size of at least 2, got {self.group_size}")
        check_count(self.epochs, "epochs", 0)
        check_count(self.batch_queries, "batch_queries", 1)
        check_count(self.inner_steps, "inner_steps", 1)
        check_positive(self.lr, "lr")
        if self.capacity is not None:
            check_count(self.capacity, "capacity", 1)
        check_count(self.stale, "stale", 0)
        if self.reward not in ("paper", "code"):
            raise ValueError(f"reward must be 'paper' or 'code', got {self.reward!r}")


@dataclass
class TrainResult:
    policy: MemPolicy
    mean_reward: list = field(default_factory=list)  # per minibatch
    mean_alpha: list = field(default_factory=list)  # expected alpha per minibatch
    bank_size: int = 0
    stale_left: int = 0  # stale entries (source -1, :func:`seed_stale`) left in the training bank


def neighbourhood_targets(world: World, config: TrainConfig) -> dict[int, np.ndarray]:
    """Target queries of every training query: ``NN_N(q)`` within the training pool, or ``[q]``."""
    if config.neighbourhood == 0:
        return {int(q): np.array([q]) for q in world.train}
    nn_ids = semantic_neighbourhood(world.embeddings, world.train, config.neighbourhood)
    return {int(q): nn_ids[i] for i, q in enumerate(world.train)}


def train_policy(world: World, executor: Executor | MemoryExecutor, config: TrainConfig,
                 seed: int = 0,
                 policy: MemPolicy | None = None) -> TrainResult:
    """GRPO with online memory evolution over the training queries (the released loop, scaled down).

    For each query: observe, sample ``G`` actions from the current policy, reward each on the
    targets, commit the best action to the training bank if its utility is positive, and after
    every ``batch_queries`` queries take ``inner_steps`` Adam steps on the clipped GRPO loss.
    With a :class:`MemoryExecutor` the reward is :func:`learned_candidate_rewards` (the learned
    executor's success gain on the retrieved memories; ``reward="paper"`` only).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError("config must be a TrainConfig")
    learned = isinstance(executor, MemoryExecutor)
    if learned and config.reward != "paper":
        raise ValueError("the learned executor supports the paper's reward only")
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    policy = policy if policy is not None else MemPolicy(world.dim, config.hidden)
    reference = copy.deepcopy(policy).requires_grad_(False)
    optimiser = AdamW(policy.parameters(), lr=config.lr)
    targets = neighbourhood_targets(world, config)
    bank = MemoryBank(world.dim, 256, limit=config.capacity)
    seed_stale(bank, world, config.stale, seed)
    result = TrainResult(policy)
    buffer: list = []
    G = config.group_size
    order = np.concatenate([rng.permutation(world.train) for _ in range(config.epochs)])
    for i, q in enumerate(order):
        q = int(q)
        step = observe(world, executor, bank, q, rng, config.threshold)
        p_ext, p_man = policy.probabilities(step.features, step.manage_mask)
        ext = rng.choice(N_EXTRACT, size=G, p=p_ext)
        man = rng.choice(N_MANAGE, size=G, p=p_man)
        if learned:
            rewards = learned_candidate_rewards(world, executor, bank, q, step, ext, man,
                                                targets[q], rng, config.threshold,
                                                config.common_random_numbers)
        else:
            rewards = candidate_rewards(world, executor, bank, q, step, ext, man, targets[q],
                                        rng, config.threshold, config.reward,
                                        config.common_random_numbers)
        best = int(np.argmax(rewards))
        if rewards[best] > 1.0:  # positive utility: online memory evolution
            apply_action(bank, world, q, step, int(ext[best]), int(man[best]))
        adv = group_advantages(rewards, config.normalise)
        buffer.append((step.features, step.manage_mask, ext, man, adv, rewards.mean(),
                       expected_alpha(p_ext)))
        if len(buffer) == config.batch_queries or i == len(order) - 1:
            _update(policy, reference, optimiser, buffer, config)
            result.mean_reward.append(float(np.mean([b[5] for b in buffer])))
            result.mean_alpha.append(float(np.mean([b[6] for b in buffer])))
            buffer = []
    result.bank_size = len(bank)
    result.stale_left = int(np.sum(bank.source[: len(bank)] == -1))
    return result


def _update(policy, reference, optimiser, buffer, config: TrainConfig) -> None:
    G = config.group_size
    x = torch.as_tensor(np.repeat(np.stack([b[0] for b in buffer]), G, 0), dtype=torch.float32)
    mask = torch.as_tensor(np.repeat(np.stack([b[1] for b in buffer]), G, 0))
    ext = torch.as_tensor(np.concatenate([b[2] for b in buffer]))
    man = torch.as_tensor(np.concatenate([b[3] for b in buffer]))
    adv = torch.as_tensor(np.concatenate([b[4] for b in buffer]), dtype=torch.float32)
    if not torch.any(adv != 0):
        return
    flags = dict(use_extract=config.train_extract, use_manage=config.train_manage)
    with torch.no_grad():
        old = policy.log_prob(x, mask, ext, man, **flags)
        ref = reference.log_prob(x, mask, ext, man, **flags)
    for _ in range(config.inner_steps):
        loss = grpo_loss(policy.log_prob(x, mask, ext, man, **flags), old, ref, adv,
                         config.clip, config.kl_coef)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    policy.refresh()


# --- evaluation ----------------------------------------------------------------------------------


@dataclass
class StreamResult:
    """Per-step success probability, length, chosen abstraction (NaN: malformed or no memory)
    and management operation (0 = ADD, k = UPDATE_{k-1}; -1 when nothing was retrieved, so that
    ADD was the only choice, or when there is no policy)."""

    probability: np.ndarray
    length: np.ndarray
    alpha: np.ndarray
    operation: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.probability.mean())

    @property
    def cumulative(self) -> np.ndarray:
        return np.cumsum(self.probability) / np.arange(1, self.probability.size + 1)


def stream(world: World, executor: Executor | MemoryExecutor,
           policy: MemPolicy | RuleManagement | None, queries,
           seed: int = 0,
           threshold: float = 0.5, capacity: int | None = None,
           stale: int = 0) -> StreamResult:
    """Zero-reset streaming: an empty bank, the queries in a random order, the policy writing.

    ``policy=None`` is the no-memory agent; ``capacity`` caps the bank (``None``: unbounded);
    ``stale > 0`` starts from a bank holding that many misleading entries per family instead of
    an empty one (:func:`seed_stale`, the same entries for every agent of a stream seed).
    Accuracy is recorded as the executor's exact success
    probability at each step (an unbiased, lower-variance stand-in for the 0/1 outcome); the bank
    evolves with the sampled outcome, as it would in deployment.
    """
    queries = np.asarray(queries)
    if queries.ndim != 1 or queries.size == 0:
        raise ValueError("queries must be a non-empty 1-D array of query ids")
    rng = np.random.default_rng(seed)
    order = rng.permutation(queries)
    bank = MemoryBank(world.dim, 128, limit=capacity)
    seed_stale(bank, world, stale, seed)
    prob, length, alpha = (np.full(order.size, np.nan) for _ in range(3))
    operation = np.full(order.size, -1)
    for i, q in enumerate(order):
        q = int(q)
        step = observe(world, executor, bank, q, rng, threshold)
        prob[i], length[i] = step.probability, step.length
        if policy is None:
            continue
        p_ext, p_man = policy.probabilities(step.features, step.manage_mask)
        ext = int(rng.choice(N_EXTRACT, p=p_ext))
        man = int(rng.choice(N_MANAGE, p=p_man))
        if ext != MALFORMED:
            alpha[i] = ALPHAS[ext]
            if step.retrieved.size:
                operation[i] = man
        apply_action(bank, world, q, step, ext, man)
    return StreamResult(prob, length, alpha, operation)


# --- experiments ---------------------------------------------------------------------------------

VARIANTS = {
    "source-only": dict(neighbourhood=0),
    "UMEM N=1": dict(neighbourhood=1),
    "UMEM N=3": dict(neighbourhood=3),
    "UMEM N=5": dict(neighbourhood=5),
    "management-only": dict(train_extract=False),
    "extraction-only": dict(train_manage=False),
}
"""Trained variants: ``TrainConfig`` overrides (UMEM N=3 is the full method)."""


@dataclass
class Evaluation:
    """Streaming results of one agent, averaged over ``n_streams`` stream orders."""

    accuracy: float  # held-out queries of the training families
    accuracy_ood: float  # queries of held-out families
    length: float  # mean executor length (cost) on held-out queries
    alpha: float  # mean abstraction level written on held-out queries (NaN: none)
    alpha_ood: float  # mean abstraction level written on held-out families (NaN: none)
    add_rate: float  # share of ADD among writes that could have overwritten (NaN: none)
    curve: np.ndarray  # cumulative accuracy along the held-out stream
    curve_ood: np.ndarray
    cpu_seconds: float = 0.0  # CPU time of training


def evaluate(world: World, executor: Executor | MemoryExecutor,
             policy: MemPolicy | RuleManagement | None,
             n_streams: int = 3, seed: int = 0, threshold: float = 0.5, capacity: int | None = None,
             stale: int = 0, ood: bool = True) -> Evaluation:
    """Zero-reset streams over ``world.test`` and ``world.ood``, averaged over stream orders.

    ``ood=False`` skips the held-out families (their fields then repeat the held-out queries');
    every stream has its own seed, so the held-out-query results do not change.
    """
    n_streams = check_count(n_streams, "n_streams", 1)
    ind = [stream(world, executor, policy, world.test, seed + s, threshold, capacity, stale)
           for s in range(n_streams)]
    ood = ([stream(world, executor, policy, world.ood, seed + 1000 + s, threshold, capacity,
                   stale)
            for s in range(n_streams)] if world.ood.size and ood else ind)
    def add_rate(results) -> float:
        ops = np.concatenate([r.operation for r in results])
        return float(np.mean(ops[ops >= 0] == 0)) if np.any(ops >= 0) else float("nan")

    def mean_alpha(results) -> float:
        alphas = np.concatenate([r.alpha for r in results])
        return float(np.nanmean(alphas)) if np.any(~np.isnan(alphas)) else float("nan")

    return Evaluation(
        accuracy=float(np.mean([r.accuracy for r in ind])),
        accuracy_ood=float(np.mean([r.accuracy for r in ood])),
        length=float(np.mean([r.length.mean() for r in ind])),
        alpha=mean_alpha(ind),
        alpha_ood=mean_alpha(ood),
        add_rate=add_rate(ind),
        curve=np.mean([r.cumulative for r in ind], axis=0),
        curve_ood=np.mean([r.cumulative for r in ood], axis=0))


def run_replicate(seed: int, executor: Executor | MemoryExecutor, world_kwargs: dict | None = None,
                  train_kwargs: dict | None = None, variants: dict | None = None,
                  n_streams: int = 3, baselines: bool = True,
                  managed: tuple = (), ood: bool = True) -> dict[str, Evaluation]:
    """One world, every agent: no memory, the untrained policy, and each trained variant.

    ``train_kwargs["capacity"]`` caps the bank and ``train_kwargs["stale"]`` seeds it with
    misleading entries, in training and in the evaluation streams alike;
    ``baselines=False`` skips the no-memory and untrained agents; each variant named in
    ``managed`` is evaluated a second time with :class:`RuleManagement` in place of its own
    management head, under the name ``"<variant> + rule management"``; ``ood=False`` skips the
    held-out-family streams (:func:`evaluate`).

    Every trained variant starts from the same initial policy (the untrained one), sees the same
    world, the same number of GRPO updates and the same seed; only the reward's targets and the
    masked heads differ.
    """
    import time

    world = make_world(seed=seed, **(world_kwargs or {}))
    torch.manual_seed(seed)
    initial = MemPolicy(world.dim)
    cap = (train_kwargs or {}).get("capacity")
    stale = dict(stale=(train_kwargs or {}).get("stale", 0))
    out = ({"no memory": evaluate(world, executor, None, n_streams, seed, capacity=cap, ood=ood),
            "untrained": evaluate(world, executor, initial, n_streams, seed, capacity=cap,
                                  ood=ood, **stale)}
           if baselines else {})
    for name, overrides in (VARIANTS if variants is None else variants).items():
        config = TrainConfig(**{**(train_kwargs or {}), **overrides})
        start = time.process_time()
        trained = train_policy(world, executor, config, seed, copy.deepcopy(initial))
        cpu = time.process_time() - start
        out[name] = evaluate(world, executor, trained.policy, n_streams, seed,
                             capacity=config.capacity, stale=config.stale, ood=ood)
        out[name].cpu_seconds = cpu
        if name in managed:
            out[f"{name} + rule management"] = evaluate(
                world, executor, RuleManagement(trained.policy), n_streams, seed,
                capacity=config.capacity, stale=config.stale, ood=ood)
    return out


def lone_memory_gains(world: World, executor: Executor, query: int, insights, targets,
                      efficiency: bool = False, threshold: float = 0.5) -> np.ndarray:
    """Exact expected gain of a lone memory written from ``query``, per insight and level
    (``eq-umem-lone``).

    For every row of ``insights`` (unit vectors, shape ``(n, dim)``) and every abstraction level
    of :data:`ALPHAS`, the memory ``eq-umem-extract`` is the only entry of the bank. Each target
    retrieves it when its key ``e(query)`` clears ``threshold``; the reference bank is empty. With
    common random numbers the expected per-target gain ``eq-umem-gain`` is

    ``(p_mem - p_ref) + min(p_mem, p_ref) (1 - lambda_mem / lambda_ref)``,

    where ``lambda`` is the noise-free part of the length (the log-normal noise cancels in the
    ratio) and ``min(p_mem, p_ref)`` is the chance that both runs succeed on the same draw.
    ``efficiency=False`` keeps only the success gain ``p_mem - p_ref``. Returns the mean over
    ``targets``, shape ``(n, len(ALPHAS))``.
    """
    insights = np.atleast_2d(np.asarray(insights, dtype=float))
    if insights.shape[1] != world.dim:
        raise ValueError(f"insights must have width {world.dim}, got {insights.shape[1]}")
    targets = np.atleast_1d(np.asarray(targets, dtype=int))
    if targets.size == 0:
        raise ValueError("targets must not be empty")
    alphas = np.asarray(ALPHAS)[None, :, None]
    shortcut = world.shortcuts[query]
    values = _unit(alphas * insights[:, None, :] + (1 - alphas) * shortcut)  # (n, A, d)
    weight = values @ shortcut  # shortcut content <v, a_q>
    p_ref = executor.success_probability(0.0, 0.0, 0.0)
    total = np.zeros(weight.shape)
    for t in targets:
        if float(world.embeddings[t] @ world.embeddings[query]) < threshold:
            continue  # the target does not retrieve the memory: no gain
        r = np.maximum(0.0, values @ world.rules[world.family[t]])
        own = int(t) == query
        h, w = (weight, 0.0) if own else (0.0, weight)
        z = executor.b0 + executor.b_rule * r + executor.b_own * h - executor.b_mislead * w
        p = 1 / (1 + np.exp(-z))
        gain = p - p_ref
        if efficiency:
            ratio = (1 - executor.g_rule * r) * (1 + executor.g_mislead * w)
            gain = gain + np.minimum(p, p_ref) * (1 - ratio)
        total += gain
    return total / targets.size


def expected_gain_by_alpha(world: World, executor: Executor, query: int, targets,
                           insight_noise: float | None = None, draws: int = 200,
                           seed: int = 0, efficiency: bool = False,
                           threshold: float = 0.5) -> np.ndarray:
    """Expected gain of a lone memory of each abstraction level on ``targets``, over insights.

    Averages :func:`lone_memory_gains` over ``draws`` insights (a successful trajectory's noise
    level by default). With ``targets=[query]`` this is the source-only view; with a
    neighbourhood, the SNM view. ``efficiency=True`` adds the expected efficiency term of
    ``eq-umem-gain``, so the result is ``eq-umem-lone``: the expected marginal utility that the
    reward ``eq-umem-reward`` pays (format term excluded) when the bank holds nothing else.
    """
    draws = check_count(draws, "draws", 1)
    rng = np.random.default_rng(seed)
    s = executor.insight_noise_success if insight_noise is None else insight_noise
    rule = world.rules[world.family[query]]
    insights = _unit(rule + s * rng.normal(size=(draws, world.dim)) / np.sqrt(world.dim))
    return lone_memory_gains(world, executor, query, insights, targets, efficiency,
                             threshold).mean(axis=0)


def lemma_check(embeddings: np.ndarray, pairs: np.ndarray, keys: np.ndarray
                ) -> tuple[int, int, float]:
    """The neighbourhood lemma ``eq-umem-lemma`` on many (query, neighbour) pairs at once.

    ``pairs`` holds rows ``(i, j)`` of query ids. Returns the number of (pair, key) cases where
    ``|e_i.k - e_j.k|`` exceeds ``||e_i - e_j||`` (beyond rounding), the number of cases tested,
    and the largest ratio of gap to bound (at most 1 when the lemma holds).
    """
    pairs = np.asarray(pairs, dtype=int)
    keys = np.atleast_2d(np.asarray(keys, dtype=float))
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"pairs must have shape (n, 2), got {pairs.shape}")
    if keys.shape[1] != embeddings.shape[1]:
        raise ValueError(f"keys must have width {embeddings.shape[1]}, got {keys.shape[1]}")
    if np.any(np.abs(np.linalg.norm(embeddings, axis=1) - 1) > 1e-9) or np.any(
            np.abs(np.linalg.norm(keys, axis=1) - 1) > 1e-9):
        raise ValueError("embeddings and keys must be unit vectors")
    diff = embeddings[pairs[:, 0]] - embeddings[pairs[:, 1]]  # (n, d)
    gap = np.abs(diff @ keys.T)  # (n, keys)
    bound = np.linalg.norm(diff, axis=1, keepdims=True)
    violations = int(np.sum(gap > bound + 1e-12))
    ratio = float(np.max(gap / np.maximum(bound, 1e-300)))
    return violations, int(gap.size), ratio


def reward_curves(world: World, executor: Executor, sizes=(1, 3, 5), draws: int = 20,
                  seed: int = 0, threshold: float = 0.5) -> dict:
    """What the world predicts: expected reward of a lone memory by level (``eq-umem-lone``).

    Averaged over the training queries, with the same insights for every target set:

    * ``"source"``: the expected marginal utility (``eq-umem-gain`` with its efficiency term) on
      the source query alone, i.e. what the source-only reward pays;
    * each ``N`` in ``sizes``: the same on ``NN_N(q)``, what UMEM's reward pays;
    * ``"held-out"``: the expected success gain of a held-out query of the same family that
      retrieves the memory, i.e. what streaming evaluation measures.

    Each value is an array over :data:`ALPHAS`.
    """
    draws = check_count(draws, "draws", 1)
    rng = np.random.default_rng(seed)
    neighbours = {n: semantic_neighbourhood(world.embeddings, world.train, n) for n in sizes}
    out = {key: np.zeros(len(ALPHAS)) for key in ("source", *sizes, "held-out")}
    s = executor.insight_noise_success
    for row, q in enumerate(world.train):
        q = int(q)
        rule = world.rules[world.family[q]]
        insights = _unit(rule + s * rng.normal(size=(draws, world.dim)) / np.sqrt(world.dim))
        out["source"] += lone_memory_gains(world, executor, q, insights, [q], True,
                                           threshold).mean(0)
        for n in sizes:
            out[n] += lone_memory_gains(world, executor, q, insights, neighbours[n][row], True,
                                        threshold).mean(0)
        held_out = world.test[world.family[world.test] == world.family[q]]
        if held_out.size:
            out["held-out"] += lone_memory_gains(world, executor, q, insights, held_out,
                                                 False, -np.inf).mean(0)
    return {key: value / len(world.train) for key, value in out.items()}


# --- a learned executor --------------------------------------------------------------------------

GRADE_SHARPNESS = 8.0
"""Sharpness ``kappa`` of the grader of the learned executor's answers (``eq-umem-learned``)."""
GRADE_BAR = 0.75
"""Cosine ``theta`` at which a graded answer succeeds with probability one half."""


def answers(world: World) -> np.ndarray:
    """The answer ``y_q = normalise(u_f + a_q)`` of every query: a rule and an instance part."""
    return world.answer_vectors.copy()


class LearnedExecutor(nn.Module):
    """A small executor trained to answer from the query and its retrieved memories.

    ``y_hat = Phi e(q) + exp(gamma) Psi sum_m softmax_m(omega sim_m) v_m`` over the retrieved
    values ``v_m`` with key similarities ``sim_m``; the answer succeeds with probability
    ``sigmoid(kappa (cos(y_hat, y_q) - theta))`` (``eq-umem-learned``). Nothing in it says which
    memory helps or misleads: that is learned from episodes (:func:`train_executor`).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = check_count(dim, "dim", 1)
        self.prior = nn.Linear(dim, dim, bias=False)
        self.read = nn.Linear(dim, dim, bias=False)
        self.temperature = nn.Parameter(torch.tensor(1.0))
        self.gate = nn.Parameter(torch.tensor(0.0))

    def forward(self, e, values, sims, mask) -> torch.Tensor:
        """The answer vector ``y_hat`` for queries ``e`` (n, d) and memories (n, slots, d)."""
        any_memory = mask.sum(-1, keepdim=True) > 0
        weights = torch.softmax(self.temperature * sims + torch.log(mask + 1e-9), -1) * any_memory
        read = self.read((weights[..., None] * values).sum(1))
        return self.prior(e) + torch.exp(self.gate) * read

    def success_probability(self, e, values, sims, mask, y) -> torch.Tensor:
        cos = (nn.functional.normalize(self(e, values, sims, mask), dim=-1) * y).sum(-1)
        return torch.sigmoid(GRADE_SHARPNESS * (cos - GRADE_BAR))


def executor_episodes(world: World, n: int, rng: np.random.Generator, own_share: float = 0.3,
                      insight_noise: float = 0.6):
    """``n`` training episodes for :class:`LearnedExecutor`: a training query and 0-3 memories.

    Each memory was written from the query itself (probability ``own_share``) or from another
    training query of its family, at a random abstraction level (``eq-umem-extract``). Returns
    tensors ``(e, values, sims, mask, y)``.
    """
    n = check_count(n, "episodes", 1)
    d = world.dim
    q = rng.choice(world.train, size=n)
    count = rng.integers(0, TOP_K + 1, size=n)
    mask = np.arange(TOP_K)[None, :] < count[:, None]
    same = [world.train[world.family[world.train] == f] for f in range(world.rules.shape[0])]
    src = np.where(rng.uniform(size=(n, TOP_K)) < own_share, q[:, None],
                   np.stack([rng.choice(same[world.family[qi]], size=TOP_K) for qi in q]))
    alpha = np.asarray(ALPHAS)[rng.integers(0, len(ALPHAS), size=(n, TOP_K))][..., None]
    insight = _unit(world.rules[world.family[src]]
                    + insight_noise * rng.normal(size=(n, TOP_K, d)) / np.sqrt(d))
    values = _unit(alpha * insight + (1 - alpha) * world.shortcuts[src]) * mask[..., None]
    sims = np.where(mask, np.einsum("nd,nkd->nk", world.embeddings[q], world.embeddings[src]),
                    -1.0)
    as_tensor = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    return (as_tensor(world.embeddings[q]), as_tensor(values), as_tensor(sims), as_tensor(mask),
            as_tensor(answers(world)[q]))


def train_executor(world: World, episodes: int = 3000, steps: int = 300, lr: float = 0.02,
                   seed: int = 0) -> LearnedExecutor:
    """Train a :class:`LearnedExecutor` once, by full-batch Adam on the log success probability."""
    steps = check_count(steps, "steps", 1)
    rng = np.random.default_rng([seed, 31])
    data = executor_episodes(world, episodes, rng)
    torch.manual_seed(seed)
    model = LearnedExecutor(world.dim)
    optimiser = AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = -torch.log(model.success_probability(*data) + 1e-9).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.requires_grad_(False)


@torch.no_grad()
def learned_success(model: LearnedExecutor, world: World, queries, values=None,
                    sims=None) -> np.ndarray:
    """Success probability of each query with one memory (row of ``values``, key similarity
    ``sims``) or with none (``values=None``)."""
    queries = np.asarray(queries, dtype=int)
    n, d = queries.size, world.dim
    e = torch.as_tensor(world.embeddings[queries], dtype=torch.float32)
    y = torch.as_tensor(answers(world)[queries], dtype=torch.float32)
    slots, sim, mask = torch.zeros(n, TOP_K, d), torch.full((n, TOP_K), -1.0), torch.zeros(n, TOP_K)
    if values is not None:
        slots[:, 0] = torch.as_tensor(np.array(np.broadcast_to(values, (n, d))),
                                      dtype=torch.float32)
        sim[:, 0] = torch.as_tensor(np.array(np.broadcast_to(sims, (n,))), dtype=torch.float32)
        mask[:, 0] = 1.0
    return model.success_probability(e, slots, sim, mask, y).double().numpy()


def learned_reward_curves(model: LearnedExecutor, world: World, sizes=(3,), draws: int = 4,
                          seed: int = 0, threshold: float = 0.5) -> dict:
    """:func:`reward_curves` for the learned executor: expected success gain of a lone memory.

    Per abstraction level, averaged over the training queries and ``draws`` insights: on the
    source query (key similarity 1), on ``NN_n(q)`` for each ``n`` in ``sizes`` (a target whose
    similarity to the key is
    below ``threshold`` does not retrieve it and gains 0), and on the held-out queries of the
    same family (retrieval assumed, as in :func:`reward_curves`).
    """
    draws = check_count(draws, "draws", 1)
    rng = np.random.default_rng(seed)
    train = world.train
    pairs = {"source": (np.arange(train.size), train)}
    for n in sizes:
        neighbours = semantic_neighbourhood(world.embeddings, train, n)
        pairs[n] = (np.repeat(np.arange(train.size), n), neighbours.ravel())
    held = [(row, t) for row, q in enumerate(train)
            for t in world.test[world.family[world.test] == world.family[q]]]
    if held:
        pairs["held-out"] = tuple(np.array(x) for x in zip(*held, strict=True))
    base = learned_success(model, world, np.arange(world.family.size))
    s = Executor().insight_noise_success
    insights = _unit(world.rules[world.family[train]][:, None, :]
                     + s * rng.normal(size=(train.size, draws, world.dim)) / np.sqrt(world.dim))
    out = {key: np.zeros(len(ALPHAS)) for key in pairs}
    for a, alpha in enumerate(ALPHAS):
        for k in range(draws):
            values = _unit(alpha * insights[:, k] + (1 - alpha) * world.shortcuts[train])
            for key, (rows, targets) in pairs.items():
                sims = np.einsum("nd,nd->n", world.embeddings[targets],
                                 world.embeddings[train[rows]])
                gain = learned_success(model, world, targets, values[rows], sims) - base[targets]
                if key != "held-out":
                    gain = np.where(sims >= threshold, gain, 0.0)
                per_query = np.bincount(rows, gain, train.size) / np.maximum(
                    np.bincount(rows, minlength=train.size), 1)
                out[key][a] += per_query[np.bincount(rows, minlength=train.size) > 0].mean()
    return {key: value / draws for key, value in out.items()}


def train_executors(worlds, episodes: int = 3000, steps: int = 300, lr: float = 0.02,
                    seeds=None) -> list[LearnedExecutor]:
    """:func:`train_executor` for many worlds at once: stacked parameters, one Adam, one loss.

    The loss is the sum of the worlds' losses and every parameter belongs to one world, so each
    executor follows its own full-batch Adam trajectory (Adam is elementwise); only the cost is
    shared. ``seeds`` (default ``0, 1, ...``) seeds each world's episodes and initial weights.
    """
    worlds = list(worlds)
    if not worlds:
        raise ValueError("train_executors needs at least one world")
    dims = {w.dim for w in worlds}
    if len(dims) != 1:
        raise ValueError(f"the worlds must share one dimension, got {sorted(dims)}")
    steps = check_count(steps, "steps", 1)
    seeds = list(range(len(worlds))) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(worlds):
        raise ValueError(f"{len(seeds)} seeds for {len(worlds)} worlds")
    data = [executor_episodes(w, episodes, np.random.default_rng([s, 31]))
            for w, s in zip(worlds, seeds, strict=True)]
    e, values, sims, mask, y = (torch.stack(x) for x in zip(*data, strict=True))
    inits = []
    for s, w in zip(seeds, worlds, strict=True):
        torch.manual_seed(s)
        inits.append(LearnedExecutor(w.dim))
    prior = nn.Parameter(torch.stack([m.prior.weight.detach() for m in inits]))
    read = nn.Parameter(torch.stack([m.read.weight.detach() for m in inits]))
    temperature = nn.Parameter(torch.stack([m.temperature.detach() for m in inits]))
    gate = nn.Parameter(torch.stack([m.gate.detach() for m in inits]))
    any_memory = mask.sum(-1, keepdim=True) > 0
    log_mask = torch.log(mask + 1e-9)
    optimiser = AdamW([prior, read, temperature, gate], lr=lr)
    for _ in range(steps):
        weights = torch.softmax(temperature[:, None, None] * sims + log_mask, -1) * any_memory
        memory = (weights[..., None] * values).sum(2)
        y_hat = (torch.bmm(e, prior.transpose(1, 2))
                 + torch.exp(gate)[:, None, None] * torch.bmm(memory, read.transpose(1, 2)))
        cos = (nn.functional.normalize(y_hat, dim=-1) * y).sum(-1)
        p = torch.sigmoid(GRADE_SHARPNESS * (cos - GRADE_BAR))
        loss = -torch.log(p + 1e-9).mean(-1).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    out = []
    for r, model in enumerate(inits):
        with torch.no_grad():
            model.prior.weight.copy_(prior[r])
            model.read.weight.copy_(read[r])
            model.temperature.copy_(temperature[r])
            model.gate.copy_(gate[r])
        out.append(model.requires_grad_(False))
    return out


# --- the learned executor as the agent's executor ------------------------------------------------


@dataclass(frozen=True)
class MemoryExecutor:
    """A :class:`LearnedExecutor` as the executor of the agent, its GRPO reward and its streams.

    NumPy weights of ``eq-umem-learned``: success probability
    ``sigmoid(kappa (cos(Phi e + exp(gamma) Psi read, y_q) - theta))`` over the retrieved
    memories' values and key similarities. It has no cost, so the efficiency term of
    ``eq-umem-gain`` is zero and every length is ``length0``; a trajectory's insight is drawn as
    for :class:`Executor`. ``read_scale=0`` gives an executor that ignores its memories (the
    falsification control: no memory policy can change its success).
    """

    prior: np.ndarray  # Phi, (d, d)
    read: np.ndarray  # Psi, (d, d)
    temperature: float  # omega
    gate: float  # gamma
    read_scale: float = 1.0
    length0: float = 1.0
    insight_noise_success: float = 0.6
    insight_noise_failure: float = 1.2

    @classmethod
    def from_model(cls, model: LearnedExecutor, ignore_memories: bool = False) -> MemoryExecutor:
        if not isinstance(model, LearnedExecutor):
            raise TypeError("model must be a LearnedExecutor")
        return cls(model.prior.weight.detach().double().numpy().copy(),
                   model.read.weight.detach().double().numpy().copy(),
                   float(model.temperature), float(model.gate),
                   0.0 if ignore_memories else 1.0)

    def success(self, world: World, queries, values, sims, mask) -> np.ndarray:
        """Success probability of each query given its memories (``(..., K, d)`` values,
        ``(..., K)`` similarities and 0/1 mask; ``queries`` of the leading shape)."""
        queries = np.asarray(queries, dtype=int)
        mask = np.asarray(mask, dtype=float)
        logits = np.where(mask > 0, self.temperature * np.asarray(sims, dtype=float), -np.inf)
        top = np.max(logits, axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        weights = np.exp(logits - top)
        weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-300)
        memory = np.einsum("...k,...kd->...d", weights, values)
        y_hat = (world.embeddings[queries] @ self.prior.T
                 + self.read_scale * math.exp(self.gate) * memory @ self.read.T)
        y_hat = y_hat / np.maximum(np.linalg.norm(y_hat, axis=-1, keepdims=True), 1e-12)
        cos = np.sum(y_hat * world.answer_vectors[queries], axis=-1)
        return 1 / (1 + np.exp(-GRADE_SHARPNESS * (cos - GRADE_BAR)))

    def insight(self, world: World, query: int, correct: int, rng: np.random.Generator):
        s = self.insight_noise_success if correct else self.insight_noise_failure
        return _unit(world.rules[world.family[query]] + s * rng.normal(size=world.dim)
                     / np.sqrt(world.dim))


def _observe_learned(world: World, executor: MemoryExecutor, bank: MemoryBank, query: int,
                     rng: np.random.Generator, threshold: float) -> Step:
    """:func:`observe` with a :class:`MemoryExecutor` (same random draws, constant length)."""
    d = world.dim
    if len(bank):
        sims_all = bank.similarities(world.embeddings[query])
        retrieved = top_k(sims_all, TOP_K, threshold)
        sims = sims_all[retrieved]
    else:
        retrieved, sims = np.zeros(0, dtype=int), np.zeros(0)
    values, slot_sims, mask = np.zeros((TOP_K, d)), np.zeros(TOP_K), np.zeros(TOP_K)
    values[: retrieved.size], slot_sims[: retrieved.size] = bank.values[retrieved], sims
    mask[: retrieved.size] = 1.0
    p = float(executor.success(world, query, values, slot_sims, mask))
    c = int(rng.uniform() < p)
    rng.normal()  # the length noise of the hand-set executor, drawn to keep the streams aligned
    x = policy_features(world, query, c, executor.length0, executor.length0, sims,
                        bank.alpha[retrieved], bank.full)
    manage_mask = np.zeros(N_MANAGE, dtype=bool)
    manage_mask[: 1 + retrieved.size] = True
    return Step(x, manage_mask, retrieved, c, executor.length0, p,
                executor.insight(world, query, c, rng))


def learned_candidate_rewards(world: World, executor: MemoryExecutor, bank: MemoryBank,
                              query: int, step: Step, ext: np.ndarray, man: np.ndarray,
                              targets: np.ndarray, rng: np.random.Generator,
                              threshold: float = 0.5, common: bool = False) -> np.ndarray:
    """:func:`candidate_rewards` (``kind="paper"``) with a :class:`MemoryExecutor`.

    Each target is executed on the bank ``B`` and on each candidate's ``B_g``, the learned
    executor reading the values and key similarities of the top ``K`` entries above
    ``threshold``; the gain is the success gain of ``eq-umem-gain`` (the learned executor has no
    cost, so no efficiency term). ``common=False``: one reference draw per target shared by the
    group and a fresh draw for every rollout's execution of every target, as the released reward;
    ``common=True``: one uniform per target for all executions.
    """
    G, T, d = len(ext), len(targets), world.dim
    targets = np.asarray(targets, dtype=int)
    rewards = np.zeros(G)
    key = world.embeddings[query]
    s_new = world.embeddings[targets] @ key
    base = []
    ref_values, ref_sims, ref_mask = np.zeros((T, TOP_K, d)), np.zeros((T, TOP_K)), np.zeros(
        (T, TOP_K))
    for t, target in enumerate(targets):
        if len(bank):
            sims = bank.similarities(world.embeddings[target])
            top = top_k(sims, TOP_K + 1, threshold)
        else:
            sims, top = np.zeros(0), np.zeros(0, dtype=int)
        base.append([(float(sims[i]), int(i)) for i in top])
        ref = top[:TOP_K]
        ref_values[t, : ref.size], ref_sims[t, : ref.size] = bank.values[ref], sims[ref]
        ref_mask[t, : ref.size] = 1.0
    actions = sorted({(int(e), int(m)) for e, m in zip(ext, man, strict=True)
                      if int(e) != MALFORMED})
    row = {a: i + 1 for i, a in enumerate(actions)}  # row 0 is the reference bank
    values = np.zeros((1 + len(actions), T, TOP_K, d))
    slot_sims, mask = np.zeros((1 + len(actions), T, TOP_K)), np.zeros((1 + len(actions), T, TOP_K))
    values[0], slot_sims[0], mask[0] = ref_values, ref_sims, ref_mask
    insight, shortcut = step.insight, world.shortcuts[query]
    layouts: dict = {}  # the retrieved set depends on the entry an action replaces, not its level
    for i, (e_action, m_action) in enumerate(actions, start=1):
        alpha = ALPHAS[e_action]
        value = _unit(alpha * insight + (1 - alpha) * shortcut)  # eq-umem-extract
        if m_action > 0:
            replaced = int(step.retrieved[m_action - 1])
        elif bank.full:
            replaced = bank.add_slot()
        else:
            replaced = -1
        if replaced not in layouts:
            new_index = len(bank) if replaced < 0 else replaced
            layout = []
            for t in range(T):
                entries = [(s, j) for s, j in base[t] if j != replaced]
                entries.append((float(s_new[t]), new_index))
                entries = sorted((x for x in entries if x[0] >= threshold),
                                 key=lambda x: (-x[0], x[1]))[:TOP_K]
                layout.append([(s, j, j == new_index) for s, j in entries])
            layouts[replaced] = layout
        for t, entries in enumerate(layouts[replaced]):
            for k, (s, j, is_new) in enumerate(entries):
                values[i, t, k] = value if is_new else bank.values[j]
                slot_sims[i, t, k], mask[i, t, k] = s, 1.0
    p = executor.success(world, np.broadcast_to(targets, (1 + len(actions), T)), values,
                         slot_sims, mask)
    u_ref = rng.uniform(size=T)
    c_ref = (u_ref < p[0]).astype(float)
    u = np.broadcast_to(u_ref, (G, T)) if common else rng.uniform(size=(G, T))
    formed = np.asarray(ext) != MALFORMED
    rows = np.array([row[(int(e), int(m))] if f else 0 for e, m, f in zip(ext, man, formed,
                                                                          strict=True)])
    gains = np.mean((u < p[rows]) - c_ref, axis=1)
    rewards[formed] = 1.0 + gains[formed]
    return rewards
