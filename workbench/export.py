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
- vllm: vLLM's SpeculativeConfig `speculative_token_tree`, a string of a list of tuples sorted breadth-first,
  with num_speculative_tokens == number of nodes. Its EAGLE-style drafter takes, per level, the top-c children
  of EVERY node (c = nodes at the level / nodes at the level above): only dense trees are drafted as written.
  The key exists only in the releases with tree attention; the fragment must stay valid JSON for
  --speculative-config, so the targeted versions go in the warning list, not in a key.
- eagle: EAGLE-1 `mc_sim_7b_63` (eagle/model/choices.py). The draft model (cnets.py init_tree) and the verifier
  (ea_model.py eagenerate's tree_choices default) both read that global, so the export replaces it. The draft
  buffer builder (utils_c.py generate_tree_buffers) indexes its per-level lists by the nodes that have children:
  a depth-1 tree has none and it fails, so depth-1 trees are refused.

A plan (plan.py: one row per batch size) goes out through `export_plan` (PLAN_FORMATS):
- vllm: vLLM's Dynamic SD `--speculative-config` with `num_speculative_tokens_per_batch_size` [[low, high, K], ...]
  (vllm/v1/spec_decode/dynamic/utils.py checks it: K >= 0, the first range starting at 1; gaps take the previous K,
  batch sizes above the last range the last K). vLLM drafts Medusa heads as a top-1 chain, so a tree row becomes
  the plan's best chain at that batch size (its cost printed). Its Medusa proposer asserts the scheduled K equals
  num_speculative_tokens, so a schedule below K_max is warned about. --synthetic adds the synthetic rejection
  sampler at the top-1 chain's per-position acceptance (vllm/config/speculative.py: length K, non-increasing).
- vllm-tree, trtllm, medusa, eagle, json: the tree of one row (batch size 1 by default), as export_tree writes it.
- trtllm-current: an error saying why current TensorRT-LLM serves no Medusa heads (TRTLLM_CURRENT).
"""
from __future__ import annotations

import json

from workbench import WorkbenchError
from workbench.optimize import best_dense_tree, expected_length, optimal_tree, optimal_tree_from, value_and_limits
from workbench.tree import MEDUSA_TOPK, RankPath, Tree, load_tree

SUFFIXES = {"medusa": ".py", "json": ".json", "trtllm": ".trtllm.txt", "vllm": ".vllm.json",  # file name ends
            "eagle": ".eagle.py"}
FORMATS = tuple(SUFFIXES)
SAFE_ENGINES = ("trtllm", "vllm")  # formats with an engine-safe repair (medusa / eagle: --max-rank 10 is enough)
TRTLLM_MAX_DRAFT_LEN = 63
DEFAULT_CHOICES = "mc_sim_7b_63"  # the tree both Medusa and EAGLE-1 use unless told otherwise
TARGETS = {  # what each export is written for: the header line of each export, and the README's Formats section
    "medusa": "FasterDecoding/Medusa as released (pip medusa-llm 0.1, 2023-09) and its main branch: "
              "medusa/model/medusa_choices.py, generate_medusa_buffers with TOPK=10",
    "trtllm": "TensorRT-LLM releases with the TensorRT backend (through the 1.2 series at least; deprecated by "
              "NVIDIA/TensorRT-LLM PR #11723, removed by #15763/#15767/#15907/#15918, June-July 2026), its Medusa "
              "flow: examples/run.py --medusa_choices or "
              "MedusaDecodingConfig; its Python runtime, runtime/medusa_utils.py, needs a first level of ranks 0..k-1",
    "vllm": "vLLM with tree attention: speculative_token_tree from vllm-project/vllm PR #20401 (merged July "
            "2025, v0.10 series) until PR #42121 removed tree attention (May 2026)",
    "eagle": "EAGLE-1 (SafeAILab/EAGLE before EAGLE-2; pip eagle-llm 1.x, last 1.2.1 of 2024-04): "
             "eagle/model/choices.py",
}
VLLM_VERSIONS = ("speculative_token_tree is accepted only by the vLLM releases with tree attention (added by PR "
                 "#20401, July 2025, v0.10 series; removed by PR #42121, May 2026): later vLLM rejects the key")


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
    --engine-safe): trtllm, first level ranks 0..k-1 (exact over k); vllm, the best dense tree.
    `value` is acc[K, R] or a path value function."""
    _check_safe_engine(engine)
    if engine == "vllm":
        return best_dense_tree(value, budget, max_depth, max_rank)
    return optimal_tree(value, budget, max_depth, max_rank, contiguous_first_level=True)


def engine_safe(tree: Tree, engine: str, value=None, max_nodes: int | None = None,
                heads: int | None = None) -> tuple[Tree, str]:
    """(a tree the engine builds exactly as written, one line saying what changed and at what cost).

    trtllm: the most valuable tree made of the tree's own nodes plus promoted first-level ranks whose first
    level is exactly ranks 0..k-1, with at most as many nodes (and at most `max_nodes`, the engine's
    max_draft_len; trtllm only): promoting the missing ranks, or dropping the outlying first-level branch, whichever costs
    less expected acceptance length. Exact (optimal_tree_from(..., contiguous_first_level=True)).
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
    if engine == "trtllm":
        budget = min(tree.nodes, max_nodes or tree.nodes)
        if not first_level_gaps(tree) and tree.nodes <= budget:
            return tree, "engine-safe: already builds as written in TensorRT-LLM (first level ranks 0..k-1)"
        k = max(p[0] for p in tree.paths) + 1
        own, base = set(tree.paths), fn or _stand_in

        def masked(p: RankPath) -> float:  # 0 off the tree, but for promotable first-level ranks: repair, not redesign
            return base(p) if p in own or (len(p) == 1 and p[0] < k) else 0.0

        safe = optimal_tree_from(masked, budget, tree.depth, max(k, tree.max_rank + 1), name=tree.name,
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
              f"dropped {_short(gone)}; ")
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

PLAN_FORMATS = ("vllm", "vllm-tree", "trtllm", "trtllm-current", "medusa", "eagle", "json")  # export PLAN --format
VLLM_SCHEDULE = ("vLLM with Dynamic SD (vllm-project/vllm PR #32374, reported first released in v0.25.1): "
                 "--speculative-config num_speculative_tokens_per_batch_size, a list of [low, high, K] with inclusive "
                 "batch-size ranges, checked by vllm/v1/spec_decode/dynamic/utils.py "
                 "validate_and_normalize_dynamic_sd_schedule (K >= 0, the first range starting at 1); Medusa heads "
                 "draft a top-1 chain there (vllm/v1/spec_decode/medusa.py)")
VLLM_MEDUSA_FIXED_K = ("vLLM's Medusa proposer asserts that the scheduled K equals num_speculative_tokens "
                       "(vllm/v1/spec_decode/medusa.py propose()): at batch sizes whose K is below {k} it fails with "
                       "an AssertionError (vllm-project/vllm PR #46399, open, would switch Dynamic SD off for Medusa "
                       "instead); until that changes, serve Medusa with one K: export with --batch-size B")
TRTLLM_CURRENT = ("current TensorRT-LLM does not serve Medusa heads: medusa_choices lived only in the TensorRT-engine "
                  "flow, which was removed (NVIDIA/TensorRT-LLM PRs #15763, #15767, #15907, #15918, June-July 2026), "
                  "and the PyTorch backend refuses Medusa (llmapi/llm_args.py: MedusaDecodingConfig.supports_backend "
                  "is false for pytorch); its static eagle_choices went too (PR #18210). Use --format trtllm for a "
                  "release that still has the TensorRT backend, or EAGLE-3/MTP with draft_len_schedule on a current "
                  "one")


def _plan_rows(plan: dict) -> list[dict]:
    return plan["plans"]


def _row_at(plan: dict, batch_size: int) -> tuple[dict, list[str]]:
    """The plan row serving `batch_size`: the largest planned batch size <= it (below the first, the first)."""
    rows = _plan_rows(plan)
    if batch_size < 1:
        raise WorkbenchError(f"--batch-size {batch_size}: must be >= 1")
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
    # deferred (here and in _vllm_model): these load transformers, which the `workbench tree` commands never need
    from workbench.heads import load_heads
    from workbench.measure_ranks import heads_fingerprint

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


def _vllm_model(plan: dict, heads_dir) -> dict:
    """method/model keys: the heads folder given, else the calibration's own heads (the demo heads' folder for
    "demo"); none for an acceptance-vector plan (its drafter is not known here)."""
    from workbench.heads import DEMO_HEADS

    src = plan.get("source") or {}
    if src.get("kind") == "acceptance" and heads_dir is None:
        return {}
    model = str(heads_dir) if heads_dir else (str(DEMO_HEADS) if src.get("heads") == "demo" else src.get("heads"))
    return {"method": "medusa", "model": model} if model else {}


def export_plan(plan: dict, fmt: str, heads_dir=None, synthetic: bool = False, batch_size: int | None = None,
                name: str | None = None, max_draft_len: int = TRTLLM_MAX_DRAFT_LEN) -> tuple[str, list[str], list[str]]:
    """(text, warnings, notes) of a plan (plan.read_plan) for one engine. vllm: the --speculative-config JSON
    with a per-batch-size schedule (or, with batch_size, one K); --synthetic adds vLLM's synthetic rejection
    sampling at the plan's top-1 chain acceptance. The static formats (vllm-tree, trtllm, medusa, eagle, json)
    write the tree of one row (batch_size, default 1) as export_tree does. trtllm-current is an error."""
    if fmt not in PLAN_FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r} for a plan; choose one of {', '.join(PLAN_FORMATS)}")
    if fmt == "trtllm-current":
        raise WorkbenchError(TRTLLM_CURRENT)
    if synthetic and fmt != "vllm":
        raise WorkbenchError("--synthetic is vLLM's synthetic rejection sampling: only with --format vllm")
    warns, notes = [], []
    num_heads = None
    if heads_dir is not None:
        num_heads, warns = check_plan_heads(plan, heads_dir)
    if fmt != "vllm":
        row, why = _row_at(plan, batch_size or 1)
        notes += why
        if row["kind"] == "none":
            raise WorkbenchError(f"the plan says no speculation at batch size {row['batch_size']}: there is no tree to "
                                 f"export for {fmt} (serve without speculation, or export another --batch-size)")
        others = [f"{r['kind']}" + (f" of {r['nodes']} nodes" if r["kind"] != "none" else "") + f" at {r['batch_size']}"
                  for r in _plan_rows(plan) if r["medusa_choices"] != row["medusa_choices"]]
        notes.append(f"the batch-size {row['batch_size']} row ({row['kind']}, {row['nodes']} nodes, predicted "
                     f"{row['predicted_speedup']:.3f}x); a static tree serves every batch size alike"
                     + (f", where the plan picks: {', '.join(others)}" if others else ""))
        tree = Tree(row["tree"].paths, name or f"plan_b{row['batch_size']}")
        text, more = export_tree(tree, "vllm" if fmt == "vllm-tree" else fmt, name=name, heads=num_heads,
                                 max_draft_len=max_draft_len, strict=True)
        return text, warns + more, notes
    notes.append(f"targets {VLLM_SCHEDULE}")
    cfg = _vllm_model(plan, heads_dir)
    if not cfg:
        notes.append("no Medusa heads known for this plan: add your drafter's \"method\" and \"model\" to the config")
    if batch_size is not None:
        row, why = _row_at(plan, batch_size)
        notes += why
        k = _chain_k(plan, row, notes)
        if k == 0:
            raise WorkbenchError(f"the plan says no speculation at batch size {row['batch_size']}: serve without "
                                 "--speculative-config there")
        cfg["num_speculative_tokens"] = k
    else:
        schedule = vllm_schedule(plan, notes)
        k = max(r[2] for r in schedule)
        if k == 0:
            raise WorkbenchError("the plan never speculates at any batch size: serve without --speculative-config")
        cfg["num_speculative_tokens"] = k
        cfg["num_speculative_tokens_per_batch_size"] = schedule
        if cfg.get("method") == "medusa" and min(r[2] for r in schedule) < k:
            warns.append(VLLM_MEDUSA_FIXED_K.format(k=k))
    if num_heads is not None and k > num_heads:
        raise WorkbenchError(f"--heads {heads_dir}: {num_heads} heads cannot draft K={k} tokens")
    if synthetic:
        rates = plan.get("chain_acceptance") or []
        if len(rates) < k:
            raise WorkbenchError(f"the plan's chain_acceptance has {len(rates)} positions, fewer than K={k}")
        cfg["rejection_sample_method"] = "synthetic"
        cfg["synthetic_acceptance_rates"] = rates[:k]
        warns.append("synthetic rejection sampling accepts drafts at these rates whatever the tokens are: for timing "
                     "the cost side only, never for serving (vLLM PRs #38045, #40662)")
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
