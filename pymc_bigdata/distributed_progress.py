"""PyMC's progress bar for the chains of a :func:`~pymc_bigdata.sample_dask` run.

The chains send the scalar statistics of their new draws from the workers as Dask events
(:class:`~pymc_bigdata.distributed_worker.chain_task`, every
:data:`~pymc_bigdata.distributed_worker.PROGRESS_SECONDS`); :class:`ClusterProgress`
subscribes to them on the caller's client and feeds them, draw by draw, to the progress bar
``pm.sample`` shows for local chains (PyMC's ``MCMCProgressBarManager``, with the step's own
columns: step size, divergences and each sampler's statistic). A finished chain's bar is
completed from its result; a chain read from a store shows as finished at once. A chain run
again after its worker was lost holds its bar until the new attempt passes the draws shown.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any

from pymc.progress_bar.progress import MCMCProgressBarManager

from pymc_bigdata.distributed_protocol import progress_topic

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ClusterProgress"]


class ClusterProgress:
    """The caller's progress bar over a run's chains, fed by the workers' events.

    Parameters
    ----------
    client
        The run's client.
    run_id
        The run's id.
    step
        The step method (its progress-bar columns).
    chains, draws, tune
        Chains, draws per chain (tuning included) and tuning draws.
    progressbar, progressbar_theme
        As in :func:`pymc.sample`.

    Attributes
    ----------
    shown
        Draws shown per chain.
    from_workers
        Draws shown from the workers' events (not from finished chains' results).
    """

    def __init__(
        self,
        client: Client,
        run_id: str,
        step: Any,
        *,
        chains: int,
        draws: int,
        tune: int,
        progressbar: Any = False,
        progressbar_theme: Any = None,
    ):
        self.client, self.topic = client, progress_topic(run_id)
        self.tune, self.chains = tune, chains
        self.manager = MCMCProgressBarManager(
            step_method=step,
            chains=chains,
            draws=draws - tune,
            tune=tune,
            progressbar=progressbar,
            progressbar_theme=progressbar_theme,
        )
        self.shown = [0] * chains
        self.from_workers = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    @property
    def active(self) -> bool:
        """Whether a bar is shown (and the chains should send their progress)."""
        return bool(self.manager._show_progress)

    def __enter__(self) -> ClusterProgress:
        self.manager.__enter__()
        if self.active:
            self.client.subscribe_topic(self.topic, self._receive)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.active:
            self.client.unsubscribe_topic(self.topic)
        self.manager.__exit__(*exc_info)

    def _receive(self, event: tuple[float, dict[str, Any]]) -> None:
        """A worker's event (called on the client's event loop): queued for :meth:`drain`."""
        self._inbox.put(event[1])

    def drain(self) -> None:
        """Show the draws the workers reported since the last call (in the caller's thread)."""
        while not self._inbox.empty():
            message = self._inbox.get()
            shown = self._show(message["chain"], message["first_draw"], message["stats"])
            self.from_workers += shown

    def finish(self, chain: int, result: dict[str, Any]) -> None:
        """Complete chain ``chain``'s bar from its result (the draws not reported yet)."""
        if not self.active:
            return
        stats = result["stats"] or []
        n_draws = result["n_draws"]
        for draw in range(self.shown[chain], n_draws):
            self._update(chain, draw, [{k: v[draw] for k, v in s.items()} for s in stats])
        self.shown[chain] = max(self.shown[chain], n_draws)
        if n_draws and (not self.manager.combined_progress or chain == self.chains - 1):
            last = [{k: v[n_draws - 1] for k, v in s.items()} for s in stats]
            self.manager.update(
                chain_idx=chain, is_last=True, draw=n_draws - 1, tuning=False, stats=last
            )

    def _show(self, chain: int, first_draw: int, stats: list[list[dict[str, Any]]]) -> int:
        """Show the draws of ``stats`` (from ``first_draw``) not shown yet; their count."""
        shown = 0
        for offset, draw_stats in enumerate(stats):
            draw = first_draw + offset
            if draw < self.shown[chain]:
                continue
            self._update(chain, draw, draw_stats)
            self.shown[chain] = draw + 1
            shown += 1
        return shown

    def _update(self, chain: int, draw: int, stats: list[dict[str, Any]]) -> None:
        self.manager.update(
            chain_idx=chain, is_last=False, draw=draw, tuning=draw < self.tune, stats=stats
        )
