"""How sure an onset's headline numbers are: the same numbers over many prompts, with intervals and minima.

The analysis finds an onset's circuit, neurons and keyed-on verdict on a few prompts (8 by default). This step
measures the headline numbers again on ``spread_prompts`` new prompts of the same kind (64 by default; the
shipped passages hold 201), each prompt on its own: the onset's P0 norm ratio, the keyed-on test's kept shares,
the share of the change the onset's faithful circuit keeps (found on the analysis' prompts, so this is also an
out-of-sample check of it), the strongest neuron's share of the massive dimension's change, and h_0's cosine
across prompts; each with a 95% bootstrap interval (:mod:`p0circuit.measures.spread`) and the lowest single
prompt. Then the onset's dependence on prompt length: the P0 norm ratio per block at lengths from 8 to 256
tokens (within the model's context; each length the first tokens of the longest prompts, one forward for all), where
it first reaches the line and where it falls back.
"""

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError, P0CircuitError
from p0circuit.core.types import Node
from p0circuit.measures.norms import direction_stability, direction_stability_ordinary, norm_ratio
from p0circuit.measures.positions import token_text
from p0circuit.measures.spread import RESAMPLES, cosine_interval, interval
from p0circuit.patching import NormRatio, PerPrompt, ResidDim
from p0circuit.patching.circuit_search import Noising, search_job
from p0circuit.patching.engine import run_groups
from p0circuit.patching.setup import Setup
from p0circuit.studies.analysis.setting import Setting
from p0circuit.patching.metrics import RunView
from p0circuit.patching.ops import node_op
from p0circuit.patching.sites import named_positions, site_of
from p0circuit.studies.experiments.keyed import _keyed_on
from p0circuit.studies.findings import Interval, LengthRow, Spread, Unmeasured

OWN_CHANGE = 0.1
"""A prompt counts for the lowest single prompt's share only where its own clean-to-corrupted change is at least this
share of the mean change (a share divides by that change)."""
SCAN = (8, 16, 32, 64, 128, 256)
"""Prompt lengths of the length scan (those within the model's context)."""
SCAN_SHARE = 0.5
"""Share of the analysis' prompts the length scan runs (the scan reads a ratio's block, not a prompt's spread; its
256-token prompts cost 5 times the analysis' own)."""


def _interval(values: Tensor, seed: int, mean: Optional[float] = None, low_high: Optional[tuple] = None) -> Interval:
    low, high = low_high if low_high is not None else interval([values], seed=seed)
    return Interval(mean=float(values.double().mean()) if mean is None else mean, low=low, high=high,
                    min=float(values.min()), n=len(values))


class _Runs:
    """One per-prompt metric on the spread's runs (``job``: their clean and corrupted runs, cached with every
    candidate's reads and shared, :meth:`~p0circuit.patching.job.PatchJob.measuring`): the clean and corrupted
    per-prompt values, and any set of nodes corrupted (or one node patched), per prompt."""

    def __init__(self, job: Any, metric: Any, candidates: Sequence[str]) -> None:
        self.capture = PerPrompt(metric)
        self.job = job = job.measuring(self.capture)
        model = job.model
        self.nodes = [Node.parse(n) for n in candidates]
        self.live = [n for n in self.nodes if job.reaches(site_of(n, model).hook)]
        self.named = named_positions(self.nodes)
        names = [h.name for h in metric.needs(model.cfg.n_layers)]
        self.clean = metric.per_prompt(RunView({n: job.clean[n] for n in names}, None, 0))
        with torch.no_grad():
            if job.prep.is_ablation:
                self.corrupted = self._last(lambda: job.corrupted_metric(
                    [node_op(job, n, "noise", self.named) for n in self.live]))
            else:
                self.corrupted = metric.per_prompt(RunView({n: job.corr[n] for n in names}, None, job.offset))

    def _last(self, run: Any) -> Tensor:
        self.capture.values.clear()
        run()
        return self.capture.values[-1].to(self.clean.dtype)

    def kept(self, circuit: Sequence[str]) -> Tensor:
        """Per prompt, the metric with every candidate outside ``circuit`` corrupted."""
        dropped = [n for n in self.live if n.name not in set(circuit)]
        with torch.no_grad():
            return self._last(lambda: Noising(self.job, self.named)(dropped))

    def patched(self, node: str) -> Tensor:
        """Per prompt, the metric with ``node`` alone set to its corrupted value."""
        op = node_op(self.job, Node.parse(node), "noise", self.named)
        with torch.no_grad():
            return self._last(lambda: run_groups(self.job.base(), [[op]], self.job.rows_per_forward))


def _share(runs: _Runs, values: Tensor, seed: int, removed: bool) -> Interval:
    """The share of the clean-to-corrupted change that ``values`` keep (``removed``: that they remove), as a ratio
    of means with its interval; ``min``: the lowest prompt's own share."""
    clean, corrupted = runs.clean.double(), runs.corrupted.double()
    values = values.double()
    if removed:
        stat = lambda v, c, k: (c - v) / (c - k)  # noqa: E731
    else:
        stat = lambda v, c, k: (v - k) / (c - k)  # noqa: E731
    whole = float(stat(values.mean(), clean.mean(), corrupted.mean()))
    change = (clean - corrupted).abs()
    own = change >= OWN_CHANGE * float(change.mean())  # a prompt whose own change is tiny has no share of its own
    per = stat(values, clean, corrupted)[own]
    low, high = interval([values, clean, corrupted], stat, seed=seed)
    return Interval(mean=whole, low=low, high=high, min=float(per.min()) if len(per) else float("nan"), n=len(values))


def scan_prompts(n_prompts: Any) -> int:  # (checked here)
    """The prompts the length scan runs on: a :data:`SCAN_SHARE` of the analysis' ``n_prompts``, at least 2."""
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise BadInputError(f"scan_prompts: n_prompts={n_prompts!r:.40} must be a whole number of prompts >= 1")
    return max(2, int(n_prompts * SCAN_SHARE))


def scan_lengths(room: Any, lengths: Sequence[Any] = SCAN) -> list[int]:  # (checked here)
    """The prompt lengths of ``lengths`` the length scan runs: those of at most ``room`` tokens of text (the model's
    context, less one for a BOS token)."""
    if isinstance(room, bool) or not isinstance(room, int):
        raise BadInputError(f"scan_lengths: room={room!r:.40} must be a whole number of tokens")
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise BadInputError(f"scan_lengths: lengths hold {bad[0]!r:.40}; pass whole numbers of tokens >= 1")
    return [n for n in lengths if n <= room]


def length_scan(setting: Setting, few: int, layer: int, lengths: Sequence[int] = SCAN) -> list[LengthRow]:
    """The P0 norm ratio per block at each prompt length of ``lengths`` within the model's context, on ``few`` of the
    ``setting``'s prompts (:meth:`~.setting.Setting.prompts`): where it first reaches the onset line
    (``s.norm_threshold``), where it falls back, its value at ``layer``.

    The prompts of each length are the first tokens of the longest ones: in a causal model a position's state reads
    only the positions before it, so one forward of the longest prompts holds every shorter prompt's states (each
    length's ratio is read on its own prefix), and the scan costs one forward of its longest length."""
    model, bos, line = setting.model, setting.bos, setting.s.norm_threshold
    scan = scan_lengths(model.cfg.n_ctx - int(bos), lengths)
    if not scan:
        return []
    names = {hooks.resid_post(l) for l in range(model.cfg.n_layers)}
    toks = setting.prompts(few, max(scan))
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, names_filter=lambda name: name in names,
                                        stop_at_layer=model.cfg.n_layers)  # every block, no logits
    rows = []
    for n in scan:
        ratios = [float(norm_ratio(cache[hooks.resid_post(l)][:, :n + int(bos)]).mean())
                  for l in range(model.cfg.n_layers)]
        onset = next((l for l, r in enumerate(ratios) if r >= line), None)
        erasure = None if onset is None else next((l for l in range(onset, len(ratios)) if ratios[l] < line), None)
        peak = max(range(len(ratios)), key=lambda l: ratios[l])
        rows.append(LengthRow(length=n, onset=onset, erasure=erasure,
                              at_onset=ratios[layer] if layer < len(ratios) else None, peak=ratios[peak],
                              peak_block=peak))
    return rows


def spread(setting: Setting, setup: Setup, row: dict[str, Any], *, label: str, scan: bool = False) -> Spread:
    """The headline numbers of the P0 onset at block ``row["layer"]`` (its analysis ``row``: circuit, candidates,
    neurons) on ``setup``'s prompts (the spread's, ``label`` in words) with its corruption, as the module docstring
    says, in the BOS ``setting`` (its onset line ``s.norm_threshold`` and seed); with the length scan when ``scan``
    (on :func:`scan_prompts` of them)."""
    model, tokens, bos, layer = setup.model, setup.tokens, bool(setup.bos), row["layer"]
    if setup.model is not setting.model or bos != setting.bos:
        raise BadInputError(f"spread: the setup (bos={setup.bos}) is not of the setting (bos={setting.bos}) on the same model; "
                            "make the setup with setting.setup(tokens, corruption, metric)")
    line, seed = setting.s.norm_threshold, setting.s.seed
    name = hooks.resid_post(layer)
    circuit = (row.get("circuit") or {}).get("nodes")
    candidates = list(row.get("effects") or {}) if circuit else []
    npass = row.get("neuron_pass") or {}
    neurons = row.get("neurons") or {}
    neuron_name = max(neurons, key=lambda n: abs(neurons[n])) if neurons and "[" in npass.get("metric", "") else ""
    job = None
    if candidates or neuron_name:  # one clean and one corrupted run, with every node's reads, for both shares
        job = search_job(setup.measuring(NormRatio(layer)))
        job.cache({site_of(Node.parse(n), model).read.name for n in candidates + [neuron_name] if n}
                  | {name})
        h = job.clean[name].float()
    else:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name, stop_at_layer=layer + 1)
        h = cache[name].float()
    ratios = norm_ratio(h)  # (B,)
    lowest = int(ratios.argmin())
    text = token_text(model)
    keyed: Any
    try:
        keyed = _keyed_on(model, tokens, 0, layer, bos=bos, seed=seed, threshold=line,
                          state=None if job is None else job.clean[name])  # the shared clean run's state
    except P0CircuitError as err:
        keyed = Unmeasured(error=str(err))
    faith = neuron = None
    if candidates:
        runs = _Runs(job, NormRatio(layer), candidates)
        faith = _share(runs, runs.kept(circuit), seed, removed=False)
    if neuron_name:
        dim = int(npass["metric"].split("[")[1].split("]")[0])
        runs = _Runs(job, ResidDim(layer, dim), [neuron_name])
        neuron = _share(runs, runs.patched(neuron_name), seed, removed=True)
    h0 = h[:, 0]
    ordinary = float(direction_stability_ordinary(h))
    cos = float(direction_stability(h0))
    unit = torch.nn.functional.normalize(h0, dim=-1)
    per_prompt = ((unit @ unit.T).sum(1) - 1) / (len(h0) - 1)  # each prompt's mean cosine with the others
    direction = Interval(mean=cos, low=(c := cosine_interval(h0, seed=seed))[0], high=c[1], min=float(per_prompt.min()),
                         n=len(h0))
    lengths = length_scan(setting, scan_prompts(setting.s.n_prompts), layer) if scan else []
    ratio = _interval(ratios, seed)
    said = lambda x: f"{x.mean:.3g} [{x.low:.3g}, {x.high:.3g}], lowest prompt {x.min:.3g}"  # noqa: E731
    first = "".join(text(int(t)) for t in tokens[lowest, int(bos):int(bos) + 4].tolist())
    evidence = (f"on {label}: the P0 norm ratio after block {layer} is {said(ratio)} (mean [95% bootstrap interval], "
                f"{RESAMPLES} resamples; {float((ratios >= line).float().mean()):.0%} of prompts reach the line {line:g}; "
                f"the lowest starts {first!r})"
                + ("" if faith is None else f"; the faithful circuit keeps {said(faith)} of the change")
                + ("" if neuron is None else f"; {neuron_name} carries {said(neuron)} of the massive dimension's change")
                + f"; h_0's cosine across prompts {said(direction)} (ordinary positions {ordinary:.3f})"
                + ("; by prompt length: " + ", ".join(
                    f"{r.length} tokens: onset " + ("none" if r.onset is None else f"at block {r.onset}")
                    + (f", falls back at {r.erasure}" if r.erasure is not None else "") for r in lengths) if lengths else ""))
    return Spread(layer=layer, prompts=label, resamples=RESAMPLES, ratio=ratio,
                  reaches=float((ratios >= line).float().mean()), lowest=first, keyed=keyed,
                  faithfulness=faith, neuron=neuron, neuron_name=neuron_name, direction=direction,
                  direction_ordinary=ordinary, lengths=lengths, evidence=evidence)
