"""The built models: known answers, cross-backend agreement, tokenizers, parity gates, builder errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models import corpus, parity, source, store
from serving import contracts
from serving.features import load_tokenizer, pad, tokenize
from testkit.processes import ROOT

KNOWN = ("A man is eating food.", "A man is eating a piece of bread.")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")


@pytest.fixture(scope="module")
def onnx():
    from serving.engines.onnx import OnnxEngine

    return OnnxEngine(
        store.path_of(contracts.ONNX_FP32) / "model.onnx",
        contracts.SENTENCE_EMBEDDING,
        threads=2,
        providers=["CPUExecutionProvider"],
    )


@pytest.fixture(scope="module")
def tf():
    from serving.engines.tf import TFEngine

    return TFEngine(
        store.path_of(contracts.TF_SAVEDMODEL) / "saved_model",
        contracts.SENTENCE_EMBEDDING,
        threads=2,
    )


@pytest.mark.parametrize("backend", ["onnx", "tf"])
def test_known_answer(request, tokenizer, backend: str) -> None:
    engine = request.getfixturevalue(backend)
    a, b = engine(pad(tokenize(tokenizer, KNOWN)))
    assert float(a @ b) == pytest.approx(0.755, abs=0.01)


def test_onnx_and_tf_agree_on_a_mixed_length_batch_and_padding_does_not_leak(
    tokenizer, onnx, tf
) -> None:
    texts = ["hi", KNOWN[0], *corpus.load_texts()[:30], "word " * 300]
    ids = tokenize(tokenizer, texts)
    assert len({len(i) for i in ids}) > 10  # genuinely mixed lengths, one truncated at the limit
    batch_onnx, batch_tf = onnx(pad(ids)), tf(pad(ids))
    np.testing.assert_allclose(batch_onnx, batch_tf, atol=1e-5)
    alone = np.concatenate([onnx(pad([i])) for i in ids])
    np.testing.assert_allclose(batch_onnx, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batch_onnx, axis=1), 1.0, atol=1e-5)


def test_tokenizer_has_no_fixed_padding_and_truncates_at_the_model_limit(tokenizer) -> None:
    short, long = tokenize(tokenizer, ["hello world", "word " * 1000])
    assert short == [101, 7592, 2088, 102]
    assert len(long) == contracts.MAX_SEQ_LEN == 256


def test_tokenize_gives_the_ids_of_the_tokenizers_full_encode_on_the_corpus(tokenizer) -> None:
    """``tokenize`` takes the fast tokenizer's encode_batch_fast (no offsets): its ids are those of
    encode_batch, one text at a time (as the service tokenizes a chat request) and in batches,
    on the corpus and on texts cut at the model's limit, empty, accented and not Latin."""
    texts = [*corpus.load_texts(), "word " * 1000, "", "Crème brûlée à Noël", "東京は晴れ 🙂"]
    full = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    assert tokenize(tokenizer, texts) == full
    assert [tokenize(tokenizer, [text])[0] for text in texts] == full


def test_sentencepiece_transformers_tokenizer_equals_sentencepiece_on_1000_lines() -> None:
    import sentencepiece
    from transformers import AutoTokenizer

    spm_dir = store.path_of(contracts.SENTENCEPIECE)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_dir / "spiece.model"))
    hf = AutoTokenizer.from_pretrained(str(spm_dir / "transformers"))
    lines = list(corpus.training_lines())[:1000]
    assert len(lines) == 1000
    assert [hf.encode(line, add_special_tokens=False) for line in lines] == [
        processor.encode(line) for line in lines
    ]


def test_stored_models_record_source_hash_settings_and_parity() -> None:
    for name in (
        contracts.ONNX_FP32,
        contracts.ONNX_OPTIMISED,
        contracts.ONNX_INT8,
        contracts.TF_SAVEDMODEL,
    ):
        meta = store.latest(name).info.metadata
        assert meta["source_sha256"] == source.MINILM_SHA256
        assert meta["export"] and meta["parity"]
    assert (
        store.latest(contracts.ONNX_FP32).info.metadata["parity"]["max_abs_diff_vs_torch"] <= 1e-5
    )
    int8 = store.latest(contracts.ONNX_INT8).info.metadata
    assert (
        int8["parity"]["mean_cosine_vs_fp32"] >= 0.99
        and int8["parity"]["min_cosine_vs_fp32"] >= 0.95
    )


def test_int8_is_smoothed_and_quantised_in_every_weighted_matmul_but_the_kept_one() -> None:
    """What minilm-onnx-int8 is, read from its graph: 36 weighted MatMuls (6 layers x query, key,
    value, attention output, FFN up and down), all in int8 but layer 0's FFN down-projection; the
    inputs of the quantised ones (4 a layer, but the kept one's) each smoothed by a Mul whose
    output only int8 quantisation reads."""
    import onnx

    model = store.latest(contracts.ONNX_INT8)
    graph = onnx.load(str(Path(model.path) / "model.onnx"), load_external_data=False).graph
    constants = {init.name for init in graph.initializer}
    kept = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    assert kept == ["/bert/encoder/layer.0/output/dense/MatMul"]
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) == 35
    smoothed = [
        n.output[0] for n in graph.node if n.op_type == "Mul" and n.name.endswith("/smooth")
    ]
    assert len(smoothed) == 23
    readers = {out: [n.op_type for n in graph.node if out in n.input] for out in smoothed}
    assert all(ops and set(ops) == {"DynamicQuantizeLinear"} for ops in readers.values()), readers
    export = model.info.metadata["export"]
    assert export["kept_fp32"] == kept and export["smoothed_matmuls"] == 35


def test_parity_report_and_gates(tmp_path: Path) -> None:
    out = tmp_path / "parity.json"
    assert parity.main(["--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results) == {"onnx", "onnx-opt", "onnx-int8", "tf"}
    for name, r in results.items():
        assert set(r) == {"mismatches", "pairs", "max_diff", "min_diff", "mean_diff", "std_diff"}
        assert r["pairs"] >= 500
        if name != "onnx-int8":
            assert r["mismatches"] == 0 and r["max_diff"] <= 1e-5
    assert results["onnx-int8"]["mismatches"] <= 0.01 * results["onnx-int8"]["pairs"]
    assert parity.gate_failures(results) == []


def test_parity_gate_fails_when_a_backend_disagrees() -> None:
    bad = {
        "onnx": {"mismatches": 1, "pairs": 600, "max_diff": 2e-5},
        "onnx-int8": {"mismatches": 7, "pairs": 600, "max_diff": 0.1},
    }
    failures = parity.gate_failures(bad)
    assert len(failures) == 2 and "onnx:" in failures[0] and "onnx-int8" in failures[1]


def build(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "BENTOML_HOME": str(home),
        "BENTOML_DO_NOT_TRACK": "True",
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "models.build", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]


def test_missing_source_directory_is_one_clear_error(tmp_path: Path) -> None:
    assert_one_line_error(
        build("--source", str(tmp_path / "nope"), home=tmp_path / "home"), "does not exist"
    )


def test_source_missing_a_file_is_one_clear_error(tmp_path: Path) -> None:
    copy = tmp_path / "minilm"
    shutil.copytree(source.default_source_dir(), copy)
    (copy / "tokenizer.json").unlink()
    assert_one_line_error(
        build("--source", str(copy), home=tmp_path / "home"), "missing", "tokenizer.json"
    )


def test_corrupted_weights_are_one_clear_error(tmp_path: Path) -> None:
    copy = tmp_path / "minilm"
    shutil.copytree(source.default_source_dir(), copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert_one_line_error(
        build("--source", str(copy), home=tmp_path / "home"), "sha256", "corrupted"
    )
    # Without a required hash, a truncated file is still caught before any export.
    weights.write_bytes(bytes(data[:1000]))
    assert_one_line_error(
        build("--source", str(copy), "--sha256", "", home=tmp_path / "home"), "safetensors"
    )


def test_hub_source_without_a_hub_is_one_clear_error(tmp_path: Path) -> None:
    assert_one_line_error(
        build("--source", "sentence-transformers/all-MiniLM-L6-v2", home=tmp_path / "home"),
        "cannot fetch",
    )


def test_second_build_reuses_and_force_rebuilds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = build("--only", "sentencepiece", home=home)
    assert first.returncode == 0 and " built in " in first.stdout, first.stdout + first.stderr
    again = build("--only", "sentencepiece", home=home)
    assert again.returncode == 0 and "reused" in again.stdout and " built in " not in again.stdout
    forced = build("--only", "sentencepiece", "--force", home=home)
    assert forced.returncode == 0 and " built in " in forced.stdout


def test_make_models_again_reuses_every_stored_model() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "models.build"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BENTOML_DO_NOT_TRACK": "True"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(" reused") == 6, proc.stdout


def test_the_tokenizer_service_keeps_the_fast_tokenizer_on_its_own_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bentoml serve` does not apply a bentofile's environment: the service itself turns the fast
    tokenizer's thread pool off (a batch would take the engines' second core), unless the
    environment says otherwise."""
    from services.tokenizer.text import Tokenizers

    paths = (
        store.path_of(contracts.TOKENIZER) / "tokenizer.json",
        store.path_of(contracts.SENTENCEPIECE) / "spiece.model",
    )
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    Tokenizers(*paths)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    Tokenizers(*paths)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
