"""The README's curl examples, run against the real graph."""

from __future__ import annotations

import json
import re
import subprocess

from loadtests.processes import ROOT

README = (ROOT / "README.md").read_text()


def curl_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("curl "):
                commands.append(command.strip())
    return commands


def test_readme_curl_examples_work(graph: str) -> None:
    commands = curl_commands()
    assert len(commands) == 6
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
