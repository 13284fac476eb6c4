"""The plan file (read and written here only):
  {"version": PLAN_VERSION, "plans": [{"batch_size", "kind": "tree" | "chain" | "none" | "dynamic", "medusa_choices",
              "nodes",
              "predicted_tokens_per_step", "predicted_speedup",
              "predicted_batch_tokens_per_step"}, ...],  # one row per batch size, ascending; the last is optional
   "alternatives": [{"batch_size", "speedup_range", "runner_up", "runner_up_within_noise", "best_chain",
                     "chains": [{"k", "predicted_tokens_per_step", "predicted_batch_tokens_per_step",
                                 "predicted_speedup", "speedup_range"}, ...],  # chains: every K weighed, 0 = none
                     "set_aside"}, ...],  # only with "within_noise": the fastest, where the rule answered none
   "chain_acceptance": [p_1, ..., p_K],  # per-position unconditional acceptance of the top-1 chain
   "source": {..., "prediction", "max_new_tokens", "regime"},
   "latency": {"file", "context", "spread", "model", "device", "dtype", "setting" (provenance.setting of the table, null
               when it was not recorded), "mode" (decoder-step | verify | vllm-round | unknown), "engine" (whose
               steps it timed: workbench | vllm; what the plan is priced on), "engine_version", "dynamic" (null: the
               table timed no per-step tree; else {"envelope": the nodes of the envelope it timed, "weighed",
               "medusa_choices" (the plan's envelope: the calibration's best paths up to that many) or "why"})},
   "within_noise": "none" (absent: "fastest"; weigh.NOISE_RULES: a choice within the latency noise of no
                   speculation answered none), "workbench_version", "created"}
`predicted_tokens_per_step` is what each sequence measures (a decoder's tokens/step); the speedup divides
`predicted_batch_tokens_per_step` instead: B sequences side by side step until the slowest is done (absent in
version 1 files: upgrade_plan). `medusa_choices` is [] for "none" and [[0], [0, 0], ...] for a chain of length
K; for "dynamic" (a per-step tree: each step the `nodes` best of its envelope, rank.py) the envelope's, of more
nodes. `runner_up` is the best candidate of another kind; `runner_up_within_noise` says whether the two speedup ranges
over the latency's interquartile range overlap (null without a spread in the CSV). `best_chain` is the best chain
or none (k = 0) at that batch size: what an engine without trees (vLLM since PR #42121) should run instead of a tree.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from workbench import WorkbenchError
from workbench.core.io import read_json
from workbench.core.provenance import differences, read_setting
from workbench.core.speed import prediction_error
from workbench.measure.sweep_file import checked_speedup
from workbench.plan.source import check_acceptance
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.tree import MAX_DEPTH, MAX_NODES, Tree, is_chain, load_tree, make_tree

KINDS = ("tree", "chain", "none", "dynamic")
PLAN_VERSION = 3  # the plan file's "version" (3: the latency's engine, engine_version); 1: files without it (upgrade_plan)
PLAN_ROW = ("batch_size", "kind", "medusa_choices", "nodes", "predicted_tokens_per_step", "predicted_speedup")


def plan_engine(plan: dict) -> tuple[str, str | None]:
    """(engine, version) whose step costs a checked plan (check_plan) was priced on: its latency table's
    (latency_file.ENGINES)."""
    lat = plan.get("latency") or {}
    return str(lat.get("engine") or "workbench"), lat.get("engine_version")


def plan_json(plan: dict) -> str:
    """The plan as JSON with one line per plan row (a 64-node tree stays one line, not 200)."""
    parts = []
    for k, v in plan.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            rows = ",\n".join("    " + json.dumps(x) for x in v)
            parts.append(f"  {json.dumps(k)}: [\n{rows}\n  ]")
        else:
            parts.append(f"  {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def looks_like_plan(path) -> bool:
    """A JSON file whose top level is an object with a "plans" key (what export takes as a plan, not a tree)."""
    p = Path(str(path))
    if not (p.suffix.lower() == ".json" and p.is_file()):
        return False
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError, RecursionError):  # not a plan: the tree reader says what it is
        return False
    return isinstance(data, dict) and "plans" in data


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_plan(path) -> dict:
    """A plan file, checked (check_plan)."""
    what = f"plan {path}"
    return check_plan(read_json(path, what), what)


def upgrade_plan(data: dict) -> dict:
    """A plan of version 1 (no "version": its rows may lack predicted_batch_tokens_per_step, which no reader needs;
    its latency's "heads_cost" is "head_cost" now) or 2 (before the engine it was priced on was recorded: every
    such plan was priced on our decoder's steps) as this version. The only place the earlier shapes live;
    check_plan calls it."""
    latency = data.get("latency")
    if isinstance(latency, dict):
        latency = {("head_cost" if k == "heads_cost" else k): v for k, v in latency.items()}
        latency = dict(engine="workbench", engine_version=None) | latency
    return {**data, "version": PLAN_VERSION, **({"latency": latency} if latency is not None else {})}


def check_plan(data, what: str = "plan") -> dict:
    """A plan file at this version (upgrade_plan), checked: rows with PLAN_ROW, distinct ascending batch sizes >= 1, each row's kind matching its
    medusa_choices (none: [], chain: [[0], [0, 0], ...]), nodes = their count, positive finite predictions; a
    chain_acceptance vector as check_acceptance wants it."""
    if not isinstance(data, dict) or not isinstance(data.get("plans"), list) or not data["plans"]:
        raise WorkbenchError(f"{what}: not a plan file (an object with a non-empty \"plans\" list; `workbench plan` "
                             "writes it)")
    if data.get("version", 1) in (1, 2):
        data = upgrade_plan(data)
    if data["version"] != PLAN_VERSION:
        raise WorkbenchError(f"{what}: version {str(data['version'])[:20]!r}, but this workbench reads plans of version "
                             f"{PLAN_VERSION}: make it again with `workbench plan`")
    last = 0
    for i, row in enumerate(data["plans"]):
        where = f"{what}: plans[{i}]"
        if not isinstance(row, dict) or any(k not in row for k in PLAN_ROW):
            raise WorkbenchError(f"{where} needs keys {', '.join(PLAN_ROW)}")
        b = row["batch_size"]
        if isinstance(b, bool) or not isinstance(b, int) or b <= last:
            raise WorkbenchError(f"{where}: batch_size must be an integer >= 1, ascending and unique (found "
                                 f"{str(b)[:20]!r})")
        last = b
        if row["kind"] not in KINDS:
            raise WorkbenchError(f"{where}: kind must be one of {', '.join(KINDS)}")
        if not (_number(row["predicted_tokens_per_step"]) and _number(row["predicted_speedup"]) and
                row["predicted_tokens_per_step"] >= 1 and row["predicted_speedup"] > 0):
            raise WorkbenchError(f"{where}: predicted_tokens_per_step (>= 1) and predicted_speedup (> 0) must be "
                                 "finite numbers")
        choices = row["medusa_choices"]
        if row["kind"] == "none":
            ok = choices == [] and row["nodes"] == 0
        else:
            tree = load_tree(choices if isinstance(choices, list) and choices else "[]")
            if row["kind"] == "dynamic":
                n = row["nodes"]
                ok = not isinstance(n, bool) and isinstance(n, int) and 1 <= n <= tree.nodes
                tree = DynamicPolicy(n, tree) if ok else tree
            else:
                ok = row["nodes"] == tree.nodes and (row["kind"] == "tree" or is_chain(tree))
            row["tree"] = tree
        if not ok:
            raise WorkbenchError(f"{where}: kind {row['kind']!r} does not match its medusa_choices and nodes (none: [] "
                                 "and 0; chain: [[0], [0, 0], ...]; nodes: their count; dynamic: 1 <= nodes <= "
                                 "the envelope's)")
    if data.get("chain_acceptance"):  # [] when even the first head's top-1 guess is never right
        data["chain_acceptance"] = check_acceptance(data["chain_acceptance"], None, f"{what}: chain_acceptance")
    alts = data.get("alternatives")
    if alts is not None and (not isinstance(alts, list) or len(alts) != len(data["plans"]) or
                             any(not isinstance(a, dict) or a.get("batch_size") != r["batch_size"]
                                 for a, r in zip(alts, data["plans"]))):
        raise WorkbenchError(f"{what}: alternatives must list the same batch sizes as plans")
    for a in alts or []:
        for key in ("runner_up", "best_chain"):
            _object(a.get(key), f"{what}: alternatives at batch size {a['batch_size']}: {key}")
        k = (a.get("best_chain") or {}).get("k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise WorkbenchError(f"{what}: alternatives best_chain k must be an integer >= 0")
        runner = a.get("runner_up") or {}
        if runner and (runner.get("kind") not in KINDS or not isinstance(runner.get("medusa_choices"), list)):
            raise WorkbenchError(f"{what}: alternatives at batch size {a['batch_size']}: runner_up needs a kind "
                                 f"({', '.join(KINDS)}) and a medusa_choices list")
        if runner.get("medusa_choices"):
            load_tree(runner["medusa_choices"])
        if not isinstance(a.get("chains", []), list) or not all(isinstance(c, dict) for c in a.get("chains", [])):
            raise WorkbenchError(f"{what}: alternatives at batch size {a['batch_size']}: chains should be a list of "
                                 "objects")
    _check_shape(data, what)
    return data


def _object(v, where: str) -> None:
    """A field that holds an object (or null): a string or a list there is a hand edit gone wrong."""
    if v is not None and not isinstance(v, dict):
        raise WorkbenchError(f"{where} should be a JSON object (or null), found {type(v).__name__}: make the plan "
                             "again with `workbench plan`")


def _check_shape(data: dict, what: str) -> None:
    """The plan's objects are objects; no row drafts past the heads it was planned for (its source's num_heads: a chain
    of K > heads would reach a vLLM config or vllm-check as it is); a timed envelope of a size a step can hold."""
    for key in ("source", "latency"):
        _object(data.get(key), f"{what}: {key}")
    lat = data.get("latency") or {}
    _object(lat.get("setting"), f"{what}: latency.setting")
    _object(lat.get("dynamic"), f"{what}: latency.dynamic")
    if lat.get("engine") is not None and not isinstance(lat.get("engine"), str):
        raise WorkbenchError(f"{what}: latency.engine should be a name (workbench or vllm), found "
                             f"{type(lat['engine']).__name__}")
    env = (lat.get("dynamic") or {}).get("envelope")
    if env is not None and (isinstance(env, bool) or not isinstance(env, int) or not 1 <= env <= MAX_NODES):
        raise WorkbenchError(f"{what}: latency.dynamic.envelope should be a node count in 1..{MAX_NODES} (the verify "
                             f"step's mask is nodes^2), found {str(env)[:20]!r}: make the plan again")
    heads = (data.get("source") or {}).get("num_heads")
    if heads is None:
        return
    if isinstance(heads, bool) or not isinstance(heads, int) or not 1 <= heads <= MAX_DEPTH:
        raise WorkbenchError(f"{what}: source.num_heads should be an integer in 1..{MAX_DEPTH}, found "
                             f"{str(heads)[:20]!r}")
    alts = {a["batch_size"]: a for a in data.get("alternatives") or []}
    for row in data["plans"]:
        alt = alts.get(row["batch_size"], {})
        deep = [row["tree"].depth if "tree" in row else 0,
                len((alt.get("runner_up") or {}).get("medusa_choices") and
                    max(alt["runner_up"]["medusa_choices"], key=len) or []),
                (alt.get("best_chain") or {}).get("k") or 0]
        if max(deep) > heads:
            raise WorkbenchError(f"{what}: batch size {row['batch_size']} drafts {max(deep)} tokens deep, but the plan "
                                 f"was made for {heads} heads (source.num_heads): a K past the heads cannot be "
                                 "served; make the plan again with `workbench plan`")



def plan_trees(plan: dict) -> list[tuple[Tree, int, dict]]:
    """(tree, batch size, plan entry) for every tree or chain a plan weighs at each batch size: its choice and its
    runner-up ("none" has no tree: vanilla runs at every batch size of a sweep anyway). The live check of a plan
    (`workbench sweep --plan`) decodes exactly these; the name carries the batch size and role, so that
    `plan_check` finds each sweep row's plan entry."""
    out = []
    alternatives = {a["batch_size"]: a for a in plan.get("alternatives", []) if isinstance(a, dict)}
    for row in plan["plans"]:
        b = row["batch_size"]
        entries = [("choice", row)]
        runner = (alternatives.get(b) or {}).get("runner_up")
        if isinstance(runner, dict) and runner.get("medusa_choices"):
            entries.append(("runner_up", runner))
        for role, entry in entries:
            if entry["medusa_choices"]:
                tree = make_tree(entry["medusa_choices"], name=_base_name(b, role, entry))
                out.append((DynamicPolicy(entry["nodes"], tree) if entry["kind"] == "dynamic" else tree, b, entry))
    return out


def _base_name(b: int, role: str, entry: dict) -> str:
    return f"plan_b{b}_{role}_{entry['kind']}_{len(entry['medusa_choices'])}"


def plan_entry_name(b: int, role: str, entry: dict) -> str:
    """The sweep row name of a plan entry: its tree's; a per-step tree's policy name and its envelope's (as
    run_sweep names it)."""
    name = _base_name(b, role, entry)
    return f"{DynamicPolicy(entry['nodes'], make_tree(entry['medusa_choices'])).name}_{name}" \
        if entry["kind"] == "dynamic" else name


def plan_check(plan: dict, sweep: pd.DataFrame) -> pd.DataFrame:
    """The plan's prediction beside the live decoder's measurement, per batch size: the choice (and its
    runner-up) as decoded by `workbench sweep --plan` at that batch size, greedy, against vanilla at the same batch
    size. "none" is vanilla itself: speedup 1 by definition. The measured speedup is the decoding phase's, as
    predicted (sweep_file.checked_speedup; measured_phase says when a row only has the end-to-end one).
    err_% = core.speed.prediction_error (predicted / measured - 1). setting_differs: how
    the sweep's setting differs from the plan's latency table's (provenance.differences; empty when they match):
    a prediction from another setting is not comparable."""
    rows = []
    alternatives = {a["batch_size"]: a for a in plan.get("alternatives", []) if isinstance(a, dict)}
    for row in plan["plans"]:
        b = row["batch_size"]
        at = sweep[(sweep["batch_size"] == b) & (sweep["acceptance"] == "greedy")]
        runner = (alternatives.get(b) or {}).get("runner_up") or {}
        for role, entry in (("choice", row), ("runner_up", runner)):
            if not entry:
                continue
            if entry["kind"] == "none":
                measured = at[at["kind"] == "vanilla"]
                tps, spd, exact, phase = 1.0, 1.0, 1.0, "by definition"
                if measured.empty:
                    continue
            else:
                measured = at[at["tree"] == plan_entry_name(b, role, entry)]
                if measured.empty:
                    continue
                m = measured.iloc[-1]
                tps, exact = m["tokens_per_step"], m["exact_match"]
                spd, phase = checked_speedup(m)
            where = read_setting(measured.iloc[-1].to_dict()) if "setting" in measured.columns else None
            rows.append(dict(batch_size=b, role=role, kind=entry["kind"], nodes=entry.get("nodes", 0),
                             predicted_tokens_per_step=entry["predicted_tokens_per_step"], measured_tokens_per_step=tps,
                             predicted_speedup=entry["predicted_speedup"], measured_speedup=spd, measured_phase=phase,
                             speedup_err_pct=100 * prediction_error(entry["predicted_speedup"], spd), exact_match=exact,
                             setting_differs="; ".join(differences((plan.get("latency") or {}).get("setting"),
                                                                   where))))
    return pd.DataFrame(rows)


def speedups_by_kind(plan: dict) -> pd.DataFrame:
    """The plan's predicted speedup per batch size for each kind it weighed (its choice, the runner-up of another
    kind, the best chain, and none at 1): one row per (batch_size, kind), the best of that kind the plan knows.
    What the app draws against batch size."""
    rows = []
    alternatives = {a["batch_size"]: a for a in plan.get("alternatives", []) if isinstance(a, dict)}
    for row in plan["plans"]:
        b, alt = row["batch_size"], alternatives.get(row["batch_size"]) or {}
        seen = {"none": dict(batch_size=b, kind="none", nodes=0, predicted_speedup=1.0)}
        for entry in (row, alt.get("runner_up") or {}):
            if entry and entry["kind"] != "none":
                seen.setdefault(entry["kind"], dict(batch_size=b, kind=entry["kind"], nodes=entry["nodes"],
                                                    predicted_speedup=entry["predicted_speedup"]))
        chain = alt.get("best_chain") or {}
        if chain.get("k"):
            seen.setdefault("chain", dict(batch_size=b, kind="chain", nodes=chain["k"],
                                          predicted_speedup=chain["predicted_speedup"]))
        for r in seen.values():
            rows.append(r | dict(chosen=r["kind"] == row["kind"]))
    return pd.DataFrame(rows, columns=["batch_size", "kind", "nodes", "predicted_speedup", "chosen"])
