"""Prompt loading: the packaged sets (equal to the original files, vendored in tests/data/), user files in every
supported format, one-line errors, and the main job's prompts resolved from a copy of the package with no data folder
beside it and no network."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench import REPO_ROOT, WorkbenchError
from workbench.core.data import PROMPTS_DIR, data_dirs, load_prompt_records, load_prompts

ORIGINALS = REPO_ROOT / "tests" / "data"  # the original files, as published (tests/data/README.md)


@pytest.mark.unit
def test_alpaca_eval_has_805_prompts_in_file_order():
    recs = load_prompt_records("alpaca-eval")
    raw = json.loads((ORIGINALS / "alpaca_eval.json").read_text())
    assert len(recs) == 805
    assert [t for _, t in recs] == [r["instruction"].strip() for r in raw]
    assert [pid for pid, _ in recs] == [str(i) for i in range(805)]


@pytest.mark.unit
def test_mt_bench_gives_80_first_turns_keyed_by_question_id():
    recs = load_prompt_records("mt-bench")
    lines = (ORIGINALS / "mt_bench_questions.jsonl").read_text().splitlines()
    raw = [json.loads(line) for line in lines if line.strip()]
    assert len(recs) == 80
    assert recs == [(str(r["question_id"]), r["turns"][0].strip()) for r in raw]


@pytest.mark.unit
def test_limit_takes_the_first_prompts():
    assert load_prompts("alpaca-eval", limit=3) == load_prompts("alpaca-eval")[:3]
    with pytest.raises(WorkbenchError, match="--limit"):
        load_prompts("alpaca-eval", limit=0)


@pytest.mark.unit
def test_alpaca_training_file_appends_non_empty_input():
    raw = json.loads((ORIGINALS / "alpaca_en_demo_first10.json").read_text())
    texts = load_prompts(str(ORIGINALS / "alpaca_en_demo_first10.json"))
    with_input = [i for i, r in enumerate(raw) if r["input"].strip()]
    without = [i for i, r in enumerate(raw) if not r["input"].strip()]
    assert with_input and without
    i, j = with_input[0], without[0]
    assert texts[i] == raw[i]["instruction"].strip() + "\n\n" + raw[i]["input"].strip()
    assert texts[j] == raw[j]["instruction"].strip()


@pytest.mark.unit
@pytest.mark.parametrize("name", ["alpaca-eval", "mt-bench"])
def test_packaged_sets_give_the_records_of_the_original_files(name, monkeypatch):
    """Same ids, same texts, same order: calibrations made on the original files stay comparable."""
    monkeypatch.delenv("WORKBENCH_DATA_DIR", raising=False)
    packaged = load_prompt_records(name)
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(ORIGINALS))
    assert packaged == load_prompt_records(name)


@pytest.mark.unit
def test_named_sets_are_read_from_the_package_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_DATA_DIR", raising=False)
    assert len(load_prompt_records("alpaca-eval")) == 805
    mt = load_prompt_records("mt-bench")
    assert len(mt) == 80 and [pid for pid, _ in mt] == [str(i) for i in range(81, 161)]
    (tmp_path / "alpaca-eval.jsonl").write_text(json.dumps({"instruction": "packaged"}) + "\n")
    monkeypatch.setattr("workbench.core.data.PROMPTS_DIR", tmp_path)
    assert load_prompts("alpaca-eval") == ["packaged"]


@pytest.mark.unit
def test_packaged_sets_carry_their_notice():
    notice = (PROMPTS_DIR / "NOTICE").read_text()
    assert "CC BY-NC 4.0" in notice and "NON-COMMERCIAL" in notice and "Apache License 2.0" in notice
    files = sorted(f.name for f in PROMPTS_DIR.glob("*.jsonl"))
    assert files == ["alpaca-eval.jsonl", "copy-edit.jsonl", "mt-bench.jsonl"]
    assert all(f in notice for f in files)


@pytest.mark.unit
def test_data_dir_env_overrides_the_packaged_copy(tmp_path, monkeypatch):
    (tmp_path / "alpaca_eval.json").write_text(json.dumps([{"instruction": "only one"}]))
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path))
    assert data_dirs()[0] == tmp_path
    assert load_prompts("alpaca-eval") == ["only one"]


OFFLINE = ("import socket, sys\n"
           "def deny(*a, **k): raise OSError('network disabled by the test')\n"
           "socket.socket.connect = deny; socket.create_connection = deny\n")


def clone_without_shared(tmp_path) -> tuple[Path, dict]:
    """A copy of the checkout (package, app, committed calibration) with no shared/ beside it, and an environment
    with no network and no data folder."""
    import shutil
    clone = tmp_path / "fresh" / "repo"
    for name in ("workbench", "calibration"):
        shutil.copytree(REPO_ROOT / name, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "app.py", clone / "app.py")
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_DATA_DIR"}
    env.update(PYTHONPATH=str(clone), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    return clone, env


def test_prompt_sets_resolve_in_a_clone_without_shared_and_offline(tmp_path):
    """What `workbench calibrate` (default --prompts alpaca-eval) and `--prompts mt-bench` resolve, from a copy of
    the package that has no ../shared/data and no network."""
    clone, env = clone_without_shared(tmp_path)
    code = OFFLINE + ("import workbench, workbench.core.data as d\n"
                      "assert not (workbench.REPO_ROOT.parent / 'shared').exists(), workbench.REPO_ROOT\n"
                      "print(workbench.__file__)\n"
                      "print(len(d.load_prompt_records('alpaca-eval')), len(d.load_prompt_records('mt-bench')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    where, counts = out.stdout.split("\n")[:2]
    assert where.startswith(str(clone)) and counts == "805 80"


def test_app_front_page_runs_in_a_clone_without_shared_and_offline(tmp_path):
    """The app's front page (the tree designer on the committed calibration) from the same copy, no network."""
    clone, env = clone_without_shared(tmp_path)
    code = OFFLINE + ("from streamlit.testing.v1 import AppTest\n"
                      f"at = AppTest.from_file({str(clone / 'app.py')!r}, default_timeout=300).run()\n"
                      "assert not at.exception, [e.value for e in at.exception]\n"
                      "assert not at.error, [e.value for e in at.error]\n"
                      "print([t.value for t in at.title])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "Tree designer" in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.slow
def test_main_job_runs_in_a_clone_without_shared_and_offline(tmp_path):
    """README's main command (`workbench calibrate`) cut to 4 prompts x 8 tokens, from a copy of the package with no
    ../shared/data beside it, the network refused: it writes a calibration on the packaged Alpaca-eval."""
    clone, env = clone_without_shared(tmp_path)
    argv = ["calibrate", "--limit", "4", "--gen-batch", "4", "--max-new-tokens", "8", "--budgets", "4",
            "--out", str(tmp_path / "cal"), "--trees-dir", str(tmp_path / "trees")]
    code = OFFLINE + f"from workbench.cli import main\nsys.exit(main({argv!r}))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    meta = json.loads((tmp_path / "cal" / "meta.json").read_text())
    assert meta["prompts"] == "alpaca-eval" and meta["num_prompts"] == 4
    assert len(list((tmp_path / "trees").glob("*.json"))) == 2


@pytest.mark.unit
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


@pytest.mark.unit
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
@pytest.mark.unit
def test_bad_files_are_one_line_errors(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(WorkbenchError, match=match) as e:
        load_prompts(str(f))
    assert "\n" not in str(e.value)


@pytest.mark.unit
def test_missing_file_and_unknown_type(tmp_path):
    with pytest.raises(WorkbenchError, match="no such file.*alpaca-eval"):
        load_prompts(str(tmp_path / "nope.json"))
    (tmp_path / "p.txt").write_text("hello")
    with pytest.raises(WorkbenchError, match="unsupported file type"):
        load_prompts(str(tmp_path / "p.txt"))


def test_named_set_without_packaged_copy_offline_is_one_line(tmp_path):
    """No packaged copy (a stripped install) and no hub: a one-line error naming where it looked (run offline in a
    subprocess)."""
    code = (f"import workbench.core.data as d, pathlib\nd.PROMPTS_DIR = pathlib.Path({str(tmp_path / 'none')!r})\n"
            "from workbench import WorkbenchError\n"
            "try:\n    d.load_prompts('alpaca-eval')\nexcept WorkbenchError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_DATA_DIR"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(lines) == 1 and "no packaged copy" in lines[0] and "give a prompt file" in lines[0], \
        out.stdout + out.stderr
