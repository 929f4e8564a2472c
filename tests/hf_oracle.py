"""A second oracle: every patch written on transformers' own modules with plain PyTorch hooks.

``tests/oracle.py`` re-implements p0circuit's patches with TransformerLens hooks, so it shares
TransformerLens' weight conversion and the meaning of its hook points with the engine: a hook whose
reading is right but whose *writing* means something else (a head's slice that is not that head's,
a ``hook_k_input`` that also feeds the queries, a ``hook_mlp_out`` before or after the wrong norm)
would agree with itself. This oracle patches the ``AutoModelForCausalLM`` model transformers itself
builds from the same checkpoint, with ``register_forward_hook`` / ``register_forward_pre_hook`` on
its ``nn.Module``\\ s. It imports neither transformer_lens nor p0circuit; from ``tests/oracle.py`` it
takes only definitions that touch no model: the corruptions (:class:`Corr`), the metrics' formulas
(:class:`Metric`) and the parsing of node and edge names. Every number comes from a forward of whole
prompts from the tokens (stopped, by an exception from the reading hook, once the value it is run
for has been read); a module's own hooks are bypassed by calling ``module.forward`` where a value is
recomputed.

What each name is, on transformers' modules (one decoder layer's pieces as in :data:`LAYOUTS`):

* a head ``A1.H2@0``: its columns ``h*d_head:(h+1)*d_head`` of the output projection's INPUT (the
  merged heads: ``o_proj``, GPT-2's ``attn.c_proj``, GPT-NeoX's ``attention.dense``), set by a
  forward pre-hook on that projection;
* an MLP ``M1@rest``: the MLP module's output (for a mixture of experts, the whole sparse block's).
  Gemma 3 and OLMo 2 put a norm after the MLP (``post_feedforward_layernorm``), and TransformerLens'
  ``hook_mlp_out`` sits after it (it is what is added to the residual). The patch here sets the MLP
  module's output, before that norm: the norm is a function of each position's MLP output alone,
  so putting in the other run's MLP output gives exactly the other run's normed output, and a set
  patch means the same at either point; doing it at the other point than TransformerLens is part of
  the check. (An ablation's mean or a delta would differ between the two points; ablations are not
  written here, and deltas are read at the residual: below.)
* a neuron ``M1.N5@0``: its column of the MLP's down projection's input (``down_proj``, GPT-2's
  ``mlp.c_proj``, GPT-NeoX's ``dense_4h_to_h``);
* ``E@0``: the token embedding module's output (Gemma 3's scaled embedding module includes its
  ``sqrt(d_model)``); ``PE@0``: GPT-2's position embedding module ``wpe``'s output;
* a path edge's sender change: a forward of the base run with only the sender patched, minus one
  without, read where the sender's output enters the residual stream: the attention module's output
  (Gemma 3, OLMo 2: the output of the norm after it, ``post_attention_layernorm``) for a head, the
  MLP's (Gemma 3, OLMo 2: ``post_feedforward_layernorm``'s) for an MLP or a neuron, block 0's input
  for an embedding;
* ``S->M2@0.mlp_in``: that change added to the input of the MLP branch alone: the input of the norm
  before the MLP (``post_attention_layernorm``, Gemma 3's ``pre_feedforward_layernorm``, GPT-2's
  ``ln_2``; OLMo 2 has none: the MLP's own input), so the residual stream itself is unchanged;
* ``S->A2.H1@0.q`` / ``.k`` / ``.v`` (``A2.KV0@0.k`` under grouped-query attention): the residual
  feeding attention is kept (a pre-hook on the norm before attention; OLMo 2 has none: the
  projection's own input), the projection recomputed from ``norm(residual + change)`` (its
  ``forward``, no hooks), and only that head's columns of the projection's OUTPUT replaced, so the
  other heads and the other two of q, k, v see the unpatched residual. Separate projections
  (``q_proj``, ``k_proj``, ``v_proj``): head ``h``'s columns ``h*d_head:(h+1)*d_head``. GPT-2's fused
  ``c_attn`` (Conv1D, output ``q | k | v`` each ``d_model`` wide): ``which*d_model + h*d_head``.
  GPT-NeoX's fused ``query_key_value`` (output viewed as ``[head, (q k v), d_head]``):
  ``(3h + which)*d_head``. Norms after the projections (Gemma 3's per-head q/k norms; OLMo 2's and
  OLMoE's over the whole projection, all heads at once) then run as transformers runs them;
* ``S->R2@0.resid``: the change added to block 2's output.

Families (:data:`LAYOUTS`, keyed by ``config.model_type``): Llama, Qwen 2, Mixtral and OLMoE (one
layout), Gemma 3, OLMo 2, GPT-2, GPT-NeoX (Pythia; its parallel residual needs nothing: the MLP's
norm reads the block input). Another family raises ``KeyError`` naming these.

Not written here (each raises ``NotImplementedError`` saying so): an expert ``M1.E3@0`` (transformers
keeps a sparse block's experts as one fused module, ``experts``, whose weights are stacked tensors
and whose routing runs inside its forward: no module is one expert, so no hook reaches one without
re-implementing the routing); the ablations ``pos_mean`` and ``zero`` (their value depends on where
the node is read, which is TransformerLens' choice to mirror, not a write to check); the metrics
``attn_to_p0`` and ``cache`` (TransformerLens hook names). Metrics here: ``norm_ratio`` and
``resid_dim`` on block ``layer``'s output (the decoder layer module's output, not transformers'
``hidden_states``, whose last entry is after the final norm) and ``logits``.
"""

from dataclasses import dataclass, replace
from typing import Optional

import torch

from oracle import Corr, Metric, _component, named_of, positions  # pure: no model is touched there

__all__ = ["Corr", "Metric", "LAYOUTS", "HF", "activation", "path", "measure"]


@dataclass(frozen=True)
class Layout:
    """Where a family keeps its pieces: model-level attribute paths (``layers``, ``embed``,
    ``pos_embed``) and paths inside one decoder layer."""

    layers: str
    embed: str
    attn_in: Optional[str]  # the norm whose input is the residual feeding q, k, v (None: the projections read it)
    qkv: tuple  # the q, k, v projections (one fused module three times)
    out_proj: str  # its input: the heads' outputs, merged
    attn_out: str  # its output: what attention adds to the residual
    mlp: str
    mlp_in: str  # its input: the residual feeding the MLP branch (the pre-norm, else the MLP)
    mlp_out: str  # its output: what the MLP adds to the residual
    down: Optional[str]  # its input: the MLP's neurons (None: experts)
    pos_embed: Optional[str] = None
    fused: Optional[str] = None  # "blocks": q | k | v (GPT-2); "heads": per head q, k, v (GPT-NeoX)


LLAMA = Layout(layers="model.layers", embed="model.embed_tokens", attn_in="input_layernorm",
               qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), out_proj="self_attn.o_proj",
               attn_out="self_attn", mlp="mlp", mlp_in="post_attention_layernorm", mlp_out="mlp", down="mlp.down_proj")
LAYOUTS = {
    "llama": LLAMA, "qwen2": LLAMA, "mixtral": replace(LLAMA, down=None), "olmoe": replace(LLAMA, down=None),
    "gemma3_text": replace(LLAMA, attn_out="post_attention_layernorm", mlp_in="pre_feedforward_layernorm",
                           mlp_out="post_feedforward_layernorm"),
    "olmo2": replace(LLAMA, attn_in=None, attn_out="post_attention_layernorm", mlp_in="mlp",
                     mlp_out="post_feedforward_layernorm"),
    "gpt2": Layout(layers="transformer.h", embed="transformer.wte", pos_embed="transformer.wpe", attn_in="ln_1",
                   qkv=("attn.c_attn",) * 3, out_proj="attn.c_proj", attn_out="attn", mlp="mlp", mlp_in="ln_2",
                   mlp_out="mlp", down="mlp.c_proj", fused="blocks"),
    "gpt_neox": Layout(layers="gpt_neox.layers", embed="gpt_neox.embed_in", attn_in="input_layernorm",
                       qkv=("attention.query_key_value",) * 3, out_proj="attention.dense", attn_out="attention",
                       mlp="mlp", mlp_in="post_attention_layernorm", mlp_out="mlp", down="mlp.dense_4h_to_h",
                       fused="heads"),
}


class HF:
    """A transformers causal LM with its family's layout and sizes."""

    def __init__(self, model):
        self.model = model.eval()
        cfg = model.config
        if cfg.model_type not in LAYOUTS:
            raise KeyError(f"no layout for {cfg.model_type!r}; written for {sorted(LAYOUTS)}")
        self.layout = LAYOUTS[cfg.model_type]
        self.d_model = cfg.hidden_size
        self.d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def at(self, layer: int, path: str) -> torch.nn.Module:
        return self.model.get_submodule(f"{self.layout.layers}.{layer}.{path}")


def head_cols(index: int, d_head: int) -> slice:
    """A head's columns of the merged heads (the output projection's input)."""
    return slice(index * d_head, (index + 1) * d_head)


def qkv_cols(hf: HF, which: str, index: int) -> slice:
    """Head (or key/value head) ``index``'s columns of the ``which`` projection's output."""
    k = "qkv".index(which)
    if hf.layout.fused == "blocks":
        start = k * hf.d_model + index * hf.d_head
    elif hf.layout.fused == "heads":
        start = (3 * index + k) * hf.d_head
    else:
        start = index * hf.d_head
    return slice(start, start + hf.d_head)


# ---------------------------------------------------------------------------------------------- hooks
# A hook is (module, "in" | "out", fn): fn gets the module's first input (before it runs) or its first
# output (after), and returns a replacement or None.
def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _register(module, side, fn):
    if side == "in":
        def pre(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            new = fn(x)
            if new is None:
                return None
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
        return module.register_forward_pre_hook(pre, with_kwargs=True)

    def post(m, args, out):
        new = fn(_first(out))
        if new is None:
            return None
        return (new, *out[1:]) if isinstance(out, tuple) else new
    return module.register_forward_hook(post)


class _Read(Exception):
    """Raised by the hook that reads the last value a forward is run for: what follows is not needed."""


@torch.no_grad()
def forward(hf: HF, tokens, hooks=()):
    """The logits of one forward of ``tokens`` with ``hooks`` registered for it (None when a hook
    ended it once its value was read)."""
    handles = [_register(*h) for h in hooks]
    try:
        return hf.model(input_ids=tokens, use_cache=False).logits
    except _Read:
        return None
    finally:
        for h in handles:
            h.remove()


def _reader(got: list):
    def read(x):
        got.append(x.detach().clone())
        raise _Read
    return read


def capture(hf: HF, tokens, module, side, hooks=()):
    """The value at ``(module, side)`` in a forward of ``tokens`` with ``hooks`` (registered first)."""
    got = []
    forward(hf, tokens, list(hooks) + [(module, side, _reader(got))])
    return got[0]


def measure(hf: HF, tokens, metric: Metric, p0: int, hooks=()) -> float:
    """``metric`` at ``p0`` on a forward of ``tokens`` with ``hooks``."""
    if metric.kind == "logits":
        return metric.value({}, forward(hf, tokens, hooks), p0)
    if metric.kind not in ("norm_ratio", "resid_dim"):
        raise NotImplementedError(f"metric {metric.kind!r}: written for norm_ratio, resid_dim and logits")
    got = []
    forward(hf, tokens, list(hooks) + [(hf.model.get_submodule(hf.layout.layers)[metric.layer], "out", _reader(got))])
    return metric.value({metric.hooks()[0]: got[0]}, None, p0)


def _setter(at, cols, value):
    def put(x):
        x = x.clone()
        x[:, at, cols] = value.to(x.dtype)
        return x
    return put


def _adder(at, delta):
    def add(x):
        x = x.clone()
        x[:, at] = x[:, at] + delta.to(x.dtype)
        return x
    return add


# ---------------------------------------------------------------------------------------------- the runs
@dataclass
class Runs:
    """The clean run and the corrupted run of one call (a corruption that changes the tokens)."""

    hf: HF
    tokens: torch.Tensor
    corr: Corr

    def __post_init__(self):
        if self.corr.ablation:
            raise NotImplementedError(f"ablation {self.corr.kind!r}: its value depends on where a node is read")
        self.corrupt_tokens = self.corr.corrupt(self.tokens)

    def base(self, direction):
        """(tokens, P0 index, position map) of the run patches go into."""
        if direction == "noise":
            return self.tokens, 0, (lambda p: p)
        return self.corrupt_tokens, self.corr.where(0), self.corr.where

    def other_value(self, module, side, cols, pos, direction):
        """The value put in at clean positions ``pos``: the corrupted run's for noise, the clean one's for denoise."""
        if direction == "denoise":
            return capture(self.hf, self.tokens, module, side)[:, pos, cols]
        return capture(self.hf, self.corrupt_tokens, module, side)[:, [self.corr.where(p) for p in pos], cols]


def site(hf: HF, node: str) -> tuple:
    """(module, side, columns) holding ``node``."""
    kind, layer, index = _component(node)
    if kind == "head":
        return hf.at(layer, hf.layout.out_proj), "in", head_cols(index, hf.d_head)
    if kind == "mlp":
        return hf.at(layer, hf.layout.mlp), "out", slice(None)
    if kind == "neuron" and hf.layout.down:
        return hf.at(layer, hf.layout.down), "in", slice(index, index + 1)
    if kind == "embed":
        return hf.model.get_submodule(hf.layout.embed), "out", slice(None)
    if kind == "pos_embed" and hf.layout.pos_embed:
        return hf.model.get_submodule(hf.layout.pos_embed), "out", slice(None)
    raise NotImplementedError(f"{node}: a {kind} node is not written on transformers' modules (see the docstring)")


def node_hooks(runs: Runs, node: str, direction: str, named) -> list:
    """The hook that patches ``node`` in the base run of ``direction``."""
    module, side, cols = site(runs.hf, node)
    pos = positions(node, runs.tokens.shape[1], named)
    _, _, where = runs.base(direction)
    value = runs.other_value(module, side, cols, pos, direction)
    return [(module, side, _setter([where(p) for p in pos], cols, value))]


def activation(model, tokens, nodes, corr: Corr, metric: Metric, direction="noise") -> dict:
    """{node: the metric with that node alone patched}."""
    hf = model if isinstance(model, HF) else HF(model)
    runs = Runs(hf, tokens, corr)
    named = named_of(nodes)
    base, p0, _ = runs.base(direction)
    return {n: measure(hf, base, metric, p0, node_hooks(runs, n, direction, named)) for n in nodes}


def writes_at(hf: HF, node: str) -> tuple:
    """(module, side) where ``node``'s output enters the residual stream."""
    kind, layer, _ = _component(node)
    if kind == "head":
        return hf.at(layer, hf.layout.attn_out), "out"
    if kind in ("mlp", "neuron"):
        return hf.at(layer, hf.layout.mlp_out), "out"
    return hf.model.get_submodule(hf.layout.layers)[0], "in"


def sender_change(runs: Runs, src: str, direction: str, named) -> tuple:
    """(base-run positions, what patching the sender alone changes in the residual stream there)."""
    base, _, where = runs.base(direction)
    at = [where(p) for p in positions(src, runs.tokens.shape[1], named)]
    module, side = writes_at(runs.hf, src)
    plain = capture(runs.hf, base, module, side)
    patched = capture(runs.hf, base, module, side, node_hooks(runs, src, direction, named))
    return at, (patched - plain)[:, at]


def receiver_hooks(hf: HF, dst_input: str, at, delta) -> list:
    """The hooks that add ``delta`` at positions ``at`` to one receiver input: ``M2@0.mlp_in``,
    ``A2.H1@0.q`` / ``.k`` / ``.v``, ``A2.KV0@0.k`` / ``.v``, ``R2@0.resid``."""
    dst, which = dst_input.rsplit(".", 1)
    _, layer, index = _component(dst)
    if which == "mlp_in":
        return [(hf.at(layer, hf.layout.mlp_in), "in", _adder(at, delta))]
    if which == "resid":
        return [(hf.model.get_submodule(hf.layout.layers)[layer], "out", _adder(at, delta))]
    proj = hf.at(layer, hf.layout.qkv["qkv".index(which)])
    norm = hf.at(layer, hf.layout.attn_in) if hf.layout.attn_in else None
    cols, kept = qkv_cols(hf, which, index), {}

    def keep(x):
        kept["resid"] = x

    def splice(out):
        resid = _adder(at, delta)(kept["resid"])
        new = proj.forward(norm.forward(resid) if norm is not None else resid)
        out = out.clone()
        out[:, at, cols] = new[:, at, cols]
        return out
    return [(norm if norm is not None else proj, "in", keep), (proj, "out", splice)]


def path(model, tokens, edges, corr: Corr, metric: Metric, direction="noise") -> dict:
    """{edge: the metric with the sender's change added to that one receiver input alone}."""
    hf = model if isinstance(model, HF) else HF(model)
    runs = Runs(hf, tokens, corr)
    named = named_of(edges)
    base, p0, _ = runs.base(direction)
    changes, out = {}, {}
    for edge in edges:
        src, dst = edge.split("->")
        if src not in changes:
            changes[src] = sender_change(runs, src, direction, named)
        out[edge] = measure(hf, base, metric, p0, receiver_hooks(hf, dst, *changes[src]))
    return out
