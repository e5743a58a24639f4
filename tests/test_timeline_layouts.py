"""The timeline's model of where Inductor writes a value: over a buffer it reads, or beside
it, and how many bytes a returned value's buffer spans (partition level).

Found on two Hugging Face models outside the zoo (``bench/frontier_models.py``'s ``UNSEEN``,
small scale, budget 0.5), whose measured peaks were over their predictions:

- GPT-NeoX's query-key-value gradient, the contiguous copy of a permuted concatenation, was
  predicted written over the concatenation (its last reader, the same size); Inductor writes
  over a buffer only where it reads it at the index it writes (``SchedulerNode.can_inplace``),
  so it was written beside it. The prediction was low by the concatenation's bytes away from
  the peak, and Inductor's buffer reuse, bounded by the prediction, filled that slack: 0.92% over;
- T5's decoder input ids, a copy into a column of a 4 x 128 matrix, are returned by the forward
  with the column's strides (``keep_output_stride``), in a buffer spanning 385 elements for 4.
"""

import torch

from fxremat.timeline import predict
from conftest import aten_graph

aten = torch.ops.aten

N = 128  # square fp32 matrices: 64 KiB each
ONE = N * N * 4


def _forward(x):
    relu_default = aten.relu.default(x)
    return (aten.sum.default(relu_default), relu_default)


def _backward_permuted_copy(relu_default, tangents_1):
    # the saved value's last reader: a contiguous copy of its transpose
    return (aten.clone.default(aten.permute.default(relu_default, [1, 0]), memory_format=torch.contiguous_format),)


def _backward_in_order(relu_default, tangents_1):
    # the saved value's last reader, reading it where it writes
    return (aten.mul.Tensor(relu_default, tangents_1),)


def _peak(backward):
    x = torch.randn(N, N)
    fwd = aten_graph(_forward, x)
    bwd = aten_graph(backward, torch.relu(x), torch.tensor(1.0))
    return predict(fwd, bwd, 1, fusion=True)


def test_a_value_read_out_of_its_order_is_not_written_over():
    in_order, permuted = _peak(_backward_in_order), _peak(_backward_permuted_copy)
    # in order: the product written over the saved value it reads last; permuted: beside it
    assert permuted.peak_bytes == in_order.peak_bytes + ONE, (in_order.as_records(), permuted.as_records())
    step = next(i for i, s in enumerate(permuted.steps) if s.name == "clone_default")
    assert permuted.live_bytes[step] >= 2 * ONE, permuted.as_records()


def _forward_column_copy(ids):
    column = aten.select.int(ids, 1, 0)
    started = aten.copy.default(column, aten.full.default([4], 7, dtype=torch.int64))
    return (aten.sum.default(aten.mul.Tensor(ids, 2)), started)


def test_a_returned_value_with_gaps_in_its_strides_takes_its_span():
    ids = torch.zeros(4, N, dtype=torch.int64)
    fwd = aten_graph(_forward_column_copy, ids)
    started = fwd.graph.find_nodes(op="call_function", target=aten.copy.default)[0]
    assert started.meta["val"].stride() == (N,)

    def _backward(copy_default, tangents_1):
        return (None,)

    bwd = aten_graph(_backward, started.meta["val"], torch.tensor(1.0))
    timeline = predict(fwd, bwd, 1, fusion=True)
    allocated = {s: n for step in timeline.steps for s, n in step.allocates.items()}
    assert allocated["forward:copy_default"] == (3 * N + 1) * 8, timeline.as_records()
