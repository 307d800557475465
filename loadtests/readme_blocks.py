"""Generated blocks in loadtests/README.md: the text between two HTML-comment markers, read and
replaced in place (the benchmark's figures and the profile each have a pair)."""

from __future__ import annotations

from loadtests.processes import ROOT

README = ROOT / "loadtests" / "README.md"


def read(begin: str, end: str) -> str:
    """The block now between the markers, markers included."""
    text = README.read_text()
    return text[text.index(begin) : text.index(end) + len(end)]


def replace(begin: str, end: str, block: str) -> None:
    """Put ``block`` (markers included) where the block between the markers is."""
    text = README.read_text()
    start, stop = text.index(begin), text.index(end) + len(end)
    README.write_text(text[:start] + block + text[stop:])
