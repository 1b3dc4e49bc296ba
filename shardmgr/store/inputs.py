"""Checking what callers hand the vector store, before anything is written.

Every check raises :class:`~shardmgr.errors.BadVectors` naming what was
wrong (shape, dtype, the first non-finite row, ...). Accepted inputs come
back in the store's layout: C-contiguous float32 [n, dim] vectors (other
float dtypes converted), int64 ids and refs.

An empty batch (n = 0) is accepted everywhere and its dtype is not checked
(numpy makes ``[]`` float64): the store answers it with an empty result
and writes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardmgr.errors import BadVectors


def vectors(value: Any, dim: int, what: str = "vectors", max_rows: int | None = None) -> np.ndarray:
    """float32 [n >= 0, dim], finite; float16/float64 are converted, other dtypes refused
    (but for an empty batch: ``[]`` or [0, dim] of any dtype)."""
    array = np.asarray(value)
    if array.ndim == 1 and array.shape[0] in (0, dim):  # [] is no rows; [dim] is one
        array = array.reshape(-1, dim)
    if array.ndim != 2 or array.shape[1] != dim:
        raise BadVectors(f"{what} must have shape [n, {dim}], got {list(array.shape)}")
    if array.dtype.kind != "f" and array.size:
        raise BadVectors(f"{what} must be floating point (float32 preferred), got {array.dtype}")
    if max_rows is not None and array.shape[0] > max_rows:
        raise BadVectors(f"{what}: {array.shape[0]} rows in one call; the limit is {max_rows}")
    if array.dtype == np.float32:
        array = np.ascontiguousarray(array)
    else:
        with np.errstate(over="ignore"):  # a float64 too large for float32 becomes inf, refused below
            array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        row = int(np.argmin(np.isfinite(array).all(axis=1)))
        raise BadVectors(f"{what}: row {row} has NaN or infinite values (after conversion to float32)")
    return array


def ids(value: Any, rows: int | None, max_rows: int | None = None) -> np.ndarray:
    """int64 [rows] (``rows`` None: any length up to ``max_rows``); other
    integer dtypes converted when the values fit."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu" and array.size:
        raise BadVectors(f"ids must be integers (int64), got {array.dtype}")
    if rows is None and array.ndim != 1:
        raise BadVectors(f"ids must be a 1-D integer array, got shape {list(array.shape)}")
    if rows is not None and (array.ndim != 1 or array.shape[0] != rows):
        raise BadVectors(f"ids must have shape [{rows}] (one per vector), got {list(array.shape)}")
    if max_rows is not None and len(array) > max_rows:
        raise BadVectors(f"ids: {len(array)} in one call; the limit is {max_rows}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise BadVectors("ids must fit in int64")
    return np.ascontiguousarray(array, dtype=np.int64)


def refs(value: Any, max_rows: int | None = None) -> np.ndarray:
    """int64 [n] refs as append returned them (at most ``max_rows``)."""
    array = np.asarray(value)
    if (array.dtype.kind not in "iu" and array.size) or array.ndim != 1:
        raise BadVectors(f"refs must be a 1-D integer array, got {array.dtype} {list(array.shape)}")
    if max_rows is not None and len(array) > max_rows:
        raise BadVectors(f"refs: {len(array)} in one call; the limit is {max_rows}")
    return np.ascontiguousarray(array, dtype=np.int64)


def k(value: Any, max_k: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 < int(value) <= max_k:
        raise BadVectors(f"k must be an integer in 1..{max_k}, got {value!r}")
    return int(value)
