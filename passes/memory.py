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
>>> simulate([Step("a", allocates={"a": 8}), Step("b", allocates={"b": 8}, reads=["a"], in_place=True)]).peak_bytes
8
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Step:
    name: str
    allocates: dict[str, int] = dataclasses.field(default_factory=dict)
    reads: list[str] = dataclasses.field(default_factory=list)
    phase: str = ""
    # May write its output over a storage it reads for the last time, when the two have
    # the same size (Inductor's in-place buffer reuse): that output then costs nothing.
    in_place: bool = False


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
        # Storages this step reads for the last time: candidates to be written over.
        dying = [s for s in dict.fromkeys(step.reads) if last_read.get(s) == i and s in live and s not in keep]
        for s, nbytes in step.allocates.items():
            if s in live:
                continue
            donor = next((d for d in dying if live[d] == nbytes), None) if step.in_place else None
            if donor is not None:
                dying.remove(donor)
                del live[donor]  # the output takes over the donor's bytes
                live[s] = nbytes
                continue
            live[s] = nbytes
            total += nbytes
        profile.append(total)
        for s in dies_after.get(i, ()):
            total -= live.pop(s, 0)
    peak = max(profile, default=total)
    peak_step = steps[profile.index(peak)].name if profile else None
    return Timeline(steps=steps, live_bytes=profile, peak_bytes=peak, peak_step=peak_step)
