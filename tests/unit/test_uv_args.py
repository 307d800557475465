"""`make install` gives uv what pip's configuration says (tools/uv_args.py): uv reads none of it,
and a missed local wheel or constraint would install something else."""

from __future__ import annotations

import os
import subprocess
import sys

from testkit.processes import ROOT
from tools.uv_args import arguments, settings

LISTING = """\
:env:.find-links='/opt/wheels'
:env:.default-timeout='180'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/elsewhere'
global.index-url='https://index.example/simple'
install.index-url='https://mirror.example/simple'
freeze.find-links='/not-for-install'
global.no-index='false'
"""


def test_each_key_takes_pips_own_precedence() -> None:
    assert settings(LISTING) == {
        "find-links": "/opt/wheels",  # the environment over the files
        "constraint": "/etc/pip/constraints.txt",
        "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
        "index-url": "https://mirror.example/simple",  # [install] over [global]
        "no-index": "false",
    }


def test_every_value_of_a_list_is_its_own_argument_and_extra_indexes_take_the_best_version() -> (
    None
):
    args = arguments(settings(LISTING))
    assert args[args.index("--find-links") + 1] == "/opt/wheels"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--extra-index-url"] == [
        "file:///opt/a/simple",
        "file:///opt/b/simple",
    ]
    # pip takes the best version any index offers; uv's default stops at the first that has it
    assert args[-2:] == ["--index-strategy", "unsafe-best-match"]
    assert "--cert" not in args and "/not-for-install" not in args and "--no-index" not in args


def test_no_configuration_gives_no_arguments() -> None:
    assert arguments(settings("")) == []


def test_a_list_on_several_lines_and_an_empty_value_read_as_pip_reads_them() -> None:
    # pip.conf's usual form of several indexes, one a line, as `pip config list` prints it; and
    # an empty PIP_FIND_LINKS, which pip skips (the file's value stands)
    listing = (
        "global.extra-index-url='\\nfile:///x/simple\\nfile:///y/simple'\n"
        "global.find-links='/opt/wheels'\n:env:.find-links=''\n:env:.no-index='yes'\n"
    )
    assert settings(listing) == {
        "extra-index-url": "file:///x/simple file:///y/simple",
        "find-links": "/opt/wheels",
        "no-index": "yes",
    }
    args = arguments(settings(listing))
    assert args[:4] == [
        "--extra-index-url",
        "file:///x/simple",
        "--extra-index-url",
        "file:///y/simple",
    ]
    assert "--no-index" in args and args[args.index("--find-links") + 1] == "/opt/wheels"


def test_the_command_reads_this_machines_pip() -> None:
    """Run as `make install` runs it: whatever pip's environment sets reaches uv."""
    env = {**os.environ, "PIP_FIND_LINKS": "/a-wheel-folder"}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.uv_args"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[lines.index("--find-links") + 1] == "/a-wheel-folder"
