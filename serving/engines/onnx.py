"""ONNX Runtime engine: one InferenceSession, its contract checked at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving.contracts import Contract, check_contract
from serving.features import Feeds

_ORT_TYPES = {"tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(float)": "float32"}


def _described(args) -> dict[str, tuple[str, tuple[int | None, ...]]]:
    return {
        a.name: (
            _ORT_TYPES.get(a.type, a.type),
            tuple(d if isinstance(d, int) else None for d in a.shape),
        )
        for a in args
    }


class OnnxEngine:
    def __init__(
        self,
        path: Path,
        contract: Contract,
        *,
        threads: int,
        providers: list[str],
        name: str = "onnx",
        memory_arena: bool = True,
        spinning: bool = True,
        spin_between_runs: bool = True,
    ) -> None:
        """``memory_arena=False`` for many small sessions: the per-session arena keeps a small
        model's resident memory well above its file size (docs/decisions/0010-tenant-memory.md)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.enable_cpu_mem_arena = memory_arena
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # ORT's default: a session of more than one thread has a pool whose idle threads spin
        # waiting for work, within a run and for a while after it (a one-thread session, as on the
        # runners' lanes, has no pool). Turning spinning off in the runners' one-lane layout, to
        # leave the cores to the tokenizer process, was slower for both chat and bulk
        # (docs/decisions/0005-onnx-session-threads.md). ``spinning=False`` is for an engine whose
        # process has other work to do while it runs (the hand-written baseline's event loop,
        # taking the next requests).
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # ``spin_between_runs=False``: spin within a run (each operator's parallel section starts
        # at once) but stop when it ends; by default the idle threads go on spinning, taking a
        # core from the processes that answer the request (most of a core for a while after each
        # run, against next to nothing with the entry: ORT bounds the spin by a count of pause
        # instructions, so the time is the CPU's; docs/decisions/0005-onnx-session-threads.md;
        # tests/integration/test_onnx_sessions.py pins the difference). For the ONNX runner's
        # solo sessions, which run when nothing else waits.
        if not spin_between_runs:
            options.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        check_contract(
            contract,
            _described(self.session.get_inputs()),
            _described(self.session.get_outputs()),
            name,
        )
        self.inputs = contract.input_names
        self.output = contract.output_names[0]

    def __call__(self, feeds: Feeds) -> np.ndarray:
        return self.session.run([self.output], {name: feeds[name] for name in self.inputs})[0]
