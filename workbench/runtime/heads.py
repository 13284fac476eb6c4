"""Medusa heads: the module, and the one reader and writer of every heads file format.

Formats (checked strictly: a missing, unexpected or mis-shaped tensor is an error, never a silent drop):
  1. Medusa-1 heads-only folder: config.json (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`)
     + `medusa_lm_head.safetensors|.pt`; keys `{head}.{layer}.linear.{weight,bias}` then `{head}.{L}.weight` [V,H].
  2. "version 2" heads-only: the same ResBlocks without the per-head [V,H] matrix; logits go through the base
     model's own lm_head (tiny files; what `workbench train-heads` writes by default).
  3. Full Medusa-2 checkpoint: a model folder whose weights also hold `medusa_head.{head}...` tensors.
  4. vLLM Medusa folder (read only; export.vllm_heads writes it): config.json `model_type: medusa` + *.safetensors
     with the format 1/2 keys, and for tied heads the base model's embedding as `lm_head.weight` (not read).
Reading goes names and shapes first (a HeadsLayout, checked against limits and the base model), tensors last: the
sizes a file implies are refused before anything of their size is allocated.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from workbench import DEMO_HEADS, WorkbenchError, warn, warnings_held
from workbench.core.notes import FieldError
from workbench.core.io import atomic_write, atomic_write_json, read_json
from workbench.runtime.generation import text_config
from workbench.runtime.kvcache import free_bytes
from workbench.trees.tree import MAX_DEPTH, MAX_RANK

HEADS_FILE = "medusa_lm_head"


class ResBlock(nn.Module):
    """x + SiLU(Wx + b), W initialised to zero so an untrained head starts as the base model's own lm_head."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """K heads on the last hidden state; head k (0-based) predicts token t+k+2 (the base predicts t+1).

    A ModuleList so the state-dict keys are exactly Medusa's: `{head}.{layer}.linear.weight`, and with untied
    heads `{head}.{num_layers}.weight`. Tied heads ("version 2") reuse the base model's lm_head.
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1, tied: bool = True):
        blocks = []
        for _ in range(num_heads):
            layers = [ResBlock(hidden_size) for _ in range(num_layers)]
            if not tied:
                layers.append(nn.Linear(hidden_size, vocab_size, bias=False))
            blocks.append(nn.Sequential(*layers))
        super().__init__(blocks)
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_layers, self.tied = num_layers, tied

    @property
    def num_heads(self) -> int:
        return len(self)

    def features(self, hidden: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """hidden [..., H] -> [n, ..., H] (before any lm_head); n = the first n heads, default all K."""
        return torch.stack([head[: self.num_layers](hidden) for head in list(self)[: n or len(self)]])

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module, n: int | None = None) -> torch.Tensor:
        """hidden [..., H] -> logits [n, ..., V]. A decoder asks only for the heads its tree reaches (n = depth)."""
        if self.tied:
            return lm_head(self.features(hidden, n))
        return torch.stack([head(hidden) for head in list(self)[: n or len(self)]])


def check_heads_fit(heads, model) -> None:
    """Heads trained for another base model are a clear error, not a shape mismatch deep inside torch. `heads`:
    loaded heads, or a file's HeadsLayout (checked before any of its tensors is read)."""
    cfg = text_config(model)
    if heads.hidden_size != cfg.hidden_size:
        raise FieldError("heads", "other_model", f"heads have hidden size {heads.hidden_size} but the base model has "
                         f"{cfg.hidden_size}: they were trained for another model (pass the matching {{also}} or "
                         "{field})", also="model")
    vocab = model.get_output_embeddings().weight.shape[0]
    if heads.vocab_size and heads.vocab_size != vocab:  # 0: tied heads that name no vocabulary take the base's
        raise FieldError("heads", "other_model", f"heads have vocabulary {heads.vocab_size} but the base model has "
                         f"{vocab}: they were trained for another model (pass the matching {{also}} or {{field}})",
                         also="model")


# ----------------------------------------------------------------------------------------------- reading

_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:(linear)\.)?(weight|bias)$")
# What a heads file may imply, checked on its names and shapes before anything is allocated: a larger value is a
# damaged or foreign file, not heads (a head index of 99,999 or a hidden size of 200,000 would ask for terabytes)
MAX_HEADS = MAX_DEPTH  # one head per tree level
MAX_LAYERS = MAX_DEPTH  # ResBlocks per head (train-heads --num-layers takes as many)
MAX_HIDDEN = 1 << 16  # the widest language models have hidden sizes of 16-25k
MAX_VOCAB = MAX_RANK  # above any vocabulary


class HeadsLayout(NamedTuple):
    """What a heads file holds, read from its tensor names and shapes alone (nothing loaded)."""
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int  # 0: tied heads naming no vocabulary (they take the base model's)
    tied: bool

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor MedusaHeads(...).state_dict() holds, with its shape."""
        H, out = self.hidden_size, {}
        for h in range(self.num_heads):
            for layer in range(self.num_layers):
                out[f"{h}.{layer}.linear.weight"], out[f"{h}.{layer}.linear.bias"] = (H, H), (H,)
            if not self.tied:
                out[f"{h}.{self.num_layers}.weight"] = (self.vocab_size, H)
        return out


Index = dict[str, tuple[tuple[int, ...], bool]]  # tensor name -> (shape, floating point?), from a header


def heads_layout(index: Index, where: str, num_heads_hint: int | None = None,
                 num_layers_hint: int | None = None) -> HeadsLayout:
    """K, L, tied-ness and sizes from Medusa-format names and shapes, strict on everything, before any tensor is
    read or any module built: a size past the limits above, a missing, unexpected or mis-shaped tensor is an error."""
    bad = [k for k in index if not _KEY.match(k)]
    if bad:
        raise WorkbenchError(f"{where}: unexpected tensor '{bad[0]}' (Medusa heads have keys like 0.0.linear.weight)")
    if not index:
        raise WorkbenchError(f"{where}: holds no tensors")
    parts = {k: _KEY.match(k).groups() for k in index}
    top = max(index, key=lambda k: int(parts[k][0]))
    num_heads = int(parts[top][0]) + 1
    if num_heads > MAX_HEADS:
        raise WorkbenchError(f"{where}: tensor '{top}' implies {num_heads} heads; heads files hold at most "
                             f"{MAX_HEADS} heads (one per tree level): a damaged or foreign file")
    linear = [k for k in index if parts[k][2]]
    num_layers = max(int(parts[k][1]) for k in linear) + 1 if linear else 0
    if num_layers == 0:
        raise WorkbenchError(f"{where}: no ResBlock tensors ({{head}}.{{layer}}.linear.weight) found")
    if num_layers > MAX_LAYERS:
        raise WorkbenchError(f"{where}: {num_layers} ResBlock layers per head; at most {MAX_LAYERS}: a damaged or "
                             "foreign file")
    tied = not any(int(parts[k][1]) == num_layers and not parts[k][2] for k in index)
    if num_heads_hint is not None and num_heads_hint != num_heads:
        warn(f"{where}: config says {num_heads_hint} heads but the weights hold {num_heads}; using {num_heads} "
             "(the weights)")
    if num_layers_hint is not None and num_layers_hint != num_layers:
        raise WorkbenchError(f"{where}: config says medusa_num_layers={num_layers_hint} but the weights hold "
                             f"{num_layers} ResBlock layers per head")
    hidden = _size(index, "0.0.linear.weight", "[H, H]", where, 1, MAX_HIDDEN, "hidden size")
    vocab = 0 if tied else _size(index, f"0.{num_layers}.weight", "[V, H]", where, 0, MAX_VOCAB, "vocabulary",
                                 " (head 0's lm_head)")
    layout = HeadsLayout(num_heads, num_layers, hidden, vocab, tied)
    expected = layout.shapes()
    missing = [k for k in expected if k not in index]
    if missing:
        raise WorkbenchError(f"{where}: missing tensor '{missing[0]}' ({len(missing)} missing in all)")
    unexpected = sorted(k for k in index if k not in expected)
    if unexpected:
        raise WorkbenchError(f"{where}: unexpected tensor '{unexpected[0]}' (not part of {num_heads} heads x "
                             f"{num_layers} ResBlock{'s' if num_layers > 1 else ''}{'' if tied else ' + lm_head'})")
    for k, shape in expected.items():
        if index[k][0] != shape:
            raise WorkbenchError(f"{where}: tensor '{k}' has shape {list(index[k][0])}, expected {list(shape)}")
        if not index[k][1]:
            raise WorkbenchError(f"{where}: tensor '{k}' is not floating-point (expected float weights)")
    return layout


def _size(index: Index, key: str, form: str, where: str, dim: int, most: int, what: str, note: str = "") -> int:
    """One size of the layout, read from a 2-D tensor's shape and checked against its limit."""
    if key not in index:
        raise WorkbenchError(f"{where}: missing tensor '{key}'{note}")
    shape = index[key][0]
    if len(shape) != 2:
        raise WorkbenchError(f"{where}: tensor '{key}' has shape {list(shape)}, expected {form}")
    if not 1 <= shape[dim] <= most:
        raise WorkbenchError(f"{where}: tensor '{key}' has shape {list(shape)}: a {what} of {shape[dim]}, outside "
                             f"1..{most} (a damaged or foreign file)")
    return shape[dim]


def _build(layout: HeadsLayout, tensors, where: str) -> MedusaHeads:
    """The heads of a checked layout: its memory checked first, then the tensors read (tensors()) and checked
    finite."""
    numel = sum(math.prod(s) for s in layout.shapes().values())
    free = free_bytes(torch.device("cpu"))
    if free is not None and 8 * numel > free:  # the file's tensors, then the float32 module
        raise WorkbenchError(f"{where}: {layout.num_heads} heads of hidden size {layout.hidden_size} need about "
                             f"{8 * numel / 2 ** 30:.1f} GiB but {free / 2 ** 30:.1f} GiB are free")
    sd = tensors()
    for k, v in sd.items():
        if not torch.isfinite(v.float()).all():  # fp8 has no isfinite of its own
            raise WorkbenchError(f"{where}: tensor '{k}' holds NaN or infinite values (a diverged or corrupt "
                                 "checkpoint)")
    heads = MedusaHeads(layout.hidden_size, layout.vocab_size, layout.num_heads, layout.num_layers, layout.tied)
    heads.load_state_dict({k: t.float() for k, t in sd.items()}, strict=True)
    return heads


def _open_tensors(path: Path, prefix: str = "") -> tuple[Index, object]:
    """(index of the tensors named prefix*, without the prefix; a function reading them) of a weights file. Only
    names and shapes are read here: a safetensors header, or a .pt memory-mapped (zip format; an old-format .pt
    is read whole, its size on disk)."""
    try:
        if path.suffix == ".safetensors":
            header = {k: v for k, v in _safetensors_header(path).items() if k.startswith(prefix)}
            names = list(header)
            index = {k[len(prefix):]: (tuple(v["shape"]), v["dtype"].startswith(("F", "BF")))
                     for k, v in header.items()}

            def read():
                try:
                    with safe_open(str(path), "pt") as sf:
                        return {k[len(prefix):]: sf.get_tensor(k) for k in names}
                except Exception as e:  # a header that the data does not match: whatever safetensors raised
                    raise WorkbenchError(f"{path}: cannot read the weights ({type(e).__name__}: "
                                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
            return index, read
        with warnings.catch_warnings():  # torch's notes on pickle protocols say nothing a user can act on
            warnings.simplefilter("ignore")
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # corrupt or foreign file: one line, whatever the library raised
        first = str(e).splitlines()[0] if str(e) else ""
        raise WorkbenchError(f"{path}: cannot read the weights ({type(e).__name__}: {first})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise WorkbenchError(f"{path}: not a state dict of tensors (expected Medusa heads: names -> tensors)")
    sd = {k[len(prefix):]: v for k, v in obj.items() if k.startswith(prefix)}
    return {k: (tuple(v.shape), v.is_floating_point()) for k, v in sd.items()}, lambda: sd


def _safetensors_header(path: Path) -> dict:
    """A safetensors file's header {name: {dtype, shape, data_offsets}}, read as the format defines it (8-byte
    length, JSON): no mapping of the file, whose size may be what is wrong with it."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 2 <= n <= min(100 << 20, path.stat().st_size - 8):  # safetensors' own header limit: 100 MB
            raise ValueError(f"a header of {n} bytes")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    for k, v in header.items():
        if not (isinstance(v, dict) and isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)
                and all(isinstance(d, int) and d >= 0 for d in v["shape"]) and isinstance(v.get("data_offsets"), list)
                and len(v["data_offsets"]) == 2 and all(isinstance(o, int) for o in v["data_offsets"])):
            raise ValueError(f"tensor {k!r} has no dtype, shape and data offsets")
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    if 8 + n + end != path.stat().st_size:
        raise ValueError(f"the header describes {end} bytes of tensors, the file holds {path.stat().st_size - 8 - n} "
                         "(truncated or damaged)")
    return header


def _read_config(folder: Path) -> dict:
    """A heads folder's config.json; the numbers it may hold are checked (the weights decide everything else)."""
    f = folder / "config.json"
    if not f.is_file():
        return {}
    cfg = read_json(f, str(folder))
    for key, most in (("medusa_num_heads", MAX_HEADS), ("medusa_num_layers", MAX_LAYERS), ("vocab_size", MAX_VOCAB)):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= most):
            raise WorkbenchError(f"{f}: {key} should be an integer in 1..{most}, found {str(v)[:40]!r}")
    return cfg


def _open_heads(path) -> tuple[HeadsLayout, dict, object, str]:
    """(layout, config, tensor reader, what to call the file) of --heads: names and shapes read and checked,
    nothing loaded."""
    folder = Path(path) if path is not None else DEMO_HEADS
    if path is None and not folder.is_dir():
        raise FieldError("heads", "no_demo", "the demo heads are not in this checkout; pass {field}")
    if not folder.exists():
        raise FieldError("heads", "missing", f"{{field}} {folder}: no such file or folder")
    if folder.is_file():
        index, read = _open_tensors(folder)
        return heads_layout(index, str(folder)), {}, read, str(folder)
    cfg = _read_config(folder)
    hints = cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers")
    for name in (f"{HEADS_FILE}.safetensors", f"{HEADS_FILE}.pt"):
        if (folder / name).is_file():
            index, read = _open_tensors(folder / name)
            layout = heads_layout(index, str(folder / name), *hints)
            if layout.tied and cfg.get("vocab_size"):
                layout = layout._replace(vocab_size=int(cfg["vocab_size"]))
            return layout, cfg, read, str(folder / name)
    if cfg.get("model_type") == "medusa":  # 4. the vLLM Medusa folder `export --format vllm-heads` writes
        index, read = _vllm_tensors(folder, cfg)
        where = f"{folder} (vLLM Medusa folder)"
        layout = heads_layout(index, where, cfg.get("num_heads"), cfg.get("num_hidden_layers"))
        if layout.tied and cfg.get("vocab_size"):
            layout = layout._replace(vocab_size=int(cfg["vocab_size"]))
        return layout, cfg, read, where
    index, read = _medusa2_tensors(folder)
    if index:
        where = f"{folder} (medusa_head.* tensors)"
        return heads_layout(index, where, *hints), cfg, read, where
    raise FieldError("heads", "none_found", f"{{field}} {folder}: no {HEADS_FILE}.safetensors/.pt, no "
                     "medusa_head.* tensors in the model weights and no vLLM Medusa config (model_type medusa)")


def _vllm_tensors(folder: Path, cfg: dict) -> tuple[Index, object]:
    """(index, reader) of a vLLM Medusa folder (export.vllm_heads.write_vllm_heads): the blocks under Medusa's own
    names in its *.safetensors; for tied heads (original_lm_head) its lm_head.weight is the base model's output
    embedding, not the heads': left out, so the heads read back tied."""
    for key in ("num_heads", "num_hidden_layers"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31):
            raise WorkbenchError(f"{folder / 'config.json'}: {key} should be a positive integer, found {str(v)[:40]!r}")
    drop = {"lm_head.weight"} if cfg.get("original_lm_head") else set()
    index, readers = {}, []
    for f in sorted(folder.glob("*.safetensors")):
        i, read = _open_tensors(f)
        index.update({k: v for k, v in i.items() if k not in drop})
        readers.append(read)
    return index, lambda: {k: v for read in readers for k, v in read().items() if k not in drop}


def inspect_heads(path: str | Path | None = None) -> tuple[HeadsLayout, dict]:
    """(layout, config) of the heads at `path` from names and shapes alone: a bad path or an absurd file fails in a
    second, before a base model loads."""
    with warnings_held():  # a config that disagrees with the weights: said in the error if the file is refused
        layout, cfg, _, _ = _open_heads(path)
    return layout, cfg


def load_heads(path: str | Path | None = None, fit=None) -> tuple[MedusaHeads, dict]:
    """Heads from a heads-only folder (formats 1 and 2), a single weights file, or a Medusa-2 model folder (3).

    Returns (heads, config). `None` means the demo heads shipped with the workbench. `fit`: the base model the
    heads must fit, checked (check_heads_fit) before any of their tensors is read.
    """
    with warnings_held():
        layout, cfg, read, where = _open_heads(path)
        if fit is not None:
            check_heads_fit(layout, fit)
        heads = _build(layout, read, where)
    heads.vocab_size = layout.vocab_size
    return heads, cfg


def _medusa2_tensors(folder: Path) -> tuple[Index, object]:
    """(index, reader) of the `medusa_head.*` tensors of a full Medusa-2 checkpoint (single or sharded
    safetensors, or .bin)."""
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    index, readers = {}, []
    for f in files:
        i, read = _open_tensors(f, "medusa_head.")
        if i:
            index.update(i)
            readers.append(read)
    return index, lambda: {k: v for read in readers for k, v in read().items()}


def save_heads(heads: MedusaHeads, folder: str | Path, base_model: str, fmt: int | None = None,
               extra: dict | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write a heads-only folder: format 1 (per-head lm_head) or 2 (ResBlocks only). Atomic per file.

    `dtype` (e.g. torch.float16, as released Medusa heads are) halves the file; loading casts back to float.
    """
    fmt = fmt or (2 if heads.tied else 1)
    if fmt == 1 and heads.tied:
        raise WorkbenchError("format 1 needs a per-head lm_head; these heads share the base lm_head (use format 2)")
    if fmt == 2 and not heads.tied:
        raise WorkbenchError("format 2 has no per-head lm_head; these heads have their own (use format 1)")
    folder = Path(folder)
    sd = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in heads.state_dict().items()}
    atomic_write(folder / f"{HEADS_FILE}.safetensors", lambda tmp: save_file(sd, str(tmp)), "out")
    cfg = dict(medusa_num_heads=heads.num_heads, medusa_num_layers=heads.num_layers,
               base_model_name_or_path=base_model, hidden_size=heads.hidden_size, vocab_size=heads.vocab_size,
               tied_lm_head=heads.tied, medusa_format=fmt, **(extra or {}))
    atomic_write_json(folder / "config.json", cfg, "out")
    return folder


def medusa2_heads_present(model: str) -> bool:
    """Does a model folder hold Medusa-2 `medusa_head.*` tensors (the heads then need no --heads)?"""
    p = Path(model)
    return p.is_dir() and bool(_medusa2_tensors(p)[0])


def heads_fingerprint(heads) -> str:
    """A hash of the heads' weights: retrained heads in the same folder are a different calibration."""
    h = hashlib.sha256()
    for k, v in sorted(heads.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
