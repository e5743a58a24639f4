"""The demo (the README's first command) on its --quick sizes."""

import io

import pytest

from fxremat.demo import QUICK, DemoConfig, run_demo


@pytest.mark.inductor
def test_quick_demo_reports_every_strategy_and_agrees_on_the_losses():
    out = io.StringIO()
    assert run_demo(DemoConfig(**QUICK), out) == 0
    text = out.getvalue()
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.split() and line.split()[0] in ("eager", "inductor", "fxremat")}
    assert set(rows) == {"eager", "inductor", "fxremat"}
    assert rows["fxremat"][-2] != "-" and rows["inductor"][-2] == "-"  # fxremat's predicted peak column
    assert "losses agree: all 4 steps" in text


@pytest.mark.inductor
def test_quick_demo_with_an_impossible_budget_names_the_minimum_and_still_reports_the_others(capsys):
    out = io.StringIO()
    assert run_demo(DemoConfig(**{**QUICK, "budget": 10}), out) == 2
    assert "inductor" in out.getvalue() and "fxremat " not in out.getvalue().split("strategy", 1)[1]
    assert "Allowed: a budget of at least" in capsys.readouterr().err
