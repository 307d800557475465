"""The PyTorch reference: MiniLM as sentence-transformers computes it (BERT, mean pooling, L2 norm).

It is both what ``torch.onnx.export`` traces and what ``make parity`` compares every backend with.
torch is needed only here, to build and check models, never to serve.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class SentenceEncoder(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, p=2, dim=1)


def load(source_dir: Path) -> SentenceEncoder:
    from transformers import BertModel
    from transformers.utils import logging

    # The checkpoint carries BERT's pooler, which sentence embeddings do not use: an expected
    # "unexpected weights" report, not worth printing on every build.
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    # eager attention traces to plain MatMul/Softmax, which ORT's optimiser fuses into Attention.
    bert = BertModel.from_pretrained(
        str(source_dir), attn_implementation="eager", add_pooling_layer=False
    )
    return SentenceEncoder(bert).eval()


@torch.inference_mode()
def embed(model: SentenceEncoder, feeds: dict[str, np.ndarray]) -> np.ndarray:
    out = model(**{name: torch.from_numpy(value) for name, value in feeds.items()})
    return out.numpy()
