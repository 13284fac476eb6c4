"""A heads folder vLLM's Medusa drafter loads (vLLM <= 0.32.0; `export --format vllm-heads`): config model_type
medusa, biases kept with medusa_fc_bias, the base model's output embedding as lm_head.weight for tied heads; fp32.
What vLLM's Medusa module cannot represent is an error, never a folder that drafts garbage."""
from __future__ import annotations

from pathlib import Path

from workbench import WorkbenchError
from workbench.core.io import atomic_write, atomic_write_json

VLLM_HEADS_WEIGHTS = "model.safetensors"  # vLLM's loader reads every *.safetensors of the folder
LOGIT_SCALES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def vllm_heads_tensors(heads, output_embedding) -> tuple[dict, dict]:
    """(tensors, config) of the heads folder vLLM's Medusa drafter loads (vllm/model_executor/models/medusa.py,
    transformers_utils/configs/medusa.py, 0.32.0): the ResBlocks under Medusa's own `{head}.{layer}.linear.*`
    names (vLLM maps them to blocks.{head}.layers.{layer}.*), with medusa_fc_bias so their biases load (without
    it vLLM drops them silently); tied heads (format 2) share the base model's output embedding, written as
    `lm_head.weight` with original_lm_head; untied heads keep `{head}.{L}.weight` (vLLM's lm_heads.{head}). fp32.
    `output_embedding` [V, H]: the base model's (`get_output_embeddings().weight`, right for tied and untied)."""
    sd = {k: v.detach().float().contiguous().cpu() for k, v in heads.state_dict().items()}
    vocab = int(output_embedding.shape[0])
    if heads.tied:
        sd["lm_head.weight"] = output_embedding.detach().float().contiguous().cpu()
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": heads.num_heads,
           "num_hidden_layers": heads.num_layers, "hidden_size": heads.hidden_size, "vocab_size": vocab,
           "truncated_vocab_size": vocab, "medusa_fc_bias": True, "original_lm_head": bool(heads.tied),
           "torch_dtype": "float32"}
    return sd, cfg


def check_vllm_heads(heads, base) -> None:
    """What vLLM's Medusa module cannot represent is an error, never a folder that drafts garbage."""
    # deferred: torch and transformers, which tree and plan exports never need
    from workbench.runtime.generation import text_config
    from workbench.runtime.heads import check_heads_fit

    check_heads_fit(heads, base)
    out = base.get_output_embeddings()
    if getattr(out, "bias", None) is not None:
        raise WorkbenchError("the base model's output layer has a bias; vLLM's Medusa lm_head has none, so its "
                             "drafts would differ from these heads': use heads with their own lm_head (untied)")
    cfg = text_config(base)
    for key in LOGIT_SCALES:
        v = getattr(cfg, key, None)
        if v not in (None, 1, 1.0) and heads.tied:
            raise WorkbenchError(f"the base model scales its logits ({key}={v}); vLLM's Medusa drafter would draft "
                                 "from unscaled ones: not representable as a vLLM Medusa folder")
    if out.weight.shape[1] != heads.hidden_size:
        raise WorkbenchError(f"the base model's output embedding is {list(out.weight.shape)}, not [V, "
                             f"{heads.hidden_size}]: vLLM's Medusa lm_head cannot take it")


def write_vllm_heads(heads, base, out, base_label: str) -> dict:
    """Check, then write the vLLM Medusa folder `out` for heads on a loaded base model (fp32); its config."""
    from safetensors.torch import save_file  # deferred: torch, which tree and plan exports never need

    if heads.tied and not heads.vocab_size:
        heads.vocab_size = base.get_output_embeddings().weight.shape[0]
    check_vllm_heads(heads, base)
    sd, cfg = vllm_heads_tensors(heads, base.get_output_embeddings().weight)
    cfg["base_model_name_or_path"] = base_label
    atomic_write(Path(out) / VLLM_HEADS_WEIGHTS, lambda tmp: save_file(sd, str(tmp)), "out")
    atomic_write_json(Path(out) / "config.json", cfg, "out")
    return cfg


def export_vllm_heads(heads_dir, model, out) -> tuple[dict, list[str]]:
    """Write `out`: a heads folder for vLLM <= 0.32.0 (--speculative-config '{"method": "medusa", "model": OUT,
    "num_speculative_tokens": K}'). (config written, notes). Atomic per file."""
    # deferred: torch and transformers, which tree and plan exports never need
    from workbench.runtime.heads import load_heads
    from workbench.runtime.models import load_base, model_label

    heads, _ = load_heads(heads_dir)
    base, _ = load_base(model, "cpu", "float32", need_tokenizer=False)
    cfg = write_vllm_heads(heads, base, out, model_label(model))
    notes = [f"{heads.num_heads} heads x {heads.num_layers} ResBlock(s), "
             + ("tied: the base model's output embedding written as lm_head.weight (original_lm_head)" if heads.tied
                else "untied: each head's own lm_head"),
             f"serve with vLLM <= 0.32.0 (checked on 0.32.0): --speculative-config '{{\"method\": \"medusa\", "
             f"\"model\": \"{Path(out).resolve()}\", \"num_speculative_tokens\": K}}' with K <= {heads.num_heads} "
             "(vLLM 0.33.0 removed Medusa)"]
    return cfg, notes
