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

from typing import Any, Optional, Sequence, Union


from p0circuit.patching.engine import PatchOp
from p0circuit.patching.runs import Runs, corrupted_metric, make_result, patch_each, setup
from p0circuit.patching.result import PatchResult
from p0circuit.patching.sites import candidate_nodes, positions_of, site_of
from p0circuit.types import REST, Node
from p0circuit.validation import parse_nodes


def node_op(runs: Runs, node: Node, direction: str, named: Sequence[int]) -> PatchOp:
    site = site_of(node, runs.model)
    seq_len = runs.prep.clean_tokens.shape[1]
    pos = positions_of(node, seq_len, named)
    name = site.hook.name
    if direction == "noise":
        value = runs.corrupted_value(name, pos)
        base_pos = pos
    else:
        value = runs.clean[name][:, pos]
        base_pos = [p + runs.prep.offset for p in pos]
    if site.head is not None:
        value = value[:, :, site.head]
    return PatchOp(site.hook, tuple(base_pos), value, site.head)


def activation_patch(
    model: Any,
    tokens: Any,  # validated by check_tokens
    nodes: Optional[Sequence[Union[Node, str]]] = None,
    corruption: Any = "shift",  # a registry name or a corruption; validated by get_corruption
    metric: Any = None,  # validated by check_metric with a clear message
    *,
    direction: str = "noise",
    min_signal: float = 0.05,
    bos: Any = None,  # True / False / None; checked by check_bos
    rows_per_forward: Optional[int] = None,
    reference: bool = False,
) -> PatchResult:
    """Patch each node alone and return raw and normalized effects on ``metric``.

    ``nodes`` defaults to :func:`candidate_nodes` (every head and MLP at position 0 and "rest",
    plus the position embedding for learned positions). ``rows_per_forward`` bounds the batch of a
    patched forward (default 8 copies of the prompts). ``reference=True`` uses the slow path.
    ``bos`` is the run's BOS choice, checked against ``tokens`` (the BOS id at position 0 of a
    run that says no BOS is an error, and the reverse); None makes no claim. The same holds for
    :func:`path_patch` and :func:`attribution_patch`.
    """
    tokens, metric, prep = setup(model, tokens, corruption, metric, direction, bos)
    node_list = parse_nodes(nodes if nodes is not None else candidate_nodes(model))
    named = sorted({n.pos for n in node_list if n.pos != REST}) or [0]
    sites = [site_of(n, model) for n in node_list]
    runs = Runs(model, prep, metric, {s.hook.name for s in sites})

    ops = [node_op(runs, n, direction, named) for n in node_list]
    corrupted = corrupted_metric(runs, ops, rows_per_forward)
    values = patch_each(runs, ops, direction, rows_per_forward, reference)
    raw = {n.name: v for n, v in zip(node_list, values)}
    return make_result("activation", runs, raw, corrupted, direction, min_signal)
