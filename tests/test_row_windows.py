"""Window gathers (``pymc_bigdata.row_windows``): minibatches as windows of a shuffled copy."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.row_windows import RowWindow, WindowIndexSampler, WindowPermutation
from pymc_bigdata.rows import RowSource, available_memory


@pytest.fixture(autouse=True)
def small_pools_read_windows(monkeypatch):
    """These tests read windows of pools of a few minibatches (the default needs 100)."""
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_MIN_BATCHES", 1)


def window_source(n_rows: int = 50) -> RowSource:
    """Two arrays whose rows say which row they are (row ``i`` holds ``i``)."""
    x = np.repeat(np.arange(n_rows, dtype=np.float64)[:, None], 3, axis=1)
    y = np.arange(n_rows)
    source = RowSource([x, y], ["x", "y"])
    source.gather = "windows"
    return source


def inclusion_counts(sampler: WindowIndexSampler, n_rows: int, draws: int) -> np.ndarray:
    counts = np.zeros(n_rows)
    for _ in range(draws):
        np.add.at(counts, sampler.draw().indices, 1)
    return counts


@pytest.mark.parametrize("reshuffle", [False, True])
def test_every_row_is_in_a_window_with_probability_n_over_n(reshuffle):
    """Each row's share of 20,000 windows of 7 rows of 50 is 7/50, within 4.5 binomial sds:
    windows that did not wrap around the copy's end (starts in [0, N - n]) give its first
    and last rows a 1/44 share of the middle rows' (watched failing)."""
    source = window_source(50)
    sampler = source.index_sampler(7, np.random.default_rng(1), reshuffle=reshuffle)
    assert isinstance(sampler, WindowIndexSampler)
    draws = 20_000
    counts = inclusion_counts(sampler, 50, draws)
    p = 7 / 50
    assert np.all(np.abs(counts - draws * p) <= 4.5 * np.sqrt(draws * p * (1 - p)))


def test_a_window_permutation_reads_each_row_first_with_probability_k_over_n():
    """A sequential test's first 7 rows of 50 (two reads, 4 then 3) hold each row with
    probability 7/50 over 20,000 decisions, within 4.5 binomial sds (watched failing: every
    decision started at the copy's first row, and starts in [0, N - 7] that never wrap)."""
    shuffled = window_source(50).shuffled_rows()
    permutation = WindowPermutation(shuffled, np.random.default_rng(3))
    counts, draws = np.zeros(50), 20_000
    for _ in range(draws):
        permutation.start()
        rows = np.concatenate([permutation.next(4).indices, permutation.next(3).indices])
        np.add.at(counts, rows, 1)
    p = 7 / 50
    assert np.all(np.abs(counts - draws * p) <= 4.5 * np.sqrt(draws * p * (1 - p)))


def test_a_window_permutation_reads_distinct_rows_up_to_the_pool():
    """Within one decision the rows are distinct, consecutive in the copy (wrapping), at
    most the pool's; a new decision starts afresh (watched failing: reads past the pool)."""
    source = window_source(50)
    shuffled = source.shuffled_rows(exclude=np.array([3, 17]))
    permutation = WindowPermutation(shuffled, np.random.default_rng(4))
    for _ in range(20):
        permutation.start()
        windows = [permutation.next(k) for k in (20, 20, 20, 5)]
        assert [len(w) for w in windows] == [20, 20, 8, 0] and permutation.drawn == 48
        rows = np.concatenate([w.indices for w in windows])
        assert sorted(rows) == sorted(set(range(50)) - {3, 17})
        x, y = (np.concatenate(parts) for parts in zip(*(source.take(w) for w in windows)))
        np.testing.assert_array_equal(y, rows)
        np.testing.assert_array_equal(x[:, 0], rows)
        first = int(np.flatnonzero(shuffled.order == rows[0])[0])
        np.testing.assert_array_equal(rows, shuffled.order[(first + np.arange(48)) % 48])


def test_past_its_window_a_permutation_reads_uniform_rows_it_has_not_read():
    """With ``window_rows=10`` of 50: the first 10 rows are consecutive in the copy, the
    next ones distinct from them and each other (a gather of the source's indices), all 50
    when read to the end; the first 30 hold each row with probability 30/50 over 20,000
    decisions (watched failing: the window's rows left in the uniform draws, and the window
    read on instead of uniform rows)."""
    source = window_source(50)
    shuffled = source.shuffled_rows()
    permutation = WindowPermutation(shuffled, np.random.default_rng(5), window_rows=10)
    counts, draws = np.zeros(50), 20_000
    for i in range(draws):
        permutation.start()
        parts = [permutation.next(k) for k in (4, 10, 16)]
        assert isinstance(parts[0], RowWindow) and not isinstance(parts[1], RowWindow)
        rows = np.concatenate([parts[0].indices, parts[1], parts[2]])
        assert len(np.unique(rows)) == 30
        first = int(np.flatnonzero(shuffled.order == rows[0])[0])
        np.testing.assert_array_equal(rows[:10], shuffled.order[(first + np.arange(10)) % 50])
        following = shuffled.order[(first + 10 + np.arange(20)) % 50]
        assert not np.array_equal(rows[10:], following)  # not the window read on
        np.add.at(counts, rows, 1)
        if i < 20:  # read to the end: every row once; a gather reads the rows it names
            rest = permutation.next(50)
            assert sorted(np.concatenate([rows, rest])) == list(range(50))
            np.testing.assert_array_equal(source.take(rest)[1], rest)
    p = 30 / 50
    assert np.all(np.abs(counts - draws * p) <= 4.5 * np.sqrt(draws * p * (1 - p)))


def test_a_reshuffled_pass_reads_disjoint_windows_from_a_random_offset():
    """Within a pass (floor(N/n) windows) no row repeats; passes start at other offsets."""
    source = window_source(50)
    sampler = source.index_sampler(7, np.random.default_rng(2), reshuffle=True)
    covered = []
    for _ in range(5):
        rows = np.concatenate([sampler.draw().indices for _ in range(50 // 7)])
        assert len(np.unique(rows)) == len(rows) == 49
        covered.append(frozenset(rows.tolist()))
    assert len(set(covered)) > 1  # the row left out changes from pass to pass


def test_a_window_reads_the_rows_of_its_indices_also_when_it_wraps():
    """A window's rows are the source's rows at its indices (x and y of the same rows);
    one that does not wrap is a view of the copy, one that wraps a copy of both ends."""
    source = window_source(50)
    shuffled = source.shuffled_rows()
    for start in (0, 20, 45):
        window = RowWindow(shuffled, start, 7)
        x, y = source.take(window)
        expected = source.take(window.indices)
        np.testing.assert_array_equal(x, expected[0])
        np.testing.assert_array_equal(y, expected[1])
        np.testing.assert_array_equal(x[:, 0], y)
        assert np.shares_memory(x, shuffled.arrays[0]) == (start + 7 <= 50)
    assert not np.array_equal(shuffled.order, np.arange(50))  # a shuffled order


def test_the_copy_reads_each_row_once_and_leaves_out_the_census():
    """The census stratum's rows are never in a window, and the copy reads every other row
    once (in memory, gathered: the census is not read)."""
    source = window_source(50)
    census = np.array([3, 17, 40])
    sampler = source.index_sampler(5, np.random.default_rng(3), exclude=census)
    before = source.rows_streamed
    rows = np.concatenate([sampler.draw().indices for _ in range(200)])
    source.take(sampler.draw())
    assert source.rows_streamed - before == 50 - len(census)
    assert not np.isin(census, rows).any()
    assert np.array_equal(np.sort(np.unique(rows)), np.setdiff1d(np.arange(50), census))


def test_an_out_of_memory_copy_is_the_same_and_read_in_one_pass(tmp_path):
    """From a ``.npy`` file the copy is read block by block (its rows placed by the order),
    and equals the in-memory source's copy."""
    memory = window_source(5_000)
    np.save(tmp_path / "x.npy", memory.columns[0].array)
    np.save(tmp_path / "y.npy", memory.columns[1].array)
    files = RowSource([str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], ["x", "y"])
    files.gather = "windows"
    assert not files.in_memory
    census = np.arange(0, 5_000, 7)
    before = files.rows_streamed
    for a, b in zip(files.shuffled_rows(census).arrays, memory.shuffled_rows(census).arrays):
        np.testing.assert_array_equal(a, b)
    assert files.rows_streamed - before == 5_000


def test_the_copy_does_not_travel_with_a_pickle_and_is_rebuilt_the_same():
    source = window_source(20_000)
    shuffled = source.shuffled_rows()
    copy = [a.copy() for a in shuffled.arrays]
    travelled = pickle.loads(pickle.dumps(shuffled))
    assert not travelled.built
    copy_bytes = sum(a.nbytes for a in copy)  # the source's own rows travel, not the copy
    assert len(pickle.dumps(shuffled)) < len(pickle.dumps(source)) + 0.2 * copy_bytes
    for a, b in zip(travelled.arrays, copy):
        np.testing.assert_array_equal(a, b)


def test_released_copies_are_read_again_the_same_on_next_use():
    """``release_copies`` frees every copy of the source; the next window reads it again,
    in the same order, as one more pass over the rows."""
    source = window_source(5_000)
    census = np.arange(0, 5_000, 9)
    copies = [source.shuffled_rows(), source.shuffled_rows(census)]
    before = [[a.copy() for a in shuffled.arrays] for shuffled in copies]
    streamed = source.rows_streamed
    source.release_copies()
    assert not any(shuffled.built for shuffled in copies)
    for shuffled, arrays in zip(copies, before):
        for a, b in zip(shuffled.arrays, arrays):
            np.testing.assert_array_equal(a, b)
    assert source.rows_streamed - streamed == 5_000 + 5_000 - len(census)


def test_a_pool_of_fewer_minibatches_than_the_floor_draws_uniform_rows(monkeypatch):
    """Below ``WINDOW_MIN_BATCHES`` minibatches in the pool the rows are uniform."""
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_MIN_BATCHES", 8)
    source = window_source(50)
    assert isinstance(source.index_sampler(6, np.random.default_rng(5)), WindowIndexSampler)
    assert not isinstance(source.index_sampler(7, np.random.default_rng(5)), WindowIndexSampler)


def test_with_replacement_a_window_source_draws_uniform_rows():
    """Windows cannot draw with replacement (HMC-ECS's minibatches): uniform rows then."""
    source = window_source(50)
    sampler = source.index_sampler(7, np.random.default_rng(4), replace=True)
    assert not isinstance(sampler, WindowIndexSampler)


def test_arrays_asking_for_different_gathers_are_refused():
    x = pmbd.sources.as_column(np.zeros((10, 2)), "x")
    y = pmbd.sources.as_column(np.zeros(10), "y")
    x.gather, y.gather = "windows", "blocks"
    with pytest.raises(ValueError, match="different gathers"):
        RowSource([x, y], ["x", "y"])


def windowed_normal(seed: int) -> pm.Model:
    y = np.random.default_rng(seed).normal(0.3, 1.0, size=5_000)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=pmbd.Data("y_data", y, gather="windows"))
    return model


def test_window_gathers_are_reproducible_and_read_windows():
    """The same seed gives the same draws; the step's minibatches are windows."""
    draws = []
    for _ in range(2):
        model = windowed_normal(5)
        step = pmbd.SGHMC(model=model)
        assert step.layer.rows.gather == "windows" and step.minibatches.windows
        with model:
            idata = pm.sample(
                step=step,
                tune=50,
                draws=50,
                chains=1,
                random_seed=9,
                progressbar=False,
                compute_convergence_checks=False,
            )
        draws.append(idata.posterior["mu"].values)
    np.testing.assert_array_equal(draws[0], draws[1])


def test_in_memory_rows_read_through_windows_by_default(tmp_path, monkeypatch):
    """In-memory rows up to ``WINDOW_COPY_BYTES`` get windows; an array asking for uniform
    rows keeps every array on them; a ``.npy`` file and larger rows get uniform rows."""
    x, y = np.zeros((100, 2)), np.zeros(100)
    assert RowSource([x, y], ["x", "y"]).gather == "windows"
    asked = pmbd.sources.as_column(y, "y")
    asked.gather = "rows"
    assert RowSource([x, asked], ["x", "y"]).gather == "rows"
    np.save(tmp_path / "x.npy", x)
    assert RowSource([str(tmp_path / "x.npy"), y], ["x", "y"]).gather == "rows"
    monkeypatch.setattr("pymc_bigdata.rows.WINDOW_COPY_BYTES", x.nbytes + y.nbytes - 1)
    assert RowSource([x, y], ["x", "y"]).gather == "rows"


def test_a_copy_beyond_the_available_memory_is_refused_or_not_made(monkeypatch):
    """An array asking for windows whose copy would not fit in the memory available gets a
    clear error when the source is made (not a MemoryError at the first minibatch); by
    default such rows, or rows whose copy would take more than half of it, read uniform
    rows. The copy is counted in the minibatches' dtypes (float32 rows read as float64 take
    twice their bytes)."""
    x = np.zeros((1_000, 3), dtype=np.float32)
    source = RowSource([x], ["x"], dtypes=[np.float64])
    assert source.copy_bytes == 24_000 and source.gather == "windows"
    monkeypatch.setattr("pymc_bigdata.rows.available_memory", lambda: 47_999)
    assert RowSource([x], ["x"], dtypes=[np.float64]).gather == "rows"
    monkeypatch.setattr("pymc_bigdata.rows.available_memory", lambda: 48_000)
    assert RowSource([x], ["x"], dtypes=[np.float64]).gather == "windows"
    asked = pmbd.sources.as_column(x, "x")
    asked.gather = "windows"
    assert RowSource([asked], ["x"], dtypes=[np.float64]).gather == "windows"
    monkeypatch.setattr("pymc_bigdata.rows.available_memory", lambda: 23_999)
    with pytest.raises(ValueError, match=r'gather="windows" copies .* GiB are available'):
        RowSource([asked], ["x"], dtypes=[np.float64])
    monkeypatch.setattr("pymc_bigdata.rows.available_memory", lambda: None)  # not known
    assert RowSource([asked], ["x"], dtypes=[np.float64]).gather == "windows"


def test_the_available_memory_is_read_from_the_system():
    """Linux says how much memory is available: a positive number of bytes, at most the
    machine's total."""
    available = available_memory()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert available is not None and 0 < available <= total
