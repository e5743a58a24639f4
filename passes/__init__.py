"""Rematerialization passes and solvers, each testable on small abstract problems.

Installed as ``fxremat.passes``. Solvers take plain Python data (names, sizes,
edges), not FX graphs, so they can be checked against brute force.
"""
