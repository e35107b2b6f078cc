"""An opponent model that learns in context: tiny transformers meta-trained on histories.

The paper's belief is a language model that reads the history of past episodes and imitates the
opponent in context. Its stand-in here is an ensemble of tiny transformers, meta-trained on
``(offer, round, accept)`` histories of random sellers, with no parameter update at test time:
the belief about a new offer is the model's output given the history in its context.

* :func:`simulate_episodes` plays ``E`` episodes per history with proposals drawn from the
  proposal distribution against given seller types (Eq. (eq-sfp-seller)), vectorised over
  histories; :func:`stream` flattens them, in a chosen episode order, into observation streams.
* :class:`InContextEnsemble` holds ``M`` independent transformers as stacked weights (one forward
  pass trains them all). Each observation is one token, each query another; a query attends to
  the observations before it and to itself only (:func:`attention_mask`), so one pass predicts
  every observation of a history from those before it, and probes appended at the end read the
  belief after the whole history.
* :func:`recency_index` measures whether a belief follows the time average or the most recent
  episodes (Eq. (eq-sfp-recency)): it compares the belief after the same episodes in two orders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from icml26.core import check_count
from icml26.nn import AdamW

from .negotiation import PriceGame, fit_logistic, pseudo_data, sigmoid

RBF_CENTRES = 12


@dataclass(frozen=True)
class TypePrior:
    """Random seller types: ``theta0 ~ U[theta_low, theta_high]``, ``beta`` log-uniform."""

    theta_low: float = 0.45
    theta_high: float = 0.85
    beta_low: float = 0.5
    beta_high: float = 2.5

    def sample(self, rng: np.random.Generator, size) -> tuple[np.ndarray, np.ndarray]:
        theta = rng.uniform(self.theta_low, self.theta_high, size)
        beta = np.exp(rng.uniform(np.log(self.beta_low), np.log(self.beta_high), size))
        return theta, beta


def type_acceptance(game: PriceGame, theta0, beta, offers, floor: float = 0.3,
                    steepness: float = 0.03) -> np.ndarray:
    """Acceptance of sellers ``(theta0, beta)`` (shape ``S``) for offers of shape ``S + (H,)``."""
    theta0, beta = np.asarray(theta0, dtype=float), np.asarray(beta, dtype=float)
    h = np.arange(game.rounds) / game.rounds
    thresholds = floor + (theta0 - floor)[..., None] * (1 - h) ** beta[..., None]
    return sigmoid((np.asarray(offers, dtype=float) - thresholds) / steepness)


@dataclass(frozen=True)
class Episodes:
    """Episodes of many histories: offers, accepts and which rounds were played, ``(n, E, H)``."""

    x: np.ndarray
    y: np.ndarray
    seen: np.ndarray


def simulate_episodes(game: PriceGame, rng: np.random.Generator, theta0, beta) -> Episodes:
    """Play one episode per entry of ``theta0``/``beta`` (shape ``(n, E)``) with proposals drawn
    from the proposal distribution; an episode ends at the first accepted offer."""
    theta0 = np.asarray(theta0, dtype=float)
    if theta0.ndim != 2 or np.shape(beta) != theta0.shape:
        raise ValueError("theta0 and beta must both have shape (n, E)")
    n, episodes = theta0.shape
    s = game.sample_strategies(rng, (n, episodes))
    x = np.minimum(s[..., :1] + s[..., 1:] * np.arange(game.rounds), game.value)
    accept = rng.random(x.shape) < type_acceptance(game, theta0, beta, x)
    first = np.where(accept.any(axis=-1), accept.argmax(axis=-1), game.rounds - 1)
    seen = np.arange(game.rounds) <= first[..., None]
    return Episodes(x, (accept & seen).astype(float), seen)


def stream(game: PriceGame, episodes: Episodes, order=None, length: int | None = None):
    """Flatten episodes, in episode ``order``, into left-aligned observation streams.

    Returns ``(x, h, y, valid)``, each ``(n, length)``; ``length`` defaults to the longest
    stream (at most ``E H``); shorter streams are padded with invalid entries.
    """
    order = np.arange(episodes.x.shape[1]) if order is None else np.asarray(order)
    if order.ndim != 1 or not np.all(np.isin(order, np.arange(episodes.x.shape[1]))):
        raise ValueError("order must index the episodes of the history")
    n, H = episodes.x.shape[0], game.rounds
    x = episodes.x[:, order].reshape(n, -1)
    y = episodes.y[:, order].reshape(n, -1)
    valid = episodes.seen[:, order].reshape(n, -1)
    h = np.broadcast_to(np.arange(H), episodes.x[:, order].shape).reshape(n, -1)
    idx = np.argsort(~valid, axis=1, kind="stable")
    length = int(valid.sum(axis=1).max()) if length is None else length

    def take(a):
        return np.ascontiguousarray(np.take_along_axis(a, idx, axis=1)[:, :length])

    return take(x), take(h), take(y), take(valid)


def features(game: PriceGame, x, h) -> np.ndarray:
    """Input encoding of an offer ``x`` in round ``h``: radial bumps in ``x``, a round one-hot."""
    x = np.asarray(x, dtype=float)
    centres = np.linspace(0.0, game.value, RBF_CENTRES)
    bumps = np.exp(-0.5 * ((x[..., None] - centres) * (RBF_CENTRES - 1) / game.value) ** 2)
    return np.concatenate([bumps, np.eye(game.rounds)[np.asarray(h)]], axis=-1)


def attention_mask(valid: torch.Tensor, query_pos) -> torch.Tensor:
    """Which token may attend to which: ``(n, 1, T, T)`` with ``T = L + Q``.

    Observation ``i`` sees the valid observations ``j <= i``; a query at position ``p`` sees the
    valid observations ``j < p`` (``p = t`` for the query of observation ``t``, ``p = L`` for a
    probe after the whole history); ``query_pos`` is ``(Q,)`` or ``(n, Q)``. Every token also
    sees itself; queries never see each other.
    """
    n, L = valid.shape
    query_pos = torch.as_tensor(np.asarray(query_pos)).expand(n, -1)
    limit = torch.cat([torch.arange(1, L + 1).expand(n, -1), query_pos], dim=1)  # (n, T)
    T = limit.shape[1]
    see = (torch.arange(L)[None, None, :] < limit[:, :, None]) & valid[:, None, :]
    mask = torch.zeros(n, T, T, dtype=torch.bool)
    mask[:, :, :L] = see
    mask |= torch.eye(T, dtype=torch.bool)[None]
    return mask[:, None]


class InContextEnsemble(torch.nn.Module):
    """``models`` independent pre-LayerNorm transformers with stacked weights.

    Observation tokens embed ``(phi, y phi, y)``, query tokens ``phi`` (:func:`features`), both
    plus a learned position; the output of a query token is the logit of acceptance.
    """

    def __init__(self, game: PriceGame, models: int, *, length: int, d_model: int = 32,
                 heads: int = 4, layers: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.game, self.heads = game, heads
        self.models = check_count(models, "models", 1)
        self.length = check_count(length, "length", 1)
        d = check_count(d_model, "d_model", 1)
        if check_count(heads, "heads", 1) and d % heads:
            raise ValueError(f"d_model ({d}) must be a multiple of heads ({heads})")
        g = torch.Generator().manual_seed(int(seed))
        fdim = RBF_CENTRES + game.rounds

        def param(*shape, std=0.02):
            return torch.nn.Parameter(torch.randn(models, *shape, generator=g) * std)

        def zeros(*shape):
            return torch.nn.Parameter(torch.zeros(models, *shape))

        def ones(*shape):
            return torch.nn.Parameter(torch.ones(models, *shape))

        self.w_obs = param(2 * fdim + 1, d, std=0.2)
        self.w_query = param(fdim, d, std=0.2)
        self.pos = param(length + 1, d, std=0.2)
        self.ln = torch.nn.ParameterList()
        self.blocks = torch.nn.ParameterList()
        res = 0.02 / math.sqrt(2 * layers)
        for _ in range(layers):
            self.blocks.extend([param(d, 3 * d, std=0.1), param(d, d, std=res),
                                param(d, 4 * d, std=0.1), zeros(4 * d), param(4 * d, d, std=res)])
            self.ln.extend([ones(d), zeros(d), ones(d), zeros(d)])
        self.ln_f = torch.nn.ParameterList([ones(d), zeros(d)])
        self.head = param(d, 1, std=0.02)
        self.bias = zeros(1)
        self.layers = layers

    def _norm(self, x, gain, shift):
        return F.layer_norm(x, x.shape[-1:]) * gain[:, None, None] + shift[:, None, None]

    def forward(self, x, h, y, valid, qx, qh, query_pos) -> torch.Tensor:
        """Logits ``(M, n, Q)`` of acceptance for queries ``(qx, qh)`` ``(M, n, Q)``.

        ``x, h, y, valid`` ``(M, n, L)`` are the observation streams; ``query_pos`` ``(Q,)`` or
        ``(n, Q)`` the position of each query: ``t`` for the query of observation ``t``, the
        number of valid observations for a probe after the whole history.
        """
        game = self.game
        M, n, L = x.shape
        phi = torch.tensor(features(game, x, h), dtype=torch.float32)
        yy = torch.tensor(np.asarray(y), dtype=torch.float32)[..., None]
        obs = torch.cat([phi, yy * phi, yy], dim=-1)
        qphi = torch.tensor(features(game, qx, qh), dtype=torch.float32)
        query_pos = torch.tensor(np.broadcast_to(np.asarray(query_pos), (n, qx.shape[-1])))
        tokens = torch.cat([obs @ self.w_obs[:, None] + self.pos[:, None, :L],
                            qphi @ self.w_query[:, None] + self.pos[:, query_pos]], dim=2)
        v = torch.tensor(np.asarray(valid)).reshape(M * n, L)
        mask = attention_mask(v, query_pos.repeat(M, 1)).reshape(M, n, 1, *([tokens.shape[2]] * 2))
        d = tokens.shape[-1]
        hd = d // self.heads
        z = tokens
        for layer in range(self.layers):
            w_qkv, w_o, w_in, b_in, w_out = self.blocks[5 * layer:5 * layer + 5]
            g1, s1, g2, s2 = self.ln[4 * layer:4 * layer + 4]
            a = self._norm(z, g1, s1) @ w_qkv[:, None]
            q, k, vv = (t.reshape(M, n, -1, self.heads, hd).transpose(2, 3)
                        for t in a.split(d, dim=-1))
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            scores = scores.masked_fill(~mask, float("-inf"))
            att = scores.softmax(dim=-1) @ vv
            z = z + att.transpose(2, 3).reshape(M, n, -1, d) @ w_o[:, None]
            hidden = F.gelu(self._norm(z, g2, s2) @ w_in[:, None] + b_in[:, None, None])
            z = z + hidden @ w_out[:, None]
        out = self._norm(z[:, :, L:], *self.ln_f) @ self.head[:, None]
        return out[..., 0] + self.bias[:, None]


def training_batch(game: PriceGame, rng: np.random.Generator, models: int, batch: int,
                   episodes: int, prior: TypePrior, hazard) -> tuple:
    """Histories of random sellers for every model: ``(x, h, y, valid)`` each ``(M, n, L)``.

    ``hazard[m]`` is model ``m``'s per-episode chance that the seller redraws its type (0: a
    stationary seller, the setting of the time average).
    """
    theta, beta = prior.sample(rng, (models * batch, episodes))
    redraw = rng.random((models * batch, episodes)) < np.repeat(np.asarray(hazard), batch)[:, None]
    redraw[:, 0] = True
    last = np.maximum.accumulate(np.where(redraw, np.arange(episodes), 0), axis=1)
    theta = np.take_along_axis(theta, last, axis=1)
    beta = np.take_along_axis(beta, last, axis=1)
    ep = simulate_episodes(game, rng, theta, beta)
    x, h, y, valid = stream(game, ep)
    return tuple(a.reshape(models, batch, -1) for a in (x, h, y, valid))


def meta_train(model: InContextEnsemble, rng: np.random.Generator, *, steps: int, batch: int,
               episodes: int, prior: TypePrior = TypePrior(), hazard=None, lr: float = 3e-3):
    """Meta-train every member on fresh random histories; returns the losses ``(steps, M)``."""
    steps = check_count(steps, "steps", 1)
    hazard = np.zeros(model.models) if hazard is None else np.asarray(hazard, dtype=float)
    if hazard.shape != (model.models,) or np.any((hazard < 0) | (hazard > 1)):
        raise ValueError("hazard must give one probability in [0, 1] per model")
    optim = AdamW(model.parameters(), lr=lr)  # Adam; torch.optim would import its compiler
    losses = []
    model.train()
    for step in range(steps):
        x, h, y, valid = training_batch(model.game, rng, model.models, batch, episodes, prior,
                                        hazard)
        L = x.shape[-1]
        logits = model(x, h, y, valid, x, h, np.arange(L))
        target = torch.tensor(y, dtype=torch.float32)
        weight = torch.tensor(valid, dtype=torch.float32)
        per = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        loss_m = (per * weight).sum(dim=(1, 2)) / weight.sum(dim=(1, 2))
        optim.zero_grad()
        loss_m.sum().backward()
        optim.step(lr * 0.5 * (1 + math.cos(math.pi * step / steps)))  # cosine decay
        losses.append(loss_m.detach().numpy())
    model.eval()
    return np.array(losses)


def beliefs(model: InContextEnsemble, x, h, y, valid, px, ph) -> np.ndarray:
    """Every member's acceptance belief ``(M, n, P)`` for probes ``(px, ph)`` ``(P,)`` after the
    histories ``(x, h, y, valid)`` ``(n, L)``, the same histories for every member."""
    M = model.models
    n, L = np.shape(x)

    def expand(a):
        return np.broadcast_to(np.asarray(a), (M, n) + np.shape(a)[1:])

    P = len(px)
    with torch.no_grad():
        logits = model(expand(x), expand(h), expand(y), expand(valid),
                       expand(np.broadcast_to(px, (n, P))), expand(np.broadcast_to(ph, (n, P))),
                       np.repeat(np.asarray(valid).sum(axis=1)[:, None], P, axis=1))
    return torch.sigmoid(logits).numpy()


def recency_index(p_recent_last, p_recent_first, q_first, q_last) -> np.ndarray:
    """Eq. (eq-sfp-recency): how far a belief moves towards the most recent type.

    ``p_recent_last``: the belief after episodes of type A then type B; ``p_recent_first``:
    after the same episodes with B's first; ``q_first``/``q_last``: the acceptance of A and B on
    the probes (last axis). 0 for any belief that ignores order (the time average), about 1 for
    one that only sees the latest type.
    """
    gap = np.asarray(q_last) - np.asarray(q_first)
    if not np.all(np.sum(gap * gap, axis=-1) > 0):
        raise ValueError("the two types must differ on the probes for the recency index")
    return (np.sum((np.asarray(p_recent_last) - np.asarray(p_recent_first)) * gap, axis=-1)
            / np.sum(gap * gap, axis=-1))


def logistic_beliefs(game: PriceGame, episodes: Episodes, order, episode_weights, px, ph, *,
                     prior=None, prior_weight: float = 5.0, ridge: float = 1e-3) -> np.ndarray:
    """The chapter's logistic beliefs (Eq. (eq-sfp-model)) after each history, on probes ``(P,)``.

    Episode ``order[k]`` is the ``k``-th episode played and gets weight ``episode_weights[k]``
    (Eq. (eq-sfp-memory): all ones is the time average); ``prior`` enters as ``prior_weight``
    pseudo-observations. Returns ``(n, P)``.
    """
    order = np.asarray(order)
    w = np.asarray(episode_weights, dtype=float)
    if w.shape != order.shape:
        raise ValueError("one weight per episode of the order is needed")
    H = game.rounds

    def feats(x, h):
        t = np.asarray(h, dtype=float) / H
        return np.stack([np.ones_like(t), x, t, x * t], axis=-1)

    if prior is None:
        pf, py, pc = np.zeros((0, 4)), np.zeros(0), np.zeros(0)
    else:
        pf, py, pc = pseudo_data(game, prior, prior_weight)
    probe_f = feats(np.asarray(px, dtype=float), ph)
    out = np.empty((episodes.x.shape[0], len(px)))
    rounds = np.arange(H)
    for i in range(episodes.x.shape[0]):
        seen = episodes.seen[i, order]
        f = feats(episodes.x[i, order][seen], np.broadcast_to(rounds, seen.shape)[seen])
        y = episodes.y[i, order][seen]
        c = np.broadcast_to(w[:, None], seen.shape)[seen]
        keep = c > 0
        coef = fit_logistic(np.concatenate([pf, f[keep]]), np.concatenate([py, y[keep]]),
                            np.concatenate([pc, c[keep]]), ridge)
        out[i] = sigmoid(probe_f @ coef)
    return out
