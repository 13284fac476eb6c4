"""Each head's top-k token ids and log-probabilities at every position of a calibration's held-out answers: what the
replay of a per-step tree (trees/dynamic.py) reads, since such a tree is chosen from the heads' confidence, which
ranks.parquet does not keep. One teacher-forced forward per chunk of answers; no generation (the answers are the
calibration's own)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from workbench import WorkbenchError
from workbench.calibrate.folder import TOPK, Calibration
from workbench.calibrate.topk_file import calibration_heads_sha256
from workbench.core.io import atomic_write
from workbench.runtime.generation import prepare_prompt, teacher_forced_hidden
from workbench.runtime.heads import heads_fingerprint


@torch.no_grad()
def head_topk(model, heads, prompts: list[list[int]], conts: list[list[int]], topk: int,
              chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(logp [M, K, topk] float32, ids [M, K, topk] int32) over the answers' M positions, prompt by prompt, each
    head's top-k in descending order (rank 0 first), log-probabilities from an fp32 log-softmax."""
    hidden = teacher_forced_hidden(model, prompts, conts)              # [M, H]
    lm_head = model.get_output_embeddings()
    logps, ids = [], []
    for s in range(0, hidden.shape[0], chunk):
        logits = heads(hidden[s:s + chunk], lm_head).float()           # [K, m, V]
        top = torch.log_softmax(logits, dim=-1).topk(topk, dim=-1)     # [K, m, topk]
        logps.append(top.values.transpose(0, 1).cpu())                 # [m, K, topk]
        ids.append(top.indices.transpose(0, 1).to(torch.int32).cpu())
    return torch.cat(logps).numpy(), torch.cat(ids).numpy()


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
    and heads, which must be the calibration's own (its heads fingerprint); returns the frame."""
    cal = Calibration(folder)
    want = calibration_heads_sha256(cal.meta)
    if want and want != heads_fingerprint(heads):
        raise WorkbenchError(f"--heads: not the heads calibration {folder} measured (its meta.json args.heads_sha256 "
                             f"{want[:16]}...; the replay needs their own log-probabilities): give --heads "
                             f"{cal.meta.get('heads', 'DIR')} (the calibration's own), or calibrate these heads")
    answers = cal.continuations()
    records = cal.holdout_prompts()
    pids = [pid for pid, _ in records if pid in answers]
    conts = [answers[pid][:max_new_tokens] if max_new_tokens else answers[pid] for pid in pids]
    texts = dict(records)
    logps, idss = [], []
    for s in range(0, len(pids), batch):
        prompts = [prepare_prompt(tok, texts[pid]) for pid in pids[s:s + batch]]
        lp, ix = head_topk(model, heads, prompts, conts[s:s + batch], int(cal.meta["topk"]))
        logps.append(lp)
        idss.append(ix)
    df = topk_frame(pids, [len(c) for c in conts], np.concatenate(logps), np.concatenate(idss))
    atomic_write(cal.folder / TOPK, lambda tmp: df.to_parquet(tmp, index=False), "--calibration")
    return df
