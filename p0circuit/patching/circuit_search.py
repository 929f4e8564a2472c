"""Faithful circuits: a node set that, kept clean with every other candidate corrupted, reproduces the
clean behaviour, found by pruning in the manner of ACDC (Conmy et al., 2023, "Towards Automated
Circuit Discovery for Mechanistic Interpretability").

A list of single-node effects is a screen, not a circuit: nodes that matter only together (a
detector and the amplifier that reads it) or that cancel each other are invisible to it. The search
starts from every candidate kept (faithfulness 1 by definition). First the weakest candidates (by
single effect) are dropped together: as many as keep the faithfulness within ``tolerance`` of 1,
found by a binary search over how many (about log2(candidates) evaluations; a real model's hundreds of
candidates are mostly near zero). The rest are visited from the last layer back to the first (within a
layer, the weakest single effect first), as ACDC does: a node is dropped (corrupted from then on) when
dropping it moves the faithfulness by at most ``tolerance`` and leaves it within ``1 - target`` of 1.
They are tried :data:`CHUNK` at a time first (a run of nodes that together move nothing is dropped in
one evaluation), and a group that moves too much is split in halves down to single nodes, so every
node that matters is still judged alone. What remains is measured three ways, each a share of the
clean-to-corrupted change ``M_clean - M_corrupted`` of the metric:

* ``faithfulness`` (noising the complement): the clean run with every candidate outside the circuit
  corrupted, ``(M - M_corrupted) / (M_clean - M_corrupted)``;
* ``denoising`` (denoising the circuit): the corrupted run with the circuit's nodes set to their clean
  values, the same share; not defined for an ablation (``zero``, ``pos_mean``: no corrupted run
  to restore into);
* ``completeness``: the share of the change that corrupting the circuit alone removes,
  ``(M_clean - M) / (M_clean - M_corrupted)`` with only the circuit corrupted.

``faithful`` is true when the circuit is within ``max_size`` nodes and ``faithfulness`` (and
``denoising``, where defined) reach ``target``; otherwise the record says which fell short.
"""

import weakref
from typing import Any, Callable, Optional, Sequence

import torch

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError
from p0circuit.core.circuits import searched_circuit
from p0circuit.core.searches import NodeSearch  # noqa: F401 (its record, re-exported here)
from p0circuit.core.types import Circuit, Node
from p0circuit.patching.engine import run_groups, start_layer
from p0circuit.core.io import strict
from p0circuit.patching.setup import Setup
from p0circuit.patching.job import PatchJob
from p0circuit.patching.ops import node_op
from p0circuit.patching.result import PatchResult, finite
from p0circuit.patching.sites import named_positions, site_of

TARGET = 0.9
"""Share of the clean-to-corrupted change a faithful circuit keeps (MIB and ACDC report 0.9 and above)."""
TOLERANCE = 0.05
"""Largest change of the faithfulness one dropped node may cause (ACDC's threshold tau, as a share of the change;
the total drift is bounded apart, by ``1 - target``)."""
CHUNK = 4
"""Candidates tried together after the bulk drop (then in halves, down to one): see ``acdc_prune`` in
:func:`faithful_circuit`."""
MAX_SIZE = 20
"""Nodes a reported circuit may hold and still count as found."""


def _share(value: float, clean: float, corrupted: float) -> float:
    return (value - corrupted) / (clean - corrupted)


def acdc_prune(live: Sequence[Any], strength: Callable[[Any], float], layer: Callable[[Any], int],
          share: Callable[[list[Any]], float], target: float, tolerance: float,
          on_bulk: Optional[Callable[[list[Any]], None]] = None) -> tuple[list[Any], float, int]:
    """ACDC-style pruning of the candidates ``live`` (nodes or edges), as the module docstring says:
    ``share(dropped)`` is the faithfulness with ``dropped`` corrupted, ``strength`` a candidate's
    single effect (weakest go first), ``layer`` where it sits (the last layer is visited first).
    ``on_bulk(dropped)`` is told what the bulk drop took (every later ``dropped`` holds it).
    Returns (what is kept, in ``live``'s order; its faithfulness; how many the bulk drop took)."""
    kept = set(live)
    current = first = share([])  # every candidate kept: 1 for nodes; for edges, the node circuit's faithfulness

    def fits(value: float, before: float) -> bool:
        """ACDC's rule: the drop moves the faithfulness by at most ``tolerance``, and it stays within ``1 - target`` of 1."""
        return abs(value - before) <= tolerance and abs(value - 1.0) <= 1.0 - target

    # the bulk drop: the largest count m of the weakest candidates that can go at once (binary search;
    # m = 0 always can, and only an m that was evaluated is taken)
    weakest = sorted(live, key=strength)
    low, high, bulk = 0, len(weakest) + 1, first
    while high - low > 1:
        mid = (low + high) // 2
        value = share(weakest[:mid])
        if fits(value, first):
            low, bulk = mid, value
        else:
            high = mid
    if low:
        kept, current = set(weakest[low:]), bulk
        if on_bulk is not None:
            on_bulk(weakest[:low])
    order = sorted(kept, key=lambda x: (-layer(x), strength(x)))  # last layer first, weakest first

    def visit(group: list[Any]) -> None:
        """Drop ``group`` at once if that keeps the faithfulness within ``tolerance`` (and the bound);
        else its halves, in order, down to single candidates: a run that changes nothing costs one
        evaluation instead of one each, and a candidate that matters is still tried alone."""
        nonlocal kept, current
        trial = kept - set(group)
        value = share([x for x in live if x not in trial])
        if fits(value, current):
            kept, current = trial, value
        elif len(group) > 1:
            visit(group[:len(group) // 2])
            visit(group[len(group) // 2:])

    for start in range(0, len(order), CHUNK):
        visit(order[start:start + CHUNK])
    return [x for x in live if x in kept], current, low


class Noising:
    """The metric of the clean run of ``job`` with a set of nodes corrupted (``noising(dropped)``).

    After :meth:`fix` (the bulk drop), a clean run with those nodes corrupted is the base: an evaluation
    whose set holds them runs only from its own other nodes' first block, and the fixed nodes in that
    block and after are patched again there (the blocks before it come from the base run, which holds
    the rest of them). Any other set runs from the clean run."""

    def __init__(self, job: PatchJob, named: Sequence[int]) -> None:
        self.job, self.named = job, named
        self.fixed: set[Node] = set()
        self.based = job.clean_base()
        self._ops: dict[Node, Any] = {}

    def fix(self, nodes: Sequence[Node]) -> None:
        self.fixed = set(nodes)
        self.based = self.job.clean_base([self._op(n) for n in nodes])

    def _op(self, node: Node) -> Any:
        """A node's patch op, built once: every evaluation of the search reuses it (ops are not changed)."""
        if node not in self._ops:
            self._ops[node] = node_op(self.job, node, "noise", self.named)
        return self._ops[node]

    def __call__(self, dropped: Sequence[Node]) -> float:
        job, rows = self.job, self.job.rows_per_forward
        if not dropped:
            return job.clean_metric
        with torch.no_grad():
            if not self.fixed or not self.fixed <= set(dropped):
                return run_groups(job.clean_base(), [[self._op(n) for n in dropped]], rows)[0]
            ops = [self._op(n) for n in dropped if n not in self.fixed]
            if not ops:
                return self.based.value()
            start = start_layer(ops)
            ops += [op for n in self.fixed for op in [self._op(n)] if op.hook.layer >= start]
            return run_groups(self.based, [ops], rows)[0]


_MEMOS: dict[int, tuple[Any, dict[Any, float]]] = {}
"""Per searched result (by ``id``, dropped with it): a weak reference to the setup it was searched on and every
evaluation of its searches, so that a search of the same result at another target or tolerance reruns nothing an
earlier one ran. Every search checks the weights first (:func:`searched`), so a store never outlives the model it
was measured on."""


def _memo(result: PatchResult, setup: Setup) -> dict[Any, float]:
    """The evaluations of earlier searches of ``result`` on ``setup`` (a fresh store for another setup). A value is
    reused only under the same key: the same nodes corrupted, in the same order, on the same fixed base
    (:class:`Noising`), so it is the number the evaluation would give again, bit for bit. The setup is held weakly
    (a result searched with ``setup=`` keeps no model alive)."""
    held = _MEMOS.get(id(result))
    if held is None or held[0]() is not setup:
        if held is None:
            weakref.finalize(result, _MEMOS.pop, id(result), None)
        held = _MEMOS[id(result)] = (weakref.ref(setup), {})
    return held[1]


def check_bounds(target: float, tolerance: float) -> None:
    """Refuse a ``target`` or ``tolerance`` outside (0, 1], before any work."""
    for name, value in (("target", target), ("tolerance", tolerance)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise BadInputError(f"{name} must be a number in (0, 1], got {value!r}")


RECORDED = ("model", "corruption_params", "corruption_class", "metric_params", "metric_class", "bos", "tokens", "dtype")
"""The parts of a setup's description a result records in its settings (beside its corruption and metric names)."""


def searched(result: Any, setup: Optional[Setup], what: str) -> Setup:
    """The setup a search of ``result`` runs on: the one the result carries, or ``setup`` for a result that
    carries none (rebuilt from its saved numbers, or unpickled: a result is pickled without its model); refused before any work when the two differ (or ``setup`` differs from what the result
    recorded), naming what differs."""
    if not isinstance(result, PatchResult):
        raise BadInputError(f"{what} takes the PatchResult to search (from activation_patch; its model, tokens, BOS "
                            f"choice, corruption and metric come with it), got {type(result).__name__}")
    if result.setup is not None:  # the weights its runs read, unchanged: checked before any work
        return result.setup.same_as(setup, "the result").unchanged()
    if setup is None:
        raise BadInputError("this result carries no setup (rebuilt from saved numbers, or unpickled?): pass setup=p0.Setup.of(model, "
                            "tokens, corruption=..., metric=..., bos=...) with what it was computed with")
    mine = setup.describe()
    recorded = {"corruption": result.corruption, "metric": result.metric,
                **{k: result.settings[k] for k in RECORDED if k in result.settings}}
    differ = [f"{k}: result {v!r:.100}, setup {mine[k]!r:.100}" for k, v in recorded.items() if strict(v) != strict(mine[k])]
    if differ:
        raise BadInputError(f"the setup is not the one the result was computed with ({'; '.join(differ)}): pass that one")
    return setup.unchanged("the setup was made", "make it again (p0circuit.Setup.of(...)) on the model as it is now")


def search_job(setup: Setup) -> PatchJob:
    """The noising job of a search, on the fast path whatever the result's (a model's own hooks refused);
    :meth:`PatchJob.cache` it with the hooks it reads, then :func:`same_clean`."""
    return PatchJob.of(setup.but(direction="noise", reference=False))


def same_clean(job: PatchJob, result: PatchResult) -> None:
    """Refuse a search whose cached job no longer gives the result's clean metric: a second look, after the
    weights' digest (:meth:`Setup.unchanged`, in :func:`searched`), at what else a forward depends on (the
    model's configuration, a hook)."""
    clean, corrupted = result.clean_metric, result.corrupted_metric
    bound = max(1e-4 * max(abs(clean), abs(corrupted)), 1e-3 * abs(clean - corrupted), 1e-12)
    if abs(job.clean_metric - clean) > bound:
        raise BadInputError(f"the model now gives a clean metric of {job.clean_metric:.6g}, the result's is {clean:.6g}: "
                            "the model (its weights or hooks) changed since the result was computed; patch again")


@entry_point
def faithful_circuit(
    result: PatchResult,
    *,
    setup: Optional[Setup] = None,
    target: float = TARGET,
    tolerance: float = TOLERANCE,
    max_size: int = MAX_SIZE,
    require_denoising: bool = True,
) -> Circuit:
    """The node circuit of an activation-patching ``result``, pruned as the module docstring says, on the
    setup the result carries (``setup``: only for a result read back from a file, or to assert which one). It is
    the one :class:`~p0circuit.Circuit`: its nodes, every candidate's normalized effect (``node_effects``), the
    search's numbers in its settings, and ``circuit.search``, the typed :class:`NodeSearch` (faithfulness,
    denoising, completeness, faithful, why, candidates, evaluations, the nodes strongest first), and
    ``circuit.result``, the result it was found on (:func:`~p0circuit.faithful_edges` reads both).
    ``require_denoising=False``: ``faithful`` asks faithfulness alone (denoising is still measured and recorded),
    for a corruption whose corrupted run holds a rival of what the metric measures that no circuit restored at
    the clean positions removes (``shift`` and the attention to P0: the shifted run's own first token is a sink
    too, and takes about half of the attention from a restored one).

    Example::

        >>> import p0circuit as p0
        >>> pm = p0.build_planted()                          # the planted model: its circuit is in its weights
        >>> tokens = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
        >>> found = p0.faithful_circuit(p0.activation_patch(pm.model, tokens, corruption="shift", metric="norm_ratio:1"))
        >>> found.search.nodes, found.search.faithful   # the search's record: strongest first, and whether it holds
        (['A0.H0@0', 'M0@0', 'M1@0'], True)
        >>> sorted(found.node_names) == sorted(found.search.nodes)   # the one Circuit, as every other search returns
        True
    """
    setup = searched(result, setup, "faithful_circuit")
    if result.level != "node":
        raise BadInputError("faithful_circuit needs a node-level PatchResult (from activation_patch), got one of edges")
    if not result.signal:
        raise BadInputError(f"this result has no signal ({result.message}): there is no change for a circuit to keep")
    check_bounds(target, tolerance)
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise BadInputError(f"max_size must be an int >= 1, got {max_size!r}")
    model = setup.model
    noise = search_job(setup)
    effects = result.strengths()  # a node a screen left unexamined is a candidate too (ranked by its estimate)
    items = [Node.parse(n) for n in effects]
    live = [n for n in items if noise.reaches(site_of(n, model).hook)]
    named = named_positions(items)
    noise.cache({site_of(n, model).read.name for n in live})
    same_clean(noise, result)
    clean, corrupted = result.clean_metric, result.corrupted_metric
    rows = noise.rows_per_forward
    evaluations = 0

    noising = Noising(noise, named)
    memo, reused = _memo(result, setup), 0

    def noised(dropped: Sequence[Node]) -> float:
        """The metric of the clean run with ``dropped`` corrupted (a NaN or inf refused, naming the step); one an
        earlier search of this result evaluated the same way (the same set, on the same fixed base) is reused."""
        nonlocal evaluations, reused
        evaluations += 1
        key = (frozenset(noising.fixed), tuple(dropped))  # ordered: an expert's patch adds, and order can round
        if key in memo:
            reused += 1
            return memo[key]
        memo[key] = finite(noising(dropped), setup, f"corrupting {len(dropped)} of {len(live)} candidate nodes "
                                                    f"together (faithful_circuit's evaluation {evaluations})")
        return memo[key]

    kept, faithfulness, bulk = acdc_prune(live, lambda n: effects[n.name], lambda n: n.layer,
                                     lambda dropped: _share(noised(dropped), clean, corrupted), target, tolerance,
                                     noising.fix)
    circuit = sorted(kept, key=lambda n: -effects[n.name])
    completeness = 1.0 - _share(noised(circuit), clean, corrupted)
    denoising = None
    if not noise.prep.is_ablation:
        evaluations += 1
        key = ("denoise", frozenset(circuit))
        if key in memo:
            reused += 1
        else:
            restore = PatchJob.of(setup.but(direction="denoise", reference=False))
            restore.cache({site_of(n, model).read.name for n in live})
            with torch.no_grad():
                value = (run_groups(restore.base(), [[node_op(restore, n, "denoise", named) for n in circuit]], rows)[0]
                         if circuit else corrupted)
            memo[key] = finite(value, setup, f"restoring the circuit's {len(circuit)} nodes into the corrupted run")
        denoising = _share(memo[key], clean, corrupted)
    short = []
    if len(circuit) > max_size:
        short.append(f"{len(circuit)} nodes, more than the budget of {max_size}")
    if faithfulness < target:
        short.append(f"faithfulness {faithfulness:.3f} < {target}")
    if denoising is not None and denoising < target and require_denoising:
        short.append(f"denoising the circuit restores {denoising:.3f} < {target} of the change")
    search = NodeSearch(
        nodes=[n.name for n in circuit], candidates=len(live), faithfulness=faithfulness, denoising=denoising,
        completeness=completeness, faithful=not short, why="; ".join(short),
        settings={"target": target, "tolerance": tolerance, "max_size": max_size, "require_denoising": require_denoising,
                  "corruption": result.corruption,
                  "metric": result.metric, "setup": setup.describe(), "clean": clean, "corrupted": corrupted,
                  "evaluations": evaluations, "reused": reused, "bulk_dropped": bulk,
                  "search": f"the {bulk} weakest candidates dropped at once (binary search), then ACDC-style pruning of "
                            f"the rest: last layer first, weakest single effect first, groups of {CHUNK} split in "
                            "halves when they move too much"})
    return searched_circuit(search.to_dict(), None, result.normalized, search=search, result=result)
