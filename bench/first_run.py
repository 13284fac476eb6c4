"""A new user's first run of the commands on the demo: each beside its plain twin, idle and with one core busy.

    python bench/first_run.py                          # every command, idle then one core busy, 2 rounds
    python bench/first_run.py --quick                  # plumbing: calibrate --limit 2 --max-new-tokens 16, 1 round
    python bench/first_run.py --commands calibrate,decode --loads idle --rounds 3
    python bench/first_run.py --loads one-core-busy --resume   # the other half into the same file, later

`--resume` keeps what --out already holds (same --rounds, --limit, --quick) and measures only the (command, load)
pairs it lacks, so the bench can be finished in pieces: the idle half, then the one-core-busy half, or the rest of
a run that was stopped (a pair in progress is measured again).

Each command runs as the README and its tour write it (the main job `calibrate --limit N`, the tour's `tree`,
`optimize`, `plan` and `export`, `decode --compare`, a small `sweep` and `latency`), in a fresh scratch folder with
fresh caches: its own WORKBENCH_CACHE holding only the converted demo model (linked from yours: converting it is
not what is timed; the CPU kernels' choice starts empty) and an empty TORCHINDUCTOR_CACHE_DIR. Its plain twin is the
same command with plain linears and nothing compiled (WORKBENCH_CPU_LINEAR=linear, WORKBENCH_CPU_LAYERS=0, and
`--no-compile` where the command takes it). Default and twin run paired, in alternating order (ABBA over rounds),
first with the machine as it is ("idle"), then with a busy loop pinned to one core ("one-core-busy"). Per command
and load: the wall seconds of each run (process start to exit), the medians, and default / plain. The commands
that do not load the model (a second or two) run at least LIGHT_ROUNDS pairs.

Run it on an otherwise idle machine. The JSON is rewritten after each command (`complete` false until every command
asked has both loads), so a run stopped early keeps what it measured. tests/test_first_run.py fails where a committed file has a command's default
more than 10 % slower than its plain twin. Writes JSON (bench/results/first-run.json unless --out) with the setting
(CPU, vector extension, cores, versions, this script's flags, load average at start, CPU other processes used
during each load) and prints a table.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from workbench import WorkbenchError  # noqa: E402
from workbench.cli.shared import bounded, run_script  # noqa: E402
from workbench.core.io import atomic_write_json, cache_dir  # noqa: E402
from workbench.core.provenance import cpu_mark, others, setting  # noqa: E402

CAL = "calibration/smollm2-135m-instruct-alpaca-eval"
MODEL = "smollm2-135m-instruct"  # the converted demo model's folder in the cache
BAR = 1.10  # a default more than this times its plain twin's time fails tests/test_first_run.py
PLAIN_ENV = {"WORKBENCH_CPU_LINEAR": "linear", "WORKBENCH_CPU_LAYERS": "0"}
LOADS = ("idle", "one-core-busy")
LOADING = {"calibrate", "decode", "sweep", "latency"}  # the commands that load the model; the others, a second each,
LIGHT_ROUNDS = 4  # run at least this many pairs so that noise of a few tenths of a second does not decide a ratio

# name: (argv after `workbench`, takes --no-compile, inputs it reads from the prepared folder). {N}: --limit,
# {T}: --max-new-tokens of the model-loading commands; {IN}: files made once before timing (the tour's own outputs).
COMMANDS = {
    "calibrate": ("calibrate --limit {N} --name quick{T}", False),
    "tree-show": ("tree show mc_sim_7b_63", False),
    "tree-eval": (f"tree eval mc_sim_7b_63 --calibration {CAL}", False),
    "optimize": (f"optimize --calibration {CAL} --budget 32 --out my_tree.json", False),
    "optimize-latency": (f"optimize --calibration {CAL} --latency {CAL}/latency-cpu.csv --out fastest.json", False),
    "plan": (f"plan --calibration {CAL} --latency {CAL}/latency-cpu.csv --batch-sizes 1,2,4,8 --out plan.json",
             False),
    "export-trtllm": ("export {IN}/fastest.json --format trtllm", False),
    "export-vllm": ("export {IN}/plan.json --format vllm", False),
    "decode": ("decode --tree {IN}/my_tree.json --prompt 'Explain KV caching.' --compare --max-new-tokens 64", True),
    "sweep": (f"sweep --calibration {CAL} --trees mc_sim_7b_63 {{IN}}/my_tree.json --temperature 0,0.7 --limit 2 "
              "--max-new-tokens 32 --out sweep.csv --quiet", True),
    "latency": ("latency --sizes 1,16 --batch-sizes 1,2 --limit 4 --max-new-tokens 16 --out latency.csv", True),
}
# the tour's outputs later commands read ({IN}/NAME), each made once (untimed) when a chosen command reads it
PREPARE = {
    "my_tree.json": f"optimize --calibration {CAL} --budget 32 --out {{IN}}/my_tree.json",
    "fastest.json": f"optimize --calibration {CAL} --latency {CAL}/latency-cpu.csv --out {{IN}}/fastest.json",
    "plan.json": f"plan --calibration {CAL} --latency {CAL}/latency-cpu.csv --batch-sizes 1,2,4,8 "
                 "--out {IN}/plan.json",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated, of: {', '.join(COMMANDS)}")
    ap.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of: {', '.join(LOADS)}")
    ap.add_argument("--rounds", type=bounded("repeats"), default=2,
                    help=f"default/plain pairs per command and load (at least {LIGHT_ROUNDS} for those not loading "
                         "the model)")
    ap.add_argument("--limit", type=bounded("count"), default=8, help="calibrate --limit (default 8)")
    ap.add_argument("--quick", action="store_true",
                    help="plumbing: calibrate --limit 2 --max-new-tokens 16, 1 round of every command")
    ap.add_argument("--out", default=str(HERE / "results" / "first-run.json"))
    ap.add_argument("--resume", action="store_true", help="keep the pairs --out holds; measure only the others")
    ap.set_defaults(flags=sys.argv[1:] if argv is None else list(argv))
    return run_script(ap, run, argv)


def names(text: str, known, flag: str) -> list[str]:
    chosen = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in chosen if x not in known]
    if not chosen or unknown:
        raise WorkbenchError(f"{flag} {text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'none given'} "
                             f"(use a comma-separated list of {', '.join(known)})")
    return chosen


def argv_of(name: str, inputs: Path, limit: int, tokens: str, plain: bool) -> list[str]:
    template, no_compile = COMMANDS[name]
    words = shlex.split(template.format(N=limit, T=tokens, IN=inputs))
    return words + (["--no-compile"] if plain and no_compile else [])


def timed(words: list[str], scratch: Path, env: dict) -> float:
    """One run of `workbench WORDS` in a fresh copy of the calibration folder, with fresh caches; wall seconds."""
    work = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    (work / "calibration").mkdir()
    shutil.copytree(ROOT / CAL, work / CAL)
    cache = work / "cache"
    shutil.copytree(env["_MODEL"], cache / MODEL, copy_function=os.link)  # linked: read only, nothing copied
    run_env = {k: v for k, v in env.items() if k != "_MODEL"} | dict(
        WORKBENCH_CACHE=str(cache), TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "workbench.cli", *words], cwd=work, env=run_env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise WorkbenchError(f"`workbench {' '.join(words)}` failed (exit {out.returncode}): "
                             f"{' '.join(out.stderr.strip().splitlines()[-1:])}")
    shutil.rmtree(work, ignore_errors=True)
    return seconds


def busy_loop() -> subprocess.Popen:
    """A process spinning on the machine's last core (pinned), as another user's job would."""
    core = max(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])


def run(args) -> int:
    commands, loads = names(args.commands, COMMANDS, "--commands"), names(args.loads, LOADS, "--loads")
    rounds, limit, tokens = (1, 2, " --max-new-tokens 16") if args.quick else (args.rounds, args.limit, "")
    model = cache_dir() / MODEL
    if not (model / "config.json").is_file():
        raise WorkbenchError(f"no converted demo model in {model}: run any model command once first (e.g. `workbench "
                             "decode --prompt hi --max-new-tokens 4`), which converts it")
    base = {k: v for k, v in os.environ.items() if k not in PLAIN_ENV} | dict(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", _MODEL=str(model))
    report = dict(bench="first-run", complete=False, bar=BAR, rounds=rounds, limit=limit, quick=args.quick,
                  plain_twin="WORKBENCH_CPU_LINEAR=linear WORKBENCH_CPU_LAYERS=0, --no-compile where taken",
                  setting=setting("cpu", "float32", os.cpu_count() or 1, "layers", mode="first-run")
                  | dict(flags=args.flags, loads=loads, other_cores_during={}),
                  commands=commands, rows=[])
    if args.resume:
        report = resumed(Path(args.out), report)
    rows, used = report["rows"], report["setting"]["other_cores_during"]
    done = {(r["command"], r["load"]) for r in rows}
    atomic_write_json(args.out, report)  # --out checked before the long work; rewritten after each command
    with tempfile.TemporaryDirectory(prefix="first-run-") as tmp:
        scratch, inputs = Path(tmp), Path(tmp) / "inputs"
        inputs.mkdir()
        for name, line in PREPARE.items():
            if any(f"{{IN}}/{name}" in COMMANDS[c][0] for c in commands for x in loads if (c, x) not in done):
                timed(line.format(IN=inputs).split(), scratch, base)
        for load in loads:
            todo = [name for name in commands if (name, load) not in done]
            if not todo:
                continue
            spinner = busy_loop() if load == "one-core-busy" else None
            mark = cpu_mark()
            try:
                for name in todo:
                    times = {"default": [], "plain": []}
                    for r in range(rounds if name in LOADING or args.quick else max(rounds, LIGHT_ROUNDS)):
                        for mode in (("default", "plain") if r % 2 == 0 else ("plain", "default")):
                            env = base | (PLAIN_ENV if mode == "plain" else {})
                            words = argv_of(name, inputs, limit, tokens, mode == "plain")
                            times[mode].append(round(timed(words, scratch, env), 2))
                    d, p = statistics.median(times["default"]), statistics.median(times["plain"])
                    rows.append(dict(command=name, load=load,
                                     argv=" ".join(argv_of(name, Path("IN"), limit, tokens, False)),
                                     default_s=times["default"], plain_s=times["plain"], default_median_s=d,
                                     plain_median_s=p, ratio=round(d / p, 3)))
                    print(line_of(rows[-1]), file=sys.stderr)
                    atomic_write_json(args.out, report)
            finally:
                now = others(mark, cpu_mark())  # before the busy loop ends: a child still running counts as another
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
                used[load] = now if used.get(load) is None or now is None or now["cores"] >= used[load]["cores"] \
                    else used[load]  # pieces of one load: the busiest one's (an interrupted piece's too)
                atomic_write_json(args.out, report)
    report["complete"] = {(c, x) for c in report["commands"] for x in LOADS} <= {(r["command"], r["load"])
                                                                                  for r in rows}
    atomic_write_json(args.out, report)
    print(table(report))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def resumed(path: Path, fresh: dict) -> dict:
    """The report `path` holds, to be finished by this run (`fresh`: its own start): its rows and each load's other
    processes kept, each piece's flags and load average at start (the setting's: the highest); refused where it was
    measured with other --rounds/--limit/--quick (its pairs would not be this run's)."""
    import json

    try:
        old = json.loads(path.read_text())
    except FileNotFoundError:
        return fresh
    except (OSError, ValueError) as e:
        raise WorkbenchError(f"--resume: {path} is not a first-run report ({e}): give its --out, or drop --resume") \
            from None
    if not isinstance(old, dict) or old.get("bench") != "first-run" or not isinstance(old.get("rows"), list) \
            or not isinstance(old.get("setting"), dict):
        raise WorkbenchError(f"--resume: {path} is not a first-run report: give its --out, or drop --resume")
    differ = [k for k in ("rounds", "limit", "quick") if old.get(k) != fresh[k]]
    if differ:
        raise WorkbenchError(f"--resume: {path} was measured with other {', '.join('--' + k for k in differ)} "
                             f"({', '.join(f'{k} {old.get(k)}' for k in differ)}): rerun with those, or drop --resume")
    s, new = old["setting"], fresh["setting"]
    piece = dict(flags=s.get("flags"), loads=s.get("loads"), load_average=s.get("load_average"))
    s["pieces"] = [*(s.get("pieces") or [piece]),
                   dict(flags=new["flags"], loads=new["loads"], load_average=new.get("load_average"))]
    s["load_average"] = max((p["load_average"] for p in s["pieces"] if p["load_average"] is not None), default=None)
    s["loads"] = list(dict.fromkeys([*(s.get("loads") or []), *new["loads"]]))
    s.setdefault("other_cores_during", {})
    before = old.get("commands") or [r.get("command") for r in old["rows"]]
    old["commands"] = list(dict.fromkeys([*before, *fresh["commands"]]))
    return old


def line_of(row: dict) -> str:
    verdict = "ok" if row["ratio"] <= BAR else f"SLOWER than {BAR:.2f}x"
    return (f"| {row['command']} | {row['load']} | {row['default_median_s']:.1f} | {row['plain_median_s']:.1f} | "
            f"{row['ratio']:.2f}x | {verdict} |")


def table(report: dict) -> str:
    s = report["setting"]
    head = (f"first run, fresh caches, {report['rounds']} round(s): {s.get('cpu')} ({s.get('vector')}), "
            f"{s.get('cores')} cores, load {s.get('load_average')} at start, torch {s.get('torch')}\n"
            "| command | load | default s | plain s | default / plain | verdict |\n|---|---|---:|---:|---:|---|")
    return "\n".join([head] + [line_of(r) for r in report["rows"]])


if __name__ == "__main__":
    sys.exit(main())
