"""One interface to every engine's export: a tree or a plan in, (text, warnings) out, each warning a code and its
fix's key (common.Warn) that the CLI and the app word themselves; `engine_safe` repairs a tree for one engine and
`best_engine_safe` designs one. Each engine's knowledge lives in its own module, checked against that project's
own code, not run end to end:

- medusa: FasterDecoding/Medusa's medusa_choices.py list (export/medusa.py).
- json: `{"name", "medusa_choices"}`, readable by every workbench command (no engine, no header).
- trtllm: TensorRT-LLM's `--medusa_choices` (export/trtllm.py).
- vllm: vLLM's `speculative_token_tree` for a tree, `--speculative-config` for a plan (export/vllm.py); its heads
  folder (export/vllm_heads.py).
- eagle: EAGLE-1's `mc_sim_7b_63` (export/eagle.py).

A plan (plan/plan_file.py: one row per batch size) goes out through `export_plan` (PLAN_FORMATS): vllm as vLLM serves it
(a top-1 chain per batch size), vllm-token-schedule the same under vLLM's proposed speculative_token_schedule key,
trtllm-schedule as TensorRT-LLM's draft_len_schedule (export/trtllm.py); vllm-tree, trtllm, medusa, eagle and json
write the tree of one row (batch size 1 by default), as export_tree does. SGLang's per-batch-size steps are not
written: its adaptive controller (sgl-project/sglang PR #24055) keys candidate step sets per batch-size range and
picks among them at run time, and no fixed per-batch-size setting of its could be confirmed.
"""
from __future__ import annotations

import json
from pathlib import Path

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.export import eagle, medusa, trtllm, vllm
from workbench.export.common import Warn, plan_rows, row_at
from workbench.trees.optimize import expected_length, value_and_limits
from workbench.trees.tree import MEDUSA_TOPK, RankPath, Tree, load_tree

ENGINES = {"medusa": medusa, "trtllm": trtllm, "vllm": vllm, "eagle": eagle}  # each: SUFFIX, TARGET, write_tree
SUFFIXES = {"medusa": medusa.SUFFIX, "json": ".json", "trtllm": trtllm.SUFFIX, "vllm": vllm.SUFFIX,  # file name ends
            "eagle": eagle.SUFFIX}
FORMATS = tuple(SUFFIXES)
TARGETS = {f: m.TARGET for f, m in ENGINES.items()}  # the header line of each export; docs/formats.md's table
SAFE_ENGINES = ("trtllm", "vllm")  # formats with an engine-safe repair (medusa / eagle: --max-rank 10 is enough)
PLAN_FORMATS = ("vllm", "vllm-tree", "vllm-token-schedule", "trtllm", "trtllm-schedule", "medusa", "eagle",
                "json")  # export PLAN --format
SCHEDULE_FORMATS = ("vllm", "vllm-token-schedule", "trtllm-schedule")  # a K per batch size (chains: any drafter)
TRTLLM_MAX_DRAFT_LEN = trtllm.TRTLLM_MAX_DRAFT_LEN


def export_tree(tree: Tree, fmt: str, name: str | None = None, heads: int | None = None,
                max_draft_len: int = TRTLLM_MAX_DRAFT_LEN, strict: bool = False) -> tuple[str, list[Warn]]:
    """(text to write, warnings). `heads` (when known) bounds the depth: a deeper tree is a WorkbenchError. A tree
    the target cannot take at all (a depth-1 tree for EAGLE-1) is a WorkbenchError with strict (the CLI); without
    it (the app, which renders every format at once) the refusal is the only warning and the text a comment saying
    why, so no downloaded file passes for a tree."""
    if fmt not in FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    tree = load_tree(tree, num_heads=heads)
    name = name or tree.name or "medusa_choices"
    if fmt == "json":
        return json.dumps({"name": name, "medusa_choices": tree.as_lists()}) + "\n", []
    return ENGINES[fmt].write_tree(tree, name, heads=heads, max_draft_len=max_draft_len, strict=strict)


# ----------------------------------------------------------------------------------------------- engine-safe trees

def _stand_in(path: RankPath) -> float:
    """Value used when no accuracies are given: halves per rank step and per level (monotone, so exactness holds)."""
    return 0.5 ** (sum(path) + len(path))


def _check_safe_engine(engine: str) -> None:
    if engine not in SAFE_ENGINES:
        raise FieldError("engine_safe", "unsupported",
                         f"{{field}} supports {' and '.join(SAFE_ENGINES)}; medusa and eagle take any tree "
                         f"of depth >= 2 with ranks < {MEDUSA_TOPK} (optimize {{also}} {MEDUSA_TOPK})", also="max_rank")


def best_engine_safe(value, engine: str, budget: int, max_depth: int, max_rank: int) -> Tree:
    """The most valuable tree of at most `budget` nodes that `engine` builds exactly as written (optimize
    --engine-safe). `value` is acc[K, R] or a path value function."""
    _check_safe_engine(engine)
    return ENGINES[engine].best(value, budget, max_depth, max_rank)


def engine_safe(tree: Tree, engine: str, value=None, max_nodes: int | None = None,
                heads: int | None = None) -> tuple[Tree, str]:
    """(a tree the engine builds exactly as written, one line saying what changed and at what cost): trtllm.repair
    (at most `max_nodes`, the engine's max_draft_len) or vllm.repair (no deeper than `heads`). `value` is
    acc[K, R] or a path value function; without it the cost is unknown (the line ends "cost unknown") and a
    stand-in ranks nodes (trtllm)."""
    _check_safe_engine(engine)
    fn = depth = ranks = None
    if value is not None:  # a table's limits are its shape; a value function's, the tree's own
        fn, depth, ranks = value_and_limits(value, what="the engine repair", fallback=(tree.depth, tree.max_rank + 1))
        if tree.depth > depth or tree.max_rank >= ranks:
            raise WorkbenchError(f"tree needs depth {tree.depth} and top-{tree.max_rank + 1} but the accuracies have "
                                 f"{depth} heads and top-{ranks}")
    if engine == "trtllm":
        safe, why = trtllm.repair(tree, fn or _stand_in, max_nodes)
    else:
        safe, why = vllm.repair(tree, fn, depth, ranks, heads)
    if safe is None:
        return tree, why
    gone, added = set(tree.paths) - set(safe.paths), set(safe.paths) - set(tree.paths)
    change = (f"engine-safe for {engine}: {tree.nodes} -> {safe.nodes} nodes, added {_short(added)}, "
              f"dropped {_short(gone)}{why}; ")
    if fn is None:
        return safe, change + "cost unknown"  # without accuracies (the front end says which input minimises it)
    before, after = expected_length(tree, fn), expected_length(safe, fn)
    cost = f"cost {before - after:.4f}" if after <= before else f"a gain of {after - before:.4f}"
    return safe, change + f"expected acceptance {before:.4f} -> {after:.4f} tokens/step ({cost})"


def _short(paths) -> str:
    ps = sorted(paths, key=lambda p: (len(p), p))
    s = " ".join(str(list(p)).replace(" ", "") for p in ps[:6])
    return (s + (f" (+{len(ps) - 6} more)" if len(ps) > 6 else "")) or "nothing"


# ----------------------------------------------------------------------------------------------- plans

def check_plan_heads(plan: dict, heads_dir) -> tuple[int, list[Warn]]:
    """(the heads' count, warnings) after checking that `heads_dir` holds the heads the plan was made for (the
    calibration's heads_sha256) and enough heads for its deepest row: another model's heads are an error."""
    # deferred: heads load torch, which tree and plan exports (the CLI's, the app's plan tab) never need
    from workbench.runtime.heads import heads_fingerprint, load_heads

    heads, _ = load_heads(heads_dir)
    src = plan.get("source") or {}
    want, warns = src.get("heads_sha256"), []
    if want:
        got = heads_fingerprint(heads)
        if got != want:
            raise FieldError("heads", "other_heads",
                             f"{{field}} {heads_dir}: not the heads this plan was made for (plan: heads "
                             f"{src.get('heads')} of {src.get('model')}, fingerprint {want}; these: {got}): "
                             "calibrate these heads and plan again")
    else:
        warns.append(Warn("plan_heads_unchecked", f"the plan records no heads fingerprint (made from "
                          f"{src.get('kind', 'an unknown source')}): cannot check that {heads_dir} holds the heads "
                          "it describes"))
    deepest = max(r["tree"].depth if "tree" in r else r["nodes"] for r in plan_rows(plan))
    if deepest > heads.num_heads:
        raise FieldError("heads", "too_shallow",
                         f"{{field}} {heads_dir}: {heads.num_heads} heads, but the plan drafts {deepest} tokens deep")
    return heads.num_heads, warns


def export_plan(plan: dict, fmt: str, heads_dir=None, synthetic: bool = False, batch_size: int | None = None,
                name: str | None = None, max_draft_len: int = TRTLLM_MAX_DRAFT_LEN, method: str | None = None,
                draft_model=None, vllm_version: str | None = None) -> tuple[str, list[Warn], list[str]]:
    """(text, warnings, notes) of a plan (plan_file.read_plan) for one engine. vllm: vllm.write_plan (--synthetic adds
    vLLM's synthetic rejection sampling at the plan's top-1 chain acceptance). The static formats (vllm-tree,
    trtllm, medusa, eagle, json) write the tree of one row (batch_size, default 1) as export_tree does."""
    if fmt not in PLAN_FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r} for a plan; choose one of {', '.join(PLAN_FORMATS)}")
    if synthetic and fmt != "vllm":
        raise FieldError("synthetic", "needs_other",
                         "{field} is vLLM's synthetic rejection sampling: only with {also} vllm", also="format")
    if (method or draft_model or vllm_version) and fmt not in SCHEDULE_FORMATS:
        raise FieldError("method", "needs_other", f"{{field}}, {{also}} and {{also2}} are for {{also3}} "
                         f"{', '.join(SCHEDULE_FORMATS)}", also=("draft_model", "vllm_version", "format"))
    num_heads, warns = check_plan_heads(plan, heads_dir) if heads_dir is not None else (None, [])
    if fmt in ("vllm", "vllm-token-schedule"):
        key = "speculative_token_schedule" if fmt != "vllm" else "num_speculative_tokens_per_batch_size"
        text, more, notes = vllm.write_plan(plan, heads_dir, num_heads, synthetic, batch_size, method, draft_model,
                                            vllm_version, key)
        return text, warns + more, notes
    if fmt == "trtllm-schedule":
        notes: list[str] = []
        src = plan.get("source") or {}
        served = src.get("served") and not method
        text, more, more_notes = trtllm.write_schedule(
            vllm.vllm_schedule(plan, notes), method or (src.get("method") if src.get("served") else None),
            str(Path(draft_model).resolve()) if draft_model else (src.get("draft_model") if served else None))
        return text, warns + more, notes + more_notes
    row, notes = row_at(plan, batch_size or 1)
    if row["kind"] == "none":
        raise FieldError("batch_sizes", "no_tree", f"the plan says no speculation at batch size {row['batch_size']}: "
                         f"there is no tree to export for {fmt} (serve without speculation, or export another "
                         "{field} B)")
    if row["kind"] == "dynamic":
        raise FieldError("batch_sizes", "per_step", f"the plan's choice at batch size {row['batch_size']} is a "
                         f"per-step tree ({row['nodes']} of its {len(row['medusa_choices'])}-node envelope chosen each "
                         f"step), which no static tree format holds: run it with `workbench decode --dynamic "
                         f"{row['nodes']} --tree ENVELOPE` (the envelope: the plan row's medusa_choices), or export "
                         "{also} vllm (the best chain) or another {field} B", also="format")
    others = [f"{r['kind']}" + (f" of {r['nodes']} nodes" if r["kind"] != "none" else "") + f" at {r['batch_size']}"
              for r in plan_rows(plan) if r["medusa_choices"] != row["medusa_choices"]]
    notes.append(f"the batch-size {row['batch_size']} row ({row['kind']}, {row['nodes']} nodes, predicted "
                 f"{row['predicted_speedup']:.3f}x); a static tree serves every batch size alike"
                 + (f", where the plan picks: {', '.join(others)}" if others else ""))
    tree = Tree(row["tree"].paths, name or f"plan_b{row['batch_size']}")
    text, more = export_tree(tree, "vllm" if fmt == "vllm-tree" else fmt, name=name, heads=num_heads,
                             max_draft_len=max_draft_len, strict=True)
    return text, warns + more, notes
