"""The measurement code stays in proportion to the serving code it measures: loadtests/ holds at
most LOADTESTS_MAX_LINES lines of Python, counted as ``wc -l`` counts them. A new figure pays for
its lines by folding what it repeats into what is already there."""

from __future__ import annotations

from testkit.processes import ROOT

LOADTESTS_MAX_LINES = 3200


def test_loadtests_holds_at_most_its_budget_of_python_lines() -> None:
    files = sorted((ROOT / "loadtests").rglob("*.py"))
    assert len(files) > 10  # the folder is where this test looks for it
    lines = {str(p.relative_to(ROOT)): p.read_bytes().count(b"\n") for p in files}
    total = sum(lines.values())
    largest = sorted(lines.items(), key=lambda item: -item[1])[:5]
    assert total <= LOADTESTS_MAX_LINES, f"{total} lines; the largest: {largest}"
