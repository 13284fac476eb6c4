"""Shared fixtures: tiny random models and Medusa heads in every format, built once per test session.

    tiny_llama, tiny_qwen2   a `Tiny` (below) for one architecture
    tiny                     parametrised over both architectures
    make_heads_dir           factory: write a state dict + config as a heads folder, for broken-checkpoint tests
    make_prompt_file         factory: write a list of prompts as a JSONL prompt file

Each `Tiny` holds an fp32 CPU model (vocab 128, hidden 64, 2 layers, init std 0.2 so greedy argmax has no
near-ties), the character-level `tiny_tokenizer` (ChatML template, EOS `</s>` = id 2) saved next to the model,
and 5 random NON-ZERO heads (1 ResBlock each) saved as:
    heads_dirs["1"]        format 1 (own [V, H] lm_head per head), medusa_lm_head.safetensors
    heads_dirs["1pt"]      the same heads as medusa_lm_head.pt, config saying 2 heads (the released-config quirk)
    heads_dirs["2"]        format 2 (ResBlocks only, logits through the base lm_head)
    heads_dirs["3"]        a full Medusa-2 model folder: base weights + medusa_head.* (= format-1 heads)
and in memory as heads["1"] (untied) and heads["2"] (tied). Treat all of it as read-only.

Torch is limited to one thread: the test machine has 2 shared cores, and oversubscribed threads make tiny
matmuls ~1000x slower.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import datasets  # noqa: F401 - its logging handler binds sys.stderr on import: do it here, not under a test's capsys
import pytest
import torch
import transformers

pytest.register_assert_rewrite("helpers")  # its asserts (checked_steps) explain themselves as a test file's do
from helpers import TESTED_TRANSFORMERS  # noqa: E402

torch.set_num_threads(1)

# The referee tiers (vLLM, browser, kill-and-resume) skipped or left out never silently: one line per tier at the end.
from support.referees import (pytest_configure, pytest_deselected, pytest_sessionfinish,  # noqa: E402, F401
                              pytest_terminal_summary, pytest_testnodedown)


def pytest_report_header(config) -> str:
    """First thing to compare when a test fails on another machine: the versions it ran with."""
    known = ".".join(transformers.__version__.split(".")[:2]) in TESTED_TRANSFORMERS
    return (f"torch {torch.__version__}, transformers {transformers.__version__} "
            f"({'a version' if known else 'NOT one of the versions'} the suite passed with: "
            f"{', '.join(TESTED_TRANSFORMERS)})")

# What a test costs, roughly, by its markers: how the two workers get the suite's files (below).
MARK_SECONDS = {"vllm": 150.0, "browser": 40.0, "soak": 30.0, "slow": 10.0}


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first. pytest-xdist hands each worker whole files (--dist loadfile) in collection order, so
    a file of a few long tests collected last (a browser's, a vLLM's, a kill-and-resume soak's) ran alone at the end
    while the other worker idled. Each file's cost is estimated from its tests' markers (MARK_SECONDS; a plain test
    ~0.3 s); ties keep the alphabetical order, so every worker collects the same order."""
    cost: dict = {}
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        cost[item.path] = cost.get(item.path, 0.0) + max([MARK_SECONDS[m] for m in marks if m in MARK_SECONDS] + [0.3])
    items.sort(key=lambda item: -cost[item.path])  # stable: a file's tests keep their order


TINY_HEADS = 5
TINY_HIDDEN = 64
TINY_VOCAB = 128


@dataclass
class Tiny:
    arch: str
    model: object               # transformers model, fp32, eval, CPU
    tokenizer: object
    model_dir: Path             # save_pretrained(model) + tokenizer
    heads_dirs: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)


def _build(arch: str, root: Path, seed: int) -> Tiny:
    from safetensors.torch import load_file, save_file

    from workbench.runtime.heads import save_heads
    from support.tiny import random_heads, tiny_model, tiny_tokenizer

    model, tok = tiny_model(arch, seed=seed), tiny_tokenizer()
    t = Tiny(arch, model, tok, root / "model")
    model.save_pretrained(t.model_dir)
    tok.save_pretrained(t.model_dir)
    untied = random_heads(TINY_HIDDEN, TINY_VOCAB, TINY_HEADS, tied=False, seed=seed + 1)
    tied = random_heads(TINY_HIDDEN, TINY_VOCAB, TINY_HEADS, tied=True, seed=seed + 2)
    t.heads = {"1": untied, "2": tied}
    t.heads_dirs["1"] = save_heads(untied, root / "heads1", str(t.model_dir), fmt=1)
    t.heads_dirs["2"] = save_heads(tied, root / "heads2", str(t.model_dir), fmt=2)

    pt = root / "heads1pt"
    pt.mkdir()
    torch.save({k: v.clone() for k, v in untied.state_dict().items()}, pt / "medusa_lm_head.pt")
    (pt / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                "base_model_name_or_path": str(t.model_dir)}))
    t.heads_dirs["1pt"] = pt

    full = root / "medusa2"
    model.save_pretrained(full)
    tok.save_pretrained(full)
    sd = load_file(str(full / "model.safetensors"))
    sd.update({f"medusa_head.{k}": v.clone().contiguous() for k, v in untied.state_dict().items()})
    save_file(sd, str(full / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((full / "config.json").read_text())
    cfg.update(medusa_num_heads=TINY_HEADS, medusa_num_layers=1)
    (full / "config.json").write_text(json.dumps(cfg))
    t.heads_dirs["3"] = full
    return t


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Tiny:
    return _build("llama", tmp_path_factory.mktemp("tiny_llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Tiny:
    return _build("qwen2", tmp_path_factory.mktemp("tiny_qwen2"), seed=10)


@pytest.fixture(params=["llama", "qwen2"])
def tiny(request) -> Tiny:
    return request.getfixturevalue(f"tiny_{request.param}")


@pytest.fixture(scope="session")
def make_prompt_file(tmp_path_factory):
    """make_prompt_file(prompts) -> a JSONL prompt file of {"id": "q<i>", "instruction": prompt} rows."""
    def make(prompts: list[str]) -> Path:
        f = tmp_path_factory.mktemp("prompts") / "p.jsonl"
        f.write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n" for i, p in enumerate(prompts)))
        return f
    return make


@pytest.fixture
def make_heads_dir(tmp_path):
    """make_heads_dir(state_dict, config=None, name="medusa_lm_head.safetensors") -> folder."""
    from safetensors.torch import save_file

    def make(sd: dict, config: dict | None = None, name: str = "medusa_lm_head.safetensors") -> Path:
        folder = tmp_path / f"heads{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        if name.endswith(".safetensors"):
            save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / name))
        else:
            torch.save(sd, folder / name)
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        return folder
    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that fails leaves a screenshot of what the browser showed (tests/output/browser/failed-*.png)."""
    outcome = yield
    report = outcome.get_result()
    driver = item.funcargs.get("browser") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and driver is not None:
        from workbench import REPO_ROOT

        out = REPO_ROOT / "tests" / "output" / "browser"
        out.mkdir(parents=True, exist_ok=True)
        try:
            driver.save_screenshot(str(out / f"failed-{item.name}.png"))
        except Exception:  # the browser itself may be what failed
            pass
