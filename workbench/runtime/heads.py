"""Medusa heads: the module, and the one reader and writer of every heads file format.

Formats (checked strictly: a missing, unexpected or mis-shaped tensor is an error, never a silent drop):
  1. Medusa-1 heads-only folder: config.json (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`)
     + `medusa_lm_head.safetensors|.pt`; keys `{head}.{layer}.linear.{weight,bias}` then `{head}.{L}.weight` [V,H].
  2. "version 2" heads-only: the same ResBlocks without the per-head [V,H] matrix; logits go through the base
     model's own lm_head (tiny files; what `workbench train-heads` writes by default).
  3. Full Medusa-2 checkpoint: a model folder whose weights also hold `medusa_head.{head}...` tensors.
  4. vLLM Medusa folder (read only; export.engines writes it): config.json `model_type: medusa` + *.safetensors
     with the format 1/2 keys, and for tied heads the base model's embedding as `lm_head.weight` (not read).
"""
from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from workbench import DEMO_HEADS, WorkbenchError
from workbench.core.io import atomic_write, atomic_write_json, read_json
from workbench.runtime.generation import text_config

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


def check_heads_fit(heads: MedusaHeads, model) -> None:
    """Heads trained for another base model are a clear error, not a shape mismatch deep inside torch."""
    cfg = text_config(model)
    if heads.hidden_size != cfg.hidden_size:
        raise WorkbenchError(f"heads have hidden size {heads.hidden_size} but the base model has {cfg.hidden_size}: "
                             "they were trained for another model (pass the matching --model or --heads)")
    vocab = model.get_output_embeddings().weight.shape[0]
    if heads.vocab_size != vocab:
        raise WorkbenchError(f"heads have vocabulary {heads.vocab_size} but the base model has {vocab}: "
                             "they were trained for another model (pass the matching --model or --heads)")


_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:(linear)\.)?(weight|bias)$")


def heads_from_state_dict(sd: dict[str, torch.Tensor], where: str, num_heads_hint: int | None = None,
                          num_layers_hint: int | None = None) -> MedusaHeads:
    """Build heads from Medusa-format keys, inferring K, L and tied-ness from the tensors; strict on everything."""
    bad = [k for k in sd if not _KEY.match(k)]
    if bad:
        raise WorkbenchError(f"{where}: unexpected tensor '{bad[0]}' (Medusa heads have keys like 0.0.linear.weight)")
    if not sd:
        raise WorkbenchError(f"{where}: holds no tensors")
    heads_idx = sorted({int(_KEY.match(k).group(1)) for k in sd})
    num_heads = heads_idx[-1] + 1
    linear_layers = sorted({int(_KEY.match(k).group(2)) for k in sd if _KEY.match(k).group(3)})
    num_layers = (linear_layers[-1] + 1) if linear_layers else 0
    if num_layers == 0:
        raise WorkbenchError(f"{where}: no ResBlock tensors ({{head}}.{{layer}}.linear.weight) found")
    tied = not any(int(_KEY.match(k).group(2)) == num_layers and not _KEY.match(k).group(3) for k in sd)
    if num_heads_hint is not None and num_heads_hint != num_heads:
        warnings.warn(f"{where}: config says {num_heads_hint} heads but the weights hold {num_heads}; "
                      f"using {num_heads} (the weights)")
    if num_layers_hint is not None and num_layers_hint != num_layers:
        raise WorkbenchError(f"{where}: config says medusa_num_layers={num_layers_hint} but the weights hold "
                             f"{num_layers} ResBlock layers per head")
    w0 = sd.get("0.0.linear.weight")
    if w0 is None:
        raise WorkbenchError(f"{where}: missing tensor '0.0.linear.weight'")
    if w0.ndim != 2:
        raise WorkbenchError(f"{where}: tensor '0.0.linear.weight' has shape {list(w0.shape)}, expected [H, H]")
    hidden = w0.shape[1]
    vocab = None
    if not tied:
        lm0 = sd.get(f"0.{num_layers}.weight")
        if lm0 is None:
            raise WorkbenchError(f"{where}: missing tensor '0.{num_layers}.weight' (head 0's lm_head)")
        if lm0.ndim != 2:
            raise WorkbenchError(f"{where}: tensor '0.{num_layers}.weight' has shape {list(lm0.shape)}, expected [V, H]")
        vocab = lm0.shape[0]
    heads = MedusaHeads(hidden, vocab or 0, num_heads, num_layers, tied)
    expected = heads.state_dict()
    missing = [k for k in expected if k not in sd]
    if missing:
        raise WorkbenchError(f"{where}: missing tensor '{missing[0]}' ({len(missing)} missing in all)")
    unexpected = sorted(k for k in sd if k not in expected)
    if unexpected:
        raise WorkbenchError(f"{where}: unexpected tensor '{unexpected[0]}' (not part of {num_heads} heads x "
                             f"{num_layers} ResBlock{'s' if num_layers > 1 else ''}{'' if tied else ' + lm_head'})")
    for k, v in expected.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise WorkbenchError(f"{where}: tensor '{k}' has shape {list(sd[k].shape)}, expected {list(v.shape)}")
        if not sd[k].is_floating_point():
            raise WorkbenchError(f"{where}: tensor '{k}' has dtype {sd[k].dtype}, expected a floating-point type")
        if not torch.isfinite(sd[k].float()).all():  # fp8 has no isfinite of its own
            raise WorkbenchError(f"{where}: tensor '{k}' holds NaN or infinite values (a diverged or corrupt checkpoint)")
    heads.load_state_dict({k: t.float() for k, t in sd.items()}, strict=True)
    return heads


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file: one line, whatever the library raised
        raise WorkbenchError(f"{path}: cannot read the weights ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise WorkbenchError(f"{path}: not a state dict of tensors (expected Medusa heads: names -> tensors)")
    return obj


def _read_config(folder: Path) -> dict:
    """A heads folder's config.json; the numbers it may hold are checked (the weights decide everything else)."""
    f = folder / "config.json"
    if not f.is_file():
        return {}
    cfg = read_json(f, str(folder))
    for key in ("medusa_num_heads", "medusa_num_layers", "vocab_size"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31):
            raise WorkbenchError(f"{f}: {key} should be a positive integer, found {str(v)[:40]!r}")
    return cfg


def load_heads(path: str | Path | None = None) -> tuple[MedusaHeads, dict]:
    """Heads from a heads-only folder (formats 1 and 2), a single weights file, or a Medusa-2 model folder (3).

    Returns (heads, config). `None` means the demo heads shipped with the workbench.
    """
    folder = Path(path) if path is not None else DEMO_HEADS
    if path is None and not folder.is_dir():
        raise WorkbenchError("the demo heads are not in this checkout; pass --heads")
    if not folder.exists():
        raise WorkbenchError(f"--heads {folder}: no such file or folder")
    if folder.is_file():
        return heads_from_state_dict(_read_tensors(folder), str(folder)), {}
    cfg = _read_config(folder)
    for name in (f"{HEADS_FILE}.safetensors", f"{HEADS_FILE}.pt"):
        if (folder / name).is_file():
            heads = heads_from_state_dict(_read_tensors(folder / name), str(folder / name),
                                          cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers"))
            if heads.tied and cfg.get("vocab_size"):
                heads.vocab_size = int(cfg["vocab_size"])
            return heads, cfg
    if cfg.get("model_type") == "medusa":  # 4. the vLLM Medusa folder `export --format vllm-heads` writes
        return _vllm_heads(folder, cfg), cfg
    medusa2 = _medusa2_tensors(folder)
    if medusa2:
        return heads_from_state_dict(medusa2, f"{folder} (medusa_head.* tensors)",
                                     cfg.get("medusa_num_heads"), cfg.get("medusa_num_layers")), cfg
    raise WorkbenchError(f"--heads {folder}: no {HEADS_FILE}.safetensors/.pt, no medusa_head.* tensors in the "
                         "model weights and no vLLM Medusa config (model_type medusa)")


def _vllm_heads(folder: Path, cfg: dict) -> MedusaHeads:
    """A vLLM Medusa folder (export.engines.write_vllm_heads): the blocks under Medusa's own names in its
    *.safetensors, and for tied heads (original_lm_head) the base model's output embedding as lm_head.weight, which
    is the base model's, not the heads': left out, the heads read back tied."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WorkbenchError(f"--heads {folder}: a vLLM Medusa folder (model_type medusa) without *.safetensors")
    sd = {k: v for f in files for k, v in _read_tensors(f).items()}
    if cfg.get("original_lm_head"):
        sd.pop("lm_head.weight", None)
    for key in ("num_heads", "num_hidden_layers", "vocab_size"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31):
            raise WorkbenchError(f"{folder / 'config.json'}: {key} should be a positive integer, found {str(v)[:40]!r}")
    heads = heads_from_state_dict(sd, f"{folder} (vLLM Medusa folder)", cfg.get("num_heads"),
                                  cfg.get("num_hidden_layers"))
    if heads.tied and cfg.get("vocab_size"):
        heads.vocab_size = int(cfg["vocab_size"])
    return heads


def _medusa2_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The `medusa_head.*` tensors of a full Medusa-2 checkpoint (single or sharded safetensors, or .bin)."""
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    out = {}
    for f in files:
        if f.suffix == ".safetensors":
            try:
                with safe_open(str(f), "pt") as sf:
                    for k in sf.keys():
                        if k.startswith("medusa_head."):
                            out[k[len("medusa_head."):]] = sf.get_tensor(k)
            except Exception as e:
                raise WorkbenchError(f"{f}: cannot read the weights ({type(e).__name__})") from None
        else:
            sd = _read_tensors(f)
            out.update({k[len("medusa_head."):]: v for k, v in sd.items() if k.startswith("medusa_head.")})
    return out


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
    atomic_write(folder / f"{HEADS_FILE}.safetensors", lambda tmp: save_file(sd, str(tmp)), "--out")
    cfg = dict(medusa_num_heads=heads.num_heads, medusa_num_layers=heads.num_layers,
               base_model_name_or_path=base_model, hidden_size=heads.hidden_size, vocab_size=heads.vocab_size,
               tied_lm_head=heads.tied, medusa_format=fmt, **(extra or {}))
    atomic_write_json(folder / "config.json", cfg, "--out")
    return folder


def medusa2_heads_present(model: str) -> bool:
    """Does a model folder hold Medusa-2 `medusa_head.*` tensors (the heads then need no --heads)?"""
    p = Path(model)
    return p.is_dir() and bool(_medusa2_tensors(p))


def heads_fingerprint(heads) -> str:
    """A hash of the heads' weights: retrained heads in the same folder are a different calibration."""
    h = hashlib.sha256()
    for k, v in sorted(heads.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
