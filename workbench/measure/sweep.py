"""Sweep: the live decoder on every configuration (tree x temperature x epsilon) beside vanilla greedy.

Vanilla greedy runs on the same prompts in the same run, so measured tokens per step, speedup and the quality
proxies are side by side; the result is a resumable sweep CSV (its format: sweep_file.py), rewritten atomically
after every row.
"""
from __future__ import annotations

import hashlib
import json
import statistics

import pandas as pd
import torch

from tqdm.auto import tqdm

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.calibrate.folder import TOPK
from workbench.calibrate.ranks import answer_rows, decoder_walk, walk_answers
from workbench.core.data import prompts_fingerprint
from workbench.core.provenance import dtype_name, setting_cell
from workbench.core.speed import (decode_speedup, decoder_overhead, goodput, mean_step_s, measured_speedup, overhead,
                                  step_times, tokens_per_step)
from workbench.decode.divergence import divergence_counts, divergences
from workbench.decode.loop import Acceptance, medusa_generate, vanilla_generate
from workbench.measure.latency import measured_setting
from workbench.measure.sweep_file import SWEEP_VERSION, read_sweep_rows, row_cells, write_rows
from workbench.runtime.engine import StepEngine
from workbench.runtime.timing import forward_probe
from workbench.runtime.forward import logits_of
from workbench.runtime.treemask import root_setup, tree_setup
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.optimize import best_by, dense_nodes, dense_tree, optimal_tree
from workbench.trees.tree import MEDUSA_TOPK, Tree, load_tree, make_tree, tree_key


# ----------------------------------------------------------------------------------------------- sweep: trees

def dense_near(budget: int, max_depth: int, max_rank: int = MEDUSA_TOPK, slack: float = 1.5) -> list[Tree]:
    """Cartesian trees [s], [s, s], [s, s, s], ... (paper §2.1.2) whose node count is the one closest to
    `budget` for that depth, kept when within a factor `slack` of it."""
    out = []
    for d in range(1, max_depth + 1):
        s = min(range(1, max_rank + 1), key=lambda s: (abs(dense_nodes(s, d) - budget), s))
        if budget / slack <= dense_nodes(s, d) <= budget * slack:
            out.append(dense_tree([s] * d))
    return out


def request_configs(req, delta, num_heads: int, calibration=None, planned=None, envelope: Tree | None = None,
                    dense: bool = False) -> list[dict]:
    """A sweep request's configurations (measure.request.SweepRequest, resolved): a plan's trees, each at its own
    batch size (`planned`: [(tree, batch size)], greedy), or the request's trees and budgets x its temperatures and
    epsilons."""
    if planned is not None:
        configs = sweep_configs([(t, "plan") for t, _ in planned], req.temperature, req.epsilon, delta)
        for c, (_, b) in zip(configs, planned):
            c["batch_sizes"] = [b]
        return configs
    trees = sweep_trees(list(req.budgets) if req.budgets else None, list(req.trees) or None, dense, calibration,
                        req.joint, num_heads, replay=req.max_new_tokens if req.replay else None, envelope=envelope)
    return sweep_configs(trees, req.temperature, req.epsilon, delta)


def sweep_trees(budgets=None, trees=None, dense: bool = False, calibration=None, joint: bool = False,
                num_heads: int | None = None, max_rank: int = MEDUSA_TOPK,
                replay: int | None = None, envelope: Tree | None = None) -> list[tuple[Tree, str]]:
    """[(tree, kind)] with kind optimal | dense | given | dynamic, deduplicated by shape. Budgets build optimal trees from
    the calibration's fit prompts (independent heads, or empirical joint paths; with `replay` = N tokens, a dense
    tree within the budget replaces the optimum when a greedy decoder replayed over the first N tokens of the fit
    answers accepts more with it); --dense adds Cartesian trees near every budget (or the given trees' sizes).
    `calibration`: a calibration.Calibration. With an `envelope`, every tree's size it holds also as a per-step tree
    (DynamicPolicy: that many nodes chosen each step from the envelope), kind dynamic: static and per-step at equal
    budgets side by side."""
    out: list[tuple[Tree, str]] = []
    for i, spec in enumerate(trees or []):
        t = load_tree(spec, num_heads=num_heads)
        out.append((Tree(t.paths, t.name or f"tree{i + 1}"), "given"))
    if budgets:
        if calibration is None:
            raise FieldError("budgets", "no_calibration", "{field} needs a calibration folder ({also} DIR) to build "
                             "optimal trees", also="calibration")
        acc = calibration.accuracies("fit")
        depth = min(acc.shape[0], num_heads or acc.shape[0])
        rank = min(acc.shape[1], max_rank)
        value = calibration.joint_value("fit") if joint else acc
        answers = calibration.answers("fit", replay) if replay else None
        for b in budgets:
            name = f"opt-{'joint' if joint else 'indep'}-{b}"
            t = optimal_tree(value, b, depth, rank, name)
            if replay:  # what a live decoder measures decides between near-equal candidates
                t = best_by(lambda c: decoder_walk(c, answers), t, b, depth, rank)
            out.append((t, "optimal"))
    if dense:
        sizes = list(budgets or []) or [t.nodes for t, _ in out]
        for b in sizes:
            out += [(t, "dense") for t in dense_near(b, num_heads or 5, max_rank)]
    seen, unique = set(), []
    for t, kind in out:
        key = tuple(t.sorted_paths)
        if key not in seen:
            seen.add(key)
            unique.append((t, kind))
    if not unique:
        raise FieldError("budgets", "no_trees", "no trees to sweep: give {field} or {also}", also="trees")
    if envelope is not None:
        sizes = sorted({t.nodes for t, _ in unique if t.nodes <= envelope.nodes})
        if not sizes:
            raise FieldError("envelope", "below_trees", f"{{field}} {envelope.name}: {envelope.nodes} nodes, fewer "
                             "than every swept tree's: give a larger envelope or smaller {also}", also="budgets")
        unique += [(DynamicPolicy(n, envelope), "dynamic") for n in sizes]
    return unique


def sweep_configs(trees: list[tuple[Tree, str]], temperatures=(0.0,), epsilons=(0.09,), delta="sqrt") -> list[dict]:
    """One config per tree at temperature 0 (greedy: epsilon/delta play no part), and per (tree, temperature,
    epsilon) for every temperature > 0 (typical acceptance)."""
    out = []
    for tree, kind in trees:
        for temp in temperatures:
            if temp == 0:
                out.append(dict(tree=tree, kind=kind, acceptance="greedy", temperature=0.0, epsilon=None, delta=None))
                continue
            for eps in epsilons:
                out.append(dict(tree=tree, kind=kind, acceptance="typical", temperature=float(temp),
                                epsilon=float(eps),
                                delta=Acceptance("typical", float(temp), float(eps), delta).delta))
    for c in out:
        c["config"] = (f"{tree_key(c['tree'])}|{c['acceptance']}|T={c['temperature']:g}" +
                       (f"|eps={c['epsilon']:g}|delta={c['delta']:g}" if c["epsilon"] is not None else ""))
    return out


# ----------------------------------------------------------------------------------------------- sweep: quality

@torch.inference_mode()
def mean_logprob(model, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean log-probability of the generated tokens under the base model at temperature 1 (one teacher-forced
    forward per prompt; logits only at the generated positions)."""

    total, count = 0.0, 0
    for p, o in zip(prompts, outputs):
        if not o:
            continue
        ids = torch.tensor([p + o], device=model.device)
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0, len(p) - 1:-1]  # [G, H]
        logp = torch.log_softmax(logits_of(model, hidden), dim=-1)                      # [G, V]
        total += float(logp.gather(1, torch.tensor(o, device=model.device)[:, None]).sum())
        count += len(o)
    return total / count if count else float("nan")


def distinct_2(outputs: list[list[int]]) -> float:
    """Distinct bigrams over all bigrams, pooled over the generations (lower = more repetitive)."""
    grams = [tuple(o[i:i + 2]) for o in outputs for i in range(len(o) - 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


# ----------------------------------------------------------------------------------------------- sweep: run

def calibration_predictions(calibration, max_new_tokens: int | None = None, prompt_ids=None):
    """tree -> calibration predictions for a sweep row: Calibration.predict's three (predicted_independent,
    predicted_joint, predicted_replay over every held-out answer: a larger sample than a live sweep can afford),
    predicted_replay_fit (the replay over the fit answers), and replay_swept: the replay over the calibration's own
    answers to *these* prompts, which a lossless greedy decoder must match exactly. Answers are cut to
    max_new_tokens, as the sweep cuts them; a tree the calibration cannot score gets no predictions."""
    ours = None
    if prompt_ids is not None:
        every = calibration.answers("all", max_new_tokens)
        ours = every[every["prompt_id"].isin([str(i) for i in prompt_ids])]

    def predict(tree: Tree) -> dict:
        if not calibration.fits(tree):
            return {}
        if isinstance(tree, DynamicPolicy):  # the heads' log-probs were recorded for the held-out answers only
            if not (calibration.folder / TOPK).is_file():
                return {}  # nothing to replay a per-step tree on (`workbench calibrate --record-topk` records it)
            out = calibration.predict(tree, max_new_tokens)
            if ours is not None and ours["prompt_id"].nunique() == len(set(map(str, prompt_ids))):
                out["replay_swept"] = walk_answers(tree, answer_rows(ours, calibration.head_logprobs(ours)))
            return out
        out = dict(calibration.predict(tree, max_new_tokens),
                   predicted_replay_fit=calibration.replay(tree, "fit", max_new_tokens))
        if ours is not None and ours["prompt_id"].nunique() == len(set(map(str, prompt_ids))):
            out["replay_swept"] = decoder_walk(tree, ours)
        return out
    return predict


def _aggregate(calls: list[list]) -> dict:
    """Speed of one method over the calls of a sweep row (each call a batch of sequences decoded together), every
    quantity from speed.py."""
    times = step_times(calls)
    return dict(tokens=sum(len(r.token_ids) for c in calls for r in c), steps=sum(len(r.steps) for c in calls for r in c),
                tokens_per_step=tokens_per_step(calls), tokens_per_s=goodput(calls), mean_step_s=mean_step_s(calls),
                step_ms=1e3 * statistics.median(times), step_times=times)


@torch.inference_mode()
def _spec(tree, bufs: dict):
    """What medusa_generate decodes for a sweep's tree: its prebuilt buffers; a per-step tree itself (it chooses
    from its envelope each step)."""
    return tree if isinstance(tree, DynamicPolicy) else bufs[tree_key(tree)]


def steps_per_shape(configs: list[dict], prompts: int, batch_sizes, max_new_tokens: int) -> int:
    """About how many steps a sweep runs per step shape (vanilla's and each tree size's, at its smallest batch
    size): what the engine's compile default weighs (compiled.PAYBACK_STEPS)."""
    shapes = 1 + len({c["tree"].nodes for c in configs if c.get("tree") is not None})
    return -(-prompts // min(batch_sizes)) * max_new_tokens * max(1, len(configs) // shapes)


def run_sweep(model, heads, tokenizer, prompts: list[list[int]], configs: list[dict], out,
              max_new_tokens: int = 128, run_info: dict | None = None, predict=None, progress: bool = True,
              on_row=None, engine=None, batch_sizes=(1,)) -> pd.DataFrame:
    """Run every configuration not yet in `out` on all prompts at every batch size, vanilla greedy first.

    One CSV row per (configuration, batch size), plus a `vanilla` row per batch size; the whole file is rewritten
    atomically after each, so a killed run loses at most the row in flight; a rerun skips rows whose (run,
    config) exist. `run` hashes run_info (model, prompts, max_new_tokens, device, ...): other settings never count
    as done. At batch size B the prompts are decoded B at a time (ragged lengths, one forward per step).
    `predict(tree) -> dict` adds calibration predictions; `on_row(row)` is called after each row is on disk.
    Timing: each row's speedup (goodput ratio, prefill included), decode_speedup (the decoding phase's: what a plan
    predicts) and overhead (mean step ratio) are against vanilla greedy run right before it on every batch of
    prompts, at the same batch size (speed.measured_speedup / decode_speedup / overhead); step_ms is the
    median step, forward_ms the median bare verify work of that tree at that batch, timed right after every step at
    its context (`timing.forward_probe`), decoder_overhead = step_ms / forward_ms (speed.decoder_overhead).
    `engine`: a StepEngine to run on (e.g. compiled); default a fresh one (compiled on CUDA).
    """
    if not prompts:
        raise WorkbenchError("the prompt set is empty: give prompts to sweep on")
    if max_new_tokens < 1:
        raise FieldError("max_new_tokens", "below_one", f"{{field}} {max_new_tokens}: must be >= 1")
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not batch_sizes or batch_sizes[0] < 1:
        raise FieldError("batch_sizes", "below_one", f"{{field}} {batch_sizes}: every batch size must be >= 1")
    if batch_sizes[-1] > len(prompts):
        raise FieldError("batch_sizes", "past_prompts", f"{{field}}: batch {batch_sizes[-1]} but {len(prompts)} "
                         "prompts: lower the batch size or give more prompts ({also})", also="limit")
    info = dict(run_info or {}, max_new_tokens=max_new_tokens, num_prompts=len(prompts),
                prompts_sha=prompts_fingerprint(prompts)[:10])
    run = hashlib.sha1(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()[:10]
    rows = read_sweep_rows(out)
    done = {(r["run"], r["config"], r["batch_size"]) for r in rows}  # a row: a configuration at one batch size
    todo = {b: [c for c in configs if (run, c["config"], str(b)) not in done and b in c.get("batch_sizes", [b])]
            for b in batch_sizes}  # a configuration may ask for some batch sizes only (a plan's choice at its own)
    if not any(todo.values()) and all((run, "vanilla", str(b)) in done for b in batch_sizes):
        return pd.read_csv(out)
    common = dict(run=run, model=info.get("model", ""), prompts=info.get("prompts", ""),
                  max_new_tokens=max_new_tokens, device=str(model.device.type),
                  dtype=dtype_name(model.dtype), calibration=info.get("calibration", ""),
                  num_prompts=len(prompts), mean_prompt_tokens=sum(map(len, prompts)) / len(prompts),
                  version=SWEEP_VERSION)

    # one engine (static cache, compiled step when asked) and one set of tree buffers for the whole sweep
    engine = engine or StepEngine(model)
    bufs = {tree_key(c["tree"]): tree_setup(getattr(c["tree"], "envelope", c["tree"]), model, heads.num_heads)
            for c in configs}  # a per-step tree's: its envelope's (the capacity and the grid)
    root = root_setup(model)
    engine.size_for(prompts, max_new_tokens, [root, *bufs.values()])  # one capacity: each (B, N) compiles once
    gens = sum(-(-len(prompts) // b) * (1 + 2 * len(todo[b])) for b in batch_sizes)
    bar = tqdm(total=gens, desc="sweep", unit="batch", disable=not progress, dynamic_ncols=True)


    def emit(row: dict) -> None:  # the setting now (its load average is this row's)
        where = measured_setting(model, engine, "decoder-step")
        row = {**common, "setting": setting_cell(where), **row}
        rows.append(row_cells(row))
        write_rows(out, rows)
        if on_row is not None:
            on_row(row)

    for b in batch_sizes:
        chunks = [prompts[i:i + b] for i in range(0, len(prompts), b)]
        # warm-up (and compilation): every step shape at this batch size is run before anything is timed
        vanilla_generate(model, tokenizer, chunks[0], 2, engine=engine)
        for c in todo[b]:
            medusa_generate(model, heads, tokenizer, chunks[0], _spec(c["tree"], bufs), 2, engine=engine)
        vanilla, (probe, van_forward) = [], forward_probe(engine, root)
        for chunk in chunks:
            vanilla.append(vanilla_generate(model, tokenizer, chunk, max_new_tokens, engine=engine, on_step=probe))
            bar.update(1)
        van = _aggregate(vanilla)
        van_outputs = [r.token_ids for c in vanilla for r in c]
        if (run, "vanilla", str(b)) not in done:
            emit(dict(config="vanilla", tree="vanilla", kind="vanilla", nodes=0, depth=0, batch_size=b,
                      acceptance="greedy", temperature=0.0, tokens_per_step=1.0, overhead=1.0, speedup=1.0,
                      tokens_per_s=van["tokens_per_s"], vanilla_tokens_per_s=van["tokens_per_s"],
                      mean_step_s=van["mean_step_s"], step_ms=van["step_ms"], forward_ms=1e3 * statistics.median(van_forward),
                      decoder_overhead=decoder_overhead(van["step_times"], van_forward), exact_match=1.0,
                      near_tie_divergences=0, mismatches=0, mean_logprob=mean_logprob(model, prompts, van_outputs),
                      distinct_2=distinct_2(van_outputs), new_tokens=van["tokens"], steps=van["steps"]))
        for c in todo[b]:
            tree, spec = c["tree"], _spec(c["tree"], bufs)
            dynamic = isinstance(tree, DynamicPolicy)  # its bare forward: as many tokens, the envelope's first nodes
            buf = tree_setup(make_tree(tree.envelope.sorted_paths[:tree.nodes]), model) if dynamic else spec
            rule = Acceptance(c["acceptance"], c["temperature"]) if c["epsilon"] is None else \
                Acceptance(c["acceptance"], c["temperature"], c["epsilon"], c["delta"])
            bar.set_postfix_str(f"B={b} " + c["config"].split("|", 1)[1])
            greedy = not rule.temperature
            results, baseline, (probe, forwards) = [], [], forward_probe(engine, buf, heads)
            for chunk in chunks:  # vanilla right before Medusa on every batch: a load change hits both alike
                baseline.append(vanilla_generate(model, tokenizer, chunk, max_new_tokens, engine=engine,
                                                 record=greedy))
                bar.update(1)
                results.append(medusa_generate(model, heads, tokenizer, chunk, spec, max_new_tokens, rule,
                                               engine=engine, on_step=probe, record=greedy))
                bar.update(1)
            agg = _aggregate(results)
            meds, vans = [r for c_ in results for r in c_], [r for c_ in baseline for r in c_]
            outputs = [r.token_ids for r in meds]
            # greedy output must be vanilla's: each prompt's first divergence is a near-tie (rounding) or a bug
            found = [d for r, v in zip(meds, vans) for d in divergences(r, v, model.dtype)] if greedy else None
            row = dict(config=c["config"], tree=f"{tree.name}_{tree.envelope.name}" if dynamic else tree.name,
                       kind=c["kind"], nodes=tree.nodes,
                       depth=tree.depth, batch_size=b, acceptance=c["acceptance"], temperature=c["temperature"],
                       epsilon=c["epsilon"], delta=c["delta"], tokens_per_step=agg["tokens_per_step"],
                       tokens_per_s=agg["tokens_per_s"], overhead=overhead(results, baseline),
                       speedup=measured_speedup(results, baseline), decode_speedup=decode_speedup(results, baseline),
                       vanilla_tokens_per_s=goodput(baseline),
                       mean_step_s=agg["mean_step_s"], step_ms=agg["step_ms"],
                       forward_ms=1e3 * statistics.median(forwards),
                       decoder_overhead=decoder_overhead(agg["step_times"], forwards),
                       exact_match=sum(o == v.token_ids for o, v in zip(outputs, vans)) / len(prompts),
                       **(divergence_counts(found) if found is not None else {}),
                       mean_logprob=mean_logprob(model, prompts, outputs), distinct_2=distinct_2(outputs),
                       new_tokens=agg["tokens"], steps=agg["steps"], **(predict(tree) if predict else {}))
            emit(row)
    bar.close()
    return pd.read_csv(out)
