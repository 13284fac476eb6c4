"""Speculation plans per batch size: for each batch size, the fastest of the optimal tree at every budget, the
top-1 chain of every length, and no speculation, by predicted speedup on a measured latency surface t(B, n).

The plan is priced on the engine its latency table timed (latency_file.latency_engine): on our decoder's steps the
candidates are below; on vLLM's served rounds (`workbench latency --engine vllm`) only what vLLM runs, a top-1 chain
of each K it timed, or none.

Batch size changes the answer: at batch 1 a verify of n tokens costs little more than one token (the weights are
read once either way); at batch B the same n tokens per sequence are B * n tokens of work, and speculation can lose
to vanilla decoding while acceptance stays the same. The candidates:
  tree   the optimal tree at every budget the surface covers (each prefix of one optimize.best_first run is the
         optimal tree of that size);
  chain  the top-1 chain [[0], [0, 0], ...] of every length up to the number of heads whose last position is
         ever accepted: what vLLM's Medusa drafter runs (vllm/v1/spec_decode/medusa.py takes each head's argmax);
  none   no speculation, speedup 1 by definition.
Tokens per step have one producer per source: Calibration.predict (a calibration folder), optimize.expected_length
(an accuracy table), 1 + the sum of the first K entries of a per-position acceptance vector (chains only); a
calibration predicts for answers of the generation length (`max_new_tokens`: acceptance rises along an answer) and the
plan says which statistic and answers it assumes (source.regime; docs/prediction.md). Each candidate's speedup is
speed.speedup_at, ranked by `rank` (the one ranking: the app's recommendation is this one); the choice is exact over the candidates, ties going to the simpler kind
(none, then chain, then tree) and then to fewer nodes.

The plan file (read and written here only):
  {"version": PLAN_VERSION, "plans": [{"batch_size", "kind": "tree" | "chain" | "none", "medusa_choices", "nodes",
              "predicted_tokens_per_step", "predicted_speedup",
              "predicted_batch_tokens_per_step"}, ...],  # one row per batch size, ascending; the last is optional
   "alternatives": [{"batch_size", "speedup_range", "runner_up", "runner_up_within_noise", "best_chain",
                     "chains": [{"k", "predicted_tokens_per_step", "predicted_batch_tokens_per_step",
                                 "predicted_speedup", "speedup_range"}, ...]}, ...],  # chains: every K weighed, 0 = none
   "chain_acceptance": [p_1, ..., p_K],  # per-position unconditional acceptance of the top-1 chain
   "source": {..., "prediction", "max_new_tokens", "regime"},
   "latency": {"file", "context", "spread", "model", "device", "dtype", "setting" (provenance.setting of the table, null
               when it was not recorded), "mode" (decoder-step | verify | vllm-round | unknown), "engine" (whose
               steps it timed: workbench | vllm; what the plan is priced on), "engine_version"},
   "workbench_version", "created"}
`predicted_tokens_per_step` is what each sequence measures (a decoder's tokens/step); the speedup divides
`predicted_batch_tokens_per_step` instead: B sequences side by side step until the slowest is done (absent in
version 1 files: upgrade_plan). `medusa_choices` is [] for "none" and [[0], [0, 0], ...] for a chain of length
K. `runner_up` is the best candidate of another kind; `runner_up_within_noise` says whether the two speedup ranges
over the latency's interquartile range overlap (null without a spread in the CSV). `best_chain` is the best chain
or none (k = 0) at that batch size: what an engine without trees (vLLM since PR #42121) should run instead of a tree.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from workbench import WorkbenchError, __version__
from workbench.calibrate.folder import Calibration
from workbench.core.io import read_csv, read_json
from workbench.core.provenance import differences, read_setting
from workbench.core.speed import max_tokens, priced, within_noise
from workbench.measure.latency_file import latency_engine, latency_surface, read_latency
from workbench.measure.sweep_file import checked_speedup
from workbench.trees.accuracies import read_accuracies
from workbench.trees.optimize import best_first, expected_length, value_and_limits
from workbench.trees.tree import MEDUSA_TOPK, Tree, load_tree, make_tree

KINDS = ("tree", "chain", "none")
SIMPLER = {"none": 2, "chain": 1, "tree": 0}  # tie-break: the simpler engine setting wins an exact tie
PLAN_VERSION = 3  # the plan file's "version" (3: latency.engine, engine_version); 1: files without it (upgrade_plan)
PLAN_ROW = ("batch_size", "kind", "medusa_choices", "nodes", "predicted_tokens_per_step", "predicted_speedup")
PREDICTIONS = {"independent": "predicted_independent", "joint": "predicted_joint", "replay": "predicted_replay"}
MAX_POSITIONS = 64  # longest acceptance vector taken (a draft longer than any engine's limit is a typo)


def chain_tree(k: int) -> Tree:
    """The top-1 chain of length k: [[0], [0, 0], ..., [0] * k]."""
    return make_tree([[0] * d for d in range(1, k + 1)], name=f"chain_{k}")


def is_chain(tree: Tree) -> bool:
    return tree.nodes == tree.depth and all(r == 0 for p in tree.paths for r in p)


# ----------------------------------------------------------------------------------------------- acceptance vectors

def check_acceptance(values, what: str = "--acceptance") -> list[float]:
    """A per-position acceptance vector p_1 >= p_2 >= ... (p_k: the share of steps whose first k drafted tokens
    are all accepted, vLLM's `synthetic_acceptance_rates` convention), each in (0, 1]; one error line otherwise."""
    if not isinstance(values, (list, tuple)) or not values:
        raise WorkbenchError(f"{what}: give a non-empty list of per-position acceptance rates like [0.7, 0.45, 0.3]")
    if len(values) > MAX_POSITIONS:
        raise WorkbenchError(f"{what}: {len(values)} positions; at most {MAX_POSITIONS} are taken")
    out = []
    for k, v in enumerate(values, 1):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < float(v) <= 1):
            raise WorkbenchError(f"{what}: position {k} has acceptance {str(v)[:20]!r}; every rate must be a number "
                                 "in (0, 1] (drop positions that are never accepted)")
        if out and float(v) > out[-1] * (1 + 1e-12):
            raise WorkbenchError(f"{what}: acceptance rises from {out[-1]:g} at position {k - 1} to {float(v):g} at "
                                 f"position {k}: rates are unconditional (all of the first k tokens accepted), so "
                                 "they never increase; convert conditional rates by taking running products")
        out.append(float(v))
    return out


def read_acceptance(path) -> list[float]:
    """An acceptance vector from a CSV `position,acceptance` (positions 1..K, or 0..K-1, each once) or a JSON list
    (or an object holding one as `synthetic_acceptance_rates`, as in a vLLM --speculative-config), checked."""
    what = f"--acceptance {path}"
    if str(path).lower().endswith(".json"):
        data = read_json(path, what, object)  # a list, or a config object holding one
        if isinstance(data, dict) and "synthetic_acceptance_rates" in data:
            data = data["synthetic_acceptance_rates"]
        return check_acceptance(data, what)
    df = read_csv(path, "--acceptance", ("position", "acceptance"), "vLLM's per-position acceptance metrics")
    num = df[["position", "acceptance"]].apply(pd.to_numeric, errors="coerce")
    pos = num["position"]
    if num.isna().any().any() or (pos % 1 != 0).any() or not pos.between(0, 1 << 20).all():
        raise WorkbenchError(f"{what}: position must be an integer and acceptance a number on every row")
    num = num.sort_values("position")
    start = int(num["position"].iloc[0])
    if start not in (0, 1) or num["position"].tolist() != list(range(start, start + len(num))):
        raise WorkbenchError(f"{what}: positions must be 1..K (or 0..K-1), each once, found "
                             f"{', '.join(map(str, num['position'].astype(int).tolist()[:8]))}")
    return check_acceptance(num["acceptance"].astype(float).tolist(), what)


# ----------------------------------------------------------------------------------------------- sources

def plan_source(calibration=None, accuracies=None, acceptance=None, prediction: str = "replay",
                max_rank: int = MEDUSA_TOPK, max_new_tokens: int | None = None) -> dict:
    """What the planner weighs, from exactly one source: {"tokens_per_step": tree -> float, "value" (path values
    the trees are optimal for, None for chains only), "max_depth", "max_rank", "chain_acceptance", "info"
    (provenance), "typical_context", "batch_tokens_per_step": (tree, batch) -> float}. A calibration predicts
    through Calibration.predict (`prediction`:
    independent, joint or replay; trees are optimal for the joint paths unless independent) for answers of
    `max_new_tokens` tokens (default: the calibration's own length); an accuracy table through expected_length;
    an acceptance vector gives chains only. info["regime"] says which statistic and answers a prediction assumes.
    A batch's tokens/step (what its goodput divides by: it steps until its slowest sequence is done) is the replay's
    Calibration.batch_replay; the other statistics have no per-answer steps and take the mean's."""
    if sum(x is not None for x in (calibration, accuracies, acceptance)) != 1:
        raise WorkbenchError("give one of --calibration DIR, --accuracies FILE or --acceptance FILE")
    if acceptance is not None:
        rates = read_acceptance(acceptance)
        chain = lambda p: rates[len(p) - 1] if len(p) <= len(rates) and not any(p) else 0.0  # noqa: E731 - a path's value
        tps = lambda t: expected_length(t, chain)  # noqa: E731 - 1 + the sum of the chain's first K rates
        return dict(tokens_per_step=tps, batch_tokens_per_step=lambda t, b: tps(t), value=None,
                    max_depth=len(rates), max_rank=1, chain_acceptance=rates, typical_context=None,
                    info=dict(kind="acceptance", path=str(acceptance), prediction="1 + sum of the first K rates",
                              num_heads=len(rates)))
    if accuracies is not None:
        return accuracy_source(read_accuracies(accuracies), str(accuracies), max_rank)
    return calibration_source(Calibration(calibration), prediction, max_rank, max_new_tokens)


def accuracy_source(acc, path: str, max_rank: int = MEDUSA_TOPK) -> dict:
    """plan_source of an accuracy table acc[K, R] (independent heads; `path` names it; no answers, so a batch's
    tokens/step is taken as the mean's)."""
    fn, depth, rank = value_and_limits(acc, None, min(max_rank, acc.shape[1]))
    return dict(tokens_per_step=lambda t: expected_length(t, acc), value=acc, max_depth=depth, max_rank=rank,
                batch_tokens_per_step=lambda t, b: expected_length(t, acc),
                chain_acceptance=chain_values(fn, depth), typical_context=None,
                info=dict(kind="accuracies", path=path, prediction="predicted_independent", num_heads=depth,
                          regime=regime("predicted_independent", None)))


def calibration_source(cal: Calibration, prediction: str = "replay", max_rank: int = MEDUSA_TOPK,
                       max_new_tokens: int | None = None) -> dict:
    """plan_source of an opened calibration folder."""
    if prediction not in PREDICTIONS:
        raise WorkbenchError(f"--prediction {prediction!r}: use {', '.join(PREDICTIONS)}")
    calibration = cal.folder
    acc = cal.accuracies("fit")
    key = PREDICTIONS[prediction]
    value = acc if prediction == "independent" else cal.joint_value("fit")
    depth, rank = acc.shape[0], min(max_rank, acc.shape[1])
    if key not in cal.predict(chain_tree(1)):
        raise WorkbenchError(f"--calibration {calibration}: holds out no prompts, so there is no replay prediction; "
                             "use --prediction joint or independent (or calibrate with --holdout 0.2)")
    fn = value_and_limits(value, depth, rank)[0]
    meta = cal.meta
    length = generation_length(cal, max_new_tokens)
    tps = lambda t: cal.predict(t, length)[key]  # noqa: E731
    batched = (lambda t, b: cal.batch_replay(t, b, "holdout", length)) if key == "predicted_replay" else \
        (lambda t, b: tps(t))
    return dict(tokens_per_step=tps, batch_tokens_per_step=batched, value=value, max_depth=depth, max_rank=rank,
                chain_acceptance=chain_values(fn, depth), typical_context=cal.typical_context(length),
                info=dict(kind="calibration", path=str(calibration), prediction=key, model=meta.get("model"),
                          heads=meta.get("heads"), heads_sha256=(meta.get("args") or {}).get("heads_sha256"),
                          num_heads=depth, max_new_tokens=length, regime=regime(key, length)))


def generation_length(cal: Calibration, max_new_tokens: int | None) -> int | None:
    """The answer length predictions are made for: `max_new_tokens`, at most the calibration's own answers' (its
    meta max_new_tokens: longer answers were never measured), default that."""
    have = cal.meta.get("max_new_tokens")
    if max_new_tokens is None:
        return have if isinstance(have, int) and have > 0 else None
    if max_new_tokens < 1:
        raise WorkbenchError(f"--max-new-tokens {max_new_tokens}: must be >= 1")
    if isinstance(have, int) and max_new_tokens > have:
        raise WorkbenchError(f"--max-new-tokens {max_new_tokens}: the calibration's answers are {have} tokens long, so "
                             f"acceptance past token {have} was never measured; plan for <= {have} or calibrate with "
                             "a larger --max-new-tokens")
    return max_new_tokens


def regime(prediction: str, max_new_tokens: int | None) -> str:
    """In words: what a calibration prediction assumes, and why (docs/prediction.md)."""
    cut = f"the first {max_new_tokens} tokens of" if max_new_tokens else "all of"
    if prediction == "predicted_replay":
        return (f"a greedy decoder replayed over {cut} each held-out prompt's greedy answer: tokens/step = tokens / "
                "steps at the positions a decoder starts its steps at (the statistic live decoding measures; the "
                "answers are cut to the generation length because acceptance rises along an answer)")
    what = "measured joint path frequencies" if prediction == "predicted_joint" else "independent head accuracies"
    return (f"{what} of the fit prompts, averaged over every position of {cut} their answers: over-predicts a live "
            "decoder, which starts its steps only at the positions after each accepted run (harder on average)")


def chain_values(fn, depth: int) -> list[float]:
    """Per-position acceptance of the top-1 chain (the value of [0] * k), up to the last positive one."""
    out = []
    for k in range(1, depth + 1):
        v = float(fn((0,) * k))
        if v <= 0:
            break
        out.append(min(v, 1.0))
    return out


# ----------------------------------------------------------------------------------------------- the planner

def candidates(tokens_per_step, chain_acceptance: list[float], max_nodes: int, value=None,
               max_depth: int | None = None, max_rank: int | None = None) -> list[dict]:
    """Every choice weighed, each {"kind", "tree", "nodes", "tokens_per_step"}: no speculation, the top-1 chain of
    every length with a positive last position (at most max_nodes), and with `value` the optimal tree at every
    budget 1..max_nodes (distinct shapes; a tree that is a chain counts as the chain)."""
    out = [dict(kind="none", tree=None, nodes=0, tokens_per_step=1.0)]
    seen = set()
    for k in range(1, min(len(chain_acceptance), max_nodes) + 1):
        t = chain_tree(k)
        seen.add(t.paths)
        out.append(dict(kind="chain", tree=t, nodes=k, tokens_per_step=float(tokens_per_step(t))))
    if value is not None and max_nodes >= 1:
        fn, depth, rank = value_and_limits(value, max_depth, max_rank, "the planner")
        order = [p for p, _ in best_first(fn, max_nodes, depth, rank)]
        for n in range(1, len(order) + 1):
            t = make_tree(order[:n], name=f"optimal_{n}")
            if t.paths in seen:
                continue
            seen.add(t.paths)
            kind = "chain" if is_chain(t) else "tree"
            out.append(dict(kind=kind, tree=t, nodes=n, tokens_per_step=float(tokens_per_step(t))))
    return out


def served(cands: list[dict], engine: str, timed) -> list[dict]:
    """The candidates the engine a latency table timed can run: all of them on our decoder ("workbench"); on vLLM a
    top-1 chain of each K it timed (tokens K + 1 in `timed`) or none: it drafts no trees and its round at a K not
    timed is not known."""
    if engine == "workbench":
        return cands
    return [c for c in cands if c["kind"] == "none" or (c["kind"] == "chain" and c["nodes"] + 1 in timed)]


def _rank(c: dict) -> tuple:
    return c["speedup"], SIMPLER[c["kind"]], -c["nodes"]


def at_batch(cands: list[dict], batch_tokens_per_step, batch: int) -> list[dict]:
    """The candidates at one batch size: each with its "batch_tokens_per_step" (the source's, for `batch`
    sequences side by side; 1 for no speculation, whose batch also waits for its longest answer)."""
    return [dict(c, batch_tokens_per_step=1.0 if c["tree"] is None else float(batch_tokens_per_step(c["tree"], batch)))
            for c in cands]


def rank(cands: list[dict], latency: dict, spread=None, head_cost: dict | None = None) -> list[dict]:
    """The candidates a latency table covers ({tokens: seconds} of one batch size), each with its "speedup" and
    "range" (speed.priced: the batch's tokens/step, `at_batch`, else the mean's, over the step cost of its token
    count and, where the table measured the heads' cost (`head_cost`, latency_file.read_head_cost), its own depth;
    the range over the interquartile range of t, None without a spread), best first: the one ranking every answer (CLI, app,
    exports) comes from."""
    top = max_tokens(latency)
    scored = []
    for c in cands:
        if c["nodes"] + 1 <= top:
            tps = c.get("batch_tokens_per_step", c["tokens_per_step"])
            fast, rng = priced(latency, spread, head_cost, tps, c["nodes"], _depth(c["tree"]))
            scored.append(dict(c, speedup=fast, range=rng))
    return sorted(scored, key=_rank, reverse=True)


def _depth(tree) -> int | None:
    return None if tree is None else tree.depth


def choose(cands: list[dict], latency: dict, spread=None, head_cost: dict | None = None) -> dict:
    """The best candidate at one batch size (`rank`): {"best", "runner_up" (best of another kind, or None),
    "within_noise", "best_chain" (best chain or none), "ranked" (every candidate, best first)}."""
    scored = rank(cands, latency, spread, head_cost)
    best = scored[0]
    others = [c for c in scored if c["kind"] != best["kind"]]
    runner = max(others, key=_rank) if others else None
    noise = within_noise(best["range"], runner["range"]) if runner else None
    return dict(best=best, runner_up=runner, within_noise=noise, ranked=scored,
                best_chain=max((c for c in scored if c["kind"] != "tree"), key=_rank))


def _choices(c: dict) -> list:
    return c["tree"].as_lists() if c["tree"] is not None else []


def _brief(c: dict | None) -> dict | None:
    if c is None:
        return None
    return dict(kind=c["kind"], nodes=c["nodes"], medusa_choices=_choices(c),
                predicted_tokens_per_step=c["tokens_per_step"], predicted_speedup=c["speedup"],
                predicted_batch_tokens_per_step=c.get("batch_tokens_per_step", c["tokens_per_step"]))


def make_plan(source: dict, latency_path, batch_sizes, context: int | None = None) -> dict:
    """The plan file's dict for these batch sizes on the latency CSV at one context (`context`, else the one
    nearest the calibration's typical context, else the only one)."""
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not batch_sizes or batch_sizes[0] < 1:
        raise WorkbenchError("--batch-sizes: give positive integers like 1,2,4,8,16")
    df = read_latency(latency_path)
    surface, ctx = latency_surface(df, batch_sizes, context, source["typical_context"], f"--latency {latency_path}")
    top = max(max_tokens(s["seconds"]) for s in surface.values()) - 1
    engine, version = latency_engine(df)
    cands = served(candidates(source["tokens_per_step"], source["chain_acceptance"], top, source["value"],
                              source["max_depth"], source["max_rank"]),
                   engine, set.intersection(*(set(s["measured"]) for s in surface.values())))
    plans, alternatives = [], []
    for b in batch_sizes:
        at = at_batch(cands, source["batch_tokens_per_step"], b)
        pick = choose(at, surface[b]["seconds"], surface[b]["spread"], surface[b]["head_cost"])
        best, chain = pick["best"], pick["best_chain"]
        plans.append(dict(batch_size=b, kind=best["kind"], medusa_choices=_choices(best), nodes=best["nodes"],
                          predicted_tokens_per_step=best["tokens_per_step"], predicted_speedup=best["speedup"],
                          predicted_batch_tokens_per_step=best["batch_tokens_per_step"]))
        alternatives.append(dict(batch_size=b, speedup_range=list(best["range"]) if best["range"] else None,
                                 runner_up=_brief(pick["runner_up"]), runner_up_within_noise=pick["within_noise"],
                                 best_chain=dict(k=chain["nodes"], predicted_tokens_per_step=chain["tokens_per_step"],
                                                 predicted_speedup=chain["speedup"]),
                                 chains=chain_rows(pick["ranked"])))
    setup = {c: str(df[c].iloc[0]) for c in ("model", "device", "dtype") if c in df.columns}
    where = read_setting(df)
    return dict(version=PLAN_VERSION, plans=plans, alternatives=alternatives, chain_acceptance=source["chain_acceptance"],
                source=source["info"],
                latency=dict(file=str(latency_path), context=ctx, spread=surface[batch_sizes[0]]["spread"] is not None,
                             head_cost=surface[batch_sizes[0]]["head_cost"] is not None, **setup, setting=where,
                             mode=(where or {}).get("mode", "unknown (the table does not record its setting)"),
                             engine=engine, engine_version=version),
                workbench_version=__version__, created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def chain_rows(ranked: list[dict]) -> list[dict]:
    """Every chain (and none, k = 0) weighed at one batch size, by K: what an engine that drafts chains can be
    asked for, each with the plan's prediction (what `vllm-check --plan` measures beside it)."""
    rows = [dict(k=c["nodes"], predicted_tokens_per_step=c["tokens_per_step"],
                 predicted_batch_tokens_per_step=c.get("batch_tokens_per_step", c["tokens_per_step"]),
                 predicted_speedup=c["speedup"], speedup_range=list(c["range"]) if c["range"] else None)
            for c in ranked if c["kind"] != "tree"]
    return sorted(rows, key=lambda r: r["k"])


def plan_engine(plan: dict) -> tuple[str, str | None]:
    """(engine, version) whose step costs a checked plan (check_plan) was priced on: its latency table's
    (latency_file.ENGINES)."""
    lat = plan.get("latency") or {}
    return str(lat.get("engine") or "workbench"), lat.get("engine_version")


def plan_table(plan: dict) -> str:
    """The plan as a text table: batch size, choice, nodes, tokens/step, predicted speedup, runner-up and whether
    it is within the latency noise."""
    lines = [f"{'batch':>5}  {'choice':<10}{'nodes':>6}{'tok/step':>10}{'speedup':>9}  {'runner-up':<24}"
             f"{'within noise':>13}"]
    for row, alt in zip(plan["plans"], plan["alternatives"]):
        choice = f"chain K={row['nodes']}" if row["kind"] == "chain" else row["kind"]
        r = alt["runner_up"]
        runner = "-" if r is None else \
            f"{'chain K=' + str(r['nodes']) if r['kind'] == 'chain' else r['kind']}" + \
            (f" {r['nodes']}" if r["kind"] == "tree" else "") + f" {r['predicted_speedup']:.3f}x"
        noise = {True: "yes", False: "no", None: "n/a"}[alt["runner_up_within_noise"]]
        lines.append(f"{row['batch_size']:>5}  {choice:<10}{row['nodes']:>6}{row['predicted_tokens_per_step']:>10.3f}"
                     f"{row['predicted_speedup']:>8.3f}x  {runner:<24}{noise:>13}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- the plan file

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
            ok = row["nodes"] == tree.nodes and (row["kind"] == "tree" or is_chain(tree))
            row["tree"] = tree
        if not ok:
            raise WorkbenchError(f"{where}: kind {row['kind']!r} does not match its medusa_choices and nodes (none: [] "
                                 "and 0; chain: [[0], [0, 0], ...]; nodes: their count)")
    if data.get("chain_acceptance"):  # [] when even the first head's top-1 guess is never right
        data["chain_acceptance"] = check_acceptance(data["chain_acceptance"], f"{what}: chain_acceptance")
    alts = data.get("alternatives")
    if alts is not None and (not isinstance(alts, list) or len(alts) != len(data["plans"]) or
                             any(not isinstance(a, dict) or a.get("batch_size") != r["batch_size"]
                                 for a, r in zip(alts, data["plans"]))):
        raise WorkbenchError(f"{what}: alternatives must list the same batch sizes as plans")
    for a in alts or []:
        k = (a.get("best_chain") or {}).get("k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise WorkbenchError(f"{what}: alternatives best_chain k must be an integer >= 0")
    return data



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
                name = f"plan_b{b}_{role}_{entry['kind']}_{len(entry['medusa_choices'])}"
                out.append((make_tree(entry["medusa_choices"], name=name), b, entry))
    return out


def plan_check(plan: dict, sweep: pd.DataFrame) -> pd.DataFrame:
    """The plan's prediction beside the live decoder's measurement, per batch size: the choice (and its
    runner-up) as decoded by `workbench sweep --plan` at that batch size, greedy, against vanilla at the same batch
    size. "none" is vanilla itself: speedup 1 by definition. The measured speedup is the decoding phase's, as
    predicted (sweep_file.checked_speedup; measured_phase says when a row only has the end-to-end one).
    err_% = measured / predicted - 1. setting_differs: how
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
                name = f"plan_b{b}_{role}_{entry['kind']}_{len(entry['medusa_choices'])}"
                measured = at[at["tree"] == name]
                if measured.empty:
                    continue
                m = measured.iloc[-1]
                tps, exact = m["tokens_per_step"], m["exact_match"]
                spd, phase = checked_speedup(m)
            where = read_setting(measured.iloc[-1].to_dict()) if "setting" in measured.columns else None
            rows.append(dict(batch_size=b, role=role, kind=entry["kind"], nodes=entry.get("nodes", 0),
                             predicted_tokens_per_step=entry["predicted_tokens_per_step"], measured_tokens_per_step=tps,
                             predicted_speedup=entry["predicted_speedup"], measured_speedup=spd, measured_phase=phase,
                             speedup_err_pct=100 * (spd / entry["predicted_speedup"] - 1), exact_match=exact,
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
