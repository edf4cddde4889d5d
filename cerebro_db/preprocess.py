"""Packing rows into training buffers: the pure part of the preprocessors.

Rows are read from PostgreSQL as ``array_send(col::float4[])`` (the binary send format of
an array: a header, then a length word and four big-endian bytes per element). Decoding
that with numpy costs a few memory passes, no Python object per element, which is what
makes preprocessing about as fast as reading the rows (MADlib builds the buffers with a
Python list per row and takes minutes for Fashion-MNIST).

A packed buffer holds ``rows`` examples: features as little-endian float32 in C order
(``[rows, dims...]``), labels as int16 one-hot (``[rows, classes]``) or, for regression
targets, float32. Buffer ``b`` goes to partition ``b % p`` (the ``__dist_key__``); a
partition may hold no buffer (a table with fewer buffers than partitions).
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from .errors import DATA_EXCEPTION, FLOATING_POINT_EXCEPTION, NULL_VALUE_NOT_ALLOWED, CerebroError

MADLIB_BUFFER_BYTES = 75_000_000  # MADlib's rule: about 75M feature values per buffer
_ELEM = {"float4": (">f4", 4), "int2": (">i2", 2)}


def default_buffer_size(num_rows: int, feature_size: int, num_partitions: int) -> int:
    """MADlib's default: ``ceil(min(75e6 / feature_size, rows / partitions))``, then evened
    out so the number of buffers is a multiple of the number of partitions."""
    if num_rows < 1 or feature_size < 1 or num_partitions < 1:
        raise ValueError("num_rows, feature_size and num_partitions must be positive")
    size = math.ceil(min(MADLIB_BUFFER_BYTES / feature_size, num_rows / num_partitions))
    return _evened(num_rows, size, num_partitions)


def _evened(num_rows: int, size: int, num_partitions: int) -> int:
    """MADlib's ``_get_buffer_size``: ``p * ceil(rows / size / p)`` buffers, and the buffer
    size that makes that many (``ceil(rows / buffers)``)."""
    num_buffers = num_partitions * math.ceil(num_rows / size / num_partitions)
    return math.ceil(num_rows / num_buffers)


@dataclass(frozen=True)
class BufferPlan:
    """How ``num_rows`` shuffled rows are cut into buffers and spread over partitions."""

    num_rows: int
    num_partitions: int
    buffer_size: int  # the most rows in one buffer
    bounds: tuple[tuple[int, int], ...]  # [start, stop) in the shuffled order, per buffer

    @property
    def num_buffers(self) -> int:
        return len(self.bounds)

    def dist_key(self, buffer_id: int) -> int:
        return buffer_id % self.num_partitions


def plan_buffers(num_rows: int, feature_size: int, num_partitions: int,
                 buffer_size: int | None = None) -> BufferPlan:
    """Cut ``num_rows`` into buffers as MADlib does: the buffer size is evened out over the
    partitions (MADlib's segments), row ``i`` of the shuffled order goes to buffer
    ``i // buffer_size`` (so only the last buffer is short: 17 rows of buffer size 5 give
    5, 5, 5, 2), and buffer ``b`` to partition ``b % p``. A table with fewer buffers than
    partitions (fewer rows than partitions, say) leaves the last partitions empty."""
    if num_rows < 1:
        raise CerebroError("there are no rows to pack", DATA_EXCEPTION)
    if buffer_size is None:
        size = default_buffer_size(num_rows, feature_size, num_partitions)
    else:
        size = _evened(num_rows, buffer_size, num_partitions)
    bounds = tuple((lo, min(lo + size, num_rows)) for lo in range(0, num_rows, size))
    return BufferPlan(num_rows, num_partitions, size, bounds)


def shuffle_order(num_rows: int, seed: int) -> np.ndarray:
    """The seeded permutation applied to the rows before they are cut into buffers."""
    return np.random.default_rng(seed).permutation(num_rows)


def decode_arrays(blobs: Sequence[bytes | None], elem: str, what: str
                  ) -> tuple[np.ndarray, tuple[int, ...]]:
    """Decode ``array_send`` outputs of one column into an ``[n, size]`` array.

    ``elem`` is ``'float4'`` (returns float32) or ``'int2'`` (returns int16). Every row must
    have the same dimensions and no NULL element; ``what`` names the column in errors.
    Returns the values and the per-row dimensions.
    """
    dtype_be, width = _ELEM[elem]
    if any(b is None for b in blobs):
        raise CerebroError(f"{what} is NULL in some rows", NULL_VALUE_NOT_ALLOWED,
                           hint="Filter or impute the rows with NULL first.")
    rows = cast("Sequence[bytes]", blobs)  # no NULL: checked above
    first = bytes(rows[0])
    ndim, flags = struct.unpack_from(">ii", first)
    if ndim == 0:
        raise CerebroError(f"{what} holds an empty array", DATA_EXCEPTION)
    dims = tuple(struct.unpack_from(f">{2 * ndim}i", first, 12)[0::2])
    hdr = 12 + 8 * ndim
    size = int(np.prod(dims))
    row_len = hdr + (4 + width) * size
    lens = np.fromiter((len(b) for b in rows), dtype=np.int64, count=len(rows))
    if flags & 1 or (lens != row_len).any():
        bad = 0 if flags & 1 else int(np.flatnonzero(lens != row_len)[0])
        bndim, bflags = struct.unpack_from(">ii", bytes(rows[bad]))
        if bflags & 1:
            raise CerebroError(f"{what} has NULL elements", NULL_VALUE_NOT_ALLOWED,
                               hint="Replace the NULL array elements first.")
        bdims = struct.unpack_from(f">{2 * bndim}i", bytes(rows[bad]), 12)[0::2] if bndim else ()
        raise CerebroError(
            f"{what} must have the same shape in every row, found {list(dims)} and {list(bdims)}",
            DATA_EXCEPTION,
        )
    raw = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), row_len)
    if not (raw[:, :hdr] == raw[0, :hdr]).all():
        raise CerebroError(f"{what} must have the same shape in every row", DATA_EXCEPTION)
    body = raw[:, hdr:].reshape(len(rows), size, 4 + width)[:, :, 4:]
    vals = np.ascontiguousarray(body).view(dtype_be).reshape(len(rows), size)
    return vals.astype(np.float32 if elem == "float4" else np.int16), dims


def check_finite(values: np.ndarray, what: str, row_offset: int = 0) -> None:
    """Reject NaN and infinity with the first offending row's position."""
    finite = np.isfinite(values)
    if not finite.all():
        row = int(np.flatnonzero(~finite.reshape(len(values), -1).all(axis=1))[0]) + row_offset
        raise CerebroError(
            f"{what} contains NaN or infinity (first in row {row + 1} of the scan)",
            FLOATING_POINT_EXCEPTION,
            hint="Clean or impute the data first.",
        )


def one_hot(index: np.ndarray, num_classes: int) -> np.ndarray:
    """int16 one-hot rows for class indices ``0..num_classes-1``."""
    out = np.zeros((len(index), num_classes), dtype=np.int16)
    out[np.arange(len(index)), index] = 1
    return out


def to_le_bytes(values: np.ndarray) -> bytes:
    """The stored form: little-endian, C order (what MADlib and numpy frombuffer expect)."""
    v = np.ascontiguousarray(values)
    if v.dtype.byteorder == ">":
        v = v.astype(v.dtype.newbyteorder("<"))
    return v.tobytes()
