"""What the caller of :func:`~pymc_bigdata.sample_dask` and its chains on the workers share.

* :class:`ChainFailedError` -- the error a run fails with (raised on either side);
* the names of the run's scheduler events (:func:`event_name`, :func:`started_name`,
  :func:`ran_on_name`): the abort signal, and where each attempt at a chain started;
* the chains' task keys (:func:`chain_key`, :func:`attempt_of_key`) and the topic their
  progress is sent on (:func:`progress_topic`).

A chain that is lost with its worker is run again as a new *attempt* (a new task key), so
that an attempt is never silently run twice: Dask's own re-run of a lost attempt finds the
attempt's "started" event set and raises (:func:`~pymc_bigdata.distributed_worker.chain_task`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ChainFailedError",
    "attempt_of_key",
    "chain_key",
    "event_name",
    "progress_topic",
    "ran_on_name",
    "started_name",
]


class ChainFailedError(RuntimeError):
    """A chain of :func:`sample_dask` raised, or was lost more often than its retries allow.

    Parameters
    ----------
    message
        What happened and what to do.
    chain
        The failed chain's number (``0 .. chains - 1``).
    worker
        The worker's address, where known.
    finished
        The chains that had finished when the run failed (kept in ``store=`` when one was
        given).
    """

    # where users import it from (and where pickles of it, sent from the workers, name it)
    __module__ = "pymc_bigdata.distributed"

    def __init__(
        self,
        message: str,
        chain: int | None = None,
        worker: str | None = None,
        finished: Sequence[int] = (),
    ):
        super().__init__(message)
        self.chain = chain
        self.worker = worker
        self.finished = tuple(finished)

    def __reduce__(self):
        return (type(self), (self.args[0], self.chain, self.worker, self.finished))


def event_name(run_id: str, what: str) -> str:
    """The name of the run's scheduler event ``what`` (e.g. ``"abort"``)."""
    return f"pymc-bigdata-{run_id}-{what}"


def started_name(run_id: str, chain: int, attempt: int) -> str:
    """The event an attempt at a chain sets as it starts (Dask's re-run finds it set)."""
    return event_name(run_id, f"chain-{chain}-attempt-{attempt}-started")


def ran_on_name(run_id: str, chain: int, attempt: int, worker: str) -> str:
    """The event an attempt at a chain sets on the worker it started on."""
    return event_name(run_id, f"chain-{chain}-attempt-{attempt}-ran-on-{worker}")


def progress_topic(run_id: str) -> str:
    """The Dask event topic on which the run's chains send their progress."""
    return event_name(run_id, "progress")


def chain_key(run_id: str, chain: int, attempt: int) -> str:
    """The Dask task key of attempt ``attempt`` at the run's chain ``chain``."""
    return f"pymc-bigdata-chain-{chain}-attempt-{attempt}-{run_id}"


def attempt_of_key(run_id: str, key: Any) -> tuple[int, int] | None:
    """``(chain, attempt)`` of the task key ``key``, or None for another run's or task's key."""
    prefix, suffix = "pymc-bigdata-chain-", f"-{run_id}"
    key = str(key)
    if not (key.startswith(prefix) and key.endswith(suffix)):
        return None
    chain, _, attempt = key[len(prefix) : -len(suffix)].partition("-attempt-")
    return int(chain), int(attempt)
