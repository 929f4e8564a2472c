"""Every first token: which tokens become the P0 state when they stand at position 0.

Under the causal mask the state at position 0 depends on the token there and nothing else (in a model whose
positions are rotary or absent, on nothing but that token; with a learned position embedding, on that token at
position 0). So the analysis' prompts, however many, sample the P0 state at as many points as they have distinct
first tokens, and a claim "across prompts" is a claim about those few tokens. :func:`first_token_map` runs every
id of the vocabulary as a one-token sequence through the blocks up to the onset (one batched forward, in chunks)
and reads, for each, the P0 state's *norm ratio* (its norm over the mean norm of the reference prompts' other
positions after that block: what the norm ratio of a prompt starting with that token would be with those
positions) and its cosine with the reference prompts' mean P0 direction. The record gives the distribution, the
share of tokens whose state reaches the sink line, and names the tokens that do not, the special tokens and the
reference prompts' own first tokens.
"""

from typing import Any

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.args import above_one, entry_point
from p0circuit.core.defaults import DIRECTION_COS, NORM_THRESHOLD
from p0circuit.core.errors import BadInputError
from p0circuit.studies.findings import TokenPoint, FirstTokens
from p0circuit.measures.spread import share_interval
from p0circuit.measures.positions import token_text
from p0circuit.models.checks import check_block, check_model
from p0circuit.models.tokens import check_tokens, special_ids

QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
"""The quantiles of the distribution over first tokens that the record keeps."""
NAMED = 16
"""Tokens named at most in each list of the record."""
CHUNK_BYTES = 64 * 2**20
"""The largest activation one forward of the map may hold (float32): the one-token sequences per forward are as
many as fit it in the widest layer (the MLP's hidden width, as a rule), so the step's peak memory stays a small
share of the model's whatever its size (Qwen2.5 0.5B: 3449 per forward; 8192 took +1.15 GiB there)."""
ROUND = 1024
"""Tokens drawn per round of a sampled map with a ``margin``: after each round the share's 95% interval is checked.
A share near 0 or 1 settles in one round (at 0 or 1 of 1,024 the Wilson interval's half-width is about 0.002); a
share near a half needs about 38,000 draws for a margin of 0.005, and rounds of 1,024 stop within 1,024 of that
(rounds of 4,096 before 2026-12-05: the same rule, up to 3,072 more draws past it)."""


def chunk_rows(model: Any) -> int:
    """One-token sequences per forward of the map (:data:`CHUNK_BYTES`), at least 256."""
    cfg = model.cfg
    widest = max(int(cfg.d_model), int(cfg.d_mlp or 0), int(cfg.n_heads) * int(cfg.d_head))
    return max(256, CHUNK_BYTES // (4 * widest))


@entry_point
def first_token_map(model: Any, reference: Tensor, layer: int, *, threshold: float = NORM_THRESHOLD,
                    cos: float = DIRECTION_COS, most: int = 0, seed: int = 0, margin: float = 0.0) -> FirstTokens:
    """Every vocabulary id as a one-token sequence up to block ``layer``: its P0 state's norm ratio and direction
    against the ``reference`` prompts (no BOS: their first tokens are text), as the module docstring says. ``most``
    (> 0): a vocabulary larger than that is sampled: ``most`` ids drawn with ``seed``, the special tokens and the
    reference prompts' first tokens always among them (the record says so). ``margin`` (> 0, a sampled map only):
    the ids are drawn in rounds of :data:`ROUND` (a prefix of the same seeded order, so a longer draw holds a
    shorter one), and the drawing stops once the 95% Wilson interval of the share that reaches ``threshold`` is at
    most ``margin`` (its half-width; the Wilson interval is not symmetric about the share), or at ``most``. A share near 0 or 1 is then settled in one round; a share near a
    half takes about ``(1.96 / 2 / margin)^2`` draws. Stopping on the interval's width makes its coverage a little
    less exact than a fixed draw's (the width depends on the share drawn)."""
    check_model(model)
    reference = check_tokens(model, reference, min_len=2, bos=False, what="reference")
    check_block(model, layer, "first_token_map")
    above_one("first_token_map", "threshold", threshold)
    if not 0 < cos <= 1:
        raise BadInputError(f"first_token_map: cos={cos!r} must lie in (0, 1]")
    if isinstance(most, bool) or not isinstance(most, int) or most < 0:
        raise BadInputError(f"first_token_map: most={most!r} must be a whole number >= 0 (0: every token)")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 0.5:
        raise BadInputError(f"first_token_map: margin={margin!r:.40} must be a number in [0, 0.5): the half-width of the "
                            "share's 95% interval at which a sampled map stops drawing (0: draw all `most`)")
    name = hooks.resid_post(layer)
    with torch.no_grad():
        _, cache = model.run_with_cache(reference, names_filter=lambda n: n == name, stop_at_layer=layer + 1)
        h = cache[name].float()
        ordinary = float(h[:, 1:].norm(dim=-1).mean())
        direction = torch.nn.functional.normalize(torch.nn.functional.normalize(h[:, 0], dim=-1).mean(0), dim=0)
        full = int(model.cfg.d_vocab)
        firsts = list(dict.fromkeys(int(t) for t in reference[:, 0].tolist()))
        sampled = bool(most) and full > most
        order = (torch.randperm(full, generator=torch.Generator().manual_seed(seed))[:most] if sampled
                 else torch.arange(full))
        forced = torch.tensor(special_ids(model) + firsts, dtype=torch.long) if sampled else order[:0]
        all_norms, all_cosines = torch.full((full,), float("nan")), torch.full((full,), float("nan"))
        rows = chunk_rows(model)
        step = ROUND if sampled and margin else len(order)
        drawn, interval, rounds = order, None, 0
        while True:  # a round: the next ``step`` draws (and the always-measured tokens, once)
            drawn = order[:min(len(order), (rounds + 1) * step)]
            rounds += 1
            every = torch.unique(torch.cat([drawn, forced])) if sampled else drawn
            todo = every[all_norms[every].isnan()]
            for start in range(0, len(todo), rows):
                ids = todo[start:start + rows]
                _, c = model.run_with_cache(ids.to(reference.device)[:, None], names_filter=lambda n: n == name,
                                            stop_at_layer=layer + 1)
                state = c[name][:, 0].float()
                all_norms[ids] = state.norm(dim=-1).cpu()
                all_cosines[ids] = (torch.nn.functional.normalize(state, dim=-1) @ direction).cpu()
            if sampled:  # the share's interval over the random draws only (the always-measured ones are no sample)
                hits = int((all_norms[drawn] / ordinary >= threshold).sum())
                interval = share_interval(hits, len(drawn))
            if len(drawn) == len(order) or (interval[1] - interval[0]) / 2 <= margin:
                break
        vocab = len(every)
        norms, cosines = all_norms[every], all_cosines[every]
    ratios = norms / ordinary
    where = {int(t): i for i, t in enumerate(every.tolist())}
    order = torch.argsort(ratios)
    rank = torch.empty(vocab)
    rank[order] = torch.arange(vocab, dtype=torch.float32) / vocab
    text = token_text(model)

    def point(i: int) -> TokenPoint:  # i: a position in ``every``
        t = int(every[i])
        return TokenPoint(id=t, text=text(t), ratio=float(ratios[i]), cosine=float(cosines[i]), below=float(rank[i]))

    q = torch.tensor(QUANTILES)
    below = ratios < threshold
    if interval is not None:
        drawn_share = hits / len(drawn)
        interval = [round(v, 6) for v in interval]
    record = dict(
        layer=layer, vocab=vocab, of=full, reference=f"{reference.shape[0]} prompts x {reference.shape[1]} tokens (no BOS): "
        "the ratio's denominator is their ordinary positions' mean norm, the direction their P0 states' mean direction",
        threshold=threshold, cos=cos, quantiles={f"{x:g}": float(v) for x, v in zip(QUANTILES, ratios.quantile(q))},
        cos_quantiles={f"{x:g}": float(v) for x, v in zip(QUANTILES, cosines.quantile(q))},
        sinks=float((~below).float().mean()), sinks_interval=interval, aligned=float((cosines >= cos).float().mean()),
        not_sinks=int(below.sum()), lowest=[point(int(i)) for i in order[:NAMED]],
        special=[point(where[i]) for i in special_ids(model)][:NAMED], prompts=[point(where[i]) for i in firsts][:NAMED])
    low = record["lowest"]
    record["evidence"] = (
        (f"every one of the {vocab} vocabulary tokens" if vocab == full else
         f"{vocab} of the {full} vocabulary tokens (drawn with seed {seed}, the special tokens and the prompts' first "
         "tokens among them)") + f" as a one-token prompt: after block {layer} its P0 state's norm ratio "
        f"(over the reference prompts' ordinary positions) has median {record['quantiles']['0.5']:.3g}, 1% quantile "
        f"{record['quantiles']['0.01']:.3g}, minimum {record['quantiles']['0']:.3g}; {record['sinks']:.1%} of the "
        f"first tokens measured" + (f" (of the {len(drawn)} drawn at random {drawn_share:.1%}, 95% Wilson interval "
                                    f"{interval[0]:.2%}-{interval[1]:.2%}, binomial: a little wide for a draw without "
                                    "replacement" + (f"; drawn in rounds of {ROUND} until the interval's half-width was at "
                                                     f"most {margin:.2%}, or {most} were drawn; the quantiles and the "
                                                     "lowest tokens are the measured tokens'" if margin and most > ROUND
                                                     else "")
                                    + ")" if interval else "")
        + f" reach the onset line ({threshold:g}, a norm ratio) and {record['aligned']:.1%} point within a cosine of {cos:g} of the "
        f"prompts' P0 direction; {record['not_sinks']} {'does' if record['not_sinks'] == 1 else 'do'} not become sink states"
        + (f" (the lowest: {', '.join(f'{p.text!r} {p.ratio:.2f}' for p in low[:5])})" if record["not_sinks"] else ""))
    return FirstTokens(**record)
