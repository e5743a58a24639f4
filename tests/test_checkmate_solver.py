"""passes.schedule and passes.checkmate on small abstract problems.

The ILP's optimum equals exhaustive search over the schedules it models (staged ones), is
never better than exhaustive search over all schedules, and its schedule is valid under the
budget; two-phase LP rounding gives valid schedules no cheaper than the ILP.
"""

import math

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from fxremat.passes import checkmate, schedule
from fxremat.passes.schedule import RematProblem, compute, free, memory_lower_bound, simulate
from strategies import budget_range, dags, problems_and_budgets, training_chain, training_chains


# ----------------------------------------------------------------------------- schedule.simulate


def test_simulate_counts_inputs_and_output_of_each_compute():
    p = RematProblem(nodes=["a", "b", "c"], edges=[("a", "b"), ("b", "c")], cost={"a": 1, "b": 2, "c": 4},
                     size={"a": 1, "b": 10, "c": 100}, outputs={"c"})
    assert simulate(p, [compute("a"), compute("b"), free("a"), compute("c"), free("b")]) == (7, 110)
    assert simulate(p, [compute("a"), compute("b"), compute("c")]) == (7, 111)


@pytest.mark.parametrize("ops, message", [
    ([compute("b")], "not resident"),                              # input missing
    ([compute("a"), compute("a")], "already resident"),            # double compute
    ([compute("a"), free("b")], "not resident"),                   # free of a non-resident value
    ([compute("a"), compute("b"), free("b")], "end of the schedule"),  # output freed
    ([compute("a"), compute("zz")], "unknown node"),
    ([("launch", "a")], "unknown kind"),
])
def test_simulate_rejects_invalid_schedules(ops, message):
    p = RematProblem(nodes=["a", "b"], edges=[("a", "b")], cost={"a": 1, "b": 1}, size={"a": 1, "b": 1},
                     outputs={"b"})
    with pytest.raises(schedule.ScheduleError, match=message):
        simulate(p, ops)


def tied_problem():
    # f makes a (size 2) and, optionally, x (size 3, tied to f); g reads a, f, x.
    return RematProblem(nodes=["a", "f", "x", "g"], edges=[("a", "f"), ("a", "x"), ("f", "x"), ("a", "g"),
                                                           ("f", "g"), ("x", "g")],
                        cost={"a": 1, "f": 4, "x": 0, "g": 1}, size={"a": 2, "f": 1, "x": 3, "g": 1},
                        outputs={"g"}, workspace={"f": 5}, tied={"x": "f"})


def test_simulate_counts_workspace_and_enforces_tied_nodes():
    p = tied_problem()
    # Workspace counts while f runs: a + f + 5.
    assert simulate(p, schedule.no_remat(p)) == (6, 8)
    with pytest.raises(schedule.ScheduleError, match="right after"):  # x computed apart from f
        simulate(p, [compute("a"), compute("f"), free("a"), compute("a"), compute("x")])
    with pytest.raises(schedule.ScheduleError, match="tied"):  # x's input a freed while x is held
        simulate(p, [compute("a"), compute("f"), compute("x"), free("a")])
    # Frees after last use release x before the inputs it pins.
    ops = schedule.from_computes(p, ["a", "f", "x", "g"])
    assert ops.index(free("x")) < min(ops.index(free("a")), ops.index(free("f")))


@pytest.mark.parametrize("kwargs, message", [
    (dict(tied={"g": "a"}), "right after"),              # not adjacent
    (dict(tied={"x": "a"}), "right after"),
    (dict(workspace={"zz": 1}), "workspace"),
])
def test_problem_rejects_bad_tied_and_workspace(kwargs, message):
    p = tied_problem()
    with pytest.raises(ValueError, match=message):
        RematProblem(nodes=p.nodes, edges=p.edges, cost=p.cost, size=p.size, outputs=p.outputs,
                     **{"workspace": {}, "tied": {}, **kwargs})


def test_problem_rejects_a_tied_node_whose_user_misses_its_inputs():
    with pytest.raises(ValueError, match="not its inputs"):
        RematProblem(nodes=["a", "f", "x", "g"], edges=[("a", "f"), ("a", "x"), ("f", "x"), ("x", "g")],
                     cost=dict.fromkeys("afxg", 1), size=dict.fromkeys("afxg", 1), outputs={"g"},
                     tied={"x": "f"})


def test_ilp_and_brute_force_respect_workspace_and_ties():
    p = tied_problem()
    assert memory_lower_bound(p) == 8  # f's working set: a, f and the workspace
    sol = checkmate.solve(p, 8)
    assert (sol.cost, sol.peak_bytes) == simulate(p, sol.schedule) == (6, 8)
    assert checkmate.brute_force(p, 8)[0] == 6
    with pytest.raises(checkmate.InfeasibleBudget):
        checkmate.solve(p, 7)


def test_problem_rejects_non_topological_order():
    with pytest.raises(ValueError, match="topological"):
        RematProblem(nodes=["a", "b"], edges=[("b", "a")], cost={"a": 1, "b": 1}, size={"a": 1, "b": 1})


@settings(max_examples=100, deadline=None)
@given(dags(max_nodes=8), st.randoms(use_true_random=False))
def test_from_computes_frees_as_early_as_possible(problem, rnd):
    # A random valid compute sequence: a topological pass plus random recomputations.
    seq = []
    done = set()
    for i in problem.needed:
        for _ in range(rnd.randint(0, 1)):
            redo = [problem.nodes[j] for j in range(i) if problem.nodes[j] in done]
            if redo:
                seq.append(rnd.choice(redo))
        seq.append(problem.nodes[i])
        done.add(problem.nodes[i])
    ops = schedule.from_computes(problem, seq)
    cost, peak = simulate(problem, ops)
    assert [op.node for op in ops if op.kind == "compute"] == seq
    assert cost == sum(problem.cost[v] for v in seq)
    # Freeing later can only hold more; never freeing at all holds everything computed.
    keep_all = [compute(v) for v in dict.fromkeys(seq)]
    assert peak <= simulate(problem, keep_all).peak_bytes
    # Nothing is held longer than needed: between two computes, every resident value is
    # read by a later compute before it is computed again, or is an output kept to the end.
    computes = [(pos, op.node) for pos, op in enumerate(ops) if op.kind == "compute"]
    resident = set()
    for idx, (pos, node) in enumerate(computes):
        end = computes[idx + 1][0] if idx + 1 < len(computes) else len(ops)
        for op in ops[pos:end]:
            (resident.add if op.kind == "compute" else resident.discard)(op.node)
        for value in resident:
            needed = value in problem.outputs
            for _, later in computes[idx + 1:]:
                if later == value:
                    needed = False
                    break
                if problem.index[value] in problem.preds[problem.index[later]]:
                    needed = True
                    break
            assert needed, (value, ops)


# ----------------------------------------------------------------------------- the ILP


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_budgets(dags(max_nodes=5)))
def test_ilp_equals_brute_force_over_staged_schedules(case):
    problem, budget = case
    try:
        best_staged, _ = checkmate.brute_force_staged(problem, budget)
    except checkmate.InfeasibleBudget:
        best_staged = None
    try:
        sol = checkmate.solve(problem, budget, time_limit=30)
    except checkmate.InfeasibleBudget as err:
        event("infeasible budget")
        assert best_staged is None
        # The smallest feasible budget is exact: feasible there, infeasible one byte below.
        assert err.min_feasible is not None and err.min_feasible > budget
        assert err.lower_bound <= err.min_feasible
        checkmate.brute_force_staged(problem, err.min_feasible)
        with pytest.raises(checkmate.InfeasibleBudget):
            checkmate.brute_force_staged(problem, err.min_feasible - 1)
        return
    assert best_staged is not None
    assert sol.status == "optimal" and not sol.stopped_early and sol.gap == 0
    assert sol.cost == pytest.approx(best_staged)
    assert sol.objective == pytest.approx(sol.cost)
    assert (sol.cost, sol.peak_bytes) == simulate(problem, sol.schedule)
    assert sol.peak_bytes <= budget
    # Unrestricted schedules can only do better (other node orders, two recomputations per stage).
    best_any, ops = checkmate.brute_force(problem, budget)
    assert best_any <= sol.cost + 1e-9
    event("staged = global optimum" if best_any == sol.cost else "staged > global optimum")
    cost, peak = simulate(problem, ops)
    assert cost == best_any and peak <= budget


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_budgets(training_chains(), below=0))
def test_ilp_equals_brute_force_over_all_schedules_on_training_chains(case):
    # One node order only; empirically (thousands of random cases) staging loses nothing here.
    problem, budget = case
    try:
        best_any, _ = checkmate.brute_force(problem, budget)
    except checkmate.InfeasibleBudget:
        with pytest.raises(checkmate.InfeasibleBudget):
            checkmate.solve(problem, budget)
        return
    sol = checkmate.solve(problem, budget)
    assert sol.cost == pytest.approx(best_any)
    assert simulate(problem, sol.schedule) == (sol.cost, sol.peak_bytes)
    assert sol.peak_bytes <= budget


def test_ilp_keeps_an_input_of_a_value_it_recomputes():
    # b (10 bytes) is freed after c and recomputed for e; its input a (1 byte, cost 100) must
    # stay resident through stages x and e although its only user b comes earlier.
    p = RematProblem(nodes=["a", "b", "c", "x", "e"],
                     edges=[("a", "b"), ("b", "c"), ("c", "x"), ("x", "e"), ("b", "e")],
                     cost={"a": 100, "b": 1, "c": 1, "x": 1, "e": 1},
                     size={"a": 1, "b": 10, "c": 10, "x": 10, "e": 1}, outputs={"e"})
    sol = checkmate.solve(p, 21)
    assert sol.cost == 105 == checkmate.brute_force(p, 21)[0]
    assert [op.node for op in sol.schedule if op.kind == "compute"] == ["a", "b", "c", "x", "b", "e"]


def test_staged_ilp_misses_recomputing_an_output_last():
    # Keeping both ends of a chain within 3 bytes needs v0 recomputed after v3; stage 3
    # computes its nodes in node order, so the ILP cannot: documented limitation.
    p = RematProblem(nodes=["v0", "v1", "v2", "v3"], edges=[("v0", "v1"), ("v1", "v2"), ("v2", "v3")],
                     cost={"v0": 2, "v1": 3, "v2": 1, "v3": 4}, size={"v0": 1, "v1": 1, "v2": 2, "v3": 1},
                     outputs={"v0", "v3"})
    assert checkmate.brute_force(p, 3)[0] == 12
    with pytest.raises(checkmate.InfeasibleBudget) as err:
        checkmate.solve(p, 3)
    assert err.value.min_feasible == 4 and err.value.lower_bound == 3
    assert "4 bytes" in str(err.value)


def test_budget_below_working_set_is_reported_with_the_minimum():
    p = training_chain(3, sizes=[1, 2, 3, 4, 1, 1, 1], costs=[1] * 7)
    lo, hi = budget_range(p)
    with pytest.raises(checkmate.InfeasibleBudget) as err:
        checkmate.solve(p, lo - 1)
    assert err.value.lower_bound == lo
    assert err.value.min_feasible >= lo
    sol = checkmate.solve(p, err.value.min_feasible)
    assert sol.peak_bytes <= err.value.min_feasible


def test_time_limit_returns_incumbent_with_bound():
    p = training_chain(30, sizes=[1 + (3 * i) % 7 for i in range(61)], costs=[1 + (7 * i) % 5 for i in range(61)])
    lo, hi = budget_range(p)
    try:
        sol = checkmate.solve(p, lo + (hi - lo) // 4, time_limit=0.5)
    except checkmate.NoScheduleFound as err:
        assert not isinstance(err, checkmate.InfeasibleBudget)
        assert "within" in str(err)
        return
    assert sol.peak_bytes <= sol.budget
    assert simulate(p, sol.schedule) == (sol.cost, sol.peak_bytes)
    assert sol.bound <= sol.objective + 1e-9
    if sol.stopped_early:
        assert sol.status == "time_limit" and 0 <= sol.gap <= 1
    else:
        assert sol.status == "optimal" and sol.gap == 0


# ----------------------------------------------------------------------------- two-phase LP rounding


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems_and_budgets(dags(max_nodes=10, costs=(1, 5), sizes=(1, 4)), below=0))
def test_lp_rounding_is_valid_and_no_better_than_the_ilp(case):
    problem, budget = case
    try:
        opt = checkmate.solve(problem, budget, report_min_budget=False).cost
    except checkmate.InfeasibleBudget as err:
        assert err.min_feasible is None and err.lower_bound <= memory_lower_bound(problem)
        opt = None
    try:
        sol = checkmate.solve_lp(problem, budget)
    except checkmate.InfeasibleBudget:
        assert opt is None  # the LP is a relaxation: infeasible LP, infeasible ILP
        event("LP infeasible")
        return
    except checkmate.NoScheduleFound:
        event("ILP feasible, no rounding fits" if opt is not None else "ILP infeasible, LP feasible")
        return  # rounding may fail under tight budgets (the paper's caveat)
    assert opt is not None
    assert simulate(problem, sol.schedule) == (sol.cost, sol.peak_bytes)
    assert sol.peak_bytes <= budget
    assert sol.cost >= opt - 1e-9
    assert sol.bound <= opt + 1e-6  # the LP value bounds the ILP optimum
    event("rounded = ILP optimum" if sol.cost <= opt + 1e-9 else "rounded > ILP optimum")


def test_lp_rounding_ratio_on_training_chains(capsys):
    ratios = []
    for layers in (4, 6, 8, 10):
        n = 2 * layers + 1
        p = training_chain(layers, sizes=[2 + (3 * i) % 5 for i in range(n)], costs=[1 + (5 * i) % 4 for i in range(n)])
        lo, hi = budget_range(p)
        for frac in (0.3, 0.6):
            budget = lo + round(frac * (hi - lo))
            opt = checkmate.solve(p, budget).cost
            sol = checkmate.solve_lp(p, budget)
            assert sol.peak_bytes <= budget and sol.cost >= opt
            ratios.append(sol.cost / opt)
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    with capsys.disabled():
        print(f"\nLP rounding / ILP cost on training chains: geomean {geomean:.3f}, max {max(ratios):.3f}")
    # Plain threshold rounding reached 1.13 here; with randomized roundings, repair and local
    # improvement every case reaches the ILP optimum today (1.000): some slack for other HiGHS builds.
    assert geomean <= 1.02 and max(ratios) <= 1.10
    # Reproducible: seeded roundings, deterministic moves.
    assert checkmate.solve_lp(p, budget).schedule == sol.schedule
