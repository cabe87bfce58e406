"""Chains of ``pm.sample`` as tasks on a Dask cluster, draw for draw equal to ``cores=1``.

:func:`sample_dask` calls :func:`pymc.sample` itself with ``cores=1``, so PyMC derives the
per-chain generators (``get_random_generator(random_seed).spawn(chains)``), initial points,
step assignment (NUTS initialisation included), trace set-up, sample statistics, convergence
checks and the returned ``DataTree`` exactly as it does on one core. Only the sequential
chain loop (``pymc.sampling.mcmc._sample_many``) is routed to the cluster, for the calling
thread and for the duration of the call: each chain runs on a worker as PyMC's own
single-chain loop (``_iter_sample``) on a fresh copy of the step, pickled with cloudpickle as
PyMC's multiprocess sampler does, with that chain's generator state and initial point. The
recorded draws and statistics come back into PyMC's trace objects, and ``pm.sample``
finishes as usual.

A chain that raises, or whose worker leaves the cluster while the chain runs (Dask would
silently run it again elsewhere), fails the whole call with :class:`ChainFailedError`;
partial chains are never returned.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np
import pymc as pm
import pymc.sampling.mcmc as _mcmc
from pymc.backends.ndarray import NDArray
from pymc.stats.convergence import log_warning_stats
from pymc.util import get_state_from_generator, random_generator_from_state

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ChainFailedError", "sample_dask"]

_log = logging.getLogger(__name__)

#: how often (seconds) a running chain asks the scheduler whether the run was aborted
ABORT_POLL_SECONDS = 1.0
#: how often (seconds) the caller checks that the workers running its chains are still there
LOST_WORKER_POLL_SECONDS = 1.0

#: pm.sample arguments that cannot work when chains run as remote tasks
_REFUSED = {
    "cores": "each chain is one Dask task; the cluster's workers set the parallelism",
    "callback": "a per-draw callback would run on the workers, away from the caller",
    "trace": "the chains record in memory on the workers (PyMC's default NDArray traces)",
    "mp_ctx": "the chains run in the Dask workers' processes, not in multiprocessing ones",
}


class ChainFailedError(RuntimeError):
    """A chain of :func:`sample_dask` raised, or its worker was lost while it ran.

    Parameters
    ----------
    message
        What happened and what to do.
    chain
        The failed chain's number (``0 .. chains - 1``).
    worker
        The worker's address, where known.
    """

    def __init__(self, message: str, chain: int | None = None, worker: str | None = None):
        super().__init__(message)
        self.chain = chain
        self.worker = worker

    def __reduce__(self):
        return (type(self), (self.args[0], self.chain, self.worker))


def sample_dask(
    client: Client | None = None,
    *,
    draws: int = 1000,
    tune: int | None = None,
    chains: int = 4,
    random_seed: Any = None,
    step: Any = None,
    model: pm.Model | None = None,
    **sample_kwargs: Any,
):
    """Run ``pm.sample``'s chains as tasks on a Dask cluster.

    The result equals ``pm.sample(draws=draws, tune=tune, chains=chains, cores=1,
    random_seed=random_seed, step=step, model=model, **sample_kwargs)`` draw for draw
    (posterior, sample statistics and every other group) whenever that run is reproducible
    (an integer or array ``random_seed``), because PyMC itself prepares the chains and
    assembles the result; only where each chain runs differs. Each chain is one task; a
    worker runs one chain per thread, so ``threads_per_worker=1`` workers give one chain per
    process.

    Parameters
    ----------
    client
        A connected ``distributed.Client``; ``None`` uses the default client
        (``distributed.get_client()``).
    draws
        Draws kept per chain, as in :func:`pymc.sample`.
    tune
        Tuning draws per chain; ``None`` lets the step choose, as in :func:`pymc.sample`
        (1000 for PyMC's and this package's steps).
    chains
        Number of chains, 4 by default whatever the cluster's size, so that a seed means the
        same draws on any cluster.
    random_seed
        As in :func:`pymc.sample`: an integer (or array of them) makes the run reproducible
        and equal to ``pm.sample(cores=1)`` with that seed.
    step
        The step method(s), as in :func:`pymc.sample`; ``None`` assigns them (NUTS for a
        continuous model).
    model
        The model; ``None`` takes it from the ``with pm.Model():`` context.
    **sample_kwargs
        Any other :func:`pymc.sample` argument (``initvals``, ``init``, ``var_names``,
        ``idata_kwargs``, ``compile_kwargs``, ``discard_tuned_samples``,
        ``compute_convergence_checks``, step arguments such as ``target_accept``...), except
        ``cores``, ``callback``, ``trace`` and ``mp_ctx``. ``nuts_sampler`` may only be
        ``"pymc"`` (the default here). ``progressbar`` defaults to ``False``; completed
        chains are logged at INFO level on the ``pymc_bigdata.distributed`` logger.

    Returns
    -------
    DataTree
        What ``pm.sample`` returns, with chains ``0 .. chains - 1``.

    Raises
    ------
    ChainFailedError
        A chain raised on its worker (the original exception is chained), or its worker left
        the cluster while it ran; the other chains are cancelled and nothing is returned.
    TypeError, ValueError
        A bad argument (``client`` not a ``Client``, ``chains < 1``, a refused argument...).
    RuntimeError
        ``client=None`` and there is no default client.
    NotImplementedError
        The step is a population sampler (``DEMetropolis``), whose chains need each other.

    Notes
    -----
    The model and step are shipped to the workers with cloudpickle: in-memory data travels
    with them, and data read from files must be at the same path on every worker. Workers
    need the same versions of PyMC, PyTensor and pymc-bigdata as the caller; they compile the
    model's functions on first use (PyTensor's on-disk cache makes later compiles on the same
    machine fast).
    """
    client = _resolve_client(client)
    _check_count("chains", chains, minimum=1)
    _check_count("draws", draws, minimum=0)
    if tune is not None:
        _check_count("tune", tune, minimum=0)
    if tune is not None and draws + tune < 1:
        raise ValueError("draws + tune must be at least 1.")
    for name, why in _REFUSED.items():
        if sample_kwargs.get(name) is not None:
            raise ValueError(f"sample_dask does not take {name}=: {why}.")
    for name in _REFUSED:
        sample_kwargs.pop(name, None)
    nuts_sampler = sample_kwargs.pop("nuts_sampler", None) or "pymc"
    if nuts_sampler != "pymc":
        raise ValueError(
            f"sample_dask runs PyMC's own samplers only (nuts_sampler='pymc'), got "
            f"nuts_sampler={nuts_sampler!r}; external NUTS samplers run their chains themselves."
        )
    sample_kwargs.setdefault("progressbar", False)

    run = _ClusterRun(client=client, thread=threading.get_ident())
    with _chains_on_cluster(run), _renamed_sequential_message(run, chains):
        return pm.sample(
            draws=draws,
            tune=tune,
            chains=chains,
            cores=1,
            random_seed=random_seed,
            step=step,
            model=model,
            nuts_sampler="pymc",
            **sample_kwargs,
        )


# ---------------------------------------------------------------------------------- arguments
def _resolve_client(client: Any) -> Client:
    try:
        import distributed
    except ImportError as err:  # pragma: no cover - the optional dependency is missing
        raise ImportError(
            "sample_dask needs dask.distributed: pip install 'pymc-bigdata[dask]'."
        ) from err
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError as err:
            raise RuntimeError(
                "sample_dask(client=None) found no default Dask client. Create one first, "
                "e.g. distributed.Client(distributed.LocalCluster()) or "
                "distributed.Client('tcp://scheduler-host:8786'), or pass client=."
            ) from err
    if not isinstance(client, distributed.Client):
        raise TypeError(
            f"client must be a distributed.Client, got {type(client).__name__}; for a "
            "scheduler address use client=distributed.Client('tcp://host:8786')."
        )
    if client.status != "running":
        raise ValueError(f"The Dask client is not running (status {client.status!r}).")
    return client


def _check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")


# ---------------------------------------------------------------------------------- routing
@dataclass
class _ClusterRun:
    """One sample_dask call: where its chains go, and what came back."""

    client: Client
    thread: int
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


_CURRENT_RUN: contextvars.ContextVar[_ClusterRun | None] = contextvars.ContextVar(
    "pymc_bigdata_cluster_run", default=None
)
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = 0
_ORIGINALS: dict[str, Any] = {}


def _sample_many_hook(**kwargs: Any) -> None:
    """Stands in for ``pymc.sampling.mcmc._sample_many`` while a sample_dask call is active:
    that call's chains go to the cluster, every other caller's stay sequential."""
    run = _CURRENT_RUN.get()
    if run is None:
        return _ORIGINALS["_sample_many"](**kwargs)
    return _run_chains(run, **kwargs)


def _sample_population_hook(**kwargs: Any) -> None:
    if _CURRENT_RUN.get() is None:
        return _ORIGINALS["_sample_population"](**kwargs)
    raise NotImplementedError(
        "sample_dask cannot run population step methods (DEMetropolis): their chains "
        "update together. Use pm.sample for them."
    )


_HOOKS = {"_sample_many": _sample_many_hook, "_sample_population": _sample_population_hook}


@contextlib.contextmanager
def _chains_on_cluster(run: _ClusterRun) -> Iterator[None]:
    """Route pm.sample's sequential chain loop to the cluster, for this thread only."""
    global _PATCH_USERS
    with _PATCH_LOCK:
        if _PATCH_USERS == 0:
            for name, hook in _HOOKS.items():
                original = getattr(_mcmc, name, None)
                if not callable(original):
                    raise RuntimeError(
                        f"This PyMC ({pm.__version__}) has no pymc.sampling.mcmc.{name}; "
                        "sample_dask supports PyMC 6.4's sampling loop."
                    )
                _ORIGINALS[name] = original
                setattr(_mcmc, name, hook)
        _PATCH_USERS += 1
    token = _CURRENT_RUN.set(run)
    try:
        yield
    finally:
        _CURRENT_RUN.reset(token)
        with _PATCH_LOCK:
            _PATCH_USERS -= 1
            if _PATCH_USERS == 0:
                for name in _HOOKS:
                    setattr(_mcmc, name, _ORIGINALS.pop(name))


class _SequentialMessage(logging.Filter):
    """pm.sample logs "Sequential sampling (n chains in 1 job)"; say where they really run."""

    def __init__(self, run: _ClusterRun, chains: int):
        super().__init__()
        self.run, self.chains = run, chains

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread == self.run.thread and str(record.msg).startswith("Sequential sampling"):
            workers = len(self.run.client.scheduler_info().get("workers", {}))
            record.msg = "Dask sampling (%d chains as tasks on %d workers)"
            record.args = (self.chains, workers)
        return True


@contextlib.contextmanager
def _renamed_sequential_message(run: _ClusterRun, chains: int) -> Iterator[None]:
    logger = logging.getLogger(_mcmc.__name__)
    message = _SequentialMessage(run, chains)
    logger.addFilter(message)
    try:
        yield
    finally:
        logger.removeFilter(message)


# ---------------------------------------------------------------------------------- client side
def _run_chains(
    run: _ClusterRun,
    *,
    draws: int,
    chains: int,
    traces: Sequence[Any],
    start: Sequence[dict[str, np.ndarray]],
    rngs: Sequence[np.random.Generator],
    step: Any,
    tune: int = 0,
    **_: Any,
) -> None:
    """What ``_sample_many`` does, one task per chain: fill ``traces`` with every chain's
    ``draws`` (tuning included) draws, or raise :class:`ChainFailedError`."""
    from distributed import Event

    if not all(type(trace) is NDArray for trace in traces):
        raise ValueError("sample_dask records into PyMC's default in-memory traces only.")
    client = run.client
    # the chain function's inputs, taken before anything runs: the step in its initial
    # state (what _sample_many restores before each chain) and an empty trace to record into
    first = traces[0]
    empty = NDArray(
        name=first.name,
        model=first.model,
        vars=first.vars,
        fn=first.fn,
        var_shapes=first.var_shapes,
        var_dtypes=first.var_dtypes,
    )
    payload = cloudpickle.dumps((step, empty), protocol=-1)
    watch = _LostChainWatch(client, run.run_id)
    payload_future = _scatter_payload(client, payload, chains)
    futures = {
        client.submit(
            _chain_task,
            payload_future,
            run_id=run.run_id,
            chain=i,
            rng_state=get_state_from_generator(rngs[i]),
            start=start[i],
            draws=draws,
            tune=tune,
            key=_chain_key(run.run_id, i),
            pure=False,
        ): i
        for i in range(chains)
    }
    t0 = time.perf_counter()
    results: dict[int, dict[str, Any]] = {}
    pending = dict(futures)
    failed = True
    try:
        next_check = time.monotonic() + LOST_WORKER_POLL_SECONDS
        while pending:
            done = [future for future in pending if future.done()]
            for future in done:
                i = pending.pop(future)
                results[i] = watch.collect(future, i, draws)
                future.release()  # its worker may go now without the chain being run again
                _log.info(
                    "chain %d finished on %s in %.1f s (%d of %d chains done, %.1f s elapsed)",
                    i,
                    results[i]["worker"],
                    results[i]["seconds"],
                    len(results),
                    chains,
                    time.perf_counter() - t0,
                )
            if pending and time.monotonic() >= next_check:
                watch.check(set(pending.values()))
                next_check = time.monotonic() + LOST_WORKER_POLL_SECONDS
            elif pending and not done:
                time.sleep(0.05)
        failed = False
    except BaseException:
        with contextlib.suppress(Exception):
            Event(_event_name(run.run_id, "abort"), client=client).set()
        with contextlib.suppress(Exception):
            client.cancel(list(futures), force=True)
        raise
    finally:
        with contextlib.suppress(Exception):
            client.cancel([payload_future])
        watch.clear_events(chains, results, keep_abort=failed)
    for i in range(chains):
        trace, result = traces[i], results[i]
        trace.samples = result["samples"]
        trace._stats = result["stats"]
        trace.draw_idx = result["n_draws"]
    _replay_warnings([results[i] for i in range(chains)])


class _LostChainWatch:
    """Notices a chain whose worker left the cluster while the chain ran.

    Dask would run such a chain again from its start on another worker; this fails the run
    instead. Each chain, as it starts, sets an event named after its worker; the watch pins a
    chain to the worker it started on (seen in ``client.processing()``) and fails the run
    when that worker is no longer in the cluster. A re-run that starts before the watch
    notices fails by itself (:func:`_chain_task`).
    """

    def __init__(self, client: Client, run_id: str):
        self.client = client
        self.run_id = run_id
        self.workers_at_start = set(client.scheduler_info().get("workers", {}))
        self.pinned: dict[int, str] = {}

    def check(self, pending: set[int]) -> None:
        """Raise :class:`ChainFailedError` if a pending chain's worker left the cluster."""
        from distributed import Event

        processing = self.client.processing()
        for worker, keys in processing.items():
            for key in keys:
                i = _chain_of_key(self.run_id, key)
                if i is None or i not in pending or i in self.pinned:
                    continue
                if Event(_ran_on_name(self.run_id, i, worker), client=self.client).is_set():
                    self.pinned[i] = worker
        for i in sorted(pending):
            worker = self.pinned.get(i)
            if worker is not None and worker not in processing:
                raise ChainFailedError(
                    f"Chain {i} was lost: worker {worker}, which was running it, left the Dask "
                    "cluster (it crashed, ran out of memory or was shut down). No draws are "
                    "returned; run sample_dask again.",
                    chain=i,
                    worker=worker,
                )

    def collect(self, future: Any, chain: int, draws: int) -> dict[str, Any]:
        """The finished chain's result, or :class:`ChainFailedError` saying why there is none."""
        try:
            result = future.result()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            workers = set(self.client.scheduler_info().get("workers", {}))
            left = sorted(self.workers_at_start - workers)
            note = f" Workers that left the cluster during the run: {left}." if left else ""
            if isinstance(err, ChainFailedError):  # raised by a re-run of a lost chain
                worker = left[0] if len(left) == 1 else None
                raise ChainFailedError(f"{err}{note}", chain=chain, worker=worker) from None
            raise ChainFailedError(
                f"Chain {chain} failed on the Dask cluster: {type(err).__name__}: {err}. "
                f"No draws are returned.{note}",
                chain=chain,
                worker=self.pinned.get(chain),
            ) from err
        if result["n_draws"] != draws:
            raise ChainFailedError(
                f"Chain {chain} came back with {result['n_draws']} of {draws} draws from "
                f"worker {result['worker']}. No draws are returned.",
                chain=chain,
                worker=result["worker"],
            )
        return result

    def clear_events(
        self, chains: int, results: dict[int, dict[str, Any]], keep_abort: bool
    ) -> None:
        """Free the run's events on the scheduler; after a failure, the abort event stays set
        for the chains still running (cancelling a Dask task does not stop its thread)."""
        from distributed import Event

        names = [] if keep_abort else [_event_name(self.run_id, "abort")]
        names += [_started_name(self.run_id, i) for i in range(chains)]
        names += [_ran_on_name(self.run_id, i, w) for i, w in self.pinned.items()]
        names += [_ran_on_name(self.run_id, i, r["worker"]) for i, r in results.items()]
        for name in set(names):
            with contextlib.suppress(Exception):
                Event(name, client=self.client).clear()


def _event_name(run_id: str, what: str) -> str:
    return f"pymc-bigdata-{run_id}-{what}"


def _started_name(run_id: str, chain: int) -> str:
    return _event_name(run_id, f"chain-{chain}-started")


def _ran_on_name(run_id: str, chain: int, worker: str) -> str:
    return _event_name(run_id, f"chain-{chain}-ran-on-{worker}")


def _chain_key(run_id: str, chain: int) -> str:
    return f"pymc-bigdata-chain-{chain}-{run_id}"


def _chain_of_key(run_id: str, key: Any) -> int | None:
    prefix, suffix = "pymc-bigdata-chain-", f"-{run_id}"
    key = str(key)
    if key.startswith(prefix) and key.endswith(suffix):
        return int(key[len(prefix) : -len(suffix)])
    return None


def _scatter_payload(client: Client, payload: bytes, chains: int) -> Any:
    """Put the pickled step on as many workers as there are chains (up to all of them).

    With one copy, Dask would run every chain on the worker that holds it (data locality);
    with a copy on ``k`` workers it spreads the chains over them. Any other worker that gets
    a chain fetches the copy from a peer.
    """
    info = client.scheduler_info(n_workers=-1).get("workers", {})
    # the least busy workers first; chains beyond their count fetch the payload from a peer
    busy = client.processing()
    ranked = sorted(info, key=lambda w: (len(busy.get(w, ())), w))[: max(1, chains)]
    return client.scatter(payload, hash=False, workers=ranked or None, broadcast=bool(ranked))


def _replay_warnings(results: list[dict[str, Any]]) -> None:
    """Emit in the caller what the chains warned and logged on their workers, in chain
    order, each Python warning once (as the default warning filter shows it on one core)."""
    seen: set[tuple] = set()
    for result in results:
        for key in result["warnings"]:
            if key not in seen:
                seen.add(key)
                category, message, filename, lineno = key
                warnings.warn_explicit(message, category, filename, lineno)
        for stats in result["stats"] or []:
            for warning in stats.get("warning", ()):
                if warning is not None and warning != 0:
                    log_warning_stats([{"warning": warning}])


# ---------------------------------------------------------------------------------- worker side
def _chain_task(
    payload: bytes,
    *,
    run_id: str,
    chain: int,
    rng_state: Any,
    start: dict[str, np.ndarray],
    draws: int,
    tune: int,
) -> dict[str, Any]:
    """Run chain ``chain`` on a worker as ``pm.sample(cores=1)`` runs it (``_iter_sample``)."""
    from distributed import Event, get_worker

    worker = get_worker().address
    started = Event(_started_name(run_id, chain))
    if started.is_set():
        # Dask re-runs the tasks of a worker that left; a chain is never silently restarted
        raise ChainFailedError(
            f"Chain {chain} was lost: the worker that was running it left the Dask cluster "
            "(it crashed, ran out of memory or was shut down). No draws are returned; run "
            "sample_dask again.",
            chain=chain,
        )
    started.set()
    Event(_ran_on_name(run_id, chain, worker)).set()
    abort = Event(_event_name(run_id, "abort"))
    t0 = time.perf_counter()
    step, trace = cloudpickle.loads(payload)
    trace.setup(draws, chain, step.stats_dtypes)
    rng = random_generator_from_state(rng_state)
    last_poll = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _stats in _mcmc._iter_sample(
            draws=draws, step=step, start=start, trace=trace, chain=chain, tune=tune, rng=rng
        ):
            if time.monotonic() - last_poll > ABORT_POLL_SECONDS:
                last_poll = time.monotonic()
                if abort.is_set():  # another chain failed: stop quietly, the caller raises
                    break
    seen: set[tuple] = set()
    replay = []
    for w in caught:
        key = (w.category, str(w.message), w.filename, w.lineno)
        if key not in seen:
            seen.add(key)
            replay.append(key)
    return {
        "samples": trace.samples,
        "stats": trace._stats,
        "n_draws": len(trace),
        "worker": worker,
        "seconds": time.perf_counter() - t0,
        "warnings": replay,
    }
