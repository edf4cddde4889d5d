from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cerebro_db.errors import CerebroError
from cerebro_db.preprocess import (
    decode_arrays,
    default_buffer_size,
    one_hot,
    plan_buffers,
    shuffle_order,
)


def array_send(values, dims=None, elem="float4", null_at=None):
    """What PostgreSQL's array_send produces for a real[] / smallint[] value."""
    values = list(values)
    dims = dims or [len(values)]
    oid, fmt = (700, ">f") if elem == "float4" else (21, ">h")
    out = struct.pack(">iii", len(dims), 1 if null_at is not None else 0, oid)
    for d in dims:
        out += struct.pack(">ii", d, 1)
    for i, v in enumerate(values):
        if i == null_at:
            out += struct.pack(">i", -1)
        else:
            out += struct.pack(">i", struct.calcsize(fmt)) + struct.pack(fmt, v)
    return out


def test_madlib_default_buffer_size():
    # Fashion-MNIST on 2 partitions: one buffer per partition
    assert default_buffer_size(60000, 784, 2) == 30000
    # wide data: capped by 75e6 / feature size, and the buffer count a multiple of p
    # 1000 rows of 1M features on 3 partitions: at most 75 rows a buffer, so 14 buffers,
    # made 15 (a multiple of 3) of 67 rows
    assert default_buffer_size(1000, 1_000_000, 3) == 67
    assert default_buffer_size(1000, 100_000, 3) == 334  # rows / p wins


@given(st.integers(1, 5000), st.integers(1, 3000), st.integers(1, 8),
       st.one_of(st.none(), st.integers(1, 800)))
def test_plan_is_madlibs_layout(n, width, p, bs):
    """MADlib's _get_buffer_size over p segments, then buffer_id = row / buffer_size."""
    plan = plan_buffers(n, width, p, bs)
    want = bs if bs is not None else math.ceil(min(75e6 / width, n / p))
    size = math.ceil(n / (p * math.ceil(n / want / p)))
    assert plan.buffer_size == size
    sizes = [b - a for a, b in plan.bounds]
    assert sum(sizes) == n and plan.bounds[0][0] == 0 and plan.bounds[-1][1] == n
    assert all(a == i * size for i, (a, _) in enumerate(plan.bounds))
    assert all(s == size for s in sizes[:-1]) and 1 <= sizes[-1] <= size
    if bs is not None:
        assert size <= bs
    assert {plan.dist_key(b) for b in range(plan.num_buffers)} == \
        set(range(min(p, plan.num_buffers)))


def test_plan_examples_as_madlib():
    # MADlib on PostgreSQL (one segment): 17 rows of buffer_size 5 give 5, 5, 5, 2
    for p in (1, 2):
        plan = plan_buffers(17, 4, p, 5)
        assert [b - a for a, b in plan.bounds] == [5, 5, 5, 2]
    # three partitions (Greenplum with three segments): 6 buffers of 3
    assert [b - a for a, b in plan_buffers(17, 4, 3, 5).bounds] == [3, 3, 3, 3, 3, 2]
    # fewer rows than partitions: one buffer, the other partitions stay empty
    one = plan_buffers(1, 4, 4)
    assert one.bounds == ((0, 1),) and one.dist_key(0) == 0
    three = plan_buffers(3, 4, 4)
    assert [three.dist_key(b) for b in range(three.num_buffers)] == [0, 1, 2]


def test_shuffle_is_seeded_permutation():
    a, b, c = shuffle_order(100, 1), shuffle_order(100, 1), shuffle_order(100, 2)
    assert (a == b).all() and not (a == c).all() and sorted(a) == list(range(100))


def test_decode_float_arrays_and_shapes():
    rows = [array_send([i, i + 0.5, -i, 2], dims=[2, 2]) for i in range(5)]
    vals, dims = decode_arrays(rows, "float4", "x")
    assert dims == (2, 2) and vals.dtype == np.float32
    assert np.array_equal(vals[3], np.array([3, 3.5, -3, 2], np.float32))
    ints, _ = decode_arrays([array_send([1, 0, 0], elem="int2")], "int2", "y")
    assert ints.dtype == np.int16 and ints.tolist() == [[1, 0, 0]]


@pytest.mark.parametrize("rows,words", [
    ([array_send([1, 2]), None], "NULL in some rows"),
    ([array_send([1, 2]), array_send([1, 2], null_at=1)], "NULL elements"),
    ([array_send([1, 2]), array_send([1, 2, 3])], "same shape"),
    ([array_send([1, 2, 3, 4], dims=[2, 2]), array_send([1, 2, 3, 4], dims=[4])], "same shape"),
    ([struct.pack(">iii", 0, 0, 700)], "empty"),
])
def test_decode_rejects_bad_rows(rows, words):
    with pytest.raises(CerebroError) as e:
        decode_arrays(rows, "float4", "x")
    assert words in e.value.message


def test_one_hot():
    assert one_hot(np.array([2, 0]), 4).tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]
    assert one_hot(np.array([1]), 2).dtype == np.int16
