"""Shared widgets of the app's pages: file and accuracy inputs, sliders, cached readers, error text.

Every page reads its inputs through these, so an upload, a found file and a typed path behave alike on each page,
and each file is read once per version (its modification time and size are in every cache key). Bad input is
an `st.error` naming the problem, never a crash.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench.calibrate import folder as calibration
from workbench.calibrate.folder import Calibration, list_calibrations
from workbench.calibrate.served import Served, list_served
from workbench.core.io import find_csvs
from workbench.core.notes import flag, worded
from workbench.measure.latency_file import LATENCY_REQUIRED, read_latency
from workbench.measure.sweep_file import SWEEP_REQUIRED, read_sweep
from workbench.plan.fastest import fastest, value_source
from workbench.trees.accuracies import read_accuracies

UPLOAD_DIR = Path(tempfile.gettempdir()) / "workbench-app"
EXAMPLE_CSV = "head,rank,accuracy\n1,1,0.55\n1,2,0.12\n1,3,0.05\n2,1,0.30\n2,2,0.10\n2,3,0.05\n"


def calibration_root() -> Path:
    return calibration.calibration_root(REPO_ROOT / "calibration")


def results_root() -> Path:
    """Where sweep CSVs are looked for: $WORKBENCH_RESULTS_ROOT (default: docs/results/ in this checkout)."""
    return Path(os.environ.get("WORKBENCH_RESULTS_ROOT") or REPO_ROOT / "docs" / "results")


def calibration_folders() -> list[Path]:
    return list_calibrations(calibration_root())


def served_folders() -> list[Path]:
    """The served calibrations (vLLM's counters, any drafter) under the calibration root and the results' served/."""
    return list_served((calibration_root(), results_root() / "served"))


def file_stamp(path) -> tuple:
    """(modification time in ns, size) of a file, or of every file in a folder (() if missing): part of every
    cache key, so an edited, replaced or grown file is read again, never served from the cache."""
    p = Path(path)
    if p.is_dir():
        return tuple((f.name, *file_stamp(f)) for f in sorted(p.iterdir()) if f.is_file())
    try:
        st_ = p.stat()
    except OSError:
        return ()
    return st_.st_mtime_ns, st_.st_size


def stamped(paths) -> tuple:
    """((path, stamp), ...) of files: one cache key for a set of files."""
    return tuple((str(p), file_stamp(p)) for p in paths)


# the sidebar's controls (ui/inputs.shared_inputs, on every page) by the request field a library error names
SIDEBAR = {"calibration": "Calibration", "latency": "latency CSV"}


def app_names(labels: dict[str, str] | None = None):
    """How the app names a request's field (core.notes): by its control's label, the sidebar's (SIDEBAR) and the
    page's `labels`; a field no control sets keeps its flag's name."""
    names = SIDEBAR | (labels or {})
    return lambda f: f"'{names[f]}'" if f in names else flag(f)


def clean_error(err: Exception, labels: dict[str, str] | None = None) -> str:
    """An error message naming an upload by its file name, not by the hash folder it was written to, and a
    request's field (core.notes.FieldError) by its control's label (app_names)."""
    text = worded(err, app_names(labels))
    return re.sub(re.escape(str(UPLOAD_DIR) + os.sep) + r"[0-9a-f]+" + re.escape(os.sep), "", text)


def portable_path(path) -> str:
    """A path as an exported file may carry it: relative to the repository when inside it, else its name (a server's
    absolute path is no use to whoever downloads the file, and reveals the server's layout)."""
    p = Path(path)
    try:
        return p.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return p.name


def relative_paths(text: str) -> str:
    """A download's text with this checkout's absolute paths made relative to it (an engine config names the heads'
    folder by its absolute path on the server: no use on another machine, and it reveals the server's layout)."""
    return text.replace(str(REPO_ROOT) + os.sep, "")


def shown_path(path) -> str:
    """A path as the app shows it in an input: relative to the repository when inside it (the server's layout is
    none of the page's business), else as it is."""
    p = Path(path)
    try:
        return p.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(p)


def resolved(path: str) -> Path:
    """A typed path: as typed when it exists (relative to the server's working folder), else from the repository."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else REPO_ROOT / p


@contextmanager
def timed(what: str):
    """Server time of one page run or fragment run, printed to stderr as `[workbench-app] WHAT 0.123 s` when
    $WORKBENCH_APP_TIMINGS is set (the browser test reads them; nothing is printed otherwise)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if os.environ.get("WORKBENCH_APP_TIMINGS"):
            print(f"[workbench-app] {what} {time.perf_counter() - start:.3f} s", file=sys.stderr, flush=True)


def _stored(data: bytes, name: str) -> Path:
    """Bytes as a file on disk (the workbench readers take paths), in a folder named by their content hash."""
    folder = UPLOAD_DIR / hashlib.sha1(data).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.is_file():
        path.write_bytes(data)
    return path


def upload_path(upload) -> Path:
    """An uploaded file on disk, under its own file name."""
    return _stored(upload.getvalue(), Path(upload.name).name)


def _text_path(text: str, name: str) -> Path:
    """Pasted text as a file, like an upload."""
    return _stored(text.encode(), name)


@st.cache_resource(show_spinner="Reading the calibration...", max_entries=4)
def open_calibration(folder: str, stamp: tuple):
    """The calibration folder, opened once per version (it keeps what it reads); cache_resource: never copied."""
    cal = Calibration(folder)
    cal.path_probabilities("fit")  # read and checked here, under the spinner, not halfway through a page
    return cal


@st.cache_resource(max_entries=8)
def open_served(folder: str, stamp: tuple) -> Served:
    """A served calibration folder, opened and checked once per version (its errors name the sidebar's control)."""
    return Served(folder, "calibration")


@st.cache_data(max_entries=16)
def read_accuracy_file(path: str, stamp: tuple):
    return read_accuracies(path, return_counts=True)


@st.cache_data(max_entries=8)
def read_latency_file(path: str, stamp: tuple) -> pd.DataFrame:
    return read_latency(path)


@st.cache_data(max_entries=8)
def read_sweep_file(path: str, stamp: tuple) -> pd.DataFrame:
    return read_sweep(path)


@st.cache_data(max_entries=32, show_spinner=False)
def fastest_for(source_key: tuple, value_name: str, _value, _surface, tables, max_depth: int, max_rank: int,
                max_budget: int | None) -> dict:
    """plan's weighing (plan/fastest.py) of the trees optimal for path values `_value` (named by `value_name`:
    independence or empirical paths) on `_surface` at the picked batch size and context (`tables`, its surface.At:
    the cache key), once per accuracies (`source_key`), table and limits: {"best", "tree", "curve"} as fastest
    returns them."""
    return fastest(value_source(_value, max_depth, max_rank), _surface, tables, max_budget, curve=True)


@st.cache_resource(show_spinner=False, max_entries=1)
def load_model(model: str, heads: str, device: str):
    """(base, tokenizer, heads); one at a time, so switching models frees the last one."""
    from workbench.runtime.models import load_model_and_heads  # torch: imported when a model is loaded, not on every page

    return load_model_and_heads(model or None, heads or None, None if device == "auto" else device)


def found_csvs(kind: str) -> list[Path]:
    """Sweep or latency CSVs in the calibration folders and the results folder, recognised by their header."""
    return find_csvs((calibration_root(), results_root()), {"sweep": SWEEP_REQUIRED, "latency": LATENCY_REQUIRED}[kind])


def latency_files(src) -> list[Path]:
    """The latency CSVs a page offers, the calibration folder's own first (then the results folder's): the designer
    and the trade-offs page preselect the same one, so their recommendations agree. A served calibration's first:
    the engine's rounds with its drafter (served_surfaces)."""
    own = src.calib.latency_files() if src is not None and src.calib is not None else []
    found = found_csvs("latency")
    if src is not None and src.served is not None:
        own = served_surfaces(src.served, found)
    return list(dict.fromkeys(own + found))


@st.cache_data(max_entries=64, show_spinner=False)
def _setting_of(path: str, stamp: tuple) -> dict:
    """The engine, drafter and model a latency CSV's first row records ({} when unreadable), once per version."""
    try:
        row = pd.read_csv(path, nrows=1).iloc[0]
        setting = json.loads(row["setting"]) if isinstance(row.get("setting"), str) else {}
        return dict(engine=row.get("engine"), drafter=setting.get("drafter"), model=row.get("model"))
    except (OSError, ValueError, KeyError, IndexError, pd.errors.ParserError):
        return {}


def served_surfaces(served: Served, found: list[Path]) -> list[Path]:
    """The latency CSVs timed by the engine that served `served`, with its drafter on its model: in its folder first,
    then beside it by the longest name in common with it (`bench/served_plan.py` writes X-calibration beside
    X-latency.csv): the surface a served drafter was calibrated for, preselected; the others stay on offer."""
    m = served.meta
    want = dict(engine=m.get("engine"), drafter=m.get("method"), model=m.get("model"))
    mine = [f for f in found if _setting_of(str(f), file_stamp(f)) == want]
    folder = served.folder.resolve()

    def near(f: Path) -> tuple:  # in the folder, then beside it, then elsewhere; then the longest name in common
        where = f.resolve().parent
        return 0 if where == folder else 1 if where == folder.parent else 2, \
            -len(os.path.commonprefix([folder.name, f.stem])), str(f)

    return sorted(mine, key=near)


@dataclass
class Source:
    """Accuracies a page works on: acc[K, R] (a calibration's fit prompts) and, for a calibration folder, the
    opened workbench.calibrate.folder.Calibration; for a served one (`served`, calibrate/served.Served: a chain
    drafter vLLM ran), its conditional per-position acceptance as acc[K, 1] (source.chain_accuracies)."""

    acc: object
    label: str
    calib: object = None
    folder: str | None = None
    stamp: tuple = ()
    served: object = None

    @property
    def key(self) -> tuple:
        """What names these accuracies in a cache key: the folder and its stamp, or the table's own bytes."""
        return (self.folder, self.stamp) if self.folder is not None else (self.label, self.acc.tobytes())


OTHER_FILE = "other: type a path"


def _forget_upload(upload_key: str, kept_key: str) -> None:
    """Uploader callback: the user removed (or replaced) the file, so the kept copy goes too."""
    if st.session_state.get(upload_key) is None:
        st.session_state.pop(kept_key, None)


def kept_upload(label: str, upload_key: str, types: list[str]) -> Path | None:
    """An uploaded file on disk, kept (as `{upload_key}_kept`) until the user removes it or presses `forget`:
    Streamlit empties an uploader whenever its page is left, and coming back must not silently switch to another
    input while the other settings were kept."""
    kept_key = f"{upload_key}_kept"
    up = st.file_uploader(label, type=types, key=upload_key, on_change=_forget_upload, args=(upload_key, kept_key))
    if up is not None:
        path = upload_path(up)
        st.session_state[kept_key] = str(path)
        return path
    kept = st.session_state.get(kept_key)
    if not kept or not Path(kept).is_file():
        return None
    st.caption(f"using the uploaded {Path(kept).name} (kept from before)")
    if st.button(f"forget {Path(kept).name}", key=f"{upload_key}_forget_btn"):
        st.session_state.pop(kept_key, None)
        return None
    return Path(kept)


def file_input(label: str, key: str, types: list[str], found: list[Path] | None = None,
               paste: bool = False, default: Path | None = None) -> Path | None:
    """A file from an upload (kept across pages), one of the `found` files (a selectbox; `default` or the first
    preselected), a path typed in, or pasted text."""
    up = kept_upload(f"Upload {label}", f"{key}_upload", types)
    if up is not None:
        return up
    typed = ""
    if found:
        names = list(dict.fromkeys(str(f) for f in found)) + [OTHER_FILE]
        drop_stale(f"{key}_pick", names)
        pick = st.selectbox(f"... or a {label} found here", names, key=f"{key}_pick",
                            index=names.index(str(default)) if default is not None and str(default) in names else 0,
                            format_func=lambda f: f if f == OTHER_FILE else f"{Path(f).parent.name}/{Path(f).name}")
        if pick != OTHER_FILE:
            typed = pick
        else:
            typed = st.text_input(f"{label} path", key=f"{key}_path")
    else:
        typed = st.text_input(f"... or a {label} path", key=f"{key}_path")
    if paste:
        text = st.text_area(f"... or paste {label} text", key=f"{key}_paste", placeholder=EXAMPLE_CSV, height=110)
        if text.strip():
            return _text_path(text, "pasted.csv")
    return Path(typed.strip()) if typed.strip() else None


def slider(label: str, low: int, high: int, default: int, key: str, where=None, disabled: bool = False,
           help: str | None = None) -> int:
    """An integer slider whose kept value is first brought into low..high: a setting kept from a larger range (a
    budget of 63 when the latency table stops at 16 tokens) would otherwise raise StreamlitValueAboveMaxError.
    `disabled` with `help` saying why, when it does not apply to what is shown."""
    where = where or st.sidebar
    kept = st.session_state.get(key)
    if isinstance(kept, (int, float)) and not low <= kept <= high:
        st.session_state[key] = int(min(max(kept, low), high))
    if high <= low:  # sliders need two values
        where.caption(f"{label}: {low}" + (f" ({help})" if disabled and help else ""))
        return low
    return where.slider(label, low, high, min(max(default, low), high), key=key, disabled=disabled, help=help)


def int_slider(label: str, high: int, default: int, key: str, disabled: bool = False, help: str | None = None,
               where=None) -> int:
    """A 1..high slider (default: in the sidebar); a one-value range (one head, one rank) is a caption."""
    return slider(label, 1, high, default, key, where=where, disabled=disabled, help=help)


def figure(fig, caption: str | None = None) -> None:
    st.pyplot(fig)
    if caption:
        st.caption(caption)


def chart(fig, caption: str | None = None, key: str | None = None, on_select=None) -> None:
    """An interactive plotly figure (hover for values, drag to zoom; `on_select`: a click selects points) with its
    caption. Its title is written above it, so that in a narrow column a long title never runs under the chart's
    toolbar. Drawn without Streamlit's theme (it restyles every figure in the browser on each rerun, most of a
    click's time) and without a plotly template (serialising one doubles the server's cost per figure): a white
    plot area is set directly."""
    title = fig.layout.title.text
    if title:
        st.markdown(f"**{title}**")
        fig.update_layout(title=None, margin=dict(t=30))
    fig.update_layout(plot_bgcolor="white", xaxis_gridcolor="#ebebeb", yaxis_gridcolor="#ebebeb")
    if fig.layout.margin.autoexpand is not False:  # a figure that pins its margins is drawn once, not twice
        fig.update_xaxes(automargin=True)  # room for tick labels and the axis title (Streamlit's template has none)
        fig.update_yaxes(automargin=True)
    select = {} if on_select is None else dict(on_select=on_select, selection_mode="points")
    st.plotly_chart(fig, key=key, config={"displaylogo": False}, theme=None, **select)
    if caption:
        st.caption(caption)


def drop_stale(key: str, options, fallback=None) -> bool:
    """Replace a kept choice that is no longer among a widget's options (a removed node, a tree that stopped
    parsing) by `fallback` (default: drop it, the widget's default applies), before drawing it. Assigning the
    state, rather than deleting it, makes the browser show the value the page uses. True when it was stale."""
    if key in st.session_state and st.session_state[key] not in options:
        if fallback is None:
            del st.session_state[key]
        else:
            st.session_state[key] = fallback
        return True
    return False


def read_sweep_or_error(path: Path | None) -> pd.DataFrame | None:
    if path is None:
        return None
    try:
        return read_sweep_file(str(path), file_stamp(path))
    except WorkbenchError as e:
        st.error(clean_error(e))
        return None
