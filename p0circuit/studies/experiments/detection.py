"""Detection tested where the paper puts it: does position 0 stand out because its attention is undiluted?

Peng et al. (2026) say the first blocks' attention *identifies* position 0: under the causal mask it can
attend only to itself, so its attention output is one undiluted value vector, while every later position
averages many. If that is the mechanism, taking the dilution away should make every position look like
position 0. :func:`diagonal_attention` forces self-only (diagonal) attention at every position in blocks
``0..k``, for each ``k`` up to the onset, lets the later blocks run as they are, and measures how close the
other positions come to the clean P0 state after the onset: their norm as a share of P0's (``norm_share``) and
their cosine with it. Position 0 itself attends only to itself anyway, so its state does not change.

A mechanism that reads the dilution (the planted cone-model head, and, if the paper is right, layer-0
attention in real models) makes the other positions P0-like from the block where it sits; one that reads
something else (a learned position embedding, a BOS token) leaves them as they are at every ``k``.
"""

from functools import partial
from typing import Any

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.args import entry_point
from p0circuit.core.defaults import DIRECTION_COS, KEEPS
from p0circuit.core.errors import BadInputError
from p0circuit.studies.findings import Detection
from p0circuit.models.checks import check_block, check_model
from p0circuit.models.tokens import check_tokens


def _identity(pattern: Tensor, hook: Any, rows: slice) -> Tensor:
    """Self-only attention for the batch rows ``rows`` (the pattern is ``[batch, head, query, key]``)."""
    pattern = pattern.clone()
    eye = torch.eye(pattern.shape[-1], dtype=pattern.dtype, device=pattern.device)
    pattern[rows] = eye.expand_as(pattern[rows])
    return pattern


@entry_point
def diagonal_attention(model: Any, tokens: Tensor, layer: int, *, bos: bool, keep: float = KEEPS,
                       cos: float = DIRECTION_COS) -> Detection:
    """Force self-only attention in blocks ``0..k`` for each ``k`` in ``0..layer`` and compare the other positions
    with the clean P0 state after block ``layer`` (the module docstring says why). ``bos``: the prompts' BOS choice;
    ``keep``, ``cos``: the lines of :attr:`Detection.first`. One forward up to ``layer`` of ``layer + 2`` copies of
    the prompts.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> d = p0.diagonal_attention(pm.model, tokens, 1, bos=False)
        >>> d.upto, [round(s, 2) for s in d.norm_share]
        ([0, 1], [0.99, 1.0])
    """
    check_model(model)
    tokens = check_tokens(model, tokens, min_len=2, bos=bos)
    check_block(model, layer, "diagonal_attention")
    for name, value in (("keep", keep), ("cos", cos)):
        if not 0 < value <= 1:
            raise BadInputError(f"diagonal_attention: {name}={value!r} must lie in (0, 1] (a share of P0's norm, a "
                                "cosine)")
    batch = tokens.shape[0]
    fwd = []
    for block in range(layer + 1):  # variant k (rows (k + 1) * batch ...) forces blocks 0..k: block j from variant j on
        fwd.append((hooks.pattern(block), partial(_identity, rows=slice((block + 1) * batch, None))))
    name = hooks.resid_post(layer)
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        _, cache = model.run_with_cache(tokens.repeat(layer + 2, 1), names_filter=lambda n: n == name,
                                        stop_at_layer=layer + 1)
    h = cache[name].float().reshape(layer + 2, batch, tokens.shape[1], -1)  # (variant, B, T, d)
    p0 = h[0, :, 0]  # (B, d): the clean P0 state
    share = h[:, :, 1:].norm(dim=-1) / p0.norm(dim=-1)[None, :, None]  # (variant, B, T-1)
    cosine = torch.nn.functional.cosine_similarity(h[:, :, 1:], p0[None, :, None], dim=-1)
    by_prompt = share.mean(-1)  # (variant, B)
    forced = list(range(layer + 1))
    norm_share = [float(by_prompt[k + 1].mean()) for k in forced]
    cosines = [float(cosine[k + 1].mean()) for k in forced]
    first = next((k for k in forced if norm_share[k] >= keep and cosines[k] >= cos), None)
    said = "; ".join(f"blocks 0-{k}: {norm_share[k]:.2f} of its norm, cosine {cosines[k]:.3f}" for k in forced)
    evidence = (f"with self-only attention at every position, the other positions after block {layer} reach, of the "
                f"clean P0 state: {said} (with the attention as it is: {float(by_prompt[0].mean()):.2f}, cosine "
                f"{float(cosine[0].mean()):.3f}); " + (
                    f"from blocks 0-{first} on they reach {keep:g} of its norm and a cosine of {cos:g}: undiluted "
                    "attention is enough to make a position look like position 0" if first is not None else
                    f"no k up to the onset reaches {keep:g} of its norm with a cosine of {cos:g}: the state is not made "
                    "by undiluted attention alone"))
    return Detection(layer=layer, upto=forced, norm_share=norm_share,
                     norm_share_min=[float(by_prompt[k + 1].min()) for k in forced], cosine=cosines,
                     clean_norm_share=float(by_prompt[0].mean()), clean_cosine=float(cosine[0].mean()), first=first,
                     keep=keep, cos=cos, evidence=evidence)

