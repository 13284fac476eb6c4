"""The heads over a calibration's answers, in one pass: at every position, the rank of the answer's own token in
each head's top-k (ranks.parquet) and, from the same logits, each head's top-k ids and log-probabilities
(topk.parquet: what the replay of a per-step tree, trees/dynamic.py, reads, since such a tree is chosen from the
heads' confidence, which the ranks do not keep). `workbench calibrate` records both while it ranks; `record_topk`
runs the pass again, teacher-forced, for a folder calibrated before topk.parquet was recorded with the ranks."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from workbench.core.notes import FieldError
from workbench.calibrate.folder import TOPK, Calibration
from workbench.calibrate.ranks import NULL
from workbench.calibrate.topk_file import calibration_heads_sha256
from workbench.core.io import atomic_write
from workbench.runtime.generation import prepare_prompt, teacher_forced_hidden
from workbench.runtime.heads import heads_fingerprint


class HeadPass(NamedTuple):
    """One pass of the heads over M answer positions (prompt by prompt)."""
    ranks: list[np.ndarray]          # per prompt [N, K] int16: -1 miss, NULL past the end
    mismatches: list[int] | None     # per prompt, teacher-forced positions whose base argmax is not the answer's
    logp: np.ndarray | None          # [M, K, topk] float32, each head's top-k log-probs, descending (logprobs=True)
    ids: np.ndarray | None           # [M, K, topk] int32, their token ids


def head_pass(model, heads, prompts: list[list[int]], conts: list[list[int]], topk: int,
              hidden: list[torch.Tensor] | None = None, chunk: int | None = None,
              logprobs: bool = False) -> HeadPass:
    """Ranks (and with `logprobs` the top-k ids and fp32 log-softmax values) from the same heads' logits.

    `hidden`: greedy_continuations' per-answer hidden states. Without them one teacher-forced forward over
    prompt + continuation computes them, and `mismatches` counts, per prompt, the positions where the base's
    argmax there disagrees with the continuation (0 unless numerics differ); with them it is None (those very
    states chose the tokens)."""
    B, K = len(prompts), heads.num_heads
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in conts])]).tolist()
    M = offsets[-1]
    # targets[k, m]: the token head k must guess at flat position m (k = 0: the base's root token); -1 = none
    targets = torch.full((K + 1, M), -1, dtype=torch.long)
    for b, c in enumerate(conts):
        c = torch.tensor(c, dtype=torch.long)
        for k in range(min(K, len(c) - 1) + 1):
            targets[k, offsets[b]:offsets[b + 1] - k] = c[k:]
    lm_head = model.get_output_embeddings()
    dev = next(heads.parameters()).device  # the last hidden state's (a model across devices: see models.py)
    with torch.no_grad():
        check = hidden is None
        hidden = teacher_forced_hidden(model, prompts, conts) if check else torch.cat(hidden)  # [M, H]
        vocab = lm_head.weight.shape[0]
        chunk = chunk or max(1, (1 << 26) // (vocab * (K + 1)))  # ~256 MB of fp32 logits per chunk
        ranks = torch.empty((K, M), dtype=torch.int16)
        mismatches = torch.zeros(M, dtype=torch.bool)
        logps, idss = [], []
        for s in range(0, M, chunk):
            h = hidden[s:s + chunk]                                   # [m, H]
            tgt = targets[:, s:s + chunk].to(dev)                     # [K+1, m]
            if check:
                mismatches[s:s + chunk] = (lm_head(h).argmax(-1).to(dev) != tgt[0]).cpu()
            logits = heads(h, lm_head)                                # [K, m, V]
            top = logits.topk(topk, dim=-1).indices.to(dev)           # [K, m, topk] (lm_head's device -> ours)
            hit = top == tgt[1:, :, None]
            r = torch.where(hit.any(-1), hit.int().argmax(-1), -1)
            ranks[:, s:s + chunk] = torch.where(tgt[1:] < 0, NULL, r).to(torch.int16).cpu()
            if logprobs:
                best = torch.log_softmax(logits.float(), dim=-1).topk(topk, dim=-1)  # [K, m, topk]
                logps.append(best.values.transpose(0, 1).cpu())                    # [m, K, topk]
                idss.append(best.indices.transpose(0, 1).to(torch.int32).cpu())
    per_prompt = [ranks[:, offsets[b]:offsets[b + 1]].T.numpy().copy() for b in range(B)]
    bad = [int(mismatches[offsets[b]:offsets[b + 1]].sum()) for b in range(B)] if check else None
    if not logprobs:
        return HeadPass(per_prompt, bad, None, None)
    return HeadPass(per_prompt, bad, torch.cat(logps).numpy(), torch.cat(idss).numpy())


def head_ranks(model, heads, prompts: list[list[int]], conts: list[list[int]], topk: int,
               hidden: list[torch.Tensor] | None = None,
               chunk: int | None = None) -> tuple[list[np.ndarray], list[int] | None]:
    """(per prompt ranks [N, K], mismatches) of `head_pass`, without the log-probs."""
    got = head_pass(model, heads, prompts, conts, topk, hidden, chunk)
    return got.ranks, got.mismatches


def topk_frame(prompt_ids: list[str], lengths: list[int], logp: np.ndarray, ids: np.ndarray) -> pd.DataFrame:
    """The file's rows: prompt_id, position, then per head k (1-based) `logp_k` and `ids_k`, each a list of topk."""
    out = dict(prompt_id=pd.array(np.repeat(prompt_ids, lengths), dtype="string"),
               position=np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]))
    for k in range(logp.shape[1]):
        out[f"logp_{k + 1}"] = list(logp[:, k])
        out[f"ids_{k + 1}"] = list(ids[:, k])
    return pd.DataFrame(out)


def record_topk(folder, model, tok, heads, batch: int = 8, max_new_tokens: int | None = None) -> pd.DataFrame:
    """Write FOLDER/topk.parquet for the calibration's held-out answers (cut to max_new_tokens) with these model
    and heads, which must be the calibration's own (its heads fingerprint); returns the frame. For folders
    calibrated before `calibrate` recorded it with the ranks."""
    cal = Calibration(folder)
    want = calibration_heads_sha256(cal.meta)
    if want and want != heads_fingerprint(heads):
        raise FieldError("heads", "not_calibrated", f"{{field}}: not the heads calibration {folder} measured (its "
                         f"meta.json args.heads_sha256 {want[:16]}...; the replay needs their own log-probabilities): "
                         f"give {{field}} {cal.meta.get('heads', 'DIR')} (the calibration's own), or calibrate these "
                         "heads")
    answers = cal.continuations()
    records = cal.holdout_prompts()
    pids = [pid for pid, _ in records if pid in answers]
    conts = [answers[pid][:max_new_tokens] if max_new_tokens else answers[pid] for pid in pids]
    texts = dict(records)
    logps, idss = [], []
    for s in range(0, len(pids), batch):
        prompts = [prepare_prompt(tok, texts[pid]) for pid in pids[s:s + batch]]
        got = head_pass(model, heads, prompts, conts[s:s + batch], int(cal.meta["topk"]), logprobs=True)
        logps.append(got.logp)
        idss.append(got.ids)
    df = topk_frame(pids, [len(c) for c in conts], np.concatenate(logps), np.concatenate(idss))
    atomic_write(cal.folder / TOPK, lambda tmp: df.to_parquet(tmp, index=False), "calibration")
    return df
