"""Latency: the latency CSV (this module owns its format) and reading it as a table t(B, n) per batch size.

A tree with more nodes accepts more tokens per step but each step costs more (Medusa paper Fig. 4, App. G), and
at batch size B every sequence of the batch pays for that step:
  latency   t(B, n): wall time of one step of B sequences x n tokens (n - 1 tree nodes + the root), next to the
            single-token step t(B, 1), read non-decreasing in n (non_decreasing: a dip is noise); measured by
            measure/latency.py, either the decoder's whole step
            (decoder-step, the default) or its bare verify forward (verify). The CSV keeps the spread of the
            repeats (min, quartiles, max) beside the median, and the setting it was measured in (`setting`,
            provenance.py): a table from another machine, thread count or load predicts another speed;
  speedup   speed.py (torch-free) owns the model: tokens_per_step / (t(n) / t(1)), its range and the noise test;
            plan/rank.py ranks trees by it (the one ranker).
Torch-free: the planner and the app read latency without loading torch. Where a latency file lives in a
calibration folder, and the typical context it is read at, are calibrate/folder.py's.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from workbench.core.notes import FieldError, named, refused
from workbench.core.io import read_csv
from workbench.core.provenance import COMPARED, differences
from workbench.core.speed import spread

SPREAD_COLUMNS = ["seconds_min", "seconds_q1", "seconds_q3", "seconds_max"]
HEADS_COLUMNS = ["depth", "heads_seconds"]  # depth: heads run by the timed step (its tree's depth, 0 = vanilla);
# heads_seconds: their proposal's cost at the row's batch size (timing.heads_times), timed beside the table
LATENCY_VERSION = 4  # the format's version, on every row (`version`); older ones read through upgrade_latency
ENGINES = ("workbench", "vllm")  # whose step the rows time: our decoder's, or a round as vLLM serves it
ENGINE_COLUMNS = ["engine", "engine_version", "context_min", "context_max"]  # (version 3) context_min/max: the range
# of the contexts the timed steps saw (`context` is their mean; empty where the steps ran at one fixed context)
POLICIES = ("static", "dynamic")  # the step's tree: one fixed tree, or N nodes chosen per step (trees/dynamic.py)
POLICY_COLUMNS = ["policy", "envelope"]  # (version 4) envelope: the nodes a dynamic step chose its N from (the
# selection's cost grows with it); empty on static rows. tokens = N + 1 on a dynamic row, as on a static one
LATENCY_COLUMNS = ["model", "device", "dtype", "batch", "context", "tokens", "seconds", *SPREAD_COLUMNS, "repeats",
                   "setting",  # setting: provenance.setting_cell of the measurement (empty: not recorded)
                   *HEADS_COLUMNS,  # the heads the timed step ran and their cost (absent: no heads ran, read_head_cost)
                   *ENGINE_COLUMNS, *POLICY_COLUMNS, "version"]
LATENCY_REQUIRED = ("context", "tokens", "seconds")  # what every reader needs; the rest name the setup or the spread
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_SECONDS, MAX_SECONDS = 1e-9, 1e5  # a step faster than a nanosecond or slower than a day is not a timing
DEFAULT_CONTEXTS = (128, 1024)
DEFAULT_BATCHES = (1,)


# ----------------------------------------------------------------------------------------------- latency


def spread_row(times: list[float]) -> dict:
    """The CSV's timing columns of one point from its repeats (speed.spread): median as `seconds`, min,
    quartiles, max."""
    s = spread(times)
    return dict(seconds=s["median"], seconds_min=s["min"], seconds_q1=s["q1"], seconds_q3=s["q3"],
                seconds_max=s["max"], repeats=s["repeats"])


def stamp(df: pd.DataFrame, engine: str, version: str, contexts: tuple[int, int] | None = None) -> pd.DataFrame:
    """The rows of one measurement with ENGINE_COLUMNS filled: whose step they timed (`engine`, one of ENGINES, and
    its version) and the range of contexts its steps saw (None: not recorded)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    df["engine"], df["engine_version"] = engine, str(version)
    df["context_min"], df["context_max"] = (None, None) if contexts is None else (int(contexts[0]), int(contexts[1]))
    return df


def latency_engine(df: pd.DataFrame) -> tuple[str, str | None]:
    """(engine, its version) whose steps a checked latency table (read_latency) timed; ("workbench", None) for a
    frame without the engine columns (one not read through read_latency)."""
    if "engine" not in df.columns:
        return "workbench", None
    version = df["engine_version"].iloc[0] if "engine_version" in df.columns else None
    return str(df["engine"].iloc[0]), None if pd.isna(version) else str(version)


def _check_engine(df: pd.DataFrame, path, field: str) -> None:
    """ENGINE_COLUMNS: one known engine and version per file, and context_min <= context <= context_max where the
    range is recorded."""
    if "engine" not in df.columns:
        return
    if df["engine"].isna().any() or not df["engine"].isin(ENGINES).all() or \
            df[[c for c in ("engine", "engine_version") if c in df.columns]].astype(str).nunique().max() > 1:
        raise FieldError(field, "engine", f"{{field}} {path}: engine must be one of {', '.join(ENGINES)}, one engine and version per "
                         "file (`workbench latency --engine E` writes it)")
    have = [c for c in ("context_min", "context_max") if c in df.columns]
    rng = df[have].apply(pd.to_numeric, errors="coerce") if have else None
    if rng is not None and rng.notna().any().any():
        if len(have) < 2 or rng.isna().any().any() or (rng["context_min"] > df["context"]).any() or \
                (rng["context_max"] < df["context"]).any():
            raise FieldError(field, "context_range", f"{{field}} {path}: context_min and context_max must both be numbers on every row, "
                             "with context_min <= context <= context_max")


def _check_setting(df: pd.DataFrame, path, field: str) -> None:
    """The `setting` cells: each a JSON object whose COMPARED fields are plain values (a list there is a hand edit), one
    setting per file in what changes a step's cost (provenance.COMPARED: compiled and eager rows, or two thread
    counts, are two tables: priced together they would mix two speeds), and its mode saying the same engine as the
    engine column (a vllm-round setting is vLLM's, decoder-step and verify ours)."""
    if "setting" not in df.columns:
        return
    cells = df["setting"].dropna().astype(str)
    first = None
    for cell in cells[cells.str.strip() != ""].unique():
        try:
            s = json.loads(cell)
        except ValueError:
            s = None
        if not isinstance(s, dict):
            raise FieldError(field, "setting_not_object", f"{{field}} {path}: a setting cell is not a JSON object ({cell[:40]!r}): measure it "
                             "again with `workbench latency`")
        bad = [k for k in COMPARED if isinstance(s.get(k), (list, dict))] + \
            [k for k in ("device", "gpu", "cpu", "vector", "dtype", "mode")
             if not isinstance(s.get(k), (str, type(None)))] + \
            [k for k in ("load_average", "load_now", "cores") if s.get(k) is not None and (
                isinstance(s[k], bool) or not isinstance(s[k], (int, float)) or not np.isfinite(s[k]))]
        if bad:
            raise FieldError(field, "setting_value", f"{{field}} {path}: the setting's {bad[0]} holds a {type(s[bad[0]]).__name__} where one "
                             "plain value (a name for the machine, a finite number for the load and cores) belongs: measure it again "
                             "with `workbench latency`")
        key = {k: s.get(k) for k in COMPARED}
        if first is None:
            first = key
        elif key != first:
            raise FieldError(field, "two_settings", f"{{field}} {path}: rows of two settings ({'; '.join(differences(first, key))}): "
                             "one table per setting (compiled and eager steps are two speeds); keep the rows "
                             "of one, or measure again with `workbench latency`")
    if first is not None and first.get("mode") and "engine" in df.columns:
        engine, mode = str(df["engine"].iloc[0]), first["mode"]
        if (mode == "vllm-round") != (engine == "vllm"):
            raise FieldError(field, "mode_engine", f"{{field}} {path}: the engine column says {engine} but the setting's mode is {mode} "
                             f"({'vLLM' if mode == 'vllm-round' else 'this workbench'}'s step): a file of "
                             "contradictory rows; measure it again with `workbench latency`")


def upgrade_latency(df: pd.DataFrame) -> pd.DataFrame:
    """A latency table of version 1 (no `version` column: older files of this tool, or a table written by hand with
    LATENCY_REQUIRED), 2 (before ENGINE_COLUMNS) or 3 (before POLICY_COLUMNS) as this version, its cells unchanged:
    a file without a `batch` column timed batch 1; one without an engine timed our decoder's step (every earlier
    table did), its context range not recorded; one without a policy timed static trees. The only place the
    earlier shapes live; read_latency calls it."""
    df = df.copy()
    if "batch" not in df.columns:
        df.insert(int(df.columns.get_loc("context")) if "context" in df.columns else 0, "batch", 1)
    for cols, values in ((ENGINE_COLUMNS, ("workbench", None, None, None)), (POLICY_COLUMNS, ("static", None))):
        if cols[0] not in df.columns:
            at = int(df.columns.get_loc("version")) if "version" in df.columns else len(df.columns)
            for i, (col, value) in enumerate(zip(cols, values)):
                df.insert(at + i, col, value)
    df["version"] = LATENCY_VERSION
    return df


def read_latency(path, field: str = "latency", policy: str | None = "static",
                 engine: str | None = None) -> pd.DataFrame | None:
    """A latency CSV at this version (upgrade_latency), checked: LATENCY_REQUIRED present, positive integer batch
    sizes, contexts and token counts, seconds finite and > 0; the spread columns, where there, on every row, ordered
    min <= q1 <= median <= q3 <= max. Its errors name the request's `field` that gave it (core.notes.FieldError: the
    CLI words it as --latency, the app as its control). The rows of one `policy`
    (POLICIES), each a table of its own: "static" (every reader's), or "dynamic": the per-step trees' rows with the
    1-token rows they are relative to (None where no per-step tree was timed); None: every row (policy_rows splits
    them)."""
    df = read_csv(path, field, LATENCY_REQUIRED, "workbench latency")
    if "version" not in df.columns or pd.to_numeric(df["version"], errors="coerce").isin([2, 3]).all():
        df = upgrade_latency(df)
    other = pd.to_numeric(df["version"], errors="coerce") != LATENCY_VERSION
    if other.any():
        i = int(np.argmax(other.to_numpy()))
        raise FieldError(field, "version", f"{{field}} {path}: row {i + 2}: version {str(df['version'].iloc[i])[:20]!r}, but this "
                         f"workbench reads latency CSVs of version {LATENCY_VERSION}: measure it again with "
                         "`workbench latency`")
    cols = ["batch", "context", "tokens", "seconds"]
    num = df[cols].apply(pd.to_numeric, errors="coerce")
    ints = num[["batch", "context", "tokens"]]
    if num.isna().any().any() or (ints % 1 != 0).any().any() or (num["context"] > 1 << 24).any() or \
            not num["tokens"].between(1, 1 << 16).all() or (num["context"] < 0).any() or \
            not num["batch"].between(1, 1 << 20).all() or \
            not num["seconds"].between(MIN_SECONDS, MAX_SECONDS).all():
        raise FieldError(field, "values", f"{{field}} {path}: batch/context/tokens must be integers (batch >= 1, tokens "
                         f"1..{1 << 16}) and seconds numbers in [{MIN_SECONDS:g}, {MAX_SECONDS:g}] on every row "
                         "(outside: a unit slip, or a ratio that under- or overflows); `workbench latency` "
                         "writes it")
    df[cols] = num
    df[["batch", "context", "tokens"]] = df[["batch", "context", "tokens"]].astype(int)
    _check_engine(df, path, field)
    _check_setting(df, path, field)
    if engine is not None and latency_engine(df)[0] != engine:  # e.g. sweep-report: a sweep is our decoder's
        raise FieldError(field, "other_engine", f"{{field}} {path}: times {latency_engine(df)[0]}'s steps, but this compares {engine}'s: "
                         "give a table of `workbench latency` (a plan priced on vLLM is checked by `workbench vllm-check`)")
    present = [c for c in SPREAD_COLUMNS if c in df.columns]
    if present:
        spread = df[present].apply(pd.to_numeric, errors="coerce")
        order = pd.concat([spread[["seconds_min", "seconds_q1"]], num["seconds"],
                           spread[["seconds_q3", "seconds_max"]]], axis=1) if len(present) == 4 else None
        if order is None or spread.isna().any().any() or np.isinf(spread).any().any() or \
                not (spread > 0).all().all() or \
                (order.diff(axis=1).iloc[:, 1:] < -1e-12 * order.iloc[:, 1:]).any().any():
            raise FieldError(field, "spread", f"{{field}} {path}: the spread columns {', '.join(SPREAD_COLUMNS)} must all be there, "
                             "finite and > 0 on every row, with min <= q1 <= seconds <= q3 <= max")
        df[SPREAD_COLUMNS] = spread
    present = [c for c in HEADS_COLUMNS if c in df.columns]
    if present and df[present].isna().all().all():  # written without heads (verify mode on a bare model)
        df, present = df.drop(columns=present), []
    if present:
        heads = df[present].apply(pd.to_numeric, errors="coerce")
        if len(heads.columns) < 2 or heads.isna().any().any() or np.isinf(heads).any().any() or \
                (heads["depth"] % 1 != 0).any() or (heads < 0).any().any() or \
                (heads["heads_seconds"] > MAX_SECONDS).any() or \
                ((heads["depth"] == 0) != (df["tokens"] == 1)).any():
            raise FieldError(field, "heads_columns", f"{{field}} {path}: the columns {', '.join(HEADS_COLUMNS)} must both be there with a "
                             "number on every row: depth a whole number (0 on the 1-token rows, >= 1 on the "
                             "others), heads_seconds >= 0 (`workbench latency --heads DIR` measures them)")
        df[HEADS_COLUMNS] = heads
        df["depth"] = df["depth"].astype(int)
    return _policy_rows(df, path, field, policy)


def _policy_rows(df: pd.DataFrame, path, field: str, policy: str) -> pd.DataFrame | None:
    """POLICY_COLUMNS checked (a known policy on every row; a whole envelope of at least the step's nodes on the
    dynamic rows, one envelope per file) and the rows of `policy` (read_latency)."""
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    if "policy" not in df.columns:  # a frame written by hand with LATENCY_REQUIRED only: static steps
        return df if policy in ("static", None) else None
    dynamic = df["policy"] == "dynamic"
    env = pd.to_numeric(df["envelope"], errors="coerce") if "envelope" in df.columns else None
    if not df["policy"].isin(POLICIES).all() or (dynamic.any() and (
            env is None or env[dynamic].isna().any() or (env[dynamic] % 1 != 0).any() or env[dynamic].nunique() > 1
            or (env[dynamic] < df.loc[dynamic, "tokens"] - 1).any() or (df.loc[dynamic, "tokens"] < 2).any())):
        raise FieldError(field, "policy", f"{{field}} {path}: policy must be static or dynamic on every row; a dynamic row has >= 2 "
                         "tokens and a whole envelope of at least its tokens - 1 nodes, one envelope per file "
                         "(`workbench latency --envelope TREE` writes them)")
    if policy is None:
        return df
    if policy == "static":
        return df[~dynamic].reset_index(drop=True)
    if not dynamic.any():
        return None
    return df[dynamic | (df["tokens"] == 1)].reset_index(drop=True)


def policy_rows(df: pd.DataFrame, policy: str) -> pd.DataFrame | None:
    """The rows of one `policy` of a frame read with every policy (read_latency(policy=None)): one read a command
    splits, as read_latency would have."""
    return _policy_rows(df, "", "latency", policy)


def read_head_cost(rows: pd.DataFrame) -> dict | None:
    """The heads' cost of one batch size and context's rows (speed.at_depth reads it): {"depth": {tokens: the
    depth of the tree timed}, "seconds": {depth: heads_seconds}} (depth 0: vanilla, no heads); None for a table
    without it (no heads ran, or not recorded: priced as timed, whatever the tree's depth)."""
    if not set(HEADS_COLUMNS) <= set(rows.columns) or rows[HEADS_COLUMNS].isna().any().any():
        return None
    seconds = rows.groupby("depth")["heads_seconds"].median()
    return dict(depth=dict(zip(rows["tokens"].astype(int), rows["depth"].astype(int))),
                seconds={int(d): float(t) for d, t in seconds.items()})


def _setup_check(df: pd.DataFrame, what: str, field: str | None) -> None:
    keys = [c for c in ("model", "device", "dtype") if c in df.columns]
    if keys and len(df[keys].drop_duplicates()) > 1:
        groups = "; ".join(" ".join(str(v) for v in r) for r in df[keys].drop_duplicates().itertuples(index=False))
        raise refused(field, "several_setups", f"{named(field, what)}: rows from several setups ({groups}): keep one "
                      "model/device/dtype per file")


def _batches(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["batch"].unique()) if "batch" in df.columns else [1]


def _join(values) -> str:
    return ", ".join(map(str, values))


def _pick_context(contexts: list[int], context: int | None, target: float | None, what: str,
                  field: str | None) -> int:
    """`context` (already checked to be measured), else the measured one closest to `target`, else the only one."""
    if context is not None:
        return context
    if target is not None:
        return min(contexts, key=lambda c: (abs(c - target), c))
    if len(contexts) == 1:
        return contexts[0]
    raise FieldError("context", "ambiguous", f"{named(field, what, 'also')}: measured at contexts {_join(contexts)}; "
                     "pick one with {field}", also=field)


def latency_table(df: pd.DataFrame, context: int | None = None, target: float | None = None,
                  what: str = "latency", batch: int | None = None, column: str = "seconds",
                  monotone: bool = True, field: str | None = None) -> tuple[dict[int, float], int]:
    """{tokens: seconds} of one batch size at one context: `context` exactly, else the measured one closest to
    `target`, else the only one. `batch` defaults to 1 (the only one a file without a batch column has).
    `column` picks another timing column (seconds_q1, ...); `monotone` (default) reads it non_decreasing, False as
    measured. One (model, device, dtype) per file: mixing hardware in one table would be meaningless. Errors name
    the table by `what`, after the request's `field` that gave it where one did (core.notes.named)."""
    _setup_check(df, what, field)
    label = named(field, what)
    have = _batches(df)
    b = 1 if batch is None and 1 in have else batch
    if b is None:
        raise refused(field, "batch_ambiguous", f"{label}: measured at batch sizes {_join(have)}; pick one")
    if b not in have:
        raise refused(field, "no_batch", f"{label}: no rows for batch size {b} (measured: {_join(have)}): time it with "
                      f"`workbench latency --batch-sizes {b}`")
    df = df[df["batch"] == b] if "batch" in df.columns else df
    contexts = sorted(df["context"].unique().tolist())
    if context is not None and context not in contexts:
        raise refused(field, "no_context", f"{label}: no rows for context {context} (measured: {_join(contexts)})")
    ctx = _pick_context(contexts, context, target, what, field)
    rows = df[df["context"] == ctx]
    if rows["tokens"].duplicated().any():
        raise refused(field, "duplicate_tokens", f"{label}: batch {b} context {ctx} lists a token count twice")
    if column not in rows.columns or rows[column].isna().any():
        raise refused(field, "no_column", f"{label}: no {column} on every row (the table has no spread: measure it with "
                      "`workbench latency`)")
    table = dict(zip(rows["tokens"].astype(int).tolist(), rows[column].astype(float).tolist()))
    if 1 not in table:
        raise refused(field, "no_plain_step", f"{label}: batch {b} context {ctx} has no 1-token row (the vanilla step every cost is "
                      "relative to)")
    return non_decreasing(table) if monotone else table, int(ctx)


def non_decreasing(table: dict[int, float]) -> dict[int, float]:
    """A table's Medusa steps (n >= 2 tokens) made non-decreasing in n by pooling adjacent violators (the
    least-squares monotone fit): a step over more tokens cannot cost less, so a dip is the table's noise, and a
    prediction should not rest on it (recommend.cheaper_larger names such dips in the raw table). The plain
    step t(1), every prediction's denominator, stays as measured. Order-preserving: fitted quartiles stay ordered."""
    sizes = sorted(n for n in table if n >= 2)
    blocks: list[list[float]] = []  # [sum, count] of each pooled run, left to right
    for n in sizes:
        blocks.append([table[n], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [value for total, count in blocks for value in [total / count] * count]
    return {n: table[n] for n in table if n < 2} | dict(zip(sizes, fitted))


def latency_surface(df: pd.DataFrame, batches, context: int | None = None, target: float | None = None,
                    what: str = "latency", field: str | None = None) -> tuple[dict[int, dict], int]:
    """The surface t(B, n) at one context for every asked batch size: ({B: {"seconds": {tokens: s},
    "spread": {tokens: (q1, q3)} or None, "measured": {tokens: s} as in the file, "head_cost": read_head_cost or None}},
    context); seconds and spread
    read non_decreasing. The context is `context`, else the one measured at every
    asked batch size closest to `target`, else the only one. Batch sizes or a context the file lacks are one
    error naming all of them (named as latency_table names them)."""
    _setup_check(df, what, field)
    label = named(field, what)
    batches = sorted({int(b) for b in batches})
    have = _batches(df)
    missing = [b for b in batches if b not in have]
    if missing:
        raise refused(field, "no_batch", f"{label}: no rows for batch size(s) {_join(missing)} (measured: {_join(have)}): time "
                      f"them with `workbench latency --batch-sizes {','.join(map(str, batches))}`")
    per = {b: set(df.loc[df["batch"] == b, "context"].astype(int)) if "batch" in df.columns else
           set(df["context"].astype(int)) for b in batches}
    if context is not None:
        lack = [b for b in batches if context not in per[b]]
        if lack:
            measured = sorted(set().union(*per.values()))
            raise refused(field, "no_context", f"{label}: no rows at context {context} for batch size(s) {_join(lack)} (measured "
                          f"contexts: {_join(measured)})")
        ctx = context
    else:
        common = sorted(set.intersection(*per.values()))
        if not common:
            raise FieldError("context", "none_common", f"{named(field, what, 'also')}: no context is measured at "
                             f"every batch size {_join(batches)}: measure them at one {{field}}", also=field)
        ctx = _pick_context(common, None, target, what, field)
    out = {}
    for b in batches:
        measured, _ = latency_table(df, ctx, what=what, batch=b, monotone=False, field=field)
        table = non_decreasing(measured)
        spread = None
        if set(SPREAD_COLUMNS) <= set(df.columns):
            q1, _ = latency_table(df, ctx, what=what, batch=b, column="seconds_q1", field=field)
            q3, _ = latency_table(df, ctx, what=what, batch=b, column="seconds_q3", field=field)
            spread = {n: (q1[n], q3[n]) for n in table}
        rows = df[(df["batch"] == b) & (df["context"] == ctx)] if "batch" in df.columns else df[df["context"] == ctx]
        out[b] = dict(seconds=table, spread=spread, measured=measured, head_cost=read_head_cost(rows))
    return out, int(ctx)


def every_batch(df: pd.DataFrame, context: int) -> dict[int, dict[int, float]]:
    """{batch size: {tokens: seconds}} of every batch size the table timed at `context`: what the tail of a batch is
    priced on where the engine drops finished sequences (core.speed.shrinking_cost)."""
    have = [b for b in _batches(df) if context in set(df.loc[df["batch"] == b, "context"].astype(int))] \
        if "batch" in df.columns else [1]
    return {b: s["seconds"] for b, s in latency_surface(df, have, context)[0].items()}
