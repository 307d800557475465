"""pip's configuration as ``uv pip install`` arguments (``make install``).

uv installs the same pinned packages as pip, but reads none of pip's configuration files or
``PIP_*`` variables. A machine that points pip at a local wheel (a CPU build of torch, where the
index's default build is the CUDA one), a constraints file or other indexes must give uv the same,
or uv resolves to something else. This prints, one argument a line, uv's arguments for pip's
``index-url``, ``extra-index-url``, ``find-links``, ``constraint`` and ``no-index``.

Not passed: pip's ``cert`` (uv has no such argument; it reads ``SSL_CERT_FILE``), ``trusted-host``,
``pre``, ``only-binary``, ``no-binary`` and ``prefer-binary``: a machine that needs one of these
must give uv its own setting for it (``UV_*``).

    python -m tools.uv_args [PIP]     (PIP: the pip to ask, default ``python -m pip``)
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

# pip key -> uv option; a value is a list (whitespace or lines between its items, as in pip's files)
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
FLAGS = {"no-index": "--no-index"}  # pip key -> uv flag, given where pip's value is true
TRUE = {"1", "true", "yes", "on"}
# pip's precedence, lowest first: the install command's own section overrides [global], and the
# environment (PIP_*, listed as section ``:env:``) overrides both
SECTIONS = ("global", "install", ":env:")
LINE = re.compile(r"^(?P<section>[^.]*)\.(?P<key>[a-z-]+)=(?P<value>.*)$")


def settings(listing: str) -> dict[str, str]:
    """The value pip uses for each key of ``OPTIONS`` and ``FLAGS``, from ``pip config list``'s
    ``section.key='value'`` lines (the value as Python's repr; where two files set one key, the
    one listed last). An empty value is skipped, as pip skips it."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        match = LINE.match(line.strip())
        if not match or match["section"] not in SECTIONS:
            continue
        key = match["key"]
        if key not in OPTIONS and key not in FLAGS:
            continue
        value = " ".join(str(ast.literal_eval(match["value"])).split())
        if not value:
            continue
        rank = SECTIONS.index(match["section"])
        if key not in chosen or rank >= chosen[key][0]:
            chosen[key] = (rank, value)
    return {key: value for key, (_, value) in chosen.items()}


def arguments(found: dict[str, str]) -> list[str]:
    """uv's arguments for pip's ``found`` settings. With other indexes pip takes the best version
    any of them offers; uv's default takes the first index that has the package at all."""
    args = [
        arg
        for key, value in found.items()
        if key in OPTIONS
        for item in value.split()
        for arg in (OPTIONS[key], item)
    ]
    args += [FLAGS[key] for key, value in found.items() if key in FLAGS and value.lower() in TRUE]
    if "extra-index-url" in found:
        args += ["--index-strategy", "unsafe-best-match"]
    return args


def main(argv: list[str]) -> int:
    pip = argv or [sys.executable, "-m", "pip"]
    proc = subprocess.run([*pip, "config", "list"], capture_output=True, text=True)
    if proc.returncode:
        print(f"error: pip config list failed: {proc.stderr.strip()}", file=sys.stderr)
        return 1
    print("\n".join(arguments(settings(proc.stdout))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
