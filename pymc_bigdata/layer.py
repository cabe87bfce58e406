"""Compatibility names: the model layer now lives in :mod:`pymc_bigdata.model`.

``from pymc_bigdata.layer import MinibatchModel, Anchor, ...`` keeps working; new code
imports from the module that defines each name (see :mod:`pymc_bigdata.model`).
"""

from __future__ import annotations

from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.anchor import SPARSE_HESSIAN_DENSITY, Anchor
from pymc_bigdata.model.compiled import ChunkFunction
from pymc_bigdata.model.laplace import (
    DENSE_PRECONDITIONER_DIM,
    MAP_DECREMENT_TOLERANCE,
    MIN_RELATIVE_CURVATURE,
    MapResult,
)
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.passes import DEFAULT_CHUNK_ROWS, DIAGONAL_PROBES, HESSIAN_BLOCK_ELEMENTS

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "DENSE_HESSIAN_MAX_DIM",
    "DENSE_PRECONDITIONER_DIM",
    "DIAGONAL_PROBES",
    "HESSIAN_BLOCK_ELEMENTS",
    "MAP_DECREMENT_TOLERANCE",
    "MIN_RELATIVE_CURVATURE",
    "SPARSE_HESSIAN_DENSITY",
    "Anchor",
    "ChunkFunction",
    "MapResult",
    "MinibatchModel",
]
