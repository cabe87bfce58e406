"""In-memory rows shared with worker processes (``pymc_bigdata.shared_rows``)."""

from __future__ import annotations

import gc
import mmap
import os

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from conftest import logistic_data, logistic_model

import pymc_bigdata as pmbd
from pymc_bigdata import SharedRowsGone, rows_travel_with_pickles, shared_rows
from pymc_bigdata.sources import ArrayColumn

pytestmark = pytest.mark.skipif(
    not os.path.isdir(shared_rows.SHM_DIR), reason="no POSIX shared memory as files here"
)


def segment_path(name: str) -> str:
    return os.path.join(shared_rows.SHM_DIR, name.lstrip("/"))


@pytest.fixture
def share_everything(monkeypatch):
    """Share arrays of any size (the threshold is 16 MiB)."""
    monkeypatch.setattr(shared_rows, "SHARE_MIN_BYTES", 0)


def test_a_pickled_column_names_its_shared_rows(share_everything):
    """The pickle holds the segment's name, not the rows; the unpickled column maps the same
    rows read-only; a second pickling reuses the segment; freeing the column unlinks it, and
    a pickle unpickled after that says what happened."""
    rows = np.random.default_rng(0).standard_normal((4_000, 5)).astype(np.float32)
    column = ArrayColumn(rows, "X")
    pickled = cloudpickle.dumps(column)
    assert len(pickled) < rows.nbytes / 10
    name = column.shared_name
    assert os.path.exists(segment_path(name))
    restored = cloudpickle.loads(pickled)
    np.testing.assert_array_equal(restored.take(np.array([3, 0, 3_999])), rows[[3, 0, 3_999]])
    assert restored.array.dtype == np.float32 and restored.array.shape == rows.shape
    assert isinstance(restored.array.base, mmap.mmap) and not restored.array.flags.writeable
    assert cloudpickle.loads(cloudpickle.dumps(column)).shared_name == name
    del column
    gc.collect()
    assert not os.path.exists(segment_path(name))
    with pytest.raises(SharedRowsGone, match="rows_travel_with_pickles"):
        cloudpickle.loads(pickled)


def test_rows_travel_where_asked_where_small_and_where_no_room(share_everything, monkeypatch):
    """Inside rows_travel_with_pickles (even for a column already shared), below the
    threshold, and without room in /dev/shm the rows are in the pickle."""
    rows = np.arange(30_000.0).reshape(10_000, 3)
    column = ArrayColumn(rows, "X")
    cloudpickle.dumps(column)
    assert column.shared_name is not None
    with rows_travel_with_pickles():
        travelled = cloudpickle.loads(cloudpickle.dumps(column))
    assert travelled.array.flags.writeable and travelled.shared_name is None
    np.testing.assert_array_equal(travelled.array, rows)
    monkeypatch.setattr(shared_rows, "SHARE_MIN_BYTES", rows.nbytes + 1)
    assert len(cloudpickle.dumps(ArrayColumn(rows, "X"))) > rows.nbytes
    monkeypatch.setattr(shared_rows, "SHARE_MIN_BYTES", 0)
    monkeypatch.setattr(shared_rows, "SHM_DIR", "/nonexistent-shm-dir")
    assert len(cloudpickle.dumps(ArrayColumn(rows, "X"))) > rows.nbytes


def test_parallel_chains_read_the_shared_rows(share_everything):
    """pm.sample(cores=2) with forkserver workers (Linux's default from Python 3.14; fork
    inherits the step unpickled) unpickles the step in two processes that map the shared
    rows: the same draws as cores=1 (a wrong shape, dtype or offset in the map would change
    them)."""
    model, layer = logistic_model(*logistic_data(5_000, 3, seed=11))
    step = pmbd.SGHMC(model=model, layer=layer, batch_size=500)
    kwargs = {"tune": 60, "draws": 40, "progressbar": False, "compute_convergence_checks": False}
    with model:
        parallel = pm.sample(
            step=step, chains=2, cores=2, random_seed=5, mp_ctx="forkserver", **kwargs
        )
        sequential = pm.sample(step=step, chains=2, cores=1, random_seed=5, **kwargs)
    assert all(column.shared_name for column in layer.rows.columns)
    np.testing.assert_array_equal(
        parallel.posterior["beta"].values, sequential.posterior["beta"].values
    )
