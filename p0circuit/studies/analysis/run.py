"""``p0circuit.analyze``: the paper's questions for one model in one call, resumable.

The analysis is a list of steps, each saved to ``DIR/analysis.state.json`` the moment it ends, so
an interrupted analysis resumes at the first step not done (the state records the model and the
settings, and refuses to mix runs). The plan:

1. per BOS setting (without, and with the model's start token when it has one): the sink report;
2. per onset of the P0 norm ratio (and the strongest delimiter sink, e.g. Gemma 3's first comma):
   activation patching of the nodes up to the onset with the corruption that fits the setting
   (``shift`` without BOS, ``swap`` of the BOS token with it) and their faithfulness curve; path
   patching between the nodes kept; the neurons writing the onset's massive dimension;
3. per BOS setting, at the first onset: every corruption side by side, and other prompt lengths.
"""

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from p0circuit.core.defaults import KEEPS, SINK_EPS
from p0circuit.studies.analysis import cost, elsewhere, steps
from p0circuit.studies.analysis.sensitivity import TARGETS, first_onsets, sweeps
from p0circuit.studies.analysis.sink_circuit import sink_circuit
from p0circuit.studies.analysis.spread import scan_lengths, spread
from p0circuit.studies.experiments.detection import diagonal_attention
from p0circuit.studies.experiments.first_tokens import first_token_map
from p0circuit.studies.experiments.reads import CONTROL, first_readers, sink_reads
from p0circuit.studies.experiments.special_tokens import candidates as special_candidates, special_tokens
from p0circuit.studies.experiments.super_weights import super_weights, weight_outliers
from p0circuit.studies.findings import Control, Unmeasured
from p0circuit.studies.analysis.eta import Bar
from p0circuit.studies.analysis.records import (
    ABSENT, SCHEMA_VERSION, UNIT, AnalysisRecord, OnsetRow, Sensitivity, SinkSummary, Skipped, StateFile, StateHeader,
)
from p0circuit.studies.analysis.setting import Setting
from p0circuit.studies.analysis.settings import STATE, AnalysisSettings, check_bos_token, precheck, read_state
from p0circuit.studies.analysis.verdict import SETTINGS, verdict
from p0circuit.studies.analysis.write import markdown, write_all
from p0circuit.core.errors import BadInputError, ConfigError, P0CircuitError, warn_user
from p0circuit.core.args import entry_point
from p0circuit.core.io import clear_stale, out_dir as checked_out, strict, write_atomic
from p0circuit.core import memory, threads
from p0circuit.core.clock import import_seconds
from p0circuit.patching import NormRatio, work
from p0circuit.patching.order import hook_order
from p0circuit.patching.corruptions import Swap, get_corruption
from p0circuit.patching.setup import Setup
from p0circuit.core.entries import check_model_entry
from p0circuit.models.resolve import load_model
from p0circuit.models.checks import checked
from p0circuit.models.planted import PlantedModel
from p0circuit.core.progress import tqdm
from p0circuit.models.tokens import BOS_ATTR, bos_label, prepend_id, set_bos

MASSIVE_EDITED = 8
"""Massive dimensions at an onset that the ``massive_removed`` edit removes at most (the strongest first)."""


@dataclass
class Analysis:
    """What :func:`analyze` measured: ``record``, the typed :class:`~.records.AnalysisRecord` (its fields are
    ``analysis.json``'s keys, read as attributes: ``result.verdict.claim``, ``result.onsets["without_bos"][0].nodes``);
    ``data``, the same as ``analysis.json``'s JSON object (``result["timing"]["seconds"]``)."""

    record: AnalysisRecord
    """``model``, ``settings``, ``sinks``, ``onsets``, ``variations``, ``verdict``, ``timing``, ``memory``, ... typed all
    the way down (docs/records.md); an attribute of the result that is not its own is read here."""
    out: Optional[Path] = None
    """Where the files were written, if anywhere."""
    reports: dict[str, Any] = field(default_factory=dict, repr=False)
    """The sink reports of this process, by BOS setting (not restored on resume)."""

    @property
    def data(self) -> dict[str, Any]:
        """``analysis.json``'s content (the record's ``to_dict()``, made once: a change to it stays in it, as in a
        dict, and changes neither the record nor the file)."""
        if self.__dict__.get("_data_of") is not self.record:  # (made again when the record is replaced)
            self.__dict__["_data"], self.__dict__["_data_of"] = self.record.to_dict(), self.record
        return self.__dict__["_data"]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __iter__(self) -> Any:
        return iter(self.data)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "record":  # (not during construction or copying)
            raise AttributeError(name)
        try:
            return getattr(self.record, name)
        except AttributeError:
            raise AttributeError(f"an Analysis has no {name!r}: its record's fields are "
                                 f"{AnalysisRecord.keys()}, and it has record, data, out and reports") from None

    def __str__(self) -> str:
        return markdown(self.record)


def fingerprint(tokens: Tensor) -> str:
    """A short hash of a token tensor (the state file checks that resumed prompts are the same)."""
    return hashlib.sha256(tokens.cpu().numpy().tobytes() + str(tuple(tokens.shape)).encode()).hexdigest()[:16]


class _State:
    """The finished steps of one analysis directory, saved after each."""

    def __init__(self, out: Optional[Path], header: StateHeader, resume: bool) -> None:
        self.path = None if out is None else out / STATE
        self.header = header
        self.done: dict[str, Any] = {}
        self.model: Any = None
        self.rows = 0
        """The model and the token rows of the unit forward: each step's work is counted in forwards of them."""
        self.process_peak = 0
        """The process's peak resident memory before the last reset (bytes)."""
        self.run_index = 0
        """Which process of this directory's analysis this is (0: the first; a resume counts on): each step it runs
        records it, so that a resumed run's figures are given per process."""
        self.unit_s = 0.0
        """This process' own unit forward (seconds), recorded with each step it runs."""
        if self.path is not None:
            clear_stale(self.path)  # a save cut short (Ctrl-C, a kill) left a temporary file beside the state
        if self.path is not None and self.path.is_file():
            if resume:
                old = read_state(self.path)  # its schema version checked (records.py)
                if old.header != header:
                    raise ConfigError(
                        f"{self.path.parent} holds an analysis of {old.header.model!r} with other "
                        f"settings or prompts; write to another directory, or pass --fresh (fresh=True in Python) to replace it")
                self.done = dict(old.steps)
                self.run_index = 1 + max((v.get("run", 0) for v in self.done.values()), default=-1)
            else:
                self.path.unlink()

    def keep(self, key: str, seconds: float) -> None:
        """Record a measured time under ``key`` (the unit of the analysis' cost), saved with the steps."""
        self.done[key] = {"value": None, "seconds": seconds}
        self._save()

    def _save(self) -> None:
        if self.path is not None:
            write_atomic(self.path, json.dumps(StateFile(self.header, self.done).to_dict(), allow_nan=False))

    def run(self, key: str, fn: Callable[[], Any], bar: "Bar") -> Any:
        if key not in self.done:
            bar.running(key)
            before = memory.peak()  # the peak so far, kept: the reset below hides it from outside tools too
            if before is not None:
                self.process_peak = max(self.process_peak, before)
            measured = memory.reset_peak()
            threads.adapt()
            t = time.perf_counter()
            with work.Count(self.model) as counted:
                value = strict(fn())
            self.done[key] = {"value": value, "seconds": round(time.perf_counter() - t, 2),
                              "forwards": round(counted.forwards(self.rows), 2),
                              "with_grad": round(counted.with_grad(self.rows), 2),
                              "peak": memory.peak() if measured else None,
                              "run": self.run_index, "unit_s": round(self.unit_s, 4)}
            self._save()
        bar.done(key)
        return copy.deepcopy(self.done[key]["value"])  # callers may change it; the record stays as measured


@dataclass
class _Run:
    """One analysis in progress, what each of its steps reads: the checked model, the settings, the saved state
    (finished steps, resumed) and the progress bar."""

    model: Any
    s: AnalysisSettings
    state: _State
    bar: "Bar"

    def step(self, key: str, fn: Callable[[], Any]) -> Any:
        """Run (or, finished before, restore) the step ``key``, saved as it ends (:meth:`_State.run`)."""
        return self.state.run(key, fn, self.bar)

    def skip(self, key: str) -> None:
        """Credit the bar with a planned step that does not run."""
        self.bar.done(key)


def _gib(n: Optional[float]) -> Optional[float]:
    return None if n is None else round(n / 2**30, 3)


def _memory(model: Any, at_start: Optional[int], state: "_State") -> dict[str, Any]:
    """The model's own size, the process' resident memory when the steps began, each step's peak resident
    memory and the process' peak over its whole life (GiB; the peak is reset before each step,
    :mod:`p0circuit.core.memory`, which hides the earlier peak from outside tools such as ``/usr/bin/time``:
    ``process_peak`` is the one to compare with them). ``None``
    where it cannot be read (not Linux), and for steps restored from a state file written before steps
    recorded their peak; a resumed step keeps the peak of the process that ran it."""
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    now = memory.peak()
    whole = max(state.process_peak, now) if now is not None else None
    return {"weights": _gib(weights), "at_start": _gib(at_start), "process_peak": _gib(whole or None),
            "steps": {k: _gib(v.get("peak")) for k, v in state.done.items() if k != UNIT}}


def _start_token(model: Any, bos_token: Optional[Union[str, int]]) -> tuple[Optional[str], Any]:
    """(why the with-BOS setting cannot run, or None; the BOS attribute to restore afterwards)."""
    previous = getattr(model, BOS_ATTR, None)
    if bos_token is not None:
        set_bos(model, bos_token)
        return None, previous
    try:
        prepend_id(model)
    except BadInputError as err:  # its first clause says why; the fix is the analysis' own (below)
        return str(err).split("; ")[0], previous
    return None, previous


def _p0_onsets(summary: SinkSummary) -> list[dict[str, Any]]:
    """Every onset of the P0 norm ratio, in layer order, with its ratio."""
    return [{"layer": layer, "where": "P0", "ratio": round(ratio, 2)} for kind, layer, ratio in summary.norm_stages
            if kind == "onset"]


def _onset_plan(summary: SinkSummary, s: AnalysisSettings) -> list[dict[str, Any]]:
    """The onsets of one BOS setting: P0's (at most ``max_onsets``; the first marked ``first``), then the sink states
    away from position 0 (:func:`.elsewhere.plan`: at most ``max_sinks``, strongest first)."""
    p0 = [{k: v for k, v in o.items() if k != "ratio"} for o in _p0_onsets(summary)[:s.max_onsets]]
    if p0:
        p0[0]["first"] = True
    return p0 + elsewhere.plan(summary, s)


def _below(summary: SinkSummary, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks below the first P0 onset that another onset line of the sensitivity table makes the onset
    (:data:`.sensitivity.ONSET_LINES`): each patched as an onset there, for the table (cheaper than the onset)."""
    first = next((o["layer"] for o in plan if o["where"] == "P0"), None)
    if first is None:
        return []
    blocks = sorted({b for b in first_onsets(summary.norm_ratio).values() if b is not None and b < first})
    return [{"layer": b, "where": "P0", "below": True} for b in blocks]


def _left_out(model: Any, sinks: dict[str, Union[SinkSummary, Skipped]], s: AnalysisSettings
              ) -> dict[str, list[dict[str, Any]]]:
    """Per BOS setting, the P0 onsets past ``max_onsets`` that were not patched, each with the forwards of the
    batch the cost model predicts its steps would take (:func:`.cost.step_costs`)."""
    out = {}
    for tag, summary in sinks.items():
        if not isinstance(summary, SinkSummary):
            continue
        later = _p0_onsets(summary)[s.max_onsets:]
        for o in later:
            cands = len(steps.onset_nodes(model, o["layer"], get_corruption("shift")))
            costs = cost.step_costs(model, o["layer"], cands, s, steps.SCREEN_EXPECTED, 0, False)
            o["predicted_forwards"] = round(sum(costs.values()), 1)
        if later:
            out[tag] = later
    return out


@entry_point
def analyze(
    model: Any, *, out: Optional[Union[str, Path]] = None, entry: Optional[str] = None,
    bos_token: Optional[Union[str, int]] = None, resume: bool = True, progress: bool = True,
    settings: Optional[AnalysisSettings] = None, **overrides: Any,
) -> Analysis:
    """Measure the P0 sink of ``model`` and its circuit, with and without BOS (see the module docstring).

    ``model``: a ``HookedTransformer``, a :class:`~p0circuit.models.planted.PlantedModel` (its ground truth is
    recorded beside the findings) or a model entry (``"real:smollm2"``, ``"planted:rope"``, ...).
    ``out``: a directory for ``analysis.json``, ``analysis.md`` and ``report.html`` (and the state
    that lets an interrupted analysis resume). ``entry``: the model's entry (``"real:smollm2"``), the label the record
    keeps when ``model`` is an object (checked as an entry). ``bos_token``: the start token of the with-BOS
    setting when the tokenizer's BOS is not one (SmolLM2: ``"<|endoftext|>"``). Settings are an
    :class:`AnalysisSettings` or its fields as keywords (``n_prompts=8``)."""
    if settings is not None and overrides:
        raise BadInputError("pass settings=AnalysisSettings(...) or its fields as keywords, not both")
    try:
        settings = settings or AnalysisSettings(**overrides)
    except TypeError as err:
        raise BadInputError(f"analyze: {err}; the settings are {list(AnalysisSettings.__dataclass_fields__)}") from None
    check_bos_token(bos_token, settings)
    out_dir = None if out is None else checked_out("analyze", out)  # the arguments' own errors, before any load
    if not isinstance(model, (str, PlantedModel, HookedTransformer)):
        raise BadInputError(f"analyze needs a HookedTransformer or a model entry string (or a PlantedModel), got "
                            f"{type(model).__name__}")
    if entry is not None:
        check_model_entry(entry)  # the label the record keeps must name a model
    label = entry
    truth = None
    load_s = None  # given a model object: no load to time
    if isinstance(model, str):
        precheck(out_dir, entry or model, settings, resume)
        loading = time.perf_counter()
        resolved = load_model(model)
        load_s = round(time.perf_counter() - loading, 2)
        label, model, truth = entry or model, resolved.model, resolved.truth
        bos_token = bos_token if bos_token is not None else resolved.start_token
    if isinstance(model, PlantedModel):  # a plant: its ground truth goes into the record
        label, model, truth = label or f"planted ({model.spec.key}-keyed)", model.model, model.truth

    if not isinstance(model, HookedTransformer):
        raise BadInputError(f"analyze needs a HookedTransformer or a model entry string, got {type(model).__name__}")
    label = label or str(model.cfg.model_name)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    no_bos_reason, previous = _start_token(model, bos_token) if True in settings.bos else (None, None)
    try:
        # the model is checked once here and carried as checked through every step (none changes a weight);
        # the caller's grad mode is left as it was (the neuron screen enables grad itself)
        with torch.no_grad(), checked(model):
            return _analyze(model, label, settings, out_dir, resume, progress, no_bos_reason, truth, load_s)
    finally:
        if previous is None and hasattr(model, BOS_ATTR) and bos_token is not None:
            delattr(model, BOS_ATTR)
        elif previous is not None:
            setattr(model, BOS_ATTR, previous)


def _analyze(model: Any, label: str, s: AnalysisSettings, out: Optional[Path], resume: bool, progress: bool,
             no_bos_reason: Optional[str], truth: Any, load_s: Optional[float]) -> Analysis:
    """The analysis itself, once :func:`analyze` has checked its arguments, loaded and checked the model and set its
    start token (the caller holds ``torch.no_grad()`` and the model's check around it).

    In order: the prompts of each BOS setting measured; the saved state of ``out`` read (its finished steps
    reused when ``resume`` and the settings and prompts match); one warm-up forward and the model's one-time
    trace, then one timed forward of the batch, the unit every step's cost is predicted and counted in (a resumed
    analysis keeps its first process's unit); the progress bar planned from the cost model. Then the steps, each
    saved to the state as it finishes: each setting's sink summary and its onset plan, the first-token maps at the
    P0 onsets' layers, the weights into the massive dimensions, and per setting each planned onset patched
    (nodes, circuit, edges, neurons, the P0 studies), the blocks below the first P0 onset for the sensitivity table,
    the variations, controls and spread over prompts at the first P0 onset, the special tokens and the
    sensitivity. Last, the record assembled (verdict, timing, memory, ground truth), checked as an
    :class:`~.records.AnalysisRecord` and written to ``out`` (``analysis.json``, ``analysis.md``, ``report.html``).

    ``model``: the checked ``HookedTransformer``. ``label``: the name the record keeps (the entry, or the model's
    name). ``s``: the settings. ``out``: the output directory (made by the caller), or None to write nothing and
    keep no state. ``resume``: reuse the finished steps saved in ``out``. ``progress``: show the progress bar.
    ``no_bos_reason``: why the with-BOS setting cannot run (the model has no start token), or None: that setting
    is then recorded as skipped with this reason, and an analysis that asked only for it is refused
    (:class:`BadInputError`). ``truth``: a planted model's ground-truth circuit, or None. ``load_s``: the seconds
    loading the model took, or None when the caller passed a model object.
    """
    tags = [b for b in s.bos if not (b and no_bos_reason)]
    if not tags:
        raise BadInputError(f"nothing to measure: only the with-BOS setting was asked for, and {no_bos_reason}: "
                            "choose the token to prepend (--bos-token TOKEN on the command line, bos_token= in Python), "
                            "or measure without BOS too (--bos both, or bos=(False, True))")
    setting = {b: Setting(model, s, b) for b in tags}
    tokens = {b: setting[b].prompts() for b in tags}
    header = StateHeader(model=label, settings=json.loads(json.dumps(asdict(s))),
                         prompt_source=Setting(model, s, False).describe().split(" x ")[0],
                         prompts={SETTINGS[b]: fingerprint(t) for b, t in tokens.items()})
    state = _State(out, header, resume)
    first = tokens[tags[0]]
    state.model, state.rows = model, first.numel()
    at_start = memory.resident()  # the model loaded, before any step
    threads.adapt()  # a first look at the machine ...
    model(first)  # a first forward pays one-off costs (allocations, lazy set-up) that would inflate the unit
    hook_order(model)  # the model's one-time trace (a tenth of a forward), here: no step's count depends on it
    threads.adapt()  # ... and a second: one thread for the unit and what follows if other processes are busy
    with threads.Contention() as contention:
        t = time.perf_counter()
        model(first)  # one forward of the batch, timed in this process: the unit of the steps it runs
        state.unit_s = time.perf_counter() - t
    if contention.busy:  # the cost model's seconds assume the forward's speed holds; say why it may not
        warn_user(contention.warning("the analysis' unit forward"))
    if UNIT in state.done:  # a resumed analysis: the predictions keep the unit of its first process
        forward_s = state.done[UNIT]["seconds"]
    else:
        forward_s = state.unit_s
        state.keep(UNIT, forward_s)
    started = time.perf_counter()
    bar = Bar(tqdm(total=None, desc="analyze", unit=" forwards", disable=not progress, mininterval=0.5,
                   bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt}{unit} [{elapsed}{postfix}]"), forward_s)
    run = _Run(model, s, state, bar)
    sinks: dict[str, Any] = {}
    first_tokens: dict[str, Any] = {}
    weights: Any = None
    onsets: dict[str, Any] = {}
    variations: dict[str, Any] = {}
    controls: dict[str, Any] = {}
    spreads: dict[str, Any] = {}
    sensitivity: dict[str, Any] = {}
    special: dict[str, Any] = {}
    reports: dict[str, Any] = {}
    with threads.Contention() as during:  # the other processes' cores while the steps run
        try:  # (the bar's thread stops in the finally below, whatever happens from here)
            bar.plan({f"{SETTINGS[b]}/sinks": cost.SINK for b in tags}, final=False)  # the rest is planned from the sinks
            for b in tags:
                def sink_step(b: bool = b) -> dict[str, Any]:
                    reports[SETTINGS[b]], summary = steps.sinks(setting[b], tokens[b])
                    return summary
                sinks[SETTINGS[b]] = SinkSummary.from_dict(state.run(f"{SETTINGS[b]}/sinks", sink_step, bar),
                                                           "the sink summary")
            if no_bos_reason and True in s.bos:
                sinks[SETTINGS[True]] = Skipped(skipped=no_bos_reason)
            plans = {b: _onset_plan(sinks[SETTINGS[b]], s) for b in tags}
            bar.plan(*_costs(model, plans, s))
            reference = tokens[False] if False in tokens else Setting(model, s, False).prompts()
            first_tokens = {str(l): state.run(f"first_tokens@L{l}", lambda l=l: _measured(lambda: first_token_map(
                model, reference, l, threshold=s.norm_threshold, most=_first_token_count(plans, l, s), seed=s.seed,
                margin=s.first_tokens_margin)), bar)
                for l in _p0_layers(plans)}
            massive = sorted({d.dim for sk in sinks.values() if isinstance(sk, SinkSummary) for d in sk.massive_dims})
            weights = state.run("weights", lambda: _weights(model, massive), bar)
            for b in tags:
                tag = SETTINGS[b]
                onsets[tag] = [_onset(run, setting[b], tokens[b], o, sinks[tag]) for o in plans[b]]
                p0_onsets = [o for o in onsets[tag] if o["where"] == "P0"]
                below = [_onset(run, setting[b], tokens[b], o, sinks[tag]) for o in _below(sinks[tag], plans[b])]
                if p0_onsets:
                    chosen = p0_onsets[0].get("corruption") or ("swap" if b else "shift")
                    variations[tag] = _variations(run, setting[b], p0_onsets[0], chosen)
                    controls[tag] = _controls(model, p0_onsets[0], variations[tag])
                    if s.spread_prompts:
                        scan = b == tags[0]  # the length scan once, in the first setting (without BOS where measured)
                        spreads[tag] = state.run(f"{tag}/spread@L{p0_onsets[0]['layer']}", lambda b=b, scan=scan: _measured(
                            lambda: _spread(setting[b], p0_onsets[0], scan)), bar)
                special[tag] = state.run(f"{tag}/special", lambda b=b: _special(setting[b], tokens[b]), bar)
                rows = {o["layer"]: o for o in p0_onsets + below}
                typed = {layer: OnsetRow.from_dict(row, "an onset row") for layer, row in rows.items()}
                first_row = typed[p0_onsets[0]["layer"]] if p0_onsets else None
                sensitivity[tag] = Sensitivity(sweeps=sweeps(sinks[tag], first_row, typed, header.settings),
                                               rows=[typed[o["layer"]] for o in below]).to_dict()
        finally:
            bar.close()
    fields = dict(  # the keys are the record's fields (records.py), read back typed: each onset row as an OnsetRow
        model=label, settings=header.settings, prompt_source=header.prompt_source,
        n_layers=int(model.cfg.n_layers),
        n_heads=int(model.cfg.n_heads), sinks={tag: sk.to_dict() for tag, sk in sinks.items()},
        onsets=onsets, variations=variations,
        verdict=verdict(sinks, {tag: [OnsetRow.from_dict(o, "an onset row") for o in rows] for tag, rows in onsets.items()},
                        s.threshold, line=s.norm_threshold).to_dict(),
        timing={"seconds": round(sum(v["seconds"] for k, v in state.done.items() if k != UNIT), 1),
                "this_call": round(time.perf_counter() - started, 1), "forward_s": round(state.unit_s, 4),
                "import_s": import_seconds(), "load_s": load_s,
                "threads": threads.status(),  # the count now, how it was chosen, how often it dropped to one
                **_counted(state, forward_s, during.others),
                "onsets_left_out": _left_out(model, sinks, s),
                "sinks_left_out": {SETTINGS[b]: elsewhere.left_out(sinks[SETTINGS[b]], s) for b in tags},
                "steps": {k: v["seconds"] for k, v in state.done.items() if k != UNIT},
                "predicted_forwards": {k: round(v, 2) for k, v in bar.costs.items()},
                "parts": {k: v for k, v in bar.timed.items() if k not in state.done},
                "eta": bar.log()},
        memory=_memory(model, at_start, state),
        bos_token=bos_label(model, prepend_id(model)) if True in tags else None,
        truth=ABSENT if truth is None else {"nodes": [n.name for n in truth.nodes],
                                            "edges": [e.name for e in truth.edges]},
        variant=getattr(model.cfg, "variant", None) or ABSENT,
        first_tokens=first_tokens, weights=weights, sensitivity=sensitivity, spread=spreads, controls=controls,
        special_tokens=special, schema=SCHEMA_VERSION,
    )
    record = AnalysisRecord.from_dict(strict({k: v for k, v in fields.items() if v is not ABSENT}), "the analysis")
    result = Analysis(record, out, reports)
    if out is not None:
        write_all(result, out)
    return result


def _counted(state: _State, forward_s: float, others: float) -> dict[str, Any]:
    """The steps' work, counted (:class:`~p0circuit.patching.work.Count`: the same on any machine): ``forwards``
    (forward work in forwards of the batch), per step (``forwards_by_step``), ``with_grad`` (of it, the work done
    with a graph recorded, whose backward costs about twice it); ``timed_forwards`` (the steps' seconds over the
    unit forward's) and ``slowdown``: the seconds over what the counted work (backwards at twice their forward)
    takes at the unit forward's speed, for the steps this process ran against its own unit forward (a resumed
    run's earlier steps ran in another process, on another machine state: ``processes`` gives each process'
    figures apart). None where a step predates the count. Warns above :data:`.cost.SLOW`, saying whether
    ``others`` (the cores other processes used while the steps ran) explains it."""
    done = {k: v for k, v in state.done.items() if k != UNIT}
    by_step = {k: v.get("forwards") for k, v in done.items()}
    known = None not in by_step.values()
    counted = round(sum(by_step.values()), 1) if known else None
    grad = round(sum(v.get("with_grad") or 0.0 for v in done.values()), 1) if known else None
    processes = []
    for run in sorted({v.get("run", 0) for v in done.values()}):
        steps = [v for v in done.values() if v.get("run", 0) == run]
        unit = next((v["unit_s"] for v in steps if v.get("unit_s")), forward_s)
        seconds = round(sum(v["seconds"] for v in steps), 1)
        work = [v.get("forwards") for v in steps]
        total = sum(work) + 2 * sum(v.get("with_grad") or 0.0 for v in steps) if None not in work else None
        processes.append({"run": run, "steps": len(steps), "seconds": seconds, "unit_s": round(unit, 4),
                          "forwards": round(sum(work), 1) if total is not None else None,
                          "timed_forwards": round(seconds / unit, 1),
                          "slowdown": round(seconds / unit / total, 2) if total else None})
    mine = next((p for p in processes if p["run"] == state.run_index), processes[-1] if processes else None)
    slowdown = mine["slowdown"] if mine else None
    if slowdown is not None and slowdown > cost.SLOW and mine["seconds"] > cost.SLOW_SECONDS:
        why = (f"other processes used {others:.1f} of the machine's {threads.status()['cpus']} cores on average "
               "while the steps ran" if others > threads.BUSY else
               "the machine was quiet while the steps ran, so the steps' many small forwards cost more per token "
               "than one forward of the batch (or the unit forward was timed beside other work)")
        warn_user(f"the analysis' steps took {mine['seconds']:.0f} s, {slowdown:.1f}x what their counted work "
                  f"({mine['forwards']:.0f} forwards of the batch) takes at the unit forward's speed "
                  f"({mine['unit_s'] * 1000:.0f} ms): {why}")
    return {"forwards": counted, "with_grad": grad, "forwards_by_step": by_step,
            "timed_forwards": mine["timed_forwards"] if mine else 0.0, "slowdown": slowdown,
            "others_cores": round(others, 2), "processes": processes}


def _p0_layers(plans: dict[bool, list[dict[str, Any]]]) -> list[int]:
    """The blocks of every P0 onset planned, in either BOS setting, once each."""
    return sorted({o["layer"] for plan in plans.values() for o in plan if o["where"] == "P0"})


def _first_token_count(plans: dict[bool, list[dict[str, Any]]], layer: int, s: AnalysisSettings) -> int:
    """Vocabulary tokens the first-token map at ``layer`` runs (0: every one): ``first_tokens`` where ``layer`` is the
    first P0 onset of a BOS setting, else ``later_first_tokens`` (at most ``first_tokens``)."""
    if layer in {o["layer"] for plan in plans.values() for o in plan if o.get("first")}:  # (_onset_plan marks it)
        return s.first_tokens
    later = s.later_first_tokens or s.first_tokens
    return min(later, s.first_tokens) if s.first_tokens else later


def _weights(model: Any, massive: list[int]) -> Any:
    """The model's super-weight candidates (:func:`weight_outliers`) as JSON, or why there are none to read."""
    try:
        return [w.to_dict() for w in weight_outliers(model, massive=massive)]
    except P0CircuitError as err:
        return Unmeasured(error=str(err)).to_dict()


def _onset_key(tag: str, onset: dict[str, Any]) -> str:
    """The state key of an onset of the BOS setting ``tag`` (``without_bos/P0@L2``)."""
    return f"{tag}/{onset['where']}@L{onset['layer']}"


def _costs(model: Any, plans: dict[bool, list[dict[str, Any]]],
           s: AnalysisSettings) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Every planned step's estimated forwards (:func:`.cost.step_costs`), by its state key, and the node
    steps' parts (:func:`.cost.node_parts`)."""
    out: dict[str, float] = {}
    parts: dict[str, dict[str, float]] = {}
    for b, plan in plans.items():
        first = next((o for o in plan if o["where"] == "P0"), None)
        for o in plan:
            cands = len(steps.onset_nodes(model, o["layer"], get_corruption("shift")))
            screened = steps.SCREEN_EXPECTED
            costs = cost.step_costs(model, o["layer"], cands, s, screened, len(steps.corruption_variants(b)) - 1,
                                    o is first, o["where"] == "P0", varied=steps.VARIATION_EXPECTED)
            for name, value in costs.items():
                key = (f"{_onset_key(SETTINGS[b], o)}/{name}" if name in cost.ONSET_STEPS else
                       f"{SETTINGS[b]}/{name}@L{o['layer']}" if name == "corruptions" else f"{SETTINGS[b]}/{name}")
                out[key] = value
            parts[f"{_onset_key(SETTINGS[b], o)}/nodes"] = cost.node_parts(model, o["layer"], cands, s, screened)
        if first is not None and s.spread_prompts:  # (the length scan in the first setting only, as _analyze runs it)
            scan = scan_lengths(model.cfg.n_ctx - int(b)) if b == next(iter(plans)) else []
            out[f"{SETTINGS[b]}/spread@L{first['layer']}"] = cost.spread(model, first["layer"], s, scan)
    for layer in _p0_layers(plans):
        out[f"first_tokens@L{layer}"] = cost.first_tokens(model, layer, s, _first_token_count(plans, layer, s))
    for b in plans:
        out[f"{SETTINGS[b]}/special"] = cost.special(model, len(special_candidates(model)))
    out["weights"] = 0.0
    return out, parts


def _onset(run: "_Run", setting: Setting, tokens: Tensor, onset: dict[str, Any], summary: SinkSummary
           ) -> dict[str, Any]:
    """One onset row of a BOS ``setting`` (``tokens``: its prompts): its keyed test, node pass and circuit, edges and
    neurons, and at P0 the studies beyond the norm, each a saved step, all on one checked :class:`Setup`."""
    model, s = run.model, run.s
    layer, where = onset["layer"], onset["where"]
    key = _onset_key(setting.tag, onset)
    at = onset.get("at", 0)
    entry: dict[str, Any] = {"layer": layer, "where": where, "at": at,
                             "token": onset["target"][1] if where != "P0" else None,
                             "prompt_set": setting.describe(tokens.shape[0])}
    choice: Optional[dict[str, Any]] = None
    contexts = None
    if where == "P0":
        setup = setting.setup(tokens, get_corruption("shift", seed=s.seed), NormRatio(layer))
        if setting.bos:  # swap the BOS token, or shift: whichever the sink depends on
            setup, choice = steps.choose(setup, ("swap", "shift"), s.seed)
    else:
        try:
            toks, contexts, described = elsewhere.prompts(setting, onset)
        except P0CircuitError as err:
            entry["skipped"] = str(err)
            for step in ("keyed", "nodes", "edges", "neurons"):
                run.skip(f"{key}/{step}")
            return entry
        # the token replaced in place
        setup = setting.setup(toks, Swap(position=at, seed=s.seed), NormRatio(layer, pos=at))
        entry.update(prompts=int(toks.shape[0]), prompt_set=described)
    entry["keyed_on"] = run.step(key + "/keyed", lambda: elsewhere.keyed(setup, at, layer, s,
                                                                        None if where == "P0" else contexts))

    def node_step() -> dict[str, Any]:
        res, out = steps.nodes(setup, layer, s.threshold, s.exact_nodes, s.seed, at)
        out["corruption_choice"] = choice
        run.bar.part(key + "/nodes", "pass")
        out["faithfulness"] = steps.faithfulness(res)
        run.bar.part(key + "/nodes", "curve")
        out["circuit"] = steps.circuit(res, s.max_edges)
        if onset.get("first"):  # the sensitivity table's other faithfulness targets
            out["circuit_targets"] = steps.circuit_targets(res, out["circuit"], TARGETS)
        return out

    entry.update(run.step(key + "/nodes", node_step))
    entry["edges"] = {}
    entry["neurons"] = {}
    if entry["signal"] and entry["nodes"] and not onset.get("below"):  # a row below the onset: its nodes only
        e = dict(run.step(key + "/edges", lambda: steps.circuit_edges(
            setup, layer, entry.get("circuit") or {}, entry["nodes"], s.threshold)))
        entry["edges"], entry["edge_pass"] = e.pop("edges"), e
    else:
        run.skip(key + "/edges")
    dims = [d.dim for d in summary.massive_dims if d.first_layer <= layer <= d.last_layer]
    if where != "P0" and entry["signal"]:  # the massive dimension at the sink's own position
        dims = [d for d in [steps.massive_dim_at(model, setup.tokens, layer, at)] if d is not None]
    if dims and entry["signal"]:
        n = run.step(key + "/neurons", lambda: steps.neurons(setup, layer, dims[0], entry["nodes"], s.threshold,
                                                             s.neurons_keep, s.ig_steps, at))
        entry["neurons"], entry["neuron_pass"] = n.pop("neurons"), n
    else:
        entry["neuron_pass"] = {"note": f"no massive dimension at position {at} after block {layer}" if entry["signal"]
                                else "no signal at the node pass"}
        run.skip(key + "/neurons")
    if where == "P0":
        entry.update(_p0_studies(run, setup, layer, entry, summary, dims, key, below=bool(onset.get("below"))))
    return entry


def _measured(fn: Callable[[], Any]) -> dict[str, Any]:
    """A study's record as JSON, or :class:`~p0circuit.studies.findings.Unmeasured` with why it could not run."""
    try:
        return fn().to_dict()
    except P0CircuitError as err:
        return Unmeasured(error=f"{type(err).__name__}: {err}").to_dict()


def _p0_studies(run: "_Run", setup: Setup, layer: int, entry: dict[str, Any], summary: SinkSummary,
                dims: list[int], key: str, below: bool = False) -> dict[str, Any]:
    """What makes a P0 onset a sink, beyond its norm: what later heads read of the state (edits after the onset),
    whether undiluted attention detects position 0 (self-only attention up to it), the sink's own circuit (the
    attention of the sink heads after it), and the single weights through which its neurons write the massive
    dimension. A block ``below`` the first onset (patched for the sensitivity table) gets what the verdict's parts
    read only: what the sink reads. ``setup``: the onset's (its prompts, BOS choice and corruption)."""
    model, toks, bos, s = run.model, setup.tokens, setup.bos, run.s
    out: dict[str, Any] = {}
    massive = [d.dim for d in summary.massive_dims]
    later = layer < model.cfg.n_layers - 1
    if later:
        out["reads"] = run.step(key + "/reads", lambda: _measured(lambda: sink_reads(
            model, toks, layer, bos=bos, dims=dims[:MASSIVE_EDITED], seed=s.seed)))
    else:
        run.skip(key + "/reads")
    if below:
        return out
    out["detection"] = run.step(key + "/detection", lambda: _measured(lambda: diagonal_attention(
        model, toks, layer, bos=bos)))
    heads = first_readers(summary.alpha, layer, SINK_EPS)
    if later and heads and entry["signal"]:
        norm_nodes = (entry.get("circuit") or {}).get("nodes") or list(entry["nodes"])
        out["sink_circuit"] = run.step(key + "/sink", lambda: _measured(lambda: sink_circuit(
            setup, layer, heads, norm_nodes, threshold=s.threshold, exact_nodes=s.exact_nodes, seed=s.seed,
            max_edges=s.max_edges)))
    else:
        why = ("no block after the onset" if not later else f"no head after block {layer} gives position 0 an alpha_0 "
               f"above {SINK_EPS:g}" if not heads else "no signal at the node pass")
        out["sink_circuit"] = Unmeasured(error=why).to_dict()
        run.skip(key + "/sink")
    strong = [n for n, v in (entry.get("neurons") or {}).items() if abs(v) >= s.threshold]
    metric = (entry.get("neuron_pass") or {}).get("metric", "")
    if strong and "[" in metric:
        dim = int(metric.split("[")[1].split("]")[0])
        out["super_weights"] = run.step(key + "/weights", lambda: _measured(lambda: super_weights(
            model, toks, layer, strong, [dim], bos=bos, massive=massive)))
    else:
        out["super_weights"] = Unmeasured(error="no neuron carries the massive dimension's change at the threshold"
                                          if not strong else "no massive dimension's neurons").to_dict()
        run.skip(key + "/weights")
    return out


ROTARY_OR_NONE = ("rotary", "alibi")
"""TransformerLens' position encodings that give no position an absolute identity (with no position embedding at all,
``standard`` weights frozen at 0, the planted NoPE variant, the same holds)."""


CONTROL_SHARE = 0.1
"""The change a negative control may make, as a share of the onset's own clean-to-corrupted change, and still pass (a
norm ratio also moves with the other positions, which every edit of the prompt touches a little); a positive control
must move the metric by :data:`~p0circuit.core.defaults.KEEPS` of it."""


def _controls(model: Any, row: dict[str, Any], variations: dict[str, Any]) -> list[dict[str, Any]]:
    """The controls of the first P0 onset, each with its prediction and what a pass and a failure would mean: two
    corruptions compared at the onset (``resample``: other prompts, every position kept, a negative control;
    ``copies``: copies of the first token put in front, negative without absolute positions, positive with them),
    each judged by its change of the onset's metric as a share of the onset's own change (:data:`CONTROL_SHARE`), and
    the positive control of what the sink reads (a random direction of the same norm written at P0)."""
    out = []
    by = variations.get("corruption") or {}
    absolute = str(model.cfg.positional_embedding_type) not in ROTARY_OR_NONE and bool(
        getattr(model, "W_pos", None) is not None and float(model.W_pos.detach().abs().max()) > 0)
    own = abs(row["clean"] - row["corrupted"]) or float("nan")

    def corruption(name: str, does: str, positive: bool, expects: str, fail: str, hold: str) -> None:
        c = by.get(name) or {}
        kind = "positive" if positive else "negative"
        if "clean" not in c:
            out.append(Control(name=name, kind=kind, does=does, expects=expects,
                               observed=c.get("error", "not measured"), passed=None, meaning="not measured").to_dict())
            return
        moved = abs(c["clean"] - c["corrupted"]) / own
        seen = (f"`{c['metric']}` {c['clean']:.4g} clean -> {c['corrupted']:.4g} corrupted: {moved:.1%} of the onset's "
                f"own change under `{row['corruption']}`")
        passed = moved >= KEEPS if positive else moved < CONTROL_SHARE
        out.append(Control(name=name, kind=kind, does=does, expects=expects, observed=seen, passed=passed,
                           meaning=hold if passed else fail).to_dict())

    corruption("resample", "other prompts of the same length, every position kept", False,
               f"less than {CONTROL_SHARE:.0%} of the onset's change: a state made by position 0 (or by a BOS token every "
               "prompt keeps) does not depend on which tokens the prompts hold",
               "the metric moves with the prompts' tokens (the P0 state, or the other positions' norms it is divided "
               "by): part of what it measures is keyed on content",
               "the metric barely moves with the prompts' tokens, as a position-keyed state predicts (this shows only "
               "that; the position itself is tested by shift and copies)")
    if absolute:
        corruption("copies", "copies of the first token put in front of it", True,
                   f"at least {KEEPS:.0%} of the onset's change: with a learned absolute position embedding, a position "
                   "after copies of the first token is not position 0",
                   "the metric barely moves: the state does not read the absolute position, only that no other token "
                   "comes first",
                   "the state needs position 0 itself (its absolute position), not only an empty prefix")
    else:
        corruption("copies", "copies of the first token put in front of it", False,
                   f"less than {CONTROL_SHARE:.0%} of the onset's change: without absolute positions a position whose "
                   "prefix is copies of its own token computes exactly what position 0 computes, so a state keyed on "
                   "'no other token before it' stays",
                   "the state changes although no other token comes before it: it reads more than an empty prefix "
                   "(e.g. the prompt's length or its later tokens)",
                   "'position 0' here means 'no other token before it': the two are the same for this model")
    reads = row.get("reads") or {}
    edit = (reads.get("edits") or {}).get(CONTROL)
    does = "P0's state after the onset replaced by a random direction of the same norm"
    if edit is None or edit.get("kept") is None:  # no sink heads to read, or too little excess: no share to read
        out.append(Control(name="random direction", kind="positive", does=does,
                           expects="the sink heads lose their attention to P0",
                           observed=reads.get("error") or reads.get("reads", "not measured"), passed=None,
                           meaning="not measured").to_dict())
    else:
        passed = bool(reads.get("control"))
        out.append(Control(name="random direction", kind="positive", does=does, expects="the sink heads lose their "
                           f"attention to P0 (keep less than {reads['keep']:g} of its excess over uniform)",
                           observed=f"they keep {edit['kept']:.2f}", passed=passed,
                           meaning="the attention metric sees a changed state, so what the other edits keep is "
                           "evidence" if passed else "the attention metric does not move when the state is replaced: "
                           "what the edits keep says nothing").to_dict())
    return out


def _special(setting: Setting, toks: Tensor) -> Any:
    """The model's start, end-of-text and chat tokens in the middle of the prompts (:mod:`..experiments.special_tokens`),
    or why not."""
    try:
        return [t.to_dict() for t in special_tokens(setting.model, toks, bos=setting.bos,
                                                    threshold=setting.s.norm_threshold)]
    except P0CircuitError as err:
        return Unmeasured(error=str(err)).to_dict()


def _spread(setting: Setting, row: dict[str, Any], scan: bool) -> Any:
    """The first P0 onset's headline numbers on ``s.spread_prompts`` other prompts (:mod:`.spread`), and the length scan
    when ``scan``."""
    s = setting.s
    toks = setting.prompts(s.spread_prompts, seed=s.seed + 1)
    setup = setting.setup(toks, get_corruption(row["corruption"], **row["corruption_params"]), NormRatio(row["layer"]))
    label = setting.describe(s.spread_prompts) + f" (drawn with seed {s.seed + 1})"
    return spread(setting, setup, row, label=label, scan=scan)


def _variations(run: "_Run", setting: Setting, onset: dict[str, Any], chosen: str) -> dict[str, Any]:
    """Every corruption side by side at the first P0 ``onset`` (its own pass is reused for ``chosen``),
    and other prompt lengths patched with ``chosen``: the corruption the analysis chose for this BOS
    setting at that onset."""
    model, s = run.model, run.s
    tag, layer = setting.tag, onset["layer"]
    same = onset.get("corruption") == chosen and onset.get("corruption_params") == strict(steps.seeded(chosen, s.seed).params())
    known = {chosen: onset} if "skipped" not in onset and same else {}  # the onset's own pass: the same corruption

    def on(tokens: Tensor) -> Setup:
        """The onset's study (its metric, the chosen corruption) on ``tokens``."""
        return setting.setup(tokens, get_corruption(chosen, seed=s.seed), NormRatio(layer))

    out: dict[str, Any] = {"layer": layer, "chosen_corruption": chosen}
    out["corruption"] = run.step(f"{tag}/corruptions@L{layer}", lambda: steps.by_corruption(
        on(setting.prompts()), layer, steps.corruption_variants(setting.bos), s.threshold, s.seed, known, s.exact_nodes))
    out["length"] = {}
    for n in s.lengths:
        def length_step(n: int = n) -> dict[str, Any]:
            t = setting.prompts(length=n)
            _, summary = steps.sinks(setting, t)
            row: dict[str, Any] = {k: summary[k] for k in ("sink_rate", "norm_stages")}
            row["prompts"] = setting.describe(length=n)
            if layer < model.cfg.n_layers:
                _, nodes = steps.nodes(on(t), layer, s.threshold, s.exact_nodes, s.seed, sample=steps.VARIATION_SAMPLE)
                row.update({k: nodes[k] for k in ("corruption", "metric", "clean", "corrupted", "signal",
                                                  "normalization")}, nodes=dict(list(nodes["nodes"].items())[:8]))
            return row
        out["length"][str(n)] = run.step(f"{tag}/length{n}", length_step)
    return out
