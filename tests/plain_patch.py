"""Activation, path and attribution patching written with plain TransformerLens hooks.

An independent check of p0circuit's engine: nothing here imports p0circuit. The corruption is a
shift by one explicit filler token (built by hand), the metric is computed by hand, every patch is
one ordinary ``run_with_hooks`` forward, and a path edge's sender change is read off a real forward
with only that sender patched (``hook_attn_out`` or ``hook_mlp_out``, which TransformerLens takes
after any norm that follows the sublayer), so post-norm blocks need no formula of ours.
"""

import torch

FILLER = 5


def shifted(tokens):
    """The corrupted prompts: one filler token before each clean prompt (clean position p is p + 1)."""
    return torch.cat([torch.full((tokens.shape[0], 1), FILLER, dtype=tokens.dtype), tokens], dim=1)


def norm_ratio(resid, p0):
    """||h_p0|| / mean_{t > p0} ||h_t||, mean over prompts."""
    norms = resid.float().norm(dim=-1)[:, p0:]
    return float((norms[:, 0] / norms[:, 1:].mean(-1)).mean())


def _site(model, node):
    """(hook name, index into axis 2 or None, layer) of a node name like A1.H2@0, M0@rest, M1.N5@0."""
    comp = node.split("@")[0]
    if comp == "PE":
        return "hook_pos_embed", None, -1
    if comp == "E":
        return "hook_embed", None, -1
    if comp.startswith("A"):
        layer, head = comp[1:].split(".H")
        return f"blocks.{layer}.attn.hook_z", int(head), int(layer)
    if ".N" in comp:
        layer, neuron = comp[1:].split(".N")
        return f"blocks.{layer}.mlp.hook_post", int(neuron), int(layer)
    return f"blocks.{comp[1:]}.hook_mlp_out", None, int(comp[1:])


def _positions(node, seq_len):
    pos = node.split("@")[1]
    return list(range(1, seq_len)) if pos == "rest" else [int(pos)]


def logit_gap(logits):
    """The logit metric: last position, token 3 minus token 4, mean over prompts."""
    return float((logits[:, -1, 3] - logits[:, -1, 4]).mean())


def _metric_value(model, tokens, layer, p0, fwd_hooks, dim=None):
    """The norm ratio after block ``layer`` (with ``dim``, that residual dimension at ``p0``, mean
    over prompts), or with ``layer=None`` the logit metric (a full forward through the final norm,
    soft-capping and unembedding). Every forward runs the whole prompt."""
    if layer is None:
        return logit_gap(model.run_with_hooks(tokens, fwd_hooks=fwd_hooks))
    got = {}

    def grab(act, hook):
        got["resid"] = act.detach()

    model.run_with_hooks(tokens, fwd_hooks=fwd_hooks + [(f"blocks.{layer}.hook_resid_post", grab)])
    if dim is not None:
        return float(got["resid"][:, p0, dim].float().mean())
    return norm_ratio(got["resid"], p0)


def _patch_hook(model, cache, node, seq_len, offset=1, at=0):
    """(hook name, hook) that writes the value of ``node`` from ``cache`` (clean position p read at
    p + ``offset``) into a run at p + ``at``: the corrupted value into the clean run, or with
    ``offset=0, at=1`` the clean value into the shifted run."""
    name, index, _ = _site(model, node)
    value = cache[name][:, [p + offset for p in _positions(node, seq_len)]]
    pos = [p + at for p in _positions(node, seq_len)]

    def patch(act, hook, pos=pos, index=index, value=value):
        if index is None:
            act[:, pos] = value
        else:
            act[:, pos, index] = value[:, :, index]
        return act

    return name, patch


def swapped(tokens):
    """The corrupted prompts of a token swap: the first token replaced by the filler, positions kept."""
    out = tokens.clone()
    out[:, 0] = FILLER
    return out


@torch.no_grad()
def activation(model, tokens, nodes, layer, swap=False, dim=None, denoise=False):
    """{node: patched metric at ``layer``}: the corrupted value (shifted, or with ``swap`` the
    first token replaced in place) patched into the clean run; with ``denoise``, the clean value
    patched into the shifted run (where the clean first token sits at 1). ``dim``: the metric is
    that residual dimension at P0 instead of the norm ratio."""
    if denoise:
        _, cache = model.run_with_cache(tokens)
        return {node: _metric_value(model, shifted(tokens), layer, 1,
                                    [_patch_hook(model, cache, node, tokens.shape[1], 0, 1)], dim)
                for node in nodes}
    corrupt, offset = (swapped(tokens), 0) if swap else (shifted(tokens), 1)
    _, cache = model.run_with_cache(corrupt)
    return {node: _metric_value(model, tokens, layer, 0, [_patch_hook(model, cache, node, tokens.shape[1], offset)], dim)
            for node in nodes}


@torch.no_grad()
def activation_together(model, tokens, nodes, layer):
    """The norm ratio at ``layer`` with every node of ``nodes`` patched at once (a faithfulness point)."""
    _, cache = model.run_with_cache(shifted(tokens))
    return _metric_value(model, tokens, layer, 0, [_patch_hook(model, cache, n, tokens.shape[1]) for n in nodes])


def _sender_change(model, tokens, corrupt_cache, src):
    """What the sender's corruption changes in the residual stream at its positions (clean run,
    only the sender patched), read from the sublayer's output hook."""
    name, index, layer = _site(model, src)
    pos = _positions(src, tokens.shape[1])
    out_hook = f"blocks.{layer}.hook_attn_out" if name.endswith("hook_z") else f"blocks.{layer}.hook_mlp_out"
    value = corrupt_cache[name][:, [p + 1 for p in pos]]
    got = {}

    def patch(act, hook):
        if index is None:
            act[:, pos] = value
        else:
            act[:, pos, index] = value[:, :, index]
        return act

    def grab(act, hook):
        got["out"] = act.detach().clone()

    model.run_with_hooks(tokens, fwd_hooks=[(out_hook, grab)])
    clean_out = got["out"]
    model.run_with_hooks(tokens, fwd_hooks=[(name, patch), (out_hook, grab)])
    return pos, (got["out"] - clean_out)[:, pos]


@torch.no_grad()
def path(model, tokens, edges, layer, dim=None):
    """{edge: patched norm ratio}: the sender's change added to one receiver input only (per-head
    q/k/v inputs, the MLP input), in the clean run."""
    _, corrupt_cache = model.run_with_cache(shifted(tokens))
    out = {}
    old = model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    try:
        for edge in edges:
            src, dst = edge.split("->")
            pos, delta = _sender_change(model, tokens, corrupt_cache, src)
            receiver, which = dst.rsplit(".", 1)
            comp, _ = receiver.split("@")
            if which == "mlp_in":
                hook, index = f"blocks.{comp[1:]}.hook_mlp_in", None
            else:
                r_layer, r_head = comp[1:].replace(".KV", ".H").split(".H")
                hook, index = f"blocks.{r_layer}.hook_{which}_input", int(r_head)

            def add(act, hook, pos=pos, delta=delta, index=index):
                if index is None:
                    act[:, pos] += delta
                else:
                    act[:, pos, index] += delta
                return act

            out[edge] = _metric_value(model, tokens, layer, 0, [(hook, add)], dim)
    finally:
        model.set_use_split_qkv_input(old[0])
        model.set_use_hook_mlp_in(old[1])
    return out


def attribution(model, tokens, nodes, layer):
    """{node: clean metric + (corrupted - clean) . d metric / d activation}, by plain autograd."""
    with torch.no_grad():
        _, cache = model.run_with_cache(shifted(tokens))
    acts = {}
    names = {_site(model, n)[0] for n in nodes}

    def keep(act, hook):
        act.retain_grad()
        acts[hook.name] = act

    def leaf(act, hook):
        return act.detach().requires_grad_(True)

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    got = {}

    def grab(act, hook):
        got["resid"] = act

    with torch.enable_grad():
        roots = [(n, leaf) for n in ("hook_embed", "hook_pos_embed") if n in model.hook_dict]
        model.run_with_hooks(tokens, fwd_hooks=roots + [(n, keep) for n in names]
                             + [(f"blocks.{layer}.hook_resid_post", grab)])
        norms = got["resid"].norm(dim=-1)
        value = (norms[:, 0] / norms[:, 1:].mean(-1)).mean()
        value.backward()
    for p, was in frozen:  # the model as it was given
        p.requires_grad_(was)
    out = {}
    for node in nodes:
        name, index, _ = _site(model, node)
        pos = _positions(node, tokens.shape[1])
        diff = cache[name][:, [p + 1 for p in pos]] - acts[name].detach()[:, pos]
        grad = acts[name].grad[:, pos]
        if index is not None:
            diff, grad = diff[:, :, index], grad[:, :, index]
        out[node] = float(value.detach()) + float((diff * grad).sum())
    return out
