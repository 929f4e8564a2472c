"""The property-based differential test: random small models with every architecture feature the
families bring, random node and edge subsets, every corruption (a plugin's included), every metric
kind and both directions; p0circuit's fast path and its reference path, each against the oracle
(``tests/oracle.py``: plain TransformerLens hooks, no code shared with p0circuit).

The default suite runs a fixed, derandomized budget (``CASES``: 180 cases, about half a minute), and checks that
its compared cases drew every architecture feature; the long run is
``P0_DIFF_CASES=10000 pytest -m full tests/test_differential.py`` (random, a new seed each run;
``docs/reliability.md`` records its count and time).
"""

import os
from functools import lru_cache

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from transformer_lens import HookedTransformer, HookedTransformerConfig

import oracle as O
import p0circuit as p0
from p0circuit.core.errors import P0CircuitError
from p0circuit.core.types import Kind, Node


CASES = 180
"""Cases in the default suite and the fast tier (fixed examples: the same every run; a smaller budget draws a
different stream, which at 60 cases drew no parallel block and no RMSNorm)."""
RTOL = 1e-4
"""Float32 patched forwards against the oracle: this share of the largest magnitude compared."""
VOCAB, N_CTX = 24, 16

OPTIONS = {
    "n_layers": [2, 3],
    "pos": ["standard", "rotary", "rotary_partial", "shortformer"],
    "norm": ["LN", "RMS", "LNPre", "RMSPre", None],
    "blocks": ["sequential", "parallel", "attn_only", "moe", "post_norm", "gemma_norms"],
    "kv": [None, 2, 1],
    "local": [False, True],
    "gated": [False, True],
    "qk_norm": [False, True],
    "softcap": [False, True],
    "flags": [(), ("use_attn_result",), ("use_split_qkv_input",), ("use_hook_mlp_in",), ("use_attn_in",)],
}
"""Every architecture feature a case draws, and its values."""
FEATURES = st.fixed_dictionaries({**{k: st.sampled_from(v) for k, v in OPTIONS.items()}, "seed": st.integers(0, 3)})


def config(f: dict) -> dict:
    """HookedTransformerConfig arguments for a feature draw."""
    kw = dict(n_layers=f["n_layers"], d_model=16, n_heads=4, d_head=4, d_mlp=16, d_vocab=VOCAB, n_ctx=N_CTX,
              act_fn="silu" if f["gated"] else "gelu", gated_mlp=f["gated"], seed=f["seed"],
              normalization_type=f["norm"], default_prepend_bos=False)
    kw["positional_embedding_type"] = "rotary" if f["pos"] == "rotary_partial" else f["pos"]
    if f["pos"] == "rotary_partial":
        kw["rotary_dim"] = 2
    blocks = f["blocks"]
    if blocks == "parallel":
        kw["parallel_attn_mlp"] = True
    elif blocks == "attn_only":
        kw["attn_only"] = True
    elif blocks == "moe":
        kw.update(num_experts=4, experts_per_token=2, gated_mlp=True, act_fn="silu")
    elif blocks == "post_norm":
        kw.update(original_architecture="Olmo2ForCausalLM", normalization_type="RMS")
    elif blocks == "gemma_norms":
        kw.update(use_normalization_before_and_after=True, normalization_type="RMS")
    if f["kv"] is not None:
        kw["n_key_value_heads"] = f["kv"]
    if f["local"]:
        kw.update(use_local_attn=True, attn_types=("local", "global") * 2, window_size=3)
    if f["qk_norm"]:
        kw.update(use_qk_norm=True, normalization_type=kw["normalization_type"] or "RMS")
    if f["softcap"]:
        kw.update(attn_scores_soft_cap=5.0, output_logits_soft_cap=3.0)
    for flag in f["flags"]:
        kw[flag] = True
    return kw


@lru_cache(maxsize=64)
def built(key: tuple):
    """The model of a feature draw (random weights of std 0.3: every weight matters), or None when
    TransformerLens refuses the combination."""
    kw = dict(key)
    if "attn_types" in kw:
        kw["attn_types"] = list(kw["attn_types"])[:kw["n_layers"]]
    try:
        torch.manual_seed(kw["seed"])
        model = HookedTransformer(HookedTransformerConfig(**kw))
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(std=0.3)
            model(torch.zeros(1, 3, dtype=torch.long))
    except (AssertionError, ValueError, NotImplementedError, TypeError, RuntimeError):  # TransformerLens refuses it
        return None
    return model


def _fired(model) -> list:
    """Hooks that fire with a float activation in a plain forward (the oracle's own run)."""
    _, cache = model.run_with_cache(torch.zeros(2, 5, dtype=torch.long))
    return sorted(n for n, a in cache.cache_dict.items() if a.is_floating_point())


def _layer_of(name: str, n_layers: int) -> int:
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    return -1 if name in ("hook_embed", "hook_pos_embed", "hook_tokens") else n_layers


def metrics(draw, model, length):
    """A random metric: the p0circuit object and the oracle's."""
    cfg = model.cfg
    kind = draw(st.sampled_from(["norm_ratio", "norm_ratio_at", "resid_dim", "attn_to_p0", "logits", "cache"]))
    layer = draw(st.integers(0, cfg.n_layers - 1))
    if kind == "norm_ratio":
        return p0.NormRatio(layer), O.Metric("norm_ratio", layer=layer)
    if kind == "norm_ratio_at":
        pos = draw(st.one_of(st.integers(1, 2), st.tuples(*[st.integers(0, 2)] * 3)))
        return p0.NormRatio(layer, pos=pos), O.Metric("norm_ratio", layer=layer, pos=pos)
    if kind == "resid_dim":
        dim = draw(st.integers(0, cfg.d_model - 1))
        return p0.ResidDim(layer, dim), O.Metric("resid_dim", layer=layer, dim=dim)
    if kind == "attn_to_p0":
        heads = tuple(sorted(set(draw(st.lists(st.tuples(st.integers(0, cfg.n_layers - 1),
                                                            st.integers(0, cfg.n_heads - 1)), min_size=1, max_size=3)))))
        return p0.AttnToP0(heads=list(heads)), O.Metric("attn_to_p0", heads=heads)
    if kind == "logits":
        a, b = draw(st.integers(0, VOCAB - 1)), draw(st.integers(0, VOCAB - 1))

        def gap(logits, a=a, b=b):
            return (logits[:, -1, a] - logits[:, -1, b]).float().mean() + logits[:, 0, a].float().mean()

        return p0.LogitMetric(gap, label="gap"), O.Metric("logits", fn=gap)
    hook = draw(st.sampled_from(_fired(model)))

    def weighted_mean(act, p0_=0):
        """A mean weighted along the last axis (plain means and norms of softmax outputs, routing
        weights and normalized vectors are constant); masked attention scores (-inf) count as 0."""
        act = act.float()
        act = torch.where(torch.isfinite(act), act, torch.zeros_like(act))
        return (act * torch.linspace(-1.0, 2.0, act.shape[-1])).mean()

    return (p0.CacheMetric(lambda acts, at, h=hook: weighted_mean(acts[h]), [(_layer_of(hook, cfg.n_layers), hook)],
                           label=f"mean|{hook}|"),
            O.Metric("cache", hook=hook, fn=weighted_mean))


def corruptions(draw, tokens):
    kind = draw(st.sampled_from(["shift", "shift2", "copies", "swap", "resample", "trade_first_two", "pos_mean", "zero"]))
    if kind == "shift":
        return p0.Shift(filler=(O.FILLER,)), O.Corr("shift")
    if kind == "shift2":
        return p0.Shift(k=2, filler=(O.FILLER, 7)), O.Corr("shift", filler=(O.FILLER, 7))
    if kind == "copies":
        k = draw(st.integers(1, 2))
        return p0.Copies(k=k), O.Corr("copies", k=k)
    if kind == "swap":
        at = draw(st.integers(0, 1))
        return p0.Swap(position=at, token=O.FILLER), O.Corr("swap", position=at)
    if kind == "resample":
        other = (tokens + 1) % VOCAB
        return p0.Resample(tokens=other), O.Corr("resample", tokens=other)
    if kind == "trade_first_two":
        return p0.CORRUPTIONS["trade_first_two"](), O.Corr("swap_first_two")
    if kind == "pos_mean":
        at = draw(st.integers(0, 1))
        return p0.PosMean(position=at), O.Corr("pos_mean", position=at)
    return p0.Zero(), O.Corr("zero")


def node_pool(model, each: bool, length: int) -> list:
    cfg = model.cfg
    classes = list(range(length)) if each else [0, 1, "rest"]
    pool = []
    for p in classes:
        pool += [Node(Kind.HEAD, l, h, p).name for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
        pool += [Node(Kind.RESID, l, pos=p).name for l in range(cfg.n_layers)]
        pool.append(Node(Kind.EMBED, pos=p).name)
        if cfg.positional_embedding_type == "standard":
            pool.append(Node(Kind.POS_EMBED, pos=p).name)
        if not cfg.attn_only:
            pool += [Node(Kind.MLP, l, pos=p).name for l in range(cfg.n_layers)]
            if cfg.num_experts:
                pool += [Node(Kind.EXPERT, l, pos=p, neuron=e).name for l in range(cfg.n_layers) for e in (0, 3)]
            else:
                pool += [Node(Kind.NEURON, l, pos=p, neuron=n).name for l in range(cfg.n_layers) for n in (1, 6)]
    return pool


def scale_of(model, tokens, metric, values) -> float:
    """The magnitude the compared numbers are computed at: the largest value compared, and for a
    metric on the logits the largest logit (a difference of logits rounds at their size)."""
    scale = max([abs(v) for v in values] + [1e-6])
    if metric.kind == "logits":
        with torch.no_grad():
            scale = max(scale, float(model(tokens).abs().max()))
    return scale


def check(model, tokens, method, names, corruption, metric, oc, om, direction, **extra):
    """Fast and reference against the oracle: every raw value, the clean and corrupted metrics."""
    fn = {"activation": p0.activation_patch, "path": p0.path_patch}[method]
    what = {"activation": "nodes", "path": "edges"}[method]
    kw = dict(corruption=corruption, metric=metric, direction=direction, min_signal=0, **extra)
    if not extra:
        kw[what] = names
    outcomes = []
    for reference in (False, True):
        try:
            outcomes.append(fn(model, tokens, reference=reference, **kw))
        except P0CircuitError as err:
            outcomes.append(err)
    refused = [isinstance(o, P0CircuitError) for o in outcomes]
    assert refused[0] == refused[1], f"fast and reference disagree on refusing: {outcomes}"
    assume(not refused[0])  # a refusal (with its fix) is an answer; nothing to compare
    fast, slow = outcomes
    if method == "activation":
        oracle = O.activation(model, tokens, names, oc, om, direction)
        every = list(fast.raw) if extra else names
        clean, corrupted = O.references(model, tokens, every, oc, om)
    else:
        oracle = O.path(model, tokens, names, oc, om, direction)
        clean, corrupted = O.references(model, tokens, sorted({n.split("->")[0] for n in names}), oc, om)
    expected = {**oracle, "(clean)": clean, "(corrupted)": corrupted}
    tol = RTOL * scale_of(model, tokens, om, expected.values())
    for result, path_name in ((fast, "fast"), (slow, "reference")):
        got = {**{n: result.raw[n] for n in names}, "(clean)": result.clean_metric,
               "(corrupted)": result.corrupted_metric}
        bad = {n: (got[n], expected[n]) for n in expected if not abs(got[n] - expected[n]) <= tol}
        assert not bad, f"{path_name} path differs from the oracle (tolerance {tol:.3g}): {bad}"


def case(draw):
    """One random case, drawn step by step (what is drawn depends on the model)."""
    features = draw(FEATURES)
    DRAWN.clear()
    DRAWN.update(features)
    model = built(tuple(sorted(config(features).items())))
    assume(model is not None)
    length = draw(st.integers(5, 8))
    batch = draw(st.integers(2, 3))
    tokens = torch.randint(8, VOCAB, (batch, length), generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    corruption, oc = corruptions(draw, tokens)
    metric, om = metrics(draw, model, length)
    direction = "noise" if oc.ablation else draw(st.sampled_from(["noise", "denoise"]))
    method = draw(st.sampled_from(["activation", "activation", "path", "each"]))
    if method == "each":
        nodes = [n.name for n in p0.candidate_nodes(model, positions=range(length), rest=False)]
        names = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4, unique=True))
        return model, tokens, "activation", names, corruption, metric, oc, om, direction, {"positions": "each"}
    pool = node_pool(model, False, length)
    if method == "activation":
        names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        return model, tokens, method, names, corruption, metric, oc, om, direction, {}
    senders = [n for n in pool if not n.startswith("R") and ".E" not in n]
    chosen = draw(st.lists(st.sampled_from(senders), min_size=1, max_size=3, unique=True))
    edges = [e.name for e in p0.candidate_edges(model, [Node.parse(n) for n in chosen], metric=metric)]
    assume(edges)
    names = draw(st.lists(st.sampled_from(edges), min_size=1, max_size=4, unique=True))
    return model, tokens, method, names, corruption, metric, oc, om, direction, {}


DRAWN: dict = {}
"""The architecture features of the case being drawn."""
COVERED = tuple(OPTIONS)
"""The features whose every value the default run must have compared."""
COUNTED = {"compared": 0, "refused": 0}
SEEN: dict[str, set] = {"corruption": set(), "metric": set(), "method": set(), "direction": set(),
                        **{k: set() for k in COVERED}}
"""What the compared cases covered (the coverage test after the default run reads it)."""


def _run(data):
    model, tokens, method, names, corruption, metric, oc, om, direction, extra = case(data.draw)
    try:
        check(model, tokens, method, names, corruption, metric, oc, om, direction, **extra)
    except BaseException as err:
        if type(err).__name__ == "UnsatisfiedAssumption":
            COUNTED["refused"] += 1
        raise
    COUNTED["compared"] += 1
    for key, value in (("corruption", corruption.name), ("metric", om.kind), ("direction", direction),
                       ("method", "each" if extra else method), *((k, DRAWN[k]) for k in COVERED)):
        SEEN[key].add(value)
    log = os.environ.get("P0_DIFF_LOG")  # the long run's progress: cases compared, and refused with a fix
    if log and COUNTED["compared"] % 100 == 0:
        with open(log, "a") as f:
            f.write(f"{COUNTED['compared']} compared, {COUNTED['refused']} refused\n")


@settings(max_examples=CASES, deadline=None, derandomize=True, database=None, report_multiple_bugs=False,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fast_and_reference_equal_the_oracle(user_corruption, data):
    _run(data)


def test_the_default_budget_compared_every_kind():
    """The default run above compared enough cases, and among them every corruption, metric kind,
    method and direction (a budget that refuses or assumes away most cases would pass silently)."""
    if not COUNTED["compared"] and not COUNTED["refused"]:
        pytest.skip("the default differential test did not run in this session")
    assert COUNTED["compared"] >= CASES * 0.9, COUNTED
    assert SEEN["corruption"] >= {"shift", "copies", "swap", "resample", "trade_first_two", "pos_mean", "zero"}, SEEN
    assert SEEN["metric"] >= {"norm_ratio", "resid_dim", "attn_to_p0", "logits", "cache"}, SEEN
    assert SEEN["method"] == {"activation", "path", "each"} and SEEN["direction"] == {"noise", "denoise"}, SEEN
    missing = {k: sorted(map(str, set(OPTIONS[k]) - SEEN[k])) for k in COVERED if set(OPTIONS[k]) - SEEN[k]}
    assert not missing, f"architecture features never compared: {missing}"


@pytest.mark.full
@settings(max_examples=int(os.environ.get("P0_DIFF_CASES", "10000")), deadline=None, database=None,
          report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fast_and_reference_equal_the_oracle_long(user_corruption, data):
    _run(data)
