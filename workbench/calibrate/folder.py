"""The calibration folder: the one module that knows its layout, and the questions a tree asks of it.

`workbench calibrate` writes calibration/NAME/ (see calibrate/run.py for how the ranks are measured):
  ranks.parquet          prompt_id, position, head_1..head_K: 0-based rank of the true token in head k's top-k,
                         -1 when absent, null past the end of the answer
  continuations.parquet  prompt_id, prompt_tokens, continuation (the greedy answer's token ids), stopped
  accuracies.csv         a_k^(i) of the fit prompts (accuracies.write_accuracies)
  meta.json              model, prompt set, counts, topk, holdout_ids, ...; written last: marks the folder finished
  latency-DEVICE.csv     `workbench latency` (read by latency.read_latency)
Splits: holdout = meta's holdout_ids (never used to fit a tree), fit = the rest, all = both.

A tree's three predicted tokens per step carry the same names everywhere (sweep CSV, tree files, report, app):
  predicted_independent  1 + sum over nodes of prod_k a_k^(i_k): independent heads, fit prompts' accuracies
  predicted_joint        1 + sum over nodes of the measured joint path frequency, fit prompts
  predicted_replay       a greedy decoder replayed over the holdout prompts' answers: what a live decoder measures
The first two are the paper's mean over every position; the replay visits only the positions a step starts at,
which are harder than average. `predicted_replay_fit` is the same replay over the fit answers.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import WorkbenchError
from workbench.core.data import load_prompt_records
from workbench.core.io import read_json
from workbench.trees.optimize import acc_value_fn, empirical_value_fn, expected_length

NULL = -2  # in-memory marker for "target past the end of the continuation" (null in ranks.parquet)
META, RANKS, CONTINUATIONS, ACCURACIES = "meta.json", "ranks.parquet", "continuations.parquet", "accuracies.csv"
META_VERSION = 2  # meta.json's "version"; 1: folders without it (upgrade_meta)
SPLITS = ("all", "fit", "holdout")
PREDICTIONS = ("predicted_independent", "predicted_joint", "predicted_replay")
PREDICTED_COLUMNS = PREDICTIONS + ("predicted_replay_fit",)  # a sweep row's predictions


# ----------------------------------------------------------------------------------------------- finding folders

def calibration_root(default: str | Path = "calibration") -> Path:
    """Where calibration folders live: $WORKBENCH_CALIBRATION_ROOT, else `default` (the CLI: ./calibration)."""
    return Path(os.environ.get("WORKBENCH_CALIBRATION_ROOT") or default)


def list_calibrations(root: str | Path | None = None) -> list[Path]:
    """The finished calibration folders (those with a meta.json) under root, sorted by name."""
    return [m.parent for m in sorted(Path(root or calibration_root()).glob(f"*/{META}"))]


def default_calibration(root: str | Path | None = None) -> Path:
    """The first finished calibration folder under the root (sorted by name)."""
    root = Path(root or calibration_root())
    found = list_calibrations(root)
    if not found:
        raise WorkbenchError(f"no calibration folder under {root}/: run `workbench calibrate`, or pass "
                             "--calibration DIR, or give --trees instead of --budgets")
    return found[0]


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


# ----------------------------------------------------------------------------------------------- ranks frames

def ranks_frame(prompt_ids: list[str], ranks: list[np.ndarray], num_heads: int) -> pd.DataFrame:
    """Long table: prompt_id, position, head_1..head_K (nullable Int16: rank, -1, or <NA> past the end)."""
    cols = {"prompt_id": pd.array([pid for pid, r in zip(prompt_ids, ranks) for _ in range(len(r))], dtype="string"),
            "position": pd.array(np.concatenate([np.arange(len(r)) for r in ranks]) if ranks else [], dtype="Int32")}
    mat = np.concatenate(ranks) if ranks else np.zeros((0, num_heads), dtype=np.int16)
    for k in range(num_heads):
        cols[f"head_{k + 1}"] = pd.array(mat[:, k], dtype="Int16", copy=True)
        cols[f"head_{k + 1}"][mat[:, k] == NULL] = pd.NA
    return pd.DataFrame(cols)


def head_columns(ranks: pd.DataFrame) -> list[str]:
    cols = [c for c in ranks.columns if re.fullmatch(r"head_\d+", c)]
    return sorted(cols, key=lambda c: int(c[5:]))


def rank_matrix(ranks: pd.DataFrame) -> np.ndarray:
    """[positions, K] int64 with -1 for a miss and NULL for past the end."""
    return ranks[head_columns(ranks)].fillna(NULL).to_numpy(dtype=np.int64)


def head_accuracies(ranks: pd.DataFrame, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """a_k^(i): share of head k's positions (those with a target) where its rank-i guess is the true token.

    Returns (acc [K, topk], counts [K] = positions with a target per head), the canonical CSV's columns.
    """
    mat = rank_matrix(ranks)
    K = mat.shape[1]
    counts = (mat != NULL).sum(0)
    hits = np.stack([np.bincount(mat[:, k][mat[:, k] >= 0], minlength=topk)[:topk] for k in range(K)])
    return hits / np.maximum(counts, 1)[:, None], counts


def path_probabilities(ranks: pd.DataFrame) -> dict[tuple[int, ...], float]:
    """P(path [i1..id] is accepted) = share of ALL positions whose rank sequence starts with it (no independence
    assumption). Past-the-end counts as a miss: the decoder cannot accept tokens the answer does not have."""
    mat = rank_matrix(ranks)
    M = len(mat)
    if M == 0:
        return {}
    probs = {}
    alive = np.ones(M, dtype=bool)
    for d in range(mat.shape[1]):
        alive &= mat[:, d] >= 0
        if not alive.any():
            break
        keys, counts = np.unique(mat[alive, :d + 1], axis=0, return_counts=True)
        probs.update({tuple(int(x) for x in key): n / M for key, n in zip(keys, counts)})
    return probs


def measured_acceptance(tree, ranks: pd.DataFrame) -> float:
    """Mean over positions of 1 + number of tree nodes accepted there (= longest accepted prefix)."""
    mat = rank_matrix(ranks)
    if len(mat) == 0:
        raise WorkbenchError("no positions to measure on (empty calibration data)")
    return int((1 + accepted_depths(tree, mat)).sum()) / len(mat)


def decoder_walk(tree, ranks: pd.DataFrame) -> float:
    """Tokens per step a live greedy decoder with this tree would measure on these answers: per prompt, start at
    position 0, accept the longest tree prefix of the rank sequence, jump past it; total tokens / total steps.
    Differs from measured_acceptance (the mean over ALL positions) only by which positions get visited."""
    return walk_answers(tree, answer_rows(ranks))


def answer_rows(ranks: pd.DataFrame) -> tuple[np.ndarray, list[int]]:
    """Every prompt's rank rows, prompt after prompt, as one matrix [positions, K], and each prompt's position count
    (the grouping is most of a walk's cost: a Calibration keeps it)."""
    codes, _ = pd.factorize(ranks["prompt_id"])  # prompts in order of first appearance (no key: dropped)
    keep = np.flatnonzero(codes >= 0)
    order = keep[np.argsort(codes[keep], kind="stable")]  # each prompt's rows together, in their own order
    return rank_matrix(ranks)[order], np.bincount(codes[keep]).tolist()


def accepted_depths(tree, mat: np.ndarray) -> np.ndarray:
    """[positions]: how many tree nodes a greedy step starting at each position accepts, the longest path of the tree
    that the rank row starts with. All positions at once: the tree as a table child[node, rank] -> node."""
    order = [()] + tree.sorted_paths
    ids = {p: i for i, p in enumerate(order)}
    rank_cap = max((p[-1] for p in tree.paths), default=0) + 1
    child = np.full((len(order), rank_cap), -1, dtype=np.int64)
    for p in tree.paths:
        child[ids[p[:-1]], p[-1]] = ids[p]
    node = np.zeros(len(mat), dtype=np.int64)  # the accepted node so far at each position (0: the root)
    depth = np.zeros(len(mat), dtype=np.int64)
    alive = np.ones(len(mat), dtype=bool)
    for d in range(min(tree.depth, mat.shape[1])):
        r = mat[:, d]
        ok = alive & (r >= 0) & (r < rank_cap)
        nxt = np.where(ok, child[node, np.where(ok, r, 0)], -1)
        alive = nxt >= 0
        node = np.where(alive, nxt, 0)
        depth += alive
    return depth


def walk_steps(tree, answers: tuple[np.ndarray, list[int]]) -> list[int]:
    """Per prompt of answer_rows, the steps a greedy decoder with this tree takes over its answer: start at its
    first position, accept accepted_depths there, jump past the accepted run."""
    mat, lengths = answers
    depth = accepted_depths(tree, mat).tolist()
    out, start = [], 0
    for n in lengths:
        t, end, steps = start, start + n, 0
        while t < end:
            t += 1 + depth[t]
            steps += 1
        out.append(steps)
        start = end
    return out


def walk_answers(tree, answers: tuple[np.ndarray, list[int]], steps: list[int] | None = None) -> float:
    """decoder_walk over answer_rows: total tokens / total steps (walk_steps, or `steps` when already walked)."""
    steps = sum(walk_steps(tree, answers) if steps is None else steps)
    if steps == 0:
        raise WorkbenchError("no positions to measure on (empty calibration data)")
    return sum(answers[1]) / steps


def expected_max(values, batch: int) -> float:
    """E[max] of `batch` values drawn without replacement from `values` (exact: the k-th smallest is the maximum
    of C(k-1, batch-1) of the C(n, batch) draws); the whole maximum when batch >= n."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        raise WorkbenchError("no answers to take a batch from")
    if batch >= n:
        return v[-1]
    total = math.comb(n, batch)
    return math.fsum(x * (math.comb(k, batch - 1) / total) for k, x in enumerate(v) if k >= batch - 1)


def batch_walk(tree, answers: tuple[np.ndarray, list[int]], batch: int, steps: list[int] | None = None) -> float:
    """Tokens per step of a batch of `batch` answers decoded side by side, as its goodput sees it: the batch steps
    until its slowest sequence is done and plain decoding until its longest answer is, so over random batches
    E[max answer length] / E[max steps] (walk_steps, or `steps` when already walked); batch 1 is walk_answers."""
    steps = walk_steps(tree, answers) if steps is None else steps
    if sum(steps) == 0:
        raise WorkbenchError("no positions to measure on (empty calibration data)")
    return expected_max(answers[1], batch) / expected_max(steps, batch)


# ----------------------------------------------------------------------------------------------- checked readers

def upgrade_meta(meta: dict) -> dict:
    """meta.json of version 1 (no "version"; the same fields) as this version: the only place earlier folders are
    told apart; read_meta calls it."""
    return {"version": META_VERSION, **meta}


def read_meta(folder: str | Path, what: str = "--calibration") -> dict:
    """meta.json of a calibration folder at this version (upgrade_meta), checked for the fields readers use (topk,
    holdout_ids)."""
    folder = Path(folder)
    what = f"{what} {folder}"
    if not (folder / META).is_file():
        raise WorkbenchError(f"{what}: not a finished calibration folder (no meta.json; run `workbench calibrate` "
                             "to completion)")
    meta = read_json(folder / META, what)
    meta = meta if "version" in meta else upgrade_meta(meta)
    if meta["version"] != META_VERSION:
        raise WorkbenchError(f"{what}: meta.json version {str(meta['version'])[:20]!r}, but this workbench reads "
                             f"calibrations of version {META_VERSION}: calibrate again with `workbench calibrate`")
    topk, held = meta.get("topk"), meta.get("holdout_ids", [])
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= 1 << 20:
        raise WorkbenchError(f"{what}: meta.json's topk should be a positive integer, found {str(topk)[:40]!r}")
    if not isinstance(held, list) or not all(isinstance(h, str) for h in held):
        raise WorkbenchError(f"{what}: meta.json's holdout_ids should be a list of prompt ids (strings)")
    return meta


def read_ranks(f: Path, what: str, topk: int = 1 << 15) -> pd.DataFrame:
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
                             "calibrate` with more prompts or --max-new-tokens")
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

    def __init__(self, folder: str | Path, what: str = "--calibration"):
        self.folder, self.what = Path(folder), what
        if not (self.folder / RANKS).is_file():
            raise WorkbenchError(f"{what} {folder}: not a finished calibration folder (no meta.json/ranks.parquet; "
                                 "run `workbench calibrate` to completion)")
        self.meta = read_meta(self.folder, what)
        self.holdout_ids = set(self.meta.get("holdout_ids", []))
        self._cache: dict = {}

    def __repr__(self) -> str:
        return f"Calibration({str(self.folder)!r})"

    def _cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def ranks(self, split: str = "all") -> pd.DataFrame:
        """The ranks frame of one split (all | fit | holdout)."""
        if split not in SPLITS:
            raise WorkbenchError(f"split {split!r}: use all, fit or holdout")
        every = self._cached("ranks", lambda: read_ranks(self.folder / RANKS, f"{self.what} {self.folder}",
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
        if not self.fits(tree):
            K, topk = self.accuracies("all").shape
            raise WorkbenchError(f"tree needs depth {tree.depth} and top-{tree.max_rank + 1} but the calibration has "
                                 f"{K} heads and top-{topk}")

    def fits(self, tree) -> bool:
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
        rows = self._cached(("rows", split, max_new_tokens), lambda: answer_rows(answers))
        return rows, self._cached(("steps", tuple(map(tuple, tree.sorted_paths)), split, max_new_tokens),
                                  lambda: walk_steps(tree, rows))

    def batch_replay(self, tree, batch: int, split: str = "holdout", max_new_tokens: int | None = None) -> float | None:
        """Tokens per step of `batch` of a split's answers decoded side by side (batch_walk: the batch waits for its
        slowest sequence); None without answers. What a batch's goodput divides by, where replay() is what each
        sequence measures."""
        answers = self.answers(split, max_new_tokens)
        if not len(answers):
            return None
        rows, steps = self._walk(tree, answers, split, max_new_tokens)
        return batch_walk(tree, rows, batch, steps)

    def predict(self, tree, max_new_tokens: int | None = None) -> dict[str, float]:
        """The three predicted tokens per step of a tree (names in the module docstring); predicted_replay only
        when the calibration holds out prompts. max_new_tokens cuts the replayed answers, as a sweep does."""
        self.check_fits(tree)
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
            raise WorkbenchError(f"{self.what} {self.folder}: meta.json does not say which prompts it used "
                                 "(prompts, limit)")
        records = [r for r in load_prompt_records(self.meta["prompts"], limit_) if r[0] in self.holdout_ids]
        if not records:
            raise WorkbenchError(f"--prompts holdout: calibration {self.folder} has no held-out prompts "
                                 "(calibrate with --holdout 0.2, or name a prompt set)")
        if limit is not None and limit <= 0:
            raise WorkbenchError(f"--limit {limit}: must be a positive number of prompts")
        return records[:limit] if limit else records

    def continuations(self) -> dict[str, list[int]]:
        """prompt_id -> the greedy answer's token ids."""
        return self._cached("cont", lambda: read_continuations(self.folder / CONTINUATIONS,
                                                               f"{self.what} {self.folder}"))

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
            raise WorkbenchError(f"{self.what} {self.folder}: {f.name} is not a readable continuations file "
                                 f"(prompt_tokens, continuation token lists; {type(e).__name__})") from None

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
