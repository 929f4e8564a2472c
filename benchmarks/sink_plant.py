"""A P0 sink planted into a random-weight Llama-shaped ``HookedTransformer``, so that an analysis of a
1B-class checkpoint has an onset to patch (random weights have none: their P0 norm ratio stays near 1.2).

The mechanism is the one the paper describes, written into the weights of block 0 and block ``onset``
(and one embedding coordinate), each weight a Llama weight (no biases):

* a *bias coordinate* ``j``: every token's embedding gets ``B`` there, a constant every later
  threshold is a ratio to (a norm rescales both alike). The planted coordinates are written by the
  plant alone (the random weights that wrote them are set to zero);
* *identification*, block 0's attention: in ``n_kv`` key/value groups one query head has zero
  query weights, so it attends uniformly over the prefix; its value reads 64 random orthonormal
  directions of the residual stream and its output writes them into 64 coordinates ``Z`` of its own.
  At position t the head writes the mean of t + 1 values: ``|Z_t|^2`` is about ``|Z_0|^2 / (t + 1)``,
  and only position 0 keeps a whole value (the values of different tokens are nearly orthogonal);
* *detection*, block 0's MLP: pairs of SiLU-gated neurons, ``silu(Gz) z + silu(-Gz)(-z) = G z^2``
  exactly, sum the squares of the ``Z`` coordinates and subtract ``theta`` times the square of the
  bias coordinate into a detector coordinate ``k`` (scaled to half the residual stream's norm):
  positive at position 0, negative after it; the blocks in between carry it on;
* *amplification*, block ``onset``'s MLP: two neurons, ``(silu(G2 x_k + c x_j) - silu(G2 x_k)) x_j``, a
  step that is about ``c x_j^2`` where the detector is positive and 0 where it is negative, write a
  massive value into coordinate ``m``: the P0 norm onset is at block ``onset``.

The values are read from the token embeddings alone (block 0), which random weights make nearly
orthogonal; a later block's input carries a prefix mixture that a uniform average cannot tell from
position 0. ``theta``, the detector's scale, the amplifier's gain and the massive value are calibrated
on probe prompts, as the planted
toy models of ``p0circuit.models.planted`` are. The analysis of such a model is a timing benchmark of
the analysis' steps at the model's size, not a finding about a trained model.
"""

import torch

import p0circuit as p0
from p0circuit.core import hooks


def plant_sink(model, onset: int, n_kv: int = 4, ratio: float = 20.0, seed: int = 0) -> dict:
    """Plant the sink (module docstring) into ``model`` in place, its amplifier in block ``onset``; returns
    the coordinates, the calibrated constants and the P0 norm ratio after that block on probe prompts."""
    a = 0  # identification and detection in block 0
    cfg = model.cfg
    d, dh, heads, kvs = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_key_value_heads
    group, n_kv = heads // kvs, min(n_kv, kvs)
    gen = torch.Generator().manual_seed(seed)
    j, k, m = 0, 1, 2
    Z = torch.arange(3, 3 + n_kv * dh)
    free = torch.arange(3 + n_kv * dh, d)
    probe = p0.probe_tokens(model, 16, 24, seed=seed)
    with torch.no_grad():
        rms = model(probe, stop_at_layer=0).norm(dim=-1).median() / d ** 0.5  # the embedding's scale
        planted = torch.cat([torch.tensor([j, k, m]), Z])
        model.W_E[:, planted] = 0.0  # the planted coordinates are written by the plant alone
        for b in model.blocks:
            b.attn.W_O[:, :, planted] = 0.0
            b.mlp.W_out[:, planted] = 0.0
        model.W_E[:, j] = 2.0 * rms * d ** 0.5  # the bias coordinate: as large as the rest of the embedding, twice
        block, nxt = model.blocks[a], model.blocks[onset]
        read = torch.linalg.qr(torch.randn(len(free), n_kv * dh, generator=gen))[0]  # orthonormal columns
        for g in range(n_kv):  # one head per key/value group averages that group's planted values
            h = g * group
            block.attn.W_Q[h] = 0.0
            block.attn._W_V[g] = 0.0
            block.attn._W_V[g][free] = read[:, g * dh:(g + 1) * dh] * (d / len(free)) ** 0.5
            for other in range(h, h + group):
                block.attn.W_O[other] = 0.0
            block.attn.W_O[h][torch.arange(dh), Z[g * dh:(g + 1) * dh]] = 1.0
        # the detector: 2 |Z| + 2 neurons, the rest of block a's MLP untouched
        n = 2 * len(Z) + 2
        cols = torch.arange(cfg.d_mlp - n, cfg.d_mlp)
        for W in (block.mlp.W_gate, block.mlp.W_in):
            W[:, cols] = 0.0
        block.mlp.W_out[cols] = 0.0
        for i, z in enumerate(Z.tolist()):
            for s, c in ((1.0, cols[2 * i]), (-1.0, cols[2 * i + 1])):
                block.mlp.W_gate[z, c], block.mlp.W_in[z, c] = s, s
                block.mlp.W_out[c, k] = 1.0
        # |Z|^2 at the detector's input, against the bias coordinate's square: theta between P0 and the rest
        _, cache = model.run_with_cache(probe, names_filter=hooks.resid_mid(a), stop_at_layer=a + 1)
        x = cache[hooks.resid_mid(a)]
        share = (x[..., Z] ** 2).sum(-1) / x[..., j] ** 2
        low, high = float(share[:, 0].min()), float(share[:, 1:].max())
        theta = (low * high) ** 0.5
        for s, c in ((1.0, cols[-2]), (-1.0, cols[-1])):
            block.mlp.W_gate[j, c], block.mlp.W_in[j, c] = s, -s * theta
            block.mlp.W_out[c, k] = 1.0
        # the detector's output scaled to half the residual stream's norm after the rest of the prompt
        _, cache = model.run_with_cache(probe, names_filter=hooks.resid_post(a), stop_at_layer=a + 1)
        x = cache[hooks.resid_post(a)]
        rest = x[:, 1:]
        scale = 0.5 * float((rest.norm(dim=-1) ** 2 - rest[..., k] ** 2).clamp(min=0).sqrt().median()) / float(
            rest[..., k].abs().median())
        block.mlp.W_out[cols, k] *= scale
        # the amplifier: two neurons of block ``onset``'s MLP, a step (silu(g x_k + c x_j) - silu(g x_k)) x_j that
        # is about c x_j^2 where the detector is positive and 0 where it is negative
        up, down = cfg.d_mlp - 1, cfg.d_mlp - 2
        for c in (up, down):
            nxt.mlp.W_gate[:, c], nxt.mlp.W_in[:, c], nxt.mlp.W_out[c] = 0.0, 0.0, 0.0
        _, cache = model.run_with_cache(probe, names_filter=[hooks.resid_mid(onset)], stop_at_layer=onset + 1)
        x = cache[hooks.resid_mid(onset)]
        normed = x / x.norm(dim=-1, keepdim=True) * d ** 0.5
        xj, xk = float(normed[..., j].median()), normed[..., k]
        step = 10.0 / xj  # c: the step's gate offset is 10
        gain = 20.0 / float(xk[:, 0].min())  # the smallest detector at P0 still 20 past the step
        nxt.mlp.W_gate[k, up], nxt.mlp.W_gate[j, up], nxt.mlp.W_in[j, up] = gain, step, 1.0
        nxt.mlp.W_gate[k, down], nxt.mlp.W_in[j, down] = gain, -1.0
        _, cache = model.run_with_cache(probe, names_filter=[hooks.resid_post(onset)], stop_at_layer=onset + 1)
        h = cache[hooks.resid_post(onset)]
        others = float(h[:, 1:].norm(dim=-1).mean())
        height = 10.0 * xj  # the step's height: c x_j^2
        nxt.mlp.W_out[up, m] = nxt.mlp.W_out[down, m] = ratio * others / height
        _, cache = model.run_with_cache(probe, names_filter=[hooks.resid_post(onset)], stop_at_layer=onset + 1)
        norms = cache[hooks.resid_post(onset)].norm(dim=-1)
        per_prompt = norms[:, 0] / norms[:, 1:].mean(1)
    return {"bias": j, "detector": k, "massive": m, "Z": (int(Z[0]), int(Z[-1])), "theta": theta,
            "separation": (low, high), "gain": gain, "onset": onset, "min_ratio": float(per_prompt.min()),
            "median_ratio": float(per_prompt.median())}

