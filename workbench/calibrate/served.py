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

Read from: two `/metrics` scrapes of a running server (the difference; one scrape: since the server started),
vLLM's per-request statistics (JSON or JSON lines of `metrics.speculative_decoding` objects), or a vLLM run of
`workbench calibrate --engine vllm` (the same counts, summed from its per-request records). Written as a folder:
  meta.json       kind "served", the setting (engine, version, method, K, model, prompts, source) and the totals
  acceptance.csv  position (1..K), drafts (drafts that reached the position: all drafts at 1, else those whose
                  earlier tokens were all accepted), accepted, conditional (accepted / drafts), marginal (accepted /
                  all drafts: vLLM's "per-position acceptance rate")
A plan reads `rates()`: per decoding step where the steps are known (a run of ours counts them: an n-gram drafter
drafts on only some steps), else per draft. Torch-free.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench import WorkbenchError
from workbench.core.data import load_prompt_records
from workbench.core.notes import FieldError, flag, named, refused
from workbench.core.io import atomic_write_json, atomic_write_text, read_csv, read_json

META, TABLE = "meta.json", "acceptance.csv"
KIND, SERVED_VERSION = "served", 1
MAX_K = 64  # the longest draft taken (plan.source's MAX_POSITIONS)
# vLLM 0.32.0's drafters (vllm/config/speculative.py SpeculativeMethod, less the model-specific MTP aliases, which
# it renames to "mtp", and custom_class)
VLLM_DRAFTERS = ("ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "mtp", "dflash",
                 "extract_hidden_states", "ngram_gpu", "dspark")
SPEC = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


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
                    draft_share=None if not self.decode_steps else min(self.drafts / self.decode_steps, 1.0))


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


# ----------------------------------------------------------------------------------------------- Prometheus

def parse_metrics(text: str, what: str) -> dict[tuple, float]:
    """vLLM's spec-decode counters (and its generation/request counters and running gauges) of one `/metrics`
    text: {(name without vllm: and _total, labels as sorted (key, value) pairs): value}. A series twice in one
    text is two scrapes pasted together."""
    out: dict[tuple, float] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise WorkbenchError(f"{what}: line {n} is not Prometheus text ({line[:60]!r}): give the text a "
                                 "server's /metrics returns (curl http://HOST:PORT/metrics > before.prom)")
        name, labels, value = m.groups()
        if not name.startswith("vllm:") or name.endswith("_created"):
            continue
        base = name[len("vllm:"):].removesuffix("_total")
        if not (base.startswith("spec_decode_") or base in ("generation_tokens", "request_success",
                                                             "num_requests_running", "num_requests_waiting")):
            continue
        pairs = tuple(sorted((k, v) for k, v in _LABEL.findall(labels or "")))
        try:
            val = float(value)
        except ValueError:
            raise WorkbenchError(f"{what}: line {n}: {name} has value {value[:20]!r}, not a number") from None
        if not math.isfinite(val) or val < 0:
            raise WorkbenchError(f"{what}: line {n}: {name} is {value[:20]}: a counter is a finite count >= 0 (a "
                                 "damaged scrape)")
        if (base, pairs) in out:
            raise WorkbenchError(f"{what}: {name}{dict(pairs)} appears twice: two scrapes (or two servers) pasted "
                                 "into one file; give each scrape its own file")
        out[(base, pairs)] = val
    return out


def _servers(series: dict, what: str) -> dict[tuple, dict]:
    """{server labels (all but position): {counter: value, "per_pos": {i: value}}} of the spec-decode series."""
    found: dict[tuple, dict] = {}
    for (base, pairs), v in series.items():
        if not base.startswith("spec_decode_"):
            continue
        name = base[len("spec_decode_"):]
        labels = tuple(p for p in pairs if p[0] != "position")
        entry = found.setdefault(labels, {"per_pos": {}})
        if name == PER_POS:
            pos = dict(pairs).get("position", "")
            if not pos.isdigit():
                raise WorkbenchError(f"{what}: {SPEC}{PER_POS} with position {pos[:10]!r}: need 0, 1, ...")
            entry["per_pos"][int(pos)] = v
        elif name in COUNTERS:
            entry[name] = v
    if not found:
        raise WorkbenchError(f"{what}: no speculative-decoding counters ({SPEC}num_drafts and the others): the "
                             "server runs without --speculative-config, or this is not vLLM's /metrics text")
    models = {dict(lab).get("model_name") for lab in found}
    if len(models) > 1:
        raise WorkbenchError(f"{what}: counters of {len(models)} models ({', '.join(sorted(map(str, models)))}): "
                             "scrapes of two servers mixed; scrape one server")
    for lab, e in found.items():
        missing = [c for c in COUNTERS if c not in e]
        pos = sorted(e["per_pos"])
        if missing or not pos or pos != list(range(len(pos))):
            raise WorkbenchError(f"{what}: server {dict(lab)} lacks {', '.join(missing) or 'positions 0..K-1 of '}"
                                 f"{'' if missing else PER_POS}: a partial scrape; scrape /metrics whole")
    return found


def _gauge_idle(series: dict) -> bool:
    vals = [v for (b, _), v in series.items() if b in ("num_requests_running", "num_requests_waiting")]
    return bool(vals) and not any(vals)


def _summed(series: dict, base: str) -> float | None:
    vals = [v for (b, _), v in series.items() if b == base]
    return sum(vals) if vals else None


def metrics_counts(texts: list[tuple[str, str]]) -> tuple[ServedCounts, dict]:
    """ServedCounts from one or two `/metrics` texts [(what, text)] (two: after minus before), and facts about them
    (model_name, engines). Several engines of one model (data parallel) are summed. The decoding steps are known
    only when no request was in flight at either scrape (then generation tokens - accepted - finished requests)."""
    parsed = [parse_metrics(t, w) for w, t in texts]
    servers = [_servers(p, w) for p, (w, _) in zip(parsed, texts)]
    what = " and ".join(w for w, _ in texts)
    if len(servers) == 2 and set(servers[0]) != set(servers[1]):
        raise WorkbenchError(f"{what}: the scrapes come from different servers (labels {sorted(map(dict, servers[0]))} "
                             f"then {sorted(map(dict, servers[1]))}): scrape the same server twice")
    last = servers[-1]
    ks = {len(e["per_pos"]) for s in servers for e in s.values()}
    if len(ks) > 1:
        raise WorkbenchError(f"{what}: the scrapes count {sorted(ks)} draft positions: two servers (or a restart "
                             "with another num_speculative_tokens) mixed; scrape one server twice")
    k = ks.pop()

    def delta(get) -> int:
        total = 0
        for lab in last:
            after, before = get(last[lab]), get(servers[0][lab]) if len(servers) == 2 else 0.0
            if after < before:
                raise WorkbenchError(f"{what}: a counter went down between the scrapes ({before:g} -> {after:g}): the "
                                     "server restarted, the scrapes come from two servers, or they are in the wrong order "
                                     "(give BEFORE then AFTER)")
            total += after - before
        return int(round(total))

    counts = [delta(lambda e, c=c: e[c]) for c in COUNTERS]
    per_pos = [delta(lambda e, i=i: e["per_pos"][i]) for i in range(k)]
    steps = None
    if all(_gauge_idle(p) for p in parsed):
        gen = [_summed(p, "generation_tokens") for p in parsed]
        done = [_summed(p, "request_success") for p in parsed]
        if None not in gen and None not in done:
            before = (gen[0], done[0]) if len(parsed) == 2 else (0.0, 0.0)
            steps = int(round(gen[-1] - before[0] - counts[2] - (done[-1] - before[1])))
    facts = dict(model_name=dict(next(iter(last))).get("model_name"),
                 engines=sorted(str(dict(lab).get("engine")) for lab in last))
    return checked_counts(k, *counts, per_pos, what, steps), facts


# ----------------------------------------------------------------------------------------------- per request

def _request_metrics(row, n: int, what: str) -> dict:
    for key in ("metrics", "speculative_decoding"):
        if isinstance(row, dict) and isinstance(row.get(key), dict) and "acceptance_histogram" not in row:
            row = row[key]
    if isinstance(row, dict) and isinstance(row.get("speculative_decoding"), dict):
        row = row["speculative_decoding"]
    hist = row.get("acceptance_histogram") if isinstance(row, dict) else None
    if not isinstance(hist, list) or len(hist) < 2 or not all(isinstance(h, int) and h >= 0 for h in hist):
        raise WorkbenchError(f"{what}: record {n} has no acceptance_histogram (vLLM's per-request "
                             "speculative_decoding metrics: serve with --per-request-spec-decode-metrics summary)")
    tokens = row.get("num_draft_tokens")
    if not isinstance(tokens, int) or tokens < 0:
        raise WorkbenchError(f"{what}: record {n} has no num_draft_tokens count")
    return dict(hist=hist, tokens=tokens)


def request_counts(path, what: str) -> ServedCounts:
    """ServedCounts summed over vLLM's per-request statistics: a JSON list or JSON lines of response objects (their
    metrics.speculative_decoding) or of those objects themselves; every request of one K."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"{what}: no such file")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    except ValueError:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError:
            raise WorkbenchError(f"{what}: neither JSON nor JSON lines (vLLM's per-request statistics, one "
                                 "response or metrics object per line)") from None
    recs = [_request_metrics(r, i + 1, what) for i, r in enumerate(rows)]
    if not recs:
        raise WorkbenchError(f"{what}: no requests in the file")
    ks = {len(r["hist"]) - 1 for r in recs}
    if len(ks) > 1:
        raise WorkbenchError(f"{what}: requests served at K = {', '.join(map(str, sorted(ks)))}: two servers (or "
                             "configs) mixed; give one server's requests")
    k = ks.pop()
    hist = [sum(r["hist"][j] for r in recs) for j in range(k + 1)]
    per_pos = [sum(hist[i + 1:]) for i in range(k)]
    return checked_counts(k, sum(hist), sum(r["tokens"] for r in recs), sum(j * h for j, h in enumerate(hist)),
                          per_pos, what)


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


def write_served(folder, counts: ServedCounts, setting: dict) -> Path:
    """The served calibration folder: acceptance.csv, then meta.json (last: it marks the folder finished)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / TABLE, counts.table().to_csv(index=False), "out")
    atomic_write_json(folder / META, dict(kind=KIND, version=SERVED_VERSION, **setting, **counts.totals()), "out")
    return folder


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
        self.meta = read_json(self.folder / META, self.folder, dict, self.field)
        if self.meta.get("kind") != KIND or self.meta.get("version") != SERVED_VERSION:
            raise WorkbenchError(f"{what}: meta.json is not a served calibration of version {SERVED_VERSION} "
                                 f"(kind {str(self.meta.get('kind'))[:20]!r}): write it again")
        df = read_csv(self.folder / TABLE, self.field, ("position", "drafts", "accepted"), "workbench calibrate "
                      "--engine vllm")
        num = df[["position", "drafts", "accepted"]].apply(pd.to_numeric, errors="coerce")
        drafts, steps = self.meta.get("num_drafts"), self.meta.get("decode_steps")
        if (num.isna().any().any() or (num % 1 != 0).any().any() or num["position"].tolist() !=
                list(range(1, len(num) + 1)) or not isinstance(drafts, int) or isinstance(drafts, bool)
                or not (steps is None or isinstance(steps, int) and steps >= drafts)):
            raise WorkbenchError(f"{what}: {TABLE} should hold integer positions 1..K with their drafts and accepted "
                                 "counts, and meta.json num_drafts (and decode_steps >= it): write it again")
        self.counts = checked_counts(len(num), drafts, int(self.meta.get("num_draft_tokens", -1)),
                                     int(num["accepted"].sum()), num["accepted"].astype(int).tolist(), what, steps)

    def rates(self) -> list[float]:
        """Per-position acceptance for a plan (unconditional, p_k: the first k drafted tokens all accepted), up to
        the last position ever accepted: per decoding step where the steps are known, else per draft."""
        c = self.counts
        base = c.decode_steps or c.drafts
        out = [a / base for a in c.per_pos]
        while out and out[-1] <= 0:
            out.pop()
        if not out:
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
                    source=m.get("source"), regime=f"{m.get('engine')} {m.get('engine_version') or ''} served "
                    f"{m.get('method')} at K={self.counts.k}: acceptance per {per}")
