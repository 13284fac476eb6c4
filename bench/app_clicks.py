"""Click times of the app in a real browser, and its tables at 1280 px: `streamlit run app.py` (headless, a free
port) driven in headless Chromium through a fixed script of clicks on every page (latency table, batch size, tree
on display, acceptance model, budget, a tree node, tabs, calibration split, trade-offs inputs and tabs, page
changes). Each click is timed from its first press (mouse or key; not Selenium's finding of the element) until the
script run it set off has finished and the browser painted it (Streamlit's own run state, tests/support/browser.py):
first on a fresh server (nothing cached), then repeated in a new session (the server's caches warm). The server's
own time per run ($WORKBENCH_APP_TIMINGS) is beside it: the rest is the browser and the transfer. Then, at 1280 x
900 with every expander open and each tab in turn, every table on every page is checked for cut columns (a
horizontal scroll bar, or columns past the window) and every page for sideways overflow.

    python bench/app_clicks.py                          # the committed calibration and results (what the demo shows)
    python bench/app_clicks.py --passes 3 --out /tmp/clicks.json
    python bench/app_clicks.py --calibration-root DIR --results-root DIR

Prints a table and writes JSON (--out) with the setting (provenance.setting: CPU, threads, load average, versions),
the load average before and after, the server's CPU time and thread count, the streamlit/selenium/Chromium versions.
Nothing asserts a time: the target (every click under 1 s) is for an idle machine, and `loaded` says whether this
one was.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.cli.shared import ScriptParser, run_script  # noqa: E402
from workbench.core.provenance import describe, load_average, loaded, setting  # noqa: E402
from tests.support import browser as ui  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "app-clicks.json"
WINDOW = (1280, 900)
PAGES = {"tree": "Tree designer", "calibration": "Calibration", "tradeoffs": "Trade-offs", "live": "Live decode"}
OPTIMIZER = "the optimizer's (sidebar settings)"


@dataclass
class Click:
    """One user move: `act` is timed; `prepare` (opening a list) is not; `skip` says why it cannot be made here
    (a widget this data does not draw), checked before `prepare`."""

    page: str
    name: str
    act: Callable[[], None]
    prepare: Callable[[], None] | None = None
    skip: Callable[[], str | None] | None = None


# ----------------------------------------------------------------------------------------------- the user's moves

def choice(driver, label: str, pick: Callable[[list[str], str], str]) -> tuple[Callable, Callable, Callable]:
    """(skip, prepare, act) for a selectbox: prepare opens its list and finds the option pick(options, current)
    names; act clicks it."""
    from selenium.webdriver.common.by import By

    found: dict = {}

    def skip():
        try:  # a page just opened may draw its sidebar in a run after the first: a few seconds' grace
            ui.wait(driver, lambda: ui.select(driver, label), timeout=5, every=0.1, what=label)
        except AssertionError:  # the selectbox is not drawn with this data
            return f"no selectbox {label!r} on this page"
        return None

    def prepare():
        box = ui.select(driver, label)
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
        current = box.get_attribute("value")
        box.click()
        opts = ui.wait(driver, lambda: driver.find_elements(By.CSS_SELECTOR, '[role="option"]'), timeout=20,
                       what=f"the options of {label}", every=0.05)
        want = pick([o.text for o in opts], current)
        found["option"] = next(o for o in opts if o.text == want)
        found["text"] = want

    return skip, prepare, lambda: found["option"].click()


def other(options: list[str], current: str) -> str:
    """The first option that is not the current one."""
    return next(o for o in options if o != current)


def first(options: list[str], current: str) -> str:
    return options[0]


def starting(prefix: str):
    return lambda options, current: next(o for o in options if o.startswith(prefix))


def radio_exists(driver, text: str):
    from selenium.webdriver.common.by import By

    def skip():
        if not any(o.text == text for o in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stRadioOption"]')):
            return f"no radio option {text!r}"
        return None
    return skip


def slider_exists(driver, label: str):
    def skip():
        try:
            box = ui.range_input(driver, label)
        except Exception:  # noqa: BLE001
            return f"no slider {label!r}"
        return "disabled" if box.get_attribute("disabled") else None
    return skip


def found_then_clicked(find: Callable) -> tuple[Callable, Callable]:
    """(act, prepare) of a Click: prepare finds the element (WebDriver round trips a user does not make; untimed),
    act only clicks it."""
    held: dict = {}

    def prepare():
        held["element"] = find()
    return lambda: held["element"].click(), prepare


def nav_click(driver, title: str) -> tuple[Callable, Callable]:
    return found_then_clicked(lambda: ui.nav_link(driver, title))


def radio_click(driver, text: str) -> tuple[Callable, Callable]:
    from selenium.webdriver.common.by import By

    return found_then_clicked(lambda: next(o for o in driver.find_elements(By.CSS_SELECTOR,
                                                                        '[data-testid="stRadioOption"]')
                                           if o.text == text))


def tab_click(driver, label: str) -> tuple[Callable, Callable]:
    from selenium.webdriver.common.by import By

    return found_then_clicked(lambda: next(t for t in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stTab"]')
                                           if t.text.strip() == label))


def clicks(driver) -> list[Click]:
    """The fixed script: every page, its main inputs changed and changed back (so a second pass asks the same
    questions again), page changes by the sidebar links."""
    from selenium.webdriver.common.keys import Keys

    out: list[Click] = []

    def pick(page, name, label, how):
        skip, prepare, act = choice(driver, label, how)
        out.append(Click(page, name, act, prepare, skip))

    lat = "... or a latency CSV found here"
    pick("tree", "batch size: another", "batch size", other)  # before the latency table changes: it may have one
    pick("tree", "batch size: back to the first", "batch size", first)
    pick("tree", "latency table: another", lat, other)
    pick("tree", "latency table: back to the first", lat, first)
    pick("tree", "tree on display: a reference", "Tree on display (drawn, masked, exported)", starting("reference: "))
    pick("tree", "tree on display: the optimizer's", "Tree on display (drawn, masked, exported)", starting(OPTIMIZER))
    out.append(Click("tree", "acceptance model: empirical paths", *radio_click(driver, "empirical paths"),
                     skip=radio_exists(driver, "empirical paths")))
    out.append(Click("tree", "acceptance model: independence", *radio_click(driver, "independence"),
                     skip=radio_exists(driver, "independence")))
    out.append(Click("tree", "budget: one less", lambda: ui.slide(driver, "Budget (tree nodes)", Keys.ARROW_LEFT),
                     skip=slider_exists(driver, "Budget (tree nodes)")))
    out.append(Click("tree", "budget: one more", lambda: ui.slide(driver, "Budget (tree nodes)", Keys.ARROW_RIGHT),
                     skip=slider_exists(driver, "Budget (tree nodes)")))
    out.append(Click("tree", "a tree node (the figure alone reruns)",
                     lambda: ui.chart_point(driver, ui.chart_index(driver, " nodes, depth "), 3, click=True)))
    pick("tree", "compare with a reference", "Compare with", starting("reference: "))
    pick("tree", "compare with nothing", "Compare with", starting("(nothing)"))
    out.append(Click("tree", "tab: Tokens/step and speedup", *tab_click(driver, "Tokens/step and speedup")))
    out.append(Click("tree", "tab: Export", *tab_click(driver, "Export")))
    out.append(Click("calibration", "page: Calibration", *nav_click(driver, "Calibration")))
    out.append(Click("calibration", "prompts: holdout", *radio_click(driver, "holdout"),
                     skip=radio_exists(driver, "holdout")))
    out.append(Click("calibration", "prompts: fit", *radio_click(driver, "fit"), skip=radio_exists(driver, "fit")))
    out.append(Click("tradeoffs", "page: Trade-offs", *nav_click(driver, "Trade-offs")))
    pick("tradeoffs", "batch size: another", "batch size", other)
    pick("tradeoffs", "batch size: back to the first", "batch size", first)
    pick("tradeoffs", "latency table: another", lat, other)
    pick("tradeoffs", "latency table: back to the first", lat, first)
    pick("tradeoffs", "sweep: another", "... or a sweep CSV found here", other)
    pick("tradeoffs", "sweep: back to the first", "... or a sweep CSV found here", first)
    for label in ("Sweep (Fig. 4)", "Latency and speedup", "Plan per batch size"):  # each one away from the open
        out.append(Click("tradeoffs", f"tab: {label}", *tab_click(driver, label)))
    out.append(Click("live", "page: Live decode", *nav_click(driver, "Live decode")))
    out.append(Click("tree", "page: Tree designer", *nav_click(driver, "Tree designer")))
    return out


# ----------------------------------------------------------------------------------------------- measuring

def server_seconds(log: Path, since: int) -> tuple[float | None, int]:
    """The server's run time ($WORKBENCH_APP_TIMINGS lines) logged after line `since`: its page runs (a fragment
    drawn inside a page run is part of it), else its fragment runs; and the new line count."""
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("[workbench-app]")]
    new = [ln for ln in lines[since:] if re.search(r" [\d.]+ s$", ln)]
    runs = [ln for ln in new if ln.startswith("[workbench-app] page ")] or new
    found = [float(ln.rsplit(" ", 2)[1]) for ln in runs]
    return (sum(found) if found else None), len(lines)


def process_cpu(pid: int) -> tuple[float | None, int | None]:
    """(CPU seconds user + system, threads) of a process, from /proc (None where unreadable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        threads = int(re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))
        return cpu, threads
    except (OSError, ValueError, AttributeError):
        return None, None


def run_pass(driver, url: str, log: Path, number: int, progress=print) -> list[dict]:
    """One pass of the script in a new session; every click's time, the server's, and any error on the page."""
    rows = []
    _, seen = server_seconds(log, 0)
    res = ui.timed_open(driver, f"{url}/tree", PAGES["tree"])
    srv, seen = server_seconds(log, seen)
    rows.append(dict(page="tree", click="open /tree", pass_=number, **res, server_seconds=srv,
                     errors=ui.errors(driver)))
    for c in clicks(driver):
        why = c.skip() if c.skip else None
        if why:
            rows.append(dict(page=c.page, click=c.name, pass_=number, seconds=None, runs=0, server_seconds=None,
                             errors=[], skipped=why))
            progress(f"pass {number}: {c.page:<11} {c.name:<42} skipped ({why})")
            continue
        _, seen = server_seconds(log, 0)
        try:
            if c.prepare:
                c.prepare()
            res = ui.timed_click(driver, c.act)
            if c.name.startswith("page: "):
                ui.wait(driver, lambda: ui.heading_is(driver, PAGES[c.page]), what=f"the page {c.page}")
        except Exception as e:  # noqa: BLE001 - one click that cannot be made is reported, the rest still run
            from selenium.webdriver.common.keys import Keys

            rows.append(dict(page=c.page, click=c.name, pass_=number, seconds=None, runs=0, server_seconds=None,
                             errors=[f"the click failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"]))
            progress(f"pass {number}: {c.page:<11} {c.name:<42} FAILED ({type(e).__name__})")
            driver.switch_to.active_element.send_keys(Keys.ESCAPE)  # close a list left open
            ui.settled(driver)
            continue
        srv, seen = server_seconds(log, seen)
        rows.append(dict(page=c.page, click=c.name, pass_=number, **res, server_seconds=srv,
                         errors=ui.errors(driver)))
        shown = "no rerun" if res["seconds"] is None else f"{res['seconds']:.2f} s"
        progress(f"pass {number}: {c.page:<11} {c.name:<42} {shown}")
    return rows


def check_tables(driver, url: str) -> dict:
    """{page: {"cut": [...], "overflow_px": n}} at the window size, every expander open; the designer also while
    comparing two trees (it adds two tables)."""
    def look() -> dict:
        ui.expand_all(driver)
        ui.settled(driver)
        return dict(cut=ui.cut_tables(driver), overflow_px=ui.page_overflow(driver), errors=ui.errors(driver))

    out = {}
    for path, heading in list(PAGES.items()) + [("tree, comparing", PAGES["tree"])]:
        try:
            ui.open_page(driver, f"{url}/{path.split(',')[0]}", heading)
            if path == "tree, comparing":
                ui.choose(driver, "Compare with", next(o for o in ui.options(driver, "Compare with")
                                                       if o.startswith("reference: ")))
            out[path] = look()
            for label in ui.tab_labels(driver)[1:]:  # a tab draws only while open: each one in turn
                ui.open_tab(driver, label)
                out[f"{path}, tab {label}"] = look()
        except Exception as e:  # noqa: BLE001 - reported, the other pages are still checked
            out[path] = dict(cut=[], overflow_px=None, errors=[f"could not check: {type(e).__name__}: {e}"[:300]])
    return out


def summary(rows: list[dict], passes: int) -> list[dict]:
    """One line per click: its time in each pass and the server's."""
    lines: dict = {}
    for r in rows:
        line = lines.setdefault((r["page"], r["click"]), dict(page=r["page"], click=r["click"], seconds={},
                                                              server_seconds={}, skipped=r.get("skipped")))
        line["seconds"][r["pass_"]] = r["seconds"]
        line["server_seconds"][r["pass_"]] = r["server_seconds"]
    return list(lines.values())


def table(lines: list[dict], passes: int) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    head = f"{'page':<11} {'click':<42} " + " ".join(f"{'pass ' + str(p):>7}" for p in range(1, passes + 1)) + \
        "  " + " ".join(f"{'srv ' + str(p):>7}" for p in range(1, passes + 1))
    out = [head, "-" * len(head)]
    for ln in lines:
        if ln["skipped"]:
            out.append(f"{ln['page']:<11} {ln['click']:<42} skipped: {ln['skipped']}")
            continue
        out.append(f"{ln['page']:<11} {ln['click']:<42} "
                   + " ".join(f"{fmt(ln['seconds'].get(p)):>7}" for p in range(1, passes + 1)) + "  "
                   + " ".join(f"{fmt(ln['server_seconds'].get(p)):>7}" for p in range(1, passes + 1)))
    return "\n".join(out)


def versions(driver) -> dict:
    def v(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    return dict(python=platform.python_version(), streamlit=v("streamlit"), selenium=v("selenium"),
                plotly=v("plotly"), pandas=v("pandas"), chromium=driver.capabilities.get("browserVersion"))


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=2, help="passes over the clicks: 1 on a fresh server, the rest "
                                                          "repeat it with warm caches (default 2)")
    ap.add_argument("--calibration-root", help="calibration folders (default: the app's, calibration/)")
    ap.add_argument("--results-root", help="sweep and latency CSVs (default: the app's, docs/results/)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="JSON (default bench/results/app-clicks.json)")
    return run_script(ap, _run, argv)


def _run(args) -> int:
    if args.passes < 1:
        print(f"error: --passes {args.passes}: give 1 or more (1 = the uncached clicks only)", file=sys.stderr)
        return 2
    for flag, value in (("--calibration-root", args.calibration_root), ("--results-root", args.results_root)):
        if value is not None and not Path(value).is_dir():
            print(f"error: {flag} {value}: not a folder; give the folder the app should read", file=sys.stderr)
            return 2
    why = ui.missing_browser()
    if why is None and importlib.util.find_spec("selenium") is None:  # a dev dependency: the tests fail without it
        why = "selenium is not installed (pip install -e '.[dev]')"
    if why:
        print(f"error: no browser to drive: {why}", file=sys.stderr)
        return 2
    env = dict(WORKBENCH_APP_TIMINGS="1")
    if args.calibration_root:
        env["WORKBENCH_CALIBRATION_ROOT"] = str(Path(args.calibration_root).resolve())
    if args.results_root:
        env["WORKBENCH_RESULTS_ROOT"] = str(Path(args.results_root).resolve())
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    where = setting("cpu", "n/a", threads, compiled=False, mode="app-clicks")
    load_before = load_average(every=True) or []
    print(f"setting: {describe(where)}; load average {', '.join(f'{x:.2f}' for x in load_before)}")
    with tempfile.TemporaryDirectory(prefix="app-clicks-") as tmp:
        tmp = Path(tmp)
        log = tmp / "streamlit.log"
        try:
            with ui.app_server(env, log) as (url, proc):
                driver = ui.chromium(tmp / "profile", width=WINDOW[0], height=WINDOW[1])
                try:
                    rows, cpu = [], []
                    for p in range(1, args.passes + 1):
                        before, _ = process_cpu(proc.pid)
                        rows += run_pass(driver, url, log, p)
                        after, threads_now = process_cpu(proc.pid)
                        cpu.append(dict(pass_=p, server_cpu_seconds=None if before is None else after - before,
                                        server_threads=threads_now))
                    tables = check_tables(driver, url)
                    info = versions(driver)
                finally:
                    driver.quit()
        except (RuntimeError, AssertionError) as e:
            print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 1
    load_after = load_average(every=True) or []
    lines = summary(rows, args.passes)
    print(table(lines, args.passes))
    timed = [ln for ln in lines if not ln["skipped"]]
    for p in range(1, args.passes + 1):
        got = [ln["seconds"][p] for ln in timed if ln["seconds"].get(p) is not None]
        if got:
            print(f"pass {p}: {len(got)} clicks, median {statistics.median(got):.2f} s, max {max(got):.2f} s, "
                  f"{sum(g > 1 for g in got)} over 1 s")
    cut = {page: t for page, t in tables.items() if t["cut"] or (t["overflow_px"] or 0) > 1}
    print("tables at {}x{}: ".format(*WINDOW) + ("no cut columns on any page" if not cut else
                                                  "; ".join(f"{page}: {t['cut']} overflow {t['overflow_px']} px"
                                                            for page, t in cut.items())))
    errs = [(r["page"], r["click"], e) for r in rows for e in r["errors"]]
    for page, name, e in errs[:5]:
        print(f"error on {page} after {name!r}: {e[:300]}")
    result = dict(setting=where, loaded=loaded(where), load_average_before=list(load_before),
                  load_average_after=list(load_after), window=list(WINDOW), versions=info, passes=args.passes,
                  server=cpu, clicks=lines, runs=rows, tables=tables, errors=len(errs),
                  note="seconds: from the click's first press until the script run it set off finished and the "
                       "browser painted it; pass 1 on a fresh server (uncached), later passes in a new session "
                       "with the server's caches warm; server_seconds: the app's own run time ($WORKBENCH_APP_TIMINGS)")
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
