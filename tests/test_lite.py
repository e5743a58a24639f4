"""fxremat.lite: the light graphs searches score candidates on are torch's graphs without
FX's bookkeeping. The extracted graphs have the same nodes as torch's extractor gives,
and every candidate a search scores predicts on its light graphs the peak it predicts
on its torch.fx graphs (not only the one chosen, which ``Candidate.realize`` checks)."""

import warnings

import pytest
import torch

import fxremat
from fxremat import candidate as candidate_module, lite, models
from fxremat.backend import FxrematPartitioner, _eager_compile
from fxremat.options import Options
from fxremat.strategies import knapsack, staged


def _contexts(make, kwargs, monkeypatch):
    """The planning contexts of ``make(**kwargs)``'s graphs (from an unconstrained plan)."""
    from fxremat import partition as partition_module

    found = []
    real_context = partition_module.context

    def context(*args, **kw):
        found.append(real_context(*args, **kw))
        return found[-1]

    monkeypatch.setattr(partition_module, "context", context)
    _plan(make, kwargs, {"solver": "mincut"})
    return found


def _plan(make, kwargs, options):
    torch.manual_seed(0)
    model, batch = make(**kwargs)
    torch._dynamo.reset()
    fxremat.inspect.clear()

    def backend(gm, example_inputs):
        return _eager_compile(gm, example_inputs, FxrematPartitioner(Options.from_user(options)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(model, backend=backend)(*batch).backward()
    torch._dynamo.reset()
    return fxremat.inspect.plans()


def _shape(gm):
    return [(n.name, n.op, str(n.target), [a.name for a in n.all_input_nodes]) for n in gm.graph.nodes]


@pytest.mark.parametrize("make, kwargs", [(models.make_transformer, dict(batch=2, seq=16, layers=2, dropout=0.1)),
                                          (models.make_deep_cnn, dict(batch=2, size=16, depth=3))])
def test_extraction_gives_torchs_nodes(monkeypatch, make, kwargs):
    """Same nodes, in the same order, reading the same inputs, as torch's extractor (with
    random ops, whose purity keeps them alive, and convolutions)."""
    from fxremat.strategies import mincut

    for ctx in _contexts(make, kwargs, monkeypatch):
        lean, _ = mincut.lean(ctx)
        for saved in (mincut.traffic_optimal(ctx).saved, lean):
            for template in (False, True):
                real = candidate_module.extract(ctx, saved, backward_template=template)
                light = candidate_module.extract(ctx, saved, backward_template=template, light=True)
                assert lite.is_light(light[0]) and not lite.is_light(real[0])
                for r, l in zip(real, light):
                    got, want = _shape(l), _shape(r)
                    if template:  # torch's template also has the placeholders' order from its convention
                        got, want = sorted(got), sorted(want)
                    assert got == want


@pytest.mark.parametrize("make, kwargs, compiler", [
    (models.make_transformer, dict(batch=2, seq=32, layers=3, dropout=0.1), "inductor"),
    (models.make_unet, dict(batch=2, size=16), "inductor"),
    (models.make_deep_cnn, dict(batch=2, size=16, depth=4), "eager"),
])
def test_every_scored_candidate_predicts_its_fx_peak(monkeypatch, make, kwargs, compiler):
    """Every Rotor probe and knapsack probe of ``solver="auto"`` at two budgets, built
    again as torch.fx graphs: the same predicted peak (and Rotor's, the same estimated time)."""
    checked = []
    real_make = staged.StagedProblem.make

    def make_probe(self, schedule, **kw):
        probe = real_make(self, schedule, **kw)
        if probe is not None and probe.candidate.rebuild is not None:
            light_peak, light_estimate = probe.peak, self.ctx.estimate(probe.candidate)
            probe.candidate.realize()  # raises if the FX graphs predict another peak
            checked.append(light_peak == probe.peak and light_estimate == self.ctx.estimate(probe.candidate))
        return probe

    real_candidate = knapsack.make_candidate

    def make_candidate(ctx, solver, fwd, bwd, saved, *args, **kw):
        scored = real_candidate(ctx, solver, fwd, bwd, saved, *args, **kw)
        if lite.is_light(fwd):
            real_fwd, real_bwd, _ = candidate_module.extract_placed(ctx, saved)
            checked.append(real_candidate(ctx, solver, real_fwd, real_bwd, saved, *args, **kw).peak == scored.peak)
        return scored

    monkeypatch.setattr(staged.StagedProblem, "make", make_probe)
    monkeypatch.setattr(knapsack, "make_candidate", make_candidate)
    for budget in (0.6, 0.4):
        try:
            _plan(make, kwargs, {"memory_budget": budget, "compiler": compiler})
        except Exception as error:  # noqa: BLE001 - a budget no plan meets is fine here
            cause = getattr(error, "inner_exception", None) or error
            assert isinstance(cause, fxremat.BudgetError), error
    assert len(checked) >= 4 and all(checked)


def test_a_byte_budget_under_the_floor_is_refused_at_once(monkeypatch):
    """Under what every plan keeps to the end of the step (the parameter gradients), a byte
    budget is refused before any solver searches, naming the floor; at the floor, the
    search runs and names the least plan, which is at or above the floor."""
    from fxremat.strategies import SOLVERS

    searched = []
    real_plan = type(SOLVERS["auto"]).plan

    def plan(self, *args, **kw):
        searched.append(self.name)
        return real_plan(self, *args, **kw)

    monkeypatch.setattr(type(SOLVERS["auto"]), "plan", plan)
    kwargs = dict(batch=2, seq=16, layers=2)
    with pytest.raises(Exception) as caught:
        _plan(models.make_transformer, kwargs, {"memory_budget": 1})
    floor_error = getattr(caught.value, "inner_exception", None) or caught.value
    assert isinstance(floor_error, fxremat.BudgetError) and "floor" in str(floor_error) and not searched
    grads = sum(p.numel() * 4 for p in models.make_transformer(**kwargs)[0].parameters())
    assert floor_error.least_bytes >= grads  # float32 gradients, alive at the end
    with pytest.raises(Exception) as caught:
        _plan(models.make_transformer, kwargs, {"memory_budget": floor_error.least_bytes})
    least_error = getattr(caught.value, "inner_exception", None) or caught.value
    assert searched and isinstance(least_error, fxremat.BudgetError) and "minimum feasible" in str(least_error)
    assert least_error.least_bytes >= floor_error.least_bytes
    assert least_error.floor_bytes == floor_error.least_bytes and "x the floor" in str(least_error)
    plans = _plan(models.make_transformer, kwargs, {"memory_budget": least_error.least_bytes})
    assert plans[-1].predicted_peak_bytes <= least_error.least_bytes
    assert plans[-1].timeline.end_bytes <= floor_error.least_bytes == plans[-1].notes["floor_bytes"]
    # The fraction 0.0 is never refused: it is that least plan, or here, where the least plan
    # predicts within 5% of the min-cut plan (nothing to trade), the min-cut plan.
    [plan] = _plan(models.make_transformer, kwargs, {"memory_budget": 0.0})
    assert plan.notes["nothing_to_trade"] and plan.solver == "mincut"
    assert least_error.least_bytes <= plan.predicted_peak_bytes == plan.budget_bytes < least_error.least_bytes / 0.95


def test_planning_runs_on_a_fresh_stack_as_the_caller():
    """``_compat.on_fresh_stack`` (CPython gh-142183): the planner's thread hands back its
    result, raises what it raised in the caller's thread, and sees the caller's thread-local
    state: Dynamo's tracing context (without it the plan recomputed ``rand``), the fake mode,
    the Python dispatcher and grad mode."""
    import threading

    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxremat import _compat

    assert _compat.on_fresh_stack(lambda a, b=0: (threading.current_thread().name, a + b), 1, b=2) == \
        ("fxremat-planner", 3)
    with pytest.raises(KeyError, match="missing"):
        _compat.on_fresh_stack(lambda: {}["missing"])

    def state():
        return (TracingContext.try_get(), torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE),
                torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher),
                torch.is_grad_enabled())

    fake = FakeTensorMode()
    context = TracingContext(fake)
    with tracing(context), fake, torch._C._EnablePythonDispatcher(), torch.no_grad():
        assert _compat.on_fresh_stack(state) == (context, fake, True, False) == state()
    assert _compat.on_fresh_stack(state) == (None, None, False, True) == state()



def test_the_least_memory_ladder_builds_only_rungs_that_can_matter(monkeypatch):
    """Asked for its least-memory plan (the fraction 0.0), Rotor's ladder skips the rungs
    whose bytes alive as its backward begins are over the least peak so far: the same plan as
    building every rung, from fewer candidates."""
    from fxremat.candidate import Context

    built = []
    real_build = staged.StagedProblem._build

    def build(self, schedule, light=False, **kw):
        built.append(schedule)
        return real_build(self, schedule, light, **kw)

    monkeypatch.setattr(staged.StagedProblem, "_build", build)
    kwargs, options = dict(batch=2, seq=32, layers=4), {"memory_budget": 0.0, "solver": "rotor", "compiler": "eager"}
    pruned = _plan(models.make_transformer, kwargs, options)
    pruned_builds = len(built)
    built.clear()
    monkeypatch.setattr(Context, "backward_start_bytes", lambda *args: 0)  # a bound that never skips
    every = _plan(models.make_transformer, kwargs, options)
    assert [(p.predicted_peak_bytes, p.saved, p.sequence) for p in pruned] == \
        [(p.predicted_peak_bytes, p.saved, p.sequence) for p in every]
    assert 0 < pruned_builds < len(built)


def test_a_nodes_facts_are_remembered_only_while_it_is_planned(monkeypatch):
    """``memo.per_meta`` answers once for a node and its light copies while a graph is
    planned (the same plan, from far fewer questions), then forgets: no graph stays alive
    through the memo after planning."""
    import contextlib

    from fxremat import memo, sizes

    asked = []
    real = sizes._node_bytes
    monkeypatch.setattr(sizes, "_node_bytes", lambda node: asked.append(node) or real(node))
    kwargs, options = dict(batch=2, seq=16, layers=2), {"memory_budget": 0.5, "compiler": "eager"}
    remembered = _plan(models.make_transformer, kwargs, options)
    assert memo._MEMO.get() is None
    with_memo = len(asked)
    asked.clear()
    monkeypatch.setattr(memo, "planning", contextlib.nullcontext)
    afresh = _plan(models.make_transformer, kwargs, options)
    assert [(p.predicted_peak_bytes, p.saved) for p in remembered] == [(p.predicted_peak_bytes, p.saved) for p in afresh]
    assert 0 < 3 * with_memo < len(asked)


def test_the_chosen_graphs_stay_lazy_and_the_plan_quotes_their_code(monkeypatch):
    """The planner hands back lazy GraphModules (their code compiled where they first run,
    as PyTorch's partitioner leaves its own: compiling it was the planner's memory peak) and
    quotes the code they compile to (``_compat.graph_source``), at a budget (light graphs built
    again as torch.fx ones) and without."""
    from fxremat import backend

    handed = []
    real_partition = backend.partition

    def partition(*args, **kwargs):
        fwd, bwd, plan = real_partition(*args, **kwargs)
        lazy = fwd._needs_recompile() and bwd._needs_recompile()
        handed.append((lazy, (plan.forward_code, plan.backward_code), (fwd.code, bwd.code)))  # .code compiles
        return fwd, bwd, plan

    monkeypatch.setattr(backend, "partition", partition)
    for options in ({"memory_budget": 0.5}, {}):
        handed.clear()
        _plan(models.make_transformer, dict(batch=2, seq=8, dim=16, layers=2), options)
        assert handed
        for lazy, quoted, compiled in handed:
            assert lazy
            assert quoted == compiled
