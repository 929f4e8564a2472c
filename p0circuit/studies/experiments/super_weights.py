"""Super weights: the single weights that write a massive dimension, named, ranked and removed.

Yu et al. (2024, "The Super Weight in Large Language Models") find that zeroing one scalar of an MLP's down
projection can destroy a model: the weight that writes a massive activation. A neuron that carries a massive
dimension's change (the analysis' neuron pass) writes it through one entry of its block's ``W_out``, row
``neuron``, column ``dim``. :func:`super_weights` names those entries (value, rank by magnitude in the matrix,
z-score against the matrix's entries), zeroes each alone and the strongest few together, and measures what is
lost: the P0 norm ratio after the onset, the attention later heads give position 0, Sink_0^eps and the
next-token loss. :func:`weight_outliers` lists, for the whole model, every entry of every block's ``W_out``
whose z-score reaches :data:`SUPER_Z`, and whether its column is a massive dimension at P0: the candidates,
whether or not an onset uses them.

A weight is zeroed in place for one forward and restored at once (also when interrupted): the model is the
same before and after the call.
"""

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.args import entry_point
from p0circuit.core.defaults import SINK_EPS
from p0circuit.core.errors import BadInputError
from p0circuit.studies.findings import Weight, Zeroed, SuperWeights
from p0circuit.core.types import Kind, Node
from p0circuit.measures.attention import attention_to_position
from p0circuit.measures.loss import next_token_loss
from p0circuit.measures.norms import norm_ratio
from p0circuit.models.checks import check_block, check_dims, check_model
from p0circuit.models.tokens import check_tokens
from p0circuit.patching.shape import BlockShape

SUPER_Z = 20.0
"""|z-score| (standard deviations from the mean of its matrix's entries) at which a ``W_out`` entry is listed as a
super-weight candidate."""
PER_BLOCK = 4
"""Candidates listed per block at most (the largest |z| first)."""
TOGETHER = 3
"""The strongest weights (by |z|) also zeroed together."""
DIRECT_Z = 3.0
"""|z-score| from which a neuron's weight into the dimension counts as writing it itself, and is zeroed: a neuron
whose weight is ordinary carries the dimension's change through later blocks, not by writing it."""
ZEROED = 3
"""Weights zeroed alone at most (the largest |z| first)."""


def name_of(w: Any) -> str:
    """``M2.W_out[90, 507]``."""
    return f"M{w.block}.W_out[{w.neuron}, {w.dim}]"


def _stats(matrix: Tensor) -> tuple[float, float, Tensor]:
    flat = matrix.detach().float().flatten()
    return float(flat.mean()), float(flat.std()), flat.abs()


def weight_of(model: Any, block: int, neuron: int, dim: int, massive: Sequence[int] = ()) -> Weight:
    """The entry ``W_out[neuron, dim]`` of ``block``'s MLP with its rank and z-score."""
    W = model.blocks[block].mlp.W_out
    mean, std, mags = _stats(W)
    value = float(W[neuron, dim].detach())
    if not std > 0:
        raise BadInputError(f"block {block}'s MLP W_out has every entry equal ({mean:g}): no weight stands out of it, "
                            "so no z-score; ask about the neurons of another block")
    return Weight(block=block, neuron=neuron, dim=dim, value=value, rank=int((mags > abs(value)).sum()) + 1,
                  z=(value - mean) / std, massive=dim in massive)


def _mlps(model: Any, where: str) -> None:
    shape = BlockShape.of(model)
    if shape.attn_only or shape.experts:
        raise BadInputError(f"{where}: this model has " + ("no MLPs" if shape.attn_only else "a mixture of "
                            "experts (one down projection per expert)") + ": there is no single W_out to read")


@entry_point
def weight_outliers(model: Any, *, massive: Sequence[int] = (), z: float = SUPER_Z,
                    per_block: int = PER_BLOCK) -> list[Weight]:
    """Every entry of every block's MLP ``W_out`` at least ``z`` standard deviations from its matrix's mean (at most
    ``per_block`` per block, the largest first): the model's super-weight candidates; ``massive``: the massive
    dimensions at P0, marked."""
    check_model(model)
    _mlps(model, "weight_outliers")
    massive = check_dims(model, massive, "weight_outliers")
    if not z > 0:
        raise BadInputError(f"weight_outliers: z={z!r} must be > 0 (standard deviations)")
    if isinstance(per_block, bool) or not isinstance(per_block, int) or per_block < 1:
        raise BadInputError(f"weight_outliers: per_block={per_block!r} must be a whole number >= 1")
    out = []
    with torch.no_grad():
        for block in range(model.cfg.n_layers):
            W = model.blocks[block].mlp.W_out.detach().float()
            mean, std, _ = _stats(W)
            if not std > 0:
                continue  # every entry equal (a block that writes nothing): no outlier
            zs = ((W - mean) / std).abs().flatten()
            top = torch.topk(zs, min(per_block, zs.numel()))
            for score, index in zip(top.values.tolist(), top.indices.tolist()):
                if score >= z:
                    out.append(weight_of(model, block, index // W.shape[1], index % W.shape[1], massive))
    return sorted(out, key=lambda w: -abs(w.z))


@contextmanager
def zeroed(model: Any, weights: Sequence[Weight]) -> Iterator[None]:
    """The ``weights`` set to 0 inside the block, restored on leaving it (whatever happens inside)."""
    saved = [(w, model.blocks[w.block].mlp.W_out[w.neuron, w.dim].clone()) for w in weights]
    try:
        with torch.no_grad():
            for w, _ in saved:
                model.blocks[w.block].mlp.W_out[w.neuron, w.dim] = 0.0
        yield
    finally:
        with torch.no_grad():
            for w, value in saved:
                model.blocks[w.block].mlp.W_out[w.neuron, w.dim] = value


def _measure(model: Any, tokens: Tensor, layer: int, eps: float, names: list[str]) -> Zeroed:
    later = range(layer + 1, model.cfg.n_layers)
    wanted = {hooks.resid_post(layer)} | {hooks.pattern(l) for l in later}
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted)
    ratio = float(norm_ratio(cache[hooks.resid_post(layer)]).mean())
    if len(later):
        alpha = attention_to_position(torch.stack([cache[hooks.pattern(l)] for l in later]).float(), 0)
        attention, rate = float(alpha.mean()), float((alpha > eps).float().mean())
    else:
        attention = rate = None
    return Zeroed(weights=names, norm_ratio=ratio, attention=attention, sink_rate=rate,
                  loss=float(next_token_loss(logits, tokens).mean()))


@entry_point
def super_weights(model: Any, tokens: Tensor, layer: int, neurons: Sequence[str], dims: Sequence[int], *, bos: bool,
                  massive: Sequence[int] = (), eps: float = SINK_EPS) -> SuperWeights:
    """The weights through which ``neurons`` (names such as ``M2.N90@0``) write ``dims``; those at least
    :data:`DIRECT_Z` standard deviations from their matrix's mean (the neuron writes the dimension itself) zeroed
    alone and the strongest together, measured after block ``layer`` and in the blocks after it (the module
    docstring says what); ``massive``: the massive dimensions at P0, marked; ``bos``: the prompts' BOS choice. One
    forward of the batch per zeroing."""
    check_model(model)
    _mlps(model, "super_weights")
    tokens = check_tokens(model, tokens, min_len=2, bos=bos)
    check_block(model, layer, "super_weights")
    dims = check_dims(model, dims, "super_weights")
    massive = check_dims(model, massive, "super_weights")
    if isinstance(neurons, str) or not isinstance(neurons, Sequence):
        raise BadInputError(f"super_weights: neurons={neurons!r:.40} must be a list of neuron names such as ['M2.N90@0']")
    parsed = []
    for name in neurons:
        try:
            node = Node.parse(name) if isinstance(name, str) else None
        except BadInputError:
            node = None
        if node is None or node.kind != Kind.NEURON or node.layer >= model.cfg.n_layers or node.neuron >= model.cfg.d_mlp:
            raise BadInputError(f"super_weights: {name!r:.40} is not a neuron of this model (a name such as "
                                f"'M2.N90@0' with block < {model.cfg.n_layers} and neuron < {model.cfg.d_mlp})")
        if node.layer > layer:
            raise BadInputError(f"super_weights: {name!r} is in block {node.layer}, after block {layer}, where the norm "
                                f"ratio is measured: zeroing its weights cannot change it; ask about neurons of blocks "
                                f"0..{layer}")
        parsed.append(node)
    weights = sorted({(n.layer, n.neuron, d) for n in parsed for d in dims})
    found = sorted((weight_of(model, b, n, d, massive) for b, n, d in weights), key=lambda w: -abs(w.z))
    clean = _measure(model, tokens, layer, eps, [])
    direct = [w for w in found if abs(w.z) >= DIRECT_Z][:ZEROED]
    runs = [[w] for w in direct] + ([direct[:TOGETHER]] if len(direct) > 1 else [])
    out = []
    for group in runs:
        with zeroed(model, group):
            out.append(_measure(model, tokens, layer, eps, [name_of(w) for w in group]))
    said = "; ".join(f"{name_of(w)} = {w.value:+.3g} (rank {w.rank}, z {w.z:+.1f})" for w in direct[:4])
    effects = "; ".join(f"zeroing {' + '.join(z.weights)}: norm ratio {z.norm_ratio:.3g}, attention "
                        f"{'n/a' if z.attention is None else format(z.attention, '.2f')}, loss {z.loss:.2f}" for z in out)
    ordinary = [w for w in found if abs(w.z) < DIRECT_Z]
    if ordinary:
        said += (f"; {len(ordinary)} neuron(s) write it through an ordinary weight (|z| < {DIRECT_Z:g}: they carry it "
                 "through later blocks), not zeroed")
    evidence = (f"{said or 'no weight'}; with the model as it is: norm ratio {clean.norm_ratio:.3g} after block {layer}, "
                f"attention to P0 in the later blocks {'n/a' if clean.attention is None else format(clean.attention, '.2f')}, "
                f"loss {clean.loss:.2f}"
                + (f"; {effects}" if effects else ""))
    return SuperWeights(layer=layer, weights=found, clean=clean, zeroed=out, evidence=evidence)
