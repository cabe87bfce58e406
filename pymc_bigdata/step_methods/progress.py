"""Sampler statistics in PyMC's progress bar (what NUTS shows: divergences and step size).

PyMC asks a step method for its progress-bar columns (``_progressbar_config(n_chains)``) and
for a function that picks their values out of each draw's statistics
(``_make_progressbar_update_functions()``). Every step here shows the chain's divergences
after tuning (the stat ``divergences``, a running count as NUTS's) and, where it has one,
its step size, then the sampler's own statistic of the draw: a :class:`ProgressField` the
step class declares (``progress_field``). A bar turns red once its chain has diverged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from rich.progress import TextColumn
from rich.table import Column

__all__ = [
    "DIVERGENCES",
    "STEP_SIZE",
    "ProgressColumns",
    "ProgressField",
    "progressbar_config",
    "update_functions",
]


class ProgressField(NamedTuple):
    """One column: the draw's statistic ``stat``, headed ``title``, formatted by ``spec``."""

    stat: str
    title: str
    spec: str


#: the chain's divergences after tuning (a running count)
DIVERGENCES = ProgressField("divergences", "Divergences", "d")
#: the step size the draw used
STEP_SIZE = ProgressField("step_size", "Step size", "0.3g")


def progressbar_config(
    fields: Sequence[ProgressField], n_chains: int
) -> tuple[list[TextColumn], dict[str, list[Any]]]:
    """PyMC's ``_progressbar_config``: a column per field, and each field's starting value
    per chain."""
    columns = [
        TextColumn(f"{{task.fields[{f.stat}]:{f.spec}}}", table_column=Column(f.title, ratio=1))
        for f in fields
    ]
    stats = {f.stat: [0 if f.spec == "d" else math.nan] * n_chains for f in fields}
    return columns, stats


def update_functions(
    fields: Sequence[ProgressField],
) -> tuple[Callable[[Mapping[str, Any]], dict[str, Any]]]:
    """PyMC's ``_make_progressbar_update_functions``: the fields' values from a draw's
    statistics, and ``failing`` once the chain has diverged."""
    stats = tuple(f.stat for f in fields)

    def update_stats(step_stats: Mapping[str, Any]) -> dict[str, Any]:
        values = {stat: step_stats[stat] for stat in stats}
        return values | {"failing": step_stats.get("divergences", 0) > 0}

    return (update_stats,)


class ProgressColumns:
    """PyMC's two progress-bar methods for a step with a step size and the stat
    ``divergences``: divergences, step size, then the class's ``progress_field``."""

    #: the sampler's own statistic, after divergences and step size (None: none)
    progress_field: ClassVar[ProgressField | None] = None

    def _progressbar_config(self, n_chains: int = 1):
        """The columns and their starting values (:func:`progressbar_config`)."""
        return progressbar_config(self._progress_fields(), n_chains)

    def _make_progressbar_update_functions(self):
        """The columns' values from a draw's stats (:func:`update_functions`)."""
        return update_functions(self._progress_fields())

    def _progress_fields(self) -> list[ProgressField]:
        own = [] if self.progress_field is None else [self.progress_field]
        return [DIVERGENCES, STEP_SIZE, *own]
