"""Prompt loading: the real shared sets, user files in every supported format, and one-line errors."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from workbench import REPO_ROOT, WorkbenchError
from workbench.data import data_dirs, load_prompt_records, load_prompts

SHARED = REPO_ROOT.parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "alpaca_eval.json").is_file(), reason="no shared/data beside the repo")


@needs_shared
def test_alpaca_eval_has_805_prompts_in_file_order():
    recs = load_prompt_records("alpaca-eval")
    raw = json.loads((SHARED / "alpaca_eval.json").read_text())
    assert len(recs) == 805
    assert [t for _, t in recs] == [r["instruction"].strip() for r in raw]
    assert [pid for pid, _ in recs] == [str(i) for i in range(805)]


@needs_shared
def test_mt_bench_gives_80_first_turns_keyed_by_question_id():
    recs = load_prompt_records("mt-bench")
    raw = [json.loads(line) for line in (SHARED / "mt_bench_questions.jsonl").read_text().splitlines() if line.strip()]
    assert len(recs) == 80
    assert recs == [(str(r["question_id"]), r["turns"][0].strip()) for r in raw]


@needs_shared
def test_limit_takes_the_first_prompts():
    assert load_prompts("alpaca-eval", limit=3) == load_prompts("alpaca-eval")[:3]
    with pytest.raises(WorkbenchError, match="--limit"):
        load_prompts("alpaca-eval", limit=0)


@needs_shared
def test_alpaca_training_file_appends_non_empty_input():
    raw = json.loads((SHARED / "alpaca_en_demo_1k.json").read_text())
    texts = load_prompts(str(SHARED / "alpaca_en_demo_1k.json"))
    with_input = [i for i, r in enumerate(raw) if r["input"].strip()]
    without = [i for i, r in enumerate(raw) if not r["input"].strip()]
    assert with_input and without
    i, j = with_input[0], without[0]
    assert texts[i] == raw[i]["instruction"].strip() + "\n\n" + raw[i]["input"].strip()
    assert texts[j] == raw[j]["instruction"].strip()


def test_data_dir_env_overrides_shared(tmp_path, monkeypatch):
    (tmp_path / "alpaca_eval.json").write_text(json.dumps([{"instruction": "only one"}]))
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path))
    assert data_dirs()[0] == tmp_path
    assert load_prompts("alpaca-eval") == ["only one"]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "parquet"])
@pytest.mark.parametrize("column", ["instruction", "prompt", "question"])
def test_user_files_in_every_format(tmp_path, fmt, column):
    rows = [{column: "first prompt", "id": "a"}, {column: "second prompt", "id": "b"}, {column: "", "id": "c"}]
    f = tmp_path / f"p.{fmt}"
    df = pd.DataFrame(rows)
    if fmt == "json":
        f.write_text(json.dumps(rows))
    elif fmt == "jsonl":
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        df.to_csv(f, index=False)
    else:
        df.to_parquet(f)
    # empty prompts are skipped; the id column keys the records
    assert load_prompt_records(str(f)) == [("a", "first prompt"), ("b", "second prompt")]


def test_turns_column_gives_the_first_turn(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"turns": ["one", "two"]}) + "\n" + json.dumps({"turns": ["three", "four"]}) + "\n")
    assert load_prompt_records(str(f)) == [("0", "one"), ("1", "three")]


@pytest.mark.parametrize("content,match", [
    ("", "empty"),
    ("[]", "holds no prompts"),
    ('[{"text": "x"}]', "no prompt column"),
    ('[{"instruction": ""}, {"instruction": "  "}]', "no non-empty prompts"),
    ('[{"instruction": "x", "id": 1}, {"instruction": "y", "id": 1}]', "duplicate"),
    ("[{not json", "cannot read"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(WorkbenchError, match=match) as e:
        load_prompts(str(f))
    assert "\n" not in str(e.value)


def test_missing_file_and_unknown_type(tmp_path):
    with pytest.raises(WorkbenchError, match="no such file.*alpaca-eval"):
        load_prompts(str(tmp_path / "nope.json"))
    (tmp_path / "p.txt").write_text("hello")
    with pytest.raises(WorkbenchError, match="unsupported file type"):
        load_prompts(str(tmp_path / "p.txt"))


def test_named_set_without_local_copy_offline_is_one_line(tmp_path):
    """No local copy and no hub: a one-line error naming where it looked (run offline in a subprocess)."""
    code = ("import workbench.data as d\nd.data_dirs = lambda: []\n"
            "from workbench import WorkbenchError\n"
            "try:\n    d.load_prompts('alpaca-eval')\nexcept WorkbenchError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(lines) == 1 and "no local alpaca_eval.json" in lines[0], out.stdout + out.stderr

