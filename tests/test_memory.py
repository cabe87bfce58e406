"""Large arrays written once in full (``pymc_bigdata.memory``)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from pymc_bigdata.memory import POPULATE_MIN_BYTES, populated_empty
from pymc_bigdata.rows import RowSource


def resident_bytes() -> int:
    """This process's resident memory now (Linux's ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="no MAP_POPULATE here")
def test_a_large_array_is_resident_before_its_first_write():
    """64 MiB from populated_empty are resident at once (np.empty's are not, until written),
    writable, C-contiguous, of the shape and dtype asked for, and freed with the array."""
    shape = (2**20, 8)  # 64 MiB of float64
    before = resident_bytes()
    array = populated_empty(shape, np.float64)
    grown = resident_bytes() - before
    assert grown > 0.9 * array.nbytes
    assert array.shape == shape and array.dtype == np.float64
    assert array.flags.c_contiguous and array.flags.writeable
    array[:] = 1.5
    assert float(array.sum()) == 1.5 * array.size
    del array
    assert resident_bytes() - before < 0.1 * 2**26


def test_a_small_array_comes_from_numpy():
    """Below the threshold (and for any dtype) the array is np.empty's."""
    array = populated_empty((3, 4), np.int32)
    assert array.shape == (3, 4) and array.dtype == np.int32
    assert array.nbytes < POPULATE_MIN_BYTES and array.base is None


def test_the_window_copy_holds_the_rows_in_its_order(monkeypatch):
    """A copy in populated memory (the threshold lowered to 0 bytes) holds each array's rows
    in the copy's order, in the dtype the source hands out."""
    monkeypatch.setattr("pymc_bigdata.memory.POPULATE_MIN_BYTES", 0)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((500, 3)), rng.integers(0, 2, size=500).astype(np.int8)
    shuffled = RowSource([X, y], ["X", "y"], progress=False).shuffled_rows()
    copy_X, copy_y = shuffled.arrays
    assert isinstance(copy_X.base, mmap.mmap) or not hasattr(mmap, "MAP_POPULATE")
    np.testing.assert_array_equal(copy_X, X[shuffled.order])
    np.testing.assert_array_equal(copy_y, y[shuffled.order])
    assert copy_y.dtype == np.int8
