"""The README's examples, run against the real graph: every curl command and every Python client
block (a TF Serving block, aimed at a runner's own port, runs in test_runner.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from testkit.processes import ROOT

README = (ROOT / "README.md").read_text()


def curl_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("curl "):
                commands.append(command.strip())
    return commands


def python_blocks(port: int) -> list[str]:
    """The README's Python blocks aimed at ``localhost:PORT``."""
    return [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if f"localhost:{port}" in b]


def run_python_block(block: str, url: str, port: int) -> str:
    """Run a README block as a user would (its own process), aimed at ``url``; its output."""
    code = block.replace(f"http://localhost:{port}", url)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/tmp"
    )
    assert proc.returncode == 0, (block, proc.stderr[-2000:])
    # Each block prints what it got and says in a comment what that should be.
    expected = re.search(r"# (.+)\s*$", block.strip()).group(1)
    assert proc.stdout.strip() == expected, (block, proc.stdout)
    return proc.stdout


def test_readme_python_clients_work(graph: str) -> None:
    blocks = python_blocks(3000)
    # The openai SDK, bentoml.SyncHTTPClient and the cohere SDK (on the demo reranker).
    assert len(blocks) == 3 and sum("import cohere" in block for block in blocks) == 1
    for block in blocks:
        run_python_block(block, graph, 3000)


def test_readme_curl_examples_work(graph: str) -> None:
    commands = curl_commands()
    assert len(commands) == 10
    port = graph.rsplit(":", 1)[1]
    for command in commands:
        command = command.replace("localhost:3000", f"127.0.0.1:{port}").replace(
            "curl -s ", "curl -sf ", 1
        )
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (command, proc.stderr)
        body = json.loads(proc.stdout)
        assert body, command
        if "/similarity" in command:
            assert abs(body["scores"][0] - 0.755) < 0.01
        if "/classify" in command:
            assert body["intents"] == ["order_status", "greeting"]
        if "/predict" in command:  # what the README says the demo intent classifier answers
            best = [labels[0]["label"] for labels in body["predictions"]]
            assert best == ["reset_password", "order_status"] and len(body["predictions"][0]) == 24
        if "/rerank" in command:  # what the README says the demo reranker answers
            assert [r["index"] for r in body] == [1, 0]
