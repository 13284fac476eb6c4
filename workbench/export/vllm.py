"""vLLM: a tree as SpeculativeConfig's `speculative_token_tree` (the releases with tree attention), and a plan as
`--speculative-config`, what vLLM serves today.

Tree: a string of a list of tuples sorted breadth-first, with num_speculative_tokens == number of nodes. Its
EAGLE-style drafter takes, per level, the top-c children of EVERY node (c = nodes at the level / nodes at the level
above): only dense trees are drafted as written (`repair` and `best` give one). The fragment must stay valid JSON for
--speculative-config, so the targeted versions go in a warning, not in a key.

Plan: vLLM drafts Medusa heads as a top-1 chain, so a tree row becomes the plan's best chain at that batch size (its
cost printed). Medusa (vLLM <= 0.32.0): vLLM's Medusa proposer asserts the scheduled K equals num_speculative_tokens
(vllm/v1/spec_decode/medusa.py propose()), so a plan whose K changes with the batch size becomes one config per
batch-size range (a JSON list of {"batch_sizes": [low, high], "speculative_config"}: serve each range with its own
--max-num-seqs), never a schedule that asserts. Other drafters (--method eagle3 --draft-model DIR, ...; the usual
case for an acceptance-vector plan): Dynamic SD's `num_speculative_tokens_per_batch_size` [[low, high, K], ...]
(vLLM >= 0.24.0), checked here exactly as vllm/v1/spec_decode/dynamic/utils.py does. `synthetic` adds the synthetic
rejection sampler at the top-1 chain's per-position acceptance (checked as vllm/config/speculative.py does: length K,
each in [0, 1], non-increasing)."""
from __future__ import annotations

import json
from pathlib import Path

from workbench import DEMO_HEADS, WorkbenchError
from workbench.core.notes import FieldError, Note
from workbench.export.common import Warn, plan_rows, row_at
from workbench.plan.plan_file import plan_engine
from workbench.trees.optimize import best_dense_tree
from workbench.trees.tree import Tree

SUFFIX = ".vllm.json"
TARGET = ("vLLM with tree attention: speculative_token_tree, ignored by 0.10.0, used by 0.10.1 to 0.20.2, gone "
          "from 0.21.0 (PR #20401 added it, PR #42121 removed tree attention)")
VLLM_VERSIONS = ("speculative_token_tree is used only by vLLM 0.10.1 to 0.20.2 (0.10.0 ignores it; 0.21.0 and "
                 "later reject the key)")
# vLLM version windows, read in vLLM's own code at its release tags (not its docs): (first, last), None = open
VLLM_WINDOWS = {
    "speculative_token_tree": ("0.10.1", "0.20.2"),  # 0.10.0 ignores the key; 0.21.0 removed tree attention
    "num_speculative_tokens_per_batch_size": ("0.24.0", None),  # Dynamic SD's per-batch-size schedule
    "medusa": (None, "0.32.0"),  # 0.33.0 removed the Medusa drafter (eagle, eagle3, mtp, draft_model, ngram remain)
}
# keys proposed but in no release checked (up to VLLM_NEWEST): taken only for a --vllm-version after it, with a warning
VLLM_PROPOSED = {
    # the per-batch-size schedule renamed, with an optional context axis ([b_lo, b_hi, ctx_lo, ctx_hi, K]; the
    # 3-tuple form meaning every context length): vLLM PR #48944 (open when read), RFC #48627
    "speculative_token_schedule": "vLLM PR #48944 (RFC #48627)",
}
VLLM_METHODS = ("medusa", "eagle", "eagle3", "mtp", "draft_model", "ngram")  # --method: vLLM's drafters
VLLM_NEWEST = "0.33.0"  # the newest vLLM these windows were checked against
VLLM_SCHEDULE = ("vLLM >= 0.24.0 (Dynamic SD): --speculative-config num_speculative_tokens_per_batch_size, a list of "
                 "[low, high, K] with inclusive batch-size ranges, checked as vllm/v1/spec_decode/dynamic/utils.py "
                 "validate_and_normalize_dynamic_sd_schedule does (positive ranges, low <= high, K >= 0, "
                 "non-overlapping once sorted by low, the first starting at 1)")
VLLM_MEDUSA_PER_RANGE = Note("medusa_per_range", "vLLM's Medusa proposer asserts that the scheduled K equals "
                             "num_speculative_tokens (vllm/v1/spec_decode/medusa.py propose()), so a per-batch-size "
                             "schedule with a K below the largest fails with an AssertionError: this plan's K changes "
                             "with the batch size, so it is written as one constant-K config per batch-size range "
                             "(serve each range with its own --max-num-seqs HIGH), or export one with {field} B",
                             field="batch_sizes")  # a note naming a request field: each front end words it


# ----------------------------------------------------------------------------------------------- trees

def vllm_uniform(tree: Tree) -> bool:
    """True when every node at depth d-1 has children exactly ranks 0..c_d-1 (the only shape vLLM drafts)."""
    per_depth = [0] * tree.depth
    for p in tree.paths:
        per_depth[len(p) - 1] += 1
    shape = set(tree.paths)
    level = [()]
    for d in range(tree.depth):
        c = per_depth[d] // len(level)
        nxt = [q + (r,) for q in level for r in range(c)]
        if c * len(level) != per_depth[d] or not all(q in shape for q in nxt):
            return False
        level = nxt
    return True


def write_tree(tree: Tree, name: str, **_) -> tuple[str, list[Warn]]:
    warns = [Warn("vllm_tree_versions", VLLM_VERSIONS)]
    if not vllm_uniform(tree):
        warns.append(Warn("vllm_irregular", "vLLM's tree drafter gives every node of a level the same number of "
                          "children (its top-c), so it will not draft this irregular tree as written; {fix}", "dense"))
    bfs = sorted(tree.paths, key=lambda p: (len(p), p))
    # vLLM requires num_speculative_tokens == number of nodes, so the fragment carries both.
    return json.dumps({"num_speculative_tokens": tree.nodes, "speculative_token_tree": str(bfs)}) + "\n", warns


def best(fn, budget: int, max_depth: int, max_rank: int) -> Tree:
    """The most valuable tree vLLM drafts as written: the best dense tree."""
    return best_dense_tree(fn, budget, max_depth, max_rank)


def repair(tree: Tree, fn, depth: int, ranks: int, heads: int | None = None) -> tuple[Tree | None, str]:
    """(the best dense tree with at most as many nodes and no deeper than `heads`, ""), or None and why when the
    tree is dense already. `fn` values a path (required: a dense tree is chosen by value)."""
    if fn is None:
        raise FieldError("engine_safe", "needs_other",
                         "{field} for vllm picks the best dense tree and needs {also} FILE or {also2} DIR",
                         also=("accuracies", "calibration"))
    if vllm_uniform(tree):
        return None, "engine-safe: already a dense tree, which vLLM drafts as written"
    safe = best_dense_tree(fn, tree.nodes, min(depth, heads or depth), ranks)
    return Tree(safe.paths, tree.name or safe.name), ""


# ----------------------------------------------------------------------------------------------- plans

def priced_elsewhere(plan: dict) -> list[Warn]:
    """The warning for a vLLM export of a plan priced on another engine's step costs (plan.plan_file.plan_engine): its
    K per batch size is that engine's best, not necessarily vLLM's; [] for a plan priced on vLLM."""
    engine, _ = plan_engine(plan)
    if engine == "vllm":
        return []
    src = plan.get("source") or {}
    kind = src.get("kind") if src.get("kind") in ("acceptance", "accuracies") else "calibration"
    return [Warn("plan_priced_elsewhere", f"the plan was priced on "
                 f"{'our decoder' if engine == 'workbench' else engine}'s step costs, not on vLLM's, whose rounds "
                 "cost otherwise (its K per batch size may not be vLLM's best): price it on vLLM with `workbench "
                 f"latency --engine vllm --out vllm-latency.csv` then `workbench plan --{kind} "
                 f"{src.get('path') or 'FILE'} --latency vllm-latency.csv`")]


def chain_k(plan: dict, row: dict, notes: list[str]) -> int:
    """K a chain-only engine runs at this row: the chain's length, 0 for none, and for a tree the plan's best
    chain (or none) at that batch size, with its cost as a note."""
    if row["kind"] in ("chain", "none"):
        return row["nodes"]
    alt = next((a for a in plan.get("alternatives") or [] if a["batch_size"] == row["batch_size"]), None)
    chain = (alt or {}).get("best_chain")
    if not chain:
        raise WorkbenchError("the plan has a tree row but no alternatives.best_chain to turn it into a chain: "
                             "re-run `workbench plan`")
    k = chain["k"]
    what = f"{row['nodes']}-node tree" if row["kind"] == "tree" else f"per-step tree of {row['nodes']} nodes"
    notes.append(f"batch {row['batch_size']}: vLLM drafts no trees, so the plan's {what} "
                 f"({row['predicted_tokens_per_step']:.3f} tokens/step, {row['predicted_speedup']:.3f}x) becomes "
                 + (f"the chain K={k}" if k else "no speculation")
                 + f" ({chain['predicted_tokens_per_step']:.3f} tokens/step, {chain['predicted_speedup']:.3f}x): costs "
                 f"{row['predicted_tokens_per_step'] - chain['predicted_tokens_per_step']:.3f} tokens/step")
    return k


def served_ks(plan: dict, batch_sizes) -> dict[int, int]:
    """{batch size: the K vLLM serves there for this plan} (0: no speculation): the one rule for what a plan asks of
    vLLM, for its export, its check and a check priced again."""
    return {b: chain_k(plan, row_at(plan, b)[0], []) for b in batch_sizes}


def vllm_schedule(plan: dict, notes: list[str]) -> list[list[int]]:
    """[[low, high, K], ...]: every batch size from 1 to the plan's largest exactly once (row i covers its batch
    size up to the next row's minus one; adjacent ranges with the same K merged). vLLM keeps the last K above."""
    rows = plan_rows(plan)
    ks = [chain_k(plan, r, notes) for r in rows]
    lows = [1] + [r["batch_size"] for r in rows[1:]]
    highs = [r["batch_size"] - 1 for r in rows[1:]] + [rows[-1]["batch_size"]]
    out: list[list[int]] = []
    for low, high, k in zip(lows, highs, ks):
        if out and out[-1][2] == k:
            out[-1][1] = high
        else:
            out.append([low, high, k])
    if rows[0]["batch_size"] > 1:
        notes.append(f"batch sizes below {rows[0]['batch_size']} were not planned: they take the row of batch size "
                     f"{rows[0]['batch_size']}")
    notes.append(f"batch sizes above {rows[-1]['batch_size']} keep K={out[-1][2]} (vLLM repeats the last range's K)")
    return out


def _version(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(v).split(".")[:3])
    except ValueError:
        raise FieldError("vllm_version", "malformed", f"{{field}} {v!r}: give a release like 0.32.0") from None


def vllm_window_error(key: str, version: str) -> str | None:
    """Why vLLM `version` cannot take `key` (a VLLM_WINDOWS or VLLM_PROPOSED key), or None when it can."""
    v = _version(version)
    if key in VLLM_PROPOSED:
        return None if v > _version(VLLM_NEWEST) else (
            f"vLLM {version} has no {key} (proposed in {VLLM_PROPOSED[key]}, in no release up to {VLLM_NEWEST})")
    first, last = VLLM_WINDOWS[key]
    if first and v < _version(first):
        return f"vLLM {version} has no {key} (first in {first})"
    if last and v > _version(last):
        return f"vLLM {version} has no {key} (last in {last})"
    return None


def check_vllm_schedule(schedule) -> list[tuple[int, int, int]]:
    """vLLM's own check of num_speculative_tokens_per_batch_size (validate_and_normalize_dynamic_sd_schedule,
    vllm/v1/spec_decode/dynamic/utils.py, 0.24.0-0.33.0), rule for rule: the schedule sorted by range start."""
    if not isinstance(schedule, list) or not schedule:
        raise WorkbenchError("num_speculative_tokens_per_batch_size must be a non-empty list of [low, high, K]")
    parsed = []
    for e in schedule:
        if not isinstance(e, (list, tuple)) or len(e) != 3:
            raise WorkbenchError(f"schedule entry {e!r}: must be [low, high, K]")
        lo, hi, k = (int(x) for x in e)
        if lo <= 0 or hi <= 0:
            raise WorkbenchError(f"batch-size range ({lo}, {hi}) must be positive")
        if lo > hi:
            raise WorkbenchError(f"batch-size range start must be <= end for ({lo}, {hi}, {k})")
        if k < 0:
            raise WorkbenchError("num_speculative_tokens_per_batch_size values must be >= 0")
        parsed.append((lo, hi, k))
    parsed.sort(key=lambda e: e[0])
    prev = 0
    for lo, hi, _ in parsed:
        if lo <= prev:
            raise WorkbenchError("batch-size ranges must be non-overlapping and sorted")
        prev = hi
    if parsed[0][0] != 1:
        raise WorkbenchError("the first batch-size range must start at 1")
    return parsed


def check_synthetic_rates(rates, k: int) -> list[float]:
    """vLLM's check of synthetic_acceptance_rates (SpeculativeConfig._resolve_synthetic_acceptance_rates): length
    K, each in [0, 1], never rising (exactly: rates[i] > rates[i-1] is refused)."""
    if len(rates) != k:
        raise WorkbenchError(f"synthetic_acceptance_rates must have length {k}, got {len(rates)}")
    if not all(0.0 <= r <= 1.0 for r in rates):
        raise WorkbenchError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}")
    if any(rates[i] > rates[i - 1] for i in range(1, k)):
        raise WorkbenchError(f"synthetic_acceptance_rates must be non-increasing, got {rates}")
    return list(rates)


def drafter(plan: dict, heads_dir, method: str | None, draft_model) -> dict:
    """method/model keys with an absolute model path: --method/--draft-model when given, else the heads folder
    given, else the calibration's own heads (the demo heads' folder for "demo"). A plan from an accuracy table or
    an acceptance vector names no drafter: without --method it is an error (vLLM rejects a config without one)."""
    if method is not None and method not in VLLM_METHODS:
        raise FieldError("method", "unknown", f"{{field}} {method}: vLLM's drafters are {', '.join(VLLM_METHODS)}")
    src = plan.get("source") or {}
    if method is None and src.get("served") and src.get("method") != "medusa":  # the drafter vLLM served
        method, draft_model = src.get("method"), draft_model or src.get("draft_model")
        if method not in VLLM_METHODS:
            raise FieldError("method", "not_targeted", f"the plan's served drafter {method} is not one this export "
                             f"targets ({', '.join(VLLM_METHODS)}): give {{field}}")
    if method not in (None, "medusa"):
        if draft_model is None and method in ("eagle", "eagle3", "draft_model"):
            raise FieldError("method", "needs_other",
                             f"{{field}} {method} needs {{also}} DIR (the drafter's weights)", also="draft_model")
        return {"method": method} | ({"model": str(Path(draft_model).resolve())} if draft_model else {})
    model = draft_model or heads_dir or (DEMO_HEADS if src.get("heads") == "demo" else None)
    if model is None and src.get("kind") == "calibration" and src.get("heads"):
        model = src["heads"]
    if model is None and src.get("served") and src.get("method") == "medusa":  # the heads folder vLLM served
        model = src.get("draft_model")
    if model is None:
        made = {"accuracies": "accuracy table", "acceptance": "acceptance vector"}.get(src.get("kind"), "source")
        raise FieldError("method", "no_drafter", f"the plan names no drafter (the {made} {src.get('path', '')} it was "
                         "made from names no heads): give {field} (e.g. eagle3) and {also} DIR, or {also2} DIR for "
                         "Medusa heads", also=("draft_model", "heads"))
    return {"method": "medusa", "model": str(Path(model).resolve())}


def vllm_plan_configs(plan: dict, notes: list[str], draft: dict, synthetic: bool = False,
                      num_heads: int | None = None) -> list[dict]:
    """[{"batch_sizes": [low, high], "speculative_config": {...} or None}, ...]: one constant-K config per
    batch-size range of the plan's schedule (None where the plan does not speculate)."""
    out = []
    for lo, hi, k in vllm_schedule(plan, notes):
        cfg = None
        if k:
            cfg = dict(draft, num_speculative_tokens=k)
            if num_heads is not None and k > num_heads:
                raise WorkbenchError(f"{num_heads} heads cannot draft K={k} tokens")
            if synthetic:
                cfg |= _synthetic(plan, k)
        out.append({"batch_sizes": [lo, hi], "speculative_config": cfg})
    return out


def _synthetic(plan: dict, k: int) -> dict:
    rates = plan.get("chain_acceptance") or []
    if len(rates) < k:
        raise WorkbenchError(f"the plan's chain_acceptance has {len(rates)} positions, fewer than K={k}")
    return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": check_synthetic_rates(rates[:k], k)}


def write_plan(plan: dict, heads_dir=None, num_heads: int | None = None, synthetic: bool = False,
               batch_size: int | None = None, method: str | None = None, draft_model=None,
               vllm_version: str | None = None, key: str = "num_speculative_tokens_per_batch_size"
               ) -> tuple[str, list[Warn], list[str | Note]]:
    """(text, warnings, notes: texts, or a core.notes.Note naming a request field): the --speculative-config JSON
    for vLLM `vllm_version` (default: the newest that serves the drafter): with batch_size one K; else for Medusa
    one config per batch-size range where K changes (a JSON list, see the module docstring), for other drafters a
    Dynamic SD schedule under `key` (num_speculative_tokens_per_batch_size, or the proposed
    speculative_token_schedule)."""
    draft = drafter(plan, heads_dir, method, draft_model)
    warns, notes = priced_elsewhere(plan), []
    if synthetic:
        warns.append(Warn("vllm_synthetic", "synthetic rejection sampling accepts drafts at these rates whatever the "
                          "tokens are: for timing the cost side only, never for serving (vLLM PRs #38045, #40662)"))
    medusa = draft["method"] == "medusa"
    version = vllm_version or ("0.32.0" if medusa else VLLM_NEWEST)
    if medusa and vllm_window_error("medusa", version):
        raise FieldError("method", "medusa_window", vllm_window_error("medusa", version) + ": serve Medusa heads "
                         "with vLLM <= 0.32.0, or another drafter ({field} eagle3 {also} DIR)", also="draft_model")
    notes.append(f"for vLLM {version}, drafter {draft['method']}" + (f" at {draft['model']}" if "model" in draft
                                                                      else ""))
    if batch_size is not None:
        row, why = row_at(plan, batch_size)
        notes += why
        k = chain_k(plan, row, notes)
        if k == 0:
            raise WorkbenchError(f"the plan says no speculation at batch size {row['batch_size']}: serve without "
                                 "--speculative-config there")
        if num_heads is not None and k > num_heads:
            raise FieldError("heads", "too_shallow",
                             f"{{field}} {heads_dir}: {num_heads} heads cannot draft K={k} tokens")
        cfg = dict(draft, num_speculative_tokens=k) | (_synthetic(plan, k) if synthetic else {})
        return json.dumps(cfg) + "\n", warns, notes
    per_range = vllm_plan_configs(plan, notes, draft, synthetic, num_heads)
    ks = [e["speculative_config"]["num_speculative_tokens"] if e["speculative_config"] else 0 for e in per_range]
    k = max(ks)
    if k == 0:
        raise WorkbenchError("the plan never speculates at any batch size: serve without --speculative-config")
    if len(set(ks)) == 1:  # one K everywhere: a plain config, no schedule needed
        notes.append(f"one K ({k}) at every batch size: a constant-K config (no schedule needed)")
        return json.dumps(per_range[0]["speculative_config"]) + "\n", warns, notes
    if medusa:
        notes.append(VLLM_MEDUSA_PER_RANGE)
        return json.dumps(per_range, indent=1) + "\n", warns, notes
    if vllm_window_error(key, version):
        raise FieldError("batch_sizes", "schedule_window", vllm_window_error(key, version) + ": export one K with "
                         "{field} B, or target a vLLM that takes it"
                         + (" (>= 0.24.0)" if key not in VLLM_PROPOSED else ""))
    notes.append(f"targets {VLLM_SCHEDULE}")
    if key in VLLM_PROPOSED:
        warns.append(Warn("vllm_unreleased_key", f"{key} is proposed in {VLLM_PROPOSED[key]} and in no vLLM release "
                          f"checked (up to {VLLM_NEWEST}): written as proposed there (3-tuple entries: every context "
                          f"length), unchecked against vLLM {version}"))
    schedule = [[lo, hi, kk] for (lo, hi), kk in zip((e["batch_sizes"] for e in per_range), ks)]
    check_vllm_schedule(schedule)
    cfg = dict(draft, num_speculative_tokens=k, **{key: schedule})
    if synthetic:
        cfg |= _synthetic(plan, k)
    return json.dumps(cfg) + "\n", warns, notes
