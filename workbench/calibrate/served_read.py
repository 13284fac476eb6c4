"""A served calibration's counts from a user's own numbers (calibrate/served.py owns the folder): two `/metrics`
scrapes of a running vLLM server (the difference; one scrape: since the server started) or vLLM's per-request
statistics (JSON or JSON lines of `metrics.speculative_decoding` objects). What the counters are: served.py's
docstring. Torch-free."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from workbench import WorkbenchError
from workbench.calibrate.served import ServedCounts, checked_counts

SPEC = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
PER_POS = "num_accepted_tokens_per_pos"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')

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
