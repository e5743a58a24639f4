"""A library call's scratch measurement: what an op says of its random inputs is counted as
no scratch; anything else is a fault of the measurement, raised in the tests and a warning
for users (a TypeError from a broken fake of ``_measure`` once passed as "no scratch")."""

import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxremat import workspace


def _mm_node():
    gm = make_fx(lambda x: torch.ops.aten.mm.default(x, x), tracing_mode="fake")(torch.randn(8, 8))
    return next(n for n in gm.graph.nodes if n.op == "call_function")


def _failing(error):
    def measure(node, channels_last=False, strides=None):
        raise error
    return measure


def test_an_op_refusing_its_random_inputs_counts_no_scratch(monkeypatch, caplog):
    monkeypatch.setattr(workspace, "_MEASURED", {})
    monkeypatch.setattr(workspace, "_measure", _failing(RuntimeError("index out of range")))
    with caplog.at_level(logging.INFO, logger="fxremat"):
        assert workspace._scratch_bytes(_mm_node()) == 0
    assert "could not measure" in caplog.text and "index out of range" in caplog.text


def test_an_unexpected_failure_is_raised_in_the_tests(monkeypatch):
    monkeypatch.setattr(workspace, "_MEASURED", {})
    monkeypatch.setattr(workspace, "_measure", _failing(TypeError("unexpected keyword 'strides'")))
    assert workspace.RAISE_UNEXPECTED  # set by conftest for the whole suite
    with pytest.raises(TypeError, match="strides"):
        workspace._scratch_bytes(_mm_node())


def test_an_unexpected_failure_warns_a_user_and_counts_no_scratch(monkeypatch, caplog):
    monkeypatch.setattr(workspace, "_MEASURED", {})
    monkeypatch.setattr(workspace, "RAISE_UNEXPECTED", False)
    monkeypatch.setattr(workspace, "_measure", _failing(TypeError("unexpected keyword 'strides'")))
    with caplog.at_level(logging.WARNING, logger="fxremat"):
        assert workspace._scratch_bytes(_mm_node()) == 0
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warned and "failed unexpectedly" in warned[0].getMessage()


def test_a_real_measurement_is_not_negative(monkeypatch):
    monkeypatch.setattr(workspace, "_MEASURED", {})
    assert workspace._scratch_bytes(_mm_node()) >= 0
