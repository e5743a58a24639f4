"""Recomputed ops sit just before their first use in the emitted backward."""

import re

import torch

import fxremat
from fxremat import models


def _assignments(code: str) -> list[tuple[str, set[str]]]:
    rows = []
    for line in code.splitlines():
        match = re.match(r"\s+(\w+) = (.*)", line)
        if match:
            rows.append((match.group(1), set(re.findall(r"\b\w+\b", match.group(2)))))
    return rows


def test_recomputations_are_placed_just_before_their_first_use():
    model, batch = models.make_gpt(batch=2, seq=16, layers=2, dim=32)
    torch.compile(model, backend="fxremat", options={"compiler": "eager"})(*batch).backward()
    plan = fxremat.inspect.plans()[-1]
    recomputed = {r["name"] for r in plan.recomputed}
    assert len(recomputed) > 10
    rows = _assignments(plan.backward_code)
    names = [name for name, _ in rows]
    backward_work = set()  # values that depend on the tangents
    for name, uses in rows:
        if any(u.startswith("tangents") or u in backward_work for u in uses):
            backward_work.add(name)
    for name in recomputed:
        at = names.index(name)
        first_use = next(i for i in range(at + 1, len(rows)) if name in rows[i][1])
        # No backward work between a recomputation and its first use: only other
        # forward values computed for the same use may stand in between.
        assert not backward_work & set(names[at + 1:first_use]), name
