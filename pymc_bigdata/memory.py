"""Large arrays written once in full: memory mapped at once rather than faulted in lazily.

NumPy backs a large ``np.empty`` with memory it advises the kernel to map in 2 MiB huge pages
(``MADV_HUGEPAGE``), each faulted in at its first write. Where the kernel must first compact
memory to find a free huge page (Linux's default ``defrag=madvise``, on a machine whose memory
the page cache has filled) those first writes stall: the window gathers' copy of 10⁶ × 30
float64 rows (240 MB) took 0.86 s (median of five fresh processes) to write into fresh
``np.empty`` memory on the project's machine. :func:`populated_empty` asks for anonymous
memory with every 4 KiB page mapped at once (``MAP_POPULATE``): 0.32 s to map and write the
same copy, and reading windows of it afterwards no slower beyond the runs' spread
(``benchmarks/results/window_copy_memory.md``). Where the platform has no ``MAP_POPULATE``
(macOS, Windows) it is ``np.empty``.
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["POPULATE_MIN_BYTES", "populated_empty"]

#: arrays smaller than this come from ``np.empty`` (their first faults cost little)
POPULATE_MIN_BYTES = 16 * 2**20


def populated_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised, writable C-contiguous array whose memory is mapped at once.

    Parameters
    ----------
    shape
        The array's shape.
    dtype
        Its data type.

    Returns
    -------
    numpy.ndarray
        Backed by an anonymous ``mmap`` with ``MAP_POPULATE`` (freed with the array), or by
        ``np.empty`` below :data:`POPULATE_MIN_BYTES` or where the platform lacks it.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if nbytes < POPULATE_MIN_BYTES or populate is None:
        return np.empty(shape, dtype=dtype)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate
    try:
        buffer = mmap.mmap(-1, nbytes, flags=flags)
    except OSError:  # e.g. an address-space limit: numpy's own allocation says so clearly
        return np.empty(shape, dtype=dtype)
    return np.ndarray(shape, dtype=dtype, buffer=buffer)
