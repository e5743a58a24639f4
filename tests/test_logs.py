"""The logger ``fxremat``: each plan's summary at INFO; what planning does next at DEBUG,
at INFO once planning has taken ``candidate.PROGRESS_AFTER_S``."""

import logging

import fxremat
from fxremat import candidate

from conftest import transformer_step


def test_every_plan_is_summarized_at_info(caplog, monkeypatch):
    # Quick planning says what it does at DEBUG only. The threshold is set out of reach rather
    # than trusting this graph to plan in under 3 s: CI's machine took 4.3 s once.
    monkeypatch.setattr(candidate, "PROGRESS_AFTER_S", float("inf"))
    fxremat.inspect.clear()
    with caplog.at_level(logging.DEBUG, logger="fxremat"):
        transformer_step(0.6, batch=4, seq=32, layers=3)
    plan = fxremat.inspect.plans()[-1]
    summaries = [r.getMessage() for r in caplog.records if r.name == "fxremat" and "planned in" in r.getMessage()]
    assert len(summaries) == len(fxremat.inspect.plans()) >= 1
    assert f"graph {plan.graph_id}" in summaries[-1] and f"{plan.solver} plan" in summaries[-1]
    scoring = [r for r in caplog.records if r.name == "fxremat" and "scoring plan" in r.getMessage()]
    assert scoring and all(r.levelno == logging.DEBUG for r in scoring)  # quick: DEBUG


def test_long_planning_says_what_it_does(caplog, monkeypatch):
    monkeypatch.setattr(candidate, "PROGRESS_AFTER_S", 0.0)  # as if the graph were large
    with caplog.at_level(logging.INFO, logger="fxremat"):
        transformer_step(0.6, batch=4, seq=32, layers=3)
    progress = [r.getMessage() for r in caplog.records if r.name == "fxremat" and r.levelno == logging.INFO]
    assert any("over the budget" in m for m in progress)
    assert any("saved set (1 of" in m for m in progress)
    assert any("rotor: scoring plan 1 " in m for m in progress)
