"""The Streamlit app through `streamlit.testing.v1.AppTest`: every page runs, the key widgets exist, the budget
slider changes the drawn tree, bad input is an st.error, and the live page decodes with a tiny random model.

The app runs against a small synthetic calibration folder written in the real format (ranks.parquet,
accuracies.csv, meta.json, latency and sweep CSVs), so the tests never depend on the committed demo data."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from helpers import fastest_on, make_calibration, make_current_sweep, make_latency, make_sweep, make_walk_files, plotly_values

from workbench import REPO_ROOT

# Not in the `unit` tier though no test here loads a model but the live page's: each runs app.py in Streamlit's
# script runner (seconds each, the two walks a minute each under load), and `-m unit` stays under a minute.
APP = REPO_ROOT / "app.py"
TIMEOUT = 60


@pytest.fixture(scope="session")
def demo_files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("app_calibration")
    cal = make_calibration(root / "synthetic")
    return dict(root=root, cal=cal, latency=make_latency(cal / "latency-cpu.csv"),
                sweep=make_sweep(cal / "sweep.csv"))


# ----------------------------------------------------------------------------------------------- helpers

def page(name: str, root: Path | None, monkeypatch, body: str | None = None) -> AppTest:
    """One page of app.py on its own (st.navigation cannot be switched to a callable page inside AppTest), or
    `body` (code using `app`) in its place."""
    if root is not None:
        monkeypatch.setenv("WORKBENCH_CALIBRATION_ROOT", str(root))
        monkeypatch.setenv("WORKBENCH_RESULTS_ROOT", str(root))
    script = (f"import importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('workbench_app', {str(APP)!r})\n"
              f"app = sys.modules.get('workbench_app')\n"
              f"if app is None:\n"
              f"    app = importlib.util.module_from_spec(spec)\n"
              f"    sys.modules['workbench_app'] = app\n"
              f"    spec.loader.exec_module(app)\n"
              + (body or f"app.{name}()\n"))
    return AppTest.from_string(script, default_timeout=TIMEOUT)


def tab(at: AppTest, label: str, key: str = "to_tab") -> AppTest:
    """Open one of a page's tabs (the trade-offs page's by default; only the open one is drawn, switching reruns),
    as a click does."""
    at.session_state[key] = label
    return at.run()


def charts(at: AppTest) -> set[str]:
    """The keys of the plotly charts a run drew."""
    return {c.proto.id.rsplit("-", 1)[-1] for c in at.get("plotly_chart")} if at.get("plotly_chart") else set()


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def metric(at: AppTest, label: str) -> str:
    found = [m.value for m in at.metric if m.label == label]
    assert found, f"no metric {label!r}: {[m.label for m in at.metric]}"
    return found[0]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def table(at: AppTest, column: str) -> pd.DataFrame:
    """The first dataframe on the page that has this column (the recommendation's candidates come first)."""
    found = [d.value for d in at.dataframe if column in d.value.columns]
    assert found, f"no table with a {column!r} column"
    return found[0]


# ----------------------------------------------------------------------------------------------- the app shell

def test_app_file_runs_with_navigation(demo_files, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CALIBRATION_ROOT", str(demo_files["root"]))
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    no_exception(at)
    assert at.title[0].value == "Tree designer"  # the default page


def test_no_calibration_is_an_info_not_a_crash(tmp_path, monkeypatch):
    at = page("tree_page", tmp_path, monkeypatch).run()
    no_exception(at)
    assert any("No calibration folder" in i.value for i in at.info)
    assert not at.metric


def test_only_the_app_package_imports_streamlit():
    """Every library module and the CLI import without streamlit; the app's pages (workbench.ui) bring it in."""
    _runs_in_a_fresh_python("import pkgutil, sys, importlib, workbench\n"
                            "mods = [m.name for m in pkgutil.walk_packages(workbench.__path__, 'workbench.')]\n"
                            "[importlib.import_module(m) for m in mods\n"
                            " if not m.startswith('workbench.ui') and not m.endswith('__main__')]\n"
                            "assert 'workbench.cli' in sys.modules and 'streamlit' not in sys.modules, "
                            "'streamlit imported'\n"
                            "import workbench.ui.tree_page\n"
                            "assert 'streamlit' in sys.modules\n")


def test_the_pages_open_without_torch():
    """app.py and every page import without torch or transformers (the first page is drawn seconds sooner); they
    come in only when a model is loaded (the live page's button, the designer's head tokens)."""
    _runs_in_a_fresh_python("import sys\n"
                            "import workbench.ui.tree_page, workbench.ui.tradeoffs_page, workbench.ui.calibration_page\n"
                            "import workbench.ui.live_page, workbench.ui.recommendation, workbench.ui.widgets\n"
                            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
                            "assert not heavy, f'imported {heavy}'\n"
                            "workbench.ui.live_page.live_page()  # drawn, no button pressed: still none\n"
                            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
                            "assert not heavy, f'the live page imported {heavy}'\n")


def test_the_plan_tab_exports_without_torch():
    """The trade-offs page's plan tab makes the plan and every engine's file on first view: none of it needs torch
    (importing it there made the tab's first click on a fresh server 1.76 s, 0.68 s without, on an idle Xeon)."""
    _runs_in_a_fresh_python("import json, sys\n"
                            "from workbench import WorkbenchError\n"
                            "from workbench.export.engines import PLAN_FORMATS, export_plan\n"
                            "from workbench.plan.plan_file import check_plan, plan_json\n"
                            "from workbench.plan.rank import make_plan\n"
                            "from workbench.plan.source import plan_source\n"
                            "cal = 'calibration/smollm2-135m-instruct-alpaca-eval'\n"
                            "plan = make_plan(plan_source(calibration=cal), cal + '/latency-cpu.csv', (1, 2, 4, 8))\n"
                            "plan = check_plan(json.loads(plan_json(plan)))\n"
                            "made = []\n"
                            "for fmt in PLAN_FORMATS:\n"
                            "    try:\n"
                            "        made.append(export_plan(plan, fmt)[0])\n"
                            "    except WorkbenchError:\n"
                            "        pass\n"
                            "assert any('smollm2-135m-instruct' in m for m in made), made\n"
                            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
                            "assert not heavy, f'imported {heavy}'\n")


def _runs_in_a_fresh_python(code: str) -> None:
    """`code` passes in a new interpreter (what a module imports shows only in a process that imported nothing)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


# ----------------------------------------------------------------------------------------------- tree designer

def test_tree_designer_budget_changes_tree(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    no_exception(at)
    assert at.selectbox(key="in_cal").value == str(demo_files["cal"])
    assert int(metric(at, "nodes")) == 63
    for key in ("tree_budget", "tree_depth", "tree_rank"):
        assert at.slider(key=key) is not None
    assert {b.label for b in at.download_button} == {"medusa", "json", "trtllm", "vllm", "eagle", "candidates CSV",
                                                    "answer JSON"}
    at.slider(key="tree_budget").set_value(10).run()
    no_exception(at)
    assert int(metric(at, "nodes")) == 10
    assert any("drawn tree: 10 nodes" in c.value for c in at.caption)
    at.slider(key="tree_depth").set_value(1).run()
    assert metric(at, "depth") == "1"


def test_tree_designer_models(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    ind = float(metric(at, "predicted_independent (tokens/step)"))
    assert any("irregular tree" in w.value for w in at.warning)  # the sparse optimum: vLLM would not draft it
    at.radio(key="tree_model").set_value("empirical paths").run()
    no_exception(at)
    assert not errors(at)
    emp_tree_emp = float(metric(at, "predicted_joint (tokens/step)"))
    assert emp_tree_emp > 1 and ind > 1
    at.radio(key="tree_model").set_value("dense per level (vLLM)").run()
    no_exception(at)
    from workbench.export.vllm import vllm_uniform
    from workbench.trees.tree import load_tree
    dense = load_tree(tree_file(at)["medusa_choices"])
    assert vllm_uniform(dense) and dense.nodes <= 63
    assert not any("irregular tree" in w.value for w in at.warning)  # the export's vLLM shape warning is gone
    at.radio(key="tree_model").set_value("hardware-aware").run()
    no_exception(at)
    assert not errors(at), errors(at)
    assert metric(at, "predicted speedup").endswith("x")
    assert 1 <= int(metric(at, "nodes")) <= 63
    assert tree_file(at)["name"] == f"hardware_{metric(at, 'nodes')}"  # named by what it is, not by the budget


def test_malformed_pasted_csv_is_an_error(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.radio(key="in_src").set_value("accuracy file or pasted CSV").run()
    at.text_area(key="in_acc_paste").input("head,rank,acc\n1,1,0.5\n").run()
    no_exception(at)
    assert any("missing column" in e and "accuracy" in e for e in errors(at)), errors(at)
    at.text_area(key="in_acc_paste").input("head,rank,accuracy\n1,1,0.6\n1,2,0.2\n2,1,0.3\n2,2,0.1\n").run()
    no_exception(at)
    assert not errors(at)
    assert int(metric(at, "nodes")) == 6  # every node of a 2-head, top-2 table has positive probability
    at.text_area(key="in_acc_paste").input("head,rank,accuracy\n1,1,0.6\n").run()  # one head, one rank
    no_exception(at)
    assert int(metric(at, "nodes")) == 1
    at.radio(key="tree_model").set_value("empirical paths").run()
    assert any("calibration folder" in e for e in errors(at))


def test_malformed_upload_is_an_error(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.radio(key="in_src").set_value("accuracy file or pasted CSV").run()
    at.file_uploader(key="in_acc_upload").set_value(("acc.csv", b"head,rank,accuracy\n1,1,1.7\n", "text/csv")).run()
    no_exception(at)
    assert any("not a number in [0, 1]" in e for e in errors(at)), errors(at)
    assert all("workbench-app" not in e for e in errors(at))  # the temp folder is not shown
    assert any(e.startswith("accuracy file acc.csv:") for e in errors(at)), errors(at)  # named by the upload


def test_missing_folder_and_unfit_tree_are_errors(demo_files, monkeypatch, tmp_path):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="tree_user_spec").input("[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]").run()
    no_exception(at)
    assert any("exceeds the 4 Medusa heads" in e for e in errors(at)), errors(at)
    at.selectbox(key="in_cal").set_value("other: type a folder").run()
    at.text_input(key="in_dir").input(str(tmp_path / "nowhere")).run()
    no_exception(at)
    assert any("not a finished calibration folder" in e for e in errors(at))


def test_user_tree_is_compared(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="tree_user_spec").input("[[0], [1], [0, 0]]").run()
    no_exception(at)
    assert "tree_curves_chart" not in charts(at)  # the designer opens on its Export tab: the curves wait
    named = table(tab(at, "Named trees", "tree_tab"), "tree")
    assert "your tree" in named["tree"].tolist()
    assert "mc_sim_7b_63" in named["tree"].tolist()


def tree_file(at: AppTest) -> dict:
    """The JSON tree file the export shows (and its json button downloads)."""
    return json.loads(next(c.value for c in at.code if '"medusa_choices"' in c.value))


def test_json_export_has_provenance(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.slider(key="tree_budget").set_value(20).run()
    rec = tree_file(at)
    assert rec["name"] == "optimal_20" and len(rec["medusa_choices"]) == rec["nodes"] == 20
    assert rec["budget"] == 20 and rec["method"] == "independence"
    assert rec["accuracies"] == "synthetic"  # never the server's absolute path: relative, or the folder's name
    assert rec["expected_acceptance_length"] == pytest.approx(float(metric(at, "predicted_independent "
                                                                          "(tokens/step)")), abs=1e-3)


def test_reference_tree_is_shown_edited_and_exported(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.selectbox(key="tree_show").set_value("reference: mc_sim_7b_63").run()
    no_exception(at)
    assert int(metric(at, "nodes")) == 63 and metric(at, "depth") == "4"
    assert tree_file(at)["name"] == "mc_sim_7b_63" and tree_file(at)["method"] == "reference"
    at.text_input(key="tree_add").input("1,9").run()  # head 2's rank 9 under [1]: not in mc_sim_7b_63
    at.button(key="tree_add_btn").click().run()
    no_exception(at)
    assert int(metric(at, "nodes")) == 64 and not errors(at)
    rec = tree_file(at)
    assert rec["name"] == "mc_sim_7b_63_edited" and rec["edited_from"] == "mc_sim_7b_63"
    assert [1, 9] in rec["medusa_choices"] and rec["method"] == "edited"
    at.text_input(key="tree_add").input("1,8,0").run()  # parent [1, 8] is missing: one line, tree unchanged
    at.button(key="tree_add_btn").click().run()
    assert errors(at) == ["path [1, 8, 0]: parent [1, 8] is missing (every prefix must be a node)"]
    assert int(metric(at, "nodes")) == 64
    at.selectbox(key="tree_remove").set_value("[1]").run()  # [1] and its subtree go: 10 + the added [1, 9]
    at.button(key="tree_remove_btn").click().run()
    assert int(metric(at, "nodes")) == 64 - 11 and not errors(at)
    assert not [p for p in tree_file(at)["medusa_choices"] if p[0] == 1]
    at.button(key="tree_reset_btn").click().run()
    assert int(metric(at, "nodes")) == 63 and tree_file(at)["name"] == "mc_sim_7b_63"


def test_pasted_tree_is_shown_and_compared(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="tree_user_spec").input("[[0], [1], [0, 0], [0, 1]]").run()
    at.selectbox(key="tree_show").set_value("yours: your tree").run()
    assert int(metric(at, "nodes")) == 4
    at.selectbox(key="tree_compare").set_value("reference: mc_sim_7b_63").run()
    no_exception(at)
    assert any(h.value == "A = your tree vs B = mc_sim_7b_63" for h in at.subheader)
    both = next(d.value for d in at.dataframe
                if "tree" in d.value.columns and "A: your tree" in d.value["tree"].tolist())
    assert both["tree"].tolist() == ["A: your tree", "B: mc_sim_7b_63"] and both["nodes"].tolist() == [4, 63]
    assert (both["predicted_independent"] > 1).all()
    assert both["predicted_independent"][1] > both["predicted_independent"][0]
    diff = table(at, "P(accepted)")
    assert set(diff["in"]) == {"only B"} and len(diff) == 59  # all 4 of A's nodes are in mc_sim_7b_63
    assert any("4 shared nodes, 0 only in A, 59 only in B" in c.value for c in at.caption)


def test_selected_node_highlights_its_mask_row(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.selectbox(key="tree_focus_pick").set_value(3).run()
    no_exception(at)
    import plotly.io as pio

    charts = [pio.from_json(c.proto.spec, skip_invalid=True) for c in at.get("plotly_chart")]
    mask = next(c for c in charts if c.data and c.data[0].type == "heatmap" and len(c.data) == 2)
    assert any(m.value == "**tree-attention mask (64x64; row 3 selected)**" for m in at.markdown)  # its title
    z = plotly_values(mask.data[0].z)  # an int8 typed array on the wire
    assert z.shape == (64, 64)
    assert (z[3] >= 2).all() and (z[np.arange(len(z)) != 3] < 2).all()  # only row 3 is highlighted
    assert any(m.value.startswith("**row 3**") for m in at.markdown)


def test_hardware_aware_says_when_speculation_does_not_pay(demo_files, monkeypatch, tmp_path):
    """The designer's hardware-aware tree is plan's ranking's fastest tree (plan/fastest.py) on the same table, and
    when no speculation wins it says so."""
    from workbench.calibrate.folder import Calibration
    from workbench.plan.fastest import value_source

    slow = tmp_path / "latency-slow.csv"
    pd.DataFrame([dict(context=128, tokens=n, seconds=0.01 * n) for n in (1, 2, 4, 8, 16, 32, 64)]).to_csv(slow,
                                                                                                            index=False)
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.radio(key="tree_model").set_value("hardware-aware").run()
    assert not any("does not pay" in w.value for w in at.warning)
    tab(at, "Tokens/step and speedup", "tree_tab")
    assert any("diamonds: sweep measurements" in c.value for c in at.caption)  # sweep speedups on the curve
    at.selectbox(key="in_lat_pick").set_value("other: type a path").run()
    at.text_input(key="in_lat_path").input(str(slow)).run()
    no_exception(at)
    assert float(metric(at, "predicted speedup").rstrip("x")) < 1
    assert any("Speculation does not pay on this hardware at batch 1 and context 128" in w.value for w in at.warning)
    assert any(m.value.startswith("**Recommendation:** use no speculation at batch 1 and context 128")
               for m in at.markdown)
    acc = Calibration(demo_files["cal"]).accuracies("fit")
    table = dict(zip(pd.read_csv(slow)["tokens"], pd.read_csv(slow)["seconds"]))
    want = fastest_on(value_source(acc, acc.shape[0], min(acc.shape[1], 10)), table, max_nodes=63)
    assert want["best"].kind == "none" and want["tree"].speedup < 1
    assert tree_file(at)["medusa_choices"] == want["tree"].tree.as_lists()


def test_the_designer_prices_the_tree_at_its_own_depth(demo_files, monkeypatch, tmp_path):
    """A latency table with the heads' cost: the designer says each tree is priced at its own depth and its
    predicted speedup is recommend.designed_speedup's on that table (speed.priced, plan's pricing); a table without
    it says how to add it."""
    from dataclasses import replace

    from workbench.calibrate.folder import Calibration
    from workbench.plan.recommend import designed_speedup, latency_tables
    from workbench.trees.tree import Tree

    at = page("tree_page", demo_files["root"], monkeypatch).run()
    assert any("no heads' cost" in c.value for c in at.caption)
    rows = pd.read_csv(demo_files["latency"])
    rows = rows[(rows["tokens"] <= 16) & (rows["context"] == 128)].copy()
    rows["depth"] = rows["tokens"].map(lambda n: 0 if n == 1 else min(n - 1, 4))  # deep trees timed
    rows["heads_seconds"] = rows["depth"] * 0.004
    deep = tmp_path / "latency-heads.csv"
    rows.to_csv(deep, index=False)
    at.selectbox(key="in_lat_pick").set_value("other: type a path").run()
    at.text_input(key="in_lat_path").input(str(deep)).run()
    at.slider(key="tree_budget").set_value(6).run()
    no_exception(at)
    assert any("each tree priced at its own depth" in c.value for c in at.caption)
    tree = Tree(tuple(map(tuple, tree_file(at)["medusa_choices"])), "shown")
    tables = latency_tables(pd.read_csv(deep), batch=1)
    want = designed_speedup(Calibration(demo_files["cal"]), tree, tables)
    assert tree.depth < 4
    assert float(metric(at, "predicted speedup").rstrip("x")) == pytest.approx(want["speedup"], abs=0.006)
    assert want["speedup"] > designed_speedup(Calibration(demo_files["cal"]), tree, replace(tables, head_cost=None))["speedup"]


def test_streamlit_run_from_the_checkout_skips_the_full_gc_after_every_click():
    """`streamlit run app.py` reads .streamlit/config.toml from the folder it starts in: there runner.postScriptGC is
    off (Streamlit's gc.collect(2) after every run took ~0.5 s of each click's server time here, py-spy)."""
    code = ("from streamlit import config\nconfig.get_config_options(force_reparse=True)\n"
            "print(config.get_option('runner.postScriptGC'))")
    here = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    elsewhere = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT / "docs", capture_output=True, text=True,
                               timeout=120)
    assert here.stdout.split() == ["False"] and elsewhere.stdout.split() == ["True"], (here.stderr, elsewhere.stderr)


def test_settings_survive_a_page_change(demo_files, monkeypatch):
    body = "import streamlit as st\napp.keep_settings()\ngetattr(app, st.session_state.get('page', 'tree_page'))()\n"
    at = page("tree_page", demo_files["root"], monkeypatch, body).run()
    at.slider(key="tree_budget").set_value(16).run()
    at.radio(key="tree_model").set_value("empirical paths").run()
    at.session_state["page"] = "calibration_page"
    at.run()
    assert at.title[0].value == "Calibration"
    assert not [s for s in at.slider if s.key == "tree_budget"]  # the designer's widgets are not drawn here
    at.session_state["page"] = "tree_page"
    at.run()
    no_exception(at)
    assert at.slider(key="tree_budget").value == 16 and at.radio(key="tree_model").value == "empirical paths"
    assert int(metric(at, "nodes")) == 16


def test_defaults_a_newcomer_can_trust(tmp_path, monkeypatch):
    """The first view prices its answer: the budget starts within the latency table (16 tokens: a 15-node tree),
    and a tree the table cannot price (63 nodes) says why and offers the nearest one it can, a click away."""
    from helpers import make_short_latency

    cal = make_calibration(tmp_path / "synthetic")
    make_short_latency(cal / "latency-cpu.csv")
    at = page("tree_page", tmp_path, monkeypatch).run()
    no_exception(at)
    assert at.slider(key="tree_budget").value == 15 and int(metric(at, "nodes")) <= 15
    assert metric(at, "predicted speedup").endswith("x")
    at.selectbox(key="tree_show").set_value("reference: mc_sim_7b_63").run()
    assert metric(at, "predicted speedup") == "n/a"
    said = " ".join(c.value for c in at.caption)
    assert "No predicted speedup: latency-cpu.csv stops at 16 tokens per verify step at batch 1: a 63-node tree " \
           "needs 64. The nearest tree it prices has 15 nodes." in said, said
    at.button(key="tree_nearest_btn").click().run()
    no_exception(at)
    assert at.selectbox(key="tree_show").value == "the optimizer's (sidebar settings)"
    assert at.slider(key="tree_budget").value == 15 and metric(at, "predicted speedup").endswith("x")


def test_the_committed_answer_names_its_evidence(monkeypatch):
    """On the committed data, as a newcomer opens it: the 805-prompt calibration, a priced first view, the latency
    table's setting named with whether it is this machine's; at batch 2 the odd plain step that carries the answer is
    flagged, and the range that overlaps no speculation is called within the noise."""
    from workbench.core.provenance import here

    monkeypatch.delenv("WORKBENCH_CALIBRATION_ROOT", raising=False)
    monkeypatch.delenv("WORKBENCH_RESULTS_ROOT", raising=False)
    at = page("tree_page", None, monkeypatch).run()
    no_exception(at)
    assert at.selectbox(key="in_cal").value.endswith("calibration/smollm2-135m-instruct-alpaca-eval")
    assert metric(at, "predicted speedup").endswith("x") and int(metric(at, "nodes")) <= 15
    evidence = next(c.value for c in at.caption if c.value.startswith("Evidence: "))
    assert evidence.startswith("Evidence: latency latency-cpu.csv: cpu AMD EPYC (avx2), 2 threads, ")
    ours = here()
    assert ("this machine's CPU" in evidence) == (ours["cpu"] == "AMD EPYC" and ours["vector"] == "avx2"), evidence
    assert not any("off their trend" in w.value for w in at.warning)  # batch 1: on the trend
    at.selectbox(key="in_batch").set_value(2).run()
    no_exception(at)
    warned = [w.value for w in at.warning if "off their trend" in w.value]
    assert warned and "batch 2's plain step (1 token) 0.160 s is off its neighbours (batch 1 0.094 s, batch 4 " \
                      "0.152 s" in warned[0], [w.value for w in at.warning]
    assert any("The choice is within the noise" in c.value for c in at.caption)
    assert {"candidates CSV", "answer JSON"} <= {b.label for b in at.download_button}  # the answer to keep


def test_every_fragment_keeps_the_settings():
    """A bare st.fragment's run leaves the kept settings where the next page switch drops them (issue 53): every
    fragment of the app is made with workbench.ui.inputs.fragment, which keeps them first."""
    import re

    bare = [f"{f.name}:{i + 1}" for f in sorted((REPO_ROOT / "workbench" / "ui").glob("*.py")) if f.name != "inputs.py"
            for i, line in enumerate(f.read_text().splitlines()) if re.search(r"\bst\.fragment\b", line)]
    assert not bare, bare
    assert "@fragment" in (REPO_ROOT / "workbench" / "ui" / "tree_drawing.py").read_text()


PAGES_BODY = ("import streamlit as st\napp.keep_settings()\n"
              "if st.session_state.pop('to_goto_designer', False):  # the trade-offs button's page switch\n"
              "    st.session_state['page'] = 'tree_page'\n"
              "getattr(app, st.session_state.get('page', 'tree_page'))()\n")
SHARED = ("in_src", "in_cal", "in_lat_pick", "in_batch", "in_gen")


def test_one_set_of_inputs_for_every_page(tmp_path, monkeypatch):
    """The calibration (default: the most prompts, not the first name), latency table, batch size and generation
    length are set once in the designer's sidebar and read by every page, which gives the same answer; trade-offs'
    "open in the designer" lands on the designer showing that answer's tree at the same batch size."""
    def sentence(at):
        return next(m.value for m in at.markdown if m.value.startswith("**Recommendation:** "))

    cal = make_walk_files(tmp_path, "synthetic")
    meta = json.loads((cal / "meta.json").read_text())
    (cal / "meta.json").write_text(json.dumps(meta | {"max_new_tokens": 40}))
    make_calibration(tmp_path / "a-quick", prompts=4)  # sorts first, fewer prompts
    at = page("tree_page", tmp_path, monkeypatch, PAGES_BODY).run()
    assert at.selectbox(key="in_cal").value == str(cal)
    assert at.number_input(key="in_gen").value == 40
    full = sentence(at)
    at.number_input(key="in_gen").set_value(12).run()
    assert sentence(at) != full  # the generation length reaches the prediction
    batched = next(o for o in options(at, "in_lat_pick") if o.endswith("latency-batched.csv"))
    at.selectbox(key="in_lat_pick").set_value(batched).run()
    at.selectbox(key="in_batch").set_value(4).run()
    no_exception(at)
    said = sentence(at)
    assert " at batch 4 and context 128" in said
    values = {k: at.session_state[k] for k in SHARED}
    for name in ("calibration_page", "live_page", "tradeoffs_page"):
        at.session_state["page"] = name
        at.run()
        no_exception(at)
        assert {k: at.session_state[k] for k in SHARED} == values, name
        assert at.selectbox(key="in_cal").value == str(cal) and at.number_input(key="in_gen").value == 12
    assert at.selectbox(key="in_lat_pick").value.endswith("/latency-batched.csv")
    assert at.selectbox(key="in_batch").value == 4
    assert sentence(at) == said  # the same answer on both pages
    assert "use no speculation" not in said, said  # the data give a tree to open
    at.button(key="to_show_btn").click().run()
    no_exception(at)
    assert at.title[0].value == "Tree designer"
    assert at.selectbox(key="tree_show").value.startswith("recommended: ")
    assert not any("no longer available" in i.value for i in at.info)
    assert at.selectbox(key="in_batch").value == 4 and sentence(at) == said


# ----------------------------------------------------------------------------------------------- other pages

def test_calibration_page(demo_files, monkeypatch):
    at = page("calibration_page", demo_files["root"], monkeypatch).run()
    no_exception(at)
    assert at.title[0].value == "Calibration"
    assert metric(at, "heads") == "4"
    positions = int(metric(at, "positions"))
    at.radio(key="cal_split").set_value("all").run()
    assert int(metric(at, "positions")) > positions
    table = at.dataframe[0].value
    assert len(table) == 40 and list(table.columns)[:2] == ["path", "measured / independence"]
    assert {"measured", "independence"} <= set(table.columns)
    assert any("denominators" in c.value for c in at.caption)
    at.slider(key="cal_top").set_value(10).run()
    assert len(at.dataframe[0].value) == 10
    no_exception(at)


def test_acceptance_per_position_beside_vllms_counters(monkeypatch):
    """On the committed calibration: the top-1 chain's acceptance per draft position over the calibration (measured
    joint paths, the independence product) beside vLLM's per-position counters and our decoder's from the committed
    `workbench vllm-check` result."""
    import plotly.io as pio

    from workbench.calibrate.folder import Calibration
    from workbench.trees.optimize import chain_values

    monkeypatch.delenv("WORKBENCH_CALIBRATION_ROOT", raising=False)
    monkeypatch.delenv("WORKBENCH_RESULTS_ROOT", raising=False)
    at = page("calibration_page", None, monkeypatch).run()
    no_exception(at)
    fig = next(pio.from_json(c.proto.spec, skip_invalid=True) for c in at.get("plotly_chart")
               if c.proto.id.endswith("cal_acceptance_chart"))
    bars = {t.name: plotly_values(t.y) for t in fig.data}
    cal = Calibration(REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval")
    assert np.allclose(bars["calibration, measured (fit)"], chain_values(cal.joint_value("fit"), 4))
    saved = json.loads((REPO_ROOT / "docs" / "results" / "vllm-check-cpu.json").read_text())
    longest = max(saved["acceptance"], key=lambda r: r["k"])
    vllm = next(v for n, v in bars.items() if n.startswith(f"vLLM, K={longest['k']} (vllm-check"))
    assert np.allclose(vllm, longest["vllm_acceptance_per_pos"])
    assert any(n.startswith("our decoder, K=") for n in bars) and any(n.startswith("independence") for n in bars)


def test_a_served_calibration_is_shown_beside_ours(tmp_path, monkeypatch):
    """A served calibration (vLLM's counters from the recorded n-gram scrape) under the calibration root is set on
    the acceptance chart beside ours, at the per-step rates a plan reads, and offered in the sidebar after ours (ours
    stays preselected)."""
    import plotly.io as pio

    from workbench.calibrate.served import Served
    from workbench.cli import main

    make_calibration(tmp_path / "synthetic")
    data = Path(__file__).parent / "data" / "served"
    assert main(["calibrate", "--metrics", str(data / "ngram-before.prom"), str(data / "ngram-after.prom"),
                 "--method", "ngram", "--prompts", "copy-edit", "--out", str(tmp_path / "served-ngram")]) == 0
    at = page("calibration_page", tmp_path, monkeypatch).run()
    no_exception(at)
    assert options(at, "in_cal")[1:] == ["served-ngram (served ngram, K=4, from metrics)", "other: type a folder"]
    assert at.selectbox(key="in_cal").value == str(tmp_path / "synthetic")
    fig = next(pio.from_json(c.proto.spec, skip_invalid=True) for c in at.get("plotly_chart")
               if c.proto.id.endswith("cal_acceptance_chart"))
    bars = {t.name: plotly_values(t.y) for t in fig.data}
    served = next(v for n, v in bars.items() if n.startswith("vLLM served ngram, K=4 (served-ngram, copy-edit)"))
    assert np.allclose(served, Served(tmp_path / "served-ngram").rates())
    assert any("calibration, measured" in n for n in bars)  # ours is still there
    assert any("Served calibrations" in c.value for c in at.caption)


SERVED = REPO_ROOT / "docs" / "results" / "served"


def recommendation(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("**Recommendation:** "))


def test_a_served_calibration_is_planned_in_the_app_as_the_cli_plans_it(monkeypatch, tmp_path):
    """Issue 69: the sidebar offers the committed served n-gram calibration; picked, it preselects the vLLM surface it
    was calibrated for, and the designer and the trade-offs page name the K and speedup of `workbench plan
    --calibration SERVED --latency ITS CSV` at every batch size (one weighing, plan/weigh.py). The tree controls are
    not drawn, the plan goes out as the engines' schedules only, the calibration page shows the counts, and another
    served calibration picked brings its own surface."""
    from workbench.calibrate.served import Served
    from workbench.cli import main
    from workbench.plan.plan_file import read_plan

    served, lat = SERVED / "ngram-plan-cpu-copy-edit-calibration", SERVED / "ngram-plan-cpu-copy-edit-latency.csv"
    assert main(["plan", "--calibration", str(served), "--latency", str(lat), "--batch-sizes", "1,2,4,8",
                 "--out", str(tmp_path / "plan.json")]) == 0
    plan = read_plan(tmp_path / "plan.json")
    assert {r["kind"] for r in plan["plans"]} == {"chain"}  # n-gram pays on copy-edit: a K to name
    monkeypatch.delenv("WORKBENCH_CALIBRATION_ROOT", raising=False)
    monkeypatch.delenv("WORKBENCH_RESULTS_ROOT", raising=False)
    at = page("tree_page", None, monkeypatch, PAGES_BODY)
    at.session_state["in_cal"] = str(served)
    at.run()
    no_exception(at)
    assert not errors(at), errors(at)
    assert "ngram-plan-cpu-copy-edit-calibration (served ngram, K=4, 96 prompts)" in options(at, "in_cal")
    assert at.selectbox(key="in_lat_pick").value == str(lat)
    assert not [w for w in list(at.slider) + list(at.radio) if w.key in ("tree_budget", "tree_model")]
    assert any("drafts a chain of K tokens" in c.value for c in at.sidebar.caption)
    ctx = plan["latency"]["context"]
    for row in plan["plans"]:
        b = row["batch_size"]
        at.selectbox(key="in_batch").set_value(b).run()
        no_exception(at)
        said = recommendation(at)
        assert said.startswith(f"**Recommendation:** use chain {row['nodes']} at batch {b} and context {ctx} "), said
        assert f"{row['predicted_speedup']:.2f}x" in said, said
        ks = table(at, "K")
        assert ks.loc[ks["speedup"].idxmax(), "K"] == row["nodes"] and ks["speedup"].max() == row["predicted_speedup"]
    at.session_state["page"] = "tradeoffs_page"
    at.run()
    no_exception(at)
    assert not errors(at), errors(at)
    last = plan["plans"][-1]
    said = recommendation(at)  # batch 8, kept from the designer
    assert f"use chain {last['nodes']} at batch {last['batch_size']} " in said
    assert f"{last['predicted_speedup']:.2f}x" in said and not [b for b in at.button if b.key == "to_show_btn"]
    tab(at, "Plan per batch size")
    no_exception(at)
    line = next(m.value for m in at.markdown if m.value.startswith("batch 1: **"))
    for row in plan["plans"]:  # the page's plan is the CLI's
        assert f"batch {row['batch_size']}: **chain K={row['nodes']}** {row['predicted_speedup']:.2f}x" in line, line
    files = {d.proto.label for d in at.get("download_button") if "to_plan_" in d.proto.id}
    assert {"plan", "vllm", "trtllm-schedule"} <= files and not files & {"vllm-tree", "trtllm", "medusa", "eagle",
                                                                        "json"}, files
    # speculative_token_schedule is in no vLLM release: offered only where one K serves every batch size
    assert ("vllm-token-schedule" in files) == (len({row["nodes"] for row in plan["plans"]}) == 1), files
    tab(at, "Static vs per-step")
    assert any("drafts one chain of K tokens" in i.value for i in at.info)
    tab(at, "Latency and speedup")
    no_exception(at)
    assert "to_speedup_chart" in charts(at) and not [s for s in at.slider if s.key == "to_budget"]
    at.session_state["page"] = "calibration_page"
    at.run()
    no_exception(at)
    assert metric(at, "drafter") == "ngram" and metric(at, "K") == "4"
    assert table(at, "conditional")["accepted"].tolist() == list(Served(served).counts.per_pos)
    other = SERVED / "ngram-plan-cpu-alpaca-eval-calibration"
    at.selectbox(key="in_cal").set_value(str(other)).run()
    no_exception(at)
    assert at.selectbox(key="in_lat_pick").value == str(SERVED / "ngram-plan-cpu-alpaca-eval-latency.csv")


def test_calibration_page_with_accuracy_table(demo_files, monkeypatch):
    at = page("calibration_page", demo_files["root"], monkeypatch).run()
    at.radio(key="in_src").set_value("accuracy file or pasted CSV").run()
    at.text_input(key="in_acc_path").input(str(demo_files["cal"] / "accuracies.csv")).run()
    no_exception(at)
    assert not errors(at)
    assert any("ranks of a calibration folder" in i.value for i in at.info)


def test_tradeoffs_page(demo_files, monkeypatch, tmp_path):
    at = page("tradeoffs_page", demo_files["root"], monkeypatch).run()
    no_exception(at)
    assert at.title[0].value == "Trade-offs"
    assert at.selectbox(key="to_sweep_pick").value == str(demo_files["sweep"])
    assert at.selectbox(key="in_lat_pick").value == str(demo_files["latency"])
    assert not errors(at), errors(at)
    tab(at, "Latency and speedup")
    assert any("best:" in c.value for c in at.caption)
    tab(at, "Typical acceptance (Fig. 5)")
    at.selectbox(key="to_quality").set_value("mean_logprob").run()
    no_exception(at)
    bad = tmp_path / "bad.csv"
    bad.write_text("tree,nodes\nx,3\n")
    at.selectbox(key="to_sweep_pick").set_value("other: type a path").run()
    at.text_input(key="to_sweep_path").input(str(bad)).run()
    no_exception(at)
    assert any("not a sweep CSV (no tokens_per_step column" in e for e in errors(at)), errors(at)


def test_tradeoffs_fig5_from_a_separate_typical_sweep(demo_files, monkeypatch, tmp_path):
    """A greedy-only sweep sorts first; Fig. 5 still shows, from the typical sweep found beside it."""
    from workbench.measure.sweep_file import read_sweep

    full = read_sweep(demo_files["sweep"])
    full[full["acceptance"] == "greedy"].to_csv(tmp_path / "a-greedy.csv", index=False)
    full[full["acceptance"] != "greedy"].to_csv(tmp_path / "b-typical.csv", index=False)
    make_latency(make_calibration(tmp_path / "cal") / "latency.csv")
    at = page("tradeoffs_page", tmp_path, monkeypatch).run()
    no_exception(at)
    assert not errors(at), errors(at)
    assert at.selectbox(key="to_sweep_pick").value == str(tmp_path / "a-greedy.csv")
    assert at.selectbox(key="to_typ_pick").value == str(tmp_path / "b-typical.csv")
    tab(at, "Typical acceptance (Fig. 5)")
    assert at.select_slider(key="to_eps").value == 0.09  # the nearest to Medusa's default
    assert any("Fig. 5 (b-typical.csv)" in c.value and "At epsilon 0.09: 2.41 tokens/step" in c.value
               for c in at.caption)
    at.select_slider(key="to_eps").set_value(0.2).run()
    assert any("At epsilon 0.2: 2.30 tokens/step, exact_match 0.400" in c.value for c in at.caption)
    tab(at, "Latency and speedup")
    at.slider(key="to_budget").set_value(8).run()
    no_exception(at)
    best = next(c.value for c in at.caption if "best:" in c.value).split("best: ")[1]
    assert all(int(n) <= 8 for n in __import__("re").findall(r"(\d+) nodes", best))


def test_tradeoffs_page_draws_only_the_open_tab(demo_files, monkeypatch):
    """A click on the trade-offs page redraws the open tab's figures, not all eight: each tab's charts appear when it
    is opened and are gone from the run once another is."""
    at = page("tradeoffs_page", demo_files["root"], monkeypatch).run()
    no_exception(at)
    assert at.tabs and [t.label for t in at.tabs] == list(__import__("workbench.ui.tradeoffs_page",
                                                                      fromlist=["TABS"]).TABS)
    drawn = {}
    for label in [t.label for t in at.tabs]:
        tab(at, label)
        no_exception(at)
        drawn[label] = charts(at)
    assert drawn["Sweep (Fig. 4)"] >= {"to_fig4a_chart", "to_fig4b_chart"}
    assert drawn["Typical acceptance (Fig. 5)"] == {"to_fig5_chart"}
    assert drawn["Latency and speedup"] == {"to_latency_chart", "to_surface_chart", "to_speedup_chart"}
    assert not drawn["Sweep (Fig. 4)"] & drawn["Latency and speedup"]


def test_static_vs_per_step_tab(monkeypatch, tmp_path):
    """The trade-offs page's "Static vs per-step" tab, on the committed calibration (its heads' top-k recorded) and
    a table that also timed per-step trees (here 0.9x the static step): at every budget the static and the per-step
    tree as the plan prices them (plan.rank.equal_budgets), the faster named per budget; the committed table, which
    timed none, says how to time them."""
    from workbench import REPO_ROOT
    from workbench.plan.rank import equal_budgets
    from workbench.plan.source import plan_source

    cal = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    df = pd.read_csv(cal / "latency-cpu.csv")
    dyn = df[(df["tokens"] > 1) & (df["tokens"] <= 16)].copy()
    for c in ("seconds", "seconds_min", "seconds_q1", "seconds_q3", "seconds_max"):
        dyn[c] = dyn[c] * 0.9
    lat = tmp_path / "latency-per-step.csv"
    pd.concat([df, dyn.assign(policy="dynamic", envelope=15)], ignore_index=True).to_csv(lat, index=False)
    monkeypatch.setenv("WORKBENCH_CALIBRATION_ROOT", str(REPO_ROOT / "calibration"))
    monkeypatch.setenv("WORKBENCH_RESULTS_ROOT", str(tmp_path))
    at = page("tradeoffs_page", None, monkeypatch).run()
    tab(at, "Static vs per-step")
    no_exception(at)
    assert any("timed no per-step trees" in i.value and "--envelope" in i.value for i in at.info)
    at.selectbox(key="in_lat_pick").set_value(next(o for o in at.selectbox(key="in_lat_pick").options
                                                   if "latency-per-step" in o)).run()
    no_exception(at)
    shown = table(at, "measured speedup")
    rows, _ = equal_budgets(plan_source(calibration=str(cal), max_new_tokens=at.number_input(key="in_gen").value),
                            lat, [1], int(at.session_state["in_ctx"]) if "in_ctx" in at.session_state else None)
    assert list(zip(shown["nodes"], shown["kind"])) == [(r["nodes"], r["kind"]) for r in rows] and len(rows) >= 4
    assert shown["speedup"].tolist() == pytest.approx([r["speedup"] for r in rows])
    assert shown["measured speedup"].isna().all()  # no sweep decoded either kind
    said = next(m.value for m in at.markdown if m.value.startswith("Static or per-step at batch 1"))
    assert "**per-step**" in said  # 0.9x the static step at equal tokens/step: per-step wins somewhere


def test_per_step_measurements_are_matched_by_kind_and_size():
    from workbench.ui.per_step_view import frame, measured, verdict

    sweep = pd.DataFrame([dict(kind="vanilla", nodes=0, batch_size=1, acceptance="greedy", tokens_per_step=1.0,
                               decode_speedup=float("nan"), speedup=1.0),
                          dict(kind="optimal", nodes=4, batch_size=1, acceptance="greedy", tokens_per_step=1.6,
                               decode_speedup=0.78, speedup=0.8),
                          dict(kind="dynamic", nodes=4, batch_size=1, acceptance="greedy", tokens_per_step=1.62,
                               decode_speedup=float("nan"), speedup=0.54),
                          dict(kind="dynamic", nodes=4, batch_size=2, acceptance="greedy", tokens_per_step=1.5,
                               decode_speedup=0.9, speedup=0.9)])
    found = measured(sweep, 1)
    assert set(found) == {("static", 4), ("per-step", 4)}
    rows = [dict(nodes=4, kind="static", tokens_per_step=1.58, step_ratio=2.0, speedup=0.79, range=[0.75, 0.82]),
            dict(nodes=4, kind="per-step", tokens_per_step=1.62, step_ratio=2.2, speedup=0.74, range=[0.80, 0.85]),
            dict(nodes=8, kind="per-step", tokens_per_step=1.7, step_ratio=2.4, speedup=0.71, range=None)]
    f = frame(rows, found)
    assert f["measured speedup"].tolist()[:2] == [0.78, 0.54]  # the split where the sweep has it, else end to end
    assert f["measured tokens/step"].tolist()[:2] == [1.6, 1.62] and pd.isna(f["measured speedup"].iloc[2])
    assert verdict(rows) == "4: **static** (within noise)"
    assert measured(None, 1) == {}


def test_tradeoffs_page_without_files(tmp_path, monkeypatch):
    at = page("tradeoffs_page", tmp_path, monkeypatch).run()
    no_exception(at)
    assert any("No sweep CSV" in i.value for i in at.info)


def test_live_page_decodes_with_a_tiny_model(tiny_llama, demo_files, monkeypatch):
    at = page("live_page", demo_files["root"], monkeypatch).run()
    no_exception(at)
    assert at.title[0].value == "Live decode"
    assert at.button(key="live_go") is not None
    assert not at.get("markdown") or all("step 1" not in m.value for m in at.markdown)
    at.text_input(key="live_model").input(str(tiny_llama.model_dir))
    at.text_input(key="live_heads").input(str(tiny_llama.heads_dirs["2"]))
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_max_new").set_value(12)
    at.selectbox(key="live_tree").set_value("other: a path or literal").run()
    at.text_input(key="live_tree_spec").input("[[0], [1], [0, 0], [0, 0, 0]]")
    at.button(key="live_go").click().run()
    no_exception(at)
    assert not errors(at), errors(at)
    res = at.session_state["live_result"]
    med = res["medusa"]
    assert med["new_tokens"] == 12 and sum(med["accepted_lengths"]) == 12
    assert res["compare"]["matches_greedy"]  # greedy acceptance is lossless
    assert len(res["pieces"]) == len(res["steps"]) == 12
    assert float(metric(at, "tokens/step")) == pytest.approx(med["tokens_per_step"], abs=0.01)
    assert any('title="step 1"' in m.value for m in at.markdown)
    bars = [p.proto.text for p in at.get("progress")]  # streamed progress, left at its final state
    assert any(b.startswith("Medusa: 12/12 tokens in ") and b.endswith("tokens/s, stopped (max_new_tokens)")
               for b in bars), bars
    assert any(b.startswith("vanilla greedy: 12/12 tokens in 12 steps (1.00 tokens/step)") for b in bars), bars
    assert any("One prompt is a noisy measurement" in c.value for c in at.caption)
    assert at.number_input(key="live_threads").value is None  # empty: torch's own setting, left as it was
    # beside the measured tokens/step, what the calibration predicts for this tree (answers cut at 12 tokens)
    from workbench.calibrate.folder import Calibration
    from workbench.trees.tree import load_tree
    predicted = Calibration(demo_files["cal"]).predict(load_tree("[[0], [1], [0, 0], [0, 0, 0]]"), 12)
    assert metric(at, "predicted tokens/step") == f"{predicted['predicted_replay']:.2f}"
    assert [s.label for s in at.status if s.label.startswith("Model ready (") and "warmed up" in s.label]
    # a failing run clears the last result: no stale answer under the new error
    at.text_input(key="live_tree_spec").input("[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], "
                                              "[0, 0, 0, 0, 0, 0]]")
    at.button(key="live_go").click().run()
    assert any("exceeds the 5 Medusa heads" in e for e in errors(at))
    assert "live_result" not in at.session_state and not at.metric
    assert [s.state for s in at.status] == ["error"] and at.status[0].label == "Stopped: see the error below"


def test_live_page_tree_too_deep_is_an_error(tiny_llama, demo_files, monkeypatch):
    at = page("live_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="live_model").input(str(tiny_llama.model_dir))
    at.text_input(key="live_heads").input(str(tiny_llama.heads_dirs["2"]))
    at.selectbox(key="live_device").set_value("cpu")
    at.selectbox(key="live_tree").set_value("other: a path or literal").run()
    at.text_input(key="live_tree_spec").input("[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], "
                                              "[0, 0, 0, 0, 0, 0]]")
    at.button(key="live_go").click().run()
    no_exception(at)
    assert any("exceeds the 5 Medusa heads" in e for e in errors(at)), errors(at)
    at.text_input(key="live_model").input(str(Path("/nonexistent/model")))
    at.selectbox(key="live_tree").set_value("mc_sim_7b_63")
    at.button(key="live_go").click().run()
    no_exception(at)
    assert any("cannot load it" in e or "no such" in e.lower() for e in errors(at)), errors(at)


def test_a_request_error_names_the_flag_in_the_cli_and_the_control_in_the_app(tiny_llama, demo_files, monkeypatch,
                                                                             capsys):
    """One library error (decode.request: the answer passes the model's positions), two faces: the CLI names the
    flag (one `error:` line, exit 2), the live page the control, for the same bad value."""
    from workbench.cli import main

    too_long = "1000"  # the tiny model holds 512 positions
    code = main(["decode", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--tree", "[[0], [1]]", "--prompt", "hi", "--device", "cpu", "--max-new-tokens", too_long])
    err = capsys.readouterr().err.rstrip("\n").rsplit("\n", 1)[-1]
    assert code == 2 and err.startswith("error: prompt + --max-new-tokens + the tree = ") and \
        err.endswith("more than the model's 512: lower --max-new-tokens"), err
    at = page("live_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="live_model").input(str(tiny_llama.model_dir))
    at.text_input(key="live_heads").input(str(tiny_llama.heads_dirs["2"]))
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_max_new").set_value(int(too_long))
    at.selectbox(key="live_tree").set_value("other: a path or literal").run()
    at.text_input(key="live_tree_spec").input("[[0], [1]]")
    at.button(key="live_go").click().run()
    no_exception(at)
    shown = errors(at)
    assert len(shown) == 1 and shown[0].startswith("prompt + 'max new tokens' + the tree = ") and \
        shown[0].endswith("more than the model's 512: lower 'max new tokens'") and "--" not in shown[0], shown
    assert at.number_input(key="live_max_new").label == "max new tokens"  # the control the error names
    # a sampling control set where the acceptance does not use it is named by its label too (the same rule as
    # `decode --acceptance greedy --temperature 0.5`)
    from workbench.decode.request import DecodeRequest
    from workbench.ui.live_page import LABELS
    from workbench.ui.widgets import clean_error

    with pytest.raises(Exception) as e:
        DecodeRequest(12, acceptance="greedy", temperature=0.5).rule()
    assert clean_error(e.value, LABELS) == "'Acceptance' greedy takes no 'temperature' (use typical or nucleus to " \
                                          "sample)"
    assert str(e.value) == "--acceptance greedy takes no --temperature (use typical or nucleus to sample)"


def test_a_calibration_error_names_the_flag_in_the_cli_and_the_sidebar_control_in_the_app(demo_files, monkeypatch,
                                                                                         capsys, tmp_path):
    """A second library error in both faces, on another page than the live one: a folder that is not a finished
    calibration (calibrate/folder.Calibration) is `--calibration DIR` to `workbench tree eval` and the sidebar's
    control on the trade-offs page: 'Calibration folder' where it was typed, 'Calibration' where it was picked."""
    from workbench.cli import main

    folder = tmp_path / "unfinished"
    folder.mkdir()
    code = main(["tree", "eval", "[[0], [1]]", "--calibration", str(folder)])
    err = capsys.readouterr().err.rstrip("\n").rsplit("\n", 1)[-1]
    said = f"{folder}: not a finished calibration folder (no meta.json/ranks.parquet; run `workbench calibrate` to " \
           "completion)"
    assert code == 2 and err == f"error: --calibration {said}", err
    at = page("tradeoffs_page", demo_files["root"], monkeypatch).run()
    at.selectbox(key="in_cal").set_value("other: type a folder").run()
    at.text_input(key="in_dir").input(str(folder)).run()
    no_exception(at)
    assert errors(at) == [f"'Calibration folder' {said}"], errors(at)
    assert at.text_input(key="in_dir").label == "Calibration folder"  # the control the error names
    from workbench.calibrate.folder import Calibration
    from workbench.ui.widgets import clean_error

    with pytest.raises(Exception) as e:
        Calibration(folder)
    assert clean_error(e.value) == f"'Calibration' {said}" and str(e.value) == f"--calibration {said}"
    assert at.selectbox(key="in_cal").label == "Calibration"


def test_a_plan_export_error_names_the_flag_in_the_cli_and_the_export_control_in_the_app(tmp_path, capsys):
    """A library error of the trade-offs page's plan exports (export/engines.export_plan): a batch size the plan
    does not speculate at has no tree to export; the CLI says `--batch-sizes B`, the page (EXPORT_LABELS, beside its
    'batch size to export' selector) names that control."""
    from workbench.cli import main
    from workbench.export.engines import export_plan
    from workbench.plan.plan_file import plan_json, read_plan
    from workbench.ui.plan_view import EXPORT_LABELS
    from workbench.ui.widgets import clean_error

    rows = [dict(batch_size=1, kind="chain", medusa_choices=[[0], [0, 0]], nodes=2, predicted_tokens_per_step=1.8,
                 predicted_speedup=1.5),
            dict(batch_size=8, kind="none", medusa_choices=[], nodes=0, predicted_tokens_per_step=1.0,
                 predicted_speedup=1.0)]
    alts = [dict(batch_size=b, speedup_range=None, runner_up=None, runner_up_within_noise=None,
                 best_chain=dict(k=k, predicted_tokens_per_step=t, predicted_speedup=s))
            for b, k, t, s in ((1, 2, 1.8, 1.5), (8, 0, 1.0, 1.0))]
    f = tmp_path / "plan.json"
    f.write_text(plan_json(dict(plans=rows, alternatives=alts, chain_acceptance=[0.6, 0.3],
                                source=dict(kind="accuracies", path="acc.csv"))))
    said = "the plan says no speculation at batch size 8: there is no tree to export for medusa (serve without " \
           "speculation, or export another {} B)"
    assert main(["export", str(f), "--format", "medusa", "--batch-sizes", "8"]) == 2
    err = capsys.readouterr().err.rstrip("\n").rsplit("\n", 1)[-1]
    assert err == "error: " + said.format("--batch-sizes"), err
    with pytest.raises(Exception) as e:
        export_plan(read_plan(f), "medusa", batch_size=8)
    assert clean_error(e.value, EXPORT_LABELS) == said.format("'batch size to export'")
    assert str(e.value) == said.format("--batch-sizes")


def _latency_faces(at: AppTest, bad: Path, cli_label: str, app_label: str, capsys, cal: Path) -> None:
    """The same latency file refused by `workbench optimize --latency` (one `error:` line naming the flag, exit 2) and
    by the sidebar's latency picker (an st.error naming its control, 'latency CSV'): one message, two faces."""
    from workbench.cli import main

    code = main(["optimize", "--calibration", str(cal), "--latency", str(bad)])
    err = capsys.readouterr().err.rstrip("\n").rsplit("\n", 1)[-1]
    assert code == 2 and err.startswith(f"error: --latency {cli_label}: "), err
    at.selectbox(key="in_lat_pick").set_value("other: type a path").run()
    at.text_input(key="in_lat_path").input(str(bad)).run()
    no_exception(at)
    said = err[len(f"error: --latency {cli_label}"):]
    assert f"'latency CSV' {app_label}{said}" in errors(at), (said, errors(at))
    assert not any("--latency" in e for e in errors(at)), errors(at)


def test_a_bad_latency_file_names_the_flag_in_the_cli_and_the_sidebar_control_in_the_app(demo_files, monkeypatch,
                                                                                          capsys, tmp_path):
    """Issue 70: read_latency names its request field, not `--latency`: the app read a bad file with the CLI's flag
    in its error. Both readers: the file's checks (latency_file.read_latency) and the surface read from it
    (plan/surface.Surface: a batch size and context without the 1-token step every cost is relative to)."""
    bad = tmp_path / "latency-bad.csv"
    pd.DataFrame([dict(context=128, tokens=n, seconds=0.0 if n == 4 else 0.01 * n) for n in (1, 2, 4)]).to_csv(
        bad, index=False)
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    _latency_faces(at, bad, str(bad), str(bad), capsys, demo_files["cal"])
    assert at.selectbox(key="in_lat_pick").label.endswith("latency CSV found here")  # the control the error names
    plain = tmp_path / "latency-no-plain.csv"  # read_latency takes it; the surface refuses it
    pd.DataFrame([dict(context=128, tokens=n, seconds=0.01 * n) for n in (2, 4, 8)]).to_csv(plain, index=False)
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    _latency_faces(at, plain, str(plain), plain.name, capsys, demo_files["cal"])
    assert any("has no 1-token row" in e for e in errors(at))


def test_tree_nodes_labelled_with_real_tokens(tiny_llama, demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    assert any("node label: rank" in c.value for c in at.caption)
    at.text_input(key="tree_tok_model").input(str(tiny_llama.model_dir))
    at.text_input(key="tree_tok_heads").input(str(tiny_llama.heads_dirs["2"]))
    at.button(key="tree_tokens_btn").click().run()
    no_exception(at)
    assert not errors(at), errors(at)
    table = at.session_state["head_tokens"]["table"]
    assert len(table) == 5 and all(len(row) == 10 for row in table)  # 5 heads x top-10
    assert any("node label: the token of its head" in c.value for c in at.caption)


def test_medusa_heads_accuracy_pt_upload(demo_files, monkeypatch):
    import io

    import torch

    hits = []
    for k, rate in enumerate((0.6, 0.4, 0.3)):  # Medusa's heads_accuracy.py output: per head bool [positions, topk]
        h = torch.zeros(100, 5, dtype=torch.bool)
        h[: int(rate * 100), 0] = True
        h[90:, 1] = True
        hits.append(h)
    buf = io.BytesIO()
    torch.save(hits, buf)
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.radio(key="in_src").set_value("accuracy file or pasted CSV").run()
    at.file_uploader(key="in_acc_upload").set_value(("vicuna_heads_accuracy.pt", buf.getvalue(),
                                                       "application/octet-stream")).run()
    no_exception(at)
    assert not errors(at), errors(at)
    assert metric(at, "depth") == "3"
    assert int(metric(at, "nodes")) == 14  # 2 ranks with hits per head: 2 + 4 + 8 positive paths
    at.file_uploader(key="in_acc_upload").set_value(("heads_accuracy.pt", b"not a torch file", "x")).run()
    no_exception(at)
    assert any("not a readable torch file" in e for e in errors(at)), errors(at)


# ----------------------------------------------------------------------------------------------- no crash, no lie

@pytest.fixture(scope="module")
def walk_files(tmp_path_factory) -> dict:
    """A calibration with two latency tables (one short, batched, with spread) and two sweeps: greedy-only and
    typical (helpers.make_walk_files)."""
    root = tmp_path_factory.mktemp("walk")
    return dict(root=root, cal=make_walk_files(root))


def options(at: AppTest, key: str) -> list:
    """A selectbox's options as shown (format_func applied; set_value takes them back), [] if it is not drawn."""
    return list(at.selectbox(key=key).options) if [s for s in at.selectbox if s.key == key] else []


def test_tradeoffs_walks_every_combination_of_its_inputs(walk_files, monkeypatch):
    """Every latency table x context x batch x sweep x typical sweep with every tab open, the budget left at the
    largest value the last table allowed (the StreamlitValueAboveMaxError of a longer table), then every quality,
    size and epsilon: no exception, no error, and one recommendation on every run."""
    at = page("tradeoffs_page", walk_files["root"], monkeypatch).run()
    no_exception(at)
    runs = 0

    def check(what: str) -> None:
        nonlocal runs
        runs += 1
        no_exception(at)
        assert not errors(at), (what, errors(at))
        assert sum(m.value.startswith("**Recommendation:** use ") for m in at.markdown) == 1, what

    for lat in options(at, "in_lat_pick")[:-1]:  # the last option types a path
        at.selectbox(key="in_lat_pick").set_value(lat).run()
        tokens = pd.read_csv(at.selectbox(key="in_lat_pick").value)["tokens"]
        for batch in options(at, "in_batch") or [None]:
            if batch is not None:
                at.selectbox(key="in_batch").set_value(int(batch)).run()
            for ctx in options(at, "in_ctx") or [None]:
                if ctx is not None:
                    at.selectbox(key="in_ctx").set_value(int(ctx)).run()
                for sweep in options(at, "to_sweep_pick")[:-1]:
                    at.selectbox(key="to_sweep_pick").set_value(sweep).run()
                    for typ in options(at, "to_typ_pick")[:-1]:
                        at.selectbox(key="to_typ_pick").set_value(typ).run()
                        for label in [t.label for t in at.tabs if t.label != "Latency and speedup"] + \
                                ["Latency and speedup"]:  # the budget's tab last
                            tab(at, label)
                            check(f"{lat} {batch} {ctx} {sweep} {typ} {label}")
                        budget = at.slider(key="to_budget")
                        assert budget.max == tokens.max() - 1
                        budget.set_value(budget.max).run()  # kept high for the next, shorter table
                        check(f"{lat} budget {budget.max}")
    assert runs >= 2 * 2 * 2 * 2 * 5
    tab(at, "Typical acceptance (Fig. 5)")
    for quality in options(at, "to_quality"):
        at.selectbox(key="to_quality").set_value(quality).run()
        check(quality)
        for nodes in options(at, "to_nodes") or [None]:
            if nodes is not None:
                at.selectbox(key="to_nodes").set_value(int(nodes)).run()
            for eps in at.select_slider(key="to_eps").options:
                at.select_slider(key="to_eps").set_value(float(eps)).run()
                check(f"{quality} {nodes} {eps}")
    at.radio(key="in_src").set_value("accuracy file or pasted CSV").run()
    at.text_input(key="in_acc_path").input(str(walk_files["cal"] / "accuracies.csv")).run()
    check("accuracy table")


def test_designer_walks_its_models_latencies_and_trees(walk_files, monkeypatch):
    """Every acceptance model with every latency table (batch and context), every tab below the tree, and the sliders
    at their ends, then every tree on display and every tree to compare with: no exception, no error, the drawn tree
    is the one named."""
    at = page("tree_page", walk_files["root"], monkeypatch).run()
    no_exception(at)

    def check(what: str) -> None:
        no_exception(at)
        assert not errors(at), (what, errors(at))

    for model in at.radio(key="tree_model").options:
        at.radio(key="tree_model").set_value(model).run()
        for lat in options(at, "in_lat_pick")[:-1]:
            at.selectbox(key="in_lat_pick").set_value(lat).run()
            for batch in options(at, "in_batch") or [None]:
                if batch is not None:
                    at.selectbox(key="in_batch").set_value(int(batch)).run()
                check(f"{model} {lat} {batch}")
                for label in [t.label for t in at.tabs][1:] + ["Export"]:  # every tab; the export's last
                    tab(at, label, "tree_tab")
                    check(f"{model} {lat} {batch} {label}")
                for key, value in (("tree_budget", 1), ("tree_depth", 1), ("tree_rank", 1), ("tree_budget", 256),
                                   ("tree_depth", 4), ("tree_rank", 10)):
                    at.slider(key=key).set_value(value).run()
                    check(f"{model} {lat} {key}={value}")
                if model == "hardware-aware":
                    assert tree_file(at)["name"] == f"hardware_{metric(at, 'nodes')}"
    at.radio(key="tree_model").set_value("independence").run()
    shown = options(at, "tree_show")
    assert shown[0] == "the optimizer's (sidebar settings)" and any(s.startswith("recommended: ") for s in shown)
    for label in shown:
        at.selectbox(key="tree_show").set_value(label).run()
        check(label)
        assert at.selectbox(key="tree_show").value == label
        assert tree_file(at)["name"] in label or label.startswith("the optimizer")
    at.selectbox(key="tree_show").set_value(shown[1]).run()
    for other in options(at, "tree_compare"):
        at.selectbox(key="tree_compare").set_value(other).run()
        check(other)


def test_budget_kept_from_a_longer_latency_table_is_clamped(walk_files, monkeypatch):
    """The crash of the issue: budget 255 on a 256-token table, then a table that stops at 16 tokens."""
    at = page("tradeoffs_page", walk_files["root"], monkeypatch).run()
    long, short = (next(o for o in options(at, "in_lat_pick") if o.endswith(name))
                   for name in ("latency-cpu.csv", "latency-batched.csv"))
    at.selectbox(key="in_lat_pick").set_value(long).run()
    tab(at, "Latency and speedup")
    at.slider(key="to_budget").set_value(255).run()
    at.selectbox(key="in_lat_pick").set_value(short).run()
    no_exception(at)
    assert at.slider(key="to_budget").value == at.slider(key="to_budget").max == 15


def test_optimizer_sliders_are_disabled_for_another_tree(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    assert not at.slider(key="tree_budget").disabled
    at.selectbox(key="tree_show").set_value("reference: mc_sim_7b_63").run()
    for key in ("tree_budget", "tree_depth", "tree_rank"):
        s = at.slider(key=key)
        assert s.disabled and "applies to the optimizer's tree only; the tree on display is mc_sim_7b_63" in s.help
    at.selectbox(key="tree_show").set_value("the optimizer's (sidebar settings)").run()
    assert not at.slider(key="tree_budget").disabled


def test_malformed_paste_leaves_the_selector_telling_the_truth(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="tree_user_spec").input("[[0], [1], [0, 0], [0, 1]]").run()
    at.selectbox(key="tree_show").set_value("yours: your tree").run()
    assert int(metric(at, "nodes")) == 4
    at.text_input(key="tree_user_spec").input("[[0], [1], [0, 0], [0, 1").run()
    no_exception(at)
    assert any(e.startswith("your tree: ") for e in errors(at))
    assert at.selectbox(key="tree_show").value == "the optimizer's (sidebar settings)"  # what is drawn
    assert any("your tree is no longer available: showing the optimizer's tree" in i.value for i in at.info)
    assert int(metric(at, "nodes")) == 63
    assert not at.slider(key="tree_budget").disabled  # the optimizer's tree is drawn: its settings apply


def test_selection_follows_the_node_through_edits(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.selectbox(key="tree_show").set_value("reference: mc_sim_7b_63").run()
    names = [None] + sorted(tree_file(at)["medusa_choices"], key=lambda p: (len(p), p))
    row = names.index([0, 0, 1])
    at.selectbox(key="tree_focus_pick").set_value(row).run()
    assert any(m.value.startswith(f"**row {row}**: node `[0, 0, 1]`") for m in at.markdown)
    at.text_input(key="tree_add").input("1,9").run()  # depth 2 sorts before [0, 0, 1]: later rows move down one
    at.button(key="tree_add_btn").click().run()
    no_exception(at)
    assert not errors(at)
    assert at.selectbox(key="tree_focus_pick").value == row + 1
    assert any(m.value.startswith(f"**row {row + 1}**: node `[0, 0, 1]`") for m in at.markdown)
    at.selectbox(key="tree_remove").set_value("[0, 0]").run()  # removes [0, 0, 1] too: nothing is selected
    at.button(key="tree_remove_btn").click().run()
    no_exception(at)
    assert at.selectbox(key="tree_focus_pick").value == -1
    assert at.selectbox(key="tree_remove").value is None  # the removed node is not kept in the box
    at.button(key="tree_remove_btn").click().run()
    assert errors(at) == ["pick a node to remove first"]


def test_upload_is_kept_across_pages(demo_files, monkeypatch):
    body = "import streamlit as st\napp.keep_settings()\ngetattr(app, st.session_state.get('page', 'tree_page'))()\n"
    at = page("tree_page", demo_files["root"], monkeypatch, body).run()
    at.radio(key="in_src").set_value("accuracy file or pasted CSV").run()
    csv = b"head,rank,accuracy\n1,1,0.6\n1,2,0.2\n2,1,0.3\n2,2,0.1\n"
    at.file_uploader(key="in_acc_upload").set_value(("mine.csv", csv, "text/csv")).run()
    assert int(metric(at, "nodes")) == 6
    at.session_state["page"] = "calibration_page"
    at.run()
    # the shared input: the upload here too (a table, not the calibration folder the page would otherwise open)
    assert any("Measured path probabilities need the ranks" in i.value for i in at.info), [i.value for i in at.info]
    at.session_state["page"] = "tree_page"
    at.run()
    no_exception(at)
    assert at.radio(key="in_src").value == "accuracy file or pasted CSV"
    assert int(metric(at, "nodes")) == 6 and metric(at, "depth") == "2"  # still the upload, not nothing
    at.file_uploader(key="in_acc_upload").clear().run()  # removed by the user: the kept copy goes too
    assert not at.metric and any("Give an accuracy table" in i.value for i in at.info)


def test_recommendation_is_the_same_on_both_pages_and_shows_its_tree(walk_files, monkeypatch):
    def sentence(at):
        return next(m.value for m in at.markdown if m.value.startswith("**Recommendation:** "))

    tree = page("tree_page", walk_files["root"], monkeypatch).run()
    trade = page("tradeoffs_page", walk_files["root"], monkeypatch).run()
    assert tree.selectbox(key="in_lat_pick").value == trade.selectbox(key="in_lat_pick").value
    said = sentence(tree)
    assert said == sentence(trade)
    # the answer names the calibration, its statistic and the latency table it rests on
    assert said.startswith("**Recommendation:** use tree ") and " at batch 1 and context 128 (calibration cal, " \
        "predicted_replay; latency latency-cpu.csv): predicted " in said and "tokens/step and " in said
    assert "(no spread measured)" in said  # the calibration's latency CSV has medians only
    candidates = table(tree, "candidate")
    assert list(candidates["speedup"]) == sorted(candidates["speedup"], reverse=True)
    kinds = {c.split()[0] for c in candidates["candidate"]}
    assert kinds == {"tree", "chain", "no"}  # trees, chains and no speculation
    pick = candidates.iloc[0]
    tree.button(key="tree_show_btn").click().run()
    no_exception(tree)
    assert tree.selectbox(key="tree_show").value.startswith("recommended: ")
    assert tree.selectbox(key="tree_show").value[len("recommended: "):] in pick["candidate"]
    assert f"({metric(tree, 'nodes')} nodes)" in pick["candidate"]
    assert metric(tree, "predicted speedup") == f"{pick['speedup']:.2f}x"  # the same number
    # the batched table with its spread: a range, and batch 4 where the table says
    short = next(o for o in options(trade, "in_lat_pick") if o.endswith("latency-batched.csv"))
    trade.selectbox(key="in_lat_pick").set_value(short).run()
    assert "x from the latency quartiles)" in sentence(trade)
    trade.selectbox(key="in_batch").set_value(4).run()
    assert " at batch 4 and context 128" in sentence(trade)


def test_measurements_that_contradict_the_prediction(walk_files, monkeypatch, tmp_path):
    """Sweeps of other trees weigh nothing against the pick; a sweep in the latency table's setting that contradicts
    the prediction puts a warning in words at the top."""
    from workbench.calibrate.folder import Calibration
    from workbench.measure.latency_file import read_latency
    from workbench.plan.recommend import recommend

    at = tab(page("tradeoffs_page", walk_files["root"], monkeypatch).run(), "Sweep (Fig. 4)")
    assert not any(w.value.startswith("Measurements disagree") for w in at.warning)
    pick = recommend(Calibration(walk_files["cal"]), read_latency(walk_files["cal"] / "latency-cpu.csv"),
                     target=128)["pick"]
    root = tmp_path / "root"
    import shutil
    shutil.copytree(walk_files["root"], root)
    make_current_sweep(root, walk_files["cal"])
    at = page("tradeoffs_page", root, monkeypatch).run()
    no_exception(at)
    warning = at.warning[0].value  # the first thing on the page
    assert warning.startswith("Measurements disagree with the prediction by more than their noise: ")
    assert f"measured {pick['speedup'] / 3:.2f}x +- " in warning
    assert "c-current.csv, 20 prompts" in warning


def test_an_edited_file_is_read_again(walk_files, monkeypatch, tmp_path):
    """Every cache is keyed by its files' modification time and size: a sweep edited after the page first drew is
    what the next run shows, even when the edit kept the modification time (a copy with `cp -p`)."""
    import os
    import shutil

    root = tmp_path / "root"
    shutil.copytree(walk_files["root"], root)
    sweep = make_current_sweep(root, root / walk_files["cal"].name)
    at = page("tradeoffs_page", root, monkeypatch).run()
    assert "c-current.csv, 20 prompts" in at.warning[0].value
    df = pd.read_csv(sweep)
    df["num_prompts"] = 40
    df.to_csv(sweep, index=False)
    at.run()
    no_exception(at)
    assert "c-current.csv, 40 prompts" in at.warning[0].value
    stamp = os.stat(sweep).st_mtime_ns
    df["num_prompts"] = 400  # one character longer, same modification time
    df.to_csv(sweep, index=False)
    os.utime(sweep, ns=(stamp, stamp))
    at.run()
    assert "c-current.csv, 400 prompts" in at.warning[0].value


def test_engine_repair_is_a_button(demo_files, monkeypatch):
    at = page("tree_page", demo_files["root"], monkeypatch).run()
    at.text_input(key="tree_user_spec").input("[[0], [2], [0, 0], [2, 0]]").run()
    at.selectbox(key="tree_show").set_value("yours: your tree").run()
    assert any("first level lacks rank(s) 1" in w.value for w in at.warning)
    at.button(key="tree_repair_trtllm_btn").click().run()
    no_exception(at)
    rec = tree_file(at)
    assert rec["name"] == "your tree_trtllm_safe" and rec["method"] == "repaired trtllm-safe"
    from workbench.export.trtllm import first_level_gaps
    from workbench.trees.tree import load_tree
    assert not first_level_gaps(load_tree(rec["medusa_choices"]))
    assert not any("first level lacks" in w.value for w in at.warning)
    assert any(i.value.startswith("engine-safe for trtllm: 4 -> ") for i in at.info)
    at.button(key="tree_reset_btn").click().run()
    at.button(key="tree_best_vllm_btn").click().run()
    from workbench.export.vllm import vllm_uniform
    assert vllm_uniform(load_tree(tree_file(at)["medusa_choices"]))
    assert all("/" not in str(v) for k, v in tree_file(at).items() if k != "medusa_choices")  # no server paths


def test_tradeoffs_plan_per_batch_size(walk_files, monkeypatch):
    """A latency table with several batch sizes: the page plans per batch size (tree, chain or none), draws the
    predicted speedup of each kind against batch size, and offers the plan and each engine's output."""
    from workbench.calibrate.folder import Calibration
    from workbench.plan.rank import make_plan
    from workbench.plan.source import plan_source

    at = page("tradeoffs_page", walk_files["root"], monkeypatch).run()
    batched = next(o for o in options(at, "in_lat_pick") if str(o).endswith("latency-batched.csv"))
    at.selectbox(key="in_lat_pick").set_value(batched).run()
    no_exception(at)
    assert not errors(at)
    tab(at, "Plan per batch size")
    line = next(m.value for m in at.markdown if m.value.startswith("batch 1: **"))
    plan = make_plan(plan_source(calibration=Calibration(walk_files["cal"]).folder),
                     walk_files["root"] / "latency-batched.csv", [1, 4])
    for row in plan["plans"]:  # the page says what the library planned
        assert f"batch {row['batch_size']}: **" in line and f"{row['predicted_speedup']:.2f}x" in line


def test_plan_exports_every_batch_size_readably_without_server_paths(monkeypatch):
    """On the committed data: every batch size's row goes out in every static format (a batch-2 tree too), the
    notes are one list in an expander, not captions in narrow columns, no download holds this checkout's absolute
    path, and the batch whose plain step is off its trend is flagged."""
    from workbench.export.engines import export_plan

    monkeypatch.delenv("WORKBENCH_CALIBRATION_ROOT", raising=False)
    monkeypatch.delenv("WORKBENCH_RESULTS_ROOT", raising=False)
    at = tab(page("tradeoffs_page", None, monkeypatch).run(), "Plan per batch size")
    no_exception(at)
    assert any(w.value.startswith("Batch 2's row rests on latency measurements off their trend: batch 2's plain "
                                  "step (1 token) 0.160 s") for w in at.warning), [w.value for w in at.warning]
    assert at.selectbox(key="to_plan_batch").options == ["1", "2", "4", "8"]
    notes = [e for e in at.expander if e.label.startswith("Export notes and warnings")]
    assert len(notes) == 1 and notes[0].markdown[0].value.startswith("- **")
    assert not [c.value for c in at.caption if c.value.startswith(("vllm", "trtllm", "medusa", "eagle"))]
    at.selectbox(key="to_plan_batch").set_value(2).run()
    no_exception(at)
    files = {d.proto.label: d.proto for d in at.get("download_button") if d.proto.id.endswith("_download")
             and "to_plan_" in d.proto.id}
    assert {"plan", "vllm", "vllm-tree", "trtllm", "medusa", "eagle", "json"} <= set(files), sorted(files)
    text = " ".join(m.value for e in at.expander if e.label.startswith("Export notes") for m in e.markdown)
    assert "the batch-size 2 row" in text and str(REPO_ROOT) not in text  # batch 2's tree, no server path
    from workbench.plan.plan_file import check_plan
    from workbench.plan.rank import make_plan
    from workbench.plan.source import plan_source
    from workbench.ui.widgets import relative_paths

    cal = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    made = check_plan(make_plan(plan_source(calibration=cal), cal / "latency-cpu.csv", (1, 2, 4, 8)))
    raw = export_plan(made, "vllm")[0]
    assert str(REPO_ROOT) in raw  # the engine's config names the heads by absolute path ...
    assert str(REPO_ROOT) not in relative_paths(raw) and "workbench/heads/" in relative_paths(raw)  # ... not a download


def test_vllm_check_tab_shows_the_plans_speedup_beside_vllms(tmp_path, monkeypatch):
    """The vLLM answer shows both speeds per batch size and names the surface the plan was priced on."""
    saved = json.loads((Path(__file__).resolve().parents[1] / "docs/results/vllm-check-cpu.json").read_text())
    saved |= dict(priced_on=dict(engine="vllm", engine_version="0.32.0", file="latency-vllm-cpu.csv"),
                  surface_prompts_left_out=4,
                  plan_check=[dict(batch_size=1, plan_k=1, predicted_speedup=1.07, measured_speedup=1.05,
                                   measured_range=[1.03, 1.08], error=1.07 / 1.05 - 1, best_k=1, best_speedup=1.05,
                                   choice_is_best_or_within_noise=True)])
    (tmp_path / "vllm-check-x.json").write_text(json.dumps(saved))
    at = tab(page("tradeoffs_page", tmp_path, monkeypatch).run(), "vLLM check")
    no_exception(at)
    assert "The plan's speedup in vLLM" in [s.value for s in at.subheader]
    assert any("Priced on vllm 0.32.0 step costs (latency-vllm-cpu.csv)" in c.value for c in at.caption)
    shown = at.dataframe[-1].value
    assert shown["predicted"].tolist() == [1.07] and shown["measured"].tolist() == [1.05]
    assert shown["predicted vs measured"].tolist() == ["+1.9%"]
    assert "Plain decoding: vLLM and our decoder" not in [s.value for s in at.subheader]  # not in that check
    saved |= dict(vllm_compilation="DYNAMO_TRACE_ONCE", plain_step=[dict(
        batch_size=1, vllm_ms=40.4, ours_ms=46.4, ratio=1.118, ratio_q1=1.112, ratio_q3=1.218, passes=3)])
    (tmp_path / "vllm-check-x.json").write_text(json.dumps(saved))
    at = tab(page("tradeoffs_page", tmp_path, monkeypatch).run(), "vLLM check")
    no_exception(at)
    assert "Plain decoding: vLLM and our decoder" in [s.value for s in at.subheader]
    shown = at.dataframe[-1].value
    assert shown["ours / vLLM"].tolist() == [1.118] and shown["q1..q3"].tolist() == ["1.112..1.218"]


def test_plan_optimize_the_app_and_the_recommendation_name_one_candidate(monkeypatch, tmp_path):
    """On the committed calibration and its latency-cpu.csv, at every batch size the table timed: `workbench plan`,
    `optimize --latency` (its choice, or its best speculating runner-up where no speculation wins), the app's
    recommendation and recommend.recommend name the same candidate with the same predicted speedup (one weighing,
    plan/weigh.py, behind all four)."""
    from workbench.calibrate.folder import Calibration
    from workbench.cli import main
    from workbench.measure.latency_file import read_latency
    from workbench.plan.plan_file import read_plan
    from workbench.plan.recommend import recommend

    cal = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    lat = cal / "latency-cpu.csv"
    batches = sorted(int(b) for b in read_latency(lat)["batch"].unique())
    assert len(batches) > 1
    out, tree_out = tmp_path / "plan.json", tmp_path / "tree.json"
    assert main(["plan", "--calibration", str(cal), "--latency", str(lat), "--batch-sizes",
                 ",".join(map(str, batches)), "--out", str(out)]) == 0
    plan = read_plan(out)
    monkeypatch.delenv("WORKBENCH_CALIBRATION_ROOT", raising=False)
    monkeypatch.delenv("WORKBENCH_RESULTS_ROOT", raising=False)
    at = page("tree_page", None, monkeypatch).run()
    at.selectbox(key="in_lat_pick").set_value(next(o for o in options(at, "in_lat_pick")
                                                   if str(o).endswith("/latency-cpu.csv"))).run()
    kinds = set()
    for b, row, alt in zip(batches, plan["plans"], plan["alternatives"]):
        assert row["batch_size"] == b
        kinds.add(row["kind"])
        assert main(["optimize", "--calibration", str(cal), "--latency", str(lat), "--batch-sizes", str(b),
                     "--out", str(tree_out)]) == 0
        written = json.loads(tree_out.read_text())
        speculating = row if row["kind"] != "none" else alt["runner_up"]
        assert written["medusa_choices"] == speculating["medusa_choices"]
        assert written["predicted_speedup"] == speculating["predicted_speedup"]
        rec = recommend(Calibration(cal), read_latency(lat), batch=b, latency_name=lat.name)
        pick = rec["pick"]
        assert pick["kind"] == row["kind"] and pick["speedup"] == row["predicted_speedup"]
        assert (pick["tree"].as_lists() if pick["tree"] is not None else []) == row["medusa_choices"]
        assert rec["context"] == plan["latency"]["context"]
        at.selectbox(key="in_batch").set_value(b).run()
        no_exception(at)
        said = next(m.value for m in at.markdown if m.value.startswith("**Recommendation:** "))
        label = "no speculation" if row["kind"] == "none" else pick["label"]
        assert said.startswith(f"**Recommendation:** use {label} at batch {b} and context {rec['context']} "), said
        assert row["kind"] == "none" or f"{row['predicted_speedup']:.2f}x" in said, said
    assert len(kinds) > 1  # the answer changes with the batch size, so the test can tell the four apart
