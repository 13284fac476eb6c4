"""The recommendation as a file (written here only): its ranked candidates as rows (CSV) and the whole answer with its
evidence as JSON, so a serving engineer can keep, diff or script what the app answered. Numbers as recommend
computed them, unformatted; torch-free.
"""
from __future__ import annotations

import json

import pandas as pd

from workbench.plan.recommend import noise_text, outlier_text, sentence, table_text


def candidate_rows(rec: dict) -> pd.DataFrame:
    """One row per candidate (plan's ranking, then the measured named trees), best first: kind, label, nodes,
    predicted tokens/step and speedup with its range, the current measurement and its noise, a measurement in another
    setting (which sweep, how the setting differs), and whether it was ranked or only measured."""
    rows = []
    for ranked, group in ((True, rec["candidates"]), (False, rec["measured_trees"])):
        for r in group:
            now = r["current"]
            other = next((m for m in r["measured"] if m["elsewhere"]), None)
            rows.append(dict(
                kind=r["kind"], label=r["label"], nodes=r["nodes"],
                medusa_choices=json.dumps(r["tree"].as_lists()) if r["tree"] is not None else "",
                tokens_per_step=r["tokens_per_step"], speedup=r["speedup"],
                speedup_low=r["range"][0] if r["range"] else None, speedup_high=r["range"][1] if r["range"] else None,
                measured_speedup=now["speedup"] if now else None, measured_noise=now["noise"] if now else None,
                measured_in="; ".join(now["sweeps"]) if now else "", disagrees=bool(r["disagree"]), ranked=ranked,
                other_setting_speedup=other["speedup"] if other else None,
                other_setting_sweep=other["sweep"] if other else "",
                other_setting="; ".join(other["elsewhere"]) if other else ""))
    return pd.DataFrame(rows)


def answer_json(rec: dict, this: dict | None = None) -> str:
    """The answer in one JSON object: the sentence, the pick, batch size and context, what it rests on (calibration
    folder name, prediction, latency table with its setting and machine match), the warnings, and every candidate."""
    from pathlib import Path

    pick = rec["pick"]
    out = dict(answer=sentence(rec), batch=rec["batch"], context=rec["context"],
               pick=dict(kind=pick["kind"], label=pick["label"], nodes=pick["nodes"],
                         medusa_choices=pick["tree"].as_lists() if pick["tree"] is not None else None,
                         tokens_per_step=pick["tokens_per_step"], speedup=pick["speedup"],
                         speedup_range=list(pick["range"]) if pick["range"] else None),
               calibration=Path(rec["calibration"]).name, prediction=rec["prediction"], regime=rec["regime"],
               latency=rec["latency"], latency_setting=rec["setting"], latency_evidence=table_text(rec, this),
               warnings=[t for t in (outlier_text(rec), noise_text(rec)) if t],
               candidates=candidate_rows(rec).astype(object).where(lambda d: d.notna(), None).to_dict("records"))
    return json.dumps(out, indent=1, allow_nan=False) + "\n"
