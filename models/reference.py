"""The PyTorch reference of a catalogue model: what its ONNX export traces, and what every backend
is checked against (``make parity``, and the gates of ``make models``).

An embed model is transformers' encoder with the entry's pooling (mean over the mask, or the first
token) and, where asked, L2 normalisation; a rerank or classify model is its sequence-
classification head's logits. torch is needed only here, to build and check models, never to serve.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from serving.catalogue import ModelSpec
from serving.features import Feeds


class Reference(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        self.spec = spec

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        if self.spec.task != "embed":
            return self.model(**kwargs).logits
        hidden = self.model(**kwargs).last_hidden_state
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        if self.spec.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled


def load(source_dir: Path, spec: ModelSpec) -> Reference:
    from transformers import AutoModel, AutoModelForSequenceClassification
    from transformers.utils import logging

    # A checkpoint often carries weights its use here leaves out (a pooler an embedding does not
    # read): an expected report, not worth printing on every build.
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    # eager attention traces to plain MatMul/Softmax, which every backend runs alike.
    loader = AutoModel if spec.task == "embed" else AutoModelForSequenceClassification
    model = loader.from_pretrained(str(source_dir), attn_implementation="eager")
    return Reference(model, spec).eval()


@torch.inference_mode()
def run(reference: Reference, feeds: Feeds) -> np.ndarray:
    inputs = [torch.from_numpy(feeds[name]) for name in reference.spec.input_names]
    out: np.ndarray = reference(*inputs).numpy()
    return out
