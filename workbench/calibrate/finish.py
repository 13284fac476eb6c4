"""The last stage of `workbench calibrate`, from the merged ranks alone (no model, so cheap: a rerun with other
--budgets or --holdout redoes only this): the holdout split, the fit prompts' accuracies (accuracies.csv), the
tuned trees (trees/NAME-{indep,joint}-B.json, each with its predictions) and meta.json, written last.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import __version__
from workbench.core.notes import FieldError
from workbench.calibrate.folder import ACCURACIES, CONTINUATIONS, META, META_VERSION, RANKS, read_ranks
from workbench.calibrate.ranks import decoder_walk, head_accuracies, measured_acceptance, path_probabilities
from workbench.core.io import atomic_write_json, read_json
from workbench.trees.accuracies import write_accuracies
from workbench.trees.optimize import acc_value_fn, empirical_value_fn, expected_length, optimal_tree_from
from workbench.trees.tree import save_tree


def holdout_split(prompt_ids: list[str], share: float) -> set[str]:
    """Deterministic holdout: the round(share * n) ids with the smallest sha256, at least 1 when share > 0,
    always leaving at least one prompt to fit on. Depends on the ids only, not on the order or the run."""
    if not 0 <= share < 1:
        raise FieldError("holdout", "range", f"{{field}} {share}: must be a share in [0, 1), e.g. 0.2")
    n = len(prompt_ids)
    k = min(max(round(share * n), 1 if share > 0 else 0), n - 1)
    order = sorted(prompt_ids, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    return set(order[:max(k, 0)])


def own_trees(trees_dir: Path, name: str) -> list[Path]:
    """The tree files a calibration named `name` wrote (NAME-indep-B / NAME-joint-B), not the user's others."""
    return [f for kind in ("indep", "joint") for f in trees_dir.glob(f"{name}-{kind}-*.json")]


def build_trees(name: str, fit: pd.DataFrame, test: pd.DataFrame, acc: np.ndarray, budgets: list[int],
                trees_dir: Path, calibration: str = "") -> tuple[list[dict], list[str]]:
    """For each budget, the optimal tree under independent heads (acc) and under the joint path probabilities of
    `fit`; each file holds its predicted tokens/step (names as in calibrate/folder.py: predicted_independent and
    predicted_joint from `fit`, predicted_replay over the `test` answers when there are any, predicted_replay_fit
    over the fit answers) and holdout_acceptance_length, the joint all-position mean on `test`. A model where no
    node was ever right yields no tree (listed in skipped)."""
    K, topk = acc.shape
    indep_fn, joint_fn = acc_value_fn(acc), empirical_value_fn(path_probabilities(fit))
    summary, skipped = [], []
    for b in budgets:
        for kind, fn in (("indep", indep_fn), ("joint", joint_fn)):
            tname = f"{name}-{kind}-{b}"
            if not any(fn((r,)) > 0 for r in range(topk)):
                skipped.append(f"{tname}: no head guess was ever right on the fit prompts")
                continue
            tree = optimal_tree_from(fn, b, K, topk, name=tname)
            row = dict(name=tname, model="independent" if kind == "indep" else "joint", budget=b,
                       nodes=tree.nodes, depth=tree.depth, calibration=calibration,
                       expected_acceptance_length=expected_length(tree, fn),
                       predicted_independent=expected_length(tree, indep_fn),
                       predicted_joint=expected_length(tree, joint_fn))
            if len(test):
                row["predicted_replay"] = decoder_walk(tree, test)
            row["predicted_replay_fit"] = decoder_walk(tree, fit)
            if len(test):
                row["holdout_acceptance_length"] = measured_acceptance(tree, test)
            save_tree(tree, trees_dir / f"{tname}.json", **{k: v for k, v in row.items() if k != "name"})
            summary.append(row)
    return summary, skipped


def finish(folder: Path, name: str, args: dict, records, holdout: float, budgets: list[int],
            trees_dir: Path) -> dict:
    """Accuracies, trees and meta from the merged ranks (cheap: reruns with new budgets/holdout redo only this)."""
    shutil.rmtree(folder / "parts", ignore_errors=True)  # left over if a kill came right after the merge
    old = read_json(folder / META, str(folder))
    ranks = read_ranks(folder / RANKS, str(folder))
    try:
        stopped = pd.read_parquet(folder / CONTINUATIONS, columns=["stopped"])["stopped"]
    except Exception as e:  # a damaged folder that claims to be complete
        raise FieldError("force", "unreadable", f"{folder}: continuations.parquet is not readable "
                         f"({type(e).__name__}); rerun with {{field}}") from None
    pids = [pid for pid, _ in records]
    held = holdout_split(pids, holdout)
    fit = ranks[~ranks["prompt_id"].isin(held)].reset_index(drop=True)
    test = ranks[ranks["prompt_id"].isin(held)].reset_index(drop=True)
    topk, K = args["topk"], args["num_heads"]
    acc, counts = head_accuracies(fit, topk)
    write_accuracies(folder / ACCURACIES, acc, counts)
    trees_dir.mkdir(parents=True, exist_ok=True)
    for f in own_trees(trees_dir, name):  # budgets may have changed since the last run
        f.unlink()
    summary, skipped = build_trees(name, fit, test, acc, budgets, trees_dir, str(folder))
    meta = dict(version=META_VERSION, model=args["model"], heads=args["heads"], prompts=args["prompts"], limit=args["limit"],
                num_prompts=len(records), num_positions=len(ranks), num_heads=K, topk=topk,
                max_new_tokens=args["max_new_tokens"], batch_size=args["batch_size"], device=args["device"],
                dtype=args["dtype"], elapsed_seconds=old.get("compute_seconds"),
                workbench_version=__version__, holdout=holdout, holdout_ids=sorted(held),
                fit_positions=len(fit), holdout_positions=len(test),
                stopped_at_eos=int((stopped == "eos").sum()),
                trees=summary, trees_skipped=skipped, args=args, compute_seconds=old.get("compute_seconds"),
                num_processes=old.get("num_processes", 1),
                **({"continuations_from": old["continuations_from"]} if "continuations_from" in old else {}))
    atomic_write_json(folder / META, meta)
    return dict(meta, folder=str(folder))
