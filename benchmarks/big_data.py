"""Data beyond memory: SGHMC defaults on a logistic regression read from a zarr store or
from Parquet files.

Writes a zarr store of ``N`` rows (``X``: N x d float32, iid standard normal; ``y``: int8,
Bernoulli-logit with coefficients ``beta_k = 0.5 (-1)^k / sqrt(k + 1)``), computes an
independent reference (the Laplace fit at the full-data MAP, by numpy Newton steps streamed
over the store, outside the package), then samples in a fresh process that reads the store
only through ``pmbd.Data``, and reports:

* set-up time (the step's MAP search, Laplace fit, census) and sampling time;
* data passes: rows read by full-data passes (``RowSource.rows_streamed``) and by the
  minibatches (``rows_touched``), over N;
* peak resident memory of the sampling process (``ru_maxrss``) beside the data's size;
* accuracy against the reference: max |mean - ref| / ref sd, sd ratios, min bulk ESS.

At these N the posterior is Gaussian to O(1/sqrt(N)) (skewness of a logistic posterior),
so the Laplace fit is an accurate reference here; this benchmark tests the data path, not
the sampler (the statistical tests do that).

Usage::

    python benchmarks/big_data.py --rows 10_000_000 --dim 20 --store /tmp/pmb_store
    python benchmarks/big_data.py --rows 100_000_000 --dim 10 --store /tmp/pmb_store
    python benchmarks/big_data.py --rows 10_000_000 --store-chunk 500_000 --zstd

``--store-chunk`` sets the rows per zarr chunk (default 65,536) and ``--zstd`` compresses
the chunks with zstd (zarr's default codec; default: uncompressed), the layout a user's own
store may have (issue 27); the results file's name then says so
(``big_data_n1e7_c500000_zstd``).

``--format parquet`` writes the same rows (the same generator, so the same data and the
same reference) to ``--files`` Parquet files (pyarrow's default codec, snappy) with row
groups of ``--store-chunk`` rows, columns ``x0 .. x{d-1}`` and ``y``, and samples with
``pmbd.Data("X", directory, columns=[...])`` (``big_data_n1e7_parquet``). The reference is
then read with pyarrow, row group by row group.

Results go to ``benchmarks/results/big_data_n1e7.{md,json}`` (``n1e8`` for 1e8 rows), with
the commit they were run at.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
CHUNK_ROWS = 65_536
WRITE_ROWS = 2**20


def true_beta(dim: int) -> np.ndarray:
    k = np.arange(dim)
    return 0.5 * (-1.0) ** k / np.sqrt(k + 1)


def write_store(
    path: Path, n_rows: int, dim: int, seed: int, chunk_rows: int = CHUNK_ROWS, zstd=False
) -> float:
    """Write X and y to ``path`` (zarr v3, chunks of ``chunk_rows`` rows, uncompressed or
    zstd-compressed)."""
    import zarr

    compressors = "auto" if zstd else None  # zarr v3's default codec is zstd
    start = time.perf_counter()
    path.mkdir(parents=True, exist_ok=True)
    X = zarr.create_array(
        str(path / "X.zarr"),
        shape=(n_rows, dim),
        chunks=(chunk_rows, dim),
        dtype="float32",
        compressors=compressors,
        overwrite=True,
    )
    y = zarr.create_array(
        str(path / "y.zarr"),
        shape=(n_rows,),
        chunks=(chunk_rows,),
        dtype="int8",
        compressors=compressors,
        overwrite=True,
    )
    beta = true_beta(dim)
    rng = np.random.default_rng(seed)
    for s in range(0, n_rows, WRITE_ROWS):
        e = min(s + WRITE_ROWS, n_rows)
        x = rng.standard_normal((e - s, dim), dtype=np.float32)
        X[s:e] = x
        y[s:e] = (rng.random(e - s) < 1 / (1 + np.exp(-(x @ beta)))).astype(np.int8)
    meta = {"n_rows": n_rows, "dim": dim, "seed": seed, "chunk_rows": chunk_rows, "zstd": zstd}
    (path / "meta.json").write_text(json.dumps(meta))
    return time.perf_counter() - start


def write_parquet(
    path: Path, n_rows: int, dim: int, seed: int, chunk_rows: int, files: int
) -> float:
    """Write the rows :func:`write_store` writes (the same generator) to ``files`` Parquet
    files in ``path / "parquet"``, row groups of ``chunk_rows`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = time.perf_counter()
    folder = path / "parquet"
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-n_rows // files)
    beta = true_beta(dim)
    rng = np.random.default_rng(seed)
    writer, written = None, 0
    for s in range(0, n_rows, WRITE_ROWS):
        e = min(s + WRITE_ROWS, n_rows)
        x = rng.standard_normal((e - s, dim), dtype=np.float32)
        y = (rng.random(e - s) < 1 / (1 + np.exp(-(x @ beta)))).astype(np.int8)
        piece = pa.table({**{f"x{k}": x[:, k] for k in range(dim)}, "y": y})
        while piece.num_rows:
            if writer is None or written == per_file:
                if writer is not None:
                    writer.close()
                name = folder / f"part-{s // per_file + (written == per_file):03d}.parquet"
                writer, written = pq.ParquetWriter(str(name), piece.schema), 0
            take = min(piece.num_rows, per_file - written)
            writer.write_table(piece.slice(0, take), row_group_size=chunk_rows)
            piece, written = piece.slice(take), written + take
    writer.close()
    meta = {"n_rows": n_rows, "dim": dim, "seed": seed, "chunk_rows": chunk_rows, "files": files}
    (path / "meta.json").write_text(json.dumps(meta))
    return time.perf_counter() - start


def _zarr_pieces(path: Path):
    """(x, y) pieces of the zarr store, in order."""
    import zarr

    X, y = zarr.open_array(str(path / "X.zarr")), zarr.open_array(str(path / "y.zarr"))
    for s in range(0, X.shape[0], 8 * CHUNK_ROWS):
        yield np.asarray(X[s : s + 8 * CHUNK_ROWS]), np.asarray(y[s : s + 8 * CHUNK_ROWS])


def _parquet_pieces(path: Path, dim: int):
    """(x, y) row groups of the Parquet files, in order, read with pyarrow."""
    import pyarrow.parquet as pq

    for file in sorted((path / "parquet").glob("*.parquet")):
        handle = pq.ParquetFile(str(file))
        for group in range(handle.num_row_groups):
            table = handle.read_row_group(group)
            x = np.column_stack([table.column(f"x{k}").to_numpy() for k in range(dim)])
            yield x, table.column("y").to_numpy()


def reference(path: Path, dim: int, fmt: str = "zarr") -> dict:
    """Laplace fit at the full-data MAP (prior N(0, 1)): Newton steps, each one streamed
    pass over the store (or the Parquet files) with numpy in float64."""
    beta = np.zeros(dim)
    for _ in range(30):
        grad, hess = -beta.copy(), -np.eye(dim)
        pieces = _parquet_pieces(path, dim) if fmt == "parquet" else _zarr_pieces(path)
        for x, y in pieces:
            x = x.astype(np.float64)
            p = 1 / (1 + np.exp(-(x @ beta)))
            grad += x.T @ (y - p)
            hess -= (x * (p * (1 - p))[:, None]).T @ x
        step = np.linalg.solve(-hess, grad)
        beta = beta + step
        if float(grad @ step) < 1e-10:
            break
    cov = np.linalg.inv(-hess)
    return {"mean": beta.tolist(), "sd": np.sqrt(np.diag(cov)).tolist()}


def sample(
    path: Path, dim: int, draws: int, tune: int, chains: int, seed: int, fmt: str = "zarr"
) -> dict:
    """The measured run (a fresh process): pmbd.Data on the stores, SGHMC defaults."""
    import arviz as az
    import pymc as pm

    import pymc_bigdata as pmbd

    start = time.perf_counter()
    with pm.Model():
        if fmt == "parquet":
            X = pmbd.Data("X", path / "parquet", columns=[f"x{k}" for k in range(dim)])
            y = pmbd.Data("y", path / "parquet")
        else:
            X = pmbd.Data("X", path / "X.zarr")
            y = pmbd.Data("y", path / "y.zarr")
        beta = pm.Normal("beta", 0.0, 1.0, shape=dim)
        pm.Bernoulli("obs", logit_p=X @ beta, observed=y)
        step = pmbd.SGHMC()
        setup_s = time.perf_counter() - start
        streamed_setup = step.layer.rows.rows_streamed
        start = time.perf_counter()
        idata = pm.sample(
            step=step,
            draws=draws,
            tune=tune,
            chains=chains,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
        sample_s = time.perf_counter() - start
    n_rows = step.layer.n_rows
    draws_b = idata.posterior["beta"].values.reshape(-1, dim)
    ess = az.ess(idata.posterior["beta"]).values
    touched = float(idata.sample_stats["rows_touched"].values.sum())
    return {
        "setup_s": setup_s,
        "sample_s": sample_s,
        "setup_passes": streamed_setup / n_rows,
        "streamed_passes": step.layer.rows.rows_streamed / n_rows,
        "minibatch_passes": touched / n_rows,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "data_bytes": step.layer.rows.nbytes,
        "gather": step.layer.rows.gather,
        "mean": draws_b.mean(axis=0).tolist(),
        "sd": draws_b.std(axis=0, ddof=1).tolist(),
        "min_ess": float(ess.min()),
        "divergences": int(idata.sample_stats["diverging"].values.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--store", type=Path, default=Path("/tmp/pmb_store"))
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--phase", choices=["all", "sample"], default="all")
    parser.add_argument("--store-chunk", type=lambda s: int(float(s)), default=CHUNK_ROWS)
    parser.add_argument("--zstd", action="store_true")
    parser.add_argument("--format", choices=["zarr", "parquet"], default="zarr")
    parser.add_argument("--files", type=int, default=10, help="Parquet files (--format parquet)")
    parser.add_argument(
        "--render", action="store_true", help="only re-write the .md from the stored .json"
    )
    args = parser.parse_args()
    tag = f"n1e{round(math.log10(args.rows))}"
    layout = "" if args.store_chunk == CHUNK_ROWS else f"_c{args.store_chunk}"
    layout += "_zstd" if args.zstd else ""
    layout += "_parquet" if args.format == "parquet" else ""
    tag += layout
    if args.render:
        write_results(tag, json.loads((RESULTS / f"big_data_{tag}.json").read_text()))
        return
    store = args.store / f"n{args.rows}_d{args.dim}{layout}"
    if args.phase == "sample":
        out = sample(store, args.dim, args.draws, args.tune, args.chains, args.seed, args.format)
        print("RESULT " + json.dumps(out))
        return
    meta = store / "meta.json"
    write_s = None
    if not meta.exists() or json.loads(meta.read_text())["n_rows"] != args.rows:
        if args.format == "parquet":
            write_s = write_parquet(
                store, args.rows, args.dim, args.seed, args.store_chunk, args.files
            )
        else:
            write_s = write_store(
                store, args.rows, args.dim, args.seed, args.store_chunk, args.zstd
            )
    ref = reference(store, args.dim, args.format)
    cmd = [sys.executable, __file__, "--phase", "sample", *sys.argv[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"sampling failed:\n{proc.stdout}\n{proc.stderr}")
    run = json.loads(lines[-1][len("RESULT ") :])
    mean, sd = np.array(ref["mean"]), np.array(ref["sd"])
    err_sd = np.abs(np.array(run["mean"]) - mean) / sd
    ratio = np.array(run["sd"]) / sd
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result = {
        "commit": commit,
        "n_rows": args.rows,
        "dim": args.dim,
        "store_chunk": args.store_chunk,
        "zstd": args.zstd,
        "format": args.format,
        "files": args.files if args.format == "parquet" else None,
        "write_s": write_s,
        "draws": args.draws,
        "tune": args.tune,
        "chains": args.chains,
        **run,
        "max_err_sd": float(err_sd.max()),
        "sd_ratio_min": float(ratio.min()),
        "sd_ratio_max": float(ratio.max()),
        "reference": ref,
    }
    write_results(tag, result)


def write_results(tag: str, result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"big_data_{tag}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"big_data_{tag}.md").write_text(report(result))
    print(report(result))


def report(r: dict) -> str:
    gb = 1e9
    n, d, commit = r["n_rows"], r["dim"], r["commit"]
    source = "Parquet files" if r.get("format") == "parquet" else "a zarr store"
    return f"""# Big data from {source}: N = {n:,}, d = {d} (commit {commit})

`python benchmarks/big_data.py --rows {r["n_rows"]} --dim {r["dim"]}{_layout_args(r)}`; SGHMC
defaults through `pm.sample` ({r["tune"]} tune + {r["draws"]} draws, {r["chains"]} chains,
cores=1), X float32 and y int8 in {_layout(r)}, read only through `pmbd.Data`
({r["gather"]} gathers), on this machine (2 cores).

| quantity | value |
|---|---|
| data on disk (X and y) | {r["data_bytes"] / gb:.2f} GB |
| peak resident memory of the sampling process | {r["peak_rss_bytes"] / gb:.2f} GB |
| set-up (MAP search, Laplace fit, census) | {r["setup_s"]:.0f} s |
| sampling | {r["sample_s"]:.0f} s |
| set-up + sampling | {r["setup_s"] + r["sample_s"]:.0f} s |
| full-data passes (set-up / all) | {r["setup_passes"]:.1f} / {r["streamed_passes"]:.1f} |
| rows read by minibatches, in data passes | {r["minibatch_passes"]:.2f} |
| max abs(mean - ref) / ref sd | {r["max_err_sd"]:.3f} |
| sd ratio range | [{r["sd_ratio_min"]:.3f}, {r["sd_ratio_max"]:.3f}] |
| min bulk ESS | {r["min_ess"]:.0f} |
| divergences | {r["divergences"]} |

Reference: Laplace fit at the full-data MAP by numpy Newton steps over the data, read with
zarr or pyarrow directly (not the package's code), computed just before the measured run:
the data were then in the operating system's page cache (this machine has 24 GB), so the
times are for reads from the page cache, not from a cold disk. {_written(r)}
"""


def _layout_args(r: dict) -> str:
    chunk = r.get("store_chunk", CHUNK_ROWS)
    fmt = f" --format parquet --files {r['files']}" if r.get("format") == "parquet" else ""
    return (
        (f" --store-chunk {chunk}" if chunk != CHUNK_ROWS else "")
        + (" --zstd" if r.get("zstd") else "")
        + fmt
    )


def _layout(r: dict) -> str:
    if r.get("format") == "parquet":
        return (
            f"{r['files']} Parquet files (snappy) with row groups of "
            f"{r.get('store_chunk', CHUNK_ROWS):,} rows"
        )
    codec = "zstd-compressed" if r.get("zstd") else "uncompressed"
    return f"{codec} zarr chunks of {r.get('store_chunk', CHUNK_ROWS):,} rows"


def _written(r: dict) -> str:
    if r["write_s"] is None:
        return "The store had been written by an earlier call of this script."
    return f"Writing the store took {r['write_s']:.0f} s (not part of the run)."


if __name__ == "__main__":
    main()
