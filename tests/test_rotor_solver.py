"""passes.rotor on abstract chains: the paper's examples, and both DPs equal exhaustive search."""

import dataclasses
import itertools
import re

import pytest
from hypothesis import assume, given, settings, strategies as st

from fxremat.passes import rotor
from fxremat.passes.rotor import Chain, InfeasibleBudget, InvalidSequence
from strategies import chains

# The rotor paper's Table 2 (MB, ms) and, per ERRATA, its corrected optimal sequence at 90 MB.
TOY = dict(
    u_f=[1.60, 2.20, 2.44, 2.51, 2.10, 1.43], u_b=[3.05, 4.48, 5.09, 4.93, 4.21, 3.34],
    w_a=[9.54, 10.68, 11.06, 10.68, 9.54, 7.63], w_abar=[9.54, 10.68, 11.08, 10.66, 9.54, 7.63],
    w_a0=7.63, o_b=[20.01, 27.64, 30.99, 30.99, 27.64, 19.08])
TOY_SEQUENCE = ("F_ck^1 F_∅^2 F_∅^3 F_all^4 F_all^5 F_all^6 F_all^7 B^7 B^6 B^5 B^4 "
                "F_ck^1 F_∅^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1")


def scaled(chain, factor, integer=False):
    """The chain with every size and overhead multiplied by ``factor`` (then rounded)."""
    f = (lambda x: round(x * factor)) if integer else (lambda x: x * factor)  # noqa: E731
    sizes = {name: [f(x) for x in getattr(chain, name)]
             for name in ("w_a", "w_abar", "w_abar_last", "w_delta", "o_f", "o_b")}
    return dataclasses.replace(chain, w_a0=f(chain.w_a0), w_delta0=f(chain.w_delta0), **sizes)


def toy_chain():
    """Table 2 (MB, ms) with the loss as stage 7."""
    return Chain(**TOY).with_loss()


def fig4_chain(n):
    """The paper's Fig. 4: L = n + 2 stages, k = n - 2, backward costs and overheads 0."""
    length = n + 2
    u_f = [n - 2, 2] + [0] * (length - 2)
    w_a = [1] + [3] * (length - 2) + [4]
    return Chain(u_f=u_f, u_b=[0] * length, w_a=w_a, w_abar=w_a, w_a0=0).with_loss()


# ---------------------------------------------------------------------------- toy example

def test_toy_store_all_matches_paper():
    makespan, peak = rotor.simulate(toy_chain(), rotor.store_all(toy_chain()))
    assert makespan == pytest.approx(37.38)  # "37.4 ms"
    assert peak == pytest.approx(106.99)  # "107 MB": a^0, abar^1..abar^5, delta^4, delta^5, o_b^5


@pytest.mark.parametrize("persistent", [True, False])
def test_toy_at_90_mb_exact(persistent):
    exact = scaled(toy_chain(), 100, integer=True)  # whole 10 kB units: 9000 bins of 10 kB is exact
    sol = rotor.solve(exact, 9000, bins=None, persistent=persistent)
    assert rotor.format_sequence(sol.sequence) == TOY_SEQUENCE
    assert sol.sequence == rotor.parse_sequence(TOY_SEQUENCE)
    makespan, peak = rotor.simulate(toy_chain(), sol.sequence, budget=90)
    assert makespan == pytest.approx(47.42, abs=1e-9)
    assert peak == pytest.approx(86.75, abs=1e-9)  # at B^5: a^0 a^3 abar^4 abar^5 delta^5 delta^4 o_b^5
    assert sol.makespan == pytest.approx(47.42, abs=1e-9)


def test_toy_default_bins():
    sol = rotor.solve(toy_chain(), 90)  # 500 bins of 0.18 MB
    assert rotor.format_sequence(sol.sequence) == TOY_SEQUENCE
    assert sol.peak <= 90


# ---------------------------------------------------------------------- Fig. 4 counter-example

@pytest.mark.parametrize("n", [6, 10, 20])
def test_fig4_counter_example(n):
    chain = fig4_chain(n)
    persistent = rotor.solve(chain, 15, bins=None)
    weak = rotor.solve(chain, 15, bins=None, persistent=False)
    assert persistent.makespan == 3 * n - 2  # 16, 28, 58
    assert weak.makespan == 2 * n + 2  # 14, 22, 42
    assert rotor.is_persistent(persistent.sequence)
    assert not rotor.is_persistent(weak.sequence)
    for sol in (persistent, weak):
        assert rotor.simulate(chain, sol.sequence, budget=15) == (sol.makespan, sol.peak)


def test_fig4_n6_brute_force():
    chain = fig4_chain(6)
    assert rotor.brute_force(chain, 15).makespan == 14
    assert rotor.brute_force(chain, 15, persistent=True).makespan == 16


def test_small_chain_where_only_weak_persistence_is_optimal():
    # Found by random search (about 1 chain in 150): a^1 is kept, then dropped by F_∅^2.
    chain = Chain(u_f=[3, 4, 2, 0], u_b=[2, 1, 1, 2], w_a=[1, 5, 5, 5], w_abar=[1, 6, 7, 7], w_a0=0,
                  o_f=[1, 0, 2, 2], o_b=[0, 0, 2, 1]).with_loss()
    weak = rotor.solve(chain, 24, bins=None, persistent=False)
    assert weak.makespan == rotor.brute_force(chain, 24).makespan == 28
    assert rotor.format_sequence(weak.sequence) == (
        "F_ck^1 F_ck^2 F_∅^3 F_all^4 F_all^5 B^5 B^4 F_∅^2 F_all^3 B^3 F_all^1 F_all^2 B^2 B^1")
    assert rotor.solve(chain, 24, bins=None).makespan == rotor.brute_force(chain, 24, persistent=True).makespan == 31


# ------------------------------------------------------------ random chains vs brute force

def solve_or_none(*args, **kwargs):
    try:
        return rotor.solve(*args, **kwargs)
    except InfeasibleBudget:
        return None


def brute_or_none(*args, **kwargs):
    try:
        return rotor.brute_force(*args, **kwargs)
    except InfeasibleBudget:
        return None


@settings(max_examples=100, deadline=None)
@given(chains(), st.data())
def test_dps_equal_brute_force(chain, data):
    top = int(rotor.simulate(chain, rotor.store_all(chain))[1])
    least = int(rotor.min_budget(chain, persistent=False))
    budgets = {max(1, least - 1), least, top} | set(data.draw(
        st.lists(st.integers(least, top), min_size=2, max_size=2)))
    for budget in sorted(b for b in budgets if b >= 1):
        for persistent in (True, False):
            sol = solve_or_none(chain, budget, bins=None, persistent=persistent)
            best = brute_or_none(chain, budget, persistent=persistent)
            assert (sol is None) == (best is None)
            assert (sol is None) == (rotor.min_budget(chain, persistent) > budget)
            if sol is None:
                continue
            assert sol.makespan == best.makespan
            assert rotor.simulate(chain, sol.sequence, budget=budget) == (sol.makespan, sol.peak)
            if persistent:
                assert rotor.is_persistent(sol.sequence)
                assert rotor.is_persistent(best.sequence)


def test_dominant_sizes_equal_brute_force():
    # Random chains rarely make some memory checks the binding ones (e.g. F_ck^s with a
    # large o_f^s and a large held gradient): here every size and every pair of sizes in
    # turn dominates, on a 3-stage chain whose gradient delta^3 is held from the start.
    slots = [(f, i) for f in ("w_a", "w_abar", "w_abar_last", "w_delta", "o_f", "o_b") for i in range(3)]
    for big in itertools.chain(([x] for x in slots), itertools.combinations(slots, 2)):
        values = {f: [1, 1, 1] if f.startswith("w_") else [0, 0, 0]
                  for f in ("w_a", "w_abar", "w_abar_last", "w_delta", "o_f", "o_b")}
        for f, i in big:
            values[f][i] = 5
        chain = Chain(u_f=[1, 2, 3], u_b=[1, 1, 1], w_a0=1, **values)
        top = int(rotor.simulate(chain, rotor.store_all(chain))[1])
        for budget in range(int(rotor.min_budget(chain, False)) - 1, top + 1):
            for persistent in (True, False):
                sol = solve_or_none(chain, budget, bins=None, persistent=persistent)
                best = brute_or_none(chain, budget, persistent=persistent)
                assert (sol and sol.makespan) == (best and best.makespan), (big, budget, persistent)
                if sol is not None:
                    rotor.simulate(chain, sol.sequence, budget=budget)


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(2, 60), st.floats(0.0, 1.0))
def test_rounded_bins_fit_the_budget(chain, bins, where):
    chain = scaled(chain, 0.37)  # real-valued sizes
    least = rotor.min_budget(chain)
    top = rotor.simulate(chain, rotor.store_all(chain))[1]
    budget = least + where * (top - least) + 1e-6
    sol = solve_or_none(chain, budget, bins=bins)
    assume(sol is not None)  # rounding up may need more than the exact minimum
    makespan, peak = rotor.simulate(chain, sol.sequence)
    assert peak <= budget * (1 + 1e-9)
    assert makespan >= rotor.brute_force(chain, budget).makespan - 1e-9


def test_min_budget_is_tight():
    chain = fig4_chain(6)
    for persistent in (True, False):
        least = rotor.min_budget(chain, persistent)
        assert rotor.solve(chain, least, bins=None, persistent=persistent).peak == least
        with pytest.raises(InfeasibleBudget, match=f"minimum feasible budget .* is {least:g}") as err:
            rotor.solve(chain, least - 1, bins=None, persistent=persistent)
        assert err.value.min_budget == least


def test_infeasible_budget_names_the_minimum():
    with pytest.raises(InfeasibleBudget, match="minimum feasible budget") as err:
        rotor.solve(toy_chain(), 50)
    assert err.value.min_budget == pytest.approx(rotor.min_budget(toy_chain()))
    assert 50 < err.value.min_budget <= 90
    # Rounding to a few bins can make a feasible budget infeasible: the message says so.
    least = rotor.min_budget(toy_chain())
    with pytest.raises(InfeasibleBudget, match="rounded up to 3 bins"):
        rotor.solve(toy_chain(), least + 0.01, bins=3)


# ------------------------------------------------------------------------- monotonicity

@settings(max_examples=25, deadline=None)
@given(chains(max_stages=6))
def test_makespan_non_increasing_in_budget(chain):
    top = int(rotor.simulate(chain, rotor.store_all(chain))[1])
    previous = {True: float("inf"), False: float("inf")}
    for budget in range(max(1, int(rotor.min_budget(chain, False))), top + 2):
        for persistent in (True, False):
            sol = solve_or_none(chain, budget, bins=None, persistent=persistent)
            makespan = float("inf") if sol is None else sol.makespan
            assert makespan <= previous[persistent]
            previous[persistent] = makespan
        assert previous[False] <= previous[True]  # the exact DP is never worse
    # Enough memory: no recomputation (F_all^L runs with delta^L current: u_f_last).
    assert previous[True] == rotor.simulate(chain, rotor.store_all(chain))[0] == \
        sum(chain.u_f[:-1]) + chain.u_f_last[-1] + sum(chain.u_b)


# ------------------------------------------------------------------------ the validator

@pytest.mark.parametrize("sequence, message", [
    ("F_all^1 F_all^2 B^1", "needs delta^1"),
    ("F_ck^1 F_ck^2 F_all^3 B^3 B^2", "abar^2 is not in memory"),
    ("F_∅^1 F_all^2 F_all^3 B^3 B^2 F_all^1", "F_all^1: a^0 is not in memory"),
    ("F_∅^1 F_∅^2 F_all^3 B^3 F_all^2", "a^1 is not in memory"),
    ("F_all^1 F_all^1", "a^1 is already in memory"),
    ("F_all^1 F_all^2 F_all^3 B^3 B^2", "ends with delta^1"),
    ("F_all^4", "no stage 4"),
])
def test_simulate_rejects_invalid_sequences(sequence, message):
    chain = Chain(u_f=[1, 1, 1], u_b=[1, 1, 1], w_a=[1, 1, 1], w_abar=[2, 2, 2], w_a0=1)
    with pytest.raises(InvalidSequence, match=re.escape(message)):
        rotor.simulate(chain, rotor.parse_sequence(sequence))


def test_simulate_counts_memory_as_documented():
    chain = Chain(u_f=[1, 2], u_b=[3, 4], w_a=[10, 20], w_abar=[15, 25], w_a0=5,
                  w_delta=[100, 200], w_delta0=1000, o_f=[0.5, 0.25], o_b=[7, 9])
    sequence = rotor.parse_sequence("F_ck^1 F_all^2 B^2 F_all^1 B^1")
    assert rotor.memory_profile(chain, sequence) == [
        5 + 200 + 10 + 0.5,  # F_ck^1: a^0, delta^2, its output a^1, o_f^1
        5 + 200 + 10 + 25 + 0.25,  # F_all^2: + abar^2, o_f^2
        5 + 200 + 10 + 25 + 100 + 9,  # B^2: + delta^1, o_b^2; then frees delta^2, abar^2, a^1
        5 + 100 + 15 + 0.5,  # F_all^1: a^0, delta^1, abar^1, o_f^1
        5 + 100 + 15 + 1000 + 7,  # B^1: + delta^0, o_b^1
    ]
    assert rotor.simulate(chain, sequence) == (1 + 2 + 4 + 1 + 3, 1127)
    with pytest.raises(InvalidSequence, match=r"operation 4 \(B\^1\) needs 1127 > budget 1126"):
        rotor.simulate(chain, sequence, budget=1126)
    # F_∅^s keeps abar^(s-1) but frees a plain a^(s-1).
    kept = rotor.parse_sequence("F_all^1 F_∅^2 F_all^3 B^3")
    freed = rotor.parse_sequence("F_ck^1 F_∅^2 F_all^3 B^3")
    chain3 = Chain(u_f=[1, 1, 1], u_b=[1, 1, 1], w_a=[1, 2, 4], w_abar=[8, 16, 32], w_a0=0, w_delta=[0, 0, 0])
    assert rotor.memory_profile(chain3, kept[:3]) == [8, 8 + 2, 8 + 2 + 32]
    assert rotor.memory_profile(chain3, freed[:3]) == [1, 1 + 2, 2 + 32]


def test_parameter_gradients_stay_to_the_end():
    # w_g^s: made by B^s, held through every later operation (recomputations included).
    chain = Chain(u_f=[1, 1], u_b=[1, 1], w_a=[10, 20], w_abar=[15, 25], w_a0=5,
                  w_delta=[100, 200], w_delta0=1000, o_f=[1, 2], o_b=[7, 9], w_g=[3000, 4000])
    sequence = rotor.parse_sequence("F_ck^1 F_all^2 B^2 F_all^1 B^1")
    assert rotor.memory_profile(chain, sequence) == [
        5 + 200 + 10 + 1,
        5 + 200 + 10 + 25 + 2,
        5 + 200 + 10 + 25 + 100 + 4000 + 9,  # B^2 makes delta^1 and its parameters' gradients
        5 + 100 + 4000 + 15 + 1,  # the recomputation runs beside them
        5 + 100 + 4000 + 15 + 1000 + 3000 + 7,
    ]
    # Counted from when they are made, not throughout: the DP finds the plan that fits.
    budget = 5 + 100 + 4000 + 15 + 1000 + 3000 + 7
    sol = rotor.solve(chain, budget, bins=None)
    assert sol.peak <= budget
    assert sol.makespan == rotor.brute_force(chain, budget).makespan


def test_last_forward_of_a_segment_skips_its_output():
    # F_all^s run while delta^s is current (the stages after s are done) costs u_f_last:
    # nothing reads a^s again. Without a loss stage, the sequence starts with delta^2.
    chain = Chain(u_f=[10, 10], u_b=[1, 1], w_a=[4, 4], w_abar=[8, 8], w_a0=0, u_f_last=[3, 6])
    store_all = rotor.parse_sequence("F_all^1 F_all^2 B^2 B^1")
    assert rotor.simulate(chain, store_all)[0] == 10 + 6 + 1 + 1
    # Recomputing stage 1 after B^2 runs it with delta^1 current: 3, not 10.
    recompute = rotor.parse_sequence("F_ck^1 F_all^2 B^2 F_all^1 B^1")
    assert rotor.simulate(chain, recompute)[0] == 10 + 6 + 1 + 3 + 1
    # At that sequence's peak (below store-all's), the DPs and brute force charge the same.
    budget = rotor.simulate(chain, recompute)[1]
    assert budget < rotor.simulate(chain, store_all)[1]
    for persistent in (True, False):
        sol = rotor.solve(chain, budget, bins=None, persistent=persistent)
        assert sol.makespan == 21 == rotor.brute_force(chain, budget, persistent).makespan


def test_with_loss_and_parsing():
    chain = toy_chain()
    assert chain.length == 7 and chain.with_loss() is chain
    assert chain.w_delta[-1] == 0 and chain.w_delta[-2] == 7.63
    ops = rotor.parse_sequence("F_ck^1 F_none^2 F_0^3 F_all^4 B^4")
    assert rotor.format_sequence(ops) == "F_ck^1 F_∅^2 F_∅^3 F_all^4 B^4"
    with pytest.raises(ValueError):
        rotor.parse_sequence("G^1")
