"""Keyed on what (``p0circuit/studies/experiments/keyed.py``): the position/token/context test gives each
plant the verdict it is built with, its rule is checked branch by branch, bad input is refused before any
forward, and a metric read at a sink's own index equals plain hooks."""

import pytest
import torch

import p0circuit as p0
import oracle as O
from p0circuit.studies.experiments.keyed import KEEPS, aligned_prompts, keyed_on, target_of, verdict_of
from tolerance import close


def test_the_position_keyed_plant_is_keyed_on_position(planted):
    toks = p0.probe_tokens(planted.model, 8, 16, seed=0, regular=True)
    k = keyed_on(planted.model, toks, 0, planted.spec.circuit_layer + 1, bos=False)
    assert k.verdict == "position" and k.prompts == 8 and k.means == "no other token before it"
    assert k.swapped.mean > 0.9 and k.stays.mean > 0.9 and k.follows.mean < 0.1 and k.context is None
    assert k.copies.mean > 0.95 and k.swapped.min > 0.9 and k.follows.prompts_kept == 0
    assert k.swapped.interval[0] <= k.swapped.mean <= k.swapped.interval[1]


def test_the_bos_keyed_plant_is_keyed_on_its_token(planted_models):
    pm = planted_models("bos")
    toks = p0.probe_tokens(pm.model, 8, 16, seed=0, regular=True)
    toks[:, 0] = pm.spec.bos_id
    k = keyed_on(pm.model, toks, 0, pm.spec.circuit_layer + 1, bos=True)
    assert k.verdict == "token" and k.swapped.mean < 0.1 and k.follows.mean > 0.9 and k.stays.mean < 0.1
    assert k.reading.startswith("follows BOS when moved") and k.means == ""


@pytest.mark.parametrize("shares,verdict", [
    ((1.0, 0.0, 1.0, None), "position"),
    ((0.0, 1.0, 0.0, 1.0), "token"),
    ((0.0, 1.0, 0.0, None), "token"),
    ((1.0, 1.0, 0.0, 0.0), "context"),
    ((0.0, 1.0, 0.0, 0.0), "token and context"),
    ((1.0, 1.0, 1.0, 1.0), "mixed"),  # it stays and it follows: neither edit settles it
    ((KEEPS - 0.01, KEEPS, 0.0, KEEPS), "token"),  # the line itself
])
def test_the_rule(shares, verdict):
    assert verdict_of(*shares) == verdict


def test_bad_input_is_refused_before_any_forward(planted):
    model = planted.model
    toks = p0.probe_tokens(model, 4, 12, seed=0, regular=True)
    with pytest.raises(p0.BadInputError, match="at least 2 prompts"):
        keyed_on(model, toks[:1], 0, 1, bos=False)
    with pytest.raises(p0.BadInputError, match=r"at=11 must index a position in 0\.\.10 \(before the prompts' last"):
        keyed_on(model, toks, 11, 1, bos=False)
    with pytest.raises(p0.BadInputError, match="must be a block of this model"):
        keyed_on(model, toks, 0, model.cfg.n_layers, bos=False)
    with pytest.raises(p0.BadInputError, match="is a sink state .* in 0 of 4 prompts"):
        keyed_on(model, toks, 5, 1, bos=False)  # nothing at position 5 stands out
    with pytest.raises(p0.BadInputError, match="'#id'"):
        aligned_prompts(model, ("first", ","), 4, 12, 3, bos=False)


def test_aligned_prompts_put_the_token_at_one_index(planted):
    toks = aligned_prompts(planted.model, ("token", "#7"), 6, 12, 4, bos=False, seed=1)
    assert toks.shape == (6, 12) and bool((toks[:, 4] == 7).all()) and int((toks == 7).sum()) == 6
    assert target_of("other", (("#7", 5),)) == ("token", "#7") and target_of("first ','") == ("first", ",")
    assert target_of("P0") is None and target_of("BOS") is None


def test_a_metric_read_at_a_later_index_equals_plain_hooks(planted):
    """``ResidDim(pos=k)`` (dimension 40: the plant's uniform head writes the token identities averaged there) and
    ``NormRatio(pos=k)`` (a sink state's metrics) against the oracle, fast and
    reference, with the token at k swapped in place (nodes at that index and the rest)."""
    model, at, layer = planted.model, 5, 2
    toks = p0.probe_tokens(model, 4, 12, seed=3, regular=True)
    nodes = [n.name for n in p0.candidate_nodes(model, positions=(at,), embed=True) if n.layer <= layer]
    for metric, om in ((p0.ResidDim(layer, 40, pos=at), O.Metric("resid_dim", layer=layer, dim=40, pos=at)),
                       (p0.NormRatio(layer, pos=at), O.Metric("norm_ratio", layer=layer, pos=at))):
        kw = dict(nodes=nodes, corruption=p0.Swap(position=at, token=O.FILLER), metric=metric, min_signal=0)
        fast, slow = p0.activation_patch(model, toks, **kw), p0.activation_patch(model, toks, reference=True, **kw)
        plain = O.activation(model, toks, nodes, O.Corr("swap", position=at), om)
        bad = [(n, fast.raw[n], slow.raw[n], plain[n]) for n in nodes
               if not (close(fast.raw[n], plain[n], slow.clean_metric) and close(slow.raw[n], plain[n], slow.clean_metric))]
        assert not bad, f"{metric.name}: {bad[:4]}"
        assert max(abs(v - fast.clean_metric) for v in fast.raw.values()) > 1e-4
    assert torch.equal(toks, p0.probe_tokens(model, 4, 12, seed=3, regular=True))  # nothing changed the prompts
