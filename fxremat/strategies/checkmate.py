"""Checkmate (Jain et al., MLSys 2020) over the stages as a DAG (skip edges included):
the MILP (SciPy's HiGHS) up to the registry's ``max_stages``, two-phase LP rounding beyond."""

from __future__ import annotations

from .. import stage_graph
from ..candidate import Candidate
from ..passes import checkmate
from ..passes.schedule import memory_lower_bound, no_remat, simulate
from .staged import Schedule, StagedProblem, search_model_budget

# Each ILP solve stops after this many branch-and-bound nodes: the same incumbent on any
# machine, so the same plan (a wall-clock limit stopped the U-Net's solves at different
# incumbents under load). The time limit is only a safety net; stopping early (either
# way) is noted in the plan.
NODE_LIMIT = 500
TIME_LIMIT = 120.0


def search(problem: StagedProblem) -> Candidate:
    lin, notes = problem.lin, problem.notes
    graph = stage_graph.build(lin, problem.cost, problem.ctx.input_names, tied=True)
    from . import SOLVERS

    use_ilp = len(lin.stages) <= SOLVERS["checkmate"].max_stages  # the merge gets there unless it cannot
    notes["checkmate_method"] = "ilp" if use_ilp else "lp-rounding"
    notes["skip_edges"] = graph.skips

    def solve_at(model_budget: float) -> Schedule | None:
        try:
            if use_ilp:
                sol = checkmate.solve(graph.problem, model_budget, time_limit=TIME_LIMIT, node_limit=NODE_LIMIT,
                                      report_min_budget=False)
            else:
                sol = checkmate.solve_lp(graph.problem, model_budget, time_limit=TIME_LIMIT)
        except checkmate.NoScheduleFound:
            return None
        if sol.stopped_early:
            notes["checkmate_stopped_early"] = notes.get("checkmate_stopped_early", 0) + 1
            notes["checkmate_worst_gap"] = max(notes.get("checkmate_worst_gap", 0.0), sol.gap)
        computes = [op.node for op in sol.schedule if op.kind == "compute"]
        return Schedule(stage_graph.to_sequence(graph, computes), sol.cost,
                        stage_graph.kept_after_forward(graph, computes))

    lower, upper, _ = checkmate.min_budget(graph.problem, time_limit=TIME_LIMIT, node_limit=NODE_LIMIT)
    least_model = upper if upper is not None else max(lower, memory_lower_bound(graph.problem))
    most_model = simulate(graph.problem, no_remat(graph.problem)).peak_bytes
    slack = (1.0, 1.01, 1.05, 1.2)
    return search_model_budget(problem, solve_at, least_model, most_model, slack)
