"""The model layer: a PyMC model whose likelihood factorises over rows, as minibatch functions.

One concern per module, leaves first (each imports only those above it):

* :mod:`.row_data` -- the observed values and covariates with a row axis;
* :mod:`.checks` -- what the layer refuses, with a message saying what to do;
* :mod:`.graph` -- the per-row log-likelihood and log-prior graphs of ``theta``, held
  variables, labels (:class:`ModelGraph`);
* :mod:`.compiled` -- the compiled functions (:class:`CompiledModel`, :class:`ChunkFunction`,
  :func:`compile_function`);
* :mod:`.passes` -- full-data passes in row chunks (:class:`FullDataPasses`);
* :mod:`.map_result` -- a MAP with its curvature (:class:`MapResult`) and the posterior
  precision (:func:`posterior_precision`);
* :mod:`.newton_stop`, :mod:`.newton` -- the MAP search's full-data Newton stage and when it
  stops;
* :mod:`.laplace` -- the MAP search and the Laplace fit (:func:`find_map`);
* :mod:`.anchor` -- control-variate anchors (:class:`Anchor`);
* :mod:`.estimate_graphs` -- HMC-ECS's whole estimate at ``z`` as one graph (compiled by
  :mod:`.difference_terms`);
* :mod:`.likelihood_inputs`, :mod:`.difference_terms` -- HMC-ECS's expansion in the
  likelihood's inputs and its per-row Taylor residuals;
* :mod:`.minibatch` -- :class:`MinibatchModel`, the façade the samplers use;
* :mod:`.layer_cache` -- the layers kept for the next step on the same model.
"""

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.compiled import ChunkFunction, CompiledModel, compile_function
from pymc_bigdata.model.graph import ModelGraph
from pymc_bigdata.model.laplace import MapResult, find_map, posterior_precision, symmetrised
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.model.passes import FullDataPasses

__all__ = [
    "Anchor",
    "ChunkFunction",
    "CompiledModel",
    "FullDataPasses",
    "MapResult",
    "MinibatchModel",
    "ModelGraph",
    "compile_function",
    "find_map",
    "posterior_precision",
    "symmetrised",
]
