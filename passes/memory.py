"""Live-bytes simulation of a schedule.

Problem
-------
Given the operations of a training step in execution order, each allocating
some storages and reading others, predict the bytes alive after each
operation and the peak, when every storage is freed right after its last
reader (as Inductor's generated code does) unless it is kept to the end
(outputs, gradients).

Complexity: ``O(total reads + allocations)``.

Example
-------
>>> steps = [Step("a", allocates={"a": 4}), Step("b", allocates={"b": 8}, reads=["a"]),
...          Step("c", allocates={"c": 2}, reads=["b"])]
>>> simulate(steps, keep={"c"}).peak_bytes
12
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Step:
    name: str
    allocates: dict[str, int] = dataclasses.field(default_factory=dict)
    reads: list[str] = dataclasses.field(default_factory=list)
    phase: str = ""


@dataclasses.dataclass
class Timeline:
    steps: list[Step]
    live_bytes: list[int]  # while each step runs: everything alive plus its new outputs
    peak_bytes: int
    peak_step: str | None

    def as_records(self) -> list[dict]:
        return [
            {"step": s.name, "phase": s.phase, "live_bytes": b}
            for s, b in zip(self.steps, self.live_bytes)
        ]


def simulate(steps: list[Step], *, live_at_start: dict[str, int] | None = None,
             keep: set[str] = frozenset()) -> Timeline:
    live: dict[str, int] = dict(live_at_start or {})
    last_read: dict[str, int] = {}
    for i, step in enumerate(steps):
        for s in step.reads:
            last_read[s] = i
        for s in step.allocates:
            last_read.setdefault(s, i)
    # A storage dies after its last reader; free lists are computed once, up front.
    dies_after: dict[int, list[str]] = {}
    for s, i in last_read.items():
        if s not in keep:
            dies_after.setdefault(i, []).append(s)
    total = sum(live.values())
    profile: list[int] = []
    for i, step in enumerate(steps):
        for s, nbytes in step.allocates.items():
            if s not in live:
                live[s] = nbytes
                total += nbytes
        profile.append(total)
        for s in dies_after.get(i, ()):
            total -= live.pop(s, 0)
    peak = max(profile, default=total)
    peak_step = steps[profile.index(peak)].name if profile else None
    return Timeline(steps=steps, live_bytes=profile, peak_bytes=peak, peak_step=peak_step)
