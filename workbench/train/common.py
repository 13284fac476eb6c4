"""What both training recipes (medusa1.py, medusa2.py) share: the learning-rate schedule, the time budget, the
checkpoint files and the heads' loss. One copy each, so the two recipes cannot drift apart.

  schedule     linear warm-up, then cosine to 0 at the last step (warmup_cosine)
  budget       with --time-budget the schedule runs on the progress made, by steps or by time, whichever is
               further, so a run that must end early still finishes its schedule (Budget)
  checkpoints  one file per (settings, data), named by run_key, written whole and atomically
  head loss    Σ_k decay^k · CE(head k, token t+k+1), k = 1..K (Medusa paper §2.2.1)
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench.core.io import atomic_write
from workbench.runtime.heads import MedusaHeads, heads_fingerprint

CHECKPOINT_SECONDS = 30  # a fast device checkpoints at most this often (the state is written whole each time)


def warmup_cosine(step: int, warmup: int, steps: int) -> float:
    """The learning rate's factor at `step`: (step + 1) / warmup during the warm-up, then cosine from 1 to 0."""
    if step < warmup:
        return (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


class Budget:
    """The schedule's step under a time budget: `at(step)` is `step` itself without one, else the step the time
    spent stands for (the schedule compressed into the time left before `stop`, time.time() seconds, from the
    `progress` a resumed run had made)."""

    def __init__(self, steps: int, stop: float | None, progress: float = 0.0):
        self.steps, self.stop, self.progress0, self.clock0 = steps, stop, progress, time.time()

    def at(self, step: int) -> int:
        if self.stop is None:
            return step
        spent = (time.time() - self.clock0) / max(self.stop - self.clock0, 1e-9)
        return max(step, math.ceil(self.steps * min(1.0, max(step / self.steps,
                                                              self.progress0 + (1 - self.progress0) * spent))))


def run_key(cfg, leave_out: tuple[str, ...], start: MedusaHeads | None, **extra) -> str:
    """The digest a training checkpoint is named by: the run's settings but `leave_out` (what may change on a resume),
    `extra` (its data parts, ...) and the starting heads by their weights, not where they lie."""
    key = {k: v for k, v in asdict(cfg).items() if k not in leave_out} | extra
    key["init"] = heads_fingerprint(start) if start is not None else None
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def save_checkpoint(path: Path, state: dict) -> None:
    """The whole training state, atomically: a kill leaves the previous checkpoint whole."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path) -> dict | None:
    """The state save_checkpoint wrote (tensors only: weights_only), None when there is none yet."""
    return torch.load(path, weights_only=True) if path.is_file() else None


def head_losses(head_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """head_logits [K, M, V], targets [M, K] (-100: past the answer's end) -> CE of each head [K], the mean over
    the positions where it has a target (0 where it has none in this batch)."""
    return torch.stack([F.cross_entropy(head_logits[k].float(), targets[:, k], ignore_index=-100)
                        if (targets[:, k] != -100).any() else head_logits.new_zeros(()).float()
                        for k in range(head_logits.shape[0])])                  # [K]


def heads_loss(ces: torch.Tensor, decay: float) -> torch.Tensor:
    """Σ_k decay^k · CE_k (k = 1..K): nearer heads weigh more, as their tokens are accepted more often."""
    weights = torch.tensor([decay ** (k + 1) for k in range(len(ces))], device=ces.device)
    return (weights * ces).sum()
