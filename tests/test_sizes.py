"""Sizes of FX nodes: views, aliases, multi-output ops, symbolic shapes."""

import operator

import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxremat
from fxremat.sizes import describe, node_bytes, node_bytes_expr, storage_of


def _trace(fn, *args, symbolic=False):
    if symbolic:
        return make_fx(fn, tracing_mode="symbolic")(*args)
    return make_fx(fn)(*args)


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def test_views_and_aliases_share_their_base_storage():
    def f(x):
        y = x.sin()
        return y.view(-1), y.t(), torch.ops.aten.alias(y), torch.ops.aten._unsafe_view(y, [64])

    gm = _trace(f, torch.randn(8, 8))
    sin = _node(gm, torch.ops.aten.sin.default)
    for target in (torch.ops.aten.view.default, torch.ops.aten.t.default, torch.ops.aten.alias.default,
                   torch.ops.aten._unsafe_view.default):
        assert storage_of(_node(gm, target)) == sin.name
    assert node_bytes(sin) == 8 * 8 * 4


def test_multi_output_node_counts_every_item_and_items_are_their_own_storage():
    gm = _trace(lambda x: torch.var_mean(x, dim=1), torch.randn(8, 16, dtype=torch.float64))
    var_mean = _node(gm, torch.ops.aten.var_mean.correction)
    assert node_bytes(var_mean) == 2 * 8 * 8
    items = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert [storage_of(n) for n in items] == [n.name for n in items]
    assert [node_bytes(n) for n in items] == [64, 64]


def test_symbolic_shapes_stay_symbolic_in_reports():
    gm = _trace(lambda x: (x * 2).half(), torch.randn(5, 3), symbolic=True)
    node = next(n for n in gm.graph.nodes if n.op == "call_function" and n.meta["val"].dtype == torch.float16)
    expr = node_bytes_expr(node)
    assert len(expr.free_symbols) == 2  # both dims dynamic under symbolic tracing
    assert node_bytes(node) == 5 * 3 * 2  # evaluated with the traced sizes
    row = describe(node)
    assert row["bytes"] == 30 and "bytes_symbolic" in row and row["shape"] != ["5", "3"]


def test_plan_of_a_dynamic_batch_shows_the_symbol():
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    compiled = torch.compile(lambda x, w: (x @ w).tanh().sum(), backend="fxremat", options={"compiler": "eager"})
    compiled(x, w).backward()
    plan = fxremat.inspect.plans()[-1]
    mm = next(s for s in plan.saved if s["name"] == "mm")
    batch = sympy.Symbol(mm["shape"][0], positive=True, integer=True)
    assert mm["shape"][1] == "16" and not mm["shape"][0].isdigit()
    assert mm["bytes"] == 8 * 16 * 4
    assert sympy.simplify(sympy.sympify(mm["bytes_symbolic"], locals={batch.name: batch}) - 64 * batch) == 0


def test_a_cuda_tensor_takes_whole_512_byte_blocks_and_a_cpu_tensor_its_bytes():
    """The CUDA caching allocator rounds every block up to 512 bytes, and
    ``max_memory_allocated`` counts blocks; c10's CPU allocator takes exact sizes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxremat.sizes import CUDA_BLOCK_BYTES, tensor_bytes

    with FakeTensorMode():  # no GPU needed for a fake CUDA tensor
        assert tensor_bytes(torch.empty(3, device="cuda")) == CUDA_BLOCK_BYTES == 512
        assert tensor_bytes(torch.empty(128, device="cuda")) == 512
        assert tensor_bytes(torch.empty(129, device="cuda")) == 1024
        assert tensor_bytes(torch.empty(0, device="cuda")) == 0
        assert tensor_bytes(torch.empty(3, device="cpu")) == 12


def test_bytes_alive_as_a_backward_begins_count_each_storage_once():
    """``alive_at_backward_bytes``: the saved storages, the held outputs in storages of their
    own (a view of a saved value adds nothing), and the incoming gradients."""
    from fxremat.sizes import alive_at_backward_bytes, handed_over_bytes

    def f(x, w):
        y = x.sin()
        z = y @ w
        return z, y.t(), z.relu()

    gm = _trace(f, torch.randn(8, 16), torch.randn(16, 4))
    sin, mm = _node(gm, torch.ops.aten.sin.default), _node(gm, torch.ops.aten.mm.default)
    relu, t = _node(gm, torch.ops.aten.relu.default), _node(gm, torch.ops.aten.t.default)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert handed_over_bytes([sin]) == 8 * 16 * 4
    # held: z (its own storage), y.t() (sin's storage, saved already); incoming: a gradient like relu
    assert alive_at_backward_bytes([sin], held=[mm, t], incoming=[relu]) == 8 * 16 * 4 + 8 * 4 * 4 + 8 * 4 * 4
    # a step input (excluded) is not counted, held or saved
    assert alive_at_backward_bytes([sin, x], held=[x], exclude={x.name}) == 8 * 16 * 4
