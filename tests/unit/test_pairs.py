"""Text pairs through the stack: where a pair's second text starts, from the model's tokenizer to
the token types an engine call is fed; and what the rerank and classify routes make of logits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from runners.settings import RunnerSettings
from services.tokenizer import cohere_api, scoring
from serving.batching import Admission, Batcher, TokenQueue
from serving.features import PairTooLong, load_tokenizer, pad, tokenize_pairs
from tests import checkpoints


def test_token_types_are_1_from_the_second_text_to_the_last_real_token() -> None:
    feeds = pad([[2, 5, 3, 6, 3], [2, 7, 3]], pad_id=0, token_types=True, segments=[3, 3])
    assert feeds["token_type_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert "token_type_ids" not in pad([[2, 3]], token_types=False, segments=[1])
    assert pad([[2, 3]], segments=None)["token_type_ids"].tolist() == [[0, 0]]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    made = {}
    for kind in ("bert", "roberta"):
        path = tmp_path_factory.mktemp(kind) / "tokenizer.json"
        checkpoints.train_tokenizer(checkpoints.KINDS[kind], vocab=300).save(str(path))
        made[kind] = load_tokenizer(path, 24, pairs=True)
    return made


def test_a_pair_is_encoded_by_the_models_template_and_cut_from_its_second_text(
    tokenizers: dict[str, object],
) -> None:
    bert, roberta = tokenizers["bert"], tokenizers["roberta"]
    pairs = [("where is my order", "it shipped"), ("hi", "word " * 40)]
    ids, starts = tokenize_pairs(bert, pairs)
    for pair, row, start in zip(pairs, ids, starts, strict=True):
        encoding = bert.encode(*pair)  # type: ignore[attr-defined]
        assert row == encoding.ids
        assert start == encoding.type_ids.index(1)  # [CLS] A [SEP] | B [SEP]
    # Cut to the model's 24 from the second text: the first is kept whole, then its [SEP].
    alone = bert.encode("hi").ids  # type: ignore[attr-defined]
    assert len(ids[1]) == 24 and ids[1][: len(alone)] == alone
    # RoBERTa's template gives no token types: the second text "starts" past the end.
    ids, starts = tokenize_pairs(roberta, pairs[:1])
    assert starts == [len(ids[0])]
    with pytest.raises(PairTooLong) as cut:
        tokenize_pairs(bert, [("a", "b"), ("word " * 60, "b")])
    assert cut.value.index == 1


def test_a_call_mixing_pairs_and_single_texts_feeds_each_row_its_own_token_types() -> None:
    fed: dict[tuple[int, ...], list[int]] = {}  # each row's real ids -> its token types

    def engine(feeds: dict[str, np.ndarray]) -> np.ndarray:
        for ids, mask, types in zip(
            feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"], strict=True
        ):
            real = int(mask.sum())
            fed[tuple(ids[:real].tolist())] = types.tolist()
        return np.zeros((len(feeds["input_ids"]), 2), np.float32)

    async def main() -> None:
        batcher = Batcher(engine, RunnerSettings().policy)
        await asyncio.gather(
            batcher.submit([[2, 5, 3, 6, 3], [2, 8, 8, 3, 9, 3]], segments=[3, 4]),
            batcher.submit([[2, 7, 7, 3]]),
        )
        await batcher.close()

    asyncio.run(main())
    # Each row padded to its call's width: 1 from its second text to its end, 0 on padding.
    assert {ids: types[: len(ids)] for ids, types in fed.items()} == {
        (2, 5, 3, 6, 3): [0, 0, 0, 1, 1],
        (2, 8, 8, 3, 9, 3): [0, 0, 0, 0, 1, 1],
        (2, 7, 7, 3): [0, 0, 0, 0],
    }
    assert all(not any(types[len(ids) :]) for ids, types in fed.items())


def test_a_queue_refuses_segments_that_do_not_fit_their_sequences() -> None:
    async def main() -> None:
        queue = TokenQueue(Admission(10_000, 1.0))
        for bad in ([1], [0, 4], [2, 2, 2]):
            with pytest.raises(ValueError, match="segments"):
                queue.put([[1, 2], [3, 4, 5]], segments=bad)
        assert queue.put([[1, 2], [3, 4, 5]], segments=[1, 3]).segment(1) == 3

    asyncio.run(main())


def test_relevance_is_the_logits_sigmoid_and_ranks_ties_in_request_order() -> None:
    logits = np.array([[0.0], [2.0], [0.0], [-1.0]], np.float32)
    scores = scoring.relevance(logits)
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-logits[:, 0])))
    assert scoring.ranking(scores) == [1, 0, 2, 3]
    assert scoring.ranking(scores, 2) == [1, 0]
    np.testing.assert_array_equal(scoring.relevance(logits, raw=True), logits[:, 0])


def test_label_scores_are_the_softmax_best_first() -> None:
    logits = np.array([[1.0, 3.0, 2.0]])
    [got] = scoring.label_scores(logits, ["a", "b", "c"])
    want = np.exp(logits[0]) / np.exp(logits[0]).sum()
    assert [p["label"] for p in got] == ["b", "c", "a"]
    np.testing.assert_allclose([p["score"] for p in got], want[[1, 2, 0]])
    [raw] = scoring.label_scores(logits, ["a", "b", "c"], raw=True)
    assert [p["score"] for p in raw] == [3.0, 2.0, 1.0]


def test_coheres_request_takes_document_objects_and_ignores_fields_it_has_no_use_for() -> None:
    body = b'{"query": "q", "documents": ["a", {"text": "b"}], "priority": 0, "top_n": 1}'
    request = cohere_api.parse(body)
    assert request.documents == ["a", "b"] and request.top_n == 1 and request.model is None
    for bad, names in (
        (b'{"query": " ", "documents": ["a"]}', "query"),
        (b'{"query": "q", "documents": []}', "documents"),
        (b'{"query": "q", "documents": [{"title": "x"}]}', "documents.0"),
    ):
        with pytest.raises(cohere_api.CohereError) as refused:
            cohere_api.parse(bad)
        assert refused.value.status == 400 and names in refused.value.message


def test_the_coalescer_merges_pairs_with_single_texts_into_one_runner_call() -> None:
    """A rerank request's pairs and another request's texts leave in one call: each row with where
    its second text starts (a single text's length: none)."""
    from services.tokenizer.coalesce import Coalescer, Embedded

    calls: list[tuple[list[list[int]], list[int] | None]] = []

    class Runner:
        async def embed(
            self, ids: list[list[int]], deadline_s: float, segments: list[int] | None = None
        ) -> Embedded:
            calls.append((ids, segments))
            await asyncio.sleep(0.01)
            return Embedded(np.array([[len(s)] for s in ids], np.float32), 0.0, 0.0)

    async def main() -> None:
        queue = TokenQueue(Admission(10_000, 5.0))
        coalescer = Coalescer(Runner(), queue, max_inflight=1, max_tokens=10_000)
        first = asyncio.create_task(coalescer.embed([[1, 2]]))  # goes out alone, at once
        await asyncio.sleep(0)
        merged = await asyncio.gather(
            coalescer.embed([[2, 5, 3, 6, 3], [2, 5, 3, 7, 7, 3]], segments=[3, 3]),
            coalescer.embed([[2, 9, 3]]),
        )
        await first
        assert [e.vectors[:, 0].tolist() for e in merged] == [[5, 6], [3]]

    asyncio.run(main())
    assert calls[0] == ([[1, 2]], None)
    assert calls[1] == ([[2, 5, 3, 6, 3], [2, 5, 3, 7, 7, 3], [2, 9, 3]], [3, 3, 3])
