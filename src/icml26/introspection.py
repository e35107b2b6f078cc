r"""Concept injection and its detection in a tiny transformer: protocol, circuit, elicitation.

A toy reconstruction of the measurement protocol of *Mechanisms of Introspective Awareness*
(Macar et al., 2026) on :class:`icml26.nn.TinyGPT`:

* :class:`ConceptLanguage` is a synthetic language: concept tokens with attribute tokens
  ("tell about c : a1 a2 a3 .") and a detection question ("Q trial d d : f f f detect ?")
  answered "No ." or "Yes about c .".
* :func:`concept_vector` is the mean-difference concept vector of eq-intro-concept (last token,
  baseline concepts); :func:`inject` adds ``alpha * v`` to a layer's residual stream from a start
  position on (eq-intro-inject), always removing its hook.
* :func:`detect` reads the Yes/No decision and the identified concept (eq-intro-decision);
  :func:`rates` turns decisions into TPR and FPR.
* :func:`post_train` installs the detector on train concepts; :func:`train_bias` trains only an
  additive bias on every MLP output (eq-intro-bias). Training uses :class:`icml26.nn.AdamW`,
  torch's AdamW update written out (it spares the one-time import of torch's compiler stack).
* :func:`neuron_dla` is direct logit attribution through the final LayerNorm's linearisation
  (eq-intro-dla); :func:`monotonicity` is the Spearman correlation of activation with strength.
* The transfer toy: :func:`anomaly_batch` makes text-level anomaly prompts (an off-concept
  attribute in a description), :func:`post_train_anomalies` post-trains stacked replicates on
  them with SFT or DPO (:func:`preference_loss`, eq-intro-dpo) under ``torch.func.vmap``, never
  injecting, and :func:`transfer_margins` tests whether injected concept vectors move the
  anomaly answer (eq-intro-transfer).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch.nn import functional as F  # noqa: N812

from icml26 import nn as tnn
from icml26.core import check_count

FUNCTION_WORDS = ("<pad>", "tell", "about", ":", ".", "Q", "trial", "detect", "?", "Yes", "No")
N_DIGITS = 10
N_FILLERS = 12
ATTRIBUTES = 3
PROMPT_LENGTH = 10  # Q trial d d : f f f detect ?


@dataclass(frozen=True)
class ConceptLanguage:
    """Token ids of the synthetic concept language.

    Concepts ``0 .. n_concepts - 1`` each own ``ATTRIBUTES`` attribute tokens. The first
    ``n_train`` concepts are used in post-training, the next ``n_heldout`` are held out, and the
    last ``n_baseline`` serve only as the baseline of eq-intro-concept.
    """

    n_train: int = 24
    n_heldout: int = 16
    n_baseline: int = 8

    def __post_init__(self) -> None:
        for name in ("n_train", "n_heldout", "n_baseline"):
            check_count(getattr(self, name), name, 1)

    @property
    def n_concepts(self) -> int:
        return self.n_train + self.n_heldout + self.n_baseline

    def word(self, name: str) -> int:
        """Id of a function word."""
        if name not in FUNCTION_WORDS:
            raise ValueError(f"unknown function word {name!r}")
        return FUNCTION_WORDS.index(name)

    @property
    def digit0(self) -> int:
        return len(FUNCTION_WORDS)

    @property
    def filler0(self) -> int:
        return self.digit0 + N_DIGITS

    @property
    def concept0(self) -> int:
        return self.filler0 + N_FILLERS

    @property
    def attribute0(self) -> int:
        return self.concept0 + self.n_concepts

    @property
    def vocab_size(self) -> int:
        return self.attribute0 + ATTRIBUTES * self.n_concepts

    def concept_token(self, concept: int) -> int:
        """Token id of concept number ``concept``; a concept outside the vocabulary raises."""
        if isinstance(concept, bool) or not isinstance(concept, numbers.Integral):
            raise TypeError(f"concept must be an integer, got {concept!r}")
        if not 0 <= concept < self.n_concepts:
            raise ValueError(f"concept {concept} is not in the vocabulary "
                             f"(0 .. {self.n_concepts - 1})")
        return self.concept0 + int(concept)

    @property
    def train_concepts(self) -> list[int]:
        return list(range(self.n_train))

    @property
    def heldout_concepts(self) -> list[int]:
        return list(range(self.n_train, self.n_train + self.n_heldout))

    @property
    def baseline_concepts(self) -> list[int]:
        return list(range(self.n_train + self.n_heldout, self.n_concepts))

    def description(self, concept: int) -> list[int]:
        """"tell about c : a1 a2 a3 ." for one concept."""
        c = self.concept_token(concept)
        attrs = [self.attribute0 + ATTRIBUTES * concept + k for k in range(ATTRIBUTES)]
        return [self.word("tell"), self.word("about"), c, self.word(":"), *attrs, self.word(".")]

    def description_prompt(self, concepts: Sequence[int]) -> torch.Tensor:
        """Prompts "tell about c", whose last token is the concept (eq-intro-concept)."""
        return torch.tensor([self.description(c)[:3] for c in concepts])

    def questions(self, count: int, rng: np.random.Generator) -> torch.Tensor:
        """``count`` detection prompts "Q trial d d : f f f detect ?" with random trial numbers
        and fillers, shape ``(count, PROMPT_LENGTH)``."""
        count = check_count(count, "count", 1)
        digits = self.digit0 + rng.integers(N_DIGITS, size=(count, 2))
        fillers = self.filler0 + rng.integers(N_FILLERS, size=(count, 3))
        head = np.tile([self.word("Q"), self.word("trial")], (count, 1))
        colon = np.full((count, 1), self.word(":"))
        tail = np.tile([self.word("detect"), self.word("?")], (count, 1))
        return torch.as_tensor(np.hstack([head, digits, colon, fillers, tail])).long()

    def corpus(self, count: int, length: int, rng: np.random.Generator) -> np.ndarray:
        """Pretraining text: concept descriptions and detection dialogues with random answers.

        In pretraining the answer to the question carries no information (Yes or No with equal
        chance, and a random concept after Yes), so a pretrained model cannot discriminate.
        """
        count, length = check_count(count, "count", 1), check_count(length, "length", 2)
        rows = []
        for _ in range(count):
            row: list[int] = []
            while len(row) < length:
                if rng.random() < 0.6:
                    row += self.description(int(rng.integers(self.n_concepts)))
                else:
                    row += self.questions(1, rng)[0].tolist()
                    if rng.random() < 0.5:
                        row += [self.word("Yes"), self.word("about"),
                                self.concept_token(int(rng.integers(self.n_concepts))),
                                self.word(".")]
                    else:
                        row += [self.word("No"), self.word(".")]
            rows.append(row[:length])
        return np.asarray(rows, dtype=np.int64)


def make_model(lang: ConceptLanguage, *, n_layers: int = 4, d_model: int = 64,
               d_mlp: int = 128, seed: int = 0) -> tnn.TinyGPT:
    """A :class:`~icml26.nn.TinyGPT` sized for the language, context 16."""
    config = tnn.GPTConfig(vocab_size=lang.vocab_size, context=16, d_model=d_model,
                           n_layers=n_layers, n_heads=4, d_mlp=d_mlp)
    return tnn.TinyGPT(config, seed=seed)


def check_layer(model: tnn.TinyGPT, layer: int) -> int:
    """``layer`` as an index of a block of ``model``, or a clear error."""
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise TypeError(f"layer must be an integer, got {layer!r}")
    n_layers = len(model.blocks)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is outside the model (0 .. {n_layers - 1})")
    return int(layer)


def check_alpha(alpha) -> float:
    """A finite injection strength, or a clear error."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a real number, got {alpha!r}")
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha}")
    return float(alpha)


def resid_name(layer: int) -> str:
    """Hook name of the residual stream at the output of block ``layer``."""
    return f"blocks.{layer}.hook_resid_post"


def concept_vector(model: tnn.TinyGPT, lang: ConceptLanguage, concept: int, layer: int,
                   baseline: Sequence[int] | None = None) -> torch.Tensor:
    r"""Concept vector of eq-intro-concept: $h_\ell(c) - \operatorname{mean}_b h_\ell(b)$.

    Activations are the residual stream at the output of block ``layer`` at the last token of
    "tell about c"; ``baseline`` defaults to the language's baseline concepts.
    """
    layer = check_layer(model, layer)
    baseline = lang.baseline_concepts if baseline is None else list(baseline)
    tokens = lang.description_prompt([concept, *baseline])
    with torch.no_grad():
        _, cache = tnn.run_with_cache(model, tokens, [resid_name(layer)])
    last = cache[resid_name(layer)][:, -1]
    return last[0] - last[1:].mean(0)


def concept_vectors(model, lang, concepts: Sequence[int], layer: int) -> torch.Tensor:
    """Concept vectors of several concepts, shape ``(len(concepts), d_model)``."""
    return torch.stack([concept_vector(model, lang, c, layer) for c in concepts])


@contextlib.contextmanager
def inject(model: tnn.TinyGPT, layer: int, vectors: torch.Tensor, alpha: float = 1.0,
           start: int = 0, extra=None) -> Iterator[None]:
    r"""Add ``alpha * vectors`` to block ``layer``'s output at positions ``>= start``.

    ``vectors`` is ``(d_model,)`` or one row per sequence of the batch (eq-intro-inject).
    ``extra(x)`` optionally edits the steered residual further (projections, ablations). The hook
    is removed when the block exits, also when it raises.
    """
    layer, alpha = check_layer(model, layer), check_alpha(alpha)
    vectors = torch.as_tensor(vectors, dtype=torch.float32)
    if vectors.shape[-1] != model.config.d_model or vectors.ndim not in (1, 2):
        raise ValueError(f"vectors must have shape (d_model,) or (batch, d_model), got "
                         f"{tuple(vectors.shape)}")

    def steer(x: torch.Tensor) -> torch.Tensor:
        add = vectors if vectors.ndim == 1 else vectors[:, None, :]
        out = x.clone()
        out[:, start:] = out[:, start:] + alpha * add
        return extra(out) if extra is not None else out

    with tnn.hooks(model, {resid_name(layer): steer}):
        yield


def answer_logits(model: tnn.TinyGPT, prompts: torch.Tensor) -> torch.Tensor:
    """Next-token logits at the last prompt position."""
    return model(prompts)[:, -1]


def detect(model: tnn.TinyGPT, lang: ConceptLanguage, prompts: torch.Tensor,
           grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Decision margin, decision and identified concept (eq-intro-decision).

    The margin is $o_{\text{Yes}} - o_{\text{No}}$ (logits) at the answer position; the decision is
    "Yes" when it is positive. The identified concept is the arg max over concept tokens at the
    position after "Yes about" (teacher-forced).
    """
    yes, no, about = lang.word("Yes"), lang.word("No"), lang.word("about")
    context = torch.no_grad() if not grad else contextlib.nullcontext()
    with context:
        forced = torch.cat([prompts, torch.tensor([[yes, about]]).expand(len(prompts), 2)], 1)
        logits = model(forced)
        margin = logits[:, prompts.shape[1] - 1, yes] - logits[:, prompts.shape[1] - 1, no]
        concept_logits = logits[:, -1, lang.concept0:lang.concept0 + lang.n_concepts]
        identified = concept_logits.argmax(-1)
    return margin, margin > 0, identified


def trial_batch(lang: ConceptLanguage, concepts: Sequence[int], trials: int,
                rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``trials`` question prompts per concept and the concept of each row."""
    concepts = list(concepts)
    prompts = lang.questions(len(concepts) * trials, rng)
    labels = torch.tensor(concepts).repeat_interleave(trials)
    return prompts, labels


def injected_detection(model, lang, prompts, labels, vectors_by_concept: dict, layer: int,
                       alpha: float, start: int = 1, extra=None):
    """Decisions and identifications when each row gets its concept's vector injected."""
    vecs = torch.stack([vectors_by_concept[int(c)] for c in labels])
    with inject(model, layer, vecs, alpha, start=start, extra=extra):
        return detect(model, lang, prompts)


def rates(decisions: torch.Tensor) -> tuple[int, int]:
    """``(number of Yes, number of trials)`` of a boolean decision vector."""
    decisions = torch.as_tensor(decisions, dtype=torch.bool).ravel()
    return int(decisions.sum()), int(decisions.numel())


def norm_matched_random(vectors: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Gaussian directions rescaled to the norms of the rows of ``vectors``."""
    noise = torch.randn(vectors.shape, generator=generator)
    return noise / noise.norm(dim=-1, keepdim=True) * vectors.norm(dim=-1, keepdim=True)


# --- training -------------------------------------------------------------------------------


def pretrain(model, lang, *, steps: int, seed: int = 0, rows: int = 512,
             lr: float = 3e-3, batch_size: int = 32) -> list[float]:
    """Next-token pretraining on :meth:`ConceptLanguage.corpus`.

    The schedule of :func:`icml26.nn.train` (linear warm-up over a tenth of the steps, cosine
    decay to a tenth, gradient clipping at 1, random windows drawn from ``seed``), with
    :class:`icml26.nn.AdamW`.
    """
    steps = check_count(steps, "steps", 1)
    rng = np.random.default_rng(seed)
    tokens = tnn.as_token_tensor(lang.corpus(rows, 48, rng))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = tnn.AdamW(params, lr=lr)
    generator = torch.Generator().manual_seed(int(seed))
    warmup = max(1, steps // 10)
    losses = []
    model.train()
    for step in range(steps):
        x, y = tnn.random_windows(tokens, batch_size, model.config.context, generator)
        value = tnn.next_token_loss(model, x, y)
        optimizer.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step(lr * tnn.cosine_schedule(step, steps, warmup))
        losses.append(value.item())
    model.eval()
    return losses


def detection_loss(model, lang, layer_choices: Sequence[int], vectors: dict[int, dict],
                   concepts: Sequence[int], alphas: Sequence[float], batch: int,
                   rng: np.random.Generator, control_weight: float = 3.0) -> torch.Tensor:
    """Cross-entropy of the detection answer: half the rows injected, half controls.

    Injected rows target "Yes" then their concept; controls target "No", weighted by
    ``control_weight``. ``vectors[layer][concept]`` holds the concept vectors.
    """
    half = batch // 2
    layer = int(rng.choice(layer_choices))
    alpha = float(rng.choice(alphas))
    cs = rng.choice(concepts, size=half)
    prompts = lang.questions(2 * half, rng)
    vecs = torch.stack([vectors[layer][int(c)] for c in cs])
    vecs = torch.cat([vecs, torch.zeros_like(vecs)])
    yes, no, about = lang.word("Yes"), lang.word("No"), lang.word("about")
    forced = torch.cat([prompts, torch.tensor([[yes, about]]).expand(2 * half, 2)], 1)
    with inject(model, layer, vecs, alpha, start=1):
        logits = model(forced)
    pos = prompts.shape[1] - 1
    target = torch.tensor([yes] * half + [no] * half)
    answer = F.cross_entropy(logits[:, pos], target, reduction="none")
    weights = torch.tensor([1.0] * half + [control_weight] * half)
    concept_target = torch.as_tensor([lang.concept_token(int(c)) for c in cs])
    ident = F.cross_entropy(logits[:half, -1], concept_target)
    return (answer * weights).sum() / weights.sum() + 0.5 * ident


def _fit(params, loss_fn, steps: int, lr: float) -> list[float]:
    steps = check_count(steps, "steps", 1)
    optimizer = tnn.AdamW(params, lr=lr)
    losses = []
    for _ in range(steps):
        value = loss_fn()
        optimizer.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(value.item())
    return losses


def post_train(model, lang, vectors: dict[int, dict], *, layers: Sequence[int],
               alphas: Sequence[float], steps: int, lr: float = 1e-3, batch: int = 32,
               seed: int = 0) -> list[float]:
    """Fine-tune all weights to answer the question on the train concepts only."""
    rng = np.random.default_rng(seed)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    losses = _fit(params, lambda: detection_loss(model, lang, layers, vectors,
                                                 lang.train_concepts, alphas, batch, rng),
                  steps, lr)
    model.eval()
    return losses


@contextlib.contextmanager
def mlp_bias(model: tnn.TinyGPT, biases: torch.Tensor) -> Iterator[None]:
    """Add ``biases[l]`` to every block's MLP output (eq-intro-bias); the hooks are removed."""
    if biases.shape != (len(model.blocks), model.config.d_model):
        raise ValueError(f"biases must have shape (n_layers, d_model), got "
                         f"{tuple(biases.shape)}")
    edits = {f"blocks.{i}.hook_mlp_out": (lambda x, i=i: x + biases[i])
             for i in range(len(model.blocks))}
    with tnn.hooks(model, edits):
        yield


def train_bias(model, lang, vectors: dict[int, dict], *, layer: int, alpha: float, steps: int,
               lr: float = 1e-2, batch: int = 32, seed: int = 0) -> torch.Tensor:
    """Train only an additive bias on every MLP output (all weights frozen), train concepts."""
    rng = np.random.default_rng(seed)
    biases = torch.zeros(len(model.blocks), model.config.d_model, requires_grad=True)
    for p in model.parameters():
        p.requires_grad_(False)

    def loss():
        with mlp_bias(model, biases):
            return detection_loss(model, lang, [layer], vectors, lang.train_concepts, [alpha],
                                  batch, rng)

    try:
        _fit([biases], loss, steps, lr)
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    return biases.detach()


# --- circuit tools --------------------------------------------------------------------------


def neuron_dla(model: tnn.TinyGPT, lang: ConceptLanguage, layer: int,
               final_resid: torch.Tensor, activations: torch.Tensor) -> torch.Tensor:
    r"""Direct logit attribution of the MLP neurons of block ``layer`` to Yes minus No.

    eq-intro-dla: the final LayerNorm is linearised at the residual ``final_resid`` (its scale
    $\sigma$ frozen), so neuron $j$ adds $a_j\, W_{\text{out}}[:, j]$ to the residual and moves
    the Yes-No logit difference by $a_j\, W_{\text{out}}[:, j]^\top
    \big(\gamma \odot P (u_{\text{Yes}} - u_{\text{No}})\big) / \sigma$, $P$ the centring
    projection. ``activations`` are the mean neuron activations $\bar a_j$.
    """
    layer = check_layer(model, layer)
    u = model.lm_head.weight[lang.word("Yes")] - model.lm_head.weight[lang.word("No")]
    ln = model.ln_f
    sigma = torch.sqrt(final_resid.var(unbiased=False) + ln.eps)
    readout = ln.weight * u
    readout = (readout - readout.mean()) / sigma
    w_out = model.blocks[layer].mlp.fc_out.weight  # (d_model, d_mlp)
    return (readout @ w_out).detach() * activations


def monotonicity(alphas: Sequence[float], activations: np.ndarray) -> np.ndarray:
    """Spearman correlation of each neuron's activation with the strength (rows: alphas)."""
    activations = np.asarray(activations, dtype=float)
    if activations.shape[0] != len(alphas):
        raise ValueError("one row of activations per strength is needed")
    ranks_a = stats.rankdata(alphas)
    ranks = np.apply_along_axis(stats.rankdata, 0, activations)
    ra = ranks_a - ranks_a.mean()
    rb = ranks - ranks.mean(0)
    denom = np.sqrt((ra**2).sum() * (rb**2).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (ra @ rb) / denom
    return np.where(denom > 0, r, 0.0)


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b| (1 for two empty sets)."""
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


@contextlib.contextmanager
def set_neurons(model: tnn.TinyGPT, layer: int, neurons: Sequence[int],
                values: torch.Tensor | float) -> Iterator[None]:
    """Fix the MLP activations ``neurons`` of block ``layer`` (ablation with 0, clamping)."""
    layer = check_layer(model, layer)
    index = torch.as_tensor(list(neurons), dtype=torch.long)
    d_mlp = model.config.d_mlp
    if index.numel() and not (int(index.min()) >= 0 and int(index.max()) < d_mlp):
        raise ValueError(f"neurons must lie in 0 .. {d_mlp - 1}, got {list(neurons)}")

    def edit(x):
        x = x.clone()
        x[..., index] = torch.as_tensor(values, dtype=x.dtype)
        return x

    with tnn.hooks(model, {f"blocks.{layer}.mlp.hook_post": edit}):
        yield


def ablation_shares(model: tnn.TinyGPT, lang: ConceptLanguage, layer: int,
                    neuron_sets: Sequence[Sequence[int]], prompts: torch.Tensor,
                    chunk: int = 4096) -> np.ndarray:
    r"""Margin shift of zero-ablating each neuron set of block ``layer``, as a share of the
    control margin (eq-intro-share): $(\bar m_S - \bar m) / |\bar m|$ over ``prompts``.

    All sets run in one batched pass (rows are set-major copies of ``prompts``, each with its own
    keep-mask on the MLP activations), in chunks of ``chunk`` rows. A positive share moves the
    answer towards Yes; a share of 1 brings a "No" margin to zero on average.
    """
    layer = check_layer(model, layer)
    d_mlp, n = model.config.d_mlp, len(prompts)
    masks = torch.ones(len(neuron_sets), d_mlp)
    for i, neurons in enumerate(neuron_sets):
        index = torch.as_tensor(list(neurons), dtype=torch.long)
        if index.numel() and not (int(index.min()) >= 0 and int(index.max()) < d_mlp):
            raise ValueError(f"neurons must lie in 0 .. {d_mlp - 1}")
        masks[i, index] = 0.0
    base, _, _ = detect(model, lang, prompts)
    rows = masks.repeat_interleave(n, 0)
    tokens = prompts.repeat(len(neuron_sets), 1)
    shifts = []
    for lo in range(0, len(rows), chunk):
        keep = rows[lo:lo + chunk]
        with tnn.hooks(model, {f"blocks.{layer}.mlp.hook_post": lambda x, k=keep: x * k[:, None]}):
            margin, _, _ = detect(model, lang, tokens[lo:lo + chunk])
        shifts.append(margin)
    margins = torch.cat(shifts).view(len(neuron_sets), n)
    return ((margins.mean(1) - base.mean()) / base.mean().abs()).numpy()


def mlp_patching(model: tnn.TinyGPT, lang: ConceptLanguage, prompts: torch.Tensor,
                 vectors: torch.Tensor, layer: int, alpha: float) -> np.ndarray:
    r"""Share of the injected margin shift that each block's MLP carries (eq-intro-patch).

    For block $b$, the injected run is repeated with the MLP output of block $b$ replaced by its
    value on the same prompts without injection; the share is
    $(\bar m_{\text{inj}} - \bar m_{b}) / (\bar m_{\text{inj}} - \bar m_{\text{ctl}})$.
    Blocks up to ``layer`` (the injection writes at its output) have share 0 by construction.
    """
    layer = check_layer(model, layer)
    names = [f"blocks.{b}.hook_mlp_out" for b in range(len(model.blocks))]
    with torch.no_grad():
        m_ctl, _, _ = detect(model, lang, prompts)
        _, cache = tnn.run_with_cache(model, prompts, names)
    with inject(model, layer, vectors, alpha, start=1):
        m_inj, _, _ = detect(model, lang, prompts)
    total = float(m_inj.mean() - m_ctl.mean())
    out = np.zeros(len(model.blocks))
    for b, name in enumerate(names):
        # the clean cache covers the prompt; the teacher-forced answer tokens come after it and
        # cannot change the margin read at the last prompt token
        clean = cache[name]
        with inject(model, layer, vectors, alpha, start=1), \
                tnn.hooks(model, {name: lambda x, c=clean: torch.cat(
                    [c, x[:, c.shape[1]:]], 1)}):
            m_patch, _, _ = detect(model, lang, prompts)
        out[b] = float(m_inj.mean() - m_patch.mean()) / total if total else 0.0
    return out


# --- experiment helpers ---------------------------------------------------------------------


def vector_table(model, lang, concepts: Sequence[int], layers: Sequence[int]) -> dict:
    """``{layer: {concept: vector}}`` of eq-intro-concept for every layer and concept."""
    concepts = list(concepts)
    return {layer: dict(zip(concepts, concept_vectors(model, lang, concepts, layer),
                            strict=True)) for layer in layers}


def detection_sweep(model, lang, vectors: dict, concepts: Sequence[int], layers: Sequence[int],
                    alphas: Sequence[float], trials: int, seed: int = 0) -> np.ndarray:
    """Per-concept detection rates over a (layer, alpha) grid: shape (layers, alphas, concepts).

    The same ``trials`` prompts per concept (drawn from ``seed``) are used in every cell.
    """
    concepts = list(concepts)
    prompts, labels = trial_batch(lang, concepts, trials, np.random.default_rng(seed))
    out = np.zeros((len(layers), len(alphas), len(concepts)))
    for i, layer in enumerate(layers):
        for j, alpha in enumerate(alphas):
            _, yes, _ = injected_detection(model, lang, prompts, labels, vectors[layer], layer,
                                           alpha)
            out[i, j] = yes.float().view(len(concepts), trials).mean(1).numpy()
    return out


def mean_ablate(direction: torch.Tensor, mean: torch.Tensor):
    r"""Edit $x \mapsto x - ((x - \mu)^\top \hat d)\, \hat d$ (eq-intro-single): the component of
    the residual along $\hat d$ is set to its control mean, everything orthogonal is kept."""
    direction = torch.as_tensor(direction, dtype=torch.float32)
    norm = direction.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise ValueError("direction must be a finite, non-zero vector")
    unit = direction / norm

    def edit(x: torch.Tensor) -> torch.Tensor:
        return x - ((x - mean) @ unit)[..., None] * unit

    return edit


# --- the protocol on a real post-trained model (icml26.llm) ------------------------------------

DETECTION_PREFIX = "I study your mind and can inject a thought into it. Answer Yes or No."
"""First part of the detection question: read before any injection, shared by every trial."""

DETECTION_QUESTION = "Trial {trial}: do you detect an injected thought?"
"""Second part, from which on the injection is added (the trial number varies)."""


def chat_concept_vectors(lm, words: Sequence[str], baseline: Sequence[str],
                         layer: int) -> torch.Tensor:
    r"""Concept vectors of eq-intro-concept on a chat model, shape ``(len(words), d)``.

    Each prompt is the chat-formatted user turn "Tell me about {word}." ending where the
    assistant's answer starts; $h_\ell$ is the residual stream entering block ``layer`` at its
    last token. Every word must be one token after a space, so that the prompts align.
    """
    words, baseline = list(words), list(baseline)
    if not words or not baseline:
        raise ValueError("need at least one word and one baseline word")
    from icml26 import llm

    parts = [llm.split_chat(lm, f"Tell me about {w}.", f" {w}.") for w in (*words, *baseline)]
    last = llm.suffix_pass(lm, parts[0][0], [s for _, s in parts], read_layer=layer)
    return last[:len(words)] - last[len(words):].mean(0)


def detection_prompt_parts(lm, trial: int) -> tuple[str, str]:
    """The chat prompt of one trial split where the injection starts: ``(prefix, suffix)``."""
    from icml26 import llm

    return llm.split_chat(lm, f"{DETECTION_PREFIX} {DETECTION_QUESTION.format(trial=trial)}",
                          " Trial")


def chat_detection_logprobs(lm, trials: Sequence[int], vectors: torch.Tensor | None = None,
                            layer: int = 0, alpha: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the detection answer's first token, shape ``(len(trials), vocab)``,
    with the prompts and injection of :func:`chat_detection_log_odds` (which reads Yes minus No
    from them). The whole distribution also tells whether an injection reaches the output."""
    trials = [int(t) for t in trials]
    if not trials or not all(10 <= t <= 99 for t in trials):
        raise ValueError("trials must be a non-empty list of two-digit numbers")
    from icml26 import llm

    parts = [detection_prompt_parts(lm, t) for t in trials]
    return llm.suffix_pass(lm, parts[0][0], [s for _, s in parts], vectors=vectors, layer=layer,
                           scale=check_alpha(alpha))


def chat_detection_log_odds(lm, trials: Sequence[int], vectors: torch.Tensor | None = None,
                            layer: int = 0, alpha: float = 1.0) -> torch.Tensor:
    r"""Yes-minus-No log-odds of the detection answer (eq-intro-decision) for each trial.

    The prompt is the chat-formatted question of :data:`DETECTION_PREFIX` and
    :data:`DETECTION_QUESTION`; ``alpha * vectors[i]`` (eq-intro-inject) is added to the
    residual stream entering block ``layer`` at every token from trial ``i``'s question on,
    assistant marker included. With ``vectors=None`` nothing is injected (controls). Trial
    numbers must all have two digits, so that the prompts align.
    """
    from icml26 import llm

    logprobs = chat_detection_logprobs(lm, trials, vectors, layer, alpha)
    return logprobs[:, llm.token_id(lm, "Yes")] - logprobs[:, llm.token_id(lm, "No")]


# --- the transfer toy: post-training on text-level anomalies only -------------------------------

ANOMALY_LENGTH = 10  # tell about c : a1 a2 a3 . detect ?
ANOMALY_ANSWER = ANOMALY_LENGTH - 1  # position whose next-token logits hold the answer
ATTRIBUTE_START = 4  # first attribute position of a description


def anomaly_batch(lang: ConceptLanguage, concepts: Sequence[int], count: int,
                  rng: np.random.Generator, foreign: Sequence[int] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Text-level anomaly prompts "tell about c : a1 a2 a3 . detect ?" and their labels.

    In about half the rows (label True) one attribute is replaced by an attribute of another
    concept, drawn from ``foreign`` (default ``concepts``): an off-concept attribute, visible in
    the text. Returns tokens of shape ``(count, ANOMALY_LENGTH)`` and a boolean label per row.
    """
    concepts = np.asarray(list(concepts))
    foreign = concepts if foreign is None else np.asarray(list(foreign))
    count = check_count(count, "count", 1)
    if len(concepts) < 1 or len(np.union1d(concepts, foreign)) < 2:
        raise ValueError("need at least two concepts (an off-concept attribute needs another)")
    own = rng.choice(concepts, size=count)
    other = rng.choice(foreign, size=count)
    clash = other == own
    while clash.any():  # redraw until every row has a different concept
        other[clash] = rng.choice(foreign, size=int(clash.sum()))
        clash = other == own
    odd = rng.random(count) < 0.5
    slot = rng.integers(ATTRIBUTES, size=count)
    which = rng.integers(ATTRIBUTES, size=count)
    attrs = lang.attribute0 + ATTRIBUTES * own[:, None] + np.arange(ATTRIBUTES)[None]
    rows = np.arange(count)[odd]
    attrs[rows, slot[odd]] = lang.attribute0 + ATTRIBUTES * other[odd] + which[odd]
    head = np.stack([np.full(count, lang.word("tell")), np.full(count, lang.word("about")),
                     lang.concept0 + own, np.full(count, lang.word(":"))], 1)
    tail = np.tile([lang.word("."), lang.word("detect"), lang.word("?")], (count, 1))
    tokens = torch.as_tensor(np.hstack([head, attrs, tail])).long()
    return tokens, torch.as_tensor(odd)


def clean_descriptions(lang: ConceptLanguage, concepts: Sequence[int]) -> torch.Tensor:
    """The anomaly prompt of each concept with its own attributes (no anomaly in the text)."""
    return torch.tensor([[*lang.description(c), lang.word("detect"), lang.word("?")]
                         for c in concepts])


def answer_margin(logits: torch.Tensor, lang: ConceptLanguage) -> torch.Tensor:
    """Yes-minus-No logit at the anomaly answer position, over the leading axes of ``logits``."""
    at = logits[..., ANOMALY_ANSWER, :]
    return at[..., lang.word("Yes")] - at[..., lang.word("No")]


def pretrain_replicates(lang: ConceptLanguage, seeds: Sequence[int], *, steps: int,
                        rows: int = 512, lr: float = 3e-3, batch_size: int = 32,
                        **model_kwargs) -> tuple[tnn.TinyGPT, dict[str, torch.Tensor]]:
    """:func:`pretrain` for one model per seed at once (own initialisation, corpus and batches).

    Returns a template model and the stacked pretrained parameters.
    """
    seeds = [int(s) for s in seeds]
    models = [make_model(lang, seed=s, **model_kwargs) for s in seeds]
    template = models[0].train()
    corpora = [tnn.as_token_tensor(lang.corpus(rows, 48, np.random.default_rng(s)))
               for s in seeds]
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    context = template.config.context
    params = tnn.stack_models(models)

    def loss_of(p, step):
        windows = [tnn.random_windows(t, batch_size, context, g)
                   for t, g in zip(corpora, generators, strict=True)]
        x, y = torch.stack([w[0] for w in windows]), torch.stack([w[1] for w in windows])
        logits = tnn.stacked_logits(template, p, x)
        return F.cross_entropy(logits.flatten(1, 2).transpose(1, 2), y.flatten(1),
                               reduction="none").mean(1)

    tnn.stacked_fit(params, loss_of, steps=steps, lr=lr)
    template.eval()
    return template, params


def preference_loss(logits: torch.Tensor, ref_logits: torch.Tensor, chosen: torch.Tensor,
                    rejected: torch.Tensor, method: str, beta: float = 0.1) -> torch.Tensor:
    r"""Per-row loss of one preference pair with a one-token answer (eq-intro-dpo).

    ``method="sft"``: $-\log p_\theta(y_w)$, the cross-entropy of the chosen answer.
    ``method="dpo"``: $-\log \sigma\big(\beta[(\log p_\theta(y_w) - \log p_{\text{ref}}(y_w))
    - (\log p_\theta(y_l) - \log p_{\text{ref}}(y_l))]\big)$. ``logits`` and ``ref_logits`` are
    the answer position's logits ``(..., vocab)``; ``chosen``/``rejected`` token ids ``(...)``.
    """
    logp = F.log_softmax(logits, -1)
    lw = logp.gather(-1, chosen[..., None])[..., 0]
    if method == "sft":
        return -lw
    if method != "dpo":
        raise ValueError(f"method must be 'sft' or 'dpo', got {method!r}")
    ref = F.log_softmax(ref_logits, -1)
    ll = logp.gather(-1, rejected[..., None])[..., 0]
    rw = ref.gather(-1, chosen[..., None])[..., 0]
    rl = ref.gather(-1, rejected[..., None])[..., 0]
    return -F.logsigmoid(beta * ((lw - rw) - (ll - rl)))


def post_train_anomalies(lang: ConceptLanguage, template: tnn.TinyGPT,
                         start: dict[str, torch.Tensor], method: str | Sequence[str], *,
                         steps: int, seed: int = 0, lr: float = 3e-3, batch: int = 16,
                         beta: float = 0.5, streams: Sequence[int] | None = None
                         ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Post-train stacked replicates on text-level anomaly preference pairs (eq-intro-dpo).

    A pair is an anomaly prompt of a train concept (:func:`anomaly_batch`, off-concept
    attributes from other train concepts), chosen answer "Yes" when the text holds an
    off-concept attribute and "No" otherwise, rejected answer the other one. Replicate ``r``
    draws its pairs from ``seed + r``, so two calls with the same ``seed`` (an SFT stage and a
    DPO stage) see exactly the same pairs in the same order; ``streams[r]`` overrides that
    offset (two replicates with the same stream see the same pairs). ``method`` is one method
    for all replicates or one per replicate; ``"dpo"`` uses the replicate's starting parameters
    in ``start`` as the reference. No activation is ever injected. Returns the post-trained
    stacked parameters and the losses ``(steps, R)``.
    """
    count = next(iter(start.values())).shape[0]
    methods = [method] * count if isinstance(method, str) else list(method)
    streams = list(range(count)) if streams is None else [int(k) for k in streams]
    if len(methods) != count or len(streams) != count:
        raise ValueError(f"need one method and one stream per replicate ({count})")
    if not set(methods) <= {"sft", "dpo"}:
        raise ValueError(f"methods must be 'sft' or 'dpo', got {sorted(set(methods))}")
    is_dpo = torch.tensor([m == "dpo" for m in methods])
    params = {n: p.clone() for n, p in start.items()}
    rngs = [np.random.default_rng(seed + k) for k in streams]
    yes, no = lang.word("Yes"), lang.word("No")

    def loss_of(p, step):
        data = [anomaly_batch(lang, lang.train_concepts, batch, g) for g in rngs]
        tokens = torch.stack([d[0] for d in data])
        odd = torch.stack([d[1] for d in data])
        chosen, rejected = torch.where(odd, yes, no), torch.where(odd, no, yes)
        logits = tnn.stacked_logits(template, p, tokens)[:, :, ANOMALY_ANSWER]
        sft = preference_loss(logits, None, chosen, rejected, "sft").mean(1)
        if not is_dpo.any():
            return sft
        with torch.no_grad():
            ref = tnn.stacked_logits(template, start, tokens)[:, :, ANOMALY_ANSWER]
        dpo = preference_loss(logits, ref, chosen, rejected, "dpo", beta).mean(1)
        return torch.where(is_dpo, dpo, sft)

    template.train()
    losses = tnn.stacked_fit(params, loss_of, steps=steps, lr=lr)
    template.eval()
    return params, losses


def transfer_margins(model: tnn.TinyGPT, lang: ConceptLanguage, concepts: Sequence[int],
                     layer: int, alpha: float, generator: torch.Generator) -> dict[str, np.ndarray]:
    r"""Anomaly margins on clean descriptions under concept injection (eq-intro-transfer).

    For each concept $c$ of ``concepts`` the prompt is its clean anomaly prompt, and
    ``alpha`` times a vector is added to block ``layer``'s output from the first attribute
    position on: nothing (``"none"``), the concept vector of every other concept of
    ``concepts`` in turn (``"other"``: an off-concept thought, averaged over them), a
    norm-matched random vector for each of those (``"random"``), or $c$'s own vector
    (``"own"``). Returns the mean Yes-minus-No margin per concept under each condition, and the
    share of Yes answers (keys ending in ``"_yes"``).
    """
    concepts = list(concepts)
    if len(concepts) < 2:
        raise ValueError("need at least two concepts")
    vecs = concept_vectors(model, lang, concepts, layer)
    prompts = clean_descriptions(lang, concepts)
    k = len(concepts)
    pairs = [(i, j) for i in range(k) for j in range(k) if i != j]
    rows = torch.tensor([i for i, _ in pairs])
    others = vecs[torch.tensor([j for _, j in pairs])]
    conditions = {"none": (prompts, torch.zeros_like(vecs)), "other": (prompts[rows], others),
                  "random": (prompts[rows], norm_matched_random(others, generator)),
                  "own": (prompts, vecs)}
    out = {}
    with torch.no_grad():
        for name, (tokens, add) in conditions.items():
            with inject(model, layer, add, alpha, start=ATTRIBUTE_START):
                margin = answer_margin(model(tokens), lang)
            margin = margin.view(k, k - 1) if name in ("other", "random") else margin[:, None]
            out[name] = margin.mean(1).numpy()
            out[f"{name}_yes"] = (margin > 0).float().mean(1).numpy()
    return out
