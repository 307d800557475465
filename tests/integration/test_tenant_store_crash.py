"""A tenant upload killed at each of its filesystem steps always leaves a version that loads
(a forked child process per step: the slow part of the tenant store's tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runners.tenants import registry
from runners.tenants.loader import load
from runners.tenants.store import TenantStore
from testkit.processes import ROOT
from tests.unit.test_tenant_store import archive, store, tiny_model

__all__ = ["store"]  # the fixture, shared with the store's other tests


# A driver process imports the store once, then for each N read from its stdin forks a child that
# runs the upload and SIGKILLs itself at its Nth filesystem step (any call that creates, writes,
# flushes, renames or removes): N = 1, 2, ... covers every point of a crash. A fork, not a fresh
# interpreter per N: the imports are most of a child's time. tarfile writes the extracted files
# through its own reference to open (``tarfile.bltn_open``, bound at import), so that is counted
# too. For each N the driver prints how the child ended (``killed``, ``done``, or ``failed`` with its
# traceback on stderr) and the kind of its last step.
KILL_AT_STEP = """
import builtins, io, os, shutil, signal, sys, tarfile, traceback
from pathlib import Path
from runners.tenants import registry
from runners.tenants.store import TenantStore

def upload(kill_at, report):
    steps = 0
    def step(real, kind):
        def wrapper(*args, **kwargs):
            nonlocal steps
            steps += 1
            os.write(report, f"{kind}\\n".encode())
            if steps == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return wrapper
    for name in ("mkdir", "rename", "replace", "symlink", "fsync", "unlink", "rmdir", "chmod"):
        setattr(os, name, step(getattr(os, name), name))
    shutil.rmtree = step(shutil.rmtree, "rmtree")
    def writes(real, kind):
        counted = step(real, kind)
        def opening(file, mode="r", *args, **kwargs):
            return (counted if any(c in mode for c in "wax+") else real)(file, mode, *args, **kwargs)
        return opening
    builtins.open = io.open = writes(io.open, "open")
    tarfile.bltn_open = writes(tarfile.bltn_open, "extract-write")
    registry.upload(TenantStore(Path(sys.argv[1])), "acme", Path(sys.argv[2]), 1 << 24)

while line := sys.stdin.readline():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            upload(int(line), write)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as steps:
        kinds = steps.read().split()
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    outcome = "killed" if killed else "done" if status == 0 else f"failed({status})"
    print(outcome, kinds[-1] if kinds else "-", flush=True)
"""


def test_an_upload_killed_at_any_step_leaves_a_complete_version(
    store: TenantStore, tmp_path: Path
) -> None:
    old_version, old_path = store.current("acme")
    old_bytes = (old_path / "model.onnx").read_bytes()
    new_dir = tiny_model(tmp_path / "new", ["p", "q"], seed=1)
    new_bytes = (new_dir / "model.onnx").read_bytes()
    new = archive(new_dir, tmp_path / "new.tar.gz")
    killed_at: dict[int, str] = {}
    driver = subprocess.Popen(
        [sys.executable, "-c", KILL_AT_STEP, str(store.root), str(new)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with driver:  # its stdin closed at the end: the driver's loop ends, and it is waited for
        assert driver.stdin is not None and driver.stdout is not None
        for kill_at in range(1, 300):
            driver.stdin.write(f"{kill_at}\n")
            driver.stdin.flush()
            outcome, kind = driver.stdout.readline().split()
            if outcome == "done":  # the upload finished before reaching this step
                break
            assert outcome == "killed", (kill_at, outcome)
            killed_at[kill_at] = kind
            # Whatever the step, the tenant has one complete version: the old, or the new once the
            # atomic switch happened. Never a missing, partial or mixed one: it loads, and its
            # model is byte for byte the one that was published.
            version, path = store.current("acme")
            model = load("acme", version, path)
            if version == old_version:
                assert model.labels == ["a", "b"], kill_at
                assert (path / "model.onnx").read_bytes() == old_bytes, kill_at
            else:
                assert model.labels == ["p", "q"], kill_at
                assert (path / "model.onnx").read_bytes() == new_bytes, kill_at
        else:
            pytest.fail(f"the upload took more than {kill_at} filesystem steps: raise the bound")
    print(f"upload killed at each of its {len(killed_at)} filesystem steps: {killed_at}")
    kinds = set(killed_at.values())
    # The crash points were really exercised, extraction's own writes among them.
    assert {"extract-write", "mkdir", "fsync", "rename", "symlink", "replace"} <= kinds, kinds
    # What the killed processes left behind is cleaned up, and the next upload works.
    store.clean_staging(older_than_s=0)
    assert registry.upload(store, "acme", new, 1 << 24).labels == ["p", "q"]
