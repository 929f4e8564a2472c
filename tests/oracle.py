"""The oracle: every number p0circuit's patching reports, computed again with plain TransformerLens
hooks, sharing no code with p0circuit.

Nothing here imports p0circuit. The corruptions, metrics, node and edge names are re-implemented
from their definitions in the docs (docs/science.md, the docstrings of the public classes), every
patch is one ordinary ``run_with_hooks`` forward over whole prompts, and nothing is skipped: no
reachability, no cached prefixes, no stacked batches, no formula for what a sender writes. A path
edge's sender change is read off a real forward with only that sender patched, at the hook where
the sender's output enters the residual stream (``hook_attn_out`` for a head, ``hook_mlp_out`` for
an MLP or a neuron, ``hook_resid_pre`` of block 0 for an embedding), so post-norms need no formula.
An expert's contribution is the MLP output minus the MLP output with that expert's module silenced.

The vocabulary (names as p0circuit spells them):

* nodes ``A1.H2@0`` (a head's ``hook_z``), ``M1@rest`` (``hook_mlp_out``), ``M1.N5@0`` (one neuron of
  ``mlp.hook_post``), ``M1.E3@0`` (an expert's contribution), ``E@0``/``PE@0`` (embeddings), ``R1@0``
  (``hook_resid_post``); ``@rest`` is every position not named by another node of the same call;
* edges ``S->A2.H1@0.q`` / ``.k`` / ``.v`` (a head's split input), ``S->A2.KV0@0.k`` (a key/value head),
  ``S->M2@0.mlp_in``, ``S->R2@0.resid`` (the direct edge into the block output a metric reads);
* corruptions :class:`Corr`; metrics :class:`Metric`; directions ``noise`` (the other run's value
  into the clean run) and ``denoise`` (the clean value into the corrupted run).
"""

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

FILLER = 5


# ---------------------------------------------------------------------------------------------- corruptions
@dataclass
class Corr:
    """A corruption, as its definition says.

    kind: ``shift`` (``filler`` tokens put before each prompt: clean position p is corrupted p + k),
    ``copies`` (``k`` copies of each prompt's first token put before it: clean position p is corrupted p + k),
    ``swap`` (the token at ``position`` replaced by ``token``, positions kept), ``resample`` (the
    prompts ``tokens`` instead, positions kept), ``swap_first_two`` (a plugin's corruption: tokens 0
    and 1 trade places, so clean 0 is corrupted 1 and back), ``pos_mean`` (an ablation: the value at
    ``position`` replaced by the mean over the prompt's other positions), ``zero`` (an ablation: 0)."""

    kind: str
    filler: tuple = (FILLER,)
    position: int = 0
    token: int = FILLER
    tokens: Optional[torch.Tensor] = None
    k: int = 3

    @property
    def ablation(self) -> bool:
        return self.kind in ("pos_mean", "zero")

    def corrupt(self, tokens):
        if self.kind == "shift":
            fill = torch.tensor(self.filler, dtype=tokens.dtype).expand(tokens.shape[0], len(self.filler))
            return torch.cat([fill, tokens], dim=1)
        if self.kind == "copies":
            return torch.cat([tokens[:, :1].repeat(1, self.k), tokens], dim=1)
        if self.kind == "swap":
            out = tokens.clone()
            out[:, self.position] = self.token
            return out
        if self.kind == "resample":
            return self.tokens.clone()
        if self.kind == "swap_first_two":
            out = tokens.clone()
            out[:, 0], out[:, 1] = tokens[:, 1], tokens[:, 0]
            return out
        return None

    def where(self, p: int) -> int:
        """The corrupted index of clean position ``p``."""
        if self.kind == "shift":
            return p + len(self.filler)
        if self.kind == "copies":
            return p + self.k
        if self.kind == "swap_first_two" and p in (0, 1):
            return 1 - p
        return p

    def ablate(self, act, positions):
        """The ablated value of ``act`` (``[batch, pos, ...]``, the clean run) at ``positions``."""
        if self.kind == "zero":
            return torch.zeros_like(act[:, positions])
        out = act[:, positions].clone()
        others = [t for t in range(act.shape[1]) if t != self.position]
        for i, p in enumerate(positions):
            if p == self.position:
                out[:, i] = act[:, others].mean(dim=1)
        return out


# ---------------------------------------------------------------------------------------------- metrics
@dataclass
class Metric:
    """A patching metric, as its definition says; ``p0`` is where the clean first token sits.

    kind: ``norm_ratio`` (block ``layer``'s output: the norm at position ``pos`` counted from p0, or
    one such position per prompt, over the mean norm of the other positions from p0 on, averaged
    over prompts), ``resid_dim`` (dimension ``dim`` of block ``layer``'s output at p0, mean over
    prompts), ``attn_to_p0`` (each of ``heads``' attention from the queries after p0 to p0, mean
    over queries, heads and prompts), ``logits`` (``fn(logits)``), ``cache`` (``fn(act, p0)`` on
    hook ``hook``)."""

    kind: str
    layer: int = 0
    pos: object = 0
    dim: int = 0
    heads: tuple = ()
    hook: str = ""
    fn: Optional[Callable] = None

    def hooks(self) -> list:
        if self.kind in ("norm_ratio", "resid_dim"):
            return [f"blocks.{self.layer}.hook_resid_post"]
        if self.kind == "attn_to_p0":
            return sorted({f"blocks.{l}.attn.hook_pattern" for l, _ in self.heads})
        if self.kind == "cache":
            return [self.hook]
        return []

    def value(self, acts, logits, p0) -> float:
        if self.kind == "norm_ratio":
            norms = acts[self.hooks()[0]].double().norm(dim=-1)
            per_prompt = []
            for b in range(norms.shape[0]):
                k = self.pos[b] if isinstance(self.pos, tuple) else self.pos
                row = norms[b, p0:]
                others = [row[t] for t in range(len(row)) if t != k]
                per_prompt.append(row[k] / (sum(others) / len(others)))
            return float(sum(per_prompt) / len(per_prompt))
        if self.kind == "resid_dim":  # at P0, or ``pos`` (an int) positions after it
            return float(acts[self.hooks()[0]][:, p0 + self.pos, self.dim].double().mean())
        if self.kind == "attn_to_p0":
            vals = [acts[f"blocks.{l}.attn.hook_pattern"][:, h, p0 + 1:, p0].double().mean()
                    for l, h in self.heads]
            return float(sum(vals) / len(vals))
        if self.kind == "logits":
            return float(self.fn(logits))
        return float(self.fn(acts[self.hook], p0))


def run(model, tokens, metric, fwd_hooks=()) -> tuple:
    """(the hooks ``metric`` reads, logits) of one full forward of ``tokens`` with ``fwd_hooks``
    (patches) applied first."""
    got = {}

    def grab(act, hook):
        got[hook.name] = act.detach().clone()

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks) + [(h, grab) for h in metric.hooks()])
    return got, logits


def measure(model, tokens, metric, p0, fwd_hooks=()) -> float:
    """``metric`` at ``p0`` on one full forward of ``tokens`` with ``fwd_hooks`` applied."""
    got, logits = run(model, tokens, metric, fwd_hooks)
    return metric.value(got, logits, p0)


# ---------------------------------------------------------------------------------------------- names
def _component(name: str) -> tuple:
    """(kind, layer, index) of a node's component: ``A1.H2`` -> ("head", 1, 2)."""
    comp = name.split("@")[0]
    if comp in ("E", "PE"):
        return ({"E": "embed", "PE": "pos_embed"}[comp], -1, None)
    if comp.startswith("A"):
        layer, rest = comp[1:].split(".")
        return ("kv_head" if rest.startswith("KV") else "head", int(layer), int(rest.lstrip("KVH")))
    if comp.startswith("R"):
        return ("resid", int(comp[1:]), None)
    if "." in comp:
        layer, rest = comp[1:].split(".")
        return ("neuron" if rest[0] == "N" else "expert", int(layer), int(rest[1:]))
    return ("mlp", int(comp[1:]), None)


def _hook(kind: str, layer: int) -> str:
    return {"head": f"blocks.{layer}.attn.hook_z", "mlp": f"blocks.{layer}.hook_mlp_out",
            "neuron": f"blocks.{layer}.mlp.hook_post", "expert": f"blocks.{layer}.hook_mlp_out",
            "embed": "hook_embed", "pos_embed": "hook_pos_embed", "resid": f"blocks.{layer}.hook_resid_post"}[kind]


def named_of(names) -> list:
    """The positions named by ``names`` (``@rest`` is every other one); [0] when none is."""
    found = sorted({int(n.split("->")[0].split("@")[1]) for n in names if not n.split("->")[0].endswith("@rest")})
    return found or [0]


def positions(name: str, seq_len: int, named) -> list:
    pos = name.split("@")[1]
    return [t for t in range(seq_len) if t not in named] if pos == "rest" else [int(pos)]


# ---------------------------------------------------------------------------------------------- the runs
@dataclass
class Runs:
    """The clean and corrupted runs of one call, with every activation cached (no filter)."""

    model: object
    tokens: torch.Tensor
    corr: Corr
    corrupt_tokens: Optional[torch.Tensor] = None
    clean: dict = field(default_factory=dict)
    corrupt: dict = field(default_factory=dict)

    def __post_init__(self):
        with torch.no_grad():
            _, cache = self.model.run_with_cache(self.tokens)
            self.clean = dict(cache.cache_dict)
            self.corrupt_tokens = self.corr.corrupt(self.tokens)
            if self.corrupt_tokens is not None:
                _, cache = self.model.run_with_cache(self.corrupt_tokens)
                self.corrupt = dict(cache.cache_dict)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def base(self, direction):
        """(tokens, P0 index, position map) of the run patches go into."""
        if direction == "noise":
            return self.tokens, 0, (lambda p: p)
        return self.corrupt_tokens, self.corr.where(0), self.corr.where

    def other_value(self, hook, pos, direction):
        """The value patched in at clean positions ``pos``: the corrupted (ablated) one for noise,
        the clean one for denoise."""
        if direction == "denoise":
            return self.clean[hook][:, pos]
        if self.corr.ablation:
            return self.corr.ablate(self.clean[hook], pos)
        return self.corrupt[hook][:, [self.corr.where(p) for p in pos]]


def _setter(at, index, value):
    def hook(act, hook):
        if index is None:
            act[:, at] = value.to(act.dtype)
        else:
            act[:, at, index] = value.to(act.dtype)
        return act
    return hook


def _adder(at, index, value):
    def hook(act, hook):
        if index is None:
            act[:, at] = act[:, at] + value.to(act.dtype)
        else:
            act[:, at, index] = act[:, at, index] + value.to(act.dtype)
        return act
    return hook


def _silenced(model, layer, expert):
    """A plain PyTorch forward hook that makes one expert module output zeros."""
    return model.blocks[layer].mlp.experts[expert].register_forward_hook(lambda m, i, out: torch.zeros_like(out))


@torch.no_grad()
def expert_contribution(model, tokens, layer, expert):
    """``[batch, pos, d_model]``: the MLP output of block ``layer`` minus the same with expert ``expert``
    silenced (both read off real forwards)."""
    name = f"blocks.{layer}.hook_mlp_out"
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    full = cache[name]
    handle = _silenced(model, layer, expert)
    try:
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    finally:
        handle.remove()
    return full - cache[name]


def node_hooks(runs: Runs, node: str, direction: str, named) -> list:
    """The forward hooks that patch ``node`` in the base run of ``direction``."""
    kind, layer, index = _component(node)
    pos = positions(node, runs.seq_len, named)
    _, _, where = runs.base(direction)
    at = [where(p) for p in pos]
    if kind == "expert":
        clean = expert_contribution(runs.model, runs.tokens, layer, index)
        if runs.corr.ablation:
            new = runs.corr.ablate(clean, pos)
            return [(_hook(kind, layer), _adder(at, None, new - clean[:, pos]))]
        corr = expert_contribution(runs.model, runs.corrupt_tokens, layer, index)
        corr_at = corr[:, [runs.corr.where(p) for p in pos]]
        change = corr_at - clean[:, pos] if direction == "noise" else clean[:, pos] - corr_at
        return [(_hook(kind, layer), _adder(at, None, change))]
    hook = _hook(kind, layer)
    value = runs.other_value(hook, pos, direction)
    if index is not None:
        value = value[:, :, index]
    return [(hook, _setter(at, index, value))]


# ---------------------------------------------------------------------------------------------- the methods
def activation(model, tokens, nodes, corr: Corr, metric: Metric, direction="noise") -> dict:
    """{node: the metric with that node alone patched}."""
    runs = Runs(model, tokens, corr)
    named = named_of(nodes)
    base, p0, _ = runs.base(direction)
    return {n: measure(model, base, metric, p0, node_hooks(runs, n, direction, named)) for n in nodes}


def together(model, tokens, nodes, corr: Corr, metric: Metric, named=None, direction="noise") -> float:
    """The metric with every node of ``nodes`` patched at once: noising, a faithfulness point (and an
    ablation's fully corrupted reference); denoising, a circuit restored into the corrupted run."""
    runs = Runs(model, tokens, corr)
    named = named_of(nodes) if named is None else named
    fwd = [h for n in nodes for h in node_hooks(runs, n, direction, named)]
    base, p0, _ = runs.base(direction)
    return measure(model, base, metric, p0, fwd)


def references(model, tokens, nodes, corr: Corr, metric: Metric) -> tuple:
    """(clean metric, fully corrupted metric): the corrupted run's at its P0, or under an ablation
    the clean run with every one of ``nodes`` ablated at once."""
    clean = measure(model, tokens, metric, 0)
    if corr.ablation:
        return clean, together(model, tokens, nodes, corr, metric)
    return clean, measure(model, corr.corrupt(tokens), metric, corr.where(0))


def _writes_at(kind: str, layer: int) -> str:
    """The hook where a sender's output enters the residual stream."""
    if kind == "head":
        return f"blocks.{layer}.hook_attn_out"
    if kind in ("mlp", "neuron"):
        return f"blocks.{layer}.hook_mlp_out"
    return "blocks.0.hook_resid_pre"


@torch.no_grad()
def sender_change(runs: Runs, src: str, direction: str, named) -> tuple:
    """(base-run positions, what the sender's patch changes in the residual stream there): a real
    forward of the base run with only the sender patched, against one without."""
    kind, layer, _ = _component(src)
    base, _, where = runs.base(direction)
    pos = positions(src, runs.seq_len, named)
    at = [where(p) for p in pos]
    out = _writes_at(kind, layer)
    got = {}

    def grab(act, hook):
        got[len(got)] = act.detach().clone()

    runs.model.run_with_hooks(base, fwd_hooks=[(out, grab)])
    runs.model.run_with_hooks(base, fwd_hooks=node_hooks(runs, src, direction, named) + [(out, grab)])
    return at, (got[1] - got[0])[:, at]


def _receiver(dst_input: str) -> tuple:
    """(hook, index) of an edge's receiver input ``A2.H1@0.q``, ``A2.KV0@0.k``, ``M2@0.mlp_in``, ``R2@0.resid``."""
    dst, which = dst_input.rsplit(".", 1)
    kind, layer, index = _component(dst)
    if which == "mlp_in":
        return f"blocks.{layer}.hook_mlp_in", None
    if which == "resid":
        return f"blocks.{layer}.hook_resid_post", None
    return f"blocks.{layer}.hook_{which}_input", index


def path(model, tokens, edges, corr: Corr, metric: Metric, direction="noise") -> dict:
    """{edge: the metric with the sender's change added to that one receiver input alone}."""
    runs = Runs(model, tokens, corr)
    named = named_of(edges)
    base, p0, _ = runs.base(direction)
    out = {}
    flags = model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in
    model.cfg.use_split_qkv_input = True
    model.cfg.use_hook_mlp_in = not model.cfg.attn_only
    try:
        for edge in edges:
            src, dst = edge.split("->")
            at, delta = sender_change(runs, src, direction, named)
            hook, index = _receiver(dst)
            out[edge] = measure(model, base, metric, p0, [(hook, _adder(at, index, delta))])
    finally:
        model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in = flags
    return out


def _contribution(model, kind: str, layer: int, index, act):
    """What a sender adds to the residual stream, from its hook's activation ``act`` (whole positions):
    a head's slice of ``hook_result`` (``use_attn_result``), a neuron's ``hook_post`` times its ``W_out``
    row, an MLP's ``hook_mlp_out``, an embedding's hook."""
    if kind == "head":
        return act[:, :, index]
    if kind == "neuron":
        return act[:, :, index, None] * model.blocks[layer].mlp.W_out[index]
    return act


def _contribution_hook(kind: str, layer: int) -> str:
    return {"head": f"blocks.{layer}.attn.hook_result", "neuron": f"blocks.{layer}.mlp.hook_post",
            "mlp": f"blocks.{layer}.hook_mlp_out", "embed": "hook_embed", "pos_embed": "hook_pos_embed"}[kind]


def edges_together(model, tokens, nodes, edges, corr: Corr, metric: Metric, named) -> float:
    """The metric of the clean run with every node of ``nodes`` patched (noise) and every edge of
    ``edges`` corrupted as an edge, as ACDC does: the receiver's input minus (what the sender writes in
    this very forward - what it writes in the corrupted run)."""
    flags = model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in, model.cfg.use_attn_result
    model.cfg.use_split_qkv_input, model.cfg.use_attn_result = True, True
    model.cfg.use_hook_mlp_in = not model.cfg.attn_only
    try:
        runs = Runs(model, tokens, corr)
        fwd = [h for n in nodes for h in node_hooks(runs, n, "noise", named)]
        current = {}
        for edge in edges:
            src, dst = edge.split("->")
            kind, layer, index = _component(src)
            hook = _contribution_hook(kind, layer)
            pos = positions(src, runs.seq_len, named)
            corrupted = _contribution(model, kind, layer, index, runs.other_value(hook, pos, "noise"))

            def grab(act, hook, src=src, kind=kind, layer=layer, index=index):
                current[src] = _contribution(model, kind, layer, index, act.detach().clone())

            def subtract(act, hook, src=src, pos=pos, corrupted=corrupted, at=_receiver(dst)[1]):
                diff = current[src][:, pos] - corrupted
                if at is None:
                    act[:, pos] = act[:, pos] - diff.to(act.dtype)
                else:
                    act[:, pos, at] = act[:, pos, at] - diff.to(act.dtype)
                return act
            fwd += [(hook, grab), (_receiver(dst)[0], subtract)]
        return measure(model, tokens, metric, 0, fwd)
    finally:
        model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in, model.cfg.use_attn_result = flags


def attribution(model, tokens, nodes, corr: Corr, metric: Metric) -> dict:
    """{node: clean metric + (corrupted - clean activation) . d metric / d activation}, by plain
    autograd on one full forward (noise direction)."""
    runs = Runs(model, tokens, corr)
    named = named_of(nodes)
    acts = {}
    names = {_hook(*_component(n)[:2]) for n in nodes}

    def keep(act, hook):
        act.retain_grad()
        acts[hook.name] = act

    def leaf(act, hook):
        return act.detach().requires_grad_(True)

    got = {}

    def grab(act, hook):
        got[hook.name] = act

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        with torch.enable_grad():
            roots = [(n, leaf) for n in ("hook_embed", "hook_pos_embed") if n in model.hook_dict]
            logits = model.run_with_hooks(tokens, fwd_hooks=roots + [(n, keep) for n in names]
                                          + [(h, grab) for h in metric.hooks()])
            value = _metric_tensor(metric, got, logits, 0)
            value.backward()
    finally:
        for p, was in frozen:
            p.requires_grad_(was)
    out = {}
    for node in nodes:
        kind, layer, index = _component(node)
        hook = _hook(kind, layer)
        pos = positions(node, runs.seq_len, named)
        new = runs.other_value(hook, pos, "noise")
        diff = new - acts[hook].detach()[:, pos]
        grad = acts[hook].grad[:, pos]
        if index is not None:
            diff, grad = diff[:, :, index], grad[:, :, index]
        out[node] = float(value.detach()) + float((diff.double() * grad.double()).sum())
    return out


def _metric_tensor(metric: Metric, acts, logits, p0):
    """The metric as a differentiable tensor (norm ratio, residual dimension, logits)."""
    if metric.kind == "norm_ratio":
        norms = acts[metric.hooks()[0]].norm(dim=-1)[:, p0:]
        k = metric.pos
        others = (norms.sum(-1) - norms[:, k]) / (norms.shape[1] - 1)
        return (norms[:, k] / others).mean()
    if metric.kind == "resid_dim":
        return acts[metric.hooks()[0]][:, p0 + metric.pos, metric.dim].mean()
    return metric.fn(logits)


def integrated(model, tokens, nodes, corr: Corr, metric: Metric, steps: int) -> dict:
    """{node: clean metric + (corrupted - clean activation) . mean_i dM/da(a_i)}: integrated gradients along
    the straight path ``a_i = clean + alpha_i (target - clean)``, ``alpha_i = (i + 1/2) / steps``, one hook at
    a time, where a hook's target is its clean activation with every node of ``nodes`` at it patched. Each
    point is one plain forward of the whole prompts from the tokens, the hook's activation replaced (noise)."""
    runs = Runs(model, tokens, corr)
    named = named_of(nodes)
    clean_value = measure(model, tokens, metric, 0)
    by_hook = {}
    for node in nodes:
        kind, layer, index = _component(node)
        by_hook.setdefault(_hook(kind, layer), []).append((node, index, positions(node, runs.seq_len, named)))
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    out = {}
    try:
        for hook, members in by_hook.items():
            start = runs.clean[hook].detach().double()
            target = start.clone()
            for _, index, pos in members:
                new = runs.other_value(hook, pos, "noise").double()
                if index is None:
                    target[:, pos] = new
                else:
                    target[:, pos, index] = new[:, :, index]
            total = torch.zeros_like(start)
            for i in range(steps):
                point = (start + (i + 0.5) / steps * (target - start)).to(runs.clean[hook].dtype).requires_grad_(True)
                got = {}

                def place(act, hook, point=point):
                    return point

                def grab(act, hook):
                    got[hook.name] = act

                with torch.enable_grad():
                    logits = model.run_with_hooks(tokens, fwd_hooks=[(hook, place)] + [(h, grab) for h in metric.hooks()])
                    _metric_tensor(metric, got, logits, 0).backward()
                total += point.grad.double()
            for node, index, pos in members:
                diff, grad = (target - start)[:, pos], total[:, pos] / steps
                if index is not None:
                    diff, grad = diff[:, :, index], grad[:, :, index]
                out[node] = clean_value + float((diff * grad).sum())
    finally:
        for p, was in frozen:
            p.requires_grad_(was)
    return out
