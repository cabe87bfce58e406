"""The caller's watch over a :func:`~pymc_bigdata.sample_dask` run's chains.

:class:`LostChainWatch` notices a chain whose worker left the cluster while it ran, turns a
finished chain's future into its result (or the :class:`ChainFailedError` saying why there
is none), and frees the run's scheduler events afterwards.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from pymc_bigdata.distributed_protocol import (
    ChainFailedError,
    chain_of_key,
    event_name,
    ran_on_name,
    started_name,
)

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["LostChainWatch"]


class LostChainWatch:
    """Notices a chain whose worker left the cluster while the chain ran.

    Dask would run such a chain again from its start on another worker; this fails the run
    instead. Each chain, as it starts, sets an event named after its worker; the watch pins a
    chain to the worker it started on (seen in ``client.processing()``) and fails the run
    when that worker is no longer in the cluster. A re-run that starts before the watch
    notices fails by itself (:func:`~pymc_bigdata.distributed_worker.chain_task`).

    Parameters
    ----------
    client
        The run's client.
    run_id
        The run's id.
    """

    def __init__(self, client: Client, run_id: str):
        self.client = client
        self.run_id = run_id
        self.workers_at_start = set(client.scheduler_info().get("workers", {}))
        self.pinned: dict[int, str] = {}

    def check(self, pending: set[int]) -> None:
        """Raise :class:`ChainFailedError` if a pending chain's worker left the cluster."""
        processing = self.client.processing()
        self._pin(processing, pending)
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

    def _pin(self, processing: dict[str, Any], pending: set[int]) -> None:
        """Pin each pending chain seen processing to its worker once it started there."""
        from distributed import Event

        for worker, keys in processing.items():
            for key in keys:
                i = chain_of_key(self.run_id, key)
                if i is None or i not in pending or i in self.pinned:
                    continue
                if Event(ran_on_name(self.run_id, i, worker), client=self.client).is_set():
                    self.pinned[i] = worker

    def collect(self, future: Any, chain: int, draws: int) -> dict[str, Any]:
        """The finished chain's result, or :class:`ChainFailedError` saying why there is none."""
        try:
            result = future.result()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            failure = self._failure(err, chain)
            if isinstance(err, ChainFailedError):  # raised by a re-run of a lost chain
                raise failure from None
            raise failure from err
        if result["n_draws"] != draws:
            raise ChainFailedError(
                f"Chain {chain} came back with {result['n_draws']} of {draws} draws from "
                f"worker {result['worker']}. No draws are returned.",
                chain=chain,
                worker=result["worker"],
            )
        return result

    def _failure(self, err: BaseException, chain: int) -> ChainFailedError:
        """The error a chain whose task raised ``err`` fails the run with."""
        workers = set(self.client.scheduler_info().get("workers", {}))
        left = sorted(self.workers_at_start - workers)
        note = f" Workers that left the cluster during the run: {left}." if left else ""
        if isinstance(err, ChainFailedError):
            worker = left[0] if len(left) == 1 else None
            return ChainFailedError(f"{err}{note}", chain=chain, worker=worker)
        return ChainFailedError(
            f"Chain {chain} failed on the Dask cluster: {type(err).__name__}: {err}. "
            f"No draws are returned.{note}",
            chain=chain,
            worker=self.pinned.get(chain),
        )

    def clear_events(
        self, chains: int, results: dict[int, dict[str, Any]], keep_abort: bool
    ) -> None:
        """Free the run's events on the scheduler; after a failure, the abort event stays set
        for the chains still running (cancelling a Dask task does not stop its thread)."""
        from distributed import Event

        names = [] if keep_abort else [event_name(self.run_id, "abort")]
        names += [started_name(self.run_id, i) for i in range(chains)]
        names += [ran_on_name(self.run_id, i, w) for i, w in self.pinned.items()]
        names += [ran_on_name(self.run_id, i, r["worker"]) for i, r in results.items()]
        for name in set(names):
            with contextlib.suppress(Exception):
                Event(name, client=self.client).clear()
