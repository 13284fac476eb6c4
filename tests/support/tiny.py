"""Test-only builders, never downloaded: a tiny random decoder of any HF architecture, a character-level tokenizer
and random Medusa heads, so tests and benchmarks can run the whole pipeline in seconds. Nothing in the workbench's
own commands or app uses them.
"""
from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from workbench import WorkbenchError
from workbench.runtime.heads import MedusaHeads

TINY_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer(vocab_size: int = 128, chat_template: bool = True):
    """A character-level tokenizer built in memory (ChatML template, EOS `</s>` = id 2). Ids past the characters
    are `<xN>`."""
    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    if vocab_size < len(specials) + len(chars):
        raise WorkbenchError(f"tiny tokenizer needs vocab_size >= {len(specials) + len(chars)}, got {vocab_size}")
    vocab = specials + chars + [f"<x{i}>" for i in range(vocab_size - len(specials) - len(chars))]
    tk = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<pad>")
    if chat_template:
        tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def tiny_model(arch: str = "llama", seed: int = 0, vocab_size: int = 128, hidden_size: int = 64, layers: int = 2,
               init_std: float = 0.2, max_positions: int = 512, attn_implementation: str | None = None,
               tied: bool = False):
    """A random decoder-only model (fp32, CPU) of a given HF architecture (llama, qwen2, mistral, gemma, gemma2,
    phi3, gpt_neox, ...); `tied` shares the input embedding with the lm_head (Gemma's default).

    init_std 0.2 (not HF's 0.02) spreads the logits, so greedy argmax has no near-ties that would make exact
    comparisons flaky. EOS is id 2, as in `tiny_tokenizer`. Sliding windows are switched off (Mistral's default
    4096 is None here) or, where the architecture needs a number for its sliding layers (Gemma 2/3), set to
    max_positions: both equal full attention over any sequence the model can hold, the attention Medusa's tree
    mask implements (`engine.check_window` refuses generations longer than a real model's window).
    """
    cfg = AutoConfig.for_model(arch, vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                               num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=max_positions, initializer_range=init_std,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=tied)
    if getattr(cfg, "head_dim", None) not in (None, hidden_size // 4):
        cfg.head_dim = hidden_size // 4  # Gemma's default 256 would make a "tiny" model 16x wider in attention
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = max_positions if "sliding_attention" in (getattr(cfg, "layer_types", None) or []) else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                                 **({"attn_implementation": attn_implementation} if attn_implementation else {}))
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model.eval().requires_grad_(False)


def random_heads(hidden_size: int, vocab_size: int, num_heads: int = 5, num_layers: int = 1, tied: bool = False,
                 seed: int = 0, std: float = 0.2) -> MedusaHeads:
    """Heads with every tensor random and non-zero (zero-initialised heads would hide a dropped weight)."""
    heads = MedusaHeads(hidden_size, vocab_size, num_heads, num_layers, tied)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return heads.requires_grad_(False)



class CountingBackend:
    """A torch.compile backend that counts the graphs dynamo hands it (aot_eager traces the same graphs as inductor,
    in seconds) and, with `fail`, refuses them as a backend that cannot compile would."""

    def __init__(self, fail: bool = False):
        self.graphs, self.fail = 0, fail

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.fail:
            raise RuntimeError("this backend cannot compile it")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
