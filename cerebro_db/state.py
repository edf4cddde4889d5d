"""Model state <-> bytes: weights, optimizer variables, step counters, with a versioned header.

A model state is what hops between workers: everything needed to continue training a
configuration exactly where it stopped. It is stored in a ``bytea`` column, so it is plain
bytes with no pickling anywhere.

Layout (version 1)::

    offset  size  field
    0       8     MAGIC  b"CR\\xff\\xffST\\r\\n"
    8       2     format version, little-endian uint16 (currently 1)
    10      2     reserved, zero
    12      4     length H of the JSON metadata block, little-endian uint32
    16      H     metadata: UTF-8 JSON object (see below)
    16+H    P     payload: the arrays' raw little-endian bytes, back to back, C order

The metadata object has:

* ``arrays``: one entry per array, ``{"group": "w" | "o", "dtype": "<f4", "shape": [..]}``;
  ``w`` arrays are the model weights in ``model.get_weights()`` order (trainable and
  non-trainable, e.g. batch-norm statistics), ``o`` arrays are ``optimizer.variables`` in order
  (in Keras 3 these start with ``iteration`` (int64) and ``learning_rate``, then the slots);
* ``payload_bytes`` and ``payload_crc32``: the payload's length and CRC-32, so truncation and
  corruption are detected;
* ``counters``: ``epochs_done``, ``units_done``, ``samples_seen`` (non-negative integers);
* ``info``: a free-form JSON object (seed, optimizer name, ...).

Random-number state is not stored as arrays: every training unit re-seeds all random sources
(shuffling, dropout) from its own seed, which the coordinator derives from (run seed, config,
epoch, partition) and may record in ``info``. A unit's result therefore depends only on the
state it starts from, its data and its seed.

The first four bytes of :data:`MAGIC` read as a float32 NaN, so a state can be told apart from
MADlib's flat float32 ``model_weights`` by :func:`is_state`.

States larger than PostgreSQL's 1 GB ``bytea`` limit are stored as several rows:
:func:`split_chunks` cuts the bytes into chunks that each carry a small header (index, count,
total length, CRC-32 of the whole and of the chunk), and :func:`join_chunks` reassembles them,
detecting a missing, duplicated, reordered, foreign or corrupted chunk.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from cerebro_db.errors import DATA_EXCEPTION, INVALID_PARAMETER_VALUE, CerebroError

__all__ = [
    "CHUNK_HEADER_SIZE",
    "CHUNK_MAGIC",
    "DEFAULT_CHUNK_SIZE",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_CHUNK_SIZE",
    "ModelState",
    "decode_state",
    "encode_state",
    "flat_weights",
    "is_state",
    "join_chunks",
    "read_meta",
    "split_chunks",
]

BytesLike = Union[bytes, bytearray, memoryview]
StateBytes = Union[bytes, bytearray]
"""An encoded state (:func:`encode_state` builds a ``bytearray`` in place)."""

MAGIC = b"CR\xff\xffST\r\n"
"""First bytes of every state (the first four are a float32 NaN bit pattern)."""

CHUNK_MAGIC = b"CR\xff\xffCK\r\n"
"""First bytes of every chunk made by :func:`split_chunks`."""

FORMAT_VERSION = 1
CHUNK_VERSION = 1

MAX_CHUNK_SIZE = (1 << 30) - 1024
"""Largest chunk (payload plus header) that fits a PostgreSQL ``bytea`` value (1 GB)."""

DEFAULT_CHUNK_SIZE = 256 << 20
"""Default payload bytes per chunk (256 MiB): well below the ``bytea`` limit."""

COUNTERS = ("epochs_done", "units_done", "samples_seen")

_HEADER = struct.Struct("<8sHHI")  # magic, version, reserved, metadata length
_CHUNK_HEADER = struct.Struct("<8sHHIIQII")  # magic, ver, reserved, index, count, total,
#                                                 crc of the whole, crc of this chunk's data
CHUNK_HEADER_SIZE = _CHUNK_HEADER.size
"""Bytes of header before each chunk's data (36)."""

_MAX_META = 64 << 20
_ALLOWED_KINDS = frozenset("biuf")  # bool, signed, unsigned, float
_STATE_HINT = "the state must be bytes written by cerebro_db.state.encode_state"


@dataclass(frozen=True)
class ModelState:
    """A decoded model state.

    ``weights`` and ``optimizer_vars`` are read-only numpy arrays viewing the encoded bytes
    (copy them before modifying). ``info`` is the free-form metadata object.
    """

    weights: tuple[np.ndarray, ...]
    optimizer_vars: tuple[np.ndarray, ...]
    epochs_done: int = 0
    units_done: int = 0
    samples_seen: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def counters(self) -> dict[str, int]:
        """The step counters as a dict (keys :data:`COUNTERS`)."""
        return {k: int(getattr(self, k)) for k in COUNTERS}

    def meta(self) -> dict[str, Any]:
        """A ``meta`` mapping for :func:`encode_state` that reproduces this state's metadata."""
        return {**self.counters(), "info": dict(self.info)}


def _state_error(message: str, detail: str | None = None) -> CerebroError:
    return CerebroError(message, DATA_EXCEPTION, hint=_STATE_HINT, detail=detail)


def _as_array(value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in _ALLOWED_KINDS:
        raise CerebroError(
            f"{what} has dtype {arr.dtype}, only numeric and boolean arrays can be stored",
            INVALID_PARAMETER_VALUE,
        )
    return arr


def _le_dtype(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def _counters_from(meta: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in COUNTERS:
        value = meta.get(key, 0)
        if isinstance(value, (bool, float)) or not isinstance(value, (int, np.integer)):
            raise CerebroError(
                f"state counter {key} must be an integer, got {value!r}", INVALID_PARAMETER_VALUE
            )
        if value < 0:
            raise CerebroError(
                f"state counter {key} must be at least 0, got {value}", INVALID_PARAMETER_VALUE
            )
        out[key] = int(value)
    return out


def encode_state(
    weights: Sequence[Any],
    optimizer_vars: Sequence[Any] = (),
    meta: Mapping[str, Any] | None = None,
) -> StateBytes:
    """Encode a model state as bytes (format described in the module docstring; a
    ``bytearray``, built in place).

    ``weights`` and ``optimizer_vars`` are sequences of numeric arrays (anything
    :func:`numpy.asarray` accepts; Keras variables should be converted with ``.numpy()``
    first). ``meta`` may hold the counters ``epochs_done``, ``units_done``, ``samples_seen``
    (default 0) and ``info``, a JSON-serializable object; any other key is merged into
    ``info``. Raises :class:`CerebroError` (22023) for non-numeric arrays, bad counters or
    metadata that is not JSON-serializable.
    """
    meta = dict(meta or {})
    counters = _counters_from(meta)
    info = meta.pop("info", None) or {}
    if not isinstance(info, Mapping):
        raise CerebroError(
            f"state info must be a JSON object, got {type(info).__name__}", INVALID_PARAMETER_VALUE
        )
    info = dict(info)
    for key, value in meta.items():
        if key not in COUNTERS:
            info[key] = value

    # The arrays are checksummed where they are, then copied once into the state's buffer:
    # building it from each array's tobytes(), joined, then prefixed, held about four
    # copies of a state at once, and an outside pass had a 74 M-parameter model's worker
    # killed by the kernel at a unit's end.
    entries: list[dict[str, Any]] = []
    flat: list[np.ndarray] = []
    for group, arrays, what in (("w", weights, "weight"), ("o", optimizer_vars, "optimizer var")):
        for i, value in enumerate(arrays):
            arr = _as_array(value, f"{what} {i}")
            dt = _le_dtype(arr.dtype)
            entries.append({"group": group, "dtype": dt.str, "shape": list(arr.shape)})
            flat.append(np.ascontiguousarray(arr, dtype=dt).reshape(-1).view(np.uint8))
    crc = 0
    for b in flat:
        crc = zlib.crc32(b.data, crc)
    total = sum(b.size for b in flat)
    header = {
        "arrays": entries,
        "payload_bytes": total,
        "payload_crc32": crc,
        "counters": counters,
        "info": info,
    }
    try:
        meta_bytes = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise CerebroError(
            f"state info is not JSON-serializable: {exc}", INVALID_PARAMETER_VALUE
        ) from None
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta_bytes)) + meta_bytes
    out = bytearray(len(head) + total)
    view = np.frombuffer(out, dtype=np.uint8)
    view[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    pos = len(head)
    for b in flat:
        view[pos:pos + b.size] = b
        pos += b.size
    del view
    return out


def is_state(data: BytesLike | None) -> bool:
    """True when ``data`` starts with :data:`MAGIC` (a state, not flat float32 weights)."""
    if data is None:
        return False
    return bytes(memoryview(data)[: len(MAGIC)]) == MAGIC


def _parse_header(data: memoryview) -> tuple[dict[str, Any], int, int]:
    """(metadata, payload offset, version) after checking magic, version and lengths."""
    if len(data) < _HEADER.size:
        if bytes(data[: len(MAGIC)]) != MAGIC[: len(data)]:
            raise _state_error("model state has a bad magic number")
        raise _state_error(
            f"model state is truncated: {len(data)} bytes, shorter than its "
            f"{_HEADER.size}-byte header"
        )
    magic, version, _reserved, meta_len = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise _state_error(
            "model state has a bad magic number",
            detail=f"expected {MAGIC!r}, got {bytes(magic)!r}",
        )
    if version != FORMAT_VERSION:
        raise CerebroError(
            f"model state has format version {version}, this cerebro_db reads version "
            f"{FORMAT_VERSION}",
            DATA_EXCEPTION,
            hint="upgrade cerebro_db to read states written by a newer version",
        )
    if meta_len > _MAX_META:
        raise _state_error(f"model state metadata is too large ({meta_len} bytes)")
    start = _HEADER.size + meta_len
    if len(data) < start:
        raise _state_error(
            f"model state is truncated: {len(data)} bytes, its metadata ends at byte {start}"
        )
    try:
        meta = json.loads(bytes(data[_HEADER.size:start]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _state_error("model state metadata is not valid JSON", detail=str(exc)) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arrays"), list):
        raise _state_error("model state metadata has no array list")
    return meta, start, version


def read_meta(data: BytesLike) -> dict[str, Any]:
    """The metadata object of a state (counters, info, array shapes) without its arrays.

    Checks the magic, version and that the bytes are as long as the header says; the
    payload checksum is not computed. Raises :class:`CerebroError` (22000).
    """
    return _read(memoryview(data).cast("B"))[0]


def _read(view: memoryview) -> tuple[dict[str, Any], int, int]:
    meta, start, version = _parse_header(view)
    size = meta.get("payload_bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise _state_error("model state metadata has no valid payload_bytes")
    expected = start + size
    if len(view) < expected:
        raise _state_error(
            f"model state is truncated: {len(view)} bytes, expected {expected}"
        )
    if len(view) > expected:
        raise _state_error(
            f"model state has {len(view) - expected} trailing bytes after its payload"
        )
    return meta, start, version


def decode_state(data: BytesLike, *, verify: bool = True) -> ModelState:
    """Decode bytes written by :func:`encode_state` into a :class:`ModelState`.

    The arrays are zero-copy, read-only views of ``data`` (do not modify a ``bytearray``
    passed in while they are in use). With ``verify`` (the default) the
    payload CRC-32 is checked. Raises :class:`CerebroError` (SQLSTATE 22000) for a bad magic
    number, an unknown format version, truncated or trailing bytes, malformed metadata or a
    checksum mismatch.
    """
    if data is None:
        raise _state_error("model state is NULL")
    view = memoryview(data).cast("B")
    meta, start, version = _read(view)
    payload = view[start:]
    if verify and zlib.crc32(payload) != meta.get("payload_crc32"):
        raise _state_error("model state is corrupt: payload checksum mismatch")
    weights: list[np.ndarray] = []
    opt: list[np.ndarray] = []
    offset = 0
    for i, entry in enumerate(meta["arrays"]):
        try:
            dtype = np.dtype(entry["dtype"])
            shape = tuple(int(d) for d in entry["shape"])
            group = entry["group"]
        except (KeyError, TypeError, ValueError) as exc:
            raise _state_error(f"model state array {i} has bad metadata", detail=str(exc)) from None
        if dtype.kind not in _ALLOWED_KINDS or group not in ("w", "o") or min(shape, default=0) < 0:
            raise _state_error(f"model state array {i} has bad metadata", detail=str(entry))
        count = math.prod(int(d) for d in shape)  # Python ints: no int64 wrap
        nbytes = count * dtype.itemsize
        if offset + nbytes > len(payload):
            raise _state_error(f"model state is truncated inside array {i}")
        arr = np.frombuffer(view, dtype=dtype, count=count, offset=start + offset).reshape(shape)
        if arr.flags.writeable:
            arr.flags.writeable = False
        (weights if group == "w" else opt).append(arr)
        offset += nbytes
    if offset != len(payload):
        raise _state_error(
            f"model state payload has {len(payload)} bytes but its arrays need {offset}"
        )
    counters = meta.get("counters") or {}
    info = meta.get("info") or {}
    if not isinstance(counters, dict) or not isinstance(info, dict):
        raise _state_error("model state metadata has bad counters or info")
    try:
        c = _counters_from(counters)
    except CerebroError as exc:
        raise _state_error(f"model state metadata is invalid: {exc.message}") from None
    return ModelState(
        weights=tuple(weights),
        optimizer_vars=tuple(opt),
        info=dict(info),
        version=version,
        **c,
    )



def flat_weights(data: BytesLike) -> bytes:
    """A state's model weights as MADlib stores ``model_weights``: little-endian float32,
    back to back, in ``get_weights()`` order. :func:`encode_state` writes float32 weights
    first and back to back, so their bytes are one slice of the state: one copy of the
    weights, not a copy per array and then their join (a large model's outputs held the
    weights three times). Other dtypes are converted. Checks the state as
    :func:`decode_state` does."""
    st = decode_state(data)
    view = memoryview(data).cast("B")
    meta, start, _ = _read(view)
    lead = meta["arrays"][: len(st.weights)]
    f4 = np.dtype("<f4")
    if all(a["group"] == "w" and np.dtype(a["dtype"]) == f4 for a in lead):
        return bytes(view[start:start + sum(w.nbytes for w in st.weights)])
    return b"".join(np.asarray(w, dtype=f4).tobytes() for w in st.weights)

# --------------------------------------------------------------------------- chunking


def _chunk_error(message: str, detail: str | None = None) -> CerebroError:
    return CerebroError(
        message,
        DATA_EXCEPTION,
        hint="pass every chunk made by split_chunks, ordered by chunk index",
        detail=detail,
    )


def split_chunks(data: BytesLike, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[bytearray]:
    """Cut ``data`` into chunks of at most ``chunk_size`` data bytes, each with a header.

    Every chunk (even for small data, which gives one chunk) starts with :data:`CHUNK_MAGIC`
    and carries its index, the chunk count, the total length, the CRC-32 of the whole data
    and of its own data, so :func:`join_chunks` can check the set. ``chunk_size`` must be
    between 1 and :data:`MAX_CHUNK_SIZE` minus the header size (so each chunk fits one
    ``bytea``). Raises :class:`CerebroError` (22023) for a bad ``chunk_size``.
    """
    _check_chunk_size(chunk_size)
    return list(iter_chunks(data, chunk_size))


def _check_chunk_size(chunk_size: Any) -> None:
    limit = MAX_CHUNK_SIZE - _CHUNK_HEADER.size
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not (
        1 <= chunk_size <= limit
    ):
        raise CerebroError(
            f"chunk_size must be between 1 and {limit}, got {chunk_size!r}",
            INVALID_PARAMETER_VALUE,
        )


def iter_chunks(data: BytesLike, chunk_size: int) -> Iterator[bytearray]:
    """:func:`split_chunks`' chunks one at a time, so that a caller storing them holds one
    chunk's copy at a time, not the whole state's."""
    _check_chunk_size(chunk_size)
    view = memoryview(data).cast("B")
    total = len(view)
    count = max(1, -(-total // chunk_size))
    whole_crc = zlib.crc32(view)
    for i in range(count):
        part = view[i * chunk_size:(i + 1) * chunk_size]
        head = _CHUNK_HEADER.pack(
            CHUNK_MAGIC, CHUNK_VERSION, 0, i, count, total, whole_crc, zlib.crc32(part)
        )
        chunk = bytearray(len(head) + len(part))  # one copy of the part, not two
        chunk[:len(head)] = head
        chunk[len(head):] = part
        yield chunk


def join_chunks(chunks: Iterable[BytesLike]) -> bytearray:
    """Reassemble the bytes cut by :func:`split_chunks`; chunks must come in index order.

    ``chunks`` may be any iterable (a cursor's rows): each chunk's body is appended to one
    buffer as it arrives, so a caller that drops each chunk once it is read holds the state
    once plus one chunk (a list of chunks and their join held it twice). The buffer grows
    with the bytes that came, never to a length a header claims: the headers are caller
    data (a role may edit its own states' rows), and a buffer allocated from a forged
    length was zero-filled to gigabytes before the chunks' count was checked (a red-team
    pass).

    Raises :class:`CerebroError` (22000) when a chunk is missing, duplicated, out of order,
    from another state, truncated or corrupt, or has a bad magic number or version.
    """
    first: tuple[int, int, int] | None = None
    out = bytearray()
    filled = 0
    pos = -1
    for pos, chunk in enumerate(chunks):
        if chunk is None:
            raise _chunk_error(f"state chunk at position {pos} is NULL")
        view = memoryview(chunk).cast("B")
        if len(view) < _CHUNK_HEADER.size:
            raise _chunk_error(f"state chunk at position {pos} is truncated")
        magic, version, _r, index, count, total, whole_crc, crc = _CHUNK_HEADER.unpack_from(view)
        if magic != MAGIC and magic != CHUNK_MAGIC:
            raise _chunk_error(f"state chunk at position {pos} has a bad magic number")
        if magic != CHUNK_MAGIC:
            raise _chunk_error(f"state chunk at position {pos} is a whole state, not a chunk")
        if version != CHUNK_VERSION:
            raise CerebroError(
                f"state chunk has format version {version}, this cerebro_db reads version "
                f"{CHUNK_VERSION}",
                DATA_EXCEPTION,
            )
        ident = (count, total, whole_crc)
        if first is None:
            if total > count * MAX_CHUNK_SIZE:  # a forged length must not allocate
                raise _chunk_error("state chunk header gives a length its chunks cannot hold")
            first = ident
        elif ident != first:
            raise _chunk_error(f"state chunk at position {pos} belongs to another state")
        if index != pos:
            if index < pos:
                raise _chunk_error(f"state chunk {index} is duplicated or out of order")
            raise _chunk_error(
                f"state chunk {pos} is missing or out of order (found chunk {index} at "
                f"position {pos})"
            )
        body = view[_CHUNK_HEADER.size:]
        if zlib.crc32(body) != crc:
            raise _chunk_error(f"state chunk {index} is corrupt or truncated: checksum mismatch")
        if pos >= count or filled + len(body) > total:
            raise _chunk_error(f"state has {count} chunks but more were given")
        out += body
        filled += len(body)
    if first is None:
        raise _chunk_error("no state chunks given")
    count, total, whole_crc = first
    if pos + 1 != count:
        raise _chunk_error(f"state has {count} chunks but {pos + 1} were given")
    if filled != total or zlib.crc32(out) != whole_crc:
        raise _chunk_error("reassembled state does not match its checksum")
    return out
