"""A hand-built transformer whose P0-sink circuit is written into its weights.

:func:`build_planted` returns a ``HookedTransformer`` (pre-norm RMSNorm, ReLU MLPs, no BOS) and
its ground-truth :class:`~p0circuit.core.types.Circuit`. Every feature has its own residual
coordinates (see :mod:`p0circuit.models.planted.layout`). With ``a = circuit_layer`` (default 0):

*Embedding.* Token ``j`` embeds as ``B e_bias + U e_u + C e_tok[j]``: a constant "bias"
coordinate (read by every neuron and query as a constant input, so that every threshold is a
ratio to it and does not depend on the RMS scale), a shared component ``u`` and a one-hot token
identity.

*Identification: head ``A{a}.H0``.* Query and key weights are zero, so its attention is exactly
uniform over the causal prefix. Its value for token ``j`` is ``v_j = mu u' + s_j`` with
``s_j = sigma (e_j - 1/V) / sqrt(1 - 1/V)``: zero-mean over the vocabulary, ``||s_j|| = sigma``,
orthogonal to ``u'``: the paper's cone model. At position t the head writes
``o_t = mu u' + mean_{i<=t} s_{x_i}``; coordinate ``j`` of the ``s`` part is proportional to
``f_j(t) - 1/V``, where ``f_j(t)`` is the frequency of token j among ``x_0..x_t``. Only at
position 0 is some ``f_j`` equal to 1 (undiluted).

*Detection: MLP ``M{a}``.* Neuron ``j`` (for each token j) fires iff ``f_j(t) > theta``
(default 0.85) and writes a fixed value into the detector coordinate ``d``. So ``d`` is set at
position 0, and at a later position only if one token makes up more than ``theta`` of the prefix
(see *When the plant cannot hold*).

*Amplification: MLP ``M{a+1}``.* One neuron reads ``d`` and writes a large vector along the
fixed sink direction ``k``, sized so that the P0 residual norm after block ``a+1`` is at least
``norm_ratio`` times the mean norm of the other positions.

*Use: heads ``A{l}.H0`` for ``l >= a+2``.* Their queries read the constant bias coordinate, their
keys read ``k`` alone, so the score to the sink position is ``sink_logit`` (default 12) and 0
elsewhere: at least 0.8 of the attention (in fact > 0.99 up to ``n_ctx = 64``) lands on the sink.
Their values write a constant into a "dump" coordinate nothing reads: they are no-op heads.

*What the sink heads read.* Each sink head's key reads ``k`` from the *normalized* state (RMSNorm before
every sublayer), which is the same for ``h`` and ``c * h``: it reads the state's direction, and scaling the P0
state down to an ordinary norm (its direction kept) leaves its attention as it is, while an ordinary direction
of the same norm removes it (:mod:`p0circuit.studies.experiments.reads`). With ``sink_reads="norm"`` the block
after the amplifier holds no sink head; instead its MLP's output bias writes a vector of :data:`WASH` times the
largest ordinary norm along its own coordinate ``wash`` at every position, whatever the state there (anything
computed from the normalized state would shrink with the state and turn it no more than it turns a large one).
A large P0 state keeps most of its direction under it; a P0 state scaled to an ordinary norm turns away from
``k``. The sink heads, from the block after it on, then need the norm as well as the direction: the
paper's *stabilization*, written into the weights. The P0 norm ratio falls back below the onset's line after
that block (every other position grows too), while the sink heads keep attending to P0.

*Distractors (real work on the logits, not part of the circuit).* Every other head is a
content head: its query reads the bias coordinate, its key reads whether the token lies in a
keyword class of 4 tokens (a different class per head), and its value copies the keyword's
identity into the head's own coordinates, which the unembedding reads. MLPs ``M0..M{a+1}`` also
have one content neuron per token writing a random vector that the unembedding reads. The
unembedding also maps token ``j`` to a bigram prediction of ``j+1``.

*Variants.* ``pos="nope"``: ``W_pos`` zero and frozen. ``pos="rope"``: rotary with
``rotary_dim=2``; the planted queries and keys live in the unrotated head dimensions (as
low-frequency dimensions do in trained models), so behaviour equals NoPE: identification needs no
positional signal. ``pos="learned"`` (negative control): row ``sink_pos`` of ``W_pos`` carries a
flag that ``M{a}`` reads directly, so the ground truth is ``PE -> M{a} -> M{a+1}`` with no
attention; the uniform head still runs but nothing reads it. ``circuit_layer=a`` moves the
identification/amplification pair to layers ``a, a+1``. ``sink_pos=1``: head ``A{a+1}.H1``
averages ``d`` uniformly (``1/(t+1)`` of it at position t), and ``M{a+1}`` has a band-pass
(triangle) on that average that is non-zero only at ``1/2``, i.e. at position 1, where it writes
the sink vector.

``key="bos"``: the detector reads the identity of token ``bos_id`` instead of the uniform head,
so the sink forms wherever that token stands (at position 0 when prompts start with it) and
vanishes when it is removed: the counterpart of the position-keyed plant for BOS ablation.

*A secondary sink* (``secondary_token=j2``; None, the default, leaves the plant as above). Trained
models do not keep all their high-norm states at the start: "On the Existence and Behavior of
Secondary Attention Sinks" (ICLR 2026) finds middle-layer MLPs that turn ordinary tokens into
high-norm states that then draw attention too. Here one neuron of ``M{s}`` (``s = secondary_layer``,
default ``a+2``, after the amplifier) reads the one-hot coordinate ``e_tok[j2]`` that the embedding
writes, with the same bias threshold as the content neurons, and writes a large vector along a
second fixed direction ``k2`` (its own coordinate, ``sink2``), sized from the probe (which holds
``j2`` at a random position of every prompt) so that after block ``s`` the norm of every position
holding ``j2`` is at least ``secondary_ratio`` times its prompt's median norm. So the secondary
sink is keyed on the token alone: wherever ``j2`` stands it forms, and nowhere else. At position 0
the neuron fires too, but it reads the normalized residual stream there, which P0's own sink vector
dominates, so its write is smaller by P0's norm ratio: P0 stays the sink it already is. Head
``A{s+1}.H1`` (a content head's slot; the P0 sink heads keep head 0) is a secondary attention sink
head: its key reads ``k2`` as the sink heads' keys read ``k``, so the queries after a ``j2``
position put most of their attention there. The P0 sink heads after block ``s`` also read ``k2``
in their queries (as they read ``k``), so that a query at a secondary sink, whose RMS scale is
large, still puts its attention on P0. Nothing before block ``s`` reads or writes ``k2``: those
blocks differ from the plant without a secondary sink only in where the content features sit (one
content head fewer) and in scales calibrated on the probe that holds ``j2`` (by about 1e-4), so
the P0 circuit and its ground truth are the plain plant's. :meth:`PlantedModel.secondary_truth`
gives the second circuit, ``E@t -> M{s}@t`` at the token's position ``t``.

*When the plant cannot hold.* Without absolute positions, a position whose whole prefix is one
repeated token (``x_0 = ... = x_t``) has exactly the same residual stream as position 0 in every
layer of *any* such model: each attention output there is a convex combination of identical
values. So ``x_1 = x_0`` makes position 1 a second sink, and a prompt of one repeated token has no
distinguished position at all (every position is a copy of P0). More generally the plant flags
position t whenever one token makes up more than ``theta`` of ``x_0..x_t``;
:func:`p0_like_positions` computes this set, and the tests assert both the sink on prompts where
the set is ``{0}`` and the documented failure elsewhere.
"""

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
from torch import Tensor
from transformer_lens import HookedTransformer, HookedTransformerConfig

from p0circuit.core.entries import PLANT_LAYERS
from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError, ConfigError, from_known_keys
from p0circuit.core.names import SINK_HEADS_ATTR
from p0circuit.core.args import entry_point
from p0circuit.core.threads import share
from p0circuit.models.planted.layout import Layout
from p0circuit.models.tokens import BOS_ATTR, p0_like_positions, probe_tokens, regular_prompts  # noqa: F401 (re-exported)
from p0circuit.core.types import Circuit, Edge, Input, Kind, Node

BIAS = 8.0
"""Value of the constant bias coordinate in every token embedding."""
U_EMB = 1.0
"""Shared component of every token embedding."""
TOK = 2.0
"""Size of the one-hot token identity in the embedding."""
D_VAL = 4.0
"""Value the detector writes into its coordinate at the identified position."""
FLAG = 4.0
"""Position-embedding flag of the learned-position variant."""
AVG_W = 2.0
"""Scale of the uniform average of ``d`` in the ``sink_pos=1`` variant."""

KEY_SCORE = 5.0
"""Attention score of content heads for keyword tokens."""
RD = 2
"""Head dimension carrying planted query/key features (beyond ``rotary_dim=2``)."""
KW = 4
"""Tokens per keyword class."""
SECONDARY_RATIO = 8.0
"""Default ``PlantSpec.secondary_ratio``: below P0's ``norm_ratio``, above the sink report's threshold."""
WASH = 8.0
"""Size of the ``norm`` plant's write at every position, in largest ordinary norms."""
SECONDARY_FIELDS = ("secondary_token", "secondary_layer", "secondary_ratio")
"""The settings of the secondary sink; left out of :meth:`PlantSpec.to_dict` when there is none."""


@entry_point
@dataclass(frozen=True)
class PlantSpec:
    """Settings of a planted model."""

    pos: str = "rope"
    """Position encoding: ``rope``, ``nope`` or ``learned`` (the negative control); validated below."""
    n_layers: int = PLANT_LAYERS
    """Number of blocks (at least ``circuit_layer + 3``)."""
    n_heads: int = 2
    """Heads per block (at least 2)."""
    d_vocab: int = 32
    """Vocabulary size (a multiple of 4, at least 8)."""
    n_ctx: int = 64
    """Longest prompt."""
    circuit_layer: int = 0
    """Layer of the identification head and detector MLP; the amplifier MLP is one layer later."""
    sink_pos: int = 0
    """Position made into the sink: 0, or 1 (a transition-stage circuit)."""
    norm_ratio: float = 10.0
    """Guaranteed minimum of ||h_sink|| / mean_t ||h_t|| after the amplifier block."""
    sink_logit: float = 12.0
    """Attention score of the sink heads for the sink position (others score 0)."""
    mu: float = 1.0
    """Cone model: size of the shared component of the identification head's values."""
    sigma: float = 2.0
    """Cone model: size of the token-specific components (||s_j|| = sigma)."""
    theta: float = 0.85
    """Detector threshold on the frequency of one token in the prefix."""
    seed: int = 0
    """Seed for the random content vectors."""
    key: str = "position"
    """What the detector keys on: ``position`` (the mechanism above) or ``bos``: the detector
    fires on token ``bos_id`` wherever it is, as a model whose sink depends on a BOS token would."""
    bos_id: int = 0
    """The BOS token of ``key="bos"``."""
    secondary_token: Optional[int] = None
    """The token made a secondary sink wherever it stands (see *A secondary sink*); None: no secondary sink."""
    secondary_layer: Optional[int] = None
    """The MLP that writes the secondary sink: ``circuit_layer + 2`` (None) up to ``n_layers - 2``
    (the block after it holds the head that attends to it)."""
    secondary_ratio: float = SECONDARY_RATIO
    """Guaranteed minimum of ||h_t|| / median_s ||h_s|| after ``secondary_layer`` at every position
    t >= 1 holding ``secondary_token``, on prompts where such positions and P0 are fewer than half."""
    sink_reads: str = "direction"
    """What the sink heads need of the P0 state (see *What the sink heads read*): ``direction`` (they read its
    direction, right after the amplifier) or ``norm`` (a block between the amplifier and them writes a large vector
    at every position, which only a large state outlasts: they need its norm too)."""

    def __post_init__(self) -> None:
        for name, high in (("n_layers", 64), ("n_heads", 64), ("d_vocab", 4096), ("n_ctx", 8192)):
            if getattr(self, name) > high:
                raise ConfigError(f"PlantSpec.{name}={getattr(self, name)} is larger than a planted model takes "
                                  f"(at most {high}): planted models are small by design; use ModelSpec for size")
        if self.key not in ("position", "bos"):
            raise ConfigError(f"PlantSpec.key={self.key!r}; choose 'position' or 'bos'")
        if self.key == "bos" and (self.pos == "learned" or self.sink_pos != 0):
            raise ConfigError("PlantSpec.key='bos' needs pos 'rope' or 'nope' and sink_pos=0")
        if not 0 <= self.bos_id < self.d_vocab:
            raise ConfigError(f"PlantSpec.bos_id must lie in 0..{self.d_vocab - 1}")
        if self.pos not in ("rope", "nope", "learned"):
            raise ConfigError(f"PlantSpec.pos={self.pos!r}; choose 'rope', 'nope' or 'learned'")
        if self.sink_pos not in (0, 1):
            raise ConfigError(f"PlantSpec.sink_pos must be 0 or 1, got {self.sink_pos!r}")
        if self.circuit_layer < 0 or self.n_layers < self.circuit_layer + 3:
            raise ConfigError(
                f"PlantSpec needs n_layers >= circuit_layer + 3 (identification, amplification, "
                f"then sink heads); got n_layers={self.n_layers}, circuit_layer={self.circuit_layer}"
            )
        if self.n_heads < 2:
            raise ConfigError(f"PlantSpec.n_heads must be >= 2, got {self.n_heads}")
        if self.d_vocab < 8 or self.d_vocab % KW:
            raise ConfigError(f"PlantSpec.d_vocab must be a multiple of {KW} and >= 8, got {self.d_vocab}")
        if not 0.5 < self.theta < 1.0:
            raise ConfigError(f"PlantSpec.theta must lie in (0.5, 1), got {self.theta}")
        if self.n_ctx < 2:
            raise ConfigError(f"PlantSpec.n_ctx must be >= 2, got {self.n_ctx}")
        if self.norm_ratio > 1e6 or self.sink_logit > 1e4 or self.mu > 1e3 or self.sigma > 1e3:
            raise ConfigError("PlantSpec needs norm_ratio <= 1e6, sink_logit <= 1e4, mu <= 1e3, sigma <= 1e3: larger "
                              "values overflow float32 weights")
        if self.norm_ratio < 1 or self.sink_logit <= 0 or self.mu < 0 or self.sigma <= 0:
            raise ConfigError("PlantSpec needs norm_ratio >= 1, sink_logit > 0, mu >= 0, sigma > 0")
        if self.sink_reads not in ("direction", "norm"):
            raise ConfigError(f"PlantSpec.sink_reads={self.sink_reads!r}; choose 'direction' or 'norm'")
        if self.sink_reads == "norm" and (self.n_layers < self.circuit_layer + 4 or self.sink_pos != 0):
            raise ConfigError(f"PlantSpec.sink_reads='norm' needs sink_pos=0 and n_layers >= circuit_layer + 4 (the "
                              "amplifier, the block that writes at every position, then sink heads); got "
                              f"n_layers={self.n_layers}, circuit_layer={self.circuit_layer}, sink_pos={self.sink_pos}")
        self._check_secondary()

    def _check_secondary(self) -> None:
        tok, layer, ratio = self.secondary_token, self.secondary_layer, self.secondary_ratio
        if tok is None:
            if layer is not None or ratio != SECONDARY_RATIO:
                raise ConfigError("PlantSpec.secondary_layer and secondary_ratio shape a secondary sink: set "
                                  "secondary_token (the token made a sink) too, or leave them at their defaults")
            return
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < self.d_vocab:
            raise ConfigError(f"PlantSpec.secondary_token must be a token id in 0..{self.d_vocab - 1}, got {tok!r}")
        if self.key == "bos" and tok == self.bos_id:
            raise ConfigError(f"PlantSpec.secondary_token={tok} is the BOS token of key='bos', which is already the "
                              "P0 sink's key; choose another id")
        low, high = self.circuit_layer + 2, self.n_layers - 2
        if low > high:
            raise ConfigError(f"PlantSpec with a secondary sink needs n_layers >= circuit_layer + 4 (its MLP after the "
                              f"P0 amplifier, and a block after that for the head that attends to it); got "
                              f"n_layers={self.n_layers}, circuit_layer={self.circuit_layer}")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or not low <= layer <= high):
            raise ConfigError(f"PlantSpec.secondary_layer must lie in circuit_layer + 2 .. n_layers - 2 = "
                              f"{low}..{high} (after the P0 amplifier, whose MLP is block {low - 1}, with a block after "
                              f"it for the head that attends to the secondary sink), got {layer!r}")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 1 <= ratio <= 1e6:
            raise ConfigError(f"PlantSpec.secondary_ratio must lie in [1, 1e6] (larger overflows float32 weights), "
                              f"got {ratio!r}")

    @property
    def secondary_at(self) -> Optional[int]:
        """The block whose MLP writes the secondary sink (``secondary_layer`` or its default), or None."""
        if self.secondary_token is None:
            return None
        return self.circuit_layer + 2 if self.secondary_layer is None else self.secondary_layer

    def to_dict(self) -> dict:
        """Plain dict of the settings (without the secondary sink's when there is none: a plant
        without one records the same settings as before they existed)."""
        out = asdict(self)
        if self.secondary_token is None:
            for name in SECONDARY_FIELDS:
                del out[name]
        if self.sink_reads == "direction":  # the default, left out so that earlier plants record what they did
            del out["sink_reads"]
        return out

    @property
    def first_sink_block(self) -> int:
        """The first block with a sink head: right after the amplifier, or after the writing block (``norm``)."""
        return self.circuit_layer + (3 if self.sink_reads == "norm" else 2)


@dataclass
class PlantedModel:
    """A planted model with everything the plant guarantees, as data."""

    model: HookedTransformer
    """The hooked model."""
    truth: Circuit
    """Ground-truth circuit (nodes and edges)."""
    spec: PlantSpec
    """The settings it was built with."""
    layout: Layout
    """Residual coordinates of every feature."""
    sink_heads: tuple[tuple[int, int], ...]
    """(layer, head) of every head that attends to the sink."""
    content_heads: tuple[tuple[int, int], ...]
    """(layer, head) of the distractor heads."""
    neurons: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    """Role -> (layer, neuron indices): ``detector``, ``amplifier``, ``content{l}``, ``secondary``."""
    secondary_heads: tuple[tuple[int, int], ...] = ()
    """(layer, head) of the head that attends to the secondary sink; empty without one."""

    @property
    def circuit_layers(self) -> tuple[int, int]:
        """Layers of the identification/detection and the amplification MLPs."""
        a = self.spec.circuit_layer
        return (a, a + 1)

    def secondary_truth(self, at: int) -> Optional[Circuit]:
        """Ground truth of the secondary sink at position ``at`` (where ``secondary_token`` stands),
        named as patching reports nodes at that index (``Swap(position=at)``, candidates at ``at``):
        ``E@at -> M{s}@at``, which writes the residual stream there (``R{s}@at``) and the key of the
        secondary attention head. The sink is keyed on the token, not on a position, so the circuit
        is one per position; None for a plant without a secondary sink."""
        s = self.spec.secondary_at
        if s is None:
            return None
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < self.spec.n_ctx:
            raise BadInputError(f"secondary_truth: at must be a position in 0..{self.spec.n_ctx - 1}, got {at!r}")
        src, mlp = Node(Kind.EMBED, pos=at), Node(Kind.MLP, s, pos=at)
        edges = [Edge(src, mlp, Input.MLP), Edge(mlp, Node(Kind.RESID, s, pos=at), Input.RESID)]
        edges += [Edge(mlp, Node(Kind.HEAD, layer, h, pos=at), Input.K) for layer, h in self.secondary_heads]
        return Circuit(nodes=(src, mlp), edges=tuple(edges),
                       settings={"source": "planted", "circuit": "secondary", "at": at, "plant": self.spec.to_dict(),
                                 "secondary_heads": [list(x) for x in self.secondary_heads]})


def _through(hook: str) -> "int | None":
    """``stop_at_layer`` for a forward that only needs ``hook``: one block past the hook's block
    (the plant is built from many such probes; a full forward for each costs several times more)."""
    parts = hook.split(".")
    return int(parts[1]) + 1 if parts[0] == "blocks" else None


def _median(
    model: HookedTransformer, toks: Tensor, hook: str, pos: object, norm: bool = False, q: float = 0.5
) -> float:
    """Quantile ``q`` (median by default) over the probe of an RMS scale or a residual norm."""
    _, cache = model.run_with_cache(toks, names_filter=hook, stop_at_layer=_through(hook))
    x = cache[hook]
    x = x.norm(dim=-1) if norm else x.reshape(x.shape[0], x.shape[1])
    sel = x[:, 1:] if pos == "rest" else x[:, int(pos)]  # type: ignore[call-overload]
    return float(sel.float().quantile(q))


def _min_norm_ratio(model: HookedTransformer, toks: Tensor, layer: int, sp: int, theta: float) -> float:
    """Smallest ||h_sp|| / mean_{t != sp} ||h_t|| after ``layer`` over the probe's regular prompts."""
    _, cache = model.run_with_cache(regular_prompts(toks, theta), names_filter=hooks.resid_post(layer),
                                    stop_at_layer=layer + 1)
    norms = cache[hooks.resid_post(layer)].norm(dim=-1)
    others = torch.cat([norms[:, :sp], norms[:, sp + 1:]], 1).mean(1)
    return float((norms[:, sp] / others).min())


@entry_point
def build_planted(spec: PlantSpec | None = None, **overrides: object) -> PlantedModel:
    """Build the planted model described in this module's docstring.

    ``build_planted(pos="nope")`` is shorthand for ``build_planted(PlantSpec(pos="nope"))``. The
    sections follow the docstring: head roles, residual layout, embedding, then block by block the
    heads and the MLPs (content neurons, detector, amplifier), each calibrated on a probe run through
    the blocks written so far, and last the unembedding.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()
        >>> pm.sink_heads, [n.name for n in pm.truth.writers]
        (((2, 0), (3, 0)), ['A0.H0@0', 'M0@0', 'M1@0'])
    """
    if spec is None:
        spec = from_known_keys(PlantSpec, overrides, "build_planted / PlantSpec")  # type: ignore[assignment]
    elif overrides:
        spec = from_known_keys(PlantSpec, {**spec.to_dict(), **overrides}, "build_planted / PlantSpec")  # type: ignore[assignment]
    roles = _roles(spec)
    content = [lh for lh, r in roles.items() if r == "content"]
    lay = _layout(spec, content)
    model = share(HookedTransformer(_config(spec, lay), move_to_device=False))  # (core/threads.py)
    model.eval()
    b = _Build(spec, model, lay, roles, content, torch.Generator().manual_seed(spec.seed))
    if spec.key == "bos":  # before the probe: the calibration prompts start with the BOS token, as the sink needs
        setattr(model, BOS_ATTR, spec.bos_id)
    with torch.no_grad():
        _write_embed(b)
        b.probe = probe_tokens(model, 64, spec.n_ctx, seed=b.gen, regular=True, bos=spec.key == "bos")
        if spec.secondary_token is not None:
            b.probe = _with_secondary(b.probe, spec)
        for layer in range(spec.n_layers):
            _write_heads(b, layer)
            _write_mlp(b, layer)
        _write_unembed(b)
    sink_heads = tuple(lh for lh, r in roles.items() if r == "sink")
    setattr(model, SINK_HEADS_ATTR, sink_heads)  # so metric="sink_heads" works wherever the model goes
    return PlantedModel(model, _ground_truth(spec, sink_heads), spec, lay, sink_heads, tuple(content), b.neurons,
                        tuple(lh for lh, r in roles.items() if r == "secondary"))


def _with_secondary(probe: Tensor, spec: PlantSpec) -> Tensor:
    """The probe with ``secondary_token`` at one random position >= 1 of every prompt (never at position 1
    after the same token at 0, which would make position 1 a copy of P0), from a generator of its own: the
    plant's other random draws are those of the plant without a secondary sink."""
    gen = torch.Generator().manual_seed(spec.seed + 1)
    rows, length = probe.shape
    if length < 3:
        return probe
    at = torch.randint(1, length, (rows,), generator=gen)
    at[(at == 1) & (probe[:, 0] == spec.secondary_token)] = 2
    out = probe.clone()
    out[torch.arange(rows), at] = spec.secondary_token
    return out


@dataclass
class _Build:
    """What the sections of :func:`build_planted` share while they write the weights."""

    spec: PlantSpec
    model: HookedTransformer
    lay: Layout
    roles: dict[tuple[int, int], str]
    content: list[tuple[int, int]]
    gen: torch.Generator
    probe: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    """Calibration prompts: every scale is a median over them of the blocks written so far."""
    neurons: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    k_val: float = 0.0
    """Size of the sink vector, set by the amplifier and read by the later sink heads."""
    k2_val: float = 0.0
    """Size of the secondary sink vector, set by its MLP (0 before it) and read by the later heads."""

    @property
    def sigma_n(self) -> float:
        """Per-coordinate scale of the cone model's token components."""
        return self.spec.sigma / math.sqrt(1 - 1 / self.spec.d_vocab)

    def median(self, hook: str, pos: object, **kw: object) -> float:
        return _median(self.model, self.probe, hook, pos, **kw)  # type: ignore[arg-type]

    @property
    def secondary_mask(self) -> Tensor:
        """Where the probe holds the secondary token, position 0 left out: ``[batch, pos]``."""
        mask = self.probe == self.spec.secondary_token
        mask[:, 0] = False
        return mask

    def secondary_median(self, hook: str) -> float:
        """Median over the probe's secondary-token positions (see :attr:`secondary_mask`) of an RMS scale."""
        _, cache = self.model.run_with_cache(self.probe, names_filter=hook, stop_at_layer=_through(hook))
        x = cache[hook]
        return float(x.reshape(x.shape[0], x.shape[1])[self.secondary_mask].float().median())


def _roles(spec: PlantSpec) -> dict[tuple[int, int], str]:
    """(layer, head) -> ``ident``, ``sink``, ``avg``, ``secondary`` or ``content``."""
    a, sp, learned = spec.circuit_layer, spec.sink_pos, spec.pos == "learned"
    roles: dict[tuple[int, int], str] = {}
    for layer in range(spec.n_layers):
        for h in range(spec.n_heads):
            role = "content"
            if (layer, h) == (a, 0):
                role = "ident"
            elif layer >= spec.first_sink_block and h == 0:
                role = "sink"
            elif (layer, h) == (a + 1, 1) and sp == 1 and not learned:
                role = "avg"
            elif spec.secondary_at is not None and (layer, h) == (spec.secondary_at + 1, 1):
                role = "secondary"
            roles[(layer, h)] = role
    return roles


def _layout(spec: PlantSpec, content: list[tuple[int, int]]) -> Layout:
    """Residual coordinates of every feature."""
    lay = Layout()
    for name, size in [("bias", 1), ("u", 1), ("tok", spec.d_vocab), ("u_out", 1), ("s_out", spec.d_vocab),
                       ("det", 1), ("avg", 1), ("sink", 1), ("flag", 1), ("dump", 1)]:
        lay.add(name, size)
    for (layer, h) in content:
        lay.add(f"ctx{layer}.{h}", KW)
    for layer in range(spec.circuit_layer + 2):
        lay.add(f"mlpc{layer}", 4)
    if spec.secondary_token is not None:  # last: a plant without it keeps its layout (and d_model)
        lay.add("sink2", 1)
    if spec.sink_reads == "norm":
        lay.add("wash", 1)
    return lay


def _config(spec: PlantSpec, lay: Layout) -> HookedTransformerConfig:
    V = spec.d_vocab
    return HookedTransformerConfig(
        n_layers=spec.n_layers, d_model=16 * math.ceil(lay.d_model / 16), n_heads=spec.n_heads, d_head=V + 2,
        d_mlp=2 * V + 4, d_vocab=V, n_ctx=spec.n_ctx, act_fn="relu", normalization_type="RMS",
        positional_embedding_type="rotary" if spec.pos == "rope" else "standard",
        rotary_dim=2 if spec.pos == "rope" else None, default_prepend_bos=False, seed=spec.seed,
        device="cpu", model_name=f"p0circuit-planted-{spec.pos}",
    )


def _write_embed(b: _Build) -> None:
    """Norm weights 1, everything else 0; token embeddings (bias, u, one-hot identity) and positions."""
    spec, lay, model = b.spec, b.lay, b.model
    for name, t in model.named_parameters():
        t.fill_(1.0 if name.endswith("ln1.w") or name.endswith("ln2.w") or name == "ln_final.w" else 0.0)
    W_E = model.W_E
    W_E[:, lay.one("bias")] = BIAS
    W_E[:, lay.one("u")] = U_EMB
    for j in range(spec.d_vocab):
        W_E[j, lay["tok"][j]] = TOK
    if spec.pos == "learned":
        model.W_pos[spec.sink_pos, lay.one("flag")] = FLAG
    if spec.pos == "nope":
        model.W_pos.requires_grad_(False)


def _write_heads(b: _Build, layer: int) -> None:
    """The heads of one block by role: identification (cone model), sink, average, content."""
    spec, lay, V, sp = b.spec, b.lay, b.spec.d_vocab, b.spec.sink_pos
    B, d_head = lay.one("bias"), b.model.cfg.d_head
    att = b.model.blocks[layer].attn
    r_rest = b.median(hooks.ln_scale(layer, "ln1"), "rest")
    r_sink = b.median(hooks.ln_scale(layer, "ln1"), sp)
    r_p0 = b.median(hooks.ln_scale(layer, "ln1"), 0)
    r_sec = b.secondary_median(hooks.ln_scale(layer, "ln1")) if b.k2_val else 0.0  # after the secondary MLP
    for h in range(spec.n_heads):
        role = b.roles[(layer, h)]
        WQ, WK, WV, WO = att.W_Q[h], att.W_K[h], att.W_V[h], att.W_O[h]
        if role == "ident":
            for j in range(V):
                WV[lay["tok"][j], j] = r_rest / TOK
                WO[j, lay["s_out"].start:lay["s_out"].stop] = -b.sigma_n / V
                WO[j, lay["s_out"][j]] += b.sigma_n
            WV[lay.one("u"), V] = r_rest / U_EMB
            WO[V, lay.one("u_out")] = spec.mu
        elif role == "sink":
            WQ[B, RD] = r_rest / BIAS
            WQ[lay.one("sink"), RD] = r_sink / b.k_val  # the sink position's own query
            WK[lay.one("sink"), RD] = spec.sink_logit * math.sqrt(d_head) * r_sink / b.k_val
            WV[B, 0] = r_rest / BIAS
            WO[0, lay.one("dump")] = 1.0
            if b.k2_val:  # a query at a secondary sink (large RMS scale) reads k2 as P0's reads k
                WQ[lay.one("sink2"), RD] = r_sec / b.k2_val
        elif role == "secondary":  # a sink head for the secondary sink: its key reads k2
            WQ[B, RD] = r_rest / BIAS
            WQ[lay.one("sink"), RD] = r_sink / b.k_val
            WQ[lay.one("sink2"), RD] = r_sec / b.k2_val
            WK[lay.one("sink2"), RD] = spec.sink_logit * math.sqrt(d_head) * r_sec / b.k2_val
            WV[B, 0] = r_rest / BIAS
            WO[0, lay.one("dump")] = 1.0
        elif role == "avg":
            WV[lay.one("det"), 0] = r_p0 / D_VAL
            WO[0, lay.one("avg")] = AVG_W
        else:
            cls = b.content.index((layer, h)) % (V // KW)
            WQ[B, RD] = r_rest / BIAS
            for i in range(KW):
                j = cls * KW + i
                WK[lay["tok"][j], RD] = KEY_SCORE * math.sqrt(d_head) * r_rest / TOK
                WV[lay["tok"][j], i] = r_rest / TOK
                WO[i, lay[f"ctx{layer}.{h}"][i]] = 1.0


def _write_mlp(b: _Build, layer: int) -> None:
    """The MLP of one block: content neurons up to the amplifier's block, the detector, the amplifier."""
    a = b.spec.circuit_layer
    r2 = {pos: b.median(hooks.ln_scale(layer, "ln2"), pos) for pos in ("rest", b.spec.sink_pos, 0)}
    if layer <= a + 1:
        _write_content_neurons(b, layer, r2["rest"])
    if layer == a:
        _write_detector(b, layer, r2[0], r2[b.spec.sink_pos])
    if layer == a + 1:
        _write_amplifier(b, layer, r2[b.spec.sink_pos])
    if layer == b.spec.secondary_at:
        _write_secondary(b, layer)
    if b.spec.sink_reads == "norm" and layer == a + 2:
        _write_wash(b, layer)


def _write_content_neurons(b: _Build, layer: int, r2_rest: float) -> None:
    """Neurons V..2V-1: neuron V+j fires iff the token is j and writes a random vector the unembedding reads."""
    V, lay, mlp = b.spec.d_vocab, b.lay, b.model.blocks[layer].mlp
    for j in range(V):
        n = V + j
        mlp.W_in[lay["tok"][j], n] = 1.0
        mlp.W_in[lay.one("bias"), n] = -0.5 * TOK / BIAS
        vec = torch.randn(4, generator=b.gen) * 0.5
        mlp.W_out[n, lay[f"mlpc{layer}"].start:lay[f"mlpc{layer}"].stop] = vec * r2_rest / (0.5 * TOK)
    b.neurons[f"content{layer}"] = (layer, tuple(range(V, 2 * V)))


def _write_detector(b: _Build, layer: int, r2_p0: float, r2_sink: float) -> None:
    """Writes ``d`` where P0 is identified: from the BOS token, the position flag, or the cone asymmetry."""
    spec, lay, V = b.spec, b.lay, b.spec.d_vocab
    W_in, W_out, B = b.model.blocks[layer].mlp.W_in, b.model.blocks[layer].mlp.W_out, lay.one("bias")
    if spec.key == "bos":
        W_in[lay["tok"][spec.bos_id], 0] = 1.0
        W_in[B, 0] = -0.5 * TOK / BIAS
        W_out[0, lay.one("det")] = D_VAL * r2_p0 / (0.5 * TOK)
        b.neurons["detector"] = (layer, (0,))
    elif spec.pos == "learned":
        W_in[lay.one("flag"), 0] = 1.0
        W_in[B, 0] = -0.5 * FLAG / BIAS
        W_out[0, lay.one("det")] = D_VAL * r2_sink / (0.5 * FLAG)
        b.neurons["detector"] = (layer, (0,))
    else:
        for j in range(V):
            W_in[lay["s_out"][j], j] = 1.0
            W_in[B, j] = -b.sigma_n * (spec.theta - 1 / V) / BIAS
            W_out[j, lay.one("det")] = D_VAL * r2_p0 / (b.sigma_n * (1 - spec.theta))
        b.neurons["detector"] = (layer, tuple(range(V)))


def _write_amplifier(b: _Build, layer: int, r2_sink: float) -> None:
    """Writes the sink vector (size ``k_val``) at the sink position, rescaled to the worst probe prompt."""
    spec, lay, sp = b.spec, b.lay, b.spec.sink_pos
    W_in, W_out, B = b.model.blocks[layer].mlp.W_in, b.model.blocks[layer].mlp.W_out, lay.one("bias")
    rest_norm = b.median(hooks.resid_post(layer), "rest", norm=True, q=1.0)
    b.k_val = spec.norm_ratio * 1.25 * rest_norm  # 25% above the largest norm seen
    n0 = 2 * spec.d_vocab
    if sp == 0 or spec.pos == "learned":
        W_in[lay.one("det"), n0] = 1.0
        W_in[B, n0] = -0.5 * D_VAL / BIAS
        W_out[n0, lay.one("sink")] = b.k_val * r2_sink / (0.5 * D_VAL)
        b.neurons["amplifier"] = (layer, (n0,))
    else:  # triangle on avg/AVG_W around 1/2: non-zero only at position 1
        for i, (c, w) in enumerate([(0.4, 1.0), (0.5, -2.0), (0.6, 1.0)]):
            W_in[lay.one("avg"), n0 + i] = 1.0
            W_in[B, n0 + i] = -c * AVG_W / BIAS
            W_out[n0 + i, lay.one("sink")] = w * b.k_val * r2_sink / (0.1 * AVG_W)
        b.neurons["amplifier"] = (layer, (n0, n0 + 1, n0 + 2))
    amp = list(b.neurons["amplifier"][1])
    worst = _min_norm_ratio(b.model, b.probe, layer, sp, spec.theta)
    if worst < 1.1 * spec.norm_ratio:  # the scales vary with content: rescale to the worst case
        W_out[amp] *= 1.1 * spec.norm_ratio / worst
        b.k_val *= 1.1 * spec.norm_ratio / worst


def _write_wash(b: _Build, layer: int) -> None:
    """The MLP's output bias writes :data:`WASH` times the largest ordinary norm along the coordinate ``wash`` at every
    position, whatever the state there (a bias reads nothing): a large state (P0 after the amplifier) hardly turns,
    an ordinary-sized one turns almost wholly towards ``wash``."""
    rest_norm = b.median(hooks.resid_pre(layer), "rest", norm=True, q=1.0)
    b.model.blocks[layer].mlp.b_out[b.lay.one("wash")] = WASH * rest_norm


def _secondary_ratios(b: _Build, layer: int) -> Tensor:
    """||h_t|| / median_s ||h_s|| after ``layer`` at every secondary-token position t >= 1 of the probe's
    prompts whose sink positions (P0 and the token's) are fewer than half, so that the median is an
    ordinary position's."""
    hook = hooks.resid_post(layer)
    _, cache = b.model.run_with_cache(b.probe, names_filter=hook, stop_at_layer=layer + 1)
    norms = cache[hook].float().norm(dim=-1)
    ratios = norms / norms.median(dim=-1, keepdim=True).values
    mask = b.secondary_mask
    mask[2 * (mask.sum(1) + 1) >= mask.shape[1]] = False
    return ratios[mask]


def _write_secondary(b: _Build, layer: int) -> None:
    """One neuron reads the secondary token's one-hot coordinate and writes the secondary sink vector
    (size ``k2_val``) along ``sink2``, rescaled to the worst probe position."""
    spec, lay, mlp, B = b.spec, b.lay, b.model.blocks[layer].mlp, b.lay.one("bias")
    r2 = b.secondary_median(hooks.ln_scale(layer, "ln2"))
    hook = hooks.resid_post(layer)  # before the write: the largest norm of a position that is no sink
    _, cache = b.model.run_with_cache(b.probe, names_filter=hook, stop_at_layer=layer + 1)
    norms = cache[hook].float().norm(dim=-1)
    ordinary = torch.ones_like(norms, dtype=torch.bool)
    ordinary[:, [0, spec.sink_pos]] = False
    b.k2_val = spec.secondary_ratio * 1.25 * float(norms[ordinary].max())
    n = 0  # the MLPs after the amplifier's have no other neuron
    mlp.W_in[lay["tok"][spec.secondary_token], n] = 1.0
    mlp.W_in[B, n] = -0.5 * TOK / BIAS
    mlp.W_out[n, lay.one("sink2")] = b.k2_val * r2 / (0.5 * TOK)
    b.neurons["secondary"] = (layer, (n,))
    worst = float(_secondary_ratios(b, layer).min())
    if worst < 1.1 * spec.secondary_ratio:  # the scales vary with content: rescale to the worst case
        mlp.W_out[n] *= 1.1 * spec.secondary_ratio / worst
        b.k2_val *= 1.1 * spec.secondary_ratio / worst


def _write_unembed(b: _Build) -> None:
    """Bigram prediction of the next token, keyword identities of the content heads, MLP content."""
    V, lay, W_U = b.spec.d_vocab, b.lay, b.model.W_U
    for j in range(V):
        W_U[lay["tok"][j], (j + 1) % V] = 1.0
    for (layer, h) in b.content:
        cls = b.content.index((layer, h)) % (V // KW)
        for i in range(KW):
            W_U[lay[f"ctx{layer}.{h}"][i], cls * KW + i] = 1.0
    for layer in range(b.spec.circuit_layer + 2):
        W_U[lay[f"mlpc{layer}"].start:lay[f"mlpc{layer}"].stop] = torch.randn(4, V, generator=b.gen) * 0.5


def _ground_truth(spec: PlantSpec, sink_heads: tuple[tuple[int, int], ...]) -> Circuit:
    a, sp = spec.circuit_layer, spec.sink_pos
    mlp_a, mlp_b = Node(Kind.MLP, a, pos=sp), Node(Kind.MLP, a + 1, pos=sp)
    if spec.key == "bos":
        src = Node(Kind.EMBED, pos=0)
        nodes = [src, mlp_a, mlp_b]
        edges = [Edge(src, mlp_a, Input.MLP), Edge(mlp_a, mlp_b, Input.MLP)]
    elif spec.pos == "learned":
        src = Node(Kind.POS_EMBED, pos=sp)
        nodes = [src, mlp_a, mlp_b]
        edges = [Edge(src, mlp_a, Input.MLP), Edge(mlp_a, mlp_b, Input.MLP)]
    elif sp == 0:
        ident = Node(Kind.HEAD, a, 0, pos=0)
        nodes = [ident, mlp_a, mlp_b]
        edges = [Edge(ident, mlp_a, Input.MLP), Edge(mlp_a, mlp_b, Input.MLP)]
    else:
        ident, det = Node(Kind.HEAD, a, 0, pos=0), Node(Kind.MLP, a, pos=0)
        avg = Node(Kind.HEAD, a + 1, 1, pos=1)
        nodes = [ident, det, avg, mlp_b]
        edges = [Edge(ident, det, Input.MLP), Edge(det, avg.at(0), Input.V), Edge(avg, mlp_b, Input.MLP)]
    edges += [Edge(mlp_b, Node(Kind.HEAD, layer, h, pos=sp), Input.K) for layer, h in sink_heads]
    return Circuit(
        nodes=tuple(nodes),
        edges=tuple(edges),
        settings={"source": "planted", "plant": spec.to_dict(), "sink_heads": [list(x) for x in sink_heads]},
    )
