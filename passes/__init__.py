"""The solvers of fxremat, on abstract problems: no torch, plain data in and out.

Installed as ``fxremat.passes`` (``pyproject.toml``, ``package-dir``). Every module
takes plain Python data -- node names, sizes, costs, edges -- never an FX graph or a
tensor, so that each solver can be checked against brute force on small problems;
``fxremat/`` maps FX graphs to these problems and the answers back. Every module
docstring states the problem, the method (with its paper), the complexity and a
small example that runs as a doctest (``tests/test_doctests.py``); every public
function and class states its parameters, returns, raises and complexity.

Modules
-------
mincut.py                 fusion-aware min-cut choice of the saved values (Yu & He, MLSys 2023)
knapsack.py               which saved values to give up under a budget: greedy knapsack, galloping search
memory.py                 live bytes of a step's operations, each storage freed after its last reader
remat_problem.py          the DAG rematerialization problem: nodes, edges, costs, sizes, outputs, ties
schedule.py               compute/free schedules of such a problem and the simulator that judges them
checkmate.py              Checkmate (Jain et al., MLSys 2020): the ILP entry point, re-exports the rest
checkmate_milp.py         - the MILP over staged schedules (variables, constraints); result and error types
checkmate_rounding.py     - two-phase LP rounding with repair and local search (solve_lp)
checkmate_brute_force.py  - exhaustive search over all or staged schedules: the tests' references
twremat.py                TWRemat (Kumar et al., NeurIPS 2019): tree-decomposition divide and conquer
rotor.py                  Rotor (Beaumont et al., TOMS 2024) on chains: the entry point, re-exports the rest
rotor_chain.py            - the chain, its operations and their text form, the answer
rotor_simulate.py         - the memory model run on a sequence: validity, makespan, peak
rotor_persistent.py       - the memory-persistent dynamic program (Algorithms 3/4)
rotor_weak.py             - the exact, weakly persistent dynamic program (Algorithms 1/2)
rotor_brute_force.py      - exhaustive search over sequences: the tests' reference
chain_dag.py              Rotor chains as schedule DAGs: Checkmate and Rotor on one problem
"""
