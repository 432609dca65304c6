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


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _hash_long(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + _P5 + np.uint64(8)
    h = h ^ (_rotl(value * _P2, 31) * _P1)
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
        hashed = seed.copy()
        for i, text in enumerate(column.to_pylist()):
            if text is not None:
                hashed[i] = xxhash.xxh64_intdigest(text.encode("utf-8"), int(seed[i]))
        return hashed
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
