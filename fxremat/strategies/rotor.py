"""Rotor (Beaumont et al., ACM TOMS) over the chain of stages: ``solver="rotor"`` (the
persistent DP, Algorithm 3) and ``solver="rotor_exact"`` (the weakly persistent DP,
Algorithm 1: exact, O(L^4 S), fewer stages)."""

from __future__ import annotations

from .. import chain
from ..candidate import Candidate
from ..passes import rotor as rotor_dp
from ..sizes import node_bytes
from .staged import Schedule, StagedProblem, search_model_budget


def search(problem: StagedProblem) -> Candidate:
    lin, ctx = problem.lin, problem.ctx
    # The chain counts the gradients its stages make from when they are made.
    in_chain = chain.gradients_in_chain(lin, problem.gradients)
    rchain = chain.rotor_chain(lin, problem.cost, ctx.input_names, in_chain)
    problem.outside -= sum(node_bytes(g) for g in in_chain)
    persistent = problem.solver.name == "rotor"

    def solve_at(model_budget: float) -> Schedule | None:
        try:
            solution = rotor_dp.solve(rchain, model_budget, persistent=persistent)
        except rotor_dp.InfeasibleBudget:
            return None
        return Schedule(solution.sequence, solution.makespan, chain.kept_after_forward(lin, solution.sequence))

    # A chain whose every byte lives outside it (one linear layer) needs a budget of 0,
    # which the DP does not take: ask for one byte.
    least_model = max(rotor_dp.min_budget(rchain, persistent=persistent), 1.0)
    most_model = max(  # keeps every stage: more never helps
        rotor_dp.solve(rchain, 1e30, persistent=persistent).peak, least_model)
    slack = (1.0001, 1.01, 1.03, 1.1)  # the DP rounds sizes up into bins
    return search_model_budget(problem, solve_at, least_model, most_model, slack)
