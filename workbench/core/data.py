"""Prompt sets: Alpaca-eval, MT-bench (first turns), copy-edit (ours: rewrite, extract, summarise and edit-code
prompts whose answers copy from the prompt, where an n-gram drafter pays) or a user file (JSON/JSON lines parsed by Python's json
module, CSV/parquet read with `datasets`).

Chat-template wrapping and tokenisation live in `generation.prepare_prompt` (one copy, shared with the live decoder).

The named sets ship with the package (`workbench/prompts/`, instructions only; licences in its NOTICE), so the main
job runs on a fresh offline install. `$WORKBENCH_DATA_DIR` holding the original file takes precedence; the Hugging
Face hub is asked only when the packaged copy is missing. `data_dirs()` ($WORKBENCH_DATA_DIR) is where train-heads looks
for its default training files.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from workbench.core.notes import FieldError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"  # package data: <name>.jsonl per named set
# name -> (original file name, as in $WORKBENCH_DATA_DIR; hub loader args); every copy has the same columns.
NAMED_SETS = {
    "alpaca-eval": ("alpaca_eval.json", dict(path="json", split="train",
                                             data_files="hf://datasets/tatsu-lab/alpaca_eval/alpaca_eval.json")),
    "mt-bench": ("mt_bench_questions.jsonl", dict(path="lighteval/mt-bench", split="train")),
    "copy-edit": ("copy-edit.jsonl", None),  # ours (NOTICE): answers that copy from the prompt, for n-gram drafters
}
TEXT_COLUMNS = ("instruction", "prompt", "question", "turns")  # first one present wins
ID_COLUMNS = ("question_id", "prompt_id", "id")
FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def prompts_fingerprint(prompts) -> str:
    """sha256 of a prompt set's JSON (records, texts or token ids): what a resumable job compares to know that it
    still runs on the same prompts."""
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()


def data_dirs() -> list[Path]:
    """Folders holding original data files (training sets, full prompt sets): $WORKBENCH_DATA_DIR when set. No
    machine path: on a fresh clone there is none, and the packaged sets are all a default reads."""
    return [Path(os.environ["WORKBENCH_DATA_DIR"])] if os.environ.get("WORKBENCH_DATA_DIR") else []


def _json_rows(path: Path) -> list[dict]:
    """A JSON list of objects or JSON lines, parsed by Python's json module: pyarrow's JSON reader (what
    `datasets` would use) can crash the whole process with a segfault on some damaged files."""
    text = path.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
        rows = obj if isinstance(obj, list) else [obj]
    except ValueError as e:  # JSON lines (or garbage: then the first error is the one to show)
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError:
            raise e from None
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError("expected a list of JSON objects (one per prompt) or one object per line")
    return rows


def _read_file(path: Path) -> tuple[list[str], list[dict]]:
    """(columns, rows) of a JSON/JSONL/CSV/parquet file; any reader failure becomes one line."""
    import datasets  # deferred (here and in _read_named): ~0.4 s more on import, and JSON and local sets need none

    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise FieldError("prompts", "unsupported", f"{{field}} {path}: unsupported file type '{path.suffix}' "
                             f"(use {', '.join(FILE_FORMATS)})")
    if path.stat().st_size == 0:
        raise FieldError("prompts", "empty", f"{{field}} {path}: the file is empty")
    datasets.disable_progress_bars()
    try:
        if fmt == "json":
            rows = _json_rows(path)
            if not rows:
                raise ValueError("corresponds to no data")
            return list(dict.fromkeys(k for r in rows for k in r)), rows
        return _table(datasets.load_dataset(fmt, data_files=str(path), split="train"))
    except Exception as e:  # malformed JSON/CSV: whatever the reader raised, one line naming the file
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "corresponds to no data" in msg:  # datasets' words for a file with no rows, e.g. `[]`
            raise FieldError("prompts", "empty", f"{{field}} {path}: the file holds no prompts") from None
        raise FieldError("prompts", "unreadable", f"{{field}} {path}: cannot read it as {fmt} ({msg[:200]})") from None


def _table(ds) -> tuple[list[str], list[dict]]:
    return ds.column_names, ds.to_list()  # arrow decodes lazily: bad UTF-8 in a string surfaces only here


def _read_named(name: str):
    """(columns, rows), where: $WORKBENCH_DATA_DIR's original file, else the packaged copy, else the hub."""
    local, hub = NAMED_SETS[name]
    env_dir = os.environ.get("WORKBENCH_DATA_DIR")
    for path in ([Path(env_dir) / local] if env_dir else []) + [PROMPTS_DIR / f"{name}.jsonl"]:
        if path.is_file():
            return _read_file(path), str(path)
    if hub is None:
        raise FieldError("prompts", "missing",
                         f"{{field}} {name}: no packaged copy {PROMPTS_DIR / (name + '.jsonl')}; reinstall the "
                         "package or give a prompt file")
    import datasets

    datasets.disable_progress_bars()
    try:
        return _table(datasets.load_dataset(**hub)), f"hub:{hub['path']}"
    except Exception as e:  # a stripped install offline, or the hub moved: say where we looked
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FieldError("prompts", "missing",
                         f"{{field}} {name}: no packaged copy {PROMPTS_DIR / (name + '.jsonl')} (nor {local} in "
                         f"$WORKBENCH_DATA_DIR) and the hub copy failed ({msg[:160]}); reinstall the package "
                         "or give a prompt file") from None


def _text(value, column: str = "turns", where: str = "", row: int = 0) -> str:
    """A cell as prompt text: MT-bench-style `turns` lists give their first turn; a list or object in any other
    column (e.g. a JSON object of columns, {"instruction": [...]}, read as one row) or a non-text value (NaN) is an
    error, never one prompt made of the first item."""
    if isinstance(value, (list, tuple)) and column == "turns":
        value = value[0] if value else ""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value == value:
        return str(value)  # a CSV column of numbers: datasets typed it
    if not isinstance(value, str):
        hint = (" (a JSON object of columns? give one object per prompt: a list of objects, or JSON lines)"
                if isinstance(value, (list, tuple, dict)) else "")
        raise FieldError("prompts", "wrong_type",
                         f"{{field}} {where}: row {row + 1}: column '{column}' holds a {type(value).__name__}, "
                         f"not text{hint}")
    return value.strip()


def load_prompt_records(spec: str, limit: int | None = None) -> list[tuple[str, str]]:
    """[(prompt_id, text)] in file order, the first `limit` non-empty ones.

    Ids come from a question_id/prompt_id/id column, else the row number; they key the deterministic holdout
    split and ranks.parquet, so they must be stable across runs (they are: they depend on the file only).
    Alpaca rows with a non-empty `input` get it appended after the instruction with a blank line.
    """
    if limit is not None and limit <= 0:
        raise FieldError("limit", "below_one", f"{{field}} {limit}: must be a positive number of prompts")
    if spec in NAMED_SETS:
        (columns, rows), where = _read_named(spec)
    else:
        path = Path(spec)
        if not path.is_file():
            raise FieldError("prompts", "missing",
                             f"{{field}} {spec}: no such file (or use one of: {', '.join(NAMED_SETS)})")
        (columns, rows), where = _read_file(path), str(path)
    column = next((c for c in TEXT_COLUMNS if c in columns), None)
    if column is None:
        raise FieldError("prompts", "no_column",
                         f"{{field}} {where}: no prompt column (need one of {', '.join(TEXT_COLUMNS)}; "
                         f"found {', '.join(map(str, columns))[:160] or 'none'})")
    id_col = next((c for c in ID_COLUMNS if c in columns), None)
    records, seen = [], set()
    for i, row in enumerate(rows):
        text = _text(row.get(column), column, where, i)
        extra = _text(row.get("input"), "input", where, i) if column == "instruction" else ""
        if extra:
            text = f"{text}\n\n{extra}"
        if not text:
            continue
        pid = str(row[id_col]) if id_col and row.get(id_col) is not None else str(i)
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate such as "\ud800" in JSON: no tokenizer takes it
                raise FieldError("prompts", "not_text",
                                 f"{{field}} {where}: prompt {pid[:40]!r} is not valid Unicode text (a lone "
                                 "surrogate escape like \\ud800)") from None
        if pid in seen:
            raise FieldError("prompts", "duplicate",
                             f"{{field}} {where}: duplicate {id_col} '{pid}' (ids must be unique)")
        seen.add(pid)
        records.append((pid, text))
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise FieldError("prompts", "empty", f"{{field}} {where}: no non-empty prompts in column '{column}'")
    return records


def load_prompts(spec: str, limit: int | None = None) -> list[str]:
    """Prompt texts of a named set (`alpaca-eval`, `mt-bench`) or a JSON/JSONL/CSV/parquet file."""
    return [text for _, text in load_prompt_records(spec, limit)]

