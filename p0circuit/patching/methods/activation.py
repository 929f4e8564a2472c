"""Activation patching over position-aware nodes.

For each candidate node (a head output, an MLP output, an embedding or the residual stream, at
position 0, another named position, or "rest"), replace its activation in the base run and
measure the metric:

* ``direction="noise"`` (default): the base run is the clean prompt; the node gets its
  corrupted value (from the corrupted run at token-aligned positions, or from an ablation).
* ``direction="denoise"`` (TransformerLens' convention in ``transformer_lens.patching``): the
  base run is the corrupted prompt; the node gets its clean value.

Each node is patched alone. The fully corrupted reference is the corrupted run (``shift``,
``resample``) or, for ablations (``pos_mean``, ``zero``), the clean run with every candidate
ablated at once.
"""

from typing import Optional, Sequence, Union

from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core import names
from p0circuit.core.args import entry_point
from p0circuit.patching.setup import Setup
from p0circuit.patching.job import PatchJob
from p0circuit.patching.options import PatchOptions, takes_options
from p0circuit.patching.ops import node_op
from p0circuit.patching.registry import Method, register
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import candidate_nodes, named_positions, position_candidates, site_of
from p0circuit.core.types import Node, parse_nodes


@entry_point
@takes_options()
def activation_patch(
    model: HookedTransformer = None,  # type: ignore[assignment]  # (None: setup= gives it)
    tokens: Tensor = None,  # type: ignore[assignment]
    *,
    nodes: Optional[Sequence[Union[Node, str]]] = None,
    positions: str = "split",
    setup: Optional[Setup] = None,
    options: PatchOptions,
) -> PatchResult:
    """Patch each node alone and return raw and normalized effects on ``metric``.

    ``nodes`` defaults to :func:`candidate_nodes` (every head and MLP at position 0 and "rest",
    plus the position embedding for learned positions); ``positions="each"`` makes every position
    its own node instead, as TransformerLens' patching functions do (``result.to_tensor()`` is then
    ``[layer, pos, head]``). The shared options (:class:`~p0circuit.PatchOptions`: ``corruption``,
    ``metric``, ``direction``, ``min_signal``, ``bos``, ``rows_per_forward``, ``reference``,
    ``progress``) are keywords here, or one ``options=PatchOptions(...)``. ``bos`` is the run's BOS
    choice, checked against ``tokens`` (the BOS id at position 0 of a run that says no BOS is an
    error, and the reverse); ``reference=True`` uses the slow path.

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> result = p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1")
        >>> result.signal, sorted(result.to_circuit().node_names)
        (True, ['A0.H0@0', 'M0@0', 'M1@0'])
    """
    job = PatchJob.start(model, tokens, options, setup)
    nodes = position_candidates(model, positions, job.seq_len, nodes)
    return patch_nodes(job, parse_nodes(nodes if nodes is not None else candidate_nodes(model)))


def patch_nodes(job: PatchJob, node_list: Sequence[Node], candidates: Optional[Sequence[Node]] = None) -> PatchResult:
    """Activation patching of ``node_list`` on ``job`` (its caches are made or reused). Under an
    ablation the fully corrupted reference ablates every one of ``candidates`` at once (default
    ``node_list``): a caller that patches a subset (triage) passes the whole candidate set, so the
    normalization is the same as if every candidate had been patched."""
    model = job.model
    every = list(node_list if candidates is None else candidates)
    named = named_positions(every)
    live = [n for n in node_list if job.reaches(site_of(n, model).hook)]
    live_all = [n for n in every if job.reaches(site_of(n, model).hook)]
    job.cache({site_of(n, model).read.name for n in live_all})
    ops = [node_op(job, n, job.direction, named) for n in live]
    corrupted = job.corrupted_metric(ops if candidates is None else
                                     [node_op(job, n, job.direction, named) for n in live_all])
    with job.tracking(len(ops), "activation patching"):
        raw = {n.name: v for n, v in zip(live, job.patch_each(ops))}
    return job.result("activation", "node", raw, corrupted, candidates=[n.name for n in node_list])


register(Method(names.ACTIVATION, activation_patch, "node",
                summary="patch each node (head or MLP output at a position class) alone"))
