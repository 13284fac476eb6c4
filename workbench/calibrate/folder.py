"""The calibration folder: the one module that knows its layout, and the questions a tree asks of it.

`workbench calibrate` writes calibration/NAME/ (see calibrate/run.py for how the ranks are measured):
  ranks.parquet          prompt_id, position, head_1..head_K: 0-based rank of the true token in head k's top-k,
                         -1 when absent, null past the end of the answer
  continuations.parquet  prompt_id, prompt_tokens, continuation (the greedy answer's token ids), stopped
  topk.parquet           the held-out positions' top-k ids and log-probs per head (calibrate/topk.py)
  accuracies.csv         a_k^(i) of the fit prompts (accuracies.write_accuracies)
  meta.json              model, prompt set, counts, topk, holdout_ids, ...; written last: marks the folder finished
  latency-DEVICE.csv     `workbench latency` (read by latency_file.read_latency)
Splits: holdout = meta's holdout_ids (never used to fit a tree), fit = the rest, all = both.

A tree's three predicted tokens per step carry the same names everywhere (sweep CSV, tree files, report, app):
  predicted_independent  1 + sum over nodes of prod_k a_k^(i_k): independent heads, fit prompts' accuracies
  predicted_joint        1 + sum over nodes of the measured joint path frequency, fit prompts
  predicted_replay       a greedy decoder replayed over the holdout prompts' answers: what a live decoder measures
The first two are the paper's mean over every position; the replay visits only the positions a step starts at,
which are harder than average. `predicted_replay_fit` is the same replay over the fit answers. The statistics
behind them, computed from a ranks frame, are calibrate/ranks.py's.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import WorkbenchError
from workbench.core.notes import FieldError, flag
from workbench.calibrate.ranks import (answer_rows, batch_walk, head_accuracies, head_columns, measured_acceptance,
                                       path_probabilities, walk_answers, walk_steps)
from workbench.calibrate.served import is_served
from workbench.core.data import load_prompt_records
from workbench.calibrate.topk_file import read_topk
from workbench.core.io import read_json
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.optimize import acc_value_fn, empirical_value_fn, expected_length

META, RANKS, CONTINUATIONS, ACCURACIES = "meta.json", "ranks.parquet", "continuations.parquet", "accuracies.csv"
TOPK = "topk.parquet"  # the heads' top-k ids and log-probs at held-out positions (calibrate/topk.py's pass)
META_VERSION = 2  # meta.json's "version"; 1: folders without it (upgrade_meta)
SPLITS = ("all", "fit", "holdout")
MAX_TOPK = 1 << 15  # ranks.parquet holds 16-bit ranks (ranks_frame): a larger top-k cannot be written
PREDICTIONS = ("predicted_independent", "predicted_joint", "predicted_replay")
PREDICTED_COLUMNS = PREDICTIONS + ("predicted_replay_fit",)  # a sweep row's predictions


# ----------------------------------------------------------------------------------------------- finding folders

def calibration_root(default: str | Path = "calibration") -> Path:
    """Where calibration folders live: $WORKBENCH_CALIBRATION_ROOT, else `default` (the CLI: ./calibration)."""
    return Path(os.environ.get("WORKBENCH_CALIBRATION_ROOT") or default)


def list_calibrations(root: str | Path | None = None) -> list[Path]:
    """The finished calibration folders (those with a meta.json) under root, sorted by name; served ones (the
    engine's counters, calibrate/served.py) are not among them: they hold no ranks to replay trees on."""
    return [m.parent for m in sorted(Path(root or calibration_root()).glob(f"*/{META}")) if not is_served(m.parent)]


def default_calibration(root: str | Path | None = None) -> Path:
    """The finished calibration folder under the root with the most prompts (meta num_prompts; a tie: the first by
    name): the best-measured one, not whichever name sorts first (a quick 32-prompt run beside the 805-prompt one)."""
    root = Path(root or calibration_root())
    found = list_calibrations(root)
    if not found:
        raise FieldError("calibration", "none_found", f"no calibration folder under {root}/: run `workbench "
                         "calibrate`, or pass {field} DIR, or give {also} instead of {also2}",
                         also=("trees", "budgets"))
    return sorted(found, key=lambda f: -_num_prompts(f))[0]  # stable: a tie keeps the name order


def _num_prompts(folder: Path) -> int:
    """meta.json's num_prompts (0 when unreadable: such a folder is never the default over a readable one)."""
    try:
        return int(read_json(folder / META, str(folder)).get("num_prompts") or 0)
    except (WorkbenchError, ValueError, TypeError, AttributeError):
        return 0


def slug(text: str, file_stem: bool = False) -> str:
    """A name safe in a file name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' ('model' when nothing is
    left). file_stem: a path (or a name with a dot) gives its file name without suffix ('data/my.json' -> 'my')."""
    base = Path(text).stem if file_stem and ("/" in text or "." in text) else str(text)
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "model"


def latency_path(folder: str | Path, device: str) -> Path:
    """Where `workbench latency` writes a device's latency table inside a calibration folder."""
    return Path(folder) / f"latency-{slug(device)}.csv"


def default_latency_path(model_label: str, device: str, root: str | Path | None = None) -> Path:
    """The latency CSV of the first calibration folder made for this model, else of a folder named after it."""
    root = Path(root or calibration_root())
    for folder in list_calibrations(root):
        try:
            if read_json(folder / META, str(folder)).get("model") == model_label:
                return latency_path(folder, device)
        except WorkbenchError:  # not ours to judge here: a damaged folder is skipped
            continue
    return latency_path(root / slug(model_label), device)


# ----------------------------------------------------------------------------------------------- checked readers

def upgrade_meta(meta: dict) -> dict:
    """meta.json of version 1 (no "version"; the same fields) as this version: the only place earlier folders are
    told apart; read_meta calls it."""
    return {"version": META_VERSION, **meta}


def read_meta(folder: str | Path, field: str = "calibration") -> dict:
    """meta.json of a calibration folder at this version (upgrade_meta), checked for the fields readers use (topk,
    holdout_ids). `field`: the request field that named the folder (core.notes.FieldError)."""
    folder = Path(folder)
    what = f"{{field}} {folder}"
    if not (folder / META).is_file():
        raise FieldError(field, "not_finished", f"{what}: not a finished calibration folder (no meta.json; run "
                         "`workbench calibrate` to completion)")
    meta = read_json(folder / META, folder, dict, field)
    meta = meta if "version" in meta else upgrade_meta(meta)
    if meta["version"] != META_VERSION:
        raise FieldError(field, "version", f"{what}: meta.json version {str(meta['version'])[:20]!r}, but this "
                         f"workbench reads calibrations of version {META_VERSION}: calibrate again with `workbench "
                         "calibrate`")
    topk, held = meta.get("topk"), meta.get("holdout_ids", [])
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:  # before any work per rank
        raise FieldError(field, "damaged", f"{what}: meta.json's topk should be an integer in 1..{MAX_TOPK} "
                         f"(ranks.parquet holds 16-bit ranks), found {str(topk)[:40]!r}: a damaged folder, "
                         "calibrate again")
    if not isinstance(held, list) or not all(isinstance(h, str) for h in held):
        raise FieldError(field, "damaged", f"{what}: meta.json's holdout_ids should be a list of prompt ids (strings)")
    return meta


def read_ranks(f: Path, what: str, topk: int = MAX_TOPK) -> pd.DataFrame:
    """ranks.parquet, checked: prompt_id, position, head_1..head_K with integer ranks in [-1, topk) (null past the
    end)."""
    try:
        ranks = pd.read_parquet(f)
    except Exception as e:  # truncated or foreign file: whatever pyarrow raised, one line
        raise WorkbenchError(f"{what}: {f.name} is not a readable parquet file ({type(e).__name__})") from None
    heads = head_columns(ranks)
    if "prompt_id" not in ranks.columns or "position" not in ranks.columns or \
            heads != [f"head_{k + 1}" for k in range(len(heads))] or not heads:
        raise WorkbenchError(f"{what}: {f.name} should have columns prompt_id, position, head_1..head_K "
                             f"(found {', '.join(map(str, ranks.columns))[:160]})")
    for c in ["position"] + heads:
        low, high = (0, 1 << 31) if c == "position" else (-1, topk)
        if not pd.api.types.is_integer_dtype(ranks[c]) or not ranks[c].fillna(0).between(low, high - 1).all():
            raise WorkbenchError(f"{what}: {f.name} column {c} should hold integers in [{low}, {high})"
                                 f"{'' if c == 'position' else ' (or null)'}")
    if ranks.empty:
        raise WorkbenchError(f"{what}: {f.name} holds no rows (no position was measured): rerun `workbench "
                             "calibrate` with more prompts or a larger `--max-new-tokens`")
    ranks["prompt_id"] = ranks["prompt_id"].astype("string")
    return ranks


def read_continuations(f: Path, what: str) -> dict[str, list[int]]:
    """continuations.parquet as prompt_id -> answer token ids, checked."""
    try:
        info = pd.read_parquet(f, columns=["prompt_id", "continuation"])
        return {str(pid): [int(t) for t in c] for pid, c in zip(info["prompt_id"], info["continuation"])}
    except Exception as e:  # truncated file, missing column, answers that are not token id lists
        raise WorkbenchError(f"{what}: {f.name} is not a readable continuations file (prompt_id, continuation "
                             f"token lists; {type(e).__name__})") from None


# ----------------------------------------------------------------------------------------------- the folder

class Calibration:
    """A finished calibration folder, opened once: meta.json is checked on opening, the parquet files are read
    (and checked) on first use and kept, so repeated questions (the app asks on every rerun) cost no re-read."""

    def __init__(self, folder: str | Path, field: str = "calibration"):
        self.folder, self.field, self.what = Path(folder), field, f"{flag(field)} {folder}"
        if is_served(self.folder):
            raise FieldError(field, "served", f"{{field}} {folder}: a served calibration (the engine's counters: "
                             "one chain's per-position acceptance, no ranks): plan, optimize and export take it; tree "
                             "replays and sweeps need `workbench calibrate` of Medusa heads")
        if not (self.folder / RANKS).is_file():
            raise FieldError(field, "not_finished", f"{{field}} {folder}: not a finished calibration folder (no "
                             "meta.json/ranks.parquet; run `workbench calibrate` to completion)")
        self.meta = read_meta(self.folder, field)
        self.holdout_ids = set(self.meta.get("holdout_ids", []))
        self._cache: dict = {}

    def __repr__(self) -> str:
        return f"Calibration({str(self.folder)!r})"

    def _cached(self, key, make):
        """make() once; a file reader's error about this folder (worded `self.what: ...`) names the field."""
        if key not in self._cache:
            try:
                self._cache[key] = make()
            except FieldError:
                raise
            except WorkbenchError as e:
                if not str(e).startswith(self.what + ":"):
                    raise
                raise FieldError(self.field, "unreadable", "{field}" + str(e)[len(flag(self.field)):]) from None
        return self._cache[key]

    def ranks(self, split: str = "all") -> pd.DataFrame:
        """The ranks frame of one split (all | fit | holdout)."""
        if split not in SPLITS:
            raise WorkbenchError(f"split {split!r}: use all, fit or holdout")
        every = self._cached("ranks", lambda: read_ranks(self.folder / RANKS, self.what,
                                                         self.meta["topk"]))
        if split == "all":
            return every
        return self._cached(("ranks", split), lambda: every[every["prompt_id"].isin(self.holdout_ids) ==
                                                             (split == "holdout")].reset_index(drop=True))

    def answers(self, split: str = "all", max_new_tokens: int | None = None) -> pd.DataFrame:
        """A split's ranks cut to the first max_new_tokens positions of every answer (as a sweep cuts them)."""
        ranks = self.ranks(split)
        if not max_new_tokens:
            return ranks
        return self._cached(("cut", split, max_new_tokens), lambda: ranks[ranks["position"] < max_new_tokens])

    def accuracies(self, split: str = "fit") -> np.ndarray:
        """acc [K, topk]: a_k^(i) on one split (fit: what the calibration's trees and accuracies.csv use)."""
        return self._cached(("acc", split), lambda: head_accuracies(self.ranks(split), self.meta["topk"])[0])

    def path_probabilities(self, split: str = "fit") -> dict[tuple[int, ...], float]:
        return self._cached(("probs", split), lambda: path_probabilities(self.ranks(split)))

    def joint_value(self, split: str = "fit"):
        """The path-value function of the measured joint paths (optimize's value for --joint)."""
        return self._cached(("joint", split), lambda: empirical_value_fn(self.path_probabilities(split)))

    def path_comparison(self, split: str = "fit", top: int = 40) -> pd.DataFrame:
        """The `top` most frequent measured paths (ties: shorter, then by ranks) with their measured frequency, the
        independence product of the split's a_k^(i), the ratio (1 = independent heads) and depth. The two use
        different denominators (all positions vs the positions where head k has a target), so even a one-head
        path reads below 1: that part is the answers' ends, not head correlation."""
        measured, value = self.path_probabilities(split), acc_value_fn(self.accuracies(split))
        paths = sorted(measured, key=lambda p: (-measured[p], len(p), p))[:top]
        df = pd.DataFrame({"path": paths, "measured": [measured[p] for p in paths],
                           "independence": [value(p) for p in paths]})
        df.insert(1, "measured / independence", df["measured"] / df["independence"].where(df["independence"] > 0))
        df["depth"] = [len(p) for p in paths]
        return df

    def check_fits(self, tree) -> None:
        tree = tree.envelope if isinstance(tree, DynamicPolicy) else tree
        if not self.fits(tree):
            K, topk = self.accuracies("all").shape
            raise WorkbenchError(f"tree needs depth {tree.depth} and top-{tree.max_rank + 1} but the calibration has "
                                 f"{K} heads and top-{topk}")

    def fits(self, tree) -> bool:
        tree = tree.envelope if isinstance(tree, DynamicPolicy) else tree
        K, topk = self.accuracies("all").shape
        return tree.depth <= K and tree.max_rank < topk

    def replay(self, tree, split: str = "holdout", max_new_tokens: int | None = None) -> float | None:
        """Tokens per step of a greedy decoder with this tree replayed over a split's answers (None: no answers)."""
        answers = self.answers(split, max_new_tokens)
        if not len(answers):
            return None
        rows, steps = self._walk(tree, answers, split, max_new_tokens)
        return walk_answers(tree, rows, steps)

    def _walk(self, tree, answers: pd.DataFrame, split: str, max_new_tokens: int | None) -> tuple:
        """(answer_rows, walk_steps) of a split's answers under a tree, kept: the replay and every batch size read
        one walk (a plan weighs some 20 trees at 4 batch sizes)."""
        if isinstance(tree, DynamicPolicy):  # the same rows with the heads' log-probs beside them
            rows = self._cached(("rows+logp", split, max_new_tokens),
                                lambda: answer_rows(answers, self.head_logprobs(answers)))
            key = ("dynamic", tree.nodes, tuple(map(tuple, tree.envelope.sorted_paths)))
        else:
            rows = self._cached(("rows", split, max_new_tokens), lambda: answer_rows(answers))
            key = tuple(map(tuple, tree.sorted_paths))
        return rows, self._cached(("steps", key, split, max_new_tokens), lambda: walk_steps(tree, rows))

    def head_logprobs(self, rows: pd.DataFrame) -> np.ndarray:
        """[len(rows), K, topk] float32: the heads' top-k log-probs at these ranks rows (topk.parquet, recorded for
        the held-out answers by `workbench calibrate`, or `--record-topk` for a folder calibrated before)."""
        f = self.folder / TOPK
        if not f.is_file():
            raise FieldError(self.field, "no_topk", f"{{field}} {self.folder}: no {TOPK} (the heads' log-probs a "
                             "per-step tree is chosen from): run `workbench calibrate --record-topk` on this folder")
        df = self._cached("topk", lambda: read_topk(f, self.what, self.meta["num_heads"],
                                                    self.meta["topk"]))
        got = rows[["prompt_id", "position"]].merge(df, on=["prompt_id", "position"], how="left", sort=False)
        cols = [f"logp_{k + 1}" for k in range(self.meta["num_heads"])]
        if got[cols[0]].isna().any():
            raise FieldError(self.field, "topk_short", f"{{field}} {self.folder}: {TOPK} lacks some of the held-out "
                             "positions; record it again (`workbench calibrate --record-topk`)")
        return np.stack([np.stack(got[c].to_numpy()) for c in cols], axis=1).astype(np.float32)

    def batch_replay(self, tree, batch: int, split: str = "holdout", max_new_tokens: int | None = None,
                     cost=None) -> float | None:
        """Tokens per step of `batch` of a split's answers decoded side by side (batch_walk: the batch waits for its
        slowest sequence; `cost`: its tail steps priced by how many are left); None without answers. What a batch's
        goodput divides by, where replay() is what each sequence measures."""
        answers = self.answers(split, max_new_tokens)
        if not len(answers):
            return None
        rows, steps = self._walk(tree, answers, split, max_new_tokens)
        return batch_walk(tree, rows, batch, steps, cost)

    def predict(self, tree, max_new_tokens: int | None = None) -> dict[str, float]:
        """The three predicted tokens per step of a tree (names in the module docstring); predicted_replay only
        when the calibration holds out prompts. max_new_tokens cuts the replayed answers, as a sweep does. A
        per-step tree (DynamicPolicy) has only the replay: it is chosen from the heads' log-probs at each step."""
        self.check_fits(tree)
        if isinstance(tree, DynamicPolicy):
            return dict(predicted_replay=self.replay(tree, "holdout", max_new_tokens))
        out = dict(predicted_independent=expected_length(tree, self.accuracies("fit")),
                   predicted_joint=expected_length(tree, self.joint_value("fit")))
        replay = self.replay(tree, "holdout", max_new_tokens)
        return out if replay is None else dict(out, predicted_replay=replay)

    def report(self, tree) -> dict:
        """`workbench tree eval`: predict() plus the replay over the fit answers and the joint mean on the holdout
        prompts (beside predicted_joint it shows how far the fit prompts' paths carry to new ones)."""
        out = {"tree": tree.name, "nodes": tree.nodes, "calibration": str(self.folder),
               "positions": len(self.ranks("all")), **self.predict(tree),
               "predicted_replay_fit": self.replay(tree, "fit")}
        if len(self.ranks("holdout")):
            out["holdout_acceptance_length"] = measured_acceptance(tree, self.ranks("holdout"))
        return out

    def holdout_prompts(self, limit: int | None = None) -> list[tuple[str, str]]:
        """[(prompt_id, text)] of the held-out prompts (never used to fit its trees): the honest test set."""
        limit_ = self.meta.get("limit")
        if not isinstance(self.meta.get("prompts"), str) or not (limit_ is None or isinstance(limit_, int)):
            raise FieldError(self.field, "damaged", f"{{field}} {self.folder}: meta.json does not say which "
                             "prompts it used (prompts, limit)")
        records = [r for r in load_prompt_records(self.meta["prompts"], limit_) if r[0] in self.holdout_ids]
        if not records:
            raise FieldError("prompts", "no_holdout",
                             f"{{field}} holdout: calibration {self.folder} has no held-out prompts "
                             "(calibrate with {also} 0.2, or name a prompt set)", also="holdout")
        if limit is not None and limit <= 0:
            raise FieldError("limit", "below_one", f"{{field}} {limit}: must be a positive number of prompts")
        return records[:limit] if limit else records

    def continuations(self) -> dict[str, list[int]]:
        """prompt_id -> the greedy answer's token ids."""
        return self._cached("cont", lambda: read_continuations(self.folder / CONTINUATIONS,
                                                               self.what))

    def typical_context(self, max_new_tokens: int | None = None) -> float | None:
        """Mean cache length a decoding step sees on the calibration's prompts: prompt + half the answer (cut to
        max_new_tokens, as a decoder cuts it; None without continuations.parquet); a latency table is read at the
        measured context closest to it."""
        return self._cached(("typical", max_new_tokens), lambda: self._typical_context(max_new_tokens))

    def _typical_context(self, max_new_tokens: int | None = None) -> float | None:
        f = self.folder / CONTINUATIONS
        if not f.is_file():
            return None
        try:
            info = pd.read_parquet(f, columns=["prompt_tokens", "continuation"])
            if not all(isinstance(c, (list, np.ndarray)) for c in info["continuation"]):
                raise TypeError("continuation cells are not token lists")
            length = info["continuation"].map(len)
            if max_new_tokens:
                length = length.clip(upper=max_new_tokens)
            return float((info["prompt_tokens"] + length / 2).mean()) if len(info) else None
        except Exception as e:  # truncated file, wrong columns or types
            raise FieldError(self.field, "unreadable", f"{{field}} {self.folder}: {f.name} is not a readable "
                             f"continuations file (prompt_tokens, continuation token lists; {type(e).__name__})") \
                from None

    def latency_files(self) -> list[Path]:
        """The latency tables measured into this folder (`workbench latency --calibration DIR`)."""
        return sorted(self.folder.glob("latency-*.csv"))


def tree_table(trees, acc: np.ndarray, calibration: Calibration | None = None, optimal=None) -> list[dict]:
    """Rows comparing trees: nodes, depth, predicted_independent (from acc), with a calibration predicted_joint and
    predicted_replay, and with `optimal` (expected tokens/step of the optimal tree per node count, e.g.
    optimize.expected_curve) the optimum at the same size: the headroom of each shape. A tree that needs more
    heads or ranks than acc has gets a `note` instead of numbers."""
    rows = []
    K, R = acc.shape
    for t in trees:
        row = {"tree": t.name, "nodes": t.nodes, "depth": t.depth}
        if t.depth > K or t.max_rank >= R:
            rows.append(row | {"note": f"needs {t.depth} heads / top-{t.max_rank + 1}"})
            continue
        row |= calibration.predict(t) if calibration is not None else \
            {"predicted_independent": expected_length(t, acc)}
        if optimal is not None:
            row["optimal at same size"] = float(optimal[min(t.nodes, len(optimal) - 1)])
        rows.append(row)
    return rows
