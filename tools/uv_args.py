"""pip's configuration as ``uv pip install`` arguments (``make install``).

uv installs the same pinned packages as pip, several times faster, but reads none of pip's
configuration files or ``PIP_*`` variables. A machine that points pip at a local wheel (a CPU
build of torch, where the index's default build is the CUDA one), a constraints file or other
indexes must give uv the same, or uv resolves to something else. This prints them, one argument a
line, for the keys uv shares with pip; the rest of pip's settings do not change what is installed.

    python -m tools.uv_args [PIP]     (PIP: the pip to ask, default ``python -m pip``)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

# pip key -> uv option; every value is a whitespace-separated list, as in pip's files
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# pip's precedence, lowest first: the install command's own section overrides [global], and the
# environment (PIP_*, listed as section ``:env:``) overrides both
SECTIONS = ("global", "install", ":env:")
LINE = re.compile(r"^(?P<section>[^.]*)\.(?P<key>[a-z-]+)=(?P<value>.*)$")


def settings(listing: str) -> dict[str, str]:
    """The value pip uses for each key of ``OPTIONS``, from ``pip config list``'s
    ``section.key='value'`` lines (where two files set one key, the one listed last)."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        match = LINE.match(line.strip())
        if not match or match["key"] not in OPTIONS or match["section"] not in SECTIONS:
            continue
        rank = SECTIONS.index(match["section"])
        if match["key"] not in chosen or rank >= chosen[match["key"]][0]:
            chosen[match["key"]] = (rank, " ".join(shlex.split(match["value"])))
    return {key: value for key, (_, value) in chosen.items()}


def arguments(found: dict[str, str]) -> list[str]:
    """uv's arguments for pip's ``found`` settings. With other indexes pip takes the best version
    any of them offers; uv's default takes the first index that has the package at all."""
    args = [arg for key, value in found.items() for v in value.split() for arg in (OPTIONS[key], v)]
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
