"""Attribution patching: the first-order (gradient) approximation of activation and path patching.

One forward and one backward pass on the base run give every node's and every edge's estimate:

* node ``n``: ``(a_n^corrupted - a_n^clean) . dM/da_n`` summed over the node's positions;
* edge ``s -> r.input`` (EAP, Syed et al. 2023): ``(out_s^corrupted - out_s^clean) . dM/d(input of r)``
  at the edge's positions.

The estimate of the patched metric is ``M_base + attribution``; it is normalized like the exact
methods.

``steps > 1`` (nodes only) replaces the gradient at the base run by integrated gradients
(Sundararajan et al. 2017) along the straight path from the base activations to the patched ones,
one hook (one layer's neurons, heads or MLP output) at a time while every other activation is
recomputed: ``(a^corr - a^clean) . mean_i dM/da (a^clean + alpha_i (a^corr - a^clean))`` at the
midpoints ``alpha_i = (i + 1/2) / steps``. It costs ``steps`` forwards and backwards per hook (each from
the hook's own block on, the blocks before it taken from the base run) and
follows a metric through saturation and normalization, where one gradient at the clean run does not
(a ReLU that switches, a norm ratio that grows like the square of a massive dimension). It is a fast screen: the linearization is poor where the metric saturates (an attention
of 0.9999 has almost no gradient) or where a ReLU/threshold switches, so compare with exact
patching (:func:`p0circuit.check_attribution`, which also checks float32 against float64)
before trusting it.
"""

from functools import partial
from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core import hooks
from p0circuit.core import names
from p0circuit.core.errors import ConfigError, BadInputError
from p0circuit.core.args import entry_point
from p0circuit.patching.edges import candidate_edges, check_metric_outside_receivers, parse_edges, receiver_site, sender_hook
from p0circuit.patching.hooking import receiver_hooks
from p0circuit.patching.setup import Setup
from p0circuit.patching.job import PatchJob
from p0circuit.patching.metrics import PatchMetric, RunView
from p0circuit.patching.options import PatchOptions, takes_options
from p0circuit.patching.ops import node_op, sender_delta
from p0circuit.patching.registry import Method, register
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import candidate_nodes, named_positions, site_of
from p0circuit.core.types import Edge, Node, parse_nodes


MAX_STEPS = 1024
"""Most integrated-gradient steps a call accepts (each is a forward and a backward per hook)."""


def _from_block(model: Any, tokens: Tensor, metric: PatchMetric, base: dict[str, Tensor], layer: int
                ) -> tuple[Tensor, dict[str, Any]]:
    """What a forward that changes nothing before block ``layer`` starts from: the base run's input to that
    block (``start_at_layer``: the blocks before it are the base run's, unchanged), or the tokens where it
    cannot (an embedding, a metric read before the block, shortformer positions, a block not cached)."""
    early = any(h.layer < layer for h in metric.needs(model.cfg.n_layers))
    name = hooks.resid_pre(layer)
    if layer < 1 or early or name not in base or model.cfg.positional_embedding_type == "shortformer":
        return tokens, {}
    return base[name], {"start_at_layer": layer}


def _integrated_gradients(model: Any, tokens: Tensor, metric: PatchMetric, targets: dict[str, Tensor],
                          layers: dict[str, int], base: dict[str, Tensor], p0: int, stop: Optional[int],
                          steps: int) -> dict[str, Tensor]:
    """Mean ``dM/da`` along ``base[h] -> targets[h]`` for each hook ``h`` alone (the rest recomputed; each
    forward starts at ``h``'s block, ``layers[h]``, from the base run's input to it)."""
    metric_names = {h.name for h in metric.needs(model.cfg.n_layers)}
    out: dict[str, Tensor] = {}
    params = [p for p in model.parameters()]
    old = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        for name, target in targets.items():
            start, delta = base[name], target - base[name]
            given, extra = _from_block(model, tokens, metric, base, layers[name])
            total = torch.zeros_like(start, dtype=torch.float32)
            for i in range(steps):
                alpha = (i + 0.5) / steps
                point: dict[str, Tensor] = {}
                acts: dict[str, Tensor] = {}

                def place(act: Tensor, hook: Any, alpha: float = alpha) -> Tensor:
                    x = (start + alpha * delta).detach().to(act.dtype).requires_grad_(True)
                    point["x"] = x
                    return x

                def keep(act: Tensor, hook: Any) -> None:
                    acts[hook.name] = act

                fwd = [(name, place)] + [(n, keep) for n in metric_names]
                with model.hooks(fwd_hooks=fwd), torch.enable_grad():
                    logits = model(given, stop_at_layer=stop, **extra)
                    value = metric(RunView({n: acts[n] for n in metric_names}, logits if stop is None else None, p0))
                    if value.requires_grad:
                        value.backward()
                grad = point["x"].grad
                if grad is not None:
                    total += grad.float()
            out[name] = total / steps
    finally:
        for p, o in zip(params, old):
            p.requires_grad_(o)
        model.zero_grad(set_to_none=True)
    return out


def _gradients(model: Any, tokens: Tensor, metric: PatchMetric, names: set[str], p0: int,
               stop: Optional[int]) -> tuple[float, dict[str, Tensor]]:
    """Metric value and d metric / d activation for every hook in ``names``."""
    acts: dict[str, Tensor] = {}
    metric_names = {h.name for h in metric.needs(model.cfg.n_layers)}

    def keep(act: Tensor, hook: Any) -> None:
        if act.requires_grad:
            act.retain_grad()
        acts[hook.name] = act

    fwd: list[tuple[str, Callable]] = [(n, keep) for n in names | metric_names]
    params = [p for p in model.parameters()]
    old = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        # with frozen parameters the embeddings carry no graph: make it start there (these hooks
        # must run before the ones that keep activations, so they are registered first)
        def leaf(act: Tensor, hook: Any) -> Tensor:
            return act.detach().requires_grad_(True)

        roots: list[tuple[str, Callable]] = [(n, leaf) for n in (hooks.EMBED, hooks.POS_EMBED) if n in model.hook_dict]
        with model.hooks(fwd_hooks=roots + fwd), torch.enable_grad():  # also under a global no_grad
            out = model(tokens, stop_at_layer=stop)  # the logits, or the residual stream where the metric ends
            value = metric(RunView({n: acts[n] for n in metric_names}, out if stop is None else None, p0))
            if not value.requires_grad:
                raise BadInputError(f"the metric {metric.name} does not depend on the model's activations (its value "
                                    "carries no gradient), so attribution has nothing to differentiate: compute it "
                                    "from the logits or cached tensors it is given, without .item() or float()")
            value.backward()
    finally:
        for p, o in zip(params, old):
            p.requires_grad_(o)
        model.zero_grad(set_to_none=True)
    grads = {n: (acts[n].grad if acts[n].grad is not None else torch.zeros_like(acts[n])).detach() for n in names}
    return float(value.detach()), grads


def _targets(ops: Sequence[Any], cache: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per hook, the base activation with every op at that hook applied: where the path ends."""
    out: dict[str, Tensor] = {}
    for op in ops:
        op.apply(out.setdefault(op.hook.name, cache[op.hook.name].clone()), slice(None))
    return out


@entry_point
@takes_options(without=("reference",))
def attribution_patch(
    model: HookedTransformer = None,  # type: ignore[assignment]  # (None: setup= gives it)
    tokens: Tensor = None,  # type: ignore[assignment]
    *,
    nodes: Optional[Sequence[Union[Node, str]]] = None,
    edges: Optional[Sequence[Union[Edge, str]]] = None,
    level: str = "node",
    steps: int = 1,
    setup: Optional[Setup] = None,
    options: PatchOptions,
) -> PatchResult:
    """Gradient estimates of activation (``level="node"``) or path (``level="edge"``) patching.

    ``nodes`` are the candidate nodes (``level="node"``) or the senders of the candidate edges
    (``level="edge"``, when ``edges`` is not given). ``steps > 1``: integrated gradients over that
    many points per hook (nodes only; see the module docstring). The shared options are those of
    :func:`activation_patch` but ``reference`` (a gradient has no slow path).
    """
    if level not in ("node", "edge"):
        raise ConfigError(f"level must be 'node' or 'edge', got {level!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BadInputError(f"steps must be an integer >= 1 (1: one gradient; more: integrated gradients), got {steps!r}")
    if steps > MAX_STEPS:
        raise BadInputError(
            f"steps={steps} is more than {MAX_STEPS}: integrated gradients cost one forward and one backward per step "
            f"for every hook the nodes sit at, so this would be {steps} x (hooks) gradient passes; 4-64 steps follow a "
            "saturating metric closely (check_attribution measures how closely), and exact activation patching of "
            "the nodes costs about one forward each")
    if steps > 1 and level == "edge":
        raise BadInputError("integrated gradients (steps > 1) are for nodes; edge attribution takes steps=1")
    if edges is not None and level == "node":
        raise BadInputError("edges= is for edge attribution: pass level='edge' (method 'attribution_edges'), or nodes=")
    if edges is not None and nodes is not None:
        raise BadInputError("give the candidate edges (edges=) or their senders (nodes=), not both")
    job = PatchJob.start(model, tokens, options, setup)
    node_list = parse_nodes(nodes if nodes is not None else candidate_nodes(model))
    if level == "edge" and edges is None:
        edges = candidate_edges(model, node_list, receiver_layers=job.receiver_layers, metric=job.metric)
    return attribute(job, node_list, parse_edges(edges) if level == "edge" else None, steps)


def attribute(job: PatchJob, node_list: Sequence[Node], edge_list: Optional[Sequence[Edge]] = None,
              steps: int = 1, min_signal: Optional[float] = None) -> PatchResult:
    """Attribution on ``job`` (its caches are made or reused): of ``edge_list`` when one is given
    (``node_list`` then are the senders of the fully corrupted reference), else of ``node_list``.
    ``min_signal`` overrides the job's for the result's normalization."""
    model, direction = job.model, job.direction
    level = "node" if edge_list is None else "edge"
    edge_list = edge_list or []
    check_metric_outside_receivers(model, job.metric, edge_list)
    named = named_positions(node_list)
    live_nodes = [n for n in node_list if job.reaches(site_of(n, model).hook)]
    live_edges = [e for e in edge_list if job.reaches(receiver_site(e, model)[0])]
    job.cache({site_of(n, model).read.name for n in live_nodes} | {sender_hook(e.src) for e in live_edges})
    base = job.base()
    base_cache, base_tokens, p0 = base.cache, base.tokens, base.p0
    scores: dict[str, float] = {}
    with receiver_hooks(model, split_qkv=level == "edge"), job.tracking(steps, "attribution (gradient passes)"):
        if level == "node":
            ops = [node_op(job, n, direction, named) for n in live_nodes]
            if steps > 1:  # the base run's value from the cached run; the gradients along the path
                base_value = job.base_metric
                grads = _integrated_gradients(model, base_tokens, job.metric, _targets(ops, base_cache),
                                              {op.hook.name: op.hook.layer for op in ops}, base_cache, p0, job.stop,
                                              steps)
            elif base_cache is job.clean and job.setup.clean is not None:  # inside sharing_clean: shared gradients
                wanted = {op.hook.name for op in ops}
                base_value, grads = job.setup.clean.gradients(wanted, job.stop, lambda: _gradients(
                    model, base_tokens, job.metric, wanted, p0, job.stop))
            else:
                base_value, grads = _gradients(model, base_tokens, job.metric, {op.hook.name for op in ops}, p0,
                                               job.stop)
            at: dict[tuple[str, tuple[int, ...]], tuple[Tensor, Tensor]] = {}  # (gradient, base) at a hook's positions
            for n, op in zip(live_nodes, ops):
                key = (op.hook.name, op.positions)
                if key not in at:  # once per hook and positions, not per head or neuron
                    at[key] = (grads[op.hook.name][:, list(op.positions)], base_cache[op.hook.name][:, list(op.positions)])
                g, cur = at[key]
                if op.add:  # the op carries the change itself (an expert's contribution)
                    scores[n.name] = float((op.value * g).sum())
                    continue
                if op.head is not None:
                    cur, g = cur[:, :, op.head], g[:, :, op.head]
                scores[n.name] = float(((op.value - cur) * g).sum())
        else:
            sites = {e: receiver_site(e, model) for e in live_edges}
            base_value, grads = _gradients(model, base_tokens, job.metric, {h.name for h, _ in sites.values()}, p0,
                                           job.stop)
            for e in live_edges:
                pos, delta = sender_delta(job, e, direction, named)
                hook, head = sites[e]
                g = grads[hook.name][:, pos]
                if head is not None:
                    g = g[:, :, head]
                scores[e.name] = float((delta.detach() * g).sum())
        corrupted = job.corrupted_metric([node_op(job, n, "noise", named) for n in live_nodes])
        job.advance(steps)
    raw = {k: base_value + v for k, v in scores.items()}
    names = [n.name for n in node_list] if level == "node" else [e.name for e in edge_list]
    return job.result("attribution", level, raw, corrupted, candidates=names, min_signal=min_signal)


register(Method(names.ATTRIBUTION, attribution_patch, "node", exact=False,
                summary="gradient estimate of activation patching (one forward and backward)"))
register(Method(names.ATTRIBUTION_EDGES, partial(attribution_patch, level="edge"), "edge", exact=False,
                summary="gradient estimate of path patching (EAP: one forward and backward)"))
