"""The sink studies' numbers computed again with plain hooks, sharing no code with p0circuit.

Nothing here imports p0circuit. Each study is re-implemented from its definition in the docs (the docstrings of
``p0circuit/studies/experiments/``): an edit of the residual stream at position 0 after a block is one forward
hook that returns the edited tensor; self-only attention is a hook on the attention pattern that returns the
identity; a zeroed weight is a deep copy of the model with that entry set to 0; the first-token map is one forward
per token id. Two runners: TransformerLens's ``HookedTransformer`` (``tl_*``, hook names spelled here) and
transformers' own ``AutoModelForCausalLM`` modules with ``output_attentions`` (``hf_*``, plain
``register_forward_hook`` on a decoder layer).
"""

import copy

import torch


def alpha0(patterns):
    """alpha_0 per [prompt, layer, head]: the mean over the queries t >= 0 of the attention to key 0 (Gu et al.)."""
    return torch.stack([p[:, :, :, 0].float().mean(-1) for p in patterns], dim=1)


def loss(logits, tokens):
    """Mean next-token cross-entropy per prompt."""
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    return -logp.gather(-1, tokens[:, 1:, None])[..., 0].mean(-1)


def edit_of(name, h, dims=(), seed=0):
    """The new position-0 state of each edit (its definition), from the block output ``h`` [batch, pos, d]."""
    h0, rest = h[:, 0], h[:, 1:]
    if name == "rescaled":
        return h0 / h0.norm(dim=-1, keepdim=True) * rest.norm(dim=-1).mean(1, keepdim=True)
    if name == "massive_removed":
        out = h0.clone()
        for d in dims:
            out[:, d] = rest[:, :, d].mean(1)
        return out
    if name == "direction_replaced":
        m = rest.mean(1)
        return m / m.norm(dim=-1, keepdim=True) * h0.norm(dim=-1, keepdim=True)
    if name == "state_replaced":
        return rest.mean(1)
    raise ValueError(name)


def tl_edited(model, tokens, layer, new_h0):
    """(logits, alpha_0 [prompt, later block, head]) with the position-0 state after ``layer`` set by ``new_h0(h)``."""
    later = range(layer + 1, model.cfg.n_layers)
    patterns = {}

    def edit(act, hook):
        act = act.clone()
        act[:, 0] = new_h0(act)
        return act

    def keep(act, hook):
        patterns[hook.name] = act

    hooks_ = [(f"blocks.{layer}.hook_resid_post", edit)] + [(f"blocks.{l}.attn.hook_pattern", keep) for l in later]
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks_)
    return logits, alpha0([patterns[f"blocks.{l}.attn.hook_pattern"] for l in later])


def tl_diagonal(model, tokens, layer, upto):
    """Block ``layer``'s output with self-only attention in blocks ``0..upto``."""
    out = {}

    def eye(act, hook):
        return torch.eye(act.shape[-1], dtype=act.dtype).expand_as(act).clone()

    def keep(act, hook):
        out["h"] = act

    hooks_ = [(f"blocks.{l}.attn.hook_pattern", eye) for l in range(upto + 1)]
    hooks_.append((f"blocks.{layer}.hook_resid_post", keep))
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks_)
    return out["h"]


def tl_without_weight(model, tokens, layer, block, neuron, dim):
    """(P0 norm ratio after ``layer``, logits) of a copy of the model whose ``W_out[neuron, dim]`` of ``block`` is 0."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.blocks[block].mlp.W_out[neuron, dim] = 0.0
    out = {}

    def keep(act, hook):
        out["h"] = act

    with torch.no_grad():
        logits = twin.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_resid_post", keep)])
    norms = out["h"].float().norm(dim=-1)
    return float((norms[:, 0] / norms[:, 1:].mean(1)).mean()), logits


def tl_state(model, token, layer):
    """The position-0 state after ``layer`` of the one-token prompt ``token``."""
    out = {}

    def keep(act, hook):
        out["h"] = act

    with torch.no_grad():
        model.run_with_hooks(torch.tensor([[token]]), fwd_hooks=[(f"blocks.{layer}.hook_resid_post", keep)])
    return out["h"][0, 0].float()


def hf_edited(hf_model, tokens, layer, new_h0):
    """transformers' own modules: (logits, alpha_0 [prompt, later block, head]) with the output of decoder layer
    ``layer`` edited at position 0 by ``new_h0(h)`` (a forward hook on that layer's module)."""
    layers = hf_model.model.layers

    def edit(module, args, output):
        h = output[0] if isinstance(output, tuple) else output
        h = h.clone()
        h[:, 0] = new_h0(h)
        return (h,) + tuple(output[1:]) if isinstance(output, tuple) else h

    handle = layers[layer].register_forward_hook(edit)
    try:
        with torch.no_grad():
            out = hf_model(tokens, output_attentions=True)
    finally:
        handle.remove()
    return out.logits, alpha0(list(out.attentions[layer + 1:]))
