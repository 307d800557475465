"""The parity gate's |difference| on a head's logits: absolute while every logit is within 1,
relative to the largest logit past it (fp32 rounds the terms of a logit in proportion to the
head's scale, not to the logit's own value), while a cosine's stays absolute."""

from __future__ import annotations

import numpy as np
import pytest

from models import parity
from models.checks import FP32_MAX_DIFF, Checks, Run, parity_failure
from serving.catalogue import ModelSpec


class Fixed(Checks):
    """A model's parity inputs replaced by fixed reference scores; the run is what it returns."""

    def __init__(self, task: str, reference: np.ndarray) -> None:
        self.spec = ModelSpec.model_construct(task=task)
        self._reference = reference

    def reference_scores(self) -> np.ndarray:
        return self._reference

    def scores(self, run: Run) -> np.ndarray:
        return run(None)


def test_a_head_is_held_to_its_largest_logit_and_a_small_head_or_a_cosine_to_the_bound() -> None:
    off = 1.5 * FP32_MAX_DIFF
    near_zero = np.array([[0.0], [0.0], [off]])  # 1.5e-5 on a logit of 0.5
    wide = np.array([[10.0], [-8.0], [0.5]])  # a head whose logits reach 10
    figures = Fixed("rerank", wide).parity(lambda _: wide + near_zero)
    assert figures["max_diff"] <= FP32_MAX_DIFF and parity_failure("onnx", figures) is None
    narrow = np.array([[0.9], [-0.8], [0.5]])  # every logit within 1: absolute
    figures = Fixed("rerank", narrow).parity(lambda _: narrow + near_zero)
    assert "max |difference| 1.50e-05" in str(parity_failure("onnx", figures))
    # A classifier's logits, one column a label: scaled by its largest logit too, so 1.5e-5 on a
    # small logit passes, and 2.25e-5 of the largest (2.25e-4) does not.
    labels = np.array([[10.0, 0.5], [-8.0, 0.2]])
    small = labels + np.array([[0.0, off], [0.0, 0.0]])
    assert parity_failure("onnx", Fixed("classify", labels).parity(lambda _: small)) is None
    large = labels + np.array([[15 * off, 0.0], [0.0, 0.0]])
    assert parity_failure("onnx", Fixed("classify", labels).parity(lambda _: large)) is not None
    cosines = np.array([0.9, 0.2])  # never over 1: the bound is absolute
    figures = Fixed("embed", cosines).parity(lambda _: cosines + off)
    assert parity_failure("onnx", figures) is not None


@pytest.mark.parametrize("threads", ["0", "-2", "two"])
def test_threads_below_one_are_refused_before_any_model_is_read(threads: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parity.main(["--catalogue", "/nonexistent/catalogue.yaml", "--threads", threads])
    assert exited.value.code == 2  # argparse's usage error, before the catalogue is opened
    assert "--threads" in capsys.readouterr().err
