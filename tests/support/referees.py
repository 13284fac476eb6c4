"""The referee tiers (the real vLLM, the app in Chromium, kill-and-resume soaks) never miss a run silently: at the end
of any run, one line per tier whose tests were skipped (how many, and why: what is absent), and one line when a `-m`
left tiers out (the README's test command does: pyproject.toml's addopts), naming the command that runs them.

A pytest plugin: tests/conftest.py takes its hooks. Under pytest-xdist the workers collect and deselect, so each
worker sends its count of deselected referee tests to the controller (`workeroutput`), which prints them; skips
reach the controller as reports, with their markers in `keywords`.
"""
from __future__ import annotations

from collections import Counter

import pytest

TIERS = {"vllm": "vLLM", "browser": "browser", "soak": "kill-and-resume"}  # a test of several counts in the first
COMMAND = 'python -m pytest -q -m "vllm or browser or soak"'
_DESELECTED = pytest.StashKey[Counter]()


def tier(keywords) -> str | None:
    """The referee tier of a test (by its markers, as an item's or a report's keywords hold them), or None."""
    return next((t for t in TIERS if t in keywords), None)


def pytest_configure(config) -> None:
    config.stash[_DESELECTED] = Counter()


def pytest_deselected(items) -> None:
    for item in items:
        if (t := tier(item.keywords)) is not None:
            item.config.stash[_DESELECTED][t] += 1


def pytest_sessionfinish(session) -> None:
    output = getattr(session.config, "workeroutput", None)  # an xdist worker: hand the count to the controller
    if output is not None:
        output["referees_deselected"] = dict(session.config.stash[_DESELECTED])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: every worker collects (and deselects) the same tests, so one worker's count is the run's."""
    counts = getattr(node, "workeroutput", {}).get("referees_deselected")
    if counts:
        node.config.stash[_DESELECTED] = Counter(counts)


def _reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def summary_lines(skipped: list, deselected: Counter, markexpr: str) -> list[str]:
    """The lines (skipped: reports; deselected: tests per tier; markexpr: the run's -m)."""
    lines = []
    reasons: dict[str, Counter] = {t: Counter() for t in TIERS}
    for report in skipped:
        if (t := tier(report.keywords)) is not None:
            reasons[t][_reason(report)] += 1
    for t, why in reasons.items():
        if why:
            (reason, _), others = why.most_common(1)[0], len(why) - 1
            more = f" (and {others} other reason{'s' * (others > 1)})" if others else ""
            lines.append(f"{sum(why.values())} {TIERS[t]} tests skipped: {reason}{more}; see the README's referee "
                         "command")
    if deselected:
        parts = ", ".join(f"{deselected[t]} {TIERS[t]}" for t in TIERS if deselected[t])
        by = f"-m {markexpr!r}" if markexpr else "the selection"
        lines.append(f"{sum(deselected.values())} referee tests did not run ({parts}: left out by {by}); "
                     f"{COMMAND} runs them (README)")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = summary_lines(terminalreporter.stats.get("skipped", []), config.stash.get(_DESELECTED, Counter()),
                          config.option.markexpr)
    for line in lines:
        terminalreporter.write_line(line, yellow=True)
