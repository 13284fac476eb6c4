"""What a plan predicts from: a calibration folder (Calibration.predict, for answers of the generation length), an
accuracy table (optimize.expected_length) or a per-position acceptance vector (chains only: 1 + the sum of the first K
entries). One producer of tokens/step per source; the plan says which statistic and answers it assumes (regime)."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.core.notes import FieldError, named, refused
from workbench.calibrate.folder import Calibration
from workbench.calibrate.served import Served, is_served
from workbench.core.io import read_csv, read_json
from workbench.trees.accuracies import read_accuracies
from workbench.trees.optimize import chain_value_fn, chain_values, expected_length, value_and_limits
from workbench.trees.tree import MEDUSA_TOPK, chain_tree, is_chain

PREDICTIONS = {"independent": "predicted_independent", "joint": "predicted_joint", "replay": "predicted_replay"}
MAX_POSITIONS = 64  # longest acceptance vector taken (a draft longer than any engine's limit is a typo)

# ----------------------------------------------------------------------------------------------- acceptance vectors

def check_acceptance(values, field: str | None = "acceptance", what: str = "") -> list[float]:
    """A per-position acceptance vector p_1 >= p_2 >= ... (p_k: the share of steps whose first k drafted tokens
    are all accepted, vLLM's `synthetic_acceptance_rates` convention), each in (0, 1]; one error line otherwise,
    naming the request's `field` that gave it and `what` (core.notes.named; field None: `what` alone)."""
    what = named(field, what)
    if not isinstance(values, (list, tuple)) or not values:
        raise refused(field, "empty", f"{what}: give a non-empty list of per-position acceptance rates like [0.7, 0.45, 0.3]")
    if len(values) > MAX_POSITIONS:
        raise refused(field, "too_long", f"{what}: {len(values)} positions; at most {MAX_POSITIONS} are taken")
    out = []
    for k, v in enumerate(values, 1):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < float(v) <= 1):
            raise refused(field, "out_of_range", f"{what}: position {k} has acceptance {str(v)[:20]!r}; every rate must be a number "
                          "in (0, 1] (drop positions that are never accepted)")
        if out and float(v) > out[-1] * (1 + 1e-12):
            raise refused(field, "rises", f"{what}: acceptance rises from {out[-1]:g} at position {k - 1} to {float(v):g} at "
                          f"position {k}: rates are unconditional (all of the first k tokens accepted), so "
                          "they never increase; convert conditional rates by taking running products")
        out.append(float(v))
    return out


def read_acceptance(path, field: str = "acceptance") -> list[float]:
    """An acceptance vector from a CSV `position,acceptance` (positions 1..K, or 0..K-1, each once), a JSON list
    (or an object holding one as `synthetic_acceptance_rates`, as in a vLLM --speculative-config) or a served
    calibration folder (calibrate/served.py: the engine's own counters), checked; its errors name the request's
    `field` that gave it (core.notes.FieldError)."""
    what = named(field, path)
    if Path(path).is_dir():
        return check_acceptance(Served(path, field).rates(), field, path)
    if str(path).lower().endswith(".json"):
        data = read_json(path, path, object, field)  # a list, or a config object holding one
        if isinstance(data, dict) and "synthetic_acceptance_rates" in data:
            data = data["synthetic_acceptance_rates"]
        return check_acceptance(data, field, path)
    df = read_csv(path, field, ("position", "acceptance"), "vLLM's per-position acceptance metrics")
    num = df[["position", "acceptance"]].apply(pd.to_numeric, errors="coerce")
    pos = num["position"]
    if num.isna().any().any() or (pos % 1 != 0).any() or not pos.between(0, 1 << 20).all():
        raise FieldError(field, "positions_not_numbers", f"{what}: position must be an integer and acceptance a number on every row")
    num = num.sort_values("position")
    start = int(num["position"].iloc[0])
    if start not in (0, 1) or num["position"].tolist() != list(range(start, start + len(num))):
        raise FieldError(field, "positions", f"{what}: positions must be 1..K (or 0..K-1), each once, found "
                         f"{', '.join(map(str, num['position'].astype(int).tolist()[:8]))}")
    return check_acceptance(num["acceptance"].astype(float).tolist(), field, path)


# ----------------------------------------------------------------------------------------------- sources

class Source:
    """What the planner weighs: the predicted tokens/step of a tree (`predict`) and of a batch of sequences side by
    side (`predict_batch`), the path values the optimal trees are built for (`value`, None for chains only), the
    depth / rank limits, the top-1 chain's per-position acceptance, the typical context a latency table is read at,
    and `info` (provenance; info["regime"] says which statistic and answers a prediction assumes). One producer of
    tokens/step per kind (the subclasses); each tree's is computed once per source, whatever the batch size."""

    def __init__(self, value, max_depth: int, max_rank: int, chain_acceptance: list[float], info: dict,
                 typical_context: float | None = None):
        self.value, self.max_depth, self.max_rank = value, max_depth, max_rank
        self.chain_acceptance, self.info, self.typical_context = chain_acceptance, info, typical_context
        self._memo: dict = {}

    def predict(self, tree) -> float:
        if tree not in self._memo:
            self._memo[tree] = float(self._predict(tree))
        return self._memo[tree]

    def predict_batch(self, tree, batch: int, cost=None) -> float:
        """Tokens/step of `batch` sequences side by side (their goodput divides by it: the batch steps until its
        slowest sequence is done; `cost` prices its tail steps where the engine drops finished sequences). A source
        without per-answer steps takes the mean's."""
        return self.predict(tree)

    def _predict(self, tree) -> float:
        raise NotImplementedError

    def limited(self, max_depth: int | None = None, max_rank: int | None = None, value=None) -> "Source":
        """This source within tighter depth / rank limits (a chain deeper than max_depth is no candidate either),
        optionally with other path values to build the optimal trees from (the tokens/step stay this source's)."""
        out = copy.copy(self)
        out.max_depth = min(self.max_depth, max_depth or self.max_depth)
        out.max_rank = min(self.max_rank, max_rank or self.max_rank)
        out.chain_acceptance = self.chain_acceptance[:out.max_depth]
        out.value = self.value if value is None else value
        return out


class ChainSource(Source):
    """A per-position acceptance vector (chains only): a chain of K predicts 1 + the sum of its first K rates, or
    1 + the sum of K's own rates where `own` holds them (a served calibration's run at that K: a K-token drafter's
    acceptance is not a longer one's first K positions, calibrate/served.py)."""

    def __init__(self, rates: list[float], path: str, served: dict | None = None,
                 own: dict[int, list[float]] | None = None):
        own = {k: list(r) for k, r in (own or {}).items()}
        how = "1 + sum of K's own run's rates where K was served, else of the first K rates" if own else \
            "1 + sum of the first K rates"
        super().__init__(None, len(rates), 1, rates, dict(kind="acceptance", path=path, num_heads=len(rates),
                                                          prediction=how, **(served or {})))
        self.own = own

    def _value(self, path) -> float:
        return chain_value_fn(self.chain_acceptance)(path)

    def _predict(self, tree) -> float:
        if is_chain(tree) and tree.depth in self.own:
            return 1.0 + float(np.sum(self.own[tree.depth][:tree.depth]))
        return expected_length(tree, self._value)


class ValueSource(Source):
    """Path values: an accuracy table acc[K, R] (independent heads) or a monotone path-value function such as
    Calibration.joint_value; tokens/step is optimize.expected_length of them (no answers: a batch's is the mean's)."""

    def __init__(self, value, max_depth: int | None = None, max_rank: int | None = None, info: dict | None = None,
                 what: str = "the ranking"):
        fn, depth, rank = value_and_limits(value, max_depth, max_rank, what)
        super().__init__(value, depth, rank, chain_values(fn, depth), info or {})
        self._paths = value

    def _predict(self, tree) -> float:
        return expected_length(tree, self._paths)


class CalibrationSource(Source):
    """A calibration folder's prediction `key` (PREDICTIONS) for answers of `length` tokens (Calibration.predict);
    a batch's tokens/step is the replay's Calibration.batch_replay, the other statistics take the mean's."""

    def __init__(self, cal: Calibration, key: str, value, depth: int, rank: int, length: int | None, info: dict):
        fn = value_and_limits(value, depth, rank)[0]
        super().__init__(value, depth, rank, chain_values(fn, depth), info, cal.typical_context(length))
        self.cal, self.key, self.length = cal, key, length

    def _predict(self, tree) -> float:
        return self.cal.predict(tree, self.length)[self.key]

    def predict_batch(self, tree, batch: int, cost=None) -> float:
        if self.key != "predicted_replay":
            return self.predict(tree)
        return self.cal.batch_replay(tree, batch, "holdout", self.length, cost)


def plan_source(calibration=None, accuracies=None, acceptance=None, prediction: str = "replay",
                max_rank: int = MEDUSA_TOPK, max_new_tokens: int | None = None) -> Source:
    """What the planner weighs, from exactly one source: a calibration (calibration_source: `prediction` independent,
    joint or replay, for answers of `max_new_tokens` tokens, default the calibration's own length; trees are optimal
    for the joint paths unless independent), an accuracy table (expected_length) or an acceptance vector (chains
    only)."""
    if sum(x is not None for x in (calibration, accuracies, acceptance)) != 1:
        raise FieldError("calibration", "not_one_source", "give one of {field} DIR, {also} FILE or {also2} FILE",
                         also=("accuracies", "acceptance"))
    if calibration is not None and is_served(calibration):  # the engine's counters: a chain's acceptance vector
        calibration, acceptance = None, calibration
    if acceptance is not None and is_served(acceptance):
        return served_source(Served(acceptance), str(acceptance))
    if acceptance is not None:
        return ChainSource(read_acceptance(acceptance), str(acceptance))
    if accuracies is not None:
        return accuracy_source(read_accuracies(accuracies), str(accuracies), max_rank)
    return calibration_source(Calibration(calibration), prediction, max_rank, max_new_tokens)


def served_source(served: Served, path: str | None = None) -> Source:
    """The Source of an opened served calibration (the engine's counters, any drafter): a chain drafter's per-step
    acceptance (Served.rates), each K's chain priced on K's own run where the calibration served one (a version-1
    folder or a scrape: the largest K's first K positions), with the setting it was served in (`path` names it,
    default its folder)."""
    path = str(served.folder) if path is None else path
    own = {k: served.rates(k) for k in served.per_k} if len(served.per_k) > 1 else None
    return ChainSource(check_acceptance(served.rates(), served.field, path), path, served.info(), own)


def chain_accuracies(rates: list[float]) -> np.ndarray:
    """acc[K, 1] of a chain's per-position acceptance p_1 >= p_2 >= ...: position k's rate given the first k - 1
    accepted (p_k / p_{k-1}), so the independence product of the first k is p_k again (a chain drafter as heads)."""
    return np.array([[r / p] for r, p in zip(rates, [1.0] + list(rates[:-1]))])


def accuracy_source(acc, path: str, max_rank: int = MEDUSA_TOPK) -> Source:
    """The Source of an accuracy table acc[K, R] (independent heads; `path` names it)."""
    rank = min(max_rank, acc.shape[1])
    return ValueSource(acc, None, rank, dict(kind="accuracies", path=path, prediction="predicted_independent",
                                             num_heads=acc.shape[0], regime=regime("predicted_independent", None)))


def calibration_source(cal: Calibration, prediction: str = "replay", max_rank: int = MEDUSA_TOPK,
                       max_new_tokens: int | None = None) -> Source:
    """The Source of an opened calibration folder."""
    if prediction not in PREDICTIONS:
        raise FieldError("prediction", "unknown", f"{{field}} {prediction!r}: use {', '.join(PREDICTIONS)}")
    calibration = cal.folder
    acc = cal.accuracies("fit")
    key = PREDICTIONS[prediction]
    value = acc if prediction == "independent" else cal.joint_value("fit")
    depth, rank = acc.shape[0], min(max_rank, acc.shape[1])
    if key not in cal.predict(chain_tree(1)):
        raise FieldError("calibration", "no_holdout",
                         f"{{field}} {calibration}: holds out no prompts, so there is no replay prediction; "
                         "use {also} joint or independent (or calibrate with {also2} 0.2)",
                         also=("prediction", "holdout"))
    meta = cal.meta
    length = generation_length(cal, max_new_tokens)
    return CalibrationSource(cal, key, value, depth, rank, length,
                             dict(kind="calibration", path=str(calibration), prediction=key, model=meta.get("model"),
                                  heads=meta.get("heads"), heads_sha256=(meta.get("args") or {}).get("heads_sha256"),
                                  num_heads=depth, max_new_tokens=length, regime=regime(key, length)))


def generation_length(cal: Calibration, max_new_tokens: int | None) -> int | None:
    """The answer length predictions are made for: `max_new_tokens`, at most the calibration's own answers' (its
    meta max_new_tokens: longer answers were never measured), default that."""
    have = cal.meta.get("max_new_tokens")
    if max_new_tokens is None:
        return have if isinstance(have, int) and have > 0 else None
    if max_new_tokens < 1:
        raise FieldError("max_new_tokens", "below_one", f"{{field}} {max_new_tokens}: must be >= 1")
    if isinstance(have, int) and max_new_tokens > have:
        raise FieldError("max_new_tokens", "past_answers",
                         f"{{field}} {max_new_tokens}: the calibration's answers are {have} tokens long, so "
                         f"acceptance past token {have} was never measured; plan for <= {have} or calibrate with "
                         "a larger {field}")
    return max_new_tokens


def regime(prediction: str, max_new_tokens: int | None) -> str:
    """In words: what a calibration prediction assumes, and why (docs/prediction.md)."""
    cut = f"the first {max_new_tokens} tokens of" if max_new_tokens else "all of"
    if prediction == "predicted_replay":
        return (f"a greedy decoder replayed over {cut} each held-out prompt's greedy answer: tokens/step = tokens / "
                "steps at the positions a decoder starts its steps at (the statistic live decoding measures; the "
                "answers are cut to the generation length because acceptance rises along an answer)")
    what = "measured joint path frequencies" if prediction == "predicted_joint" else "independent head accuracies"
    return (f"{what} of the fit prompts, averaged over every position of {cut} their answers: over-predicts a live "
            "decoder, which starts its steps only at the positions after each accepted run (harder on average)")
