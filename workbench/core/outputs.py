"""Where outputs may go: the one owner of the rule that no output is, lies inside or holds what a command reads
(its inputs, the workbench's cache, the HF cache of the model, the heads in use), checked before any work so that
a refused command writes nothing (export --format vllm-heads --out on the cached demo model once replaced its
weights with the heads, and every later command failed to load it)."""
from __future__ import annotations

import os
from pathlib import Path

from workbench import DEMO_HEADS, WorkbenchError
from workbench.core.io import cache_dir, check_output


def _resolved(p) -> Path:
    return Path(os.path.realpath(p))


FOLDER_PARTS = {"meta.json", "ranks.parquet", "continuations.parquet", "accuracies.csv", "config.json",
                "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "chat_template.jinja", "args.json"}  # what model, heads and calibration folders are made of


def _part_of_folder_input(f: Path) -> bool:
    return f.name in FOLDER_PARTS or f.suffix in (".safetensors", ".bin", ".pt", ".parquet", ".gguf") or \
        f.parent.name == "trees"


CACHE_WORK_AREAS = ("train-heads",)  # the cache's own work folders (train-heads' default --work), not models


def hf_hub_cache() -> Path:
    """Where huggingface_hub keeps downloaded models (its own precedence: HF_HUB_CACHE, HF_HOME/hub, XDG)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(home) / "hub"


def protected_folders(model: str | None = None, heads=None) -> dict[str, Path]:
    """What no output may be, lie inside or hold whatever the command reads (label -> folder): the workbench's
    cache (the converted demo model, vLLM's interpreter, converted heads), the HF cache folder of a hub --model,
    the demo heads shipped with the package and a heads folder in use. A command writing there would replace a
    model's weights or config, and every later command would fail to load it."""
    where = "$WORKBENCH_CACHE" if os.environ.get("WORKBENCH_CACHE") else "the workbench cache"
    out = {f"{where} {cache_dir()}": cache_dir(), f"the demo heads {DEMO_HEADS}": DEMO_HEADS}
    if model and "/" in str(model) and not os.path.lexists(model) and not str(model).endswith(".gguf"):
        org_name = str(model).strip("/").replace("/", "--")  # a hub id: huggingface_hub's own folder name
        out[f"the HF cache of --model {model}"] = hf_hub_cache() / f"models--{org_name}"
    if heads and os.path.lexists(heads):
        h = Path(heads)
        out[f"the heads in use {heads}"] = h  # a file: that file; a folder: all of it
    return out


def check_not_protected(outputs: dict, protected: dict) -> None:
    """Refuse an output (flag -> (path, kind)) that is, lies inside or (a folder output) holds a protected folder
    (label -> path, protected_folders): before any work, so nothing is written. train-heads' --work may lie in
    the cache's own work area (its default)."""
    for flag, (out, kind) in outputs.items():
        if out is None or out == "" or Path(out).is_char_device():
            continue
        o = _resolved(out)
        for label, folder in protected.items():
            f = _resolved(folder)
            if flag == "--work" and any(a == o or a in o.parents for a in (f / w for w in CACHE_WORK_AREAS)):
                continue
            if o == f or f in o.parents or (kind == "folder" and flag != "--figures" and o in f.parents):
                how = "is" if o == f else "lies inside" if f in o.parents else "holds"
                raise WorkbenchError(f"{flag} {out} {how} {label}: writing there would overwrite what the "
                                     f"workbench reads; give another {flag} outside it")


def _weights_folder(folder: Path) -> bool:
    """A model or heads folder (weights or a config, and no calibration's meta.json): every file in it may be read
    (vLLM loads every *.safetensors of a folder), so nothing may be written inside it. A calibration folder takes
    new results beside its parts (latency.csv), so only its parts are refused."""
    if (folder / "meta.json").exists():
        return False
    try:
        return (folder / "config.json").exists() or any(f.suffix in (".safetensors", ".bin", ".pt", ".gguf")
                                                        for f in folder.iterdir())
    except OSError:
        return False


def check_not_inputs(outputs: dict, inputs: dict, protected: dict | None = None) -> None:
    """Refuse an output (flag -> (path, 'file'|'folder')) that is, or through a link reaches, one of the inputs
    (flag -> path): an input file itself, an existing file inside an input folder, an input folder itself, or (for
    a folder output) a folder holding an input. Writing there would change the user's files. Two outputs naming
    the same path are refused too (one would silently replace the other)."""
    check_not_protected(outputs, protected or {})
    seen = {}
    for flag, (out, kind) in outputs.items():
        o = _resolved(out)
        if o in seen and not Path(out).is_char_device():  # /dev/null twice is fine
            raise WorkbenchError(f"{flag} {out} and {seen[o]} name the same file: one would overwrite the other; "
                                 f"give {flag} another name")
        seen[o] = f"{flag} {out}"
        for iflag, inp in inputs.items():
            i = _resolved(inp)
            same = o == i
            inside = i.is_dir() and i in o.parents and (_weights_folder(i) or (o.exists() and
                                                                               _part_of_folder_input(o)))
            holds = kind == "folder" and o in i.parents and flag != "--figures"  # a folder output (of fixed file
            # names: heads, a calibration, trees) that holds an input; figures are named after their sweep
            if same or inside or holds:
                how = "is" if same else "would overwrite a file inside" if inside else "holds"
                link = f" (through the link to {o})" if Path(out).is_symlink() or str(o) != os.path.abspath(out) \
                    else ""
                raise WorkbenchError(f"{flag} {out}{link} {how} the input {iflag} {inp}: writing there would change "
                                     f"the input; give another {flag}")


def writable_cache(what: str) -> Path:
    """cache_dir(), refused in one line naming WORKBENCH_CACHE (or the default) and the fix when it is a file, or a
    folder this user cannot write: checked before `what` (a conversion, a heads folder) starts, not after it."""
    root = cache_dir()
    name = f"WORKBENCH_CACHE={root}" if os.environ.get("WORKBENCH_CACHE") else f"the workbench cache {root}"
    fix = "point WORKBENCH_CACHE at a folder you can write" + (" (or unset it: ~/.cache/workbench)"
                                                              if os.environ.get("WORKBENCH_CACHE") else "")
    try:
        check_output(root, None, "folder", name)
    except WorkbenchError as e:
        raise WorkbenchError(f"{e} (needed for {what}): {fix}") from None
    return root
