"""`workbench eval-heads`: Medusa-1 heads on the original backbone against a Medusa-2 model (medusa2.py) on held-out
prompts: each head set's top-k accuracy on its own backbone's greedy answers, the adapted backbone's drift from the
original, whether greedy output stays identical, and live tokens/step and speedup with one tree. Resumable
(work.WorkState beside the output file). Also the quick validation figures medusa2.py logs when training ends.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from workbench import warn
from workbench.core.notes import FieldError
from workbench.calibrate.finish import holdout_split
from workbench.calibrate.ranks import head_accuracies, ranks_frame
from workbench.calibrate.topk import head_ranks
from workbench.core.data import load_prompt_records, prompts_fingerprint
from workbench.core.speed import measured_speedup, tokens_per_step
from workbench.core.work import WorkState
from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import tree_setup
from workbench.runtime.generation import eos_ids, greedy_continuations, prepare_prompt
from workbench.runtime.heads import heads_fingerprint
from workbench.runtime.kvcache import undecodable_warning
from workbench.runtime.models import load_model_and_heads, model_label
from workbench.train.adapter import kl_terms
from workbench.train.distill import batch_tensors


@torch.no_grad()
def validate(model, examples, cfg, dev) -> dict:
    """Held-out self-distilled answers (teacher-forced): KL to the original, top-1 agreement with it, and each
    head's top-1 (quick figures for the training log; `workbench eval-heads` is the evaluation)."""
    kl, agree, n, hits, counts = 0.0, 0, 0, torch.zeros(cfg.num_heads), torch.zeros(cfg.num_heads)
    for i in range(0, len(examples), 8):
        ids, mask, rows, cols, targets = (t.to(dev) for t in batch_tensors(examples[i:i + 8], cfg.num_heads))
        teacher = model.teacher_logits(ids, mask, rows, cols).float()
        logits, head_logits = model(ids, mask, rows, cols)
        log_s, log_t = F.log_softmax(logits.float(), -1), F.log_softmax(teacher, -1)
        kl += float(kl_terms(log_t, log_s).sum())
        agree += int((logits.argmax(-1) == teacher.argmax(-1)).sum())
        n += logits.shape[0]
        for k in range(cfg.num_heads):
            m = targets[:, k] != -100
            hits[k] += int((head_logits[k].argmax(-1)[m] == targets[m, k]).sum())
            counts[k] += int(m.sum())
    return dict(positions=n, kl=round(kl / n, 5), top1_agreement=round(agree / n, 4),
                **{f"head_{k + 1}_top1": round(float(hits[k] / counts[k]), 4) for k in range(cfg.num_heads)
                   if counts[k]})


def heldout_records(prompts: str, holdout: float, limit: int | None) -> list[tuple[str, str]]:
    """The held-out prompts of a set, as `workbench calibrate` splits it (never fitted on, never trained on)."""
    records = load_prompt_records(prompts)
    held = holdout_split([pid for pid, _ in records], holdout)
    return [r for r in records if r[0] in held][:limit]


def topk_accuracies(model, heads, prompts, conts, topk: int) -> list[list[float]]:
    """[K][topk]: head k's top-1..top-topk accuracy on teacher-forced answers (the calibration's own measure)."""
    ranks, _ = head_ranks(model, heads, prompts, conts, topk)
    acc, _ = head_accuracies(ranks_frame([str(i) for i in range(len(ranks))], ranks, heads.num_heads), topk)
    return [[round(float(x), 4) for x in row] for row in acc.cumsum(1)]


@torch.no_grad()
def backbone_drift(original, adapted, prompts, conts, batch: int = 8) -> dict:
    """Teacher-forced on the original's own greedy answers: share of positions where the adapted model's top-1
    equals the original's, mean KL(original ‖ adapted), and the perplexity of those answers under each model."""
    agree = kl = nll_o = nll_a = n = 0.0
    for i in range(0, len(prompts), batch):
        ex = list(zip(prompts[i:i + batch], conts[i:i + batch]))
        ids, mask, rows, cols, _ = batch_tensors(ex, 1)
        tgt = torch.tensor([t for _, c in ex for t in c])
        lo = original(input_ids=ids.to(original.device), attention_mask=mask.to(original.device)).logits[rows, cols]
        la = adapted(input_ids=ids.to(adapted.device), attention_mask=mask.to(adapted.device)).logits[rows, cols]
        lo, la = F.log_softmax(lo.float().cpu(), -1), F.log_softmax(la.float().cpu(), -1)   # [M, V]
        agree += float((lo.argmax(-1) == la.argmax(-1)).sum())
        kl += float(kl_terms(lo, la).sum())
        nll_o -= float(lo.gather(1, tgt[:, None]).sum())
        nll_a -= float(la.gather(1, tgt[:, None]).sum())
        n += len(tgt)
    ppl_o, ppl_a = math.exp(nll_o / n), math.exp(nll_a / n)
    return dict(positions=int(n), top1_agreement=round(agree / n, 4), mean_kl=round(kl / n, 5),
                perplexity_original=round(ppl_o, 4), perplexity_adapted=round(ppl_a, 4),
                perplexity_ratio=round(ppl_a / ppl_o, 4))


def live_decode(model, heads, tok, prompts, tree, max_new_tokens: int) -> dict:
    """Medusa and plain greedy decoding of each prompt (batch 1, one engine): tokens/step, speedup, and whether
    Medusa's output equals greedy's (greedy acceptance is lossless)."""
    engine, buf = StepEngine(model), tree_setup(tree, model, heads.num_heads)
    vanilla_generate(model, tok, prompts[0], 2, engine=engine)  # warm-up, outside the timed runs
    med = [medusa_generate(model, heads, tok, p, buf, max_new_tokens, engine=engine) for p in prompts]
    van = [vanilla_generate(model, tok, p, max_new_tokens, engine=engine) for p in prompts]
    return dict(tokens_per_step=round(tokens_per_step(med), 4),
                speedup=round(measured_speedup(med, van), 4),
                identical_to_greedy=round(sum(m.token_ids == v.token_ids for m, v in zip(med, van)) / len(med), 4))


def evaluate_medusa2(medusa2: str, model: str | None = None, heads: str | None = None, prompts: str = "alpaca-eval",
                     holdout: float = 0.2, limit: int | None = 32, max_new_tokens: int = 64, topk: int = 5,
                     tree: str = "mc_sim_7b_63", live: int | None = None, device: str | None = None, batch: int = 8,
                     work=None) -> dict:
    """Medusa-1 (`model` + `heads`) against Medusa-2 (the merged folder `medusa2`, heads inside) on held-out
    prompts: per-head top-1..top-k (each head set on its own backbone's greedy answers: what its decoder
    verifies), the backbone's drift from the original, greedy-output identity, and live tokens/step and speedup
    with the same tree on the first `live` prompts (None: all, 0: none).

    Resumable: each phase (each backbone's greedy answers, each head set's accuracies, the drift, each live
    decoding) is kept in the work.WorkState beside `work` (the output file) when it ends; a killed run rerun the
    same redoes only the unfinished phases. Only the timing fields differ from an unbroken run's result:
    live_medusa1.speedup and live_medusa2.speedup (measured; the rest is computed from greedy fp32 decoding)."""
    records = heldout_records(prompts, holdout, limit)
    if not records:
        raise FieldError("prompts", "no_holdout", f"{{field}} {prompts}: no held-out prompts (raise {{also}} or "
                         "{also2})", also=("holdout", "limit"))
    orig, tok, h1 = load_model_and_heads(model, heads, device, "float32")
    m2, tok2, h2 = load_model_and_heads(medusa2, medusa2, device, "float32")
    undecodable = undecodable_warning(orig, "head accuracy and backbone drift are measured correctly (live "
                                            "decoding skipped)")
    if undecodable:  # as calibrate: the measurements hold on any causal LM; decoding does not
        warn(undecodable.removeprefix("warning: "))
        live = 0
    if tok2 is None or tok2.get_vocab() != tok.get_vocab():
        raise FieldError("medusa2", "other_tokenizer", f"{{field}} {medusa2}: its tokenizer differs from the base "
                         "model's (a Medusa-2 folder of another model?)")
    encoded = [prepare_prompt(tok, text) for _, text in records]
    stop = sorted(eos_ids(orig, tok))
    state = WorkState(work, dict(command="eval-heads", model=model_label(model), heads=heads_fingerprint(h1),
                                 medusa2=str(Path(medusa2).resolve()), medusa2_heads=heads_fingerprint(h2),
                                 prompts=prompts_fingerprint(encoded), topk=topk,
                                 tree=tree, live=live, max_new_tokens=max_new_tokens, batch=batch,
                                 device=str(orig.device)))

    def answers(m):
        out = []
        for i in range(0, len(encoded), batch):
            out += greedy_continuations(m, encoded[i:i + batch], max_new_tokens, stop, tok.pad_token_id)
        return out
    conts_o = state.piece("answers-original", lambda: answers(orig))
    conts_m = state.piece("answers-medusa2", lambda: answers(m2))
    result = dict(prompts=prompts, holdout=holdout, num_prompts=len(records), max_new_tokens=max_new_tokens,
                  model=model_label(model), medusa1_heads=str(heads or "demo heads"), medusa2=str(medusa2),
                  medusa1_topk=state.piece("medusa1-topk", lambda: topk_accuracies(orig, h1, encoded, conts_o, topk)),
                  medusa2_topk=state.piece("medusa2-topk", lambda: topk_accuracies(m2, h2, encoded, conts_m, topk)),
                  drift=state.piece("drift", lambda: backbone_drift(orig, m2, encoded, conts_o, batch)),
                  greedy_identity=round(sum(a == b for a, b in zip(conts_o, conts_m)) / len(records), 4))
    if live is None or live > 0:
        result["tree"], result["live_prompts"] = tree, len(encoded[:live])
        result["live_medusa1"] = state.piece("live-medusa1", lambda: live_decode(orig, h1, tok, encoded[:live], tree,
                                                                                 max_new_tokens))
        result["live_medusa2"] = state.piece("live-medusa2", lambda: live_decode(m2, h2, tok, encoded[:live], tree,
                                                                                 max_new_tokens))
        result["tokens_per_step_ratio"] = round(result["live_medusa2"]["tokens_per_step"]
                                                / result["live_medusa1"]["tokens_per_step"], 4)
    return result


def eval_table(r: dict) -> str:
    """The evaluation as Markdown: per-head top-k side by side, then drift and live decoding."""
    K, topk = len(r["medusa1_topk"]), len(r["medusa1_topk"][0])
    lines = ["| head | " + " | ".join(f"M-1 top-{j + 1} | M-2 top-{j + 1}" for j in range(topk)) + " |",
             "|---|" + "---|---|" * topk]
    for k in range(K):
        lines.append(f"| {k + 1} | " + " | ".join(f"{r['medusa1_topk'][k][j]:.3f} | {r['medusa2_topk'][k][j]:.3f}"
                                                  for j in range(topk)) + " |")
    d = r["drift"]
    lines += ["", "| backbone drift (teacher-forced on the original's greedy answers) | |", "|---|---|",
              f"| positions | {d['positions']} |", f"| top-1 agreement with the original | {d['top1_agreement']:.4f} |",
              f"| mean KL(original ‖ Medusa-2) | {d['mean_kl']:.5f} |",
              f"| perplexity of the original's answers: original / Medusa-2 | {d['perplexity_original']:.4f} / "
              f"{d['perplexity_adapted']:.4f} (x{d['perplexity_ratio']:.4f}) |",
              f"| greedy output identical at {r['max_new_tokens']} tokens | {r['greedy_identity']:.3f} |"]
    if "live_medusa1" in r:
        a, b = r["live_medusa1"], r["live_medusa2"]
        lines += ["", f"| live, tree `{r['tree']}`, batch 1, {r['live_prompts']} prompts | Medusa-1 | Medusa-2 |", "|---|---|---|",
                  f"| tokens/step | {a['tokens_per_step']:.3f} | {b['tokens_per_step']:.3f} (x{r['tokens_per_step_ratio']:.3f}) |",
                  f"| speedup over its own greedy | {a['speedup']:.3f} | {b['speedup']:.3f} |",
                  f"| Medusa output = greedy | {a['identical_to_greedy']:.3f} | {b['identical_to_greedy']:.3f} |"]
    return "\n".join(lines) + "\n"
