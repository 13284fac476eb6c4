"""`workbench calibrate`: measure how often each head's rank-i guess is right on the model's own greedy answers.

Alignment (what the live greedy Medusa decoder sees). Prompt p (P tokens), greedy continuation c[0..N-1].
Position t (0 <= t < N) is the decoder state whose last committed token is the one just before c[t]: the base
logits there give the root token c[t]; head k (1-based) on the same hidden state guesses c[t+k]. ranks[t, k] is
the 0-based rank of c[t+k] in head k's top-k, -1 if absent, null when t+k >= N (past the end of the answer).
A tree node [i1..id] is accepted at t iff ranks[t, j] == i_j for j = 1..d, so with path probabilities
P(path) = share of positions where it is accepted, mean tokens per step over positions = 1 + sum P(node).
(A live decoder visits only the positions after each accepted prefix; averaging over all is the paper's method.)

Speed: continuations come from batched HF `generate` (left padding, greedy); the last hidden state of every
step is captured from those same forwards (a hook on the decoder), and the heads then run once over all
positions in big chunks instead of a heads pass per step. This equals a teacher-forced forward over prompt +
continuation (`generation.teacher_forced_hidden`, tested to give the same ranks) without paying for that second pass.
Reliability: one part file per prompt batch in `parts/`, written atomically; a rerun with the same arguments
skips finished batches, then merges. Data-parallel (`accelerate launch --num_processes N -m workbench.cli
calibrate`, parallel.py): each process computes a contiguous share of the same batches and the last to finish
merges, so the folder equals a one-process run's (a batch is the unit: its padding, and so its numbers, do not
depend on who computes it); a relaunch with any N, or a plain rerun, computes only the missing batches.
The heads' top-k log-probs come from the same logits as the ranks (calibrate/topk.py's one pass): every batch's
part holds them, the merge keeps the held-out prompts' (the replay of per-step trees reads only those).
Outputs: ranks.parquet, continuations.parquet, topk.parquet, accuracies.csv, meta.json,
trees/NAME-{indep,joint}-B.json.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench import WorkbenchError, warn
from workbench.core.notes import FieldError
from workbench.calibrate.finish import finish, holdout_split, own_trees
from workbench.calibrate.folder import (ACCURACIES, CONTINUATIONS, MAX_TOPK, META, META_VERSION, RANKS, TOPK,
                                        Calibration, calibration_root, slug)
from workbench.calibrate.ranks import ranks_frame
from workbench.calibrate.topk import head_pass, topk_frame
from workbench.core.data import load_prompt_records, prompts_fingerprint
from workbench.core.io import atomic_write, atomic_write_json, gate, read_json, run_lock
from workbench.core.provenance import dtype_name
from workbench.runtime.generation import context_length, eos_ids, greedy_continuations, prepare_prompt
from workbench.runtime.heads import heads_fingerprint
from workbench.runtime.kvcache import undecodable_warning
from workbench.runtime.models import load_model_and_heads, model_label
from workbench.runtime.parallel import Shard, current_launch
from workbench.trees.tree import MEDUSA_TOPK


# ----------------------------------------------------------------------------------------------- files

def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))


def default_name(model: str | None, prompts: str) -> str:
    return f"{slug(model_label(model), True)}-{slug(prompts, True)}"


# ----------------------------------------------------------------------------------------------- the run

@dataclass(frozen=True)
class CalibrateConfig:
    """What `workbench calibrate` runs: one field per CLI flag, so the CLI, tests and scripts say it by keyword."""

    model: str | None = None            # HF id or folder (default: the demo model)
    heads: str | None = None            # heads folder/file (default: the demo heads)
    prompts: str = "alpaca-eval"        # a prompt set name or file
    limit: int | None = None            # first N prompts
    holdout: float = 0.2                # share of prompts held out of tree fitting
    max_new_tokens: int = 128           # greedy answer length per prompt
    topk: int = MEDUSA_TOPK             # ranks recorded per head
    budgets: tuple = (16, 32, 64)       # tree sizes exported under trees/
    name: str | None = None             # calibration/NAME (default: model + prompt set)
    out: str | Path | None = None       # instead of calibration/NAME
    device: str | None = None
    dtype: str | None = None
    device_map: str | None = None       # "auto": one model across the visible devices (accelerate big-model loading)
    batch_size: int = 32
    force: bool = False                 # start over when the folder holds a run with other arguments
    continuations: str | Path | None = None  # reuse a finished calibration's greedy answers (new heads, same base)
    trees_dir: str | Path | None = None      # default trees/ (or OUT/trees with --out)

    def __post_init__(self):
        """Every setting checked before any model loads: one line naming the flag."""
        if self.max_new_tokens < 1:
            raise FieldError("max_new_tokens", "below_one", f"{{field}} {self.max_new_tokens}: must be at least 1")
        if not 1 <= self.topk <= MAX_TOPK:
            raise FieldError("topk", "range", f"{{field}} {self.topk}: must be in 1..{MAX_TOPK} (a calibration "
                             "stores 16-bit ranks)")
        if self.batch_size < 1:
            raise FieldError("gen_batch", "below_one", f"{{field}} {self.batch_size}: must be at least 1")
        budgets = sorted({int(b) for b in self.budgets})
        if not budgets or budgets[0] < 1:
            raise FieldError("budgets", "not_positive", f"{{field}} {budgets}: give positive node counts, e.g. "
                             "16,32,64")
        object.__setattr__(self, "budgets", tuple(budgets))  # (frozen: set once, normalised)
        holdout_split([], self.holdout)  # the share


def calibrate(cfg: CalibrateConfig, *, on_batch=None, progress: bool = True) -> dict:
    """Run (or resume) a calibration and write its folder; returns meta.json's content plus `folder`.

    Under a launch of N processes (parallel.py) each process computes its contiguous share of the batches; the
    last one to finish merges and returns the meta, the others return {"folder", "merged": False, "rank",
    "num_processes", "batches" (its share), "computed" (those not on disk yet)}; the merging one adds those keys
    to the meta, with merged True. The batches, and so every number, are those of a one-process run.
    `on_batch(i)` is called after batch i is safely on disk (tests use it to simulate a kill).
    `cfg.continuations`: a finished calibration folder of the same model, prompts and token limit whose greedy
    answers are reused (new heads on a fixed base: only one teacher-forced forward per batch, no generation).
    """
    records = load_prompt_records(cfg.prompts, cfg.limit)
    name = cfg.name or default_name(cfg.model, cfg.prompts)
    folder = Path(cfg.out) if cfg.out else calibration_root() / name
    launch = current_launch()
    batches = -(-len(records) // cfg.batch_size)
    if launch.world > batches:
        raise FieldError("gen_batch", "idle_process", f"{launch.world} processes for {len(records)} prompts in "
                         f"{batches} batch(es) of {{field}} {cfg.batch_size}: every process needs a batch; launch at "
                         f"most {batches} (--num_processes) or lower {{field}}")
    base, tok, hd = load_model_and_heads(cfg.model, cfg.heads, launch.device(cfg.device, cfg.device_map), cfg.dtype,
                                         device_map=cfg.device_map)
    if cfg.topk > hd.vocab_size:
        raise FieldError("topk", "past_vocabulary", f"{{field}} {cfg.topk}: larger than the vocabulary "
                         f"({hd.vocab_size})")
    if base.base_model is base:
        raise WorkbenchError(f"{type(base).__name__}: no inner decoder (base_model) to read hidden states from; "
                             "only decoder-only causal LMs with an lm_head are supported")
    undecodable = undecodable_warning(base, "the accuracies and trees are measured correctly")
    if undecodable and launch.rank == 0:  # the ranks are right (greedy generate + hidden states); decoding is not
        warn(undecodable.removeprefix("warning: "))
    def where(spec):  # local paths absolute, so a rerun from elsewhere (or a later reader of meta) finds them
        return str(Path(spec).resolve()) if spec and Path(spec).exists() else spec

    args = dict(model=model_label(where(cfg.model)), heads=where(cfg.heads) or "demo", prompts=where(cfg.prompts),
                limit=cfg.limit, prompts_sha256=prompts_fingerprint(records),
                max_new_tokens=cfg.max_new_tokens, topk=cfg.topk, batch_size=cfg.batch_size,
                device=str(base.device.type),
                dtype=dtype_name(base.dtype), num_heads=hd.num_heads, heads_sha256=heads_fingerprint(hd))
    if not getattr(tok, "chat_template", None):
        raise WorkbenchError("the tokenizer has no chat template: calibrate on an instruction-tuned model whose "
                             "tokenizer defines one (heads are calibrated on what the model sees when serving)")
    encoded = [prepare_prompt(tok, text) for _, text in records]  # the live decoder's exact prompt tokens
    context = context_length(base)
    for (pid, _), ids in zip(records, encoded):
        if context and len(ids) + cfg.max_new_tokens > context:
            raise FieldError("max_new_tokens", "past_context", f"prompt {pid}: {len(ids)} tokens + {{field}} "
                             f"{cfg.max_new_tokens} exceed the model's context of {context} (lower {{field}} or "
                             "drop the prompt)")

    # reused answers are the same tokens by construction, so they are provenance, not part of the run's identity
    reuse = reused_continuations(cfg.continuations, args, [pid for pid, _ in records], hd.vocab_size) \
        if cfg.continuations is not None else None
    field = "out" if cfg.out else "name"  # the request field that named the folder (its errors name it)
    # another run on this folder refuses (no mixed parts); the processes of this launch share it
    with run_lock(folder, field, launch=launch):
        with gate(folder):  # the launch's processes check (and with --force clear) the folder one at a time
            done = _prepare_folder(folder, name, args, cfg.force)
        share = launch.share(batches) if not done else range(0)
        mine = dict(folder=str(folder), rank=launch.rank, num_processes=launch.world, batches=len(share), computed=0)
        if done and launch.rank:
            return dict(mine, merged=False)
        if not done:
            with Shard(folder / "parts", launch, folder, field) as shard:
                mine["computed"] = _run_batches(folder, base, tok, hd, records, encoded, args, share, on_batch,
                                                progress and launch.rank == 0, reuse)
                last = shard.finish()
            if not last:
                return dict(mine, merged=False)
            _merge(folder, records, args, launch.world,
                   str(Path(cfg.continuations).resolve()) if reuse is not None else None,
                   holdout_split([pid for pid, _ in records], cfg.holdout))
        trees = Path(cfg.trees_dir) if cfg.trees_dir else (folder / "trees" if cfg.out else Path("trees"))
        meta = finish(folder, name, args, records, cfg.holdout, cfg.budgets, trees)
        return dict(meta, **mine, merged=True) if launch.world > 1 else meta


def reused_continuations(source: str | Path, args: dict, prompt_ids: list[str], vocab: int) -> dict[str, list[int]]:
    """prompt_id -> greedy answer from another calibration, after checking it answered the same question (and
    holds an answer of in-vocabulary tokens for every prompt)."""
    if not (Path(source) / CONTINUATIONS).is_file():
        raise FieldError("continuations", "not_finished", f"{{field}} {source}: not a finished calibration folder "
                         "(needs meta.json and continuations.parquet)")
    src = Calibration(source, "continuations")
    theirs = src.meta.get("args")
    if not isinstance(theirs, dict):
        raise FieldError("continuations", "no_args", f"{{field}} {source}: meta.json has no recorded args (not a "
                         "calibration folder)")
    for key in ("model", "prompts_sha256", "max_new_tokens", "dtype", "device"):
        if theirs.get(key) != args.get(key):
            raise FieldError("continuations", "other_run", f"{{field}} {source}: recorded {key} "
                             f"{theirs.get(key)!r} differs from this run's {args.get(key)!r}; the answers must come "
                             "from the same model and prompts")
    answers = src.continuations()
    for pid in prompt_ids:
        if pid not in answers or not all(0 <= t < vocab for t in answers[pid]):
            raise FieldError("continuations", "damaged", f"{{field}} {source}: continuations.parquet has no answer "
                             f"of token ids in [0, {vocab}) for prompt {pid!r} (a damaged or foreign file)")
    return answers


def _prepare_folder(folder: Path, name: str, args: dict, force: bool) -> bool:
    """Check the folder's recorded arguments; returns True when the ranks are already complete."""
    recorded = None
    for f in (folder / META, folder / "parts" / "args.json"):
        if f.is_file():
            try:
                recorded = read_json(f, str(folder)).get("args")
            except WorkbenchError:
                recorded = {"unreadable": str(f)}
            break
    foreign = recorded is None and any((folder / "parts").glob("*.parquet"))
    if foreign and not force:
        raise FieldError("force", "foreign_parts", f"{folder}/parts holds part files but no args.json: they are not "
                         "this run's; remove that folder, use another {also}/{also2}, or {field} to start over",
                         also=("name", "out"))
    if foreign or (recorded is not None and recorded != args):
        if not force:
            diff = [k for k in sorted(set(args) | set(recorded)) if args.get(k) != recorded.get(k)]
            shown = ", ".join(f"{k}: {recorded.get(k)!r} -> {args.get(k)!r}" for k in diff[:3])
            raise FieldError("force", "other_arguments", f"{folder} holds a calibration with other arguments "
                             f"({shown}); use another {{also}}/{{also2}}, the same arguments to resume, or {{field}} "
                             "to start over", also=("name", "out"))
        for f in (RANKS, CONTINUATIONS, TOPK, ACCURACIES, META):
            (folder / f).unlink(missing_ok=True)
        shutil.rmtree(folder / "parts", ignore_errors=True)
        for f in own_trees(folder / "trees", name):
            f.unlink()
        recorded = None
    complete = recorded is not None and (folder / META).is_file() and (folder / RANKS).is_file()
    if not complete:
        atomic_write_json(folder / "parts" / "args.json", {"args": args})
    return complete


def _part(parts: Path, i: int, kind: str) -> Path:
    """Batch i's part file: kind 'ranks' (written last: the batch is done), 'prompts' or 'topk'."""
    return parts / f"{i:05d}.{kind}.parquet"


def _batches(n: int, size: int) -> list[range]:
    return [range(s, min(s + size, n)) for s in range(0, n, size)]


def _check_part(parts: Path, i: int, pids: list[str]) -> None:
    """A finished part must hold exactly batch i's prompts: parts copied from another run (other prompts, another
    --gen-batch) would otherwise be merged in silently."""
    try:
        got = pd.read_parquet(_part(parts, i, "prompts"), columns=["prompt_id"])["prompt_id"].tolist()
    except Exception as e:  # a damaged or missing file
        raise FieldError("force", "unreadable", f"{_part(parts, i, 'prompts')}: not readable ({type(e).__name__}); "
                         "rerun with {field} to start over") from None
    if got != pids:
        raise FieldError("force", "other_run", f"{_part(parts, i, 'prompts')}: holds prompts {got[:3]}..., not "
                         f"batch {i} of this run ({pids[:3]}...): the parts are from another run; use {{field}} to "
                         "start over")


def _run_batches(folder, base, tok, hd, records, encoded, args, share: range, on_batch, progress,
                 reuse=None) -> int:
    """Compute the batches of `share` (indices into the run's batches) that have no part file yet; returns how
    many that was."""
    from tqdm.auto import tqdm

    parts = folder / "parts"
    batches = _batches(len(records), args["batch_size"])
    todo = []
    for i in share:
        if _part(parts, i, "ranks").is_file():
            _check_part(parts, i, [records[j][0] for j in batches[i]])
        else:
            todo.append(i)
    stop_ids = sorted(eos_ids(base, tok))  # the live decoder's stop tokens
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (stop_ids[0] if stop_ids else 0)
    mine = sum(len(batches[i]) for i in share)
    bar = tqdm(total=mine, initial=mine - sum(len(batches[i]) for i in todo), unit="prompt",
               desc="calibrate", disable=not progress, dynamic_ncols=True)
    for i in todo:
        t0 = time.perf_counter()
        idx = batches[i]
        prompts = [encoded[j] for j in idx]
        if reuse is None:
            conts, hidden = greedy_continuations(base, prompts, args["max_new_tokens"], stop_ids, pad_id,
                                                 return_hidden=True)
        else:
            conts, hidden = [reuse[records[j][0]] for j in idx], None  # teacher-forced hidden states
        got = head_pass(base, hd, prompts, conts, args["topk"], hidden=hidden, logprobs=True)
        pids = [records[j][0] for j in idx]
        secs = time.perf_counter() - t0
        info = pd.DataFrame({"prompt_id": pd.array(pids, dtype="string"),
                             "prompt_tokens": [len(p) for p in prompts],
                             "continuation": [list(c) for c in conts],
                             "stopped": ["eos" if c and c[-1] in stop_ids else "length" for c in conts],
                             "seconds": [secs / len(idx)] * len(idx)})
        _write_parquet(info, _part(parts, i, "prompts"))
        _write_parquet(topk_frame(pids, [len(c) for c in conts], got.logp, got.ids), _part(parts, i, "topk"))
        _write_parquet(ranks_frame(pids, got.ranks, hd.num_heads), _part(parts, i, "ranks"))  # = batch done
        bar.update(len(idx))
        if on_batch is not None:
            on_batch(i)
    bar.close()
    return len(todo)


def _merge(folder: Path, records, args: dict, num_processes: int, continuations_from: str | None,
           held: set[str]) -> None:
    """Every batch's parts -> ranks.parquet, continuations.parquet and the `held` prompts' topk.parquet in prompt
    order, then meta.json (which marks the ranks complete), then the parts go. Whichever processes computed them,
    the files are a one-process run's. Parts written before the top-k was recorded with the ranks (a run resumed
    across versions) leave topk.parquet to `calibrate --record-topk`."""
    parts = folder / "parts"
    batches = _batches(len(records), args["batch_size"])
    missing = [i for i in range(len(batches)) if not _part(parts, i, "ranks").is_file()]
    if missing:  # every process reported its share done: someone removed parts meanwhile
        raise WorkbenchError(f"{parts}: batch(es) {missing[:5]} have no part file; run the same command again to "
                             "compute them")
    for i, idx in enumerate(batches):
        _check_part(parts, i, [records[j][0] for j in idx])
    ranks = pd.concat([pd.read_parquet(_part(parts, i, "ranks")) for i in range(len(batches))], ignore_index=True)
    info = pd.concat([pd.read_parquet(_part(parts, i, "prompts")) for i in range(len(batches))], ignore_index=True)
    seconds = float(info.pop("seconds").sum())
    _write_parquet(info, folder / CONTINUATIONS)
    _write_parquet(ranks, folder / RANKS)
    if held and all(_part(parts, i, "topk").is_file() for i in range(len(batches))):
        topk = [pd.read_parquet(_part(parts, i, "topk")) for i in range(len(batches))]
        topk = pd.concat([t[t["prompt_id"].isin(held)] for t in topk], ignore_index=True)
        _write_parquet(topk, folder / TOPK)
    atomic_write_json(folder / "parts" / "args.json", {"args": args, "compute_seconds": seconds})
    meta = dict(version=META_VERSION, args=args, compute_seconds=seconds, num_processes=num_processes,
                **({"continuations_from": continuations_from} if continuations_from else {}))
    atomic_write_json(folder / META, meta)  # marks the ranks complete; finish.py fills in the rest
    shutil.rmtree(parts, ignore_errors=True)
