"""TWRemat (Kumar et al.) over the stages as a DAG: it has no budget, its parameter k
trades memory for time; the cheapest k whose plan's predicted peak fits."""

from __future__ import annotations

from .. import stage_graph
from ..candidate import Candidate
from ..passes import twremat
from ..passes.schedule import simulate
from .staged import Schedule, StagedProblem


def search(problem: StagedProblem) -> Candidate:
    graph = stage_graph.build(problem.lin, problem.cost, problem.ctx.input_names, tied=False)
    prepared = twremat.TWRemat(graph.problem)
    ks = sorted({1 << e for e in range(max(prepared.bags, 1).bit_length() + 1)} | {prepared.bags + 1})
    found_all = []
    for k in ks:
        computes = prepared.computes(k)
        sol = simulate(graph.problem, stage_graph.from_computes(graph.problem, computes))
        found_all.append(problem.make(Schedule(stage_graph.to_sequence(graph, computes), sol.total_cost,
                                               stage_graph.kept_after_forward(graph, computes))))
        problem.notes.setdefault("twremat_k", {})[k] = found_all[-1].peak
    fitting = [f for f in found_all if problem.fits(f)]
    if not fitting:
        raise problem.too_small(min(found_all, key=lambda f: f.peak))
    return min(fitting, key=lambda f: f.schedule.makespan).candidate
