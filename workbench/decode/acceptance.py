"""How a tree's nodes are accepted, on the device for all B sequences at once: greedy (lossless), typical (Medusa
paper §2.3.1) and nucleus sampling; the longest accepted path per sequence. A new rule touches this file and the
CLI/app option lists."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench import ACCEPTANCE_KINDS, WorkbenchError
from workbench.core.notes import FieldError
from workbench.runtime.treemask import batched

ENTROPY_FORMS = ("exact", "medusa")  # -sum p log p, or Medusa's code: -sum p log(p + 1e-5)


@dataclass
class Acceptance:
    """How a tree node is accepted. greedy: token == argmax (lossless). typical (Medusa paper §2.3.1): p(x) >
    min(epsilon, delta * exp(-H(p))) at `temperature`, root greedy, longest path, ties by likelihood; delta
    defaults to sqrt(epsilon), the rule of Medusa's code (posterior_alpha = sqrt(posterior_threshold): 0.3 at its
    default 0.09), and any other delta is asked for explicitly. `entropy` "exact" is -sum p log p; "medusa" is
    Medusa's code's -sum p log(p + 1e-5), for its exact behaviour. nucleus: one sample per node from the top_p
    nucleus, a child is accepted when it equals its parent's sample (so the output is distributed exactly as
    vanilla nucleus sampling)."""

    kind: str = "greedy"
    temperature: float = 0.0
    epsilon: float = 0.09
    delta: float | str | None = None   # None or "sqrt": sqrt(epsilon)
    top_p: float = 0.8
    seed: int | None = None
    entropy: str = "exact"

    def __post_init__(self):
        if self.delta is None or self.delta == "sqrt":
            self.delta = math.sqrt(self.epsilon) if 0 < self.epsilon <= 1 else 0.0
        if self.entropy not in ENTROPY_FORMS:
            raise WorkbenchError(f"entropy '{self.entropy}': unknown (use {', '.join(ENTROPY_FORMS)})")
        if self.kind not in ACCEPTANCE_KINDS:
            raise FieldError("acceptance", "unknown", f"{{field}} '{self.kind}': unknown (use "
                             f"{', '.join(ACCEPTANCE_KINDS)})")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise FieldError("temperature", "out_of_range", f"{{field}} {self.temperature}: must be a finite number >= 0")
        if not 0 < self.epsilon <= 1:
            raise FieldError("epsilon", "out_of_range", f"{{field}} {self.epsilon}: must be in (0, 1]")
        if not (self.delta >= 0 and math.isfinite(self.delta)):
            raise FieldError("delta", "out_of_range", f"{{field}} {self.delta}: must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise FieldError("top_p", "out_of_range", f"{{field}} {self.top_p}: must be in (0, 1]")


def best_path(ok: torch.Tensor, score: torch.Tensor | None, tree) -> tuple[torch.Tensor, torch.Tensor]:
    """ok [B, N] (node accepted given its parent; ok[:, 0] = root), score [B, N] or None, tree: its `ancestors`
    [N, D+1] and `depths` [N] (or each sequence's, [B, ...]: treemask.batched) -> (deepest accepted node [B], nodes
    accepted incl. the root [B]), on the device
    with fixed shapes. Every node's own path is a candidate: the longest fully accepted one wins, ties by the
    summed score (log-likelihood), then the lowest node."""
    tree = batched(tree, ok.shape[0])
    anc, depths = tree.ancestors, tree.depths                                # [B, N, D+1], [B, N]
    whole = ok.gather(1, anc.flatten(1)).view(anc.shape).all(dim=2)          # [B, N] every node on the path ok
    length = torch.where(whole, depths + 1, 0)                               # [B, N]
    if score is None:
        last = length.argmax(dim=1)                                          # [B]
    else:
        real = torch.arange(anc.shape[2], device=anc.device) <= depths[..., None]  # [B, N, D+1]
        total = (score.gather(1, anc.flatten(1)).view(anc.shape) * real).sum(dim=2)  # [B, N]
        last = torch.where(length == length.amax(dim=1, keepdim=True), total, -math.inf).argmax(dim=1)
    return last, length.gather(1, last[:, None])[:, 0]


def _parent_tokens_ok(tokens: torch.Tensor, target: torch.Tensor, tree) -> torch.Tensor:
    """tokens [B, N], target [B, N] (what each node's logits emit) -> ok [B, N]: node i's token == its parent's
    target (the root always)."""
    parents = batched(tree, tokens.shape[0]).parents                                      # [B, N]
    root = torch.arange(tokens.shape[1], device=tokens.device) == 0                       # [N]
    return (tokens == target.gather(1, parents)) | root


def accept_greedy(logits: torch.Tensor, tokens: torch.Tensor, tree):
    """logits [B, N, V] (any dtype: only their argmax is read), tokens [B, N] -> (last node [B], length [B], next
    token [B]). Lossless: plain greedy's output."""
    target = logits.argmax(dim=-1)                                           # [B, N]
    last, length = best_path(_parent_tokens_ok(tokens, target, tree), None, tree)
    return last, length, target.gather(1, last[:, None])[:, 0]


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] -> fp32 probabilities at temperature; temperature 0 is the one-hot argmax (the greedy limit)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(logits.float() / temperature, dim=-1)


def entropy(p: torch.Tensor, form: str = "exact") -> torch.Tensor:
    """p [..., V] -> H(p) [...]. "exact": -sum p log p (0 log 0 = 0); "medusa": Medusa's code's
    -sum p log(p + 1e-5), which it uses for typical acceptance (slightly lower on peaked rows)."""
    if form == "medusa":
        return -(p * torch.log(p + 1e-5)).sum(dim=-1)
    return -torch.special.xlogy(p, p).sum(dim=-1)


def typical_decisions(logits: torch.Tensor, tokens: torch.Tensor, tree, temperature: float,
                      epsilon: float, delta: float, form: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa §2.3.1 per node: logits [B, N, V], tokens [B, N] -> (ok [B, N]: the node's token x has
    p_parent(x) > min(epsilon, delta * exp(-H(p_parent))), the root always; p_parent(x) [B, N])."""
    p = _probs(logits, temperature)                                          # [B, N, V]
    threshold = torch.clamp(delta * torch.exp(-entropy(p, form)), max=epsilon)  # [B, N]
    parents = batched(tree, tokens.shape[0]).parents                         # [B, N]
    p_tok = p.flatten(1).gather(1, parents * p.shape[2] + tokens)           # [B, N] p_parent(node token)
    root = torch.arange(tokens.shape[1], device=tokens.device) == 0
    return (p_tok > threshold.gather(1, parents)) | root, p_tok


def accept_typical(logits: torch.Tensor, tokens: torch.Tensor, tree, temperature: float,
                   epsilon: float, delta: float, form: str = "exact"):
    """Typical acceptance: the longest prefix of nodes `typical_decisions` accepts; the next token is greedy."""
    ok, p_tok = typical_decisions(logits, tokens, tree, temperature, epsilon, delta, form)
    root = torch.arange(tokens.shape[1], device=tokens.device) == 0
    score = torch.where(root, 0.0, torch.log(p_tok.clamp(min=1e-30)))       # [B, N]
    last, length = best_path(ok, score, tree)
    nxt = logits.gather(1, last[:, None, None].expand(-1, 1, logits.shape[-1]))[:, 0].argmax(dim=-1)  # [B]
    return last, length, nxt


def sample_nucleus(logits: torch.Tensor, temperature: float, top_p: float, uniform: torch.Tensor) -> torch.Tensor:
    """logits [..., V], uniform [...] in [0, 1) -> one token per row [...] from the top_p nucleus at temperature
    (argmax at temperature 0). Inverse-CDF sampling over the sorted nucleus: one uniform per row, no host sync
    (torch.multinomial's is one on CUDA), fixed shapes; the nucleus's cumulative sum is computed anyway."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    p = torch.softmax(logits.float() / temperature, dim=-1)                  # [..., V]
    sp, order = p.sort(dim=-1, descending=True)                              # [..., V]
    drop = (sp.cumsum(dim=-1) - sp) >= top_p                                 # keep the smallest prefix reaching top_p
    cdf = sp.masked_fill(drop, 0).cumsum(dim=-1)                             # [..., V]
    pick = (cdf <= uniform[..., None] * cdf[..., -1:]).sum(dim=-1, keepdim=True).clamp(max=p.shape[-1] - 1)
    return order.gather(-1, pick)[..., 0]


def accept_nucleus(logits: torch.Tensor, tokens: torch.Tensor, tree, temperature: float, top_p: float,
                   uniform: torch.Tensor):
    """One nucleus sample per node (uniform [B, N]); a child is accepted iff it equals its parent's sample, and the
    sample at the last accepted node is the next token: every emitted token is a nucleus sample given its prefix."""
    target = sample_nucleus(logits, temperature, top_p, uniform)           # [B, N]
    last, length = best_path(_parent_tokens_ok(tokens, target, tree), None, tree)
    return last, length, target.gather(1, last[:, None])[:, 0]


def accept(logits: torch.Tensor, tokens: torch.Tensor, tree, rule: Acceptance, uniform: torch.Tensor | None = None):
    """The one acceptance selection for every rule: logits [B, N, V] (the lm_head's, in the model's dtype: greedy
    reads their argmax, the other rules fp32 probabilities), tokens [B, N], uniform [B, N] (nucleus) ->
    (last node, length, next) [B] each."""
    if rule.kind == "greedy":
        return accept_greedy(logits, tokens, tree)
    if rule.kind == "typical":
        return accept_typical(logits, tokens, tree, rule.temperature, rule.epsilon, rule.delta, rule.entropy)
    return accept_nucleus(logits, tokens, tree, rule.temperature, rule.top_p, uniform)


def first_token(logits: torch.Tensor, rule: Acceptance, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] -> the roots of the first step [B]: greedy (greedy, typical) or a nucleus sample."""
    if rule.kind == "nucleus":
        return sample_nucleus(logits, rule.temperature, rule.top_p, uniform)
    return logits.argmax(dim=-1)


# ----------------------------------------------------------------------------------------------- random numbers
# Counter-based: the uniforms of a step are a hash of (seed, step, position), computed on the device with integer
# ops (identical eager and compiled, no generator state, nothing for a CUDA graph to capture but arithmetic).

_MASK = 0xFFFFFFFF
_MIX = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)  # odd multipliers < 2**31: every product fits in int64


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) of int64 values in [0, 2**32)."""
    for m in _MIX:
        x = ((x ^ (x >> 16)) * m) & _MASK
    return x ^ (x >> 16)


def uniforms(seed: torch.Tensor, counter: torch.Tensor, shape: tuple, device) -> torch.Tensor:
    """seed [], counter [] (int64) -> fp32 uniforms in [0, 1) of `shape`, a fixed function of the three."""
    key = _mix((_mix(seed & _MASK) ^ (counter & _MASK)) & _MASK)                            # []
    n = torch.arange(math.prod(shape), device=device).reshape(shape)                        # [shape]
    return (_mix((n * 0x9E37 + key) & _MASK) >> 8).float() * 2.0 ** -24


def seed_for(rule: Acceptance) -> int:
    """The seed of a generation: the rule's, else a fresh one (sampling rules only draw from it)."""
    return rule.seed if rule.seed is not None else int(torch.randint(1 << 31, ()))
