"""Storage backends (pymc_bigdata.sources) and the block gather (rows.BlockIndexSampler)."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np
import pytest
import zarr

from pymc_bigdata.rows import BlockIndexSampler, RowSource
from pymc_bigdata.sources import ArrayColumn, DaskColumn, MemmapColumn, ZarrColumn, as_column


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One (1000, 3) float32 array in memory, in a .npy file and in a zarr store."""
    path = tmp_path_factory.mktemp("sources")
    array = np.random.default_rng(0).standard_normal((1000, 3)).astype(np.float32)
    np.save(path / "x.npy", array)
    store = zarr.create_array(
        str(path / "x.zarr"), shape=array.shape, chunks=(64, 3), dtype=array.dtype
    )
    store[:] = array
    return array, path


def _columns(stored):
    array, path = stored
    return {
        "memory": as_column(array, "x"),
        "npy": as_column(path / "x.npy", "x"),
        "memmap": as_column(np.load(path / "x.npy", mmap_mode="r"), "x"),
        "zarr": as_column(path / "x.zarr", "x"),
        "dask": as_column(da.from_array(array, chunks=(100, 3)), "x"),
    }


def test_every_backend_reads_the_same_rows(stored):
    """take (unsorted, with repeats) and read give the stored rows for every backend."""
    array, _ = stored
    idx = np.array([999, 3, 3, 500, 0, 64, 63, 127, 128])
    for kind, column in _columns(stored).items():
        assert column.n_rows == 1000 and column.trailing_shape == (3,), kind
        np.testing.assert_array_equal(column.take(idx), array[idx], err_msg=kind)
        np.testing.assert_array_equal(column.read(60, 130), array[60:130], err_msg=kind)


def test_backend_kinds_and_default_gathers(stored):
    """Memory and .npy read rows cheaply (uniform gathers); zarr and dask decode blocks."""
    columns = _columns(stored)
    assert isinstance(columns["memory"], ArrayColumn)
    assert isinstance(columns["npy"], MemmapColumn) and isinstance(columns["memmap"], MemmapColumn)
    assert isinstance(columns["zarr"], ZarrColumn) and isinstance(columns["dask"], DaskColumn)
    assert [c.default_gather for c in columns.values()] == ["rows"] * 3 + ["blocks"] * 2
    np.testing.assert_array_equal(np.diff(columns["zarr"].block_bounds)[:-1], 64)
    np.testing.assert_array_equal(np.diff(columns["dask"].block_bounds), 100)


def test_chunked_take_decodes_each_block_once(stored):
    """A zarr take groups rows by chunk: 3 rows in 2 chunks decode 2 chunks, then 0."""
    column = _columns(stored)["zarr"]
    column.take(np.array([1, 2, 70]))
    assert column.cache.decoded == 2
    column.take(np.array([70, 5]))
    assert column.cache.decoded == 2


def test_a_pass_decodes_each_block_once_whatever_its_reads(stored, monkeypatch):
    """A full-data pass in reads of 16 rows over 64-row zarr chunks (issue 27: 65,536-row
    reads over 500,000-row chunks) decodes each chunk once and hands out the stored rows in
    order. Read directly, each chunk was decoded once per read that met it: 4 times here."""
    array, path = stored
    column = as_column(path / "x.zarr", "x")
    decoded = []  # the chunks each zarr read decodes
    read = ZarrColumn.read

    def counted(self, start, stop):
        decoded.extend(range(start // 64, (stop - 1) // 64 + 1))
        return read(self, start, stop)

    monkeypatch.setattr(ZarrColumn, "read", counted)
    rows = RowSource([column], ["x"], progress=False)
    streamed = np.concatenate([chunk[0] for chunk in rows.chunks(16)])
    np.testing.assert_array_equal(streamed, array)
    assert sorted(decoded) == list(range(16))  # 1,000 rows in 16 chunks, each decoded once
    # reads longer than a block still read straight from the store (a chunk that two reads
    # share is decoded by both)
    decoded.clear()
    np.testing.assert_array_equal(np.concatenate([c[0] for c in rows.chunks(300)]), array)
    assert set(decoded) == set(range(16)) and len(decoded) == 16 + 3


def test_file_backed_columns_pickle_without_their_data(stored):
    """A .npy or zarr column pickles as its path (a few hundred bytes), not 12 kB of rows."""
    columns = _columns(stored)
    for kind in ("npy", "zarr"):
        column = columns[kind]
        column.take(np.arange(10))
        blob = pickle.dumps(column)
        assert len(blob) < 4000, (kind, len(blob))
        np.testing.assert_array_equal(
            pickle.loads(blob).take(np.arange(5)), column.take(np.arange(5))
        )


def test_bad_sources_get_clear_errors(tmp_path):
    """Missing store, unreadable store, non-numeric dtype, scalar, unknown dask chunks."""
    with pytest.raises(FileNotFoundError, match="'X'.*nowhere"):
        as_column(tmp_path / "nowhere.zarr", "X")
    (tmp_path / "junk").mkdir()
    with pytest.raises(ValueError, match="'X'.*cannot open"):
        as_column(tmp_path / "junk", "X")
    (tmp_path / "bad.npy").write_bytes(b"not a npy file")
    with pytest.raises(ValueError, match="'X'.*cannot read"):
        as_column(tmp_path / "bad.npy", "X")
    with pytest.raises(TypeError, match="'names'.*not a real numeric"):
        as_column(np.array(["a", "b"]), "names")
    with pytest.raises(ValueError, match="'s'.*scalar"):
        as_column(np.float64(1.0), "s")
    unknown = da.from_array(np.arange(10.0), chunks=5)
    unknown = unknown[unknown > 3]
    with pytest.raises(ValueError, match="'d'.*unknown chunk sizes"):
        as_column(unknown, "d")
    with pytest.raises(ValueError, match="different row counts"):
        RowSource([np.zeros(5), np.zeros(6)], ["a", "b"])


def test_streamed_pass_shows_progress_only_when_slow(capsys, monkeypatch):
    """The full-data pass's progress bar appears once a pass runs past the delay."""
    import pymc_bigdata.rows as rows_module

    source = RowSource([np.zeros(10)], ["y"])
    assert rows_module.PROGRESS_DELAY >= 1  # quick passes stay quiet
    list(source.chunks(2))
    assert "rows" not in capsys.readouterr().err
    monkeypatch.setattr(rows_module, "PROGRESS_DELAY", 0.0)
    list(source.chunks(2, desc="test pass"))
    assert "test pass" in capsys.readouterr().err


# ---------------------------------------------------------------------- block gathers
def _variance_prediction(values, bounds, n, k):
    """Var of the minibatch mean under the block gather's stationary law (law of total
    variance over a uniform K-subset of equal blocks, then an n-subset of its rows)."""
    n_blocks = len(bounds) - 1
    size = k * (bounds[1] - bounds[0])
    block_means = np.add.reduceat(values, bounds[:-1]) / np.diff(bounds)
    v_cache = block_means.var(ddof=1) / k * (1 - k / n_blocks)
    within = size / (size - 1) * (values.var() - v_cache)
    return (1 - n / size) / n * within + v_cache


@pytest.mark.parametrize(("order", "block_rows"), [("sorted", 1), ("sorted", 50), ("shuffled", 50)])
def test_block_gather_noise_matches_its_derivation(order, block_rows):
    """Each minibatch mean's variance equals the derived value: uniform sampling's
    sigma^2 / n (1 - n/N) with one-row blocks, and inflated by the spread of the cached
    blocks' means when rows are sorted (5.4x here; shuffled rows: 0.99x).
    4,000 independent caches; band 5 standard errors of a sample variance."""
    n_rows, n, k = 2000, 20, 4
    values = np.linspace(-1.0, 1.0, n_rows) ** 3
    if order == "shuffled":
        values = np.random.default_rng(1).permutation(values)
    bounds = np.arange(0, n_rows + 1, block_rows)
    sampler = BlockIndexSampler(bounds, n, np.random.default_rng(2), active_blocks=k)
    k_used = sampler.active_blocks
    means = []
    for _ in range(4000):
        sampler.reset(sampler.rng)
        means.append(values[sampler.draw()].mean())
    observed = np.var(means, ddof=1)
    predicted = _variance_prediction(values, bounds, n, k_used)
    uniform = values.var() * n_rows / (n_rows - 1) / n * (1 - n / n_rows)
    assert abs(observed - predicted) < 5 * predicted * np.sqrt(2 / 3999), (observed, predicted)
    ratio = predicted / uniform
    if block_rows == 1:
        assert ratio == pytest.approx(1.0, rel=1e-9)
    elif order == "sorted":
        assert ratio > 5
    else:
        assert ratio < 1.3


def test_block_gather_rows_are_marginally_uniform_and_swap_at_the_documented_rate():
    """Over a long run every block is drawn equally often (a chi-square on 50 blocks over
    batch means of 20 independent runs), blocks swap once per block_rows * reuse rows,
    and excluded rows never appear."""
    bounds = np.arange(0, 1001, 20)
    exclude = np.array([0, 1, 999])
    counts = np.zeros((20, 50))
    for run in range(20):
        sampler = BlockIndexSampler(
            bounds, 10, np.random.default_rng(run), 4, reuse=2.0, exclude=exclude
        )
        for _ in range(400):
            rows = sampler.draw()
            assert not np.isin(rows, exclude).any() and len(np.unique(rows)) == 10
            np.add.at(counts[run], np.searchsorted(bounds, rows, side="right") - 1, 1)
        assert sampler.swaps == int(400 * 10 / (20 * 2.0))
    share = counts.sum(axis=0) / counts.sum()
    expected = (
        np.diff(bounds)
        - np.bincount(np.searchsorted(bounds, exclude, side="right") - 1, minlength=50)
    ) / (1000 - 3)
    spread = (counts / counts.sum(axis=1, keepdims=True)).std(axis=0, ddof=1) / np.sqrt(20)
    z = (share - expected) / spread
    assert np.abs(z).max() < 4.5, np.abs(z).max()


def test_block_gather_settings_are_checked():
    bounds = np.arange(0, 101, 10)
    with pytest.raises(ValueError, match="active_blocks"):
        BlockIndexSampler(bounds, 5, np.random.default_rng(0), active_blocks=0)
    with pytest.raises(ValueError, match="reuse"):
        BlockIndexSampler(bounds, 5, np.random.default_rng(0), reuse=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        BlockIndexSampler(bounds, 101, np.random.default_rng(0))
