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

import torch
from torch import Tensor

from p0circuit import hooks
from p0circuit.errors import BadInputError, ConfigError
from p0circuit.patching.corruptions import Corruption, Prepared, get_corruption
from p0circuit.patching.engine import PatchOp, run_groups, run_groups_reference
from p0circuit.patching.runs import Runs, rows_per, setup
from p0circuit.patching.metrics import PatchMetric, RunView, default_metric
from p0circuit.patching.result import PatchResult, normalize
from p0circuit.patching.sites import candidate_nodes, positions_of, site_of
from p0circuit.tokens import check_tokens
from p0circuit.types import REST, Node
from p0circuit.validation import check_model, check_metric, parse_nodes


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
    tokens: Tensor,
    nodes: Optional[Sequence[Union[Node, str]]] = None,
    corruption: Union[str, Corruption] = "shift",
    metric: Optional[PatchMetric] = None,
    *,
    direction: str = "noise",
    min_signal: float = 0.05,
    rows_per_forward: Optional[int] = None,
    reference: bool = False,
) -> PatchResult:
    """Patch each node alone and return raw and normalized effects on ``metric``.

    ``nodes`` defaults to :func:`candidate_nodes` (every head and MLP at position 0 and "rest",
    plus the position embedding for learned positions). ``rows_per_forward`` bounds the batch of a
    patched forward (default 8 copies of the prompts). ``reference=True`` uses the slow path.
    """
    tokens, metric, prep = setup(model, tokens, corruption, metric, direction)
    node_list = parse_nodes(nodes if nodes is not None else candidate_nodes(model))
    named = sorted({n.pos for n in node_list if n.pos != REST}) or [0]
    sites = [site_of(n, model) for n in node_list]
    runs = Runs(model, prep, metric, {s.hook.name for s in sites})

    ops = [node_op(runs, n, direction, named) for n in node_list]
    if prep.ablation is None:
        corrupted = runs.metric_of(runs.corr, runs.corr_logits, prep.offset)  # type: ignore[arg-type]
    else:
        corrupted = _run([ops], runs, prep, metric, 0, rows_per_forward, reference)[0]
    if direction == "noise":
        base_cache, base_tokens, p0 = runs.clean, prep.clean_tokens, 0
    else:
        base_cache, base_tokens, p0 = runs.corr, prep.corrupt_tokens, prep.offset  # type: ignore[assignment]
    groups = [[op] for op in ops]
    if reference:
        values = run_groups_reference(model, base_tokens, groups, metric, p0)
    else:
        values = run_groups(model, base_cache, groups, metric, p0, rows_per(rows_per_forward, tokens))
    raw = {n.name: v for n, v in zip(node_list, values)}
    norm, signal, msg = normalize(runs.clean_metric, corrupted, raw, direction, min_signal)
    return PatchResult(
        method="activation", corruption=prep.name, metric=metric.name, direction=direction,
        clean_metric=runs.clean_metric, corrupted_metric=corrupted, raw=raw, normalized=norm,
        signal=signal, message=msg, settings={"corruption_params": dict(prep.params), "n_prompts": int(tokens.shape[0]),
                                              "seq_len": int(tokens.shape[1])},
    )


def _run(groups: list, runs: Runs, prep: Prepared, metric: PatchMetric, p0: int, rows: Optional[int],
         reference: bool) -> list[float]:
    if reference:
        return run_groups_reference(runs.model, prep.clean_tokens, groups, metric, p0)
    return run_groups(runs.model, runs.clean, groups, metric, p0, rows_per(rows, prep.clean_tokens))
