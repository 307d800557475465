"""The import layers in pyproject.toml hold, and a wrong import breaks them (what `make lint` runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.processes import BIN, ROOT

PACKAGES = ("serving", "services", "runners", "models", "tools", "loadtests", "testkit")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_tree_keeps_its_layers(tree: Path) -> None:
    proc = lint_imports(tree)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "3 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("services/tokenizer/text.py", "from runners.settings import RunnerSettings"),
        ("runners/onnx/service.py", "import services.tokenizer.settings"),
        ("serving/protocol.py", "from runners.tenants import store"),
        ("runners/tenants/registry.py", "from models import corpus"),
        ("models/corpus.py", "from runners.tenants import classifier"),
        ("services/tokenizer/schemas.py", "import transformers"),
    ],
)
def test_a_wrong_import_breaks_a_layer_contract(tree: Path, module: str, line: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately wrong\n")
    proc = lint_imports(tree)
    assert proc.returncode != 0, f"{module}: `{line}` was not caught\n{proc.stdout[-2000:]}"
    assert "BROKEN" in proc.stdout and module.removesuffix(".py").replace("/", ".") in proc.stdout


def test_code_repeated_across_the_serving_packages_fails_lint(tree: Path) -> None:
    """`make lint`'s duplicate-code check, with its flags: a block of the serving core copied into
    a service fails it. (That the whole tree passes it, `make lint` itself checks; here the files
    at stake only, in seconds.)"""
    original = "serving/batching/admission.py"

    def pylint(*files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "pylint"), "--disable=all", "--enable=duplicate-code",
             "--min-similarity-lines=6", "--ignore-imports=yes", "--score=no", *files],
            cwd=tree, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    assert pylint(original, "services/tokenizer/coalesce.py").returncode == 0
    source = (tree / original).read_text()
    block = source[source.index("    def admit(") : source.index("    def expired(")]
    (tree / "services" / "tokenizer" / "copied.py").write_text(f"class Copied:\n{block}")
    proc = pylint(original, "services/tokenizer/copied.py")
    assert proc.returncode != 0 and "duplicate-code" in proc.stdout, proc.stdout[-1500:]
