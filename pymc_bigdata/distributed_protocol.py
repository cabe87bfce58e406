"""What the caller of :func:`~pymc_bigdata.sample_dask` and its chains on the workers share.

* :class:`ChainFailedError` -- the error a run fails with (raised on either side);
* the names of the run's scheduler events (:func:`event_name`, :func:`started_name`,
  :func:`ran_on_name`): the abort signal, and where each chain started;
* the chains' task keys (:func:`chain_key`, :func:`chain_of_key`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ChainFailedError",
    "chain_key",
    "chain_of_key",
    "event_name",
    "ran_on_name",
    "started_name",
]


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

    # where users import it from (and where pickles of it, sent from the workers, name it)
    __module__ = "pymc_bigdata.distributed"

    def __init__(self, message: str, chain: int | None = None, worker: str | None = None):
        super().__init__(message)
        self.chain = chain
        self.worker = worker

    def __reduce__(self):
        return (type(self), (self.args[0], self.chain, self.worker))


def event_name(run_id: str, what: str) -> str:
    """The name of the run's scheduler event ``what`` (e.g. ``"abort"``)."""
    return f"pymc-bigdata-{run_id}-{what}"


def started_name(run_id: str, chain: int) -> str:
    """The event a chain sets as it starts (a re-run finds it set)."""
    return event_name(run_id, f"chain-{chain}-started")


def ran_on_name(run_id: str, chain: int, worker: str) -> str:
    """The event a chain sets on the worker it started on."""
    return event_name(run_id, f"chain-{chain}-ran-on-{worker}")


def chain_key(run_id: str, chain: int) -> str:
    """The Dask task key of the run's chain ``chain``."""
    return f"pymc-bigdata-chain-{chain}-{run_id}"


def chain_of_key(run_id: str, key: Any) -> int | None:
    """The chain whose task key is ``key``, or None for another run's or task's key."""
    prefix, suffix = "pymc-bigdata-chain-", f"-{run_id}"
    key = str(key)
    if key.startswith(prefix) and key.endswith(suffix):
        return int(key[len(prefix) : -len(suffix)])
    return None
