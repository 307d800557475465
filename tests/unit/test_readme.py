"""README and Makefile cannot drift: the README's commands are real targets that dry-run cleanly."""

from __future__ import annotations

import re
import subprocess

from testkit.processes import ROOT

README = (ROOT / "README.md").read_text()


def first_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_opens_with_make_serve_then_make_test() -> None:
    assert first_block() == ["make serve", "make test"]
    assert README.index("make serve") < README.index("make test") < README.index("curl ")


def test_every_make_target_the_readme_names_exists_and_dry_runs() -> None:
    targets = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)\b", README)) | set(
        re.findall(r"`([a-z][a-z0-9-]*)`", README.split("## Make targets")[1])
    )
    assert {"serve", "test", "models", "parity", "help"} <= targets | {"help"}
    for target in sorted(targets):
        proc = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, f"make -n {target}: {proc.stderr}"


def test_make_serve_and_test_run_what_the_readme_says() -> None:
    serve = subprocess.run(["make", "-n", "serve"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "models.build" in serve and "bentoml serve ." in serve and "--port 3000" in serve
    test = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "models.build" in test and "pytest" in test


def test_make_help_lists_the_targets() -> None:
    out = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    for target in ("serve", "test", "models", "parity"):
        assert f"make {target}" in out
