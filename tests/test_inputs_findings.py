"""Bad inputs and metrics as a user meets them on the findings layer: each is refused before any work,
with a message that says what was wrong and what to do (never a KeyError from inside the engine, a
traceback from deep in transformers, or a silently replaced value)."""

import importlib
import json
import math
import shutil

import pytest
import torch

import p0circuit as p0
from p0circuit.core.errors import BadInputError, ConfigError, MissingHookError
from p0circuit.models import spec as spec_module
from p0circuit.studies.analysis.settings import AnalysisSettings

job_module = importlib.import_module("p0circuit.patching.job")  # the module whose forwards a refusal must precede


@pytest.fixture(scope="module")
def toks(planted):
    return p0.probe_tokens(planted.model, 4, 8, regular=True)


@pytest.fixture
def no_forward(monkeypatch):
    """Any cached forward of a patching job fails the test: a refusal must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a forward ran before the refusal")

    monkeypatch.setattr(job_module, "cache_run", forbidden)


# 1. a CacheMetric on a hook the patching cache never holds

@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("hook, flag, instead", [
    ("blocks.1.hook_mlp_in", "use_hook_mlp_in", "blocks.1.hook_resid_mid"),
    ("blocks.1.attn.hook_result", "use_attn_result", "blocks.1.attn.hook_z"),
    ("blocks.1.hook_q_input", "use_split_qkv_input", "blocks.1.hook_resid_pre"),
], ids=["mlp_in", "attn_result", "q_input"])
def test_a_cache_metric_on_a_hook_that_never_fires_is_refused_first(planted, toks, no_forward, hook, flag, instead,
                                                                    reference):
    """Was: KeyError('blocks.1.hook_mlp_in') from patching/job.py after both cached forwards."""
    metric = p0.CacheMetric(lambda acts, at: acts[hook].float().mean(), [(1, hook)], label="mine")
    for method in (p0.activation_patch, p0.path_patch):
        with pytest.raises(MissingHookError) as err:
            method(planted.model, toks, metric=metric, reference=reference)
        text = str(err.value)
        assert f"metric 'mine' reads hook {hook!r}" in text
        assert f"model.cfg.{flag} on (off on this model)" in text
        assert f"Read instead: {instead}" in text
        assert "hook_resid_pre, hook_resid_mid, hook_resid_post, hook_attn_out, hook_mlp_out" in text
        assert "attn.hook_pattern" in text
    assert not planted.model.cfg.use_hook_mlp_in and not planted.model.cfg.use_attn_result


def test_the_hook_named_instead_holds_the_same_values(planted, toks):
    """The replacements the refusal names are exact: hook_mlp_in is hook_resid_mid, and a head's result
    is its hook_z times its W_O."""
    model = planted.model
    model.set_use_hook_mlp_in(True)
    model.set_use_attn_result(True)
    try:
        _, cache = model.run_with_cache(toks)
    finally:
        model.set_use_hook_mlp_in(False)
        model.set_use_attn_result(False)
    assert torch.equal(cache["blocks.1.hook_mlp_in"], cache["blocks.1.hook_resid_mid"])
    result = torch.einsum("bphd,hdm->bphm", cache["blocks.1.attn.hook_z"], model.W_O[1])
    assert torch.allclose(cache["blocks.1.attn.hook_result"], result, atol=1e-5)


def test_a_cache_metric_on_a_gated_hook_that_is_switched_on_is_kept(planted, toks):
    """The refusal follows the model's own config: with use_hook_mlp_in on, the hook fires and is cached."""
    hook = "blocks.1.hook_mlp_in"
    metric = p0.CacheMetric(lambda acts, at: acts[hook][:, at].norm(), [(1, hook)])
    planted.model.set_use_hook_mlp_in(True)
    try:
        result = p0.activation_patch(planted.model, toks, nodes=["M0@0"], metric=metric, corruption="shift")
    finally:
        planted.model.set_use_hook_mlp_in(False)
    assert math.isfinite(result.raw["M0@0"])


# 2. analysis settings out of range

@pytest.mark.parametrize("name, value, got", [
    ("threshold", math.inf, "got inf"),
    ("threshold", -math.inf, "got -inf"),
    ("threshold", math.nan, "got nan"),
    ("threshold", 0.0, "got 0.0"),
    ("norm_threshold", math.inf, "got inf"),
    ("norm_threshold", math.nan, "got nan"),
    ("norm_threshold", 0.5, "got 0.5"),  # a ratio line at or below 1: every kept share divides by about 0
    ("norm_threshold", 1, "got 1"),
    ("threshold", 1.5, "got 1.5"),  # a line above the whole change: only components that overshoot it alone
    ("seed", 2**40, "got 1099511627776"),
])
def test_analysis_settings_refuse_non_finite_and_out_of_range_values(name, value, got):
    """Was: threshold=inf accepted, failing only when analysis.json was written (and a seed past 2**32 only
    when the prompts were drawn)."""
    with pytest.raises(ConfigError) as err:
        AnalysisSettings(**{name: value})
    text = str(err.value)
    want = ("must be a whole number in 0..4294967295 (what the prompt and corruption generators take)" if name == "seed"
            else "must be a finite number > 1 (" if name == "norm_threshold" else "must be a finite number in (0, 1) (")
    assert text.startswith(f"analysis setting {name}") and want in text and text.endswith(got)


# 3. model specs and checkpoint configs

@pytest.mark.parametrize("dtype, want", [("float16", torch.float16), (torch.bfloat16, torch.bfloat16),
                                         ("float32", torch.float32)])
def test_a_spec_builds_in_its_dtype(dtype, want):
    """Was: ModelSpec(dtype="float16") -> TypeError: unexpected keyword argument 'dtype'."""
    spec = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=32, n_ctx=8, dtype=dtype)
    assert spec.dtype == str(want).removeprefix("torch.")  # kept by name: to_dict stays JSON
    assert p0.ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert ("dtype" in spec.to_dict()) == (want != torch.float32)  # records made before specs had a dtype read alike
    model = spec.build()
    assert model.cfg.dtype == want and {p.dtype for p in model.parameters()} == {want}
    logits = model(torch.arange(6).reshape(1, 6))
    assert logits.dtype == want and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("dtype, words", [
    ("int8", "ModelSpec.dtype='int8' is not a dtype a spec builds in; choose one of ('float32', 'float16', 'bfloat16')"),
    (torch.int64, "ModelSpec.dtype=torch.int64 is not a dtype a spec builds in"),
    ("half", "choose one of ('float32', 'float16', 'bfloat16')"),
])
def test_a_spec_refuses_a_dtype_it_does_not_build(dtype, words):
    with pytest.raises(ConfigError) as err:
        p0.ModelSpec(dtype=dtype)
    assert words in str(err.value)


def test_a_spec_larger_than_the_machine_is_refused_before_building(monkeypatch):
    """Was: a spec whose weights exceed the machine's memory built for minutes (then swapped or died)."""
    monkeypatch.setattr(spec_module, "machine_memory", lambda: 2**30)  # a 1 GiB machine
    big = dict(n_layers=6000, d_model=64, n_heads=4, d_head=16, d_mlp=256)  # 2.95e8 parameters
    with pytest.raises(ConfigError) as err:
        p0.ModelSpec(**big)
    text = str(err.value)
    assert "ModelSpec would hold about 2.95e+08 parameters, 1.1 GiB in float32" in text
    assert "more than this machine's memory (1.0 GiB in all)" in text
    assert "use smaller sizes (n_layers, d_model, d_mlp, d_vocab), or a smaller dtype" in text
    assert p0.ModelSpec(**big, dtype="bfloat16").n_parameters() == 294_924_288  # half the bytes (0.55 GiB): it fits


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from family_configs import make_checkpoint

    return make_checkpoint("llama", tmp_path_factory.mktemp("findings"))


def _with_config(src, tmp_path, **changes):
    path = tmp_path / "ckpt"
    shutil.copytree(src, path)
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            config[outer] = dict(config.get(outer) or {}, **{inner: value})
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("key, value, words", [
    ("rope_parameters.rope_theta", "x", "rope_parameters.rope_theta='x' is not a finite number > 0"),
    ("rope_theta", "x", "rope_theta='x' is not a finite number > 0"),
    ("rope_theta", -5, "rope_theta=-5 is not a finite number > 0"),
    ("rope_theta", 0, "rope_theta=0 is not a finite number > 0"),
    ("num_hidden_layers", "3", "num_hidden_layers='3' is not a whole number >= 1"),
    ("hidden_size", 0, "hidden_size=0 is not a whole number >= 1"),
    ("intermediate_size", 2.5, "intermediate_size=2.5 is not a whole number >= 1"),
])
def test_a_checkpoint_config_with_a_malformed_number_is_refused(llama_dir, tmp_path, key, value, words):
    """Was: rope_theta 'x' -> 'could not load the weights ... check that the weight files are complete'
    (a TypeError from inside the model's rotary embedding); -5 or 0 -> a logit mismatch after the load."""
    path = _with_config(llama_dir, tmp_path, **{key: value})
    with pytest.raises(ConfigError) as err:
        p0.load_checkpoint(path)
    assert words in str(err.value) and "config.json" in str(err.value) and "fix the config" in str(err.value)


def test_a_checkpoint_config_larger_than_the_machine_is_refused_before_loading(llama_dir, tmp_path):
    """Was: a config.json of 10**6 layers went to transformers, which built it for minutes."""
    path = _with_config(llama_dir, tmp_path, num_hidden_layers=10**6, hidden_size=4096, intermediate_size=11008)
    with pytest.raises(ConfigError) as err:
        p0.load_checkpoint(path)
    text = str(err.value)
    assert "config.json" in text and "would hold about" in text and "more than this machine's memory" in text
    assert "num_hidden_layers, hidden_size, intermediate_size, vocab_size" in text


def test_real_configs_are_not_refused():
    """The estimate is a lower bound: a real model's config (Gemma 3 270M's sizes) passes."""
    from p0circuit.models.checkpoints import check_config_values

    check_config_values({"hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4,
                         "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144,
                         "rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention":
                                             {"rope_theta": 1e4}}}, "gemma3", torch.float32)


def test_a_rotary_base_read_from_a_loaded_config_is_never_defaulted():
    from types import SimpleNamespace

    from p0circuit.models.families import _rope_bases

    assert _rope_bases(SimpleNamespace(rope_theta=5e5)) == {"rotary_base": 5e5}
    for bad in ("x", -1.0, math.nan, math.inf):
        with pytest.raises(ConfigError, match="rope_theta=.* is not a finite number > 0; fix the config"):
            _rope_bases(SimpleNamespace(rope_theta=bad))


# 4. a plain function passed as a metric

METRIC_WORDS = ("p0.LogitMetric(fn) for fn(logits [batch, pos, vocab])",
                "p0.LogitMetric(lambda logits: logits[:, -1, 0].mean())",
                "p0.CacheMetric(fn, hooks_needed=[(layer, hook name), ...]) for fn(acts: dict[hook name, Tensor], p0)",
                "hooks_needed=[(1, 'blocks.1.hook_resid_post')])")


@pytest.mark.parametrize("call", ["activation_patch", "path_patch", "discover", "options", "check_metric"])
def test_a_plain_function_as_metric_names_both_wrappers(planted, toks, no_forward, call):
    """Was: '... is not str or PatchMetric or None; pass a metric such as p0circuit.NormRatio(layer) or
    AttnToP0(heads=...); pass a string': neither LogitMetric nor CacheMetric named."""
    from p0circuit.patching.metrics import check_metric

    fn = lambda logits: logits[:, -1, 0].mean()  # noqa: E731
    calls = {
        "activation_patch": lambda: p0.activation_patch(planted.model, toks, metric=fn),
        "path_patch": lambda: p0.path_patch(planted.model, toks, metric=fn),
        "discover": lambda: p0.discover(planted.model, toks, metric=fn),
        "options": lambda: p0.PatchOptions(metric=fn),
        "check_metric": lambda: check_metric(fn, planted.model),
    }
    with pytest.raises((BadInputError, ConfigError)) as err:
        calls[call]()
    text = str(err.value)
    assert "metric=" in text and "function" in text
    for words in METRIC_WORDS:
        assert words in text
    assert "; pass a string" not in text  # the metric's fix, once, not a second generic one


def test_the_wrapped_examples_in_the_message_run(planted, toks):
    logit = p0.LogitMetric(lambda logits: logits[:, -1, 0].mean())
    cache = p0.CacheMetric(lambda acts, p0_: acts['blocks.1.hook_resid_post'][:, p0_].norm(),
                           hooks_needed=[(1, 'blocks.1.hook_resid_post')])
    for metric in (logit, cache):
        result = p0.activation_patch(planted.model, toks, nodes=["M0@0"], metric=metric, corruption="shift")
        assert math.isfinite(result.raw["M0@0"])


# 5. which BOS a label names

def test_bos_label_names_an_explicit_token():
    """Was: bos_label(model) only, naming the tokenizer's BOS ('<|im_start|>' on SmolLM2) while the
    analysis' with-BOS run prepends the entry's start token ('<|endoftext|>')."""
    from family_configs import make_tokenizer

    model = p0.ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=64, n_ctx=12).build()
    model.tokenizer = make_tokenizer()  # <bos> 0, <eos> 1, <unk> 2
    model.tokenizer.bos_token = "<eos>"  # a tokenizer BOS that is no start-of-text token, as SmolLM2's
    label = p0.bos_label(model)
    assert label.startswith("BOS '<eos>' (id 1) (the tokenizer's bos_token, not a start-of-text token")
    assert "p0circuit.set_bos(model, token)" in label
    assert p0.bos_label(model, "<bos>") == "BOS '<bos>' (id 0)"  # the token a run actually prepends
    assert p0.bos_label(model, 0) == "BOS '<bos>' (id 0)"
    p0.set_bos(model, "<bos>")
    assert p0.bos_label(model) == "BOS '<bos>' (id 0)"
    with pytest.raises(BadInputError, match="bos_label: '<nope>' is not a token of this tokenizer"):
        p0.bos_label(model, "<nope>")
    with pytest.raises(BadInputError, match=r"bos_label: id 99 is outside the vocabulary 0..63"):
        p0.bos_label(model, 99)


# 7. "no signal" judged as fits the metric's kind, and said which

def test_no_signal_is_judged_in_the_metrics_own_unit():
    from p0circuit.patching.result import normalize

    # a logit metric whose value sits far from 0: a 0.45-logit change is signal (it was "no signal": 0.45 < 5% of 100)
    _, signal, msg = normalize(100.45, 100.0, {"x": 100.2}, "noise", 0.05, unit=p0.LogitMetric.signal_unit)
    assert signal and not msg
    _, signal, msg = normalize(100.01, 100.0, {"x": 100.0}, "noise", 0.05, unit="logits")
    assert not signal and "min_signal=0.05 logits (an absolute change: this metric is in logits)" in msg
    # a ratio: relative to its scale, said so with the bound it came to
    _, signal, msg = normalize(100.45, 100.0, {"x": 100.2}, "noise", 0.05)
    assert not signal and "less than the threshold 5.02 (min_signal=0.05 times the larger of the two in size)" in msg
    assert p0.NormRatio(1).signal_unit == "" and p0.CacheMetric.signal_unit == ""


def test_with_bos_on_a_model_without_one_says_the_command_line_fix(tmp_path):
    """`analyze --bos with` on a model with no BOS token: one fix, in the user's own terms."""
    from p0circuit.surfaces.cli import main

    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["analyze", "--model", "spec:rope", "--bos", "with", "--out", str(tmp_path), "--quiet"]) == 2
    said = err.getvalue()
    assert "--bos-token TOKEN" in said and "--bos both" in said and "prepend_bos=False" not in said, said
