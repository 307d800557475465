from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from runners.onnx.settings import OnnxRunnerSettings
from runners.tf.settings import TFRunnerSettings
from services.tokenizer.settings import TokenizerSettings
from serving.catalogue import ModelSpec
from serving.contracts import ContractError, check_contract
from serving.settings import available_cores
from testkit.processes import ROOT


def test_each_service_reads_its_own_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUNDLE_ONNX_MAX_BATCH_TOKENS", "512")
    monkeypatch.setenv("BUNDLE_TF_DEADLINE_S", "2.5")
    monkeypatch.setenv("BUNDLE_TOKENIZER_MAX_TEXTS", "8")
    assert OnnxRunnerSettings().policy.max_batch_tokens == 512
    assert TFRunnerSettings().policy.max_batch_tokens == 1024
    assert TFRunnerSettings().policy.deadline_s == 2.5
    assert TokenizerSettings().max_texts == 8


def test_threads_default_to_cores_per_worker_and_oversubscription_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = available_cores()
    assert OnnxRunnerSettings(workers=1).threads == cores
    assert OnnxRunnerSettings(workers=cores).threads == 1
    with pytest.raises(ValidationError, match="oversubscribe"):
        OnnxRunnerSettings(workers=cores, intra_op_threads=2)


def test_onnx_lanes_default_to_the_instance_cores_and_never_oversubscribe() -> None:
    cores = available_cores()
    assert OnnxRunnerSettings().lane_count == cores  # one one-thread call per core
    assert OnnxRunnerSettings(workers=cores).lane_count == 1
    assert OnnxRunnerSettings(intra_op_threads=1).lane_count == 1  # one lane of that many threads
    assert OnnxRunnerSettings(lanes=1).lane_count == 1
    with pytest.raises(ValidationError, match="oversubscribe"):
        OnnxRunnerSettings(lanes=cores + 1)
    if cores > 1:
        with pytest.raises(ValidationError, match="one thread"):
            OnnxRunnerSettings(lanes=cores, intra_op_threads=1)


def test_the_public_service_logs_no_line_per_request_unless_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert TokenizerSettings().access_log is False
    monkeypatch.setenv("BUNDLE_TOKENIZER_ACCESS_LOG", "true")
    assert TokenizerSettings().access_log is True


def test_invalid_values_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValidationError, match="max_batch_tokens"):
        OnnxRunnerSettings(max_batch_tokens=0)
    with pytest.raises(ValidationError, match="deadline_s"):
        OnnxRunnerSettings(deadline_s=-1)


def test_a_wait_for_a_replica_must_leave_the_deadline_inside_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BentoML ends a request at timeout_s: one that waited the whole replica wait still needs
    its deadline after it."""
    for name in ("REPLICA_WAIT_S", "DEADLINE_S", "TIMEOUT_S"):
        monkeypatch.delenv(f"BUNDLE_TOKENIZER_{name}", raising=False)
    defaults = TokenizerSettings()
    assert defaults.replica_wait_s + defaults.deadline_s <= defaults.timeout_s
    assert TokenizerSettings(replica_wait_s=45, timeout_s=60).replica_wait_s == 45
    with pytest.raises(ValidationError, match=r"replica_wait_s \(25\) \+ deadline_s \(10\)"):
        TokenizerSettings(replica_wait_s=25)
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "docker-compose.yml").read_text())
    for name, value in compose["services"]["tokenizer"]["environment"].items():
        if name.endswith(("_WAIT_S", "_TIMEOUT_S", "_DEADLINE_S")):
            monkeypatch.setenv(name, str(value))
    assert TokenizerSettings().replica_wait_s > defaults.replica_wait_s  # the compose stack's


def test_runner_service_config_never_recycles_the_callers_connections() -> None:
    config = OnnxRunnerSettings().service_config(["/embed"])
    # BentoML's default (100 requests, 300 s) closed the caller's session with calls in flight.
    assert config["runner_connection"]["max_requests"] >= 2**31
    assert config["runner_connection"]["max_age"] >= 3600 * 24 * 365
    assert config["logging"]["access"]["enabled"] is False


SPEC = ModelSpec(
    name="m", task="embed", architecture="bert", max_length=256, dim=384, vocab_size=30522,
    pad_id=0, token_types=True, backends=("onnx",),
)  # fmt: skip
SENTENCE_EMBEDDING = SPEC.contract()


def test_a_models_contract_follows_its_spec() -> None:
    """Token types only for a model that takes them; the output's name by task, its width the
    model's."""
    assert SENTENCE_EMBEDDING.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert SENTENCE_EMBEDDING.outputs[0].shape == (None, 384)
    roberta = SPEC.model_copy(update={"token_types": False, "task": "classify", "dim": 3})
    assert roberta.contract().input_names == ["input_ids", "attention_mask"]
    assert roberta.contract().output_names == ["logits"]
    assert roberta.contract().outputs[0].shape == (None, 3)


def test_contract_mismatch_is_reported_by_name() -> None:
    good = {
        "input_ids": ("int64", (None, None)),
        "attention_mask": ("int64", (None, None)),
        "token_type_ids": ("int64", (None, None)),
    }
    check_contract(SENTENCE_EMBEDDING, good, {"sentence_embedding": ("float32", (None, 384))}, "m")
    with pytest.raises(ContractError, match="missing output 'sentence_embedding'"):
        check_contract(
            SENTENCE_EMBEDDING, good, {"last_hidden_state": ("float32", (None, None, 384))}, "m"
        )
    with pytest.raises(ContractError, match="'input_ids' is int32"):
        check_contract(
            SENTENCE_EMBEDDING,
            {**good, "input_ids": ("int32", (None, None))},
            {"sentence_embedding": ("float32", (None, 384))},
            "m",
        )
    with pytest.raises(ContractError, match="shape"):
        check_contract(
            SENTENCE_EMBEDDING, good, {"sentence_embedding": ("float32", (None, 768))}, "m"
        )
