"""Spark's ``xxhash64`` and bucket ids, computed without Spark.

A bucketed batch stores row ``r`` under ``__bucket = pmod(xxhash64(key columns), n)``.
Spark computes that on its side; the local tier (and any reader that wants to open only
the buckets of a few keys) must get the very same number, or it would look in the
wrong file. This module is Spark's ``XxHash64`` expression (seed 42) over Arrow data,
vectorised with NumPy for the fixed-width types:

* BIGINT hashes its 8 bytes (``hashLong``), INT and BOOLEAN their 4 (``hashInt``, true
  is 1); DOUBLE hashes ``doubleToLongBits`` with -0.0 taken as 0.0 and every NaN as the
  canonical NaN; STRING hashes its UTF-8 bytes (standard XXH64, through ``xxhash``);
  an array folds its elements left to right.
* DATE hashes its day number as an INT, TIMESTAMP its microseconds as a BIGINT; a
  DECIMAL of up to 18 digits hashes its unscaled value as a BIGINT, a wider one the
  big-endian two's-complement bytes of its unscaled value (Java's
  ``BigInteger.toByteArray``).
* Several columns chain: each column's hash is the seed of the next. A NULL (column or
  array element) leaves the running hash unchanged.

``pmod`` is Java's: the remainder taken non-negative.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

SEED = 42

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_CANONICAL_NAN = np.uint64(0x7FF8000000000000)
_ZERO = np.uint64(0)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _round(accumulator: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """XXH64's round: one 8-byte lane mixed into an accumulator."""
    return _rotl(accumulator + lane * _P2, 31) * _P1


def _hash_long(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64 of one 8-byte value per row (``_xxh64`` of 8 bytes, without the block)."""
    h = seed + _P5 + np.uint64(8)
    h = h ^ _round(_ZERO, value)
    return _fmix(_rotl(h, 27) * _P1 + _P4)


def _hash_int(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + _P5 + np.uint64(4)
    h = h ^ ((value & np.uint64(0xFFFFFFFF)) * _P1)
    return _fmix(_rotl(h, 23) * _P2 + _P3)


def xxhash64(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``xxhash64(c1, c2, ...)`` of each row, as signed 64-bit integers."""
    if not columns:
        raise ValueError("xxhash64 needs at least one column")
    length = len(columns[0])
    with np.errstate(over="ignore"):
        seed = np.full(length, SEED, dtype=np.uint64)
        for column in columns:
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            seed = _hash_column(column, seed)
    return seed.view(np.int64)


def bucket_ids(columns: Sequence[pa.Array | pa.ChunkedArray], buckets: int) -> np.ndarray:
    """``pmod(xxhash64(columns), buckets)`` of each row (INT32), as Spark computes it."""
    if buckets < 1:
        raise ValueError(f"buckets must be positive, got {buckets}")
    return np.mod(xxhash64(columns), buckets).astype(np.int32)


def _hash_column(column: pa.Array, seed: np.ndarray) -> np.ndarray:
    kind = column.type
    valid = _valid(column)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        wide = pa.types.is_int64(kind) or pa.types.is_uint64(kind)
        values = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        bits = values.astype(np.int64).view(np.uint64)
        hashed = _hash_long(bits, seed) if wide else _hash_int(bits, seed)
    elif pa.types.is_floating(kind):
        values = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        values = np.where(values == 0.0, 0.0, values)  # -0.0 hashes as 0.0
        bits = values.astype(np.float64).view(np.uint64)
        bits = np.where(np.isnan(values), _CANONICAL_NAN, bits)
        hashed = _hash_long(bits, seed)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        hashed = _hash_strings(column, seed)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _hash_lists(column, seed)
    elif pa.types.is_date32(kind):
        days = pc.fill_null(column.cast(pa.int32()), 0).to_numpy(zero_copy_only=False)
        hashed = _hash_int(days.astype(np.int64).view(np.uint64), seed)
    elif pa.types.is_timestamp(kind):
        micros = column.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64())
        values = pc.fill_null(micros, 0).to_numpy(zero_copy_only=False)
        hashed = _hash_long(values.astype(np.int64).view(np.uint64), seed)
    elif pa.types.is_decimal(kind):
        return _hash_decimals(column, seed)
    else:
        raise TypeError(f"xxhash64 of a {kind} column is not supported")
    return np.where(valid, hashed, seed)


def _hash_strings(column: pa.Array, seed: np.ndarray) -> np.ndarray:
    """XXH64 of each string's UTF-8 bytes with its row's seed, vectorised over the rows
    of each byte length (the rows of one length share every step of the algorithm)."""
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    offsets = np.frombuffer(column.buffers()[1], dtype=width)
    offsets = offsets[column.offset : column.offset + len(column) + 1].astype(np.int64)
    data_buffer = column.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else None
    lengths = np.diff(offsets)
    hashed = seed.copy()
    for length in np.unique(lengths):
        rows = np.nonzero(lengths == length)[0]
        if length and data is not None:
            picks = offsets[rows][:, None] + np.arange(length, dtype=np.int64)
            block = data[picks]
        else:
            block = np.empty((len(rows), 0), dtype=np.uint8)
        hashed[rows] = _xxh64(block, seed[rows])
    return hashed


def _lanes(block: np.ndarray, start: int, size: int) -> np.ndarray:
    """Little-endian unsigned integers of ``size`` bytes at ``start`` of every row."""
    kind = np.dtype("<u8") if size == 8 else np.dtype("<u4")
    return np.ascontiguousarray(block[:, start : start + size]).view(kind)[:, 0].astype(np.uint64)


def _xxh64(block: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Standard XXH64 of each row of ``block`` (rows of equal length) with its seed."""
    length = block.shape[1]
    at = 0
    if length >= 32:
        v1, v2, v3, v4 = seed + _P1 + _P2, seed + _P2, seed.copy(), seed - _P1
        while at + 32 <= length:
            v1 = _round(v1, _lanes(block, at, 8))
            v2 = _round(v2, _lanes(block, at + 8, 8))
            v3 = _round(v3, _lanes(block, at + 16, 8))
            v4 = _round(v4, _lanes(block, at + 24, 8))
            at += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        for v in (v1, v2, v3, v4):
            h = (h ^ _round(_ZERO, v)) * _P1 + _P4
    else:
        h = seed + _P5
    h = h + np.uint64(length)
    while at + 8 <= length:
        h = _rotl(h ^ _round(_ZERO, _lanes(block, at, 8)), 27) * _P1 + _P4
        at += 8
    if at + 4 <= length:
        h = _rotl(h ^ (_lanes(block, at, 4) * _P1), 23) * _P2 + _P3
        at += 4
    while at < length:
        h = _rotl(h ^ (block[:, at].astype(np.uint64) * _P5), 11) * _P1
        at += 1
    return _fmix(h)


_MAX_LONG_DIGITS = 18


def _hash_decimals(column: pa.Array, seed: np.ndarray) -> np.ndarray:
    if column.type.precision <= _MAX_LONG_DIGITS:
        hashed = _hash_long(_unscaled_longs(column).view(np.uint64), seed)
        return np.where(_valid(column), hashed, seed)
    hashed = seed.copy()
    scale = column.type.scale
    for i, value in enumerate(column.to_pylist()):
        if value is None:
            continue
        unscaled = int(value.scaleb(scale))
        size = (unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()) // 8 + 1
        data = unscaled.to_bytes(size, "big", signed=True)
        hashed[i] = xxhash.xxh64_intdigest(data, int(seed[i]))
    return hashed


def _unscaled_longs(column: pa.Array) -> np.ndarray:
    """The unscaled values of a DECIMAL column of at most 18 digits, as int64, read from
    its data buffer: each value is a little-endian two's-complement integer of the type's
    width, whose low 64 bits (32 for a 4-byte decimal) hold it whole. NULL slots hold
    whatever the buffer has."""
    width = column.type.byte_width
    word = np.dtype("<i4") if width == 4 else np.dtype("<i8")
    step = max(width // word.itemsize, 1)
    words = np.frombuffer(column.buffers()[1], dtype=word)
    start = column.offset * step
    return words[start : start + len(column) * step : step].astype(np.int64)


def _hash_lists(column: pa.Array, seed: np.ndarray) -> np.ndarray:
    hashed = seed.copy()
    element = column.type.value_type
    for i, items in enumerate(column.to_pylist()):
        if items is None:
            continue
        running = np.array([hashed[i]], dtype=np.uint64)
        for item in items:
            running = _hash_column(pa.array([item], type=element), running)
        hashed[i] = running[0]
    return hashed


def _valid(column: pa.Array) -> np.ndarray:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    return pc.is_valid(column).to_numpy(zero_copy_only=False)
