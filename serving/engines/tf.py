"""TensorFlow SavedModel engine: the ``serving_default`` signature, its contract checked at load."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from serving.contracts import Contract, check_contract
from serving.features import Feeds


class TFEngine:
    def __init__(
        self, saved_model: Path, contract: Contract, *, threads: int, name: str = "tf"
    ) -> None:
        # Read by TensorFlow at import: oneDNN's custom ops were slower at the small batches served here.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # already initialised in this process (tests load several engines)
            pass
        self._tf = tf
        self.fn = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
        _, kwargs = self.fn.structured_input_signature
        inputs = {k: (v.dtype.name, tuple(v.shape.as_list())) for k, v in kwargs.items()}
        outputs = {
            k: (v.dtype.name, tuple(v.shape.as_list()))
            for k, v in self.fn.structured_outputs.items()
        }
        check_contract(contract, inputs, outputs, name)
        self.inputs = contract.input_names
        self.output = contract.output_names[0]

    def __call__(self, feeds: Feeds) -> np.ndarray:
        tf = self._tf
        return self.fn(**{name: tf.constant(feeds[name]) for name in self.inputs})[
            self.output
        ].numpy()
