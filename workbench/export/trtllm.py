"""TensorRT-LLM's Medusa flow: the `--medusa_choices="[[0], ...]"` argument of examples/run.py (the same list for
MedusaDecodingConfig(medusa_choices=...)). The engine takes at most max_draft_len draft tokens (63 in its examples)
and no more depth than its Medusa heads. Its Python runtime (runtime/medusa_utils.py, used by ModelRunner) gives the
first level one tree id per rank 0..max rank and indexes deeper nodes by the number of first-level nodes written,
so only a first level of exactly ranks 0..k-1 builds as written. Its C++ runtime (medusaModule.cpp) keys each path
4 bits per rank: ranks < 16, at most 8 levels (TRTLLM_CPP_*); `repair` drops the nodes beyond them."""
from __future__ import annotations

import json

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.export.common import Warn, header, py_list
from workbench.trees.optimize import optimal_tree, optimal_tree_from
from workbench.trees.tree import RankPath, Tree

SUFFIX = ".trtllm.txt"
TARGET = ("TensorRT-LLM releases with the TensorRT backend (through the 1.2 series at least; deprecated by "
          "NVIDIA/TensorRT-LLM PR #11723, removed by #15763/#15767/#15907/#15918, June-July 2026), its Medusa "
          "flow: examples/run.py --medusa_choices or "
          "MedusaDecodingConfig; its Python runtime, runtime/medusa_utils.py, needs a first level of ranks 0..k-1")
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


def trtllm_cpp_breaks(path: RankPath) -> bool:
    """True when TensorRT-LLM's C++ runtime cannot key `path` reliably (see TRTLLM_CPP_MAX_DEPTH): a rank >= 16 or
    more than 8 levels. A node's descendants break it too, so dropping these keeps a tree prefix-closed."""
    return len(path) > TRTLLM_CPP_MAX_DEPTH or max(path) >= TRTLLM_CPP_RANK_LIMIT


def cpp_warnings(tree: Tree) -> list[Warn]:
    """Where TensorRT-LLM's C++ runtime (the executor / Triton backend) reads the tree otherwise than its Python
    runtime (runtime/medusa_utils.py, which takes it): computePrefix keys (TRTLLM_CPP_MAX_DEPTH's comment)."""
    warns = []
    if tree.max_rank >= TRTLLM_CPP_RANK_LIMIT:
        bad = next(p for p in tree.paths if max(p) >= TRTLLM_CPP_RANK_LIMIT)
        warns.append(Warn("trtllm_cpp_rank", f"path {list(bad)} has rank {max(bad)}: TensorRT-LLM's C++ runtime packs "
                          f"each rank in 4 bits and takes ranks < {TRTLLM_CPP_RANK_LIMIT} only (its Python runtime "
                          "takes more); {fix}", "trtllm_rank"))
    if tree.depth > TRTLLM_CPP_MAX_DEPTH:
        warns.append(Warn("trtllm_cpp_depth", f"tree depth {tree.depth}: TensorRT-LLM's C++ runtime keys a path by "
                          f"shifting each rank, a 32-bit int, 4 bits per level below it, so from "
                          f"{TRTLLM_CPP_MAX_DEPTH + 1} levels on distinct paths can share a key (undefined in C++; "
                          f"past 16 levels it throws): at most {TRTLLM_CPP_MAX_DEPTH} levels (its Python runtime takes "
                          "more); {fix}", "trtllm_depth"))
    return warns


def first_level_gaps(tree: Tree) -> list[int]:
    """First-level ranks below the largest one that the tree lacks: TensorRT-LLM's Python runtime assumes none."""
    first = {p[0] for p in tree.paths if len(p) == 1}
    return [r for r in range(max(first) + 1) if r not in first]


def write_tree(tree: Tree, name: str, heads: int | None = None, max_draft_len: int = TRTLLM_MAX_DRAFT_LEN,
               **_) -> tuple[str, list[Warn]]:
    warns = []
    gaps = first_level_gaps(tree)
    if gaps:
        warns.append(Warn("trtllm_first_level", f"first level lacks rank(s) {', '.join(map(str, gaps))}: TensorRT-LLM's "
                          f"Python runtime gives the first level ranks 0..{max(p[0] for p in tree.paths)} and would "
                          "build other tree ids than written; {fix}", "engine_safe"))
    if tree.nodes > max_draft_len:
        warns.append(Warn("trtllm_draft_len", f"tree has {tree.nodes} nodes but a TensorRT-LLM Medusa engine takes at "
                          f"most max_draft_len={max_draft_len} draft tokens: rebuild the engine with max_draft_len >= "
                          f"{tree.nodes} {{fix}}", "budget"))
    warns += cpp_warnings(tree)
    if heads is None:
        warns.append(Warn("trtllm_heads_unchecked", f"TensorRT-LLM needs num_medusa_heads >= tree depth {tree.depth} "
                          "({fix})", "num_heads"))
    return header(TARGET, f"TensorRT-LLM, tree {name}") + f'--medusa_choices="{py_list(tree)}"\n', warns


def best(fn, budget: int, max_depth: int, max_rank: int) -> Tree:
    """The most valuable tree TensorRT-LLM builds as written: first level ranks 0..k-1 (exact over k), within the
    C++ runtime's ranks < 16 and 8 levels."""
    return optimal_tree(fn, budget, min(max_depth, TRTLLM_CPP_MAX_DEPTH), min(max_rank, TRTLLM_CPP_RANK_LIMIT),
                        contiguous_first_level=True)


def repair(tree: Tree, fn, max_nodes: int | None = None) -> tuple[Tree | None, str]:
    """(the most valuable tree made of the tree's own nodes that the C++ runtime keys, plus promoted first-level
    ranks, whose first level is exactly ranks 0..k-1, with at most as many nodes and at most `max_nodes` (the
    engine's max_draft_len), and what was cut for the C++ runtime; or None and why, when the tree already builds
    as written). Promoting the missing ranks or dropping the outlying first-level branch, whichever costs less
    expected acceptance length: exact (optimal_tree_from(..., contiguous_first_level=True)). `fn` values a path."""
    budget = min(tree.nodes, max_nodes or tree.nodes)
    cut = [p for p in tree.paths if trtllm_cpp_breaks(p)]
    if not first_level_gaps(tree) and tree.nodes <= budget and not cut:
        return None, ("engine-safe: already builds as written in TensorRT-LLM (first level ranks 0..k-1, ranks "
                          f"< {TRTLLM_CPP_RANK_LIMIT}, at most {TRTLLM_CPP_MAX_DEPTH} levels)")
    own = set(tree.paths) - set(cut)
    k = max((p[0] for p in own), default=0) + 1  # first-level ranks up to the largest kept one may be promoted

    def masked(p: RankPath) -> float:  # 0 off the tree, but for promotable first-level ranks: repair, not redesign
        return fn(p) if p in own or (len(p) == 1 and p[0] < k) else 0.0

    safe = optimal_tree_from(masked, budget, min(tree.depth, TRTLLM_CPP_MAX_DEPTH),
                             min(max(k, tree.max_rank + 1), TRTLLM_CPP_RANK_LIMIT), name=tree.name,
                             contiguous_first_level=True)
    note = (f" ({len(cut)} of them past TensorRT-LLM's C++ runtime limits: ranks < {TRTLLM_CPP_RANK_LIMIT}, at most "
            f"{TRTLLM_CPP_MAX_DEPTH} levels)" if cut else "")
    return safe, note


# ----------------------------------------------------------------------------------------------- plans

# TensorRT-LLM's PyTorch backend: speculative_config.draft_len_schedule (NVIDIA/TensorRT-LLM PR #10860, merged
# 2026-03-13; the first release holding it is not confirmed here), {batch-size threshold: draft length}: each key
# the largest batch size of its range, batch sizes above the largest key draft nothing. Checked as
# DecodingBaseConfig.validate_draft_len_schedule_and_sort (tensorrt_llm/llmapi/llm_args.py) does.
TRTLLM_SCHEDULE = ("TensorRT-LLM (PyTorch backend) speculative_config.draft_len_schedule, PR #10860: {largest batch "
                   "size of a range: draft length}, nothing drafted above the largest key")
# decoding_type as the releases holding draft_len_schedule spell it (llm_args.py: DraftTargetDecodingConfig's Literal
# "Draft_Target"; "DraftTarget" was the name before its pydantic literal); a draft model's and EAGLE-3's config
# refuses to start without speculative_model (the drafter's weights)
TRTLLM_DECODING_TYPES = {"ngram": "NGram", "draft_model": "Draft_Target", "eagle3": "Eagle3", "mtp": "MTP"}
TRTLLM_NEEDS_MODEL = ("draft_model", "eagle3")


def check_draft_len_schedule(schedule: dict[int, int], max_draft_len: int) -> dict[int, int]:
    """TensorRT-LLM's own rules, one error line each: thresholds >= 1, lengths >= 0, the smallest threshold's
    length equal to max_draft_len, none above it; the schedule sorted by threshold."""
    for b, k in schedule.items():
        if b < 1 or k < 0:
            raise WorkbenchError(f"draft_len_schedule: batch size threshold must be >= 1 and draft length >= 0, "
                                 f"got {b}: {k}")
    first = min(schedule)
    if schedule[first] != max_draft_len or any(k > max_draft_len for k in schedule.values()):
        raise FieldError("batch_sizes", "trtllm_schedule", f"TensorRT-LLM takes no such draft_len_schedule: its "
                         f"smallest batch size ({first}) must draft max_draft_len, the longest ({max_draft_len}), but "
                         f"the plan drafts {schedule[first]} there; export the vllm schedule, or one K with "
                         "{field} B")
    return dict(sorted(schedule.items()))


def write_schedule(ranges: list[list[int]], method: str | None, model: str | None = None
                   ) -> tuple[str, list[Warn], list[str]]:
    """(a `speculative_config` fragment, warnings, notes) of a plan's [[low, high, K], ...] ranges; `model`: the
    drafter's weights (speculative_model) where it has them."""
    kmax = max(k for _, _, k in ranges)
    schedule = check_draft_len_schedule({hi: k for _, hi, k in ranges}, kmax)
    cfg = {"max_draft_len": kmax, "draft_len_schedule": schedule}
    warns = [Warn("trtllm_schedule_release", "draft_len_schedule is in TensorRT-LLM's PyTorch backend from PR #10860 "
                  "(merged 2026-03-13): check that your release has it, and that your drafter supports a dynamic "
                  "draft length (its spec_dec_mode.support_dynamic_draft_len())")]
    notes = [f"targets {TRTLLM_SCHEDULE}"]
    if method in TRTLLM_DECODING_TYPES:
        cfg = {"decoding_type": TRTLLM_DECODING_TYPES[method], **cfg}
        if method in TRTLLM_NEEDS_MODEL:
            if model:
                cfg["speculative_model"] = str(model)
            else:
                notes.append(f"add the drafter's weights as speculative_model: TensorRT-LLM's {method} config "
                             "needs them")
    else:
        notes.append(f"add your drafter's decoding_type ({', '.join(TRTLLM_DECODING_TYPES.values())}, ...) and its "
                     "model to the fragment")
    if ranges[-1][2]:
        notes.append(f"TensorRT-LLM drafts nothing above batch size {ranges[-1][1]} (the plan's largest): add a key "
                     "for your largest batch size if it should keep drafting there")
    return json.dumps({"speculative_config": cfg}) + "\n", warns, notes
