"""In-memory rows shared with the processes of one machine instead of copied into pickles.

``pm.sample(cores=k)`` runs chains in worker processes. Where they start by ``fork`` (Linux's
default up to Python 3.13) they inherit the step; elsewhere (``forkserver``, Linux's default
from Python 3.14 and macOS's on Intel; ``spawn`` on Windows; or ``mp_ctx=`` asked for) PyMC
pickles the step with cloudpickle and every worker unpickles it. An in-memory column's rows
travelled inside that pickle: at 10⁶ × 30 float64 a 249 MB pickle, written by the parent,
sent to and read by every worker, each then holding its own copy of the rows. A column of at
least :data:`SHARE_MIN_BYTES` is now pickled as the name of a POSIX shared-memory segment
(Linux's ``/dev/shm``) holding its rows: written once, at the column's first pickling, freed
with the column (or by Python's resource tracker if the process dies first); every unpickled
copy maps the segment read-only, the same pages in every process
(``benchmarks/results/shared_rows.md``).

The segment lives on this machine and as long as the column that made it: a pickle that
must carry the rows themselves (to another machine, as :func:`pymc_bigdata.sample_dask`'s
are, or to a file read later) is made inside :func:`rows_travel_with_pickles`. Where there
is no ``/dev/shm``, or not room in it for twice the rows, the rows travel in the pickle as
before.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np

from pymc_bigdata.errors import SharedRowsGone

__all__ = [
    "SHARE_MIN_BYTES",
    "SHM_DIR",
    "attach_rows",
    "rows_travel_with_pickles",
    "share_rows",
    "travelling",
]

#: arrays smaller than this travel in the pickle (their copies cost little)
SHARE_MIN_BYTES = 16 * 2**20

#: where the machine's POSIX shared-memory segments are files
SHM_DIR = "/dev/shm"

_travel = threading.local()


@contextlib.contextmanager
def rows_travel_with_pickles() -> Iterator[None]:
    """Within this block (this thread), pickled in-memory rows travel in the pickle.

    Outside it a step's in-memory rows of 16 MiB or more are pickled as the name of a
    shared-memory segment of this machine that lives as long as the step's rows: right for
    ``pm.sample``'s worker processes, wrong for a pickle read on another machine or later.

    Examples
    --------
    >>> import cloudpickle
    >>> import pymc_bigdata as pmbd
    >>> with pmbd.rows_travel_with_pickles():  # doctest: +SKIP
    ...     payload = cloudpickle.dumps(step)
    """
    before = getattr(_travel, "on", False)
    _travel.on = True
    try:
        yield
    finally:
        _travel.on = before


def travelling() -> bool:
    """Whether pickles made now carry their rows (:func:`rows_travel_with_pickles`)."""
    return getattr(_travel, "on", False)


def share_rows(owner: object, array: np.ndarray) -> str | None:
    """The name of a new shared-memory segment holding ``array``'s bytes, unlinked when
    ``owner`` is freed; None where the rows should travel in the pickle (smaller than
    :data:`SHARE_MIN_BYTES`, Python objects, no ``/dev/shm`` or no room in it)."""
    nbytes = int(array.nbytes)
    if nbytes < SHARE_MIN_BYTES or array.dtype.hasobject or not _has_room(nbytes):
        return None
    segment = shared_memory.SharedMemory(create=True, size=nbytes)
    try:
        np.ndarray(array.shape, dtype=array.dtype, buffer=segment.buf)[...] = array
    except BaseException:
        segment.close()
        segment.unlink()
        raise
    segment.close()  # the segment stays until unlinked: the owner's finalizer does that
    weakref.finalize(owner, segment.unlink)
    return segment.name


def attach_rows(name: str, shape: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """The read-only rows of the segment ``name`` (a memory map: no copy).

    Raises
    ------
    SharedRowsGone
        Where the segment does not exist here (another machine, or its column was freed).
    """
    path = os.path.join(SHM_DIR, name.lstrip("/"))
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SharedRowsGone(
            f"The rows of {what} were pickled as a shared-memory segment of the process that "
            f"pickled them ({name}), and it no longer exists here: it lives on that machine, "
            "as long as that process keeps the data. To pickle a step or model with its rows "
            "(for another machine, or to read later), pickle it inside "
            "pmbd.rows_travel_with_pickles()."
        ) from None
    try:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        buffer = mmap.mmap(descriptor, nbytes, prot=mmap.PROT_READ)
    finally:
        os.close(descriptor)
    return np.ndarray(shape, dtype=dtype, buffer=buffer)


def _has_room(nbytes: int) -> bool:
    """Whether ``/dev/shm`` exists and has room for twice ``nbytes`` (a container's is often
    64 MB; writing past its end would kill the process, not raise)."""
    try:
        stats = os.statvfs(SHM_DIR)
    except (OSError, AttributeError):
        return False
    return stats.f_bavail * stats.f_frsize >= 2 * nbytes
