"""How a tree's nodes are accepted, on the device for all B sequences at once: greedy (lossless), typical (Medusa
paper §2.3.1) and nucleus sampling; the longest accepted path per sequence. A new rule touches this file and the
CLI/app option lists."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench import ACCEPTANCE_KINDS, WorkbenchError
from workbench.runtime.treemask import TreeBuffers

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
            raise WorkbenchError(f"acceptance '{self.kind}': unknown (use {', '.join(ACCEPTANCE_KINDS)})")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise WorkbenchError(f"--temperature {self.temperature}: must be a finite number >= 0")
        if not 0 < self.epsilon <= 1:
            raise WorkbenchError(f"--epsilon {self.epsilon}: must be in (0, 1]")
        if not (self.delta >= 0 and math.isfinite(self.delta)):
            raise WorkbenchError(f"--delta {self.delta}: must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise WorkbenchError(f"--top-p {self.top_p}: must be in (0, 1]")


def best_path(ok: torch.Tensor, score: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
    """ok [B, N] (node accepted given its parent; ok[:, 0] = root), score [B, N] -> (retrieve row [B], nodes
    accepted incl. the root [B]), on the device. Longest accepted prefix over all root-to-leaf rows; ties by the
    summed score (log-likelihood), then the first row."""
    run = (ok[:, buf.gather] & buf.real).long().cumprod(dim=2)               # [B, R, D+1] 1 while accepted
    length = run.sum(dim=2)                                                  # [B, R]
    total = (run * score[:, buf.gather]).sum(dim=2)                          # [B, R]
    total = torch.where(length == length.amax(dim=1, keepdim=True), total, -math.inf)
    row = total.argmax(dim=1)                                                # [B]
    return row, length.gather(1, row[:, None])[:, 0]


def last_node(row: torch.Tensor, count: torch.Tensor, buf: TreeBuffers) -> torch.Tensor:
    """row [B], count [B] -> the deepest accepted node of each sequence [B]."""
    return buf.gather[row].gather(1, (count - 1)[:, None])[:, 0]


def _parent_tokens_ok(tokens: torch.Tensor, target: torch.Tensor, buf: TreeBuffers) -> torch.Tensor:
    """tokens [B, N], target [B, N] (what each node's logits emit) -> ok [B, N]: node i's token == its parent's
    target (the root always)."""
    ok = tokens == target[:, buf.parents]
    ok[:, 0] = True
    return ok


def accept_greedy(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers):
    """logits [B, N, V], tokens [B, N] -> (row [B], length [B], next token [B]). Lossless: plain greedy's output."""
    target = logits.argmax(dim=-1)                                           # [B, N]
    row, length = best_path(_parent_tokens_ok(tokens, target, buf), torch.zeros_like(logits[..., 0]), buf)
    return row, length, target.gather(1, last_node(row, length, buf)[:, None])[:, 0]


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] -> probabilities at temperature; temperature 0 is the one-hot argmax (the greedy limit)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    return torch.softmax(logits / temperature, dim=-1)


def entropy(p: torch.Tensor, form: str = "exact") -> torch.Tensor:
    """p [..., V] -> H(p) [...]. "exact": -sum p log p (0 log 0 = 0); "medusa": Medusa's code's
    -sum p log(p + 1e-5), which it uses for typical acceptance (slightly lower on peaked rows)."""
    if form == "medusa":
        return -(p * torch.log(p + 1e-5)).sum(dim=-1)
    return -torch.special.xlogy(p, p).sum(dim=-1)


def typical_decisions(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, temperature: float,
                      epsilon: float, delta: float, form: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa §2.3.1 per node: logits [B, N, V], tokens [B, N] -> (ok [B, N]: the node's token x has
    p_parent(x) > min(epsilon, delta * exp(-H(p_parent))), the root always; p_parent(x) [B, N])."""
    p = _probs(logits, temperature)                                          # [B, N, V]
    threshold = torch.clamp(delta * torch.exp(-entropy(p, form)), max=epsilon)  # [B, N]
    p_tok = p[:, buf.parents].gather(2, tokens[..., None])[..., 0]          # [B, N] p_parent(node token)
    ok = p_tok > threshold[:, buf.parents]
    ok[:, 0] = True
    return ok, p_tok


def accept_typical(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, temperature: float,
                   epsilon: float, delta: float, form: str = "exact"):
    """Typical acceptance: the longest prefix of nodes `typical_decisions` accepts; the next token is greedy."""
    ok, p_tok = typical_decisions(logits, tokens, buf, temperature, epsilon, delta, form)
    score = torch.log(p_tok.clamp(min=1e-30))
    score[:, 0] = 0
    row, length = best_path(ok, score, buf)
    last = last_node(row, length, buf)
    return row, length, logits[torch.arange(logits.shape[0], device=logits.device), last].argmax(dim=-1)


def sample_nucleus(logits: torch.Tensor, temperature: float, top_p: float, generator=None) -> torch.Tensor:
    """logits [..., V] -> one token per row [...] from the top_p nucleus at temperature (argmax at temperature 0)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    shape = logits.shape[:-1]
    p = torch.softmax(logits.reshape(-1, logits.shape[-1]) / temperature, dim=-1)  # [M, V]
    sp, order = p.sort(dim=-1, descending=True)                              # [M, V]
    drop = (sp.cumsum(dim=-1) - sp) >= top_p                                 # keep the smallest prefix reaching top_p
    sp = sp.masked_fill(drop, 0)
    pick = torch.multinomial(sp, 1, generator=generator)                     # [M, 1]
    return order.gather(-1, pick)[:, 0].reshape(shape)


def accept_nucleus(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, temperature: float,
                   top_p: float, generator=None):
    """One nucleus sample per node; a child is accepted iff it equals its parent's sample, and the sample at the
    last accepted node is the next token: every emitted token is a nucleus sample given its prefix."""
    target = sample_nucleus(logits, temperature, top_p, generator)          # [B, N]
    row, length = best_path(_parent_tokens_ok(tokens, target, buf), torch.zeros_like(logits[..., 0]), buf)
    return row, length, target.gather(1, last_node(row, length, buf)[:, None])[:, 0]


def accept(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, rule: Acceptance, generator=None):
    """The one acceptance selection for every rule: logits [B, N, V], tokens [B, N] -> (row, length, next) [B] each."""
    if rule.kind == "greedy":
        return accept_greedy(logits, tokens, buf)
    if rule.kind == "typical":
        return accept_typical(logits, tokens, buf, rule.temperature, rule.epsilon, rule.delta, rule.entropy)
    return accept_nucleus(logits, tokens, buf, rule.temperature, rule.top_p, generator)


def first_token(logits: torch.Tensor, rule: Acceptance, generator=None) -> torch.Tensor:
    """logits [B, V] -> the roots of the first step [B]: greedy (greedy, typical) or a nucleus sample."""
    if rule.kind == "nucleus":
        return sample_nucleus(logits, rule.temperature, rule.top_p, generator)
    return logits.argmax(dim=-1)


def generator_for(rule: Acceptance, device: torch.device):
    """The random generator of a sampling rule (seeded when asked); None for the deterministic ones."""
    if rule.kind != "nucleus" or rule.temperature == 0:
        return None
    g = torch.Generator(device=device)
    if rule.seed is not None:
        g.manual_seed(rule.seed)
    else:
        g.seed()
    return g

