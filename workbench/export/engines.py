"""Write a tree in the formats other decoders import, with a one-line warning wherever the target engine would not
build it exactly as written, `engine_safe` to repair a tree for one engine and `best_engine_safe` to design one.
Each format targets one engine era (TARGETS, also printed in the export's header); checked against each project's
own code, not run end to end:

- medusa: `name = [[0], [0, 0], ...]` as in Medusa's medusa/model/medusa_choices.py; generate_medusa_buffers
  hard-codes TOPK=10, so a rank >= 10 would index the next head's guesses.
- json: `{"name", "medusa_choices"}`, readable by every workbench command (no engine, no header).
- trtllm: the `--medusa_choices="[[0], ...]"` argument of TensorRT-LLM's examples/run.py (same list for
  MedusaDecodingConfig(medusa_choices=...)). The engine takes at most max_draft_len draft tokens (63 in its
  examples) and no more depth than its Medusa heads. Its Python runtime (runtime/medusa_utils.py, used by
  ModelRunner) gives the first level one tree id per rank 0..max rank and indexes deeper nodes by the number of
  first-level nodes written, so only a first level of exactly ranks 0..k-1 builds as written.
  Its C++ runtime (medusaModule.cpp) keys each path 4 bits per rank: ranks < 16, at most 8 levels
  (TRTLLM_CPP_*); `engine_safe` drops the nodes beyond them.
- vllm: vLLM's SpeculativeConfig `speculative_token_tree`, a string of a list of tuples sorted breadth-first,
  with num_speculative_tokens == number of nodes. Its EAGLE-style drafter takes, per level, the top-c children
  of EVERY node (c = nodes at the level / nodes at the level above): only dense trees are drafted as written.
  The key exists only in the releases with tree attention; the fragment must stay valid JSON for
  --speculative-config, so the targeted versions go in the warning list, not in a key.
- eagle: EAGLE-1 `mc_sim_7b_63` (eagle/model/choices.py). The draft model (cnets.py init_tree) and the verifier
  (ea_model.py eagenerate's tree_choices default) both read that global, so the export replaces it. The draft
  buffer builder (utils_c.py generate_tree_buffers) indexes its per-level lists by the nodes that have children:
  a depth-1 tree has none and it fails, so depth-1 trees are refused.

A plan (plan/rank.py: one row per batch size) goes out through `export_plan` (PLAN_FORMATS):
- vllm: vLLM's `--speculative-config`. vLLM drafts Medusa heads as a top-1 chain, so a tree row becomes the plan's
  best chain at that batch size (its cost printed). Medusa (vLLM <= 0.32.0): vLLM's Medusa proposer asserts the
  scheduled K equals num_speculative_tokens (vllm/v1/spec_decode/medusa.py propose()), so a plan whose K changes
  with the batch size becomes one config per batch-size range (a JSON list of {"batch_sizes": [low, high],
  "speculative_config"}: serve each range with its own --max-num-seqs), never a schedule that asserts. Other
  drafters (--method eagle3 --draft-model DIR, ...; the usual case for an acceptance-vector plan): Dynamic SD's
  `num_speculative_tokens_per_batch_size` [[low, high, K], ...] (vLLM >= 0.24.0), checked here exactly as
  vllm/v1/spec_decode/dynamic/utils.py does. --synthetic adds the synthetic rejection sampler at the top-1 chain's
  per-position acceptance (checked as vllm/config/speculative.py does: length K, each in [0, 1], non-increasing).
- vllm-heads (`export_vllm_heads`): a heads folder vLLM's Medusa drafter loads (config model_type medusa, biases
  kept with medusa_fc_bias, the base model's output embedding as lm_head.weight for tied heads; fp32).
- vllm-tree, trtllm, medusa, eagle, json: the tree of one row (batch size 1 by default), as export_tree writes it.
"""
from __future__ import annotations

import json
from pathlib import Path

from workbench import DEMO_HEADS, WorkbenchError
from workbench.core.io import atomic_write, atomic_write_json
from workbench.plan.rank import plan_engine
from workbench.trees.optimize import best_dense_tree, expected_length, optimal_tree, optimal_tree_from, value_and_limits
from workbench.trees.tree import MEDUSA_TOPK, RankPath, Tree, load_tree

SUFFIXES = {"medusa": ".py", "json": ".json", "trtllm": ".trtllm.txt", "vllm": ".vllm.json",  # file name ends
            "eagle": ".eagle.py"}
FORMATS = tuple(SUFFIXES)
SAFE_ENGINES = ("trtllm", "vllm")  # formats with an engine-safe repair (medusa / eagle: --max-rank 10 is enough)
TRTLLM_MAX_DRAFT_LEN = 63
# TensorRT-LLM's C++ runtime (executor / Triton backend) keys each node by its path, 4 bits per rank, and finds a
# node's parent by its parent's key: MedusaModule::computePrefix (NVIDIA/TensorRT-LLM
# cpp/tensorrt_llm/runtime/medusaModule.cpp; utils/speculativeChoicesUtils.cpp in later releases):
# `prefix |= (vec[ci] << PREFIX_CHUNK_SIZE_BITS * (len - 1 - ci))` with PREFIX_CHUNK_SIZE_BITS = 4, after
# TLLM_CHECKs of rank <= PREFIX_MAX_VALUE (16) and depth <= 64 / 4. Read as C++ reads it:
# - a rank of 16 passes the check but carries into the parent's 4 bits ([0, 16] and [1, 0] share a key, so the
#   children of one are built under the other): ranks must be < 16; above 16 it throws;
# - vec[ci] is a SizeType32 (int32), so the shift is done in 32 bits: from 9 levels on it shifts by 32 or more,
#   which C++ leaves undefined (x86 masks the count, so [1, 0 x 8] and [0 x 8, 1] share a key), and past 16 levels
#   it throws: at most 32 / 4 = 8 levels are keyed reliably.
# (The heads' top-k sampling, medusaDecodingLayer.cpp, takes up to TOP_K_MAX = 1024 per head: no tighter.)
TRTLLM_CPP_MAX_DEPTH = 32 // 4
TRTLLM_CPP_RANK_LIMIT = 16  # ranks must be below it
DEFAULT_CHOICES = "mc_sim_7b_63"  # the tree both Medusa and EAGLE-1 use unless told otherwise
TARGETS = {  # what each export is written for: the header line of each export, and the README's Formats section
    "medusa": "FasterDecoding/Medusa as released (pip medusa-llm 0.1, 2023-09) and its main branch: "
              "medusa/model/medusa_choices.py, generate_medusa_buffers with TOPK=10",
    "trtllm": "TensorRT-LLM releases with the TensorRT backend (through the 1.2 series at least; deprecated by "
              "NVIDIA/TensorRT-LLM PR #11723, removed by #15763/#15767/#15907/#15918, June-July 2026), its Medusa "
              "flow: examples/run.py --medusa_choices or "
              "MedusaDecodingConfig; its Python runtime, runtime/medusa_utils.py, needs a first level of ranks 0..k-1",
    "vllm": "vLLM with tree attention: speculative_token_tree, ignored by 0.10.0, used by 0.10.1 to 0.20.2, gone "
            "from 0.21.0 (PR #20401 added it, PR #42121 removed tree attention)",
    "eagle": "EAGLE-1 (SafeAILab/EAGLE before EAGLE-2; pip eagle-llm 1.x, last 1.2.1 of 2024-04): "
             "eagle/model/choices.py",
}
VLLM_VERSIONS = ("speculative_token_tree is used only by vLLM 0.10.1 to 0.20.2 (0.10.0 ignores it; 0.21.0 and "
                 "later reject the key)")


def _py_list(tree: Tree) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, p)) + "]" for p in tree.paths) + "]"


def _identifier(name: str) -> str:
    ident = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "medusa_choices"
    return ident if not ident[0].isdigit() else "tree_" + ident


def _header(fmt: str, what: str) -> str:
    return f"# workbench export for {what} (targets {TARGETS[fmt]})\n"


# How each front end words the fix a warning points to: the CLI names its flags, the app its own controls.
FIXES = {
    "max_rank": {"cli": f"or use --max-rank {MEDUSA_TOPK}",
                 "app": f"or design with ranks below {MEDUSA_TOPK} (the optimizer's max rank)"},
    "engine_safe": {"cli": "use --engine-safe", "app": "use the repair buttons below"},
    "budget": {"cli": "or use a smaller --budget", "app": "or a smaller budget"},
    "num_heads": {"cli": "pass --num-heads to check it here", "app": "the designer checks it against the loaded heads"},
    "trtllm_rank": {"cli": f"use --engine-safe, or design with --max-rank {TRTLLM_CPP_RANK_LIMIT}",
                    "app": f"use the repair buttons below, or design with ranks below {TRTLLM_CPP_RANK_LIMIT} "
                           "(the optimizer's max rank)"},
    "trtllm_depth": {"cli": f"use --engine-safe, or design with --max-depth {TRTLLM_CPP_MAX_DEPTH}",
                     "app": f"use the repair buttons below, or design with at most {TRTLLM_CPP_MAX_DEPTH} levels"},
    "dense": {"cli": "use a dense tree (optimize --dense, --engine-safe vllm, or the app's dense option)",
              "app": "use the designer's dense-per-level model or the vllm repair button below"},
}


def _fix(key: str, front: str) -> str:
    return FIXES[key][front]


def _rank_warning(tree: Tree, engine: str, front: str) -> list[str]:
    if tree.max_rank >= MEDUSA_TOPK:
        bad = next(p for p in tree.paths if max(p) >= MEDUSA_TOPK)
        return [f"path {list(bad)} has rank {max(bad)}: {engine} builds its buffers from each head's top-"
                f"{MEDUSA_TOPK}, so ranks must be < {MEDUSA_TOPK} (raise TOPK there, {_fix('max_rank', front)})"]
    return []


def trtllm_cpp_breaks(path: RankPath) -> bool:
    """True when TensorRT-LLM's C++ runtime cannot key `path` reliably (see TRTLLM_CPP_MAX_DEPTH): a rank >= 16 or
    more than 8 levels. A node's descendants break it too, so dropping these keeps a tree prefix-closed."""
    return len(path) > TRTLLM_CPP_MAX_DEPTH or max(path) >= TRTLLM_CPP_RANK_LIMIT


def trtllm_cpp_warnings(tree: Tree, front: str) -> list[str]:
    """Where TensorRT-LLM's C++ runtime (the executor / Triton backend) reads the tree otherwise than its Python
    runtime (runtime/medusa_utils.py, which takes it): computePrefix keys (TRTLLM_CPP_MAX_DEPTH's comment)."""
    warns = []
    if tree.max_rank >= TRTLLM_CPP_RANK_LIMIT:
        bad = next(p for p in tree.paths if max(p) >= TRTLLM_CPP_RANK_LIMIT)
        warns.append(f"path {list(bad)} has rank {max(bad)}: TensorRT-LLM's C++ runtime packs each rank in 4 bits "
                     f"and takes ranks < {TRTLLM_CPP_RANK_LIMIT} only (its Python runtime takes more); "
                     + _fix("trtllm_rank", front))
    if tree.depth > TRTLLM_CPP_MAX_DEPTH:
        warns.append(f"tree depth {tree.depth}: TensorRT-LLM's C++ runtime keys a path by shifting each rank, a "
                     f"32-bit int, 4 bits per level below it, so from {TRTLLM_CPP_MAX_DEPTH + 1} levels on distinct "
                     f"paths can share a key (undefined in C++; past 16 levels it throws): at most "
                     f"{TRTLLM_CPP_MAX_DEPTH} levels (its Python runtime takes more); " + _fix("trtllm_depth", front))
    return warns


def first_level_gaps(tree: Tree) -> list[int]:
    """First-level ranks below the largest one that the tree lacks: TensorRT-LLM's Python runtime assumes none."""
    first = {p[0] for p in tree.paths if len(p) == 1}
    return [r for r in range(max(first) + 1) if r not in first]


def vllm_uniform(tree: Tree) -> bool:
    """True when every node at depth d-1 has children exactly ranks 0..c_d-1 (the only shape vLLM drafts)."""
    per_depth = [0] * tree.depth
    for p in tree.paths:
        per_depth[len(p) - 1] += 1
    shape = {p for p in tree.paths}
    level = [()]
    for d in range(tree.depth):
        c = per_depth[d] // len(level)
        nxt = [q + (r,) for q in level for r in range(c)]
        if c * len(level) != per_depth[d] or not all(q in shape for q in nxt):
            return False
        level = nxt
    return True


def export_tree(tree: Tree, fmt: str, name: str | None = None, heads: int | None = None,
                max_draft_len: int = TRTLLM_MAX_DRAFT_LEN, strict: bool = False,
                front: str = "cli") -> tuple[str, list[str]]:
    """(text to write, warnings: one line each, their fixes worded for `front`, "cli" or "app", see FIXES).
    `heads` (when known) bounds the depth: a deeper tree is a
    WorkbenchError. A tree the target cannot take at all (a depth-1 tree for EAGLE-1) is a WorkbenchError with
    strict (the CLI); without it (the app, which renders every format at once) the refusal is the only warning
    and the text a comment saying why, so no downloaded file passes for a tree."""
    if fmt not in FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    tree = load_tree(tree, num_heads=heads)
    name = name or tree.name or "medusa_choices"
    warns: list[str] = []
    if fmt == "medusa":
        warns += _rank_warning(tree, "Medusa's generate_medusa_buffers", front)
        note = ("# add it to medusa/model/medusa_choices.py and pass medusa_choices=" + _identifier(name)
                + f" to medusa_generate (its default is {DEFAULT_CHOICES})\n")
        return _header(fmt, "Medusa") + note + f"{_identifier(name)} = {_py_list(tree)}\n", warns
    if fmt == "json":
        return json.dumps({"name": name, "medusa_choices": tree.as_lists()}) + "\n", warns
    if fmt == "trtllm":
        gaps = first_level_gaps(tree)
        if gaps:
            warns.append(f"first level lacks rank(s) {', '.join(map(str, gaps))}: TensorRT-LLM's Python runtime "
                         f"gives the first level ranks 0..{max(p[0] for p in tree.paths)} and would build other "
                         f"tree ids than written; {_fix('engine_safe', front)}")
        if tree.nodes > max_draft_len:
            warns.append(f"tree has {tree.nodes} nodes but a TensorRT-LLM Medusa engine takes at most max_draft_len="
                         f"{max_draft_len} draft tokens: rebuild the engine with max_draft_len >= {tree.nodes} "
                         + _fix("budget", front))
        warns += trtllm_cpp_warnings(tree, front)
        if heads is None:
            warns.append(f"TensorRT-LLM needs num_medusa_heads >= tree depth {tree.depth} "
                         f"({_fix('num_heads', front)})")
        return _header(fmt, f"TensorRT-LLM, tree {name}") + f'--medusa_choices="{_py_list(tree)}"\n', warns
    if fmt == "vllm":
        bfs = sorted(tree.paths, key=lambda p: (len(p), p))
        warns.append(VLLM_VERSIONS)
        if not vllm_uniform(tree):
            warns.append("vLLM's tree drafter gives every node of a level the same number of children (its top-c), "
                         f"so it will not draft this irregular tree as written; {_fix('dense', front)}")
        # vLLM requires num_speculative_tokens == number of nodes, so the fragment carries both.
        cfg = {"num_speculative_tokens": tree.nodes, "speculative_token_tree": str(bfs)}
        return json.dumps(cfg) + "\n", warns
    # eagle
    if tree.depth < 2:
        why = (f"EAGLE-1 cannot take a depth-1 tree ({tree.nodes} nodes): its draft-buffer builder indexes the "
               "nodes that have children and fails when there are none; use a tree of depth >= 2")
        if strict:
            raise WorkbenchError(why)
        return f"# not exported: {why}\n", [why]
    warns += _rank_warning(tree, "EAGLE-1's generate_tree_buffers", front) + eagle1_warnings(tree)
    note = (f"# replaces the {DEFAULT_CHOICES} line of eagle/model/choices.py: both the draft model (cnets.py "
            f"init_tree) and the verifier (ea_model.py eagenerate) read that global; tree {name}, {tree.nodes} nodes\n")
    return _header(fmt, "EAGLE-1") + note + f"{DEFAULT_CHOICES} = {_py_list(tree)}\n", warns


def _stand_in(path: RankPath) -> float:
    """Value used when no accuracies are given: halves per rank step and per level (monotone, so exactness holds)."""
    return 0.5 ** (sum(path) + len(path))


def _check_safe_engine(engine: str) -> None:
    if engine not in SAFE_ENGINES:
        raise WorkbenchError(f"--engine-safe supports {' and '.join(SAFE_ENGINES)}; medusa and eagle take any tree "
                             f"of depth >= 2 with ranks < {MEDUSA_TOPK} (optimize --max-rank {MEDUSA_TOPK})")


def best_engine_safe(value, engine: str, budget: int, max_depth: int, max_rank: int) -> Tree:
    """The most valuable tree of at most `budget` nodes that `engine` builds exactly as written (optimize
    --engine-safe): trtllm, first level ranks 0..k-1 (exact over k) within the C++ runtime's ranks < 16 and
    8 levels; vllm, the best dense tree. `value` is acc[K, R] or a path value function."""
    _check_safe_engine(engine)
    if engine == "vllm":
        return best_dense_tree(value, budget, max_depth, max_rank)
    return optimal_tree(value, budget, min(max_depth, TRTLLM_CPP_MAX_DEPTH), min(max_rank, TRTLLM_CPP_RANK_LIMIT),
                        contiguous_first_level=True)


def engine_safe(tree: Tree, engine: str, value=None, max_nodes: int | None = None,
                heads: int | None = None) -> tuple[Tree, str]:
    """(a tree the engine builds exactly as written, one line saying what changed and at what cost).

    trtllm: the most valuable tree made of the tree's own nodes that the C++ runtime keys (trtllm_cpp_breaks:
    ranks < 16, at most 8 levels) plus promoted first-level ranks, whose first level is exactly ranks 0..k-1 (the
    Python runtime), with at most as many nodes (and at most `max_nodes`, the engine's max_draft_len): promoting
    the missing ranks, or dropping the outlying first-level branch, whichever costs less expected acceptance
    length. Exact (optimal_tree_from(..., contiguous_first_level=True)).
    vllm: the best dense tree with at most as many nodes and no deeper than `heads` (needs `value`).
    `value` is acc[K, R] or a path value function; without it the cost is unknown and a stand-in ranks nodes.
    """
    _check_safe_engine(engine)
    fn = depth = ranks = None
    if value is not None:  # a table's limits are its shape; a value function's, the tree's own
        fn, depth, ranks = value_and_limits(value, what="--engine-safe", fallback=(tree.depth, tree.max_rank + 1))
        if tree.depth > depth or tree.max_rank >= ranks:
            raise WorkbenchError(f"tree needs depth {tree.depth} and top-{tree.max_rank + 1} but the accuracies have "
                                 f"{depth} heads and top-{ranks}")
    cut = []  # nodes past an engine's hard limits (TensorRT-LLM's C++ runtime)
    if engine == "trtllm":
        budget = min(tree.nodes, max_nodes or tree.nodes)
        cut = [p for p in tree.paths if trtllm_cpp_breaks(p)]
        if not first_level_gaps(tree) and tree.nodes <= budget and not cut:
            return tree, ("engine-safe: already builds as written in TensorRT-LLM (first level ranks 0..k-1, ranks "
                          f"< {TRTLLM_CPP_RANK_LIMIT}, at most {TRTLLM_CPP_MAX_DEPTH} levels)")
        own, base = set(tree.paths) - set(cut), fn or _stand_in
        k = max((p[0] for p in own), default=0) + 1  # first-level ranks up to the largest kept one may be promoted

        def masked(p: RankPath) -> float:  # 0 off the tree, but for promotable first-level ranks: repair, not redesign
            return base(p) if p in own or (len(p) == 1 and p[0] < k) else 0.0

        safe = optimal_tree_from(masked, budget, min(tree.depth, TRTLLM_CPP_MAX_DEPTH),
                                 min(max(k, tree.max_rank + 1), TRTLLM_CPP_RANK_LIMIT), name=tree.name,
                                 contiguous_first_level=True)
    else:
        if fn is None:
            raise WorkbenchError("--engine-safe for vllm picks the best dense tree and needs --accuracies FILE or "
                                 "--calibration DIR")
        if vllm_uniform(tree):
            return tree, "engine-safe: already a dense tree, which vLLM drafts as written"
        safe = best_dense_tree(fn, tree.nodes, min(depth, heads or depth), ranks)
        safe = Tree(safe.paths, tree.name or safe.name)
    gone, added = set(tree.paths) - set(safe.paths), set(safe.paths) - set(tree.paths)
    change = (f"engine-safe for {engine}: {tree.nodes} -> {safe.nodes} nodes, added {_short(added)}, "
              f"dropped {_short(gone)}"
              + (f" ({len(cut)} of them past TensorRT-LLM's C++ runtime limits: ranks < {TRTLLM_CPP_RANK_LIMIT}, at "
                 f"most {TRTLLM_CPP_MAX_DEPTH} levels)" if cut else "") + "; ")
    if fn is None:
        return safe, change + "cost unknown (give --accuracies or --calibration to minimise it)"
    before, after = expected_length(tree, fn), expected_length(safe, fn)
    cost = f"cost {before - after:.4f}" if after <= before else f"a gain of {after - before:.4f}"
    return safe, change + f"expected acceptance {before:.4f} -> {after:.4f} tokens/step ({cost})"


def _short(paths) -> str:
    ps = sorted(paths, key=lambda p: (len(p), p))
    s = " ".join(str(list(p)).replace(" ", "") for p in ps[:6])
    return (s + (f" (+{len(ps) - 6} more)" if len(ps) > 6 else "")) or "nothing"


# ----------------------------------------------------------------------------------------------- plans

PLAN_FORMATS = ("vllm", "vllm-tree", "trtllm", "medusa", "eagle", "json")  # export PLAN --format
# vLLM version windows, read in vLLM's own code at its release tags (not its docs): (first, last), None = open
VLLM_WINDOWS = {
    "speculative_token_tree": ("0.10.1", "0.20.2"),  # 0.10.0 ignores the key; 0.21.0 removed tree attention
    "num_speculative_tokens_per_batch_size": ("0.24.0", None),  # Dynamic SD's per-batch-size schedule
    "medusa": (None, "0.32.0"),  # 0.33.0 removed the Medusa drafter (eagle, eagle3, mtp, draft_model, ngram remain)
}
VLLM_METHODS = ("medusa", "eagle", "eagle3", "mtp", "draft_model", "ngram")  # --method: vLLM's drafters
VLLM_NEWEST = "0.33.0"  # the newest vLLM these windows were checked against
VLLM_SCHEDULE = ("vLLM >= 0.24.0 (Dynamic SD): --speculative-config num_speculative_tokens_per_batch_size, a list of "
                 "[low, high, K] with inclusive batch-size ranges, checked as vllm/v1/spec_decode/dynamic/utils.py "
                 "validate_and_normalize_dynamic_sd_schedule does (positive ranges, low <= high, K >= 0, "
                 "non-overlapping once sorted by low, the first starting at 1)")
VLLM_MEDUSA_PER_RANGE = ("vLLM's Medusa proposer asserts that the scheduled K equals num_speculative_tokens "
                         "(vllm/v1/spec_decode/medusa.py propose()), so a per-batch-size schedule with a K below the "
                         "largest fails with an AssertionError: this plan's K changes with the batch size, so it is "
                         "written as one constant-K config per batch-size range (serve each range with its own "
                         "--max-num-seqs HIGH), or export one with --batch-sizes B")


def priced_elsewhere(plan: dict) -> list[str]:
    """The warning for a vLLM export of a plan priced on another engine's step costs (plan.rank.plan_engine): its
    K per batch size is that engine's best, not necessarily vLLM's; [] for a plan priced on vLLM."""
    engine, _ = plan_engine(plan)
    if engine == "vllm":
        return []
    src = plan.get("source") or {}
    flag = {"acceptance": "--acceptance", "accuracies": "--accuracies"}.get(src.get("kind"), "--calibration")
    return [f"the plan was priced on {'our decoder' if engine == 'workbench' else engine}'s step costs, not on "
            "vLLM's, whose rounds cost otherwise (its K per batch size may not be vLLM's best): price it on vLLM with "
            f"`workbench latency --engine vllm --out vllm-latency.csv` then `workbench plan {flag} "
            f"{src.get('path') or 'FILE'} --latency vllm-latency.csv`"]


def _plan_rows(plan: dict) -> list[dict]:
    return plan["plans"]


def _row_at(plan: dict, batch_size: int) -> tuple[dict, list[str]]:
    """The plan row serving `batch_size`: the largest planned batch size <= it (below the first, the first)."""
    rows = _plan_rows(plan)
    if batch_size < 1:
        raise WorkbenchError(f"--batch-sizes {batch_size}: must be >= 1")
    below = [r for r in rows if r["batch_size"] <= batch_size]
    if below:
        row = below[-1]
        return row, ([] if row["batch_size"] == batch_size else
                     [f"batch size {batch_size} is not in the plan: using the row of batch size {row['batch_size']}"])
    return rows[0], [f"batch size {batch_size} is below the plan's first ({rows[0]['batch_size']}): using that row"]


def _chain_k(plan: dict, row: dict, notes: list[str]) -> int:
    """K a chain-only engine runs at this row: the chain's length, 0 for none, and for a tree the plan's best
    chain (or none) at that batch size, with its cost as a note."""
    if row["kind"] != "tree":
        return row["nodes"]
    alt = next((a for a in plan.get("alternatives") or [] if a["batch_size"] == row["batch_size"]), None)
    chain = (alt or {}).get("best_chain")
    if not chain:
        raise WorkbenchError("the plan has a tree row but no alternatives.best_chain to turn it into a chain: "
                             "re-run `workbench plan`")
    k = chain["k"]
    notes.append(f"batch {row['batch_size']}: vLLM drafts no trees, so the plan's {row['nodes']}-node tree "
                 f"({row['predicted_tokens_per_step']:.3f} tokens/step, {row['predicted_speedup']:.3f}x) becomes "
                 + (f"the chain K={k}" if k else "no speculation")
                 + f" ({chain['predicted_tokens_per_step']:.3f} tokens/step, {chain['predicted_speedup']:.3f}x): costs "
                 f"{row['predicted_tokens_per_step'] - chain['predicted_tokens_per_step']:.3f} tokens/step")
    return k


def vllm_schedule(plan: dict, notes: list[str]) -> list[list[int]]:
    """[[low, high, K], ...]: every batch size from 1 to the plan's largest exactly once (row i covers its batch
    size up to the next row's minus one; adjacent ranges with the same K merged). vLLM keeps the last K above."""
    rows = _plan_rows(plan)
    ks = [_chain_k(plan, r, notes) for r in rows]
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


def check_plan_heads(plan: dict, heads_dir) -> tuple[int, list[str]]:
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
            raise WorkbenchError(f"--heads {heads_dir}: not the heads this plan was made for (plan: heads "
                                 f"{src.get('heads')} of {src.get('model')}, fingerprint {want}; these: {got}): "
                                 "calibrate these heads and plan again")
    else:
        warns.append(f"the plan records no heads fingerprint (made from {src.get('kind', 'an unknown source')}): "
                     f"cannot check that {heads_dir} holds the heads it describes")
    deepest = max(r["tree"].depth if "tree" in r else r["nodes"] for r in _plan_rows(plan))
    if deepest > heads.num_heads:
        raise WorkbenchError(f"--heads {heads_dir}: {heads.num_heads} heads, but the plan drafts {deepest} tokens deep")
    return heads.num_heads, warns


def _version(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(v).split(".")[:3])
    except ValueError:
        raise WorkbenchError(f"--vllm-version {v!r}: give a release like 0.32.0") from None


def vllm_window_error(key: str, version: str) -> str | None:
    """Why vLLM `version` cannot take `key` (a VLLM_WINDOWS key), or None when it can."""
    first, last = VLLM_WINDOWS[key]
    v = _version(version)
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


def _vllm_drafter(plan: dict, heads_dir, method: str | None, draft_model) -> dict:
    """method/model keys with an absolute model path: --method/--draft-model when given, else the heads folder
    given, else the calibration's own heads (the demo heads' folder for "demo"). A plan from an accuracy table or
    an acceptance vector names no drafter: without --method it is an error (vLLM rejects a config without one)."""
    if method is not None and method not in VLLM_METHODS:
        raise WorkbenchError(f"--method {method}: vLLM's drafters are {', '.join(VLLM_METHODS)}")
    src = plan.get("source") or {}
    if method not in (None, "medusa"):
        if draft_model is None and method in ("eagle", "eagle3", "draft_model"):
            raise WorkbenchError(f"--method {method} needs --draft-model DIR (the drafter's weights)")
        return {"method": method} | ({"model": str(Path(draft_model).resolve())} if draft_model else {})
    model = draft_model or heads_dir or (DEMO_HEADS if src.get("heads") == "demo" else None)
    if model is None and src.get("kind") == "calibration" and src.get("heads"):
        model = src["heads"]
    if model is None:
        made = {"accuracies": "accuracy table", "acceptance": "acceptance vector"}.get(src.get("kind"), "source")
        raise WorkbenchError(f"the plan names no drafter (the {made} {src.get('path', '')} it was made from names "
                             "no heads): give --method (e.g. eagle3) and --draft-model DIR, or --heads DIR for "
                             "Medusa heads")
    return {"method": "medusa", "model": str(Path(model).resolve())}


def vllm_plan_configs(plan: dict, notes: list[str], drafter: dict, synthetic: bool = False,
                      num_heads: int | None = None) -> list[dict]:
    """[{"batch_sizes": [low, high], "speculative_config": {...} or None}, ...]: one constant-K config per
    batch-size range of the plan's schedule (None where the plan does not speculate)."""
    out = []
    for lo, hi, k in vllm_schedule(plan, notes):
        cfg = None
        if k:
            cfg = dict(drafter, num_speculative_tokens=k)
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


def export_plan(plan: dict, fmt: str, heads_dir=None, synthetic: bool = False, batch_size: int | None = None,
                name: str | None = None, max_draft_len: int = TRTLLM_MAX_DRAFT_LEN, method: str | None = None,
                draft_model=None, vllm_version: str | None = None) -> tuple[str, list[str], list[str]]:
    """(text, warnings, notes) of a plan (plan.read_plan) for one engine. vllm: the --speculative-config JSON
    for vLLM `vllm_version` (default: the newest that serves the drafter): with batch_size one K; else for
    Medusa one config per batch-size range where K changes (a JSON list, see the module docstring), for other
    drafters a Dynamic SD schedule. --synthetic adds vLLM's synthetic rejection sampling at the plan's top-1 chain
    acceptance. The static formats (vllm-tree, trtllm, medusa, eagle, json) write the tree of one row
    (batch_size, default 1) as export_tree does."""
    if fmt not in PLAN_FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r} for a plan; choose one of {', '.join(PLAN_FORMATS)}")
    if synthetic and fmt != "vllm":
        raise WorkbenchError("--synthetic is vLLM's synthetic rejection sampling: only with --format vllm")
    if (method or draft_model or vllm_version) and fmt != "vllm":
        raise WorkbenchError("--method, --draft-model and --vllm-version are for --format vllm")
    warns, notes = [], []
    num_heads = None
    if heads_dir is not None:
        num_heads, warns = check_plan_heads(plan, heads_dir)
    if fmt != "vllm":
        row, why = _row_at(plan, batch_size or 1)
        notes += why
        if row["kind"] == "none":
            raise WorkbenchError(f"the plan says no speculation at batch size {row['batch_size']}: there is no tree to "
                                 f"export for {fmt} (serve without speculation, or export another --batch-sizes B)")
        others = [f"{r['kind']}" + (f" of {r['nodes']} nodes" if r["kind"] != "none" else "") + f" at {r['batch_size']}"
                  for r in _plan_rows(plan) if r["medusa_choices"] != row["medusa_choices"]]
        notes.append(f"the batch-size {row['batch_size']} row ({row['kind']}, {row['nodes']} nodes, predicted "
                     f"{row['predicted_speedup']:.3f}x); a static tree serves every batch size alike"
                     + (f", where the plan picks: {', '.join(others)}" if others else ""))
        tree = Tree(row["tree"].paths, name or f"plan_b{row['batch_size']}")
        text, more = export_tree(tree, "vllm" if fmt == "vllm-tree" else fmt, name=name, heads=num_heads,
                                 max_draft_len=max_draft_len, strict=True)
        return text, warns + more, notes
    drafter = _vllm_drafter(plan, heads_dir, method, draft_model)
    warns += priced_elsewhere(plan)
    if synthetic:
        warns.append("synthetic rejection sampling accepts drafts at these rates whatever the tokens are: for timing "
                     "the cost side only, never for serving (vLLM PRs #38045, #40662)")
    medusa = drafter["method"] == "medusa"
    version = vllm_version or ("0.32.0" if medusa else VLLM_NEWEST)
    if medusa and vllm_window_error("medusa", version):
        raise WorkbenchError(vllm_window_error("medusa", version) + ": serve Medusa heads with vLLM <= 0.32.0, or "
                             "another drafter (--method eagle3 --draft-model DIR)")
    notes.append(f"for vLLM {version}, drafter {drafter['method']}" + (f" at {drafter['model']}" if "model" in drafter
                                                                        else ""))
    if batch_size is not None:
        row, why = _row_at(plan, batch_size)
        notes += why
        k = _chain_k(plan, row, notes)
        if k == 0:
            raise WorkbenchError(f"the plan says no speculation at batch size {row['batch_size']}: serve without "
                                 "--speculative-config there")
        if num_heads is not None and k > num_heads:
            raise WorkbenchError(f"--heads {heads_dir}: {num_heads} heads cannot draft K={k} tokens")
        cfg = dict(drafter, num_speculative_tokens=k) | (_synthetic(plan, k) if synthetic else {})
        return json.dumps(cfg) + "\n", warns, notes
    per_range = vllm_plan_configs(plan, notes, drafter, synthetic, num_heads)
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
    if vllm_window_error("num_speculative_tokens_per_batch_size", version):
        raise WorkbenchError(vllm_window_error("num_speculative_tokens_per_batch_size", version)
                             + ": export one K with --batch-sizes B, or target vLLM >= 0.24.0")
    notes.append(f"targets {VLLM_SCHEDULE}")
    schedule = [[lo, hi, kk] for (lo, hi), kk in zip((e["batch_sizes"] for e in per_range), ks)]
    check_vllm_schedule(schedule)
    cfg = dict(drafter, num_speculative_tokens=k, num_speculative_tokens_per_batch_size=schedule)
    if synthetic:
        cfg |= _synthetic(plan, k)
    return json.dumps(cfg) + "\n", warns, notes


# ----------------------------------------------------------------------------------------------- engines' readings

def eagle1_misdrafted(tree: Tree) -> list[RankPath]:
    """The nodes EAGLE-1's draft builder expands from the wrong parent. Its generate_tree_buffers
    (SafeAILab/EAGLE eagle/model/utils_c.py) feeds, level by level, only the nodes that have children, and finds a
    node's parent row in the previous level's top-k by counting parent changes among the nodes with children of
    its own level: a parent whose children are all leaves is not counted, so every later parent's row is off by
    one. E.g. [[0], [1], [0, 0], [1, 0], [1, 0, 0]]: [1, 0] is drafted from [0]'s row, so [1, 0, 0] continues
    [0, 0]'s text. Our decoder (and Medusa's buffers) read every node as written."""
    inner = sorted({p[:-1] for p in tree.paths if len(p) > 1}, key=lambda p: (len(p), p))  # nodes with children
    wrong = []
    for d in range(1, tree.depth):
        parents = [p for p in inner if len(p) == d]  # rows of level d's top-k, in EAGLE-1's order
        row, last = -1, None
        for n in (p for p in inner if len(p) == d + 1):
            if n[:-1] != last:
                row, last = row + 1, n[:-1]
            if parents.index(n[:-1]) != row:
                wrong.append(n)
    return wrong


def eagle1_warnings(tree: Tree) -> list[str]:
    """The EAGLE-1 export's warning when its draft builder reads the tree otherwise than written."""
    wrong = eagle1_misdrafted(tree)
    if not wrong:
        return []
    return [f"EAGLE-1's draft builder (utils_c.py generate_tree_buffers) expands {len(wrong)} node(s) from another "
            f"parent's draft, e.g. {list(wrong[0])} (a node whose children are all leaves precedes one with "
            "grandchildren at that level): those subtrees hold other tokens than written and accept less; give "
            "each earlier node with children a grandchild too, or drop the deeper branch"]


# ----------------------------------------------------------------------------------------------- vLLM heads folder

VLLM_HEADS_WEIGHTS = "model.safetensors"  # vLLM's loader reads every *.safetensors of the folder
LOGIT_SCALES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def vllm_heads_tensors(heads, output_embedding) -> tuple[dict, dict]:
    """(tensors, config) of the heads folder vLLM's Medusa drafter loads (vllm/model_executor/models/medusa.py,
    transformers_utils/configs/medusa.py, 0.32.0): the ResBlocks under Medusa's own `{head}.{layer}.linear.*`
    names (vLLM maps them to blocks.{head}.layers.{layer}.*), with medusa_fc_bias so their biases load (without
    it vLLM drops them silently); tied heads (format 2) share the base model's output embedding, written as
    `lm_head.weight` with original_lm_head; untied heads keep `{head}.{L}.weight` (vLLM's lm_heads.{head}). fp32.
    `output_embedding` [V, H]: the base model's (`get_output_embeddings().weight`, right for tied and untied)."""
    sd = {k: v.detach().float().contiguous().cpu() for k, v in heads.state_dict().items()}
    vocab = int(output_embedding.shape[0])
    if heads.tied:
        sd["lm_head.weight"] = output_embedding.detach().float().contiguous().cpu()
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": heads.num_heads,
           "num_hidden_layers": heads.num_layers, "hidden_size": heads.hidden_size, "vocab_size": vocab,
           "truncated_vocab_size": vocab, "medusa_fc_bias": True, "original_lm_head": bool(heads.tied),
           "torch_dtype": "float32"}
    return sd, cfg


def check_vllm_heads(heads, base) -> None:
    """What vLLM's Medusa module cannot represent is an error, never a folder that drafts garbage."""
    # deferred: torch and transformers (see check_plan_heads)
    from workbench.runtime.generation import text_config
    from workbench.runtime.heads import check_heads_fit

    check_heads_fit(heads, base)
    out = base.get_output_embeddings()
    if getattr(out, "bias", None) is not None:
        raise WorkbenchError("the base model's output layer has a bias; vLLM's Medusa lm_head has none, so its "
                             "drafts would differ from these heads': use heads with their own lm_head (untied)")
    cfg = text_config(base)
    for key in LOGIT_SCALES:
        v = getattr(cfg, key, None)
        if v not in (None, 1, 1.0) and heads.tied:
            raise WorkbenchError(f"the base model scales its logits ({key}={v}); vLLM's Medusa drafter would draft "
                                 "from unscaled ones: not representable as a vLLM Medusa folder")
    if out.weight.shape[1] != heads.hidden_size:
        raise WorkbenchError(f"the base model's output embedding is {list(out.weight.shape)}, not [V, "
                             f"{heads.hidden_size}]: vLLM's Medusa lm_head cannot take it")


def write_vllm_heads(heads, base, out, base_label: str) -> dict:
    """Check, then write the vLLM Medusa folder `out` for heads on a loaded base model (fp32); its config."""
    from safetensors.torch import save_file  # deferred: torch (see check_plan_heads)

    if heads.tied and not heads.vocab_size:
        heads.vocab_size = base.get_output_embeddings().weight.shape[0]
    check_vllm_heads(heads, base)
    sd, cfg = vllm_heads_tensors(heads, base.get_output_embeddings().weight)
    cfg["base_model_name_or_path"] = base_label
    atomic_write(Path(out) / VLLM_HEADS_WEIGHTS, lambda tmp: save_file(sd, str(tmp)), "--out")
    atomic_write_json(Path(out) / "config.json", cfg, "--out")
    return cfg


def export_vllm_heads(heads_dir, model, out) -> tuple[dict, list[str]]:
    """Write `out`: a heads folder for vLLM <= 0.32.0 (--speculative-config '{"method": "medusa", "model": OUT,
    "num_speculative_tokens": K}'). (config written, notes). Atomic per file."""
    # deferred: torch and transformers (see check_plan_heads)
    from workbench.runtime.heads import load_heads
    from workbench.runtime.models import load_base, model_label

    heads, _ = load_heads(heads_dir)
    base, _ = load_base(model, "cpu", "float32", need_tokenizer=False)
    cfg = write_vllm_heads(heads, base, out, model_label(model))
    notes = [f"{heads.num_heads} heads x {heads.num_layers} ResBlock(s), "
             + ("tied: the base model's output embedding written as lm_head.weight (original_lm_head)" if heads.tied
                else "untied: each head's own lm_head"),
             f"serve with vLLM <= 0.32.0 (checked on 0.32.0): --speculative-config '{{\"method\": \"medusa\", "
             f"\"model\": \"{Path(out).resolve()}\", \"num_speculative_tokens\": K}}' with K <= {heads.num_heads} "
             "(vLLM 0.33.0 removed Medusa)"]
    return cfg, notes
