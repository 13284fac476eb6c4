"""The recommendation in words, and as a file: recommend returns facts (plan's weighing joined to the sweeps'
measurements), and this front end words them: the one sentence, the evidence and warning lines, and the answer's
candidate rows (CSV) and JSON, so a serving engineer can keep, diff or script what the app answered (numbers as
recommend computed them, unformatted).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from workbench.core.provenance import describe, differences, machine_differences
from workbench.measure.latency_checks import outlier_words
from workbench.plan.recommend import within_noise_of_none


def noise_text(rec: dict) -> str | None:
    """Words for within_noise_of_none, or None."""
    none = within_noise_of_none(rec)
    if none is None:
        return None
    lo, hi = rec["pick"]["range"]
    nlo, nhi = none["range"] or (none["speedup"], none["speedup"])
    return (f"the choice is within the noise: {rec['pick']['label']} is predicted at {lo:.2f}x-{hi:.2f}x and no "
            f"speculation at {nlo:.2f}x-{nhi:.2f}x at batch {rec['batch']} (the latency spread): this table cannot "
            "tell them apart; a sweep at this batch size can")


def table_text(rec: dict, this: dict | None = None) -> str:
    """The latency table's setting in words and whether it was measured on this machine (provenance.here, or
    `this`): 'latency X: cpu AMD EPYC (avx2), 2 threads, ..., engine workbench; measured on another machine: ...'."""
    where = machine_differences(rec["setting"], this)
    said = (f"latency {rec['latency'] or 'table'}: {describe(rec['setting'])}, engine {rec.get('engine') or '?'}; "
            + ("this machine's CPU" if where == [] else
               "whether it is this machine is unknown" if where is None else
               "measured on another machine than this one (" + "; ".join(where) + "): its step costs are not this "
               "machine's, re-measure with `workbench latency` to price trees here"))
    return said


def outlier_text(rec: dict) -> str | None:
    """Words for the latency points off their trend that the answer's price reads (latency_checks), or None."""
    found = rec.get("outliers") or []
    if not found:
        return None
    return (f"The answer at batch {rec['batch']} rests on latency measurements off their trend: "
            + "; ".join(outlier_words(f) for f in found[:3]) + f". Re-measure {rec['latency'] or 'the latency table'}"
            " at this batch size (`workbench latency --batch-sizes ...`) before trusting the answer.")


def measured_text(row: dict) -> str:
    """'measured 0.68x +- 0.05 in the latency table's setting (sweep X, N prompts)', or what is known instead (a
    sweep counts when its recorded setting matches the table's, which need not be the server's own)."""
    now = row["current"]
    if now is not None:
        noise = f" +- {now['noise']:.2f}" if now["noise"] is not None else " (noise not measured)"
        return (f"measured {now['speedup']:.2f}x{noise} in the latency table's setting "
                f"({', '.join(now['sweeps'])}, "
                f"{now['num_prompts']} prompts)")
    if row["kind"] == "none":
        return "1.00x by definition"
    if row["measured"]:
        m = row["measured"][0]
        return (f"not measured in this latency table's setting ({m['speedup']:.2f}x in {m['sweep']}, "
                f"{'; '.join(m['elsewhere'][:2])})")
    return "not measured by any sweep found"


def latency_note(rec: dict) -> str | None:
    """Words for cheaper_larger, or None when the table is monotone."""
    pairs = rec["cheaper"]
    if not pairs:
        return None
    said = ", ".join(f"{m} tokens cheaper than {n}" for n, m in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
    return (f"the latency table is not monotone ({said}): its medians differ by less than their noise there; "
            "predictions read it made non-decreasing (those sizes pooled)" + ("" if rec["spread"] else
                                                                               "; re-measure with a spread "
                                                                               "(quartiles) to see how much"))


def _inputs(rec: dict) -> str:
    lat = f"latency {rec['latency']}" if rec.get("latency") else "the latency table"
    return f"(calibration {Path(rec['calibration']).name}, {rec['prediction']}; {lat})"


def sentence(rec: dict) -> str:
    """The answer in one sentence, naming the calibration and latency table it rests on: use X at batch B and
    context C: predicted P tokens/step and S x (range), measured M x +- s (where from); or no speculation, with the
    best measured figure when every measured option was slower than plain decoding."""
    pick, ans = rec["pick"], rec["answer"]
    where = f"at batch {rec['batch']} and context {rec['context']} {_inputs(rec)}"
    if ans["kind"] == "measured-none":
        best = ans["row"]
        return (f"use no speculation {where}: the best measured option, {best['label']}, ran at "
                f"{best['current']['speedup']:.2f}x of plain decoding ({measured_text(best).removeprefix('measured ')}"
                f"); the plan predicted {pick['label']} at {pick['speedup']:.2f}x")
    if pick["kind"] == "none":
        best = next((r for r in rec["candidates"] if r["kind"] != "none"), None)
        why = (f" (the best speculation, {best['label']}, is predicted at {best['speedup']:.2f}x, "
               f"{measured_text(best)})") if best else ""
        return f"use no speculation {where}: no tree or chain is predicted faster than plain decoding{why}"
    spread = (f" ({pick['range'][0]:.2f}x-{pick['range'][1]:.2f}x from the {rec['spread']})" if pick["range"]
              else " (no spread measured)")
    return (f"use {pick['label']} {where}: predicted {pick['tokens_per_step']:.2f} tokens/step and "
            f"{pick['speedup']:.2f}x{spread}, {measured_text(pick)}")


def setting_text(rec: dict) -> str | None:
    """The loud note when a measurement shown beside a prediction was made in another setting than the latency table
    (both recorded, provenance.differences), or None."""
    known = [m["setting"] for r in rec["candidates"] + rec["measured_trees"] for m in r["measured"]
             if m["setting"] is not None]
    diffs = sorted({d for m in known for d in differences(rec["setting"], m)}) if rec["setting"] else []
    if not diffs:
        return None
    return ("The measurements were made in another setting than the latency table the predictions use ("
            + "; ".join(diffs[:4]) + "): prediction and measurement are not comparable until latency is re-measured "
            "where the sweeps ran (`workbench latency`).")


def provenance_note(rec: dict) -> str | None:
    """Words for measurements or a latency table whose setting was not recorded (older files), or None."""
    unknown_sweeps = any(m["setting"] is None for r in rec["candidates"] + rec["measured_trees"]
                         for m in r["measured"])
    if rec["setting"] is None:
        return ("the latency table does not record the setting it was measured in (machine, vector units, threads, "
                "load) nor whether it timed the decoder's whole step: re-measure it with `workbench latency`")
    if unknown_sweeps:
        return ("some measurements do not record their setting (older sweeps): whether they match the latency table "
                "is unknown")
    return None


def disagreement_text(rec: dict) -> str | None:
    """One paragraph naming the candidates whose current measurements contradict their prediction, or None."""
    if not rec["disagree"]:
        return None
    parts = [f"{r['label']}: predicted {r['speedup']:.2f}x, {measured_text(r)}" for r in rec["disagree"][:4]]
    more = len(rec["disagree"]) - len(parts)
    return ("Measurements disagree with the prediction by more than their noise: " + "; ".join(parts)
            + (f"; and {more} more" if more > 0 else "") + ". The latency table, the calibration or the decoder "
            "does not describe this machine as measured: re-measure latency (`workbench latency`) before trusting "
            "the pick.")


# ----------------------------------------------------------------------------------------------- as a file

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
