"""Unit tests of the row source and the minibatch index sampler (no PyMC model, no compilation)."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata import ModelNotSupportedError, RowIndexSampler, RowSource
from pymc_bigdata.rows import LazyPermutation, check_batch_size


# ---------------------------------------------------------------------- RowSource
@pytest.fixture
def source() -> tuple[RowSource, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = rng.standard_normal(103)
    x = rng.standard_normal((103, 2, 3))
    return RowSource([y, x], ["y", "X"]), y, x


def test_row_source_metadata(source):
    """n_rows, names, dtypes and the shape of one row of each array are reported."""
    rows, _, _ = source
    assert rows.n_rows == 103
    assert rows.names == ("y", "X")
    assert rows.dtypes == (np.dtype("float64"), np.dtype("float64"))
    assert rows.trailing_shapes == ((), (2, 3))


def test_take_gathers_rows_in_the_given_order_as_copies(source):
    """take(idx) returns every array's rows idx, in that order (repeats allowed), as copies."""
    rows, y, x = source
    idx = np.array([5, 0, 102, 5, 17])
    got_y, got_x = rows.take(idx)
    np.testing.assert_array_equal(got_y, y[idx])
    np.testing.assert_array_equal(got_x, x[idx])
    got_y[0] = 1e9
    assert y[5] != 1e9


def test_chunks_partition_the_rows_in_order(source):
    """chunks(k) yields consecutive blocks of at most k rows that concatenate to the data."""
    rows, y, x = source
    chunks = list(rows.chunks(25))
    assert [len(c[0]) for c in chunks] == [25, 25, 25, 25, 3]
    np.testing.assert_array_equal(np.concatenate([c[0] for c in chunks]), y)
    np.testing.assert_array_equal(np.concatenate([c[1] for c in chunks]), x)
    assert len(list(rows.chunks(1000))) == 1


def test_out_of_memory_passes_read_ahead_the_same_blocks(tmp_path):
    """From a zarr store, a pass reads the next block on a second thread while the caller
    works on this one: the same blocks in the same order as from memory (the last one
    short), also when the caller stops early, and the same rows counted. Caught: the
    read-ahead submitting block k instead of k + 1 (a block repeated, the last one lost)."""
    import zarr

    x = np.arange(1000 * 3, dtype=np.float32).reshape(1000, 3)
    store = zarr.create_array(
        str(tmp_path / "x.zarr"), shape=x.shape, chunks=(128, 3), dtype=x.dtype
    )
    store[:] = x
    stored = RowSource([zarr.open_array(str(tmp_path / "x.zarr"), mode="r")], ["X"])
    assert not stored.in_memory
    blocks = list(stored.chunks(300))
    assert [len(b[0]) for b in blocks] == [300, 300, 300, 100]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks]), x)
    assert stored.rows_streamed == 1000 and stored.verified
    first = stored.chunks(300)
    np.testing.assert_array_equal(next(first)[0], x[:300])
    first.close()  # stopped early: the read ahead is waited for, nothing counted
    assert stored.rows_streamed == 1000


def test_check_finite_names_each_float_array_with_nan_or_inf():
    """NaN / inf are refused per floating array, by name; integer arrays are always finite."""
    y = np.ones(10)
    y[3] = np.nan
    x = np.ones((10, 2))
    x[9, 1] = -np.inf
    rows = RowSource([y, x, np.arange(10), np.ones(10)], ["y", "X", "k", "w"])
    with pytest.raises(ModelNotSupportedError, match=r"\['y', 'X'\] contain NaN or infinite"):
        rows.check_finite()
    with pytest.raises(ModelNotSupportedError, match=r"\['y'\]"):
        rows.take(np.array([2, 3]))
    assert not rows.verified


def test_a_complete_pass_checks_the_rows_once():
    """Every block a pass reads is checked until one pass has read them all; then
    ``check_finite`` reads nothing (the set-up's separate check pass is gone) and ``take``
    checks nothing. A pass stopped early checks only what it read. Caught: ``verified`` set
    before the pass's last block (a NaN there is missed); ``check_finite`` re-reading
    checked rows."""
    x = np.ones((100, 2))
    x[95, 0] = np.nan
    rows = RowSource([x], ["X"])
    first = next(rows.chunks(25))  # a partial pass (e.g. the factorisation check's block)
    assert len(first[0]) == 25 and not rows.verified
    with pytest.raises(ModelNotSupportedError, match=r"\['X'\]"):
        for _ in rows.chunks(25):
            pass
    assert not rows.verified

    clean = RowSource([np.ones((100, 2))], ["X"])
    for _ in clean.chunks(25):
        pass
    assert clean.verified and clean.rows_streamed == 100
    clean.check_finite()
    assert clean.rows_streamed == 100
    fresh = RowSource([np.ones((100, 2))], ["X"])
    fresh.check_finite()
    assert fresh.verified and fresh.rows_streamed == 100


def test_row_source_rejects_mismatched_arrays():
    """Different row counts, a missing name or no arrays raise ValueError naming the issue."""
    with pytest.raises(ValueError, match=r"different row counts.*'y': 10.*'X': 9"):
        RowSource([np.ones(10), np.ones((9, 2))], ["y", "X"])
    with pytest.raises(ValueError, match="one name per array"):
        RowSource([np.ones(10)], ["y", "X"])
    with pytest.raises(ValueError, match="at least one array"):
        RowSource([], [])


# ---------------------------------------------------------------------- RowIndexSampler
def _draws(sampler: RowIndexSampler, count: int) -> list[np.ndarray]:
    return [sampler.draw().copy() for _ in range(count)]


@pytest.mark.parametrize("n_rows", [100, 103])
def test_without_replacement_minibatches_are_disjoint_within_an_epoch(n_rows):
    """Without replacement, the floor(N/n) minibatches of one epoch are disjoint.

    When n divides N they cover every row exactly once; otherwise they cover floor(N/n) * n
    distinct rows and the next draw starts a fresh permutation (the leftover rows of an epoch
    are skipped, so each minibatch remains a simple random sample without replacement).
    Checked over three epochs.
    """
    batch = 10
    sampler = RowIndexSampler(n_rows, batch, np.random.default_rng(1))
    per_epoch = n_rows // batch
    for _ in range(3):
        draws = _draws(sampler, per_epoch)
        assert all(d.shape == (batch,) for d in draws)
        epoch = np.concatenate(draws)
        assert len(np.unique(epoch)) == per_epoch * batch
        assert epoch.min() >= 0 and epoch.max() < n_rows
        if n_rows % batch == 0:
            np.testing.assert_array_equal(np.sort(epoch), np.arange(n_rows))


def test_full_batch_without_replacement_is_a_permutation():
    """batch_size = N draws every row once per minibatch."""
    sampler = RowIndexSampler(50, 50, np.random.default_rng(2))
    for _ in range(3):
        np.testing.assert_array_equal(np.sort(sampler.draw()), np.arange(50))


def test_with_replacement_indices_are_in_range_and_repeat():
    """replace=True: n integer indices in [0, N) per draw, drawn independently (repeats occur)."""
    sampler = RowIndexSampler(7, 7, np.random.default_rng(3), replace=True)
    draws = np.array(_draws(sampler, 200))
    assert draws.shape == (200, 7)
    assert np.issubdtype(draws.dtype, np.integer)
    assert draws.min() >= 0 and draws.max() < 7
    assert set(np.unique(draws)) == set(range(7))
    # without replacement a 7-of-7 draw never repeats a row; with replacement almost always
    assert np.mean([len(np.unique(d)) < 7 for d in draws]) > 0.9


@pytest.mark.parametrize("replace", [False, True])
def test_same_seed_same_indices_and_reset_restarts(replace):
    """The same seed gives the same index sequence; another seed a different one; reset(rng)
    with a fresh generator of the first seed replays the sequence from its start."""
    a = RowIndexSampler(1000, 64, np.random.default_rng(42), replace=replace)
    b = RowIndexSampler(1000, 64, np.random.default_rng(42), replace=replace)
    c = RowIndexSampler(1000, 64, np.random.default_rng(43), replace=replace)
    first = _draws(a, 40)  # crosses epoch boundaries (15 minibatches per epoch)
    for x, y in zip(first, _draws(b, 40), strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(first, _draws(c, 40), strict=True))
    a.reset(np.random.default_rng(42))
    for x, y in zip(first, _draws(a, 40), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("bad", [0, -1, 101])
def test_check_batch_size_rejects_out_of_range(bad):
    """batch_size outside [1, N] raises ValueError naming batch_size, the range and N."""
    with pytest.raises(ValueError, match=rf"batch_size must be between 1 and .*N = 100, got {bad}"):
        check_batch_size(bad, 100)
    with pytest.raises(ValueError, match="batch_size"):
        RowIndexSampler(100, bad, np.random.default_rng(0))


@pytest.mark.parametrize("bad", [2.5, 10.0, "10", True, None])
def test_check_batch_size_rejects_non_integers(bad):
    """A float, string, bool or None batch_size raises TypeError (not silently truncated)."""
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        check_batch_size(bad, 100)


@pytest.mark.parametrize("good", [1, 100, np.int64(37), np.int32(5)])
def test_check_batch_size_accepts_integers_in_range(good):
    """Python and NumPy integers in [1, N] are accepted."""
    check_batch_size(good, 100)
    assert RowIndexSampler(100, good, np.random.default_rng(0)).draw().shape == (int(good),)


@pytest.mark.parametrize("n_rows", [1, 7, 1_000])
def test_lazy_permutation_read_to_the_end_is_a_permutation(n_rows):
    """Batches of any size, read past the switch to a shuffled rest, give every row once; a
    new start (the next decision) begins a new permutation."""
    perm = LazyPermutation(n_rows, np.random.default_rng(0))
    for _ in range(2):
        perm.start()
        rows = np.concatenate([perm.next(k) for k in (3, 1, 50, 400, 10_000, 5)])
        assert np.array_equal(np.sort(rows), np.arange(n_rows))
        assert perm.drawn == n_rows and len(perm.next(3)) == 0


def test_lazy_permutation_prefixes_are_uniform():
    """The first three rows of a lazily drawn permutation of 5 rows: each of the 60 ordered
    triples equally likely (chi-square over 30,000 permutations), in batches that take the
    with-replacement path (up to N // 2 = 2 rows) and then the shuffled rest, or cross to it
    within a batch."""
    from scipy import stats

    rng = np.random.default_rng(1)
    perm = LazyPermutation(5, rng)
    for sizes in ((1, 1, 1), (2, 1), (1, 2), (3,)):
        counts: dict[tuple[int, ...], int] = {}
        for _ in range(30_000):
            perm.start()
            triple = tuple(np.concatenate([perm.next(k) for k in sizes]).tolist())
            counts[triple] = counts.get(triple, 0) + 1
        assert len(counts) == 60
        observed = np.array(list(counts.values()))
        assert stats.chisquare(observed).pvalue > 1e-3


@pytest.mark.parametrize("n_candidates", [700, 70_000])
def test_lazy_permutation_keeps_first_occurrences_in_order(n_candidates):
    """The rows drawn with replacement are kept at their first occurrence, in drawing order
    (what makes each kept row uniform over the rows not yet out), by the slots' minimum
    position, or by sorting where positions outgrow the slots; the slots are free after."""
    n_rows = 2_000
    perm = LazyPermutation(n_rows, np.random.default_rng(0))
    candidates = np.random.default_rng(3).integers(0, n_rows, size=n_candidates)
    seen: set[int] = set()
    expected = [c for c in candidates.tolist() if not (c in seen or seen.add(c))]
    kept = perm._first_occurrences(candidates)
    assert kept.tolist() == expected
    assert np.all(perm._slot == np.iinfo(np.uint16).max)
    perm.start()
    rows = perm.next(n_rows // 2)  # the with-replacement path to its limit
    assert len(np.unique(rows)) == n_rows // 2


def test_lazy_permutation_same_seed_same_rows():
    a = LazyPermutation(10_000, np.random.default_rng(5))
    b = LazyPermutation(10_000, np.random.default_rng(5))
    for perm in (a, b):
        perm.start()
    assert np.array_equal(
        np.concatenate([a.next(300) for _ in range(3)]),
        np.concatenate([b.next(300) for _ in range(3)]),
    )
