"""A served calibration: per-position acceptance as the engine counted it while serving, for any drafter it runs
(n-gram, draft model, EAGLE, MTP, Medusa), where our own calibration (folder.py) measures Medusa heads only.

Why the engine's counters: they are what the deployment sees (its drafter, its prompts, its proposer's own rules,
such as n-gram proposing nothing where no n-gram matches), and vLLM keeps them for every drafter alike. What they
are (vLLM 0.32.0, vllm/v1/spec_decode/metrics.py and vllm/v1/core/sched/scheduler.py): per verify step of a
request that drafted (drafts = steps with >= 1 draft token; a step without a draft is not counted),
`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
`..._num_accepted_tokens_per_pos{position="i"}` (i = 0..K-1: steps whose first i+1 draft tokens were all accepted),
Prometheus counters labelled model_name and engine (exposed with a `_total` suffix); the same counts per request
with `per_request_spec_decode_metrics` (an acceptance histogram, and per step with "detailed").

Read from: two `/metrics` scrapes of a running server or vLLM's per-request statistics (served_read.py), or a vLLM
run of `workbench calibrate --engine vllm` (the same counts, summed from its per-request records). Written as a folder:
  meta.json       kind "served", the setting (engine, version, method, K, model, prompts, source), the largest K's
                  totals and `per_k`: the totals of each smaller K served in a run of its own (none for a scrape)
  acceptance.csv  the largest K's position (1..K), drafts (drafts that reached the position: all drafts at 1, else
                  those whose earlier tokens were all accepted), accepted, conditional (accepted / drafts), marginal
                  (accepted / all drafts: vLLM's "per-position acceptance rate")
  acceptance_per_k.csv  the same columns per smaller K (num_speculative_tokens first), where one was served
A plan reads `rates(k)`: per decoding step where the steps are known (a run of ours counts them: an n-gram drafter
drafts on only some steps), else per draft; K's own run's where one was served, else the largest K's first k.
Why a run per K: a K-token drafter's acceptance is not the first K positions of a longer one's. Its drafts start
only after the previous round's accepted run (a K = 4 round starts after up to 5 tokens, at harder positions than
a K = 1 round), for every drafter; and the proposals themselves change with K for n-gram (it proposes only where
K tokens follow the match; vLLM 0.32, copy-edit, held-out prompts: 1 + the K = 4 run's first per-step rate 1.232,
a K = 1 run 1.401) and suffix decoding (its tree is cut at K). So `calibrate --engine vllm` serves every drafter
at each K, Medusa heads too (their guesses do not depend on K, their start positions do). Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench import WorkbenchError
from workbench.core.data import load_prompt_records
from workbench.core.notes import FieldError, flag, named, refused
from workbench.core.speed import draft_tokens_per_step
from workbench.core.io import atomic_write_json, atomic_write_text, read_csv, read_json

META, TABLE, PER_K_TABLE = "meta.json", "acceptance.csv", "acceptance_per_k.csv"
KIND, SERVED_VERSION = "served", 2  # 2: per_k and draft_tokens_per_step (upgrade_served reads 1)
MAX_K = 64  # the longest draft taken (plan.source's MAX_POSITIONS)
# vLLM 0.32.0's drafters (vllm/config/speculative.py SpeculativeMethod, less the model-specific MTP aliases, which
# it renames to "mtp", and custom_class)
VLLM_DRAFTERS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "mtp", "dflash",
                 "extract_hidden_states", "ngram_gpu", "dspark")


@dataclass(frozen=True)
class ServedCounts:
    """The engine's spec-decode counts over one stretch of serving: K positions, `per_pos[i]` drafts whose first
    i+1 tokens were accepted; `decode_steps` (None: unknown) every decoding step, drafted or not."""
    k: int
    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]
    decode_steps: int | None = None

    def table(self) -> pd.DataFrame:
        reached = (self.drafts,) + self.per_pos[:-1]
        return pd.DataFrame({"position": range(1, self.k + 1), "drafts": reached, "accepted": self.per_pos,
                             "conditional": [a / r if r else math.nan for a, r in zip(self.per_pos, reached)],
                             "marginal": [a / self.drafts for a in self.per_pos]})

    def totals(self) -> dict:
        return dict(num_speculative_tokens=self.k, num_drafts=self.drafts, num_draft_tokens=self.draft_tokens,
                    num_accepted_tokens=self.accepted, decode_steps=self.decode_steps,
                    mean_acceptance_length=1 + self.accepted / self.drafts,
                    draft_share=None if not self.decode_steps else min(self.drafts / self.decode_steps, 1.0),
                    draft_tokens_per_step=draft_tokens_per_step(self.draft_tokens, self.decode_steps))

    def per_step(self) -> list[float]:
        """Per-position acceptance per decoding step where the steps are known, else per draft (every position)."""
        return [a / (self.decode_steps or self.drafts) for a in self.per_pos]


def checked_counts(k: int, drafts: int, draft_tokens: int, accepted: int, per_pos, what,
                   decode_steps: int | None = None, field: str | None = None) -> ServedCounts:
    """ServedCounts after the rules vLLM's own counting obeys (SpecDecodingStats.observe_draft): a break is two
    sources mixed or a damaged file, one error line naming `what` (after the request's `field` that gave it where
    one did: core.notes.named)."""
    what = named(field, what)
    per_pos = tuple(int(x) for x in per_pos)
    if drafts <= 0:
        raise refused(field, "no_drafts", f"{what}: no drafts were counted (vllm:spec_decode_num_drafts did not grow): serve "
                      "requests between the two scrapes, with speculation on")
    if not 1 <= k <= MAX_K or len(per_pos) != k:
        raise refused(field, "positions", f"{what}: {len(per_pos)} draft positions, need 1..{MAX_K}")
    bad = (sum(per_pos) != accepted or accepted > draft_tokens or draft_tokens > drafts * k
           or any(b > a for a, b in zip((drafts,) + per_pos, per_pos)) or min(per_pos) < 0)
    if bad:
        raise refused(field, "counts_disagree", f"{what}: the counts disagree (accepted per position {list(per_pos)[:8]} should sum "
                      f"to the {accepted} accepted tokens, never rise along the draft, and stay within "
                      f"{drafts} drafts of {draft_tokens} tokens): counters from two servers or two runs "
                      "mixed; scrape one server twice")
    if decode_steps is not None and decode_steps < drafts:
        decode_steps = None  # a stop token inside a draft ends a request early: then the steps are not known
    return ServedCounts(k, drafts, draft_tokens, accepted, per_pos, decode_steps)


# ----------------------------------------------------------------------------------------------- the folder

def check_method(method: str | None, engine_version: str | None = None) -> str:
    if method is None:
        raise FieldError("method", "missing", f"give {{field}}: the drafter vLLM serves ({', '.join(VLLM_DRAFTERS)}; "
                         "medusa with {also} DIR)", also="heads")
    if method not in VLLM_DRAFTERS:
        raise FieldError("method", "unknown",
                         f"{{field}} {method}: vLLM {engine_version or '0.32.0'} has no such drafter; its "
                         f"drafters are {', '.join(VLLM_DRAFTERS)}")
    return method


def cut(counts: ServedCounts, k: int | None) -> ServedCounts:
    """The first k positions (None: all); k beyond what the drafter proposed is an error."""
    if k is None or k == counts.k:
        return counts
    if not 1 <= k <= counts.k:
        raise FieldError("k", "past_drafts", f"{{field}} {k}: the drafter proposed at most {counts.k} tokens per "
                         f"draft (vLLM's num_speculative_tokens), so acceptance past position {counts.k} was never "
                         f"measured; give {{field}} 1..{counts.k} or serve with a larger num_speculative_tokens")
    per_pos = counts.per_pos[:k]
    tokens = min(counts.draft_tokens, counts.drafts * k)  # the tokens drafted at positions 1..k (an upper bound)
    return ServedCounts(k, counts.drafts, tokens, sum(per_pos), per_pos, counts.decode_steps)


def write_served(folder, counts: ServedCounts, setting: dict, per_k=()) -> Path:
    """The served calibration folder: acceptance.csv (and acceptance_per_k.csv: `per_k`, each smaller K's own run),
    then meta.json (last: it marks the folder finished)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    per_k = sorted(per_k, key=lambda c: c.k)
    if any(not 1 <= c.k < counts.k for c in per_k) or len({c.k for c in per_k}) < len(per_k):
        raise WorkbenchError(f"per-K runs at K = {[c.k for c in per_k]}: each K once, below {counts.k}")
    atomic_write_text(folder / TABLE, counts.table().to_csv(index=False), "out")
    if per_k:
        table = pd.concat([c.table().assign(num_speculative_tokens=c.k) for c in per_k])
        atomic_write_text(folder / PER_K_TABLE, table[["num_speculative_tokens", *counts.table().columns]].to_csv(
            index=False), "out")
    else:
        (folder / PER_K_TABLE).unlink(missing_ok=True)
    atomic_write_json(folder / META, dict(kind=KIND, version=SERVED_VERSION, **setting, **counts.totals(),
                                          per_k=[c.totals() for c in per_k]), "out")
    return folder


def upgrade_served(meta: dict) -> dict:
    """A served meta.json of any version as the current one reads it: version 1 served the largest K only (per_k
    empty: K < that is read off its first positions) and kept no drafting rate."""
    if meta.get("version") == 1:
        drafts, steps = meta.get("num_draft_tokens"), meta.get("decode_steps")
        meta = dict(meta, version=SERVED_VERSION, per_k=[], draft_tokens_per_step=draft_tokens_per_step(
            drafts, steps) if isinstance(drafts, int) and isinstance(steps, int) else None)
    return meta


def is_served(path) -> bool:
    """Whether `path` is a folder whose meta.json says kind "served" (never raises: a caller's reader says why)."""
    try:
        return Path(path).is_dir() and read_json(Path(path) / META, str(path)).get("kind") == KIND
    except (WorkbenchError, OSError, AttributeError):
        return False


def list_served(roots) -> list[Path]:
    """The served calibration folders directly under each of `roots`, by name (folder.list_calibrations lists ours):
    what the app offers beside our calibrations."""
    found = {f for root in map(Path, roots) if root.is_dir() for f in root.iterdir() if is_served(f)}
    return sorted(found, key=lambda f: (f.name, str(f)))


class Served:
    """A finished served calibration folder, checked on opening."""

    def __init__(self, folder, field: str = "acceptance"):
        """`field`: the request field that named the folder: every error of opening it names it (FieldError)."""
        self.folder, self.field, what = Path(folder), field, f"{flag(field)} {folder}"
        try:
            self._open(what)
        except FieldError:
            raise
        except WorkbenchError as e:  # each worded `--field folder: ...` (`what`)
            if not str(e).startswith(what + ":"):
                raise
            raise FieldError(field, "not_served", "{field}" + str(e)[len(flag(field)):]) from None

    def _open(self, what: str) -> None:
        if not (self.folder / META).is_file():
            raise WorkbenchError(f"{what}: not a served calibration (no {META}; write one with `workbench calibrate "
                                 "--engine vllm` or `--metrics`)")
        self.meta = upgrade_served(read_json(self.folder / META, self.folder, dict, self.field))
        if self.meta.get("kind") != KIND or self.meta.get("version") != SERVED_VERSION:
            raise WorkbenchError(f"{what}: meta.json is not a served calibration of version {SERVED_VERSION} "
                                 f"(kind {str(self.meta.get('kind'))[:20]!r}): write it again")
        df = read_csv(self.folder / TABLE, self.field, ("position", "drafts", "accepted"), "workbench calibrate "
                      "--engine vllm")
        self.counts = _counts(df, self.meta, what, TABLE)
        runs = self.meta.get("per_k")
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            raise WorkbenchError(f"{what}: meta.json per_k should be a list of each K's totals: write it again")
        table = read_csv(self.folder / PER_K_TABLE, self.field, ("num_speculative_tokens", "position", "drafts",
                                                                 "accepted"), "workbench calibrate --engine vllm") \
            if runs else None
        self.per_k = {self.counts.k: self.counts}  # every K served in a run of its own
        for r in runs:
            k = r.get("num_speculative_tokens")
            if not isinstance(k, int) or not 1 <= k < self.counts.k or k in self.per_k:
                raise WorkbenchError(f"{what}: meta.json per_k has K = {str(k)[:10]}: each K once, below "
                                     f"{self.counts.k}; write it again")
            ks = pd.to_numeric(table["num_speculative_tokens"], errors="coerce")
            self.per_k[k] = _counts(table[ks == k], r, what, f"{PER_K_TABLE} (K = {k})", k)
        self.per_k = dict(sorted(self.per_k.items()))

    def rates(self, k: int | None = None) -> list[float]:
        """Per-position acceptance of a chain of K = k (None: the largest K) for a plan (unconditional, p_i: the
        first i drafted tokens all accepted; ServedCounts.per_step), from K's own run where one was served, else
        the largest K's first k positions; up to the last position ever accepted."""
        c = self.per_k.get(self.counts.k if k is None else k, self.counts)
        out = c.per_step()[:k]
        while out and out[-1] <= 0:
            out.pop()
        if not out and k is None:
            raise WorkbenchError(f"{self.folder}: no drafted token was ever accepted: speculation never pays here")
        return out

    def served_prompt_ids(self) -> list[str]:
        """The ids of the prompts vLLM served for it (a run of ours records them; a scrape does not know them)."""
        ids = (self.meta.get("setting") or {}).get("prompt_ids") if isinstance(self.meta.get("setting"), dict) else None
        return [str(i) for i in ids] if isinstance(ids, list) else []

    def holdout_prompts(self) -> list[tuple[str, str]]:
        """[(prompt_id, text)] of the prompts the run held out (never served: `calibrate --holdout`), in file order."""
        held, limit = self.meta.get("holdout_ids") or [], self.meta.get("limit")
        if not isinstance(self.meta.get("prompts"), str) or not held:
            raise FieldError("prompts", "no_holdout", f"{{field}} holdout: the served calibration {self.folder} held "
                             "no prompts out (a scrape's, or a run before {also}): name a prompt set ({field}) or "
                             "calibrate again with `calibrate --engine vllm --holdout 0.25`", also="holdout")
        return [r for r in load_prompt_records(self.meta["prompts"], limit if isinstance(limit, int) else None)
                if r[0] in set(map(str, held))]

    def info(self) -> dict:
        """Provenance for a plan's source: the setting it was served in and the statistic its rates are."""
        m = self.meta
        per = "decoding step" if self.counts.decode_steps else "draft (the steps without a draft are not counted)"
        return dict(served=True, engine=m.get("engine"), engine_version=m.get("engine_version"),
                    method=m.get("method"), draft_model=m.get("draft_model"), model=m.get("model"),
                    prompts=m.get("prompts"), num_speculative_tokens=self.counts.k, num_drafts=self.counts.drafts,
                    source=m.get("source"), per_k_runs=list(self.per_k),
                    regime=f"{m.get('engine')} {m.get('engine_version') or ''} served {m.get('method')} at "
                    f"K={', '.join(map(str, self.per_k))}" + (" (each in a run of its own)" if len(self.per_k) > 1
                                                              else "") + f": acceptance per {per}")


def _counts(df: pd.DataFrame, totals: dict, what: str, name: str, k: int | None = None) -> ServedCounts:
    """One K's ServedCounts from its table rows (positions 1..K: drafts, accepted) and its totals (meta.json)."""
    num = df[["position", "drafts", "accepted"]].apply(pd.to_numeric, errors="coerce")
    drafts, steps = totals.get("num_drafts"), totals.get("decode_steps")
    if (num.isna().any().any() or (num % 1 != 0).any().any() or num["position"].tolist() !=
            list(range(1, (k or len(num)) + 1)) or not isinstance(drafts, int) or isinstance(drafts, bool)
            or not (steps is None or isinstance(steps, int) and steps >= drafts)):
        raise WorkbenchError(f"{what}: {name} should hold integer positions 1..K with their drafts and accepted "
                             "counts, and meta.json num_drafts (and decode_steps >= it): write it again")
    return checked_counts(len(num), drafts, int(totals.get("num_draft_tokens", -1)), int(num["accepted"].sum()),
                          num["accepted"].astype(int).tolist(), what, steps)
