"""cerebro_db.state: model state <-> bytes, and chunking for states over 1 GB."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_db.errors import CerebroError
from cerebro_db.state import (
    CHUNK_HEADER_SIZE,
    CHUNK_MAGIC,
    MAGIC,
    ModelState,
    decode_state,
    encode_state,
    flat_weights,
    is_state,
    join_chunks,
    read_meta,
    split_chunks,
)


def _sample() -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    rng = np.random.default_rng(0)
    weights = [
        rng.normal(size=(4, 3)).astype(np.float32),
        np.zeros(3, np.float32),
        rng.normal(size=(2, 2, 2)).astype(np.float64),
        np.zeros((0, 5), np.float32),
    ]
    opt = [
        np.int64(17),
        np.float32(0.001),
        rng.normal(size=(4, 3)).astype(np.float32),
        np.array([True, False]),
        np.array([[1, 2]], dtype=np.uint32),
    ]
    meta = {"epochs_done": 2, "units_done": 9, "samples_seen": 12345,
            "info": {"seed": 42, "optimizer": "Adam", "visits": [[0, 1], [1, 0]]}}
    return weights, opt, meta


def _err(excinfo: pytest.ExceptionInfo) -> CerebroError:
    assert isinstance(excinfo.value, CerebroError)
    return excinfo.value


def test_round_trip_weights_optimizer_vars_and_counters():
    weights, opt, meta = _sample()
    data = encode_state(weights, opt, meta)
    assert data.startswith(MAGIC)
    state = decode_state(data)
    assert isinstance(state, ModelState)
    assert len(state.weights) == len(weights) and len(state.optimizer_vars) == len(opt)
    for a, b in zip(state.weights + state.optimizer_vars, weights + opt):
        b = np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)
    assert (state.epochs_done, state.units_done, state.samples_seen) == (2, 9, 12345)
    assert state.info == meta["info"]
    assert state.counters() == {"epochs_done": 2, "units_done": 9, "samples_seen": 12345}
    # meta() reproduces the bytes exactly
    assert encode_state(state.weights, state.optimizer_vars, state.meta()) == data


def test_decoded_arrays_are_read_only_views():
    state = decode_state(encode_state([np.ones(3, np.float32)]))
    with pytest.raises(ValueError):
        state.weights[0][0] = 2.0
    with pytest.raises(AttributeError):
        state.units_done = 3  # type: ignore[misc]


def test_big_endian_input_is_stored_little_endian():
    w = np.arange(6, dtype=">f4").reshape(2, 3)
    data = encode_state([w])
    meta = read_meta(data)
    assert meta["arrays"][0]["dtype"] == "<f4"
    assert np.array_equal(decode_state(data).weights[0], w)


def test_extra_meta_keys_go_to_info_and_defaults():
    state = decode_state(encode_state([], [], {"mst_key": 3}))
    assert state.info == {"mst_key": 3}
    assert state.counters() == {"epochs_done": 0, "units_done": 0, "samples_seen": 0}
    assert state.weights == () and state.optimizer_vars == ()


def test_accepts_memoryview_and_bytearray():
    weights, opt, meta = _sample()
    data = encode_state(weights, opt, meta)
    for buf in (memoryview(data), bytearray(data)):
        assert np.array_equal(decode_state(buf).weights[0], weights[0])


@pytest.mark.parametrize(
    "weights,meta,fragment",
    [
        ([np.array(["a"], dtype=object)], {}, "only numeric"),
        ([np.array(["a"])], {}, "only numeric"),
        ([], {"units_done": -1}, "at least 0"),
        ([], {"epochs_done": 1.5}, "must be an integer"),
        ([], {"info": [1, 2]}, "JSON object"),
        ([], {"info": {"x": object()}}, "not JSON-serializable"),
    ],
)
def test_encode_rejects_bad_input(weights, meta, fragment):
    with pytest.raises(CerebroError) as exc:
        encode_state(weights, [], meta)
    assert fragment in exc.value.message
    assert exc.value.sqlstate == "22023"


def test_bad_magic():
    data = encode_state([np.ones(2, np.float32)])
    with pytest.raises(CerebroError) as exc:
        decode_state(b"XXXXXXXX" + data[8:])
    assert "magic" in _err(exc).message and exc.value.sqlstate == "22000"
    with pytest.raises(CerebroError, match="magic"):
        decode_state(np.ones(10, "<f4").tobytes())  # MADlib flat weights are no state


def test_unknown_version():
    data = bytearray(encode_state([np.ones(2, np.float32)]))
    struct.pack_into("<H", data, 8, 99)
    with pytest.raises(CerebroError) as exc:
        decode_state(bytes(data))
    assert "version 99" in exc.value.message and exc.value.hint


def test_truncation_and_trailing_bytes():
    weights, opt, meta = _sample()
    data = encode_state(weights, opt, meta)
    for cut in (0, 3, 8, 15, 16, 40, len(data) - 1):
        with pytest.raises(CerebroError) as exc:
            decode_state(data[:cut])
        assert exc.value.sqlstate == "22000"
    with pytest.raises(CerebroError, match="trailing"):
        decode_state(data + b"\0")


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_any_truncation_is_an_error(data):
    weights, opt, meta = _sample()
    blob = encode_state(weights, opt, meta)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(CerebroError):
        decode_state(blob[:cut])


def test_corrupt_payload_is_detected():
    data = bytearray(encode_state([np.ones(100, np.float32)]))
    data[-10] ^= 0xFF
    with pytest.raises(CerebroError, match="checksum"):
        decode_state(bytes(data))
    # without verification the arrays are still readable
    assert decode_state(bytes(data), verify=False).weights[0].shape == (100,)


def test_bad_metadata_json():
    body = b"{not json"
    data = struct.pack("<8sHHI", MAGIC, 1, 0, len(body)) + body
    with pytest.raises(CerebroError, match="not valid JSON"):
        decode_state(data)
    meta = json.dumps({"arrays": [{"group": "w", "dtype": "|O", "shape": [1]}],
                       "payload_bytes": 8, "payload_crc32": 0}).encode()
    data = struct.pack("<8sHHI", MAGIC, 1, 0, len(meta)) + meta + b"\0" * 8
    with pytest.raises(CerebroError, match="bad metadata"):
        decode_state(data, verify=False)


def test_is_state_and_read_meta():
    weights, opt, meta = _sample()
    data = encode_state(weights, opt, meta)
    assert is_state(data) and is_state(memoryview(data))
    assert not is_state(np.ones(8, "<f4").tobytes()) and not is_state(None) and not is_state(b"")
    # the magic's first four bytes read as a float32 NaN
    assert np.isnan(np.frombuffer(MAGIC[:4], "<f4")[0])
    m = read_meta(data)
    assert m["counters"]["samples_seen"] == 12345 and len(m["arrays"]) == 9


# --------------------------------------------------------------------------- chunks


def test_split_and_join_small_chunk_size():
    weights, opt, meta = _sample()
    data = encode_state(weights, opt, meta)
    chunks = split_chunks(data, 64)
    assert len(chunks) == -(-len(data) // 64) > 3
    assert all(c.startswith(CHUNK_MAGIC) for c in chunks)
    assert join_chunks(chunks) == data
    assert join_chunks([memoryview(c) for c in chunks]) == data
    assert decode_state(join_chunks(chunks)).info == meta["info"]


def test_one_chunk_for_small_and_empty_data():
    assert len(split_chunks(b"abc", 1000)) == 1
    assert join_chunks(split_chunks(b"abc", 1000)) == b"abc"
    assert join_chunks(split_chunks(b"", 10)) == b""


def test_dropped_chunk_is_detected():
    chunks = split_chunks(bytes(range(256)) * 4, 100)
    for i in range(len(chunks)):
        with pytest.raises(CerebroError) as exc:
            join_chunks(chunks[:i] + chunks[i + 1:])
        assert exc.value.sqlstate == "22000"
    with pytest.raises(CerebroError, match="11 chunks but 10"):
        join_chunks(chunks[:-1])


def test_reordered_duplicated_foreign_corrupt_chunks():
    data = bytes(range(256)) * 4
    chunks = split_chunks(data, 100)
    swapped = [chunks[1], chunks[0]] + chunks[2:]
    with pytest.raises(CerebroError, match="out of order"):
        join_chunks(swapped)
    with pytest.raises(CerebroError, match="duplicated"):
        join_chunks(chunks[:3] + [chunks[2]] + chunks[3:])
    other = split_chunks(data[::-1], 100)
    with pytest.raises(CerebroError, match="another state"):
        join_chunks(chunks[:2] + [other[2]] + chunks[3:])
    bad = bytearray(chunks[4])
    bad[-1] ^= 1
    with pytest.raises(CerebroError, match="checksum"):
        join_chunks(chunks[:4] + [bytes(bad)] + chunks[5:])
    with pytest.raises(CerebroError, match="checksum"):
        join_chunks(chunks[:4] + [chunks[4][:-3]] + chunks[5:])
    with pytest.raises(CerebroError, match="truncated"):
        join_chunks([chunks[0][:10]])
    with pytest.raises(CerebroError, match="no state chunks"):
        join_chunks([])
    with pytest.raises(CerebroError, match="magic"):
        join_chunks([b"x" * 64])
    with pytest.raises(CerebroError, match="whole state"):
        join_chunks([encode_state([np.ones(40, np.float32)])])


def test_flat_weights_are_madlibs_float32_concatenation():
    """One slice of the state when the weights are float32 (what fits store), converted
    otherwise (the sample has a float64 array): equal to concatenating get_weights()."""
    def expected(ws):
        return b"".join(np.asarray(w, dtype="<f4").tobytes() for w in ws)
    weights, opt, meta = _sample()
    mixed = encode_state(weights, opt, meta)
    assert flat_weights(mixed) == expected(weights)
    f32 = [w.astype(np.float32) for w in weights]
    data = encode_state(f32, opt, meta)
    assert flat_weights(data) == expected(f32) == flat_weights(bytearray(data))
    assert flat_weights(encode_state([], opt)) == b""
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(CerebroError, match="checksum"):
        flat_weights(bytes(bad))


def test_join_takes_chunks_one_at_a_time_into_one_buffer():
    """A cursor's rows, read lazily: the join never needs the chunks as a list."""
    data = bytes(range(256)) * 40
    chunks = split_chunks(data, 1000)
    taken = []

    def rows():
        for c in chunks:
            taken.append(len(taken))
            yield c
    out = join_chunks(rows())
    assert out == data and isinstance(out, bytearray) and len(taken) == len(chunks)


def test_a_forged_length_or_an_extra_chunk_is_refused():
    import struct
    import zlib
    chunks = [bytearray(c) for c in split_chunks(b"abcdef" * 10, 20)]
    forged = bytearray(chunks[0])
    struct.pack_into("<Q", forged, 20, 1 << 60)  # total: far beyond what 3 chunks can hold
    with pytest.raises(CerebroError, match="cannot hold"):
        join_chunks([forged] + chunks[1:])
    # a fourth chunk, well formed, numbered after the last: more than the header's count
    extra = bytearray(chunks[-1])
    struct.pack_into("<I", extra, 12, len(chunks))
    body = bytes(extra[CHUNK_HEADER_SIZE:])
    struct.pack_into("<I", extra, 32, zlib.crc32(body))
    with pytest.raises(CerebroError, match="more were given"):
        join_chunks(chunks + [extra])


@pytest.mark.parametrize("size", [0, -1, 1 << 31, 2.5, True])
def test_bad_chunk_size(size):
    with pytest.raises(CerebroError) as exc:
        split_chunks(b"abc", size)  # type: ignore[arg-type]
    assert exc.value.sqlstate == "22023"


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=2000), st.integers(1, 300))
def test_split_join_property(data, size):
    chunks = split_chunks(data, size)
    assert join_chunks(chunks) == data
    assert all(len(c) - CHUNK_HEADER_SIZE <= size for c in chunks)


def test_a_shape_whose_size_wraps_int64_is_not_taken_for_a_small_one():
    """[2**62, 4] float32 values: 2**64 of them, which int64 arithmetic wraps to 0 (so 0
    bytes would match an empty payload). Counted with Python integers, it is truncated."""
    meta = json.dumps({"arrays": [{"group": "w", "dtype": "<f4", "shape": [2**62, 4],
                                   "offset": 0}],
                       "payload_bytes": 0, "payload_crc32": 0}).encode()
    data = struct.pack("<8sHHI", MAGIC, 1, 0, len(meta)) + meta
    with pytest.raises(CerebroError, match="truncated"):
        decode_state(data, verify=False)


def test_a_forged_chunk_header_allocates_nothing_it_claims():
    """A chunk whose header claims a 512 MiB state of 4 chunks (headers are caller data: a
    role may edit its own states' rows) made join_chunks allocate and zero-fill the claimed
    length before finding the other chunks missing (a red-team pass: 3 GiB from 52 bytes).
    The buffer now grows with the bytes that arrive."""
    import tracemalloc

    from cerebro_db.state import _CHUNK_HEADER

    (chunk,) = split_chunks(b"x" * 16, 16)
    magic, version, r, index, _, _, whole_crc, crc = _CHUNK_HEADER.unpack_from(chunk)
    forged = _CHUNK_HEADER.pack(magic, version, r, index, 4, 512 << 20, whole_crc, crc) + \
        bytes(chunk[_CHUNK_HEADER.size:])
    tracemalloc.start()
    try:
        with pytest.raises(CerebroError, match="4 chunks but 1 were given") as exc:
            join_chunks([forged])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.value.sqlstate == "22000"
    assert peak < 1 << 20, peak
