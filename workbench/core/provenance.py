"""The setting a speed was measured in: one function builds it (`setting`), one reads it (`read_setting`), one
says how two differ (`differences`).

A step's cost depends on the CPU's vector units (AVX-512 vs AVX2), the thread count, other processes and the load
as much as on the model, so every latency, sweep and plan file carries the setting it was measured in: as a
`setting` column holding one JSON object (CSV files) or a "setting" object (plan and benchmark JSON). Files written
before it was recorded read as provenance unknown (None). Torch-free: the caller passes what torch knows (threads,
device, dtype, whether the step was compiled); versions come from the installed package metadata.
"""
from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata

import pandas as pd

from workbench import LOAD_AT_START

# The keys a prediction must share with the measurement it is compared with; `load_average` is recorded, not
# compared (a loaded machine is reported by `loaded`).
COMPILED = {False: "eager", None: "eager", "layers": "layers compiled",
            "captured": "layers compiled, step captured"}  # setting["compiled"] in words
COMPARED = ("device", "gpu", "cpu", "vector", "threads", "processes", "dtype", "compiled", "mode")
VECTOR_FLAGS = ("avx512f", "avx2", "neon", "asimd")  # the first found names the widest vector unit
LOAD_KEYS = ("load_average", "load_now")  # what other processes did, not what was measured


def _cpuinfo() -> tuple[str | None, str | None]:
    """(CPU model name, widest vector extension among VECTOR_FLAGS) from /proc/cpuinfo (None where unreadable)."""
    name, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and name is None:
                    name = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name or platform.processor() or None, next((v for v in VECTOR_FLAGS if v in flags), None)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def dtype_name(dtype) -> str:
    """A dtype as every file and report names it: "float32", "bfloat16" (torch.float32 -> "float32"; a name stays)."""
    return str(dtype).replace("torch.", "")


def load_average(every: bool = False) -> float | list[float] | None:
    """The 1-minute load average now (`every`: the 1-, 5- and 15-minute ones), to 2 decimals; None where the OS keeps
    none: the one reading of it every record and bench takes."""
    try:
        loads = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return [round(x, 2) for x in loads] if every else round(loads[0], 2)


def setting(device: str, dtype: str, threads: int, compiled: bool | str, gpu: str | None = None, processes: int = 1,
            mode: str = "decoder-step") -> dict:
    """The setting of a measurement made now: device type ("cpu", "cuda"), GPU name, CPU model and vector
    extension, torch threads, processes measuring at once, dtype, compiled (True: the whole step, "layers": the
    decoder layers, the CPU default; "captured": the layers, the step captured per shape, CUDA's) or eager
    (False), what was timed (`mode`: "decoder-step" = the decoder's whole step, "verify" = the bare verify
    forward), torch and transformers versions, and the 1-minute load average when this process began
    (`load_average`: other processes; a measurement's own threads soon raise the load to about their count) and
    now (`load_now`)."""
    cpu, vector = _cpuinfo()
    load, now = LOAD_AT_START, load_average()
    return dict(device=str(device), gpu=gpu, cpu=cpu, vector=vector, cores=os.cpu_count(), threads=int(threads),
                processes=int(processes), dtype=dtype_name(dtype),
                compiled=compiled if compiled in ("layers", "captured") else bool(compiled), mode=mode,
                torch=_version("torch"), transformers=_version("transformers"),
                load_average=None if load is None else round(load, 2), load_now=now)


def without_load(s: dict) -> dict:
    """A setting less its load readings: what two runs must share for their points to mix in one file."""
    return {k: v for k, v in s.items() if k not in LOAD_KEYS}


def setting_cell(s: dict) -> str:
    """A setting as one CSV cell (compact JSON)."""
    return json.dumps(s, sort_keys=True, separators=(",", ":"))


def read_setting(source) -> dict | None:
    """The setting of a file's measurements: from a frame's `setting` column (its first non-empty cell), a dict's
    "setting" entry, or a cell itself; None when it was not recorded (older files) or does not parse."""
    cell = source
    if isinstance(source, pd.DataFrame):
        if "setting" not in source.columns:
            return None
        cells = source["setting"].dropna()
        cells = cells[cells.astype(str).str.strip() != ""]
        cell = cells.iloc[0] if len(cells) else None
    elif isinstance(source, dict):
        cell = source.get("setting")
    if isinstance(cell, dict):
        return cell
    if not isinstance(cell, str):
        return None
    try:
        out = json.loads(cell)
    except ValueError:
        return None
    return out if isinstance(out, dict) else None


def differences(a: dict | None, b: dict | None) -> list[str]:
    """How two settings differ in what changes a step's cost ("threads 2 vs 1", ...): [] when they match; one entry
    "provenance unknown" when either was not recorded (it cannot be told apart)."""
    if a is None or b is None:
        return ["provenance unknown (the setting was not recorded)"]
    return [f"{k} {a.get(k)} vs {b.get(k)}" for k in COMPARED if k in a and k in b and a.get(k) != b.get(k)]


def here() -> dict:
    """This machine as a setting records it (CPU model, vector unit, cores): what a table's setting is held against."""
    cpu, vector = _cpuinfo()
    return dict(device="cpu", cpu=cpu, vector=vector, cores=os.cpu_count())


def machine_differences(s: dict | None, this: dict | None = None) -> list[str] | None:
    """How the machine a CPU measurement was made on differs from this one (`this`, default here()): CPU model,
    vector unit, and threads beyond this machine's cores. [] when it matches; None when it cannot be told (setting
    not recorded, or a GPU measurement: the GPU is not read without torch)."""
    if s is None or s.get("device") != "cpu":
        return None
    this = this or here()
    out = [f"{k} {s.get(k)} (here {this.get(k)})" for k in ("cpu", "vector") if s.get(k) != this.get(k)]
    if s.get("threads") and this.get("cores") and s["threads"] > this["cores"]:
        out.append(f"threads {s['threads']} (here {this['cores']} cores)")
    return out


def loaded(s: dict | None, limit: float = 0.5) -> bool:
    """Whether a measurement ran on a busy machine: its load average above `limit` x its cores."""
    if not s or s.get("load_average") is None or not s.get("cores"):
        return False
    return s["load_average"] > limit * s["cores"]


QUIET_CORES = 0.1  # idle while measuring: other processes kept less than a tenth of a core busy on average


def cpu_mark() -> tuple[float, float, float, float] | None:
    """(wall s, busy CPU s of the whole machine, its niced part, CPU s of this process and its finished children), or
    None without /proc/stat. Two marks give what else ran between them (`others`): the load average after a run is
    mostly the run's own, and the one before it says what ran in the minute before, not during."""
    try:
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    busy = (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)) / tick  # user nice system irq softirq steal
    return time.time(), busy, f[1] / tick, sum(os.times()[:4])


def others(before, after) -> dict | None:
    """CPU cores other processes kept busy on average between two cpu_marks (all of them, and the niced part); a
    child still running at `after` counts as another process."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    wall = after[0] - before[0]
    return dict(cores=round(max(0.0, (after[1] - before[1]) - (after[3] - before[3])) / wall, 3),
                niced_cores=round((after[2] - before[2]) / wall, 3), seconds=round(wall, 1))


def quiet(used: dict | None) -> bool | None:
    """Whether nothing else ran during a measurement (`others`' result); None where that was not measured."""
    return None if used is None else used["cores"] < QUIET_CORES


def describe(s: dict | None) -> str:
    """One line: 'cpu Intel Xeon ... (avx512f), 2 threads, 1 process, float32, eager, decoder-step, load 0.3 at start'."""
    if s is None:
        return "setting unknown"
    where = s.get("gpu") if s.get("gpu") else f"{s.get('device')} {s.get('cpu') or ''} ({s.get('vector') or '?'})"
    return (f"{where.strip()}, {s.get('threads')} threads, {s.get('processes')} process(es), {s.get('dtype')}, "
            f"{COMPILED.get(s.get('compiled'), 'compiled')}, {s.get('mode')}, load {s.get('load_average')} at start")


def mismatch_warning(prediction: dict | None, measurement: dict | None, what: str) -> str | None:
    """The loud line for a prediction compared with a measurement from another setting (None when they match)."""
    diff = differences(prediction, measurement)
    if not diff:
        return None
    return (f"WARNING: {what}: the prediction's latency was measured in another setting than the measurement "
            f"({'; '.join(diff)}): the two are not comparable; re-measure latency where you decode")
