"""The test-time type checker (tests/typecheck.py) is on for the whole package, and off for entry points."""

import pytest
import torch
from beartype.roar import BeartypeCallHintViolation

import p0circuit as p0
import typecheck
from p0circuit.core import hooks
from p0circuit.measures import attention
from p0circuit.patching import engine


def test_internal_functions_are_checked_by_beartype():
    with pytest.raises(BeartypeCallHintViolation, match="layer='x'"):
        hooks.mlp_post("x")
    with pytest.raises(BeartypeCallHintViolation, match="group=5"):
        engine.start_layer(5)


def test_array_shapes_are_checked_by_jaxtyping():
    assert "p0circuit.measures.attention" in typecheck.shaped_modules()
    alpha = torch.rand(2, 3, 4)
    assert attention.sink_rate(alpha).shape == ()
    with pytest.raises(Exception, match="sink_rate"):  # "batch layer head": three axes, not two
        attention.sink_rate(torch.rand(2, 3))


def test_entry_points_raise_the_users_errors():
    with pytest.raises(p0.P0CircuitError, match="layer") as err:  # not beartype's violation
        p0.ResidDim("x", 0)
    assert not isinstance(err.value, BeartypeCallHintViolation)
    with pytest.raises(p0.P0CircuitError, match="n_layers"):
        p0.ModelSpec(n_layers=0)
