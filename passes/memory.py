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
>>> simulate([Step("a", allocates={"a": 8}),
...           Step("b", allocates={"b": 8}, reads=["a"], in_place=True, donors=())]).peak_bytes
16
>>> events = []
>>> _ = simulate(steps, keep={"c"}, observe=lambda i, s, n: events.append((i, s, n)))
>>> events
[(0, 'a', 4), (1, 'b', 8), (1, 'a', -4), (2, 'c', 2), (2, 'b', -8)]
>>> late = [dataclasses.replace(s, frees_late=True) for s in steps]
>>> simulate(late, keep={"c"}).live_bytes  # "a" freed after the last late step, not after "b"
[4, 12, 14]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection


@dataclasses.dataclass
class Step:
    """One operation of a training step, as the simulator sees it.

    Parameters
    ----------
    name : str
        A label (reported as the peak's step).
    allocates : dict of str to int, optional
        The storages the operation creates, with their bytes. A storage already alive is
        not allocated again.
    reads : collection of str, optional
        The storages it reads (a list, or a set: the timeline does not depend on their
        order); each is freed after its last reader.
    phase : str, optional
        A label kept in :meth:`Timeline.as_records` (``"forward"``, ``"backward"``, ...).
    in_place : bool, optional
        The operation may write an output over a storage it reads for the last time, when
        the two have the same size (Inductor's in-place buffer reuse): that output then
        costs nothing.
    frees_late : bool, optional
        What dies at this step is freed only after the last step of the run of consecutive
        ``frees_late`` steps it belongs to (Inductor's C++ backend generates one function for
        all its kernels between two library calls and frees their buffers after it).
    donors : collection of str, optional
        With ``in_place``, the storages an output may be written over (None: any it reads).
        Inductor writes in place only where it reads the donor at the indices it writes: a
        storage laid out otherwise is no donor.

    Returns
    -------
    Step

    Raises
    ------
    Nothing
        Fields are not checked.

    Complexity
    ----------
    ``O(1)``.
    """

    name: str
    allocates: dict[str, int] = dataclasses.field(default_factory=dict)
    reads: Collection[str] = dataclasses.field(default_factory=list)
    phase: str = ""
    in_place: bool = False
    frees_late: bool = False
    donors: Collection[str] | None = None


@dataclasses.dataclass
class Timeline:
    """The live bytes of a sequence of steps (the answer of :func:`simulate`).

    Parameters
    ----------
    steps : list of Step
        The steps simulated.
    live_bytes : list of int
        For each step, the bytes alive while it runs: everything alive plus its new outputs.
    peak_bytes : int or None
        The largest of ``live_bytes`` (the bytes alive at the start if there is no step);
        None when the bytes are symbolic expressions, which have no order.
    peak_step : str or None
        The name of the first step at the peak (None without steps).
    end_bytes : int, optional
        The bytes alive after the last step: the storages kept to the end (and those alive
        at the start that no step reads).
    kept : frozenset of str, optional
        The storages held to the end (``simulate``'s ``keep``), so that the same steps can
        be simulated again (with ``simulate``'s ``observe``, say).

    Returns
    -------
    Timeline

    Raises
    ------
    Nothing

    Complexity
    ----------
    ``O(1)``.
    """

    steps: list[Step]
    live_bytes: list[int]
    peak_bytes: int
    peak_step: str | None
    end_bytes: int = 0
    kept: frozenset[str] = frozenset()

    def as_records(self) -> list[dict]:
        """One dict a step, ``{"step", "phase", "live_bytes"}``, for JSON and tables.

        Returns
        -------
        list of dict

        Raises
        ------
        Nothing

        Complexity
        ----------
        ``O(len(steps))``.
        """
        return [
            {"step": s.name, "phase": s.phase, "live_bytes": b}
            for s, b in zip(self.steps, self.live_bytes)
        ]


def simulate(steps: list[Step], *, live_at_start: dict[str, int] | None = None,
             keep: set[str] = frozenset(), observe=None) -> Timeline:
    """The bytes alive during each step, each storage freed right after its last reader.

    A storage allocated and never read dies after the step that allocates it; storages
    in ``keep`` are never freed. With :attr:`Step.in_place`, an output the size of a
    storage the step reads for the last time takes that storage's bytes instead of
    adding its own. What dies at a :attr:`Step.frees_late` step is freed after the last
    step of its run of such steps.

    Parameters
    ----------
    steps : list of Step
        In execution order.
    live_at_start : dict of str to int, optional
        Storages alive before the first step (inputs), with their bytes; freed after
        their last reader too.
    keep : set of str, optional
        Storages held to the end (outputs, gradients).
    observe : callable, optional
        ``observe(index, storage, nbytes)``, called for every allocation (``nbytes > 0``,
        while step ``index`` runs) and every free (``nbytes < 0``, after step ``index``;
        a storage written in place is freed, then its taker allocated, while the step
        runs), in order: for reports (live bytes by kind, allocation traces).

    Returns
    -------
    Timeline

    Raises
    ------
    Nothing
        A read of a storage that is not alive is ignored. Bytes may be any values that add
        (sympy expressions in sizes, say); without an order the timeline has no peak.

    Complexity
    ----------
    ``O(R + A)`` for ``R`` reads and ``A`` allocations (an in-place step also scans the
    storages it frees).
    """
    live: dict[str, int] = dict(live_at_start or {})
    # Whatever the order of a step's reads, storages are freed (and ``observe`` called) in
    # one order: first seen first, those first seen together by name.
    last_read: dict[str, int] = {}
    for i, step in enumerate(steps):
        unseen = None
        for s in step.reads:
            if s in last_read:
                last_read[s] = i
            elif unseen is None:
                unseen = [s]
            else:
                unseen.append(s)
        if unseen is not None:
            for s in sorted(unseen) if len(unseen) > 1 else unseen:
                last_read[s] = i
        for s in step.allocates:
            last_read.setdefault(s, i)
    # A storage dies after its last reader, or after the run of steps that free late
    # its last reader ends; free lists are computed once, up front.
    freed_after = list(range(len(steps)))
    for i in range(len(steps) - 2, -1, -1):
        if steps[i].frees_late and steps[i + 1].frees_late:
            freed_after[i] = freed_after[i + 1]
    dies_after: dict[int, list[str]] = {}
    for s, i in last_read.items():
        if s not in keep:
            dies_after.setdefault(freed_after[i], []).append(s)
    total = sum(live.values())
    profile: list[int] = []
    for i, step in enumerate(steps):
        # Storages this step reads for the last time: candidates to be written over.
        dying = ([s for s in dict.fromkeys(step.reads) if last_read.get(s) == i and s in live and s not in keep
                  and (step.donors is None or s in step.donors)]
                 if step.in_place else ())
        for s, nbytes in step.allocates.items():
            if s in live:
                continue
            # (of several the same size, the first by name: the same whatever the reads' order)
            donor = min((d for d in dying if live[d] == nbytes), default=None) if step.in_place else None
            if donor is not None:
                dying.remove(donor)
                del live[donor]  # the output takes over the donor's bytes
                live[s] = nbytes
                if observe is not None:
                    observe(i, donor, -nbytes)
                    observe(i, s, nbytes)
                continue
            live[s] = nbytes
            total += nbytes
            if observe is not None:
                observe(i, s, nbytes)
        profile.append(total)
        for s in dies_after.get(i, ()):
            nbytes = live.pop(s, 0)
            total -= nbytes
            if observe is not None and nbytes:
                observe(i, s, -nbytes)
    try:
        peak = max(profile, default=total)
        peak_step = steps[profile.index(peak)].name if profile else None
    except TypeError:  # symbolic bytes (sympy expressions in sizes) have no order: no peak
        peak, peak_step = None, None
    return Timeline(steps=steps, live_bytes=profile, peak_bytes=peak, peak_step=peak_step, end_bytes=total,
                    kept=frozenset(keep))
