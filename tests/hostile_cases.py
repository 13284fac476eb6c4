"""The hostile-input corpus of issue 36: absurd sizes, hostile outputs, silent garbage and odd types, for every
subcommand. One list (CASES), two runners: tests/test_hostile.py runs it in-process (fast, on every test run);
`python tests/hostile_cases.py --repo DIR` runs every case as a subprocess of DIR's workbench with a 30 s limit
and prints, per case, the exit status, the last stderr line, whether a traceback appeared, the duration and
whether any input's bytes changed (the before/after table of the issue).

A case is (subcommand, kind, id, argv(e, O), expect): `e` holds the paths of real, valid inputs (build_env), O a
fresh output folder; expect is "refuse" (exit 2, one `error:` line), "ok" (exit 0) or "either" (0 or 2: both are
right, e.g. an extreme value that is still legal). Cases with stdout in another state than a pipe carry it in
their id (`stdout=closed`, `stdout=full`): only the subprocess runner runs them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIG = {"2^31": str(2 ** 31), "2^62": str(2 ** 62), "2^63": str(2 ** 63), "1e12": "1000000000000"}
PROMPTS = ["Tell me a story.", "What is 2+2?", "Name three colours.", "hi", "Why is the sky blue?", "List fruits."]


# ----------------------------------------------------------------------------------------------- inputs

def build_env(root: Path) -> dict:
    """Valid inputs of every kind under root/in (the tiny model, its heads, a calibration, files of every format),
    plus hostile variants beside them. Everything under root/in is an input: no case may change its bytes."""
    import numpy as np
    import pandas as pd
    import torch
    from safetensors.torch import save_file

    from workbench.trees.accuracies import write_accuracies
    from workbench.runtime.heads import save_heads
    from workbench.calibrate.run import CalibrateConfig, calibrate
    from workbench.measure.sweep_file import SWEEP_COLUMNS, SWEEP_VERSION
    from support.tiny import random_heads, tiny_model, tiny_tokenizer

    d = root / "in"
    d.mkdir(parents=True, exist_ok=True)
    e = {"root": str(root), "in": str(d)}
    model, tok = tiny_model("llama", seed=0), tiny_tokenizer()
    model.save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    heads = random_heads(64, 128, 3, tied=True, seed=1)
    save_heads(heads, d / "heads", str(d / "model"), fmt=2)
    e.update(model=str(d / "model"), heads=str(d / "heads"), heads_file=str(d / "heads" / "medusa_lm_head.safetensors"))
    sd = {k: v.clone() for k, v in heads.state_dict().items()}
    (d / "fp8").mkdir()
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in sd.items()}, str(d / "fp8" / "medusa_lm_head.safetensors"))
    (d / "w3d").mkdir()
    save_file({k: (v.unsqueeze(0).contiguous() if v.ndim == 2 else v) for k, v in sd.items()},
              str(d / "w3d" / "medusa_lm_head.safetensors"))
    (d / "pickle").mkdir()  # a pickle that runs code, named like a safe heads file
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {d}/pwned",))
    (d / "pickle" / "medusa_lm_head.safetensors").write_bytes(pickle.dumps(Boom()))
    (d / "pickle_pt").mkdir()
    (d / "pickle_pt" / "medusa_lm_head.pt").write_bytes(pickle.dumps(Boom()))
    e.update(fp8=str(d / "fp8"), w3d=str(d / "w3d"), pickle=str(d / "pickle"), pickle_pt=str(d / "pickle_pt"))
    # an architecture we cannot decode: an encoder (BERT) and an encoder-decoder (T5) saved as a model folder
    from transformers import AutoConfig, AutoModel
    for arch, kw in (("bert", dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                    vocab_size=128)),
                     ("t5", dict(d_model=64, num_layers=1, num_heads=4, d_ff=64, d_kv=16, vocab_size=128)),
                     ("mamba", dict(hidden_size=64, num_hidden_layers=1, vocab_size=128, state_size=4))):
        try:
            m = AutoModel.from_config(AutoConfig.for_model(arch, **kw))
            m.save_pretrained(d / f"arch_{arch}")
            tok.save_pretrained(d / f"arch_{arch}")
            e[f"arch_{arch}"] = str(d / f"arch_{arch}")
        except Exception:  # an architecture this transformers lacks: its cases are skipped
            pass

    (d / "prompts.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n"
                                              for i, p in enumerate(PROMPTS)))
    (d / "dict_of_lists.json").write_text(json.dumps({"instruction": PROMPTS, "id": list(range(len(PROMPTS)))}))
    (d / "nan_prompts.json").write_text('[{"instruction": NaN}, {"instruction": "hi"}]')
    (d / "pickle_prompts.json").write_bytes(pickle.dumps({"instruction": "hi"}))
    e.update(prompts=str(d / "prompts.jsonl"), dict_of_lists=str(d / "dict_of_lists.json"),
             nan_prompts=str(d / "nan_prompts.json"), pickle_prompts=str(d / "pickle_prompts.json"))

    (d / "tree.json").write_text(json.dumps({"name": "t", "medusa_choices": [[0], [0, 0], [1]]}))
    (d / "tree_nan.json").write_text('{"medusa_choices": [[0], [NaN]]}')
    (d / "tree_big.json").write_text(json.dumps({"medusa_choices": [[0], [0, 2 ** 63]]}))
    (d / "tree_deep.json").write_text(json.dumps({"medusa_choices": [[0] * k for k in range(1, 2001)]}))
    os.symlink(d / "tree.json", d / "tree_link.json")
    e.update(tree=str(d / "tree.json"), tree_nan=str(d / "tree_nan.json"), tree_big=str(d / "tree_big.json"),
             tree_deep=str(d / "tree_deep.json"), tree_link=str(d / "tree_link.json"))

    acc = np.random.default_rng(0).dirichlet(np.ones(5), size=3)[:, :4]
    write_accuracies(d / "acc.csv", acc)
    (d / "acc_over.csv").write_text("head,rank,accuracy\n1,1,0.7\n1,2,0.6\n2,1,0.5\n2,2,0.2\n")
    (d / "acc_cum.csv").write_text("head,top1,top2\n0,0.7,0.6\n")
    (d / "acc_nan.csv").write_text("head,rank,accuracy\n1,1,NaN\n")
    (d / "acc_zero_count.csv").write_text("head,rank,accuracy,count\n1,1,0.5,0\n2,1,0.3,0\n")
    (d / "acc_wide.csv").write_text("head,rank,accuracy\n1,1,0.5\n1,1000000,0.1\n")
    (d / "acc_many_heads.csv").write_text("head,rank,accuracy\n1,1,0.5\n1024,1,0.1\n")
    (d / "acc_pickle.pt").write_bytes(pickle.dumps(Boom()))
    for name in ("acc_over", "acc_cum", "acc_nan", "acc_zero_count", "acc_wide", "acc_many_heads", "acc_pickle"):
        e[name] = str(d / (name + (".pt" if name == "acc_pickle" else ".csv")))
    e["acc"] = str(d / "acc.csv")

    def lat_rows(seconds):
        return [dict(model="m", device="cpu", dtype="float32", batch=b, context=16, tokens=n, seconds=t,
                     seconds_min=t * 0.98, seconds_q1=t * 0.99, seconds_q3=t * 1.01, seconds_max=t * 1.02, repeats=5)
                for b in (1, 2) for n in range(1, 9) for t in [seconds(b, n)]]
    pd.DataFrame(lat_rows(lambda b, n: 0.01 * (1 + 0.001 * b * (n - 1)))).to_csv(d / "lat.csv", index=False)
    pd.DataFrame(lat_rows(lambda b, n: 1e-320 * n)).to_csv(d / "lat_tiny.csv", index=False)  # denormals
    (d / "lat_huge.csv").write_text("context,tokens,seconds\n16,1,0.01\n16,2,1e400\n")  # overflows to inf
    (d / "lat_ratio.csv").write_text("context,tokens,seconds\n16,1,1e-300\n16,2,1e300\n16,3,1e300\n")
    (d / "lat_nocols.csv").write_text("context,tokens\n16,1\n")
    (d / "lat_rows0.csv").write_text(",".join(pd.read_csv(d / "lat.csv").columns) + "\n")
    (d / "lat_neg_ctx.csv").write_text("context,tokens,seconds\n-5,1,0.01\n-5,2,0.02\n")
    for name in ("lat", "lat_tiny", "lat_huge", "lat_ratio", "lat_nocols", "lat_rows0", "lat_neg_ctx"):
        e[name] = str(d / f"{name}.csv")

    (d / "acc_vec.json").write_text("[0.6, 0.35, 0.2]")
    (d / "acc_vec_nan.json").write_text("[0.6, NaN]")
    (d / "acc_vec_inf.json").write_text("[Infinity]")
    e.update(acc_vec=str(d / "acc_vec.json"), acc_vec_nan=str(d / "acc_vec_nan.json"),
             acc_vec_inf=str(d / "acc_vec_inf.json"))

    from workbench.cli import main
    rc = main(["plan", "--accuracies", str(d / "acc.csv"), "--latency", str(d / "lat.csv"), "--batch-sizes", "1,2",
               "--out", str(d / "plan.json")])
    assert rc == 0, "the valid plan"
    plan = json.loads((d / "plan.json").read_text())
    bad = json.loads(json.dumps(plan))
    bad["plans"][0]["predicted_speedup"] = float("nan")
    (d / "plan_nan.json").write_text(json.dumps(bad))
    bad = json.loads(json.dumps(plan))
    bad["plans"][0]["batch_size"] = 2 ** 63
    bad["plans"] = bad["plans"][:1]
    bad.pop("alternatives", None)
    (d / "plan_bigb.json").write_text(json.dumps(bad))
    e.update(plan=str(d / "plan.json"), plan_nan=str(d / "plan_nan.json"), plan_bigb=str(d / "plan_bigb.json"))

    row = {c: "" for c in SWEEP_COLUMNS}
    row.update(run="r1", config="vanilla", tree="vanilla", kind="vanilla", nodes=0, depth=0, acceptance="greedy",
               temperature=0.0, tokens_per_step=1.0, speedup=1.0, exact_match=1.0, num_prompts=2,
               mean_prompt_tokens=9.0, new_tokens=8, model="m", prompts="p", max_new_tokens=4, batch_size=1,
               version=SWEEP_VERSION)
    tree_row = dict(row, config="t:abc|greedy|T=0", tree="t", kind="given", nodes=3, depth=2,
                    tokens_per_step=1.5, speedup=1.2, predicted_independent=1.6)
    pd.DataFrame([row, tree_row], columns=SWEEP_COLUMNS).to_csv(d / "sweep.csv", index=False)
    for name, change in {"sweep_negnodes": dict(nodes=-3), "sweep_huge": dict(tokens_per_step=1e308, speedup=1e308),
                         "sweep_zero_rate": dict(tokens_per_step=0.0, speedup=0.0),
                         "sweep_frac_nodes": dict(nodes=2.5), "sweep_bigb": dict(batch_size=2 ** 63)}.items():
        pd.DataFrame([row, dict(tree_row, **change)], columns=SWEEP_COLUMNS).to_csv(d / f"{name}.csv", index=False)
        e[name] = str(d / f"{name}.csv")
    pd.DataFrame([row], columns=SWEEP_COLUMNS).drop(columns=["tokens_per_step"]).to_csv(d / "sweep_nocol.csv",
                                                                                           index=False)
    (d / "sweep_empty.csv").write_text(",".join(SWEEP_COLUMNS) + "\n")
    e.update(sweep=str(d / "sweep.csv"), sweep_nocol=str(d / "sweep_nocol.csv"), sweep_empty=str(d / "sweep_empty.csv"))
    # issue 52: sweeps a reader could accept but not draw every output from (a column or a cell an output needs is
    # missing), or of a version this workbench does not read
    both = pd.DataFrame([row, tree_row], columns=SWEEP_COLUMNS)
    shorts = {"sweep_header_only": both[["tree", "nodes", "tokens_per_step"]],  # the header find_csvs looks for
              "sweep_v1_short": both[["tree", "kind", "nodes", "tokens_per_step"]].rename(
                  columns={"tokens_per_step": "acceleration_rate"}),  # version 1 names, most columns gone
              "sweep_no_speedup": both.drop(columns=["speedup"]), "sweep_no_acceptance": both.drop(columns=["acceptance"]),
              "sweep_blank_speedup": both.assign(speedup=[1.0, None]), "sweep_blank_kind": both.assign(kind=["vanilla", ""]),
              "sweep_version_7": both.assign(version=7), "sweep_version_word": both.assign(version="two")}
    for name, df in shorts.items():
        df.to_csv(d / f"{name}.csv", index=False)
        e[name] = str(d / f"{name}.csv")

    cal = d / "cal"
    calibrate(CalibrateConfig(model=e["model"], heads=e["heads"], prompts=e["prompts"], name="hc", out=cal,
                              holdout=0.34, max_new_tokens=6, topk=40, budgets=(2,), batch_size=6, device="cpu"),
              progress=False)
    e["cal"] = str(cal)
    zero = d / "cal_zero"  # a calibration whose ranks hold no rows
    import shutil
    shutil.copytree(cal, zero)
    r = pd.read_parquet(zero / "ranks.parquet")
    r.iloc[:0].to_parquet(zero / "ranks.parquet")
    e["cal_zero"] = str(zero)
    # a Medusa-2 model folder (eval-heads): the backbone's weights with medusa_head.* beside them
    from safetensors.torch import load_file

    m2 = d / "medusa2"
    model.save_pretrained(m2)
    tok.save_pretrained(m2)
    weights = load_file(str(m2 / "model.safetensors"))
    weights.update({f"medusa_head.{k}": v.clone().contiguous()
                    for k, v in random_heads(64, 128, 3, tied=False, seed=2).state_dict().items()})
    save_file(weights, str(m2 / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((m2 / "config.json").read_text())
    (m2 / "config.json").write_text(json.dumps(dict(cfg, medusa_num_heads=3, medusa_num_layers=1)))
    # a "vLLM python" that fails at once: vllm-check cases that pass every check end there, in a second
    fake = d / "no_vllm_python"
    fake.write_text("#!/bin/sh\necho 'no vLLM here' >&2\nexit 3\n")
    fake.chmod(0o755)
    e.update(m2=str(m2), m2_config=str(m2 / "config.json"), no_vllm=str(fake))
    _absurd_inputs(d, e, sd)
    _issue71_inputs(d, e)
    for name, minor in (("devfull", 7), ("devnull", 3)):  # private copies of /dev/full and /dev/null: a run that
        try:                                            # replaced the device node would break only its own copy
            os.mknod(root / name, 0o666 | __import__("stat").S_IFCHR, os.makedev(1, minor))
            e[name] = str(root / name)
        except OSError:
            pass
    return e


def _absurd_inputs(d: Path, e: dict, sd: dict) -> None:
    """Files whose names, shapes or numbers imply absurd sizes (issue 52): heads with a far head index, a vast
    hidden size, layer count or vocabulary (a safetensors header, a .pt, a Medusa-2 model folder, a config);
    calibrations naming a top-k past what their ranks can hold; accuracy tables reaching millions of ranks or
    heads. Each file is small: the size is what it claims, never what it holds."""
    import json as _json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from support.tiny import random_heads

    def heads_dir(name, tensors, config=None, pt=False):
        (d / name).mkdir()
        if pt:
            torch.save(tensors, d / name / "medusa_lm_head.pt")
        else:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / name / "medusa_lm_head.safetensors"))
        if config:
            (d / name / "config.json").write_text(_json.dumps(config))
        e[name] = str(d / name)

    z = torch.zeros
    heads_dir("h_index", {**sd, "4320.0.linear.weight": z(64, 64), "4320.0.linear.bias": z(64)})
    heads_dir("h_65", {f"{h}.0.{t}": z(*((64, 64) if t == "linear.weight" else (64,)))
                       for h in range(65) for t in ("linear.weight", "linear.bias")})  # complete, one too many
    heads_dir("h_hidden", {"0.0.linear.weight": z(3, 131072, dtype=torch.float16),
                           "0.0.linear.bias": z(131072, dtype=torch.float16)})
    heads_dir("h_hidden_shape", {"0.0.linear.weight": z(4, 60000, dtype=torch.float16),
                                 "0.0.linear.bias": z(60000, dtype=torch.float16)})  # within the limit, not [H, H]
    heads_dir("h_hidden_96", random_heads(96, 128, 2, tied=True, seed=3).state_dict())  # another model's heads
    heads_dir("h_layers", {**sd, "0.250.linear.weight": z(64, 64), "0.250.linear.bias": z(64)})
    heads_dir("h_vocab", {"0.0.linear.weight": z(1, 1), "0.0.linear.bias": z(1),
                          "0.1.weight": z(3_000_000, 1, dtype=torch.float8_e4m3fn)})
    heads_dir("h_pt_hidden", {"0.0.linear.weight": z(2, 90000, dtype=torch.float16),
                              "0.0.linear.bias": z(90000, dtype=torch.float16)}, pt=True)
    heads_dir("h_pt_index", {**sd, "1234.0.linear.weight": z(64, 64), "1234.0.linear.bias": z(64)}, pt=True)
    heads_dir("h_cfg", sd, config={"medusa_num_heads": 5000, "medusa_num_layers": 1})
    heads_dir("h_cfg_vocab", sd, config={"vocab_size": 3_000_000})
    heads_dir("h_3d_cfg", {k: (v.unsqueeze(0).contiguous() if v.ndim == 2 else v) for k, v in sd.items()},
              config={"medusa_num_heads": 7})  # a config to warn about, then a 3-D weight to refuse
    m2 = d / "m2_index"  # a Medusa-2 model folder whose heads reach index 2048
    shutil.copytree(e["m2"], m2)
    w = load_file(str(m2 / "model.safetensors"))
    w.update({"medusa_head.2047.0.linear.weight": z(64, 64), "medusa_head.2047.0.linear.bias": z(64)})
    save_file(w, str(m2 / "model.safetensors"), metadata={"format": "pt"})
    e["m2_index"] = str(m2)

    for topk in (40000, 524289, 9_000_000):  # meta.json's top-k past 16-bit ranks (the ranks stay top-40)
        cal = d / f"cal_topk_{topk}"
        shutil.copytree(e["cal"], cal)
        meta = _json.loads((cal / "meta.json").read_text())
        (cal / "meta.json").write_text(_json.dumps(dict(meta, topk=topk)))
        e[f"cal_topk_{topk}"] = str(cal)

    tables = {"acc_rank_4m": "head,rank,accuracy\n1,1,0.5\n1,4000000,0.1\n",
              "acc_heads_70k": "head,rank,accuracy\n1,1,0.5\n70000,1,0.1\n",
              "acc_topk_3m": "head,top1,top3000000\n0,0.4,0.5\n",
              "acc_topk_cells": "head,top1,top_800000\n" + "".join(f"{h},0.4,0.5\n" for h in range(64))}
    for name, text in tables.items():
        (d / f"{name}.csv").write_text(text)
        e[name] = str(d / f"{name}.csv")
    torch.save([z(1, 2_500_000, dtype=torch.bool)], d / "acc_pt_wide.pt")  # Medusa's hits: top-2.5M columns
    e["acc_pt_wide"] = str(d / "acc_pt_wide.pt")


# ----------------------------------------------------------------------------------------------- the cases

def _decode(e, *extra):
    return ["decode", "--model", e["model"], "--heads", e["heads"], "--tree", "[[0],[0,0],[1]]", "--prompt-ids",
            "5,6,7", "--max-new-tokens", "3", "--device", "cpu", *extra]


def _cal(e, O, *extra):
    return ["calibrate", "--model", e["model"], "--heads", e["heads"], "--prompts", e["prompts"], "--max-new-tokens",
            "3", "--topk", "4", "--budgets", "2", "--gen-batch", "6", "--device", "cpu", "--out", f"{O}/cal", *extra]


def _lat(e, O, *extra):
    return ["latency", "--random-config", "tiny", "--device", "cpu", "--sizes", "1,2", "--context", "8",
            "--repeats", "1", "--warmup", "0", "--out", f"{O}/l.csv", *extra]


def _sweep(e, O, *extra):
    return ["sweep", "--model", e["model"], "--heads", e["heads"], "--trees", "[[0]]", "--prompts", e["prompts"],
            "--limit", "2", "--max-new-tokens", "3", "--device", "cpu", "--quiet", "--out", f"{O}/s.csv", *extra]


def _train(e, O, *extra):
    return ["train-heads", "--model", e["model"], "--prompts", e["prompts"], "--tokens", "8", "--max-new-tokens",
            "3", "--gen-dtype", "float32", "--steps", "1", "--positions-per-step", "4", "--num-heads", "2", "--work",
            f"{O}/w", "--out", f"{O}/h", *extra]


def _opt(e, O, *extra):
    return ["optimize", "--accuracies", e["acc"], "--budget", "3", "--out", f"{O}/t.json", *extra]


def _plan(e, O, *extra):
    return ["plan", "--accuracies", e["acc"], "--latency", e["lat"], "--batch-sizes", "1,2", "--out", f"{O}/p.json",
            *extra]


def _evalh(e, O, *extra):
    return ["eval-heads", "--model", e["model"], "--heads", e["heads"], "--medusa2", e["m2"], "--prompts", e["prompts"],
            "--holdout", "0.5", "--limit", "2", "--max-new-tokens", "3", "--topk", "2", "--tree", "[[0],[0,0],[1]]",
            "--live", "1", "--gen-batch", "2", "--device", "cpu", "--out", f"{O}/e.json", *extra]


def _vcheck(e, O, *extra):
    return ["vllm-check", "--vllm-python", e["no_vllm"], "--model", e["model"], "--heads", e["heads"],
            "--calibration", e["cal"], "--k", "1,2", "--batch-sizes", "1", "--limit", "2", "--max-new-tokens", "3",
            "--out", f"{O}/v.json", *extra]


def _link(O, target) -> str:
    """A symlink in the output folder O pointing at target."""
    link = Path(O) / "link.out"
    if not link.is_symlink():
        os.symlink(target, link)
    return str(link)


def with_flag(argv, flag, value):
    """argv with `flag`'s value replaced (or appended); test_fuzz.py builds its cases with it too."""
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


# case id -> the most CPU seconds its refusal may take: sizes refused before work proportional to them (issue 52)
CPU_LIMITS: dict[str, float] = {}


def _cases() -> list[tuple]:
    C = []

    def add(sub, kind, cid, argv, expect="refuse", cpu=None):
        C.append((sub, kind, f"{sub}|{cid}", argv, expect))
        if cpu is not None:
            CPU_LIMITS[f"{sub}|{cid}"] = cpu

    # ---- absurd sizes and numbers
    for tag, v in BIG.items():
        add("tree buffers", "sizes", f"--topk {tag}", lambda e, O, v=v: ["tree", "buffers", "[[0],[0,1]]", "--topk", v],
            "either")
        add("tree show", "sizes", f"--num-heads {tag}", lambda e, O, v=v: ["tree", "show", "[[0]]", "--num-heads", v],
            "either")
        add("optimize", "sizes", f"--budget {tag}", lambda e, O, v=v: with_flag(_opt(e, O), "--budget", v), "either")
        add("optimize", "sizes", f"--max-rank {tag}", lambda e, O, v=v: _opt(e, O, "--max-rank", v), "either")
        add("optimize", "sizes", f"--max-depth {tag}", lambda e, O, v=v: _opt(e, O, "--max-depth", v), "either")
        add("optimize", "sizes", f"--curve --budget {tag}", lambda e, O, v=v: with_flag(_opt(e, O, "--curve"), "--budget", v))
        add("export", "sizes", f"--max-draft-len {tag}",
            lambda e, O, v=v: ["export", e["tree"], "--format", "trtllm", "--max-draft-len", v], "either")
        add("export", "sizes", f"--num-heads {tag}",
            lambda e, O, v=v: ["export", e["tree"], "--format", "medusa", "--num-heads", v], "either")
        add("decode", "sizes", f"--max-new-tokens {tag}", lambda e, O, v=v: with_flag(_decode(e), "--max-new-tokens", v))
        add("decode", "sizes", f"--batch-sizes {tag}", lambda e, O, v=v: _decode(e, "--batch-sizes", v))
        add("decode", "sizes", f"--seed {tag}",
            lambda e, O, v=v: _decode(e, "--acceptance", "nucleus", "--temperature", "0.7", "--seed", v), "either")
        add("calibrate", "sizes", f"--topk {tag}", lambda e, O, v=v: with_flag(_cal(e, O), "--topk", v))
        add("calibrate", "sizes", f"--max-new-tokens {tag}", lambda e, O, v=v: with_flag(_cal(e, O), "--max-new-tokens", v))
        add("calibrate", "sizes", f"--gen-batch {tag}", lambda e, O, v=v: with_flag(_cal(e, O), "--gen-batch", v),
            "either")
        add("calibrate", "sizes", f"--budgets {tag}", lambda e, O, v=v: with_flag(_cal(e, O), "--budgets", v), "either")
        add("latency", "sizes", f"--sizes {tag}", lambda e, O, v=v: with_flag(_lat(e, O), "--sizes", v))
        add("latency", "sizes", f"--context {tag}", lambda e, O, v=v: with_flag(_lat(e, O), "--context", v))
        add("latency", "sizes", f"--batch-sizes {tag}", lambda e, O, v=v: _lat(e, O, "--batch-sizes", v))
        add("latency", "sizes", f"--repeats {tag}", lambda e, O, v=v: with_flag(_lat(e, O), "--repeats", v))
        add("latency", "sizes", f"--random-config hidden={tag}",
            lambda e, O, v=v: with_flag(_lat(e, O), "--random-config", f"tiny,hidden={v},heads=4,kv_heads=2"))
        add("latency", "sizes", f"--random-config vocab={tag}",
            lambda e, O, v=v: with_flag(_lat(e, O), "--random-config", f"tiny,vocab={v}"))
        add("latency", "sizes", f"--random-config layers={tag}",
            lambda e, O, v=v: with_flag(_lat(e, O), "--random-config", f"tiny,layers={v}"))
        add("plan", "sizes", f"--batch-sizes {tag}", lambda e, O, v=v: with_flag(_plan(e, O), "--batch-sizes", v))
        add("plan", "sizes", f"--context {tag}", lambda e, O, v=v: _plan(e, O, "--context", v))
        add("sweep", "sizes", f"--budgets {tag}",
            lambda e, O, v=v: _sweep(e, O, "--budgets", v, "--calibration", e["cal"]))
        add("sweep", "sizes", f"--batch-sizes {tag}", lambda e, O, v=v: _sweep(e, O, "--batch-sizes", v))
        add("sweep", "sizes", f"--max-new-tokens {tag}", lambda e, O, v=v: with_flag(_sweep(e, O), "--max-new-tokens", v))
        add("sweep", "sizes", f"--limit {tag}", lambda e, O, v=v: with_flag(_sweep(e, O), "--limit", v), "either")
        add("sweep-report", "sizes", f"--context {tag}",
            lambda e, O, v=v: ["sweep-report", e["sweep"], "--latency", e["lat"], "--context", v])
        add("train-heads", "sizes", f"--num-heads {tag}", lambda e, O, v=v: with_flag(_train(e, O), "--num-heads", v))
        add("train-heads", "sizes", f"--num-layers {tag}", lambda e, O, v=v: _train(e, O, "--num-layers", v))
        add("train-heads", "sizes", f"--tokens {tag}", lambda e, O, v=v: with_flag(_train(e, O), "--tokens", v),
            "either")  # within 2^40: generation stops when the prompts run out
        add("train-heads", "sizes", f"--positions-per-step {tag}", lambda e, O, v=v: with_flag(_train(e, O), "--positions-per-step", v))
        add("train-heads", "sizes", f"--seed {tag}", lambda e, O, v=v: _train(e, O, "--seed", v), "either")
        add("train-heads", "sizes", f"--gen-batch {tag}", lambda e, O, v=v: _train(e, O, "--gen-batch", v), "either")
    add("tree show", "sizes", "rank 2^63 in a file", lambda e, O: ["tree", "show", e["tree_big"]])
    add("tree show", "sizes", "2000-deep chain", lambda e, O: ["tree", "show", e["tree_deep"]], "either")
    add("tree buffers", "sizes", "2000-deep chain", lambda e, O: ["tree", "buffers", e["tree_deep"], "--out",
                                                                  f"{O}/b.json"], "either")
    add("optimize", "sizes", "--dense 100000,100000", lambda e, O: ["optimize", "--accuracies", e["acc"], "--dense",
                                                                    "100000,100000"])
    add("optimize", "sizes", "--dense 0", lambda e, O: ["optimize", "--accuracies", e["acc"], "--dense", "0"])
    add("optimize", "sizes", "--dense -2,3", lambda e, O: ["optimize", "--accuracies", e["acc"], "--dense", "-2,3"])
    add("optimize", "sizes", "--budget 0", lambda e, O: with_flag(_opt(e, O), "--budget", "0"))
    add("optimize", "sizes", "--budget -5", lambda e, O: with_flag(_opt(e, O), "--budget", "-5"))
    add("optimize", "sizes", "--max-depth 0", lambda e, O: _opt(e, O, "--max-depth", "0"))
    add("optimize", "sizes", "--max-rank -1", lambda e, O: _opt(e, O, "--max-rank", "-1"))
    add("optimize", "sizes", "--latency --batch-sizes 0",
        lambda e, O: _opt(e, O, "--latency", e["lat"], "--batch-sizes", "0"))
    add("tree buffers", "sizes", "--topk 0", lambda e, O: ["tree", "buffers", "[[0]]", "--topk", "0"])
    add("tree show", "sizes", "--num-heads 0", lambda e, O: ["tree", "show", "[[0]]", "--num-heads", "0"])
    add("tree show", "sizes", "--num-heads -1", lambda e, O: ["tree", "show", "[[0]]", "--num-heads", "-1"])
    add("export", "sizes", "--max-draft-len 0", lambda e, O: ["export", e["tree"], "--format", "trtllm",
                                                              "--max-draft-len", "0"])
    add("export", "sizes", "--num-heads 0", lambda e, O: ["export", e["tree"], "--format", "json", "--num-heads", "0"])
    add("export", "sizes", "plan --batch-sizes 2^63", lambda e, O: ["export", e["plan"], "--format", "medusa",
                                                                   "--batch-sizes", BIG["2^63"]])
    add("decode", "sizes", "--max-new-tokens 0", lambda e, O: with_flag(_decode(e), "--max-new-tokens", "0"))
    add("decode", "sizes", "--limit 0", lambda e, O: ["decode", "--model", e["model"], "--heads", e["heads"], "--tree",
                                                      "[[0]]", "--prompts", e["prompts"], "--limit", "0",
                                                      "--device", "cpu"])
    add("decode", "sizes", "--prompt-ids past the vocabulary", lambda e, O: with_flag(_decode(e), "--prompt-ids", "5,4000"))
    add("decode", "sizes", "--seed -1", lambda e, O: _decode(e, "--acceptance", "nucleus", "--temperature", "0.7",
                                                              "--seed", "-1"), "either")
    add("calibrate", "sizes", "--holdout 1", lambda e, O: with_flag(_cal(e, O), "--holdout", "1"), "either")
    add("calibrate", "sizes", "--holdout nan", lambda e, O: with_flag(_cal(e, O), "--holdout", "nan"))
    add("calibrate", "sizes", "--holdout -0.5", lambda e, O: with_flag(_cal(e, O), "--holdout", "-0.5"))
    add("calibrate", "sizes", "--limit 0", lambda e, O: _cal(e, O, "--limit", "0"))
    add("calibrate", "sizes", "--topk 200 (past the vocabulary)", lambda e, O: with_flag(_cal(e, O), "--topk", "200"))
    add("latency", "sizes", "--repeats 0", lambda e, O: with_flag(_lat(e, O), "--repeats", "0"))
    add("latency", "sizes", "--warmup -1", lambda e, O: with_flag(_lat(e, O), "--warmup", "-1"))
    add("latency", "sizes", "--sizes 0", lambda e, O: with_flag(_lat(e, O), "--sizes", "0"))
    add("latency", "sizes", "--context 0", lambda e, O: with_flag(_lat(e, O), "--context", "0,8"), "either")
    add("latency", "sizes", "--random-config hidden=0", lambda e, O: with_flag(_lat(e, O), "--random-config",
                                                                             "tiny,hidden=0"))
    add("latency", "sizes", "--random-config layers=-1", lambda e, O: with_flag(_lat(e, O), "--random-config",
                                                                              "tiny,layers=-1"))
    add("sweep", "sizes", "--epsilon range of a billion", lambda e, O: _sweep(e, O, "--epsilon", "0.000000001:1:1e-9",
                                                                            "--temperature", "0.7"))
    add("sweep", "sizes", "--temperature range of a billion", lambda e, O: _sweep(e, O, "--temperature", "0:1:1e-9"))
    add("sweep", "sizes", "--limit 0", lambda e, O: with_flag(_sweep(e, O), "--limit", "0"))
    add("sweep", "sizes", "--max-new-tokens 0", lambda e, O: with_flag(_sweep(e, O), "--max-new-tokens", "0"))
    add("train-heads", "sizes", "--steps 0", lambda e, O: with_flag(_train(e, O), "--steps", "0"))
    add("train-heads", "sizes", "--positions-per-step 0", lambda e, O: with_flag(_train(e, O), "--positions-per-step", "0"))
    add("train-heads", "sizes", "--gen-batch 0", lambda e, O: _train(e, O, "--gen-batch", "0"))
    add("train-heads", "sizes", "--max-new-tokens 0", lambda e, O: with_flag(_train(e, O), "--max-new-tokens", "0"))
    add("train-heads", "sizes", "--heads-lr nan", lambda e, O: _train(e, O, "--heads-lr", "nan"))
    add("train-heads", "sizes", "--heads-lr -1", lambda e, O: _train(e, O, "--heads-lr", "-1"))
    add("train-heads", "sizes", "--heads-lr inf", lambda e, O: _train(e, O, "--heads-lr", "inf"))
    add("train-heads", "sizes", "--time-budget inf", lambda e, O: _train(e, O, "--time-budget", "inf"))
    add("train-heads", "sizes", "--time-budget nan", lambda e, O: _train(e, O, "--time-budget", "nan"))
    add("train-heads", "sizes", "--seed -1", lambda e, O: _train(e, O, "--seed", "-1"), "either")
    add("train-heads", "sizes", "--answers-per-prompt 2^31",
        lambda e, O: _train(e, O, "--answers-per-prompt", BIG["2^31"]))

    # ---- outputs
    file_outs = {  # subcommand: argv with an --out FILE whose input is e[key]
        "tree buffers": (lambda e, O, o: ["tree", "buffers", e["tree"], "--out", o], "tree"),
        "optimize": (lambda e, O, o: ["optimize", "--accuracies", e["acc"], "--budget", "3", "--out", o], "acc"),
        "export": (lambda e, O, o: ["export", e["tree"], "--format", "medusa", "--out", o], "tree"),
        "plan": (lambda e, O, o: ["plan", "--accuracies", e["acc"], "--latency", e["lat"], "--batch-sizes", "1,2",
                                  "--out", o], "lat"),
        "sweep-report": (lambda e, O, o: ["sweep-report", e["sweep"], "--out", o], "sweep"),
        "tree show": (lambda e, O, o: ["tree", "show", e["tree"], "--png", o], "tree"),
        "latency": (lambda e, O, o: with_flag(_lat(e, O), "--out", o), None),  # reads no file: see the heads case
        "sweep": (lambda e, O, o: with_flag(_sweep(e, O), "--out", o), "prompts"),
    }
    for sub, (argv, key) in file_outs.items():
        if key is not None:
            add(sub, "outputs", "--out = its input", lambda e, O, a=argv, k=key: a(e, O, e[k]))
            add(sub, "outputs", "--out = a symlink to its input", lambda e, O, a=argv, k=key: a(e, O, _link(O, e[k])))
        add(sub, "outputs", "--out = a dangling symlink",
            lambda e, O, a=argv: a(e, O, _link(O, f"{O}/nowhere/x.out")), "either")
        add(sub, "outputs", "--out /dev/full", lambda e, O, a=argv: a(e, O, e["devfull"]) if e.get("devfull") else None)
        add(sub, "outputs", "--out /dev/null", lambda e, O, a=argv: a(e, O, e["devnull"]) if e.get("devnull") else None,
            "refuse" if sub == "sweep" else "ok")  # a sweep resumes from its --out: a device is no CSV
    # the symlink case must point at the subcommand's own input: tree file for the tree commands
    add("optimize", "outputs", "--curve-out = --latency input",
        lambda e, O: _opt(e, O, "--latency", e["lat"], "--curve-out", e["lat"]))
    add("optimize", "outputs", "--out inside --calibration (its meta.json)",
        lambda e, O: ["optimize", "--calibration", e["cal"], "--budget", "3", "--out", f"{e['cal']}/meta.json"])
    add("sweep-report", "outputs", "--figures = the sweep CSV itself",
        lambda e, O: ["sweep-report", e["sweep"], "--figures", e["sweep"]])
    add("calibrate", "outputs", "--out = the heads folder", lambda e, O: with_flag(_cal(e, O), "--out", e["heads"]))
    add("calibrate", "outputs", "--out = the model folder --force",
        lambda e, O: with_flag(_cal(e, O, "--force"), "--out", e["model"]))
    add("calibrate", "outputs", "--out = --continuations --force",
        lambda e, O: with_flag(_cal(e, O, "--continuations", e["cal"], "--force"), "--out", e["cal"]))
    add("calibrate", "outputs", "--trees-dir = the model folder",
        lambda e, O: _cal(e, O, "--trees-dir", e["model"]))
    add("calibrate", "outputs", "--out /dev/full", lambda e, O: with_flag(_cal(e, O), "--out", e["devfull"])
        if e.get("devfull") else None)
    add("train-heads", "outputs", "--out = the model folder", lambda e, O: with_flag(_train(e, O), "--out", e["model"]))
    add("train-heads", "outputs", "--work = the model folder", lambda e, O: with_flag(_train(e, O), "--work", e["model"]))
    add("train-heads", "outputs", "--out = --init heads", lambda e, O: with_flag(_train(e, O, "--init", e["heads"]),
                                                                           "--out", e["heads"]))
    add("train-heads", "outputs", "--out = --work", lambda e, O: with_flag(_train(e, O), "--out", f"{O}/w"), "either")
    add("latency", "outputs", "--out = the heads file", lambda e, O: ["latency", "--model", e["model"], "--heads",
                                                                       e["heads"], "--sizes", "1,2", "--context", "8",
                                                                       "--repeats", "1", "--warmup", "0", "--out",
                                                                       e["heads_file"]])
    add("sweep", "outputs", "--out = the prompts file", lambda e, O: with_flag(_sweep(e, O), "--out", e["prompts"]))
    for sub, argv in {"tree list": lambda e, O: ["tree", "list"],
                      "tree show": lambda e, O: ["tree", "show", e["tree"]],
                      "tree buffers": lambda e, O: ["tree", "buffers", e["tree"]],
                      "tree eval": lambda e, O: ["tree", "eval", e["tree"], "--calibration", e["cal"]],
                      "optimize": lambda e, O: ["optimize", "--accuracies", e["acc"], "--budget", "3"],
                      "export": lambda e, O: ["export", e["tree"], "--format", "json"],
                      "plan": lambda e, O: ["plan", "--accuracies", e["acc"], "--latency", e["lat"],
                                            "--batch-sizes", "1,2"],
                      "sweep-report": lambda e, O: ["sweep-report", e["sweep"]],
                      "decode": lambda e, O: _decode(e)}.items():
        add(sub, "outputs", "stdout=closed", argv)
        add(sub, "outputs", "stdout=full", argv)

    # ---- silent garbage
    add("tree show", "garbage", "--accuracies summing past 1", lambda e, O: ["tree", "show", e["tree"], "--accuracies",
                                                                            e["acc_over"]])
    add("optimize", "garbage", "accuracies summing past 1", lambda e, O: with_flag(_opt(e, O), "--accuracies", e["acc_over"]))
    add("optimize", "garbage", "cumulative top-k falling", lambda e, O: with_flag(_opt(e, O), "--accuracies", e["acc_cum"]))
    add("optimize", "garbage", "NaN accuracy", lambda e, O: with_flag(_opt(e, O), "--accuracies", e["acc_nan"]))
    add("optimize", "garbage", "zero counts", lambda e, O: with_flag(_opt(e, O), "--accuracies", e["acc_zero_count"]),
        "either")
    add("optimize", "garbage", "rank 1000000 (1M columns)", lambda e, O: with_flag(_opt(e, O), "--accuracies",
                                                                               e["acc_wide"]), "either")
    add("plan", "garbage", "accuracies summing past 1", lambda e, O: with_flag(_plan(e, O), "--accuracies", e["acc_over"]))
    add("plan", "garbage", "latency underflowing (denormal seconds)",
        lambda e, O: with_flag(_plan(e, O), "--latency", e["lat_tiny"]))
    add("plan", "garbage", "latency overflowing (1e300 squared)",
        lambda e, O: with_flag(_plan(e, O), "--latency", e["lat_huge"]))
    add("plan", "garbage", "latency ratio overflowing", lambda e, O: with_flag(_plan(e, O), "--latency", e["lat_ratio"]))
    add("optimize", "garbage", "--latency underflowing", lambda e, O: _opt(e, O, "--latency", e["lat_tiny"]))
    add("optimize", "garbage", "--latency ratio overflowing", lambda e, O: _opt(e, O, "--latency", e["lat_ratio"]))
    add("sweep-report", "garbage", "--latency ratio overflowing",
        lambda e, O: ["sweep-report", e["sweep"], "--latency", e["lat_ratio"]])
    add("plan", "garbage", "latency negative context", lambda e, O: with_flag(_plan(e, O), "--latency", e["lat_neg_ctx"]))
    add("plan", "garbage", "latency header only", lambda e, O: with_flag(_plan(e, O), "--latency", e["lat_rows0"]))
    add("plan", "garbage", "--acceptance NaN", lambda e, O: ["plan", "--acceptance", e["acc_vec_nan"], "--latency",
                                                             e["lat"], "--batch-sizes", "1"])
    add("plan", "garbage", "--acceptance Infinity", lambda e, O: ["plan", "--acceptance", e["acc_vec_inf"],
                                                                  "--latency", e["lat"], "--batch-sizes", "1"])
    add("plan", "garbage", "--calibration with zero rows", lambda e, O: ["plan", "--calibration", e["cal_zero"],
                                                                         "--latency", e["lat"], "--batch-sizes", "1"])
    add("tree eval", "garbage", "calibration with zero rows", lambda e, O: ["tree", "eval", e["tree"], "--calibration",
                                                                            e["cal_zero"]])
    add("optimize", "garbage", "calibration with zero rows", lambda e, O: ["optimize", "--calibration", e["cal_zero"],
                                                                           "--budget", "3"])
    add("sweep", "garbage", "calibration with zero rows", lambda e, O: _sweep(e, O, "--budgets", "2", "--calibration",
                                                                              e["cal_zero"]))
    add("export", "garbage", "plan with NaN", lambda e, O: ["export", e["plan_nan"], "--format", "medusa"])
    add("export", "garbage", "plan with batch 2^63", lambda e, O: ["export", e["plan_bigb"], "--format", "vllm"],
        "either")
    add("sweep", "garbage", "--plan with NaN", lambda e, O: _sweep(e, O, "--plan", e["plan_nan"])[:0] +
        ["sweep", "--model", e["model"], "--heads", e["heads"], "--plan", e["plan_nan"], "--prompts", e["prompts"],
         "--limit", "2", "--max-new-tokens", "3", "--device", "cpu", "--quiet", "--out", f"{O}/s.csv"])
    add("tree show", "garbage", "NaN rank in a tree file", lambda e, O: ["tree", "show", e["tree_nan"]])
    add("decode", "garbage", "dict-of-lists prompts", lambda e, O: ["decode", "--model", e["model"], "--heads",
                                                                    e["heads"], "--tree", "[[0]]", "--prompts",
                                                                    e["dict_of_lists"], "--max-new-tokens", "2",
                                                                    "--device", "cpu"])
    add("calibrate", "garbage", "dict-of-lists prompts", lambda e, O: with_flag(_cal(e, O), "--prompts",
                                                                             e["dict_of_lists"]))
    add("sweep", "garbage", "dict-of-lists prompts", lambda e, O: with_flag(_sweep(e, O), "--prompts", e["dict_of_lists"]))
    add("train-heads", "garbage", "dict-of-lists prompts", lambda e, O: with_flag(_train(e, O), "--prompts",
                                                                               e["dict_of_lists"]))
    add("calibrate", "garbage", "NaN prompt", lambda e, O: with_flag(_cal(e, O), "--prompts", e["nan_prompts"]))
    for arch in ("bert", "t5", "mamba"):
        add("decode", "garbage", f"{arch} model", lambda e, O, a=arch: with_flag(_decode(e), "--model", e[f"arch_{a}"]))
        add("calibrate", "garbage", f"{arch} model", lambda e, O, a=arch: with_flag(_cal(e, O), "--model",
                                                                                 e[f"arch_{a}"]),
            "either" if arch == "mamba" else "refuse")  # ranks of a Mamba's heads are well defined; decoding is not
        add("latency", "garbage", f"{arch} model", lambda e, O, a=arch: ["latency", "--model", e[f"arch_{a}"],
                                                                         "--sizes", "1,2", "--context", "8",
                                                                         "--repeats", "1", "--warmup", "0", "--out",
                                                                         f"{O}/l.csv"])
        add("train-heads", "garbage", f"{arch} model", lambda e, O, a=arch: with_flag(_train(e, O), "--model",
                                                                                   e[f"arch_{a}"]),
            "either" if arch == "mamba" else "refuse")
    add("latency", "garbage", "--random-config arch=bert", lambda e, O: with_flag(_lat(e, O), "--random-config",
                                                                                "tiny,arch=bert"))
    add("latency", "garbage", "--random-config arch=t5", lambda e, O: with_flag(_lat(e, O), "--random-config",
                                                                              "tiny,arch=t5"))
    add("sweep-report", "garbage", "sweep negative nodes", lambda e, O: ["sweep-report", e["sweep_negnodes"]])
    add("sweep-report", "garbage", "sweep fractional nodes", lambda e, O: ["sweep-report", e["sweep_frac_nodes"]])
    add("sweep-report", "garbage", "sweep zero tokens/step", lambda e, O: ["sweep-report", e["sweep_zero_rate"]])
    add("sweep-report", "garbage", "sweep 1e308 speedups", lambda e, O: ["sweep-report", e["sweep_huge"], "--figures",
                                                                         f"{O}/f"], "either")
    add("sweep-report", "garbage", "sweep batch 2^63", lambda e, O: ["sweep-report", e["sweep_bigb"]])

    # ---- odd types and values
    for flag, bad in (("--budget", "3.5"), ("--budget", "ten"), ("--budget", "1e3"), ("--budget", "")):
        add("optimize", "types", f"{flag} {bad!r}", lambda e, O, f=flag, b=bad: with_flag(_opt(e, O), f, b))
    add("tree buffers", "types", "--topk 'x'", lambda e, O: ["tree", "buffers", "[[0]]", "--topk", "x"])
    add("decode", "types", "--temperature nan", lambda e, O: _decode(e, "--temperature", "nan"))
    add("decode", "types", "--temperature inf", lambda e, O: _decode(e, "--temperature", "inf", "--acceptance",
                                                                     "typical"))
    add("decode", "types", "--top-p 2", lambda e, O: _decode(e, "--acceptance", "nucleus", "--top-p", "2"))
    add("decode", "types", "--top-p with typical", lambda e, O: _decode(e, "--acceptance", "typical", "--top-p", "0.5"))
    add("decode", "types", "--epsilon with greedy", lambda e, O: _decode(e, "--acceptance", "greedy", "--epsilon",
                                                                         "0.3"))
    add("decode", "types", "--seed with greedy", lambda e, O: _decode(e, "--seed", "3"))
    add("decode", "types", "--prompt and --prompts", lambda e, O: _decode(e, "--prompt", "hi"))
    add("decode", "types", "--limit without --prompts", lambda e, O: _decode(e, "--limit", "3"))
    for dev in ("mps", "meta", "cuda:99", "tpu", "cpu:3", "cpu:-1"):
        add("decode", "types", f"--device {dev}", lambda e, O, d=dev: with_flag(_decode(e), "--device", d))
        add("latency", "types", f"--device {dev}", lambda e, O, d=dev: with_flag(_lat(e, O), "--device", d))
    add("calibrate", "types", "--device meta", lambda e, O: with_flag(_cal(e, O), "--device", "meta"))
    add("sweep", "types", "--device mps", lambda e, O: with_flag(_sweep(e, O), "--device", "mps"))
    add("train-heads", "types", "--device meta", lambda e, O: _train(e, O, "--device", "meta"))
    add("train-heads", "types", "--device mps", lambda e, O: _train(e, O, "--device", "mps"))
    add("decode", "types", "--dtype float8", lambda e, O: _decode(e, "--dtype", "float8_e4m3fn"))
    add("train-heads", "types", "--gen-dtype int8", lambda e, O: with_flag(_train(e, O), "--gen-dtype", "int8"))
    add("train-heads", "types", "--gen-dtype float8_e4m3fn", lambda e, O: with_flag(_train(e, O), "--gen-dtype",
                                                                                "float8_e4m3fn"))
    add("latency", "types", "--threads 0", lambda e, O: _lat(e, O, "--threads", "0"))
    add("latency", "types", "--random-config hidden=2.5", lambda e, O: with_flag(_lat(e, O), "--random-config",
                                                                               "tiny,hidden=2.5"))
    add("latency", "types", "--random-config rope_theta=x", lambda e, O: with_flag(_lat(e, O), "--random-config",
                                                                                 "tiny,rope_theta=x"))
    add("latency", "types", "--random-config and --model", lambda e, O: _lat(e, O, "--model", e["model"]))
    add("latency", "types", "--sizes 1.5", lambda e, O: with_flag(_lat(e, O), "--sizes", "1.5"))
    for what, key in (("fp8", "fp8"), ("3-D", "w3d"), ("pickle as safetensors", "pickle"),
                      ("pickle as .pt", "pickle_pt")):
        add("decode", "types", f"{what} heads", lambda e, O, k=key: with_flag(_decode(e), "--heads", e[k]),
            "either" if key == "fp8" else "refuse")
        add("calibrate", "types", f"{what} heads", lambda e, O, k=key: with_flag(_cal(e, O), "--heads", e[k]),
            "either" if key == "fp8" else "refuse")
        add("sweep", "types", f"{what} heads", lambda e, O, k=key: with_flag(_sweep(e, O), "--heads", e[k]),
            "either" if key == "fp8" else "refuse")
        add("latency", "types", f"{what} heads", lambda e, O, k=key: ["latency", "--model", e["model"], "--heads",
                                                                      e[k], "--sizes", "1,2", "--context", "8",
                                                                      "--repeats", "1", "--warmup", "0", "--out",
                                                                      f"{O}/l.csv"],
            "either" if key == "fp8" else "refuse")
        add("train-heads", "types", f"{what} --init", lambda e, O, k=key: _train(e, O, "--init", e[k]),
            "either" if key == "fp8" else "refuse")
    add("optimize", "types", "pickle accuracies", lambda e, O: with_flag(_opt(e, O), "--accuracies", e["acc_pickle"]))
    add("calibrate", "types", "pickle prompts", lambda e, O: with_flag(_cal(e, O), "--prompts", e["pickle_prompts"]))
    add("export", "types", "pickle tree", lambda e, O: ["export", e["acc_pickle"], "--format", "json"])
    add("sweep-report", "types", "sweep missing a column", lambda e, O: ["sweep-report", e["sweep_nocol"]])
    add("sweep-report", "types", "sweep with no rows", lambda e, O: ["sweep-report", e["sweep_empty"]])
    add("sweep-report", "types", "latency missing columns", lambda e, O: ["sweep-report", e["sweep"], "--latency",
                                                                         e["lat_nocols"]])
    add("plan", "types", "--batch-sizes 1.5", lambda e, O: with_flag(_plan(e, O), "--batch-sizes", "1.5"))
    add("plan", "types", "--calibration and --accuracies", lambda e, O: _plan(e, O, "--calibration", e["cal"]))
    add("export", "types", "--engine-safe with --format medusa", lambda e, O: ["export", e["tree"], "--format", "medusa",
                                                                              "--engine-safe"])
    add("export", "types", "plan with --num-heads", lambda e, O: ["export", e["plan"], "--format", "medusa",
                                                                  "--num-heads", "3"])
    add("tree eval", "types", "--calibration a file", lambda e, O: ["tree", "eval", e["tree"], "--calibration",
                                                                    e["acc"]])
    add("sweep", "types", "--joint without budgets", lambda e, O: _sweep(e, O, "--joint"))
    add("sweep", "types", "--replay with --trees", lambda e, O: _sweep(e, O, "--replay"))
    add("sweep", "types", "--delta -1", lambda e, O: _sweep(e, O, "--delta", "-1"))
    add("sweep", "types", "--epsilon 0", lambda e, O: _sweep(e, O, "--epsilon", "0"))
    add("calibrate", "types", "--continuations a file", lambda e, O: _cal(e, O, "--continuations", e["acc"]))
    add("train-heads", "types", "--gen-share 1", lambda e, O: _train(e, O, "--time-budget", "10", "--gen-share", "1"))
    add("train-heads", "types", "--active-steps > --steps", lambda e, O: _train(e, O, "--active-steps", "5"))
    add("train-heads", "types", "--untied --init tied heads", lambda e, O: _train(e, O, "--untied", "--init",
                                                                                e["heads"]))
    add("train-heads", "types", "--init with other --num-heads", lambda e, O: with_flag(_train(e, O, "--init", e["heads"]),
                                                                                  "--num-heads", "5"))
    _long_command_cases(add)
    _absurd_size_cases(add)
    _issue71_cases(add)
    return C


ABSURD_HEADS = {  # env key: what it claims
    "h_index": "head index 4320", "h_65": "65 complete heads", "h_hidden": "hidden size 131072",
    "h_hidden_shape": "a [4, 60000] ResBlock weight", "h_hidden_96": "hidden size 96 (another model's)",
    "h_layers": "ResBlock layer 250", "h_vocab": "an lm_head of 3M rows", "h_pt_hidden": ".pt hidden size 90000",
    "h_pt_index": ".pt head index 1234", "h_cfg": "config medusa_num_heads 5000",
    "h_cfg_vocab": "config vocab_size 3M", "h_3d_cfg": "3-D weight after a config warning",
}


def _issue71_inputs(d: Path, e: dict) -> None:
    """Issue 71's files: a calibration with a recorded topk.parquet and damaged copies of it, plans damaged by type
    or drafting past their heads, latency files of two settings or of an engine contradicting the setting."""
    import shutil

    import numpy as np
    import pandas as pd

    meta = json.loads((Path(e["cal"]) / "meta.json").read_text())
    ranks = pd.read_parquet(Path(e["cal"]) / "ranks.parquet")
    held = ranks[ranks["prompt_id"].isin(meta["holdout_ids"])]
    K, topk = meta["num_heads"], meta["topk"]
    rng = np.random.default_rng(0)
    good = dict(prompt_id=held["prompt_id"].astype(str).to_numpy(), position=held["position"].to_numpy())
    for k in range(1, K + 1):
        good[f"logp_{k}"] = [-np.sort(rng.random(topk) * 9).astype(np.float32) for _ in range(len(held))]
        good[f"ids_{k}"] = [rng.permutation(128)[:topk].astype(np.int32) for _ in range(len(held))]
    good = pd.DataFrame(good)
    damaged = {"topk_floats": good.assign(logp_1=-1.0), "topk_text_pos": good.assign(position=good["position"].astype(str)),
               "topk_nan": good.assign(logp_2=[np.full(topk, np.nan, np.float32)] * len(good)),
               "topk_ascending": good.assign(logp_1=[np.sort(x) for x in good["logp_1"]]),
               "topk_dup": pd.concat([good, good.iloc[:1]], ignore_index=True)}
    for name, df in {"cal_topk": good, **damaged}.items():
        folder = d / name
        shutil.copytree(e["cal"], folder)
        df.to_parquet(folder / "topk.parquet", index=False)
        e[name] = str(folder)
    plan = json.loads(Path(e["plan"]).read_text())
    for name, edit in {"plan_src_str": lambda p: p.update(source="calibration"),
                       "plan_runner_list": lambda p: p["alternatives"][0].update(runner_up=["chain"]),
                       "plan_deep": lambda p: p["plans"][0].update(kind="chain", nodes=12,
                                                                   medusa_choices=[[0] * i for i in range(1, 13)]),
                       "plan_envelope": lambda p: p["latency"].update(dynamic={"envelope": 10 ** 12})}.items():
        bad = json.loads(json.dumps(plan))
        edit(bad)
        (d / f"{name}.json").write_text(json.dumps(bad))
        e[name] = str(d / f"{name}.json")
    lat = pd.read_csv(e["lat"])
    cell = lambda **kw: json.dumps(dict(device="cpu", dtype="float32", threads=2, compiled=False,  # noqa: E731
                                        mode="decoder-step") | kw)
    for name, df in {"lat_mixed": lat.assign(setting=[cell(compiled="layers" if i % 2 else False)
                                                      for i in range(len(lat))]),
                     "lat_engine": lat.assign(setting=cell(mode="vllm-round")),
                     "lat_list": lat.assign(setting=cell(threads=[2, 4])),
                     "lat_vllm": lat.assign(setting=cell(mode="vllm-round"), engine="vllm", engine_version="0.32.0",
                                            context_min=16, context_max=16, version=4)}.items():
        df.to_csv(d / f"{name}.csv", index=False)
        e[name] = str(d / f"{name}.csv")


def _issue71_cases(add) -> None:
    """Issue 71: outputs on what a command reads, topk.parquet, plans by type, latency settings, ignored flags."""
    add("export", "outputs", "vllm-heads --out inside the --model folder",
        lambda e, O: ["export", e["heads"], "--format", "vllm-heads", "--model", e["model"], "--out",
                      f"{e['model']}/medusa"])
    add("export", "outputs", "vllm-heads --out = the heads read",
        lambda e, O: ["export", e["heads"], "--format", "vllm-heads", "--model", e["model"], "--out", e["heads"]])
    add("latency", "outputs", "--out inside the --model folder",
        lambda e, O: ["latency", "--model", e["model"], "--sizes", "1,2", "--context", "8", "--repeats", "1",
                      "--warmup", "0", "--out", f"{e['model']}/latency.csv"])
    add("calibrate", "outputs", "--out inside the --heads folder",
        lambda e, O: with_flag(_cal(e, O), "--out", f"{e['heads']}/cal"))
    for key in ("topk_floats", "topk_text_pos", "topk_nan", "topk_ascending", "topk_dup"):
        add("tree eval", "garbage", f"{key} replayed",
            lambda e, O, k=key: ["tree", "eval", e["tree"], "--calibration", e[k], "--dynamic", "2"])
    add("tree eval", "types", "a valid topk.parquet replayed",
        lambda e, O: ["tree", "eval", e["tree"], "--calibration", e["cal_topk"], "--dynamic", "2"], "ok")
    add("tree eval", "types", "--max-new-tokens without --dynamic",
        lambda e, O: ["tree", "eval", e["tree"], "--calibration", e["cal"], "--max-new-tokens", "4"])
    add("calibrate", "types", "--record-topk with --limit",
        lambda e, O: ["calibrate", "--record-topk", "--out", e["cal_topk"], "--limit", "2", "--model", e["model"],
                      "--heads", e["heads"]])
    for key in ("plan_src_str", "plan_runner_list", "plan_deep", "plan_envelope"):
        add("export", "types", f"{key} to vllm", lambda e, O, k=key: ["export", e[k], "--format", "vllm", "--out",
                                                                     f"{O}/spec.json"])
    add("sweep", "types", "--plan drafting past its heads", lambda e, O: ["sweep", "--plan", e["plan_deep"], "--model",
                                                                         e["model"], "--heads", e["heads"],
                                                                         "--prompts", e["prompts"], "--out",
                                                                         f"{O}/s.csv"])
    for key in ("lat_mixed", "lat_engine", "lat_list"):
        add("plan", "garbage", f"{key} latency", lambda e, O, k=key: with_flag(_plan(e, O), "--latency", e[k]))
    add("sweep-report", "types", "a vLLM surface as --latency",
        lambda e, O: ["sweep-report", e["sweep"], "--latency", e["lat_vllm"], "--out", f"{O}/r.md"])
    add("latency", "types", "--engine vllm --envelope",
        lambda e, O: ["latency", "--engine", "vllm", "--envelope", e["tree"], "--out", f"{O}/l.csv"])


def _absurd_size_cases(add) -> None:
    """Issue 52: files implying absurd sizes, refused before anything of that size is allocated or worked through:
    heads (names and shapes read, checked against limits and the base model, before a tensor is loaded),
    calibrations naming a top-k past 16-bit ranks, accuracy tables of millions of ranks or heads. Each refusal may
    take 10 CPU seconds at most (a busy machine stretches wall time, not CPU time); the heads cases that must load
    the base model to compare with it, 30."""
    for key, what in ABSURD_HEADS.items():
        cpu = 30 if key == "h_hidden_96" else 10
        add("decode", "sizes", f"heads: {what}", lambda e, O, k=key: with_flag(_decode(e), "--heads", e[k]), cpu=cpu)
    for key in ("h_index", "h_hidden", "h_vocab", "h_pt_hidden", "h_hidden_96"):
        what, cpu = ABSURD_HEADS[key], 30 if key == "h_hidden_96" else 10
        add("calibrate", "sizes", f"heads: {what}", lambda e, O, k=key: with_flag(_cal(e, O), "--heads", e[k]), cpu=cpu)
        add("latency", "sizes", f"heads: {what}", lambda e, O, k=key: ["latency", "--model", e["model"], "--heads",
                                                                         e[k], "--sizes", "1,2", "--context", "8",
                                                                         "--repeats", "1", "--warmup", "0", "--out",
                                                                         f"{O}/l.csv"], cpu=cpu)
        add("sweep", "sizes", f"heads: {what}", lambda e, O, k=key: with_flag(_sweep(e, O), "--heads", e[k]), cpu=cpu)
        add("eval-heads", "sizes", f"heads: {what}", lambda e, O, k=key: with_flag(_evalh(e, O), "--heads", e[k]),
            cpu=cpu)
    for key in ("h_65", "h_layers", "h_pt_index", "h_hidden_shape"):
        add("train-heads", "sizes", f"--init {ABSURD_HEADS[key]}", lambda e, O, k=key: _train(e, O, "--init", e[k]),
            cpu=10)
        add("export", "sizes", f"plan --heads {ABSURD_HEADS[key]}",
            lambda e, O, k=key: ["export", e["plan"], "--format", "vllm", "--heads", e[k]], cpu=10)
        add("export", "sizes", f"vllm-heads {ABSURD_HEADS[key]}",
            lambda e, O, k=key: ["export", e[k], "--format", "vllm-heads", "--model", e["model"], "--out", f"{O}/v"],
            cpu=10)
    add("decode", "sizes", "Medusa-2 model with head index 2047",
        lambda e, O: with_flag(with_flag(_decode(e), "--model", e["m2_index"]), "--heads", e["m2_index"]), cpu=10)
    add("eval-heads", "sizes", "--medusa2 with head index 2047",
        lambda e, O: with_flag(_evalh(e, O), "--medusa2", e["m2_index"]), cpu=10)

    for topk in (40000, 524289, 9_000_000):
        cal = f"cal_topk_{topk}"
        add("optimize", "sizes", f"calibration top-{topk}",
            lambda e, O, c=cal: ["optimize", "--calibration", e[c], "--budget", "3"], cpu=10)
        add("plan", "sizes", f"calibration top-{topk}",
            lambda e, O, c=cal: ["plan", "--calibration", e[c], "--latency", e["lat"], "--batch-sizes", "1,2"], cpu=10)
        add("tree eval", "sizes", f"calibration top-{topk}",
            lambda e, O, c=cal: ["tree", "eval", e["tree"], "--calibration", e[c]], cpu=10)
        add("export", "sizes", f"--engine-safe --calibration top-{topk}",
            lambda e, O, c=cal: ["export", e["tree"], "--format", "trtllm", "--engine-safe", "--calibration", e[c]],
            cpu=10)
        add("sweep", "sizes", f"calibration top-{topk}",
            lambda e, O, c=cal: _sweep(e, O, "--budgets", "2", "--calibration", e[c]), cpu=10)
    add("calibrate", "sizes", "--topk past 16-bit ranks", lambda e, O: with_flag(_cal(e, O), "--topk", "40000"),
        cpu=10)
    add("vllm-check", "sizes", "calibration top-524289",
        lambda e, O: with_flag(_vcheck(e, O), "--calibration", e["cal_topk_524289"]), cpu=10)

    tables = {"acc_rank_4m": "rank 4,000,000", "acc_heads_70k": "head 70,000", "acc_topk_3m": "column top3000000",
              "acc_topk_cells": "64 heads x top_800000", "acc_pt_wide": ".pt hits of top-2.5M"}
    for key, what in tables.items():
        add("optimize", "sizes", f"accuracies {what}", lambda e, O, k=key: with_flag(_opt(e, O), "--accuracies", e[k]),
            cpu=10)
        add("plan", "sizes", f"accuracies {what}", lambda e, O, k=key: with_flag(_plan(e, O), "--accuracies", e[k]),
            cpu=10)
        add("tree show", "sizes", f"accuracies {what}", lambda e, O, k=key: ["tree", "show", e["tree"],
                                                                              "--accuracies", e[k]], cpu=10)
        add("export", "sizes", f"--engine-safe --accuracies {what}",
            lambda e, O, k=key: ["export", e["tree"], "--format", "trtllm", "--engine-safe", "--accuracies", e[k]],
            cpu=10)


def _long_command_cases(add) -> None:
    """eval-heads and vllm-check: every kind. A vllm-check that passes every check ends at its stand-in vLLM
    interpreter (exit 3): one error line, so only refusals are asked of it."""
    for tag, v in BIG.items():
        add("eval-heads", "sizes", f"--max-new-tokens {tag}", lambda e, O, v=v: with_flag(_evalh(e, O), "--max-new-tokens", v))
        add("eval-heads", "sizes", f"--topk {tag}", lambda e, O, v=v: with_flag(_evalh(e, O), "--topk", v))
        add("eval-heads", "sizes", f"--gen-batch {tag}", lambda e, O, v=v: with_flag(_evalh(e, O), "--gen-batch", v),
            "either")
        add("eval-heads", "sizes", f"--limit {tag}", lambda e, O, v=v: with_flag(_evalh(e, O), "--limit", v), "either")
        add("eval-heads", "sizes", f"--live {tag}", lambda e, O, v=v: with_flag(_evalh(e, O), "--live", v), "either")
        for flag in ("--k", "--batch-sizes", "--max-new-tokens"):
            add("vllm-check", "sizes", f"{flag} {tag}", lambda e, O, f=flag, v=v: with_flag(_vcheck(e, O), f, v))
    for bad in ("0", "1", "1.5", "-0.1", "nan", "inf", "half"):
        add("eval-heads", "sizes", f"--holdout {bad}", lambda e, O, b=bad: with_flag(_evalh(e, O), "--holdout", b))
    add("eval-heads", "sizes", "--max-new-tokens 0", lambda e, O: with_flag(_evalh(e, O), "--max-new-tokens", "0"))
    add("eval-heads", "sizes", "--topk 0", lambda e, O: with_flag(_evalh(e, O), "--topk", "0"))
    add("eval-heads", "sizes", "--tree deeper than the heads",
        lambda e, O: with_flag(_evalh(e, O), "--tree", "[[0],[0,0],[0,0,0],[0,0,0,0]]"))
    for bad in ("0", "-1", "1.5", "a", "", "1,,2", "4"):  # 4: the heads draft 3 tokens at most
        add("vllm-check", "sizes", f"--k {bad!r}", lambda e, O, b=bad: with_flag(_vcheck(e, O), "--k", b))
    add("vllm-check", "sizes", "--batch-sizes 0", lambda e, O: with_flag(_vcheck(e, O), "--batch-sizes", "0"))
    add("vllm-check", "sizes", "--limit 0", lambda e, O: with_flag(_vcheck(e, O), "--limit", "0"))
    add("vllm-check", "sizes", "--limit 2^63", lambda e, O: with_flag(_vcheck(e, O), "--limit", BIG["2^63"]))

    # outputs
    for sub, argv, key in (("eval-heads", _evalh, "prompts"), ("vllm-check", _vcheck, "cal")):
        for flag in ("--out", "--table"):
            add(sub, "outputs", f"{flag} = its input", lambda e, O, a=argv, f=flag, k=key: with_flag(a(e, O), f, e[k]))
            add(sub, "outputs", f"{flag} = a symlink to its input",
                lambda e, O, a=argv, f=flag: with_flag(a(e, O), f, _link(O, e["prompts" if a is _evalh else "heads"])))
            add(sub, "outputs", f"{flag} /dev/full",
                lambda e, O, a=argv, f=flag: with_flag(a(e, O), f, e["devfull"]) if e.get("devfull") else None)
        add(sub, "outputs", "--out = --table", lambda e, O, a=argv: a(e, O, "--table", f"{O}/{'ev'[a is _vcheck]}.json"))
        add(sub, "outputs", "--out = a dangling symlink",
            lambda e, O, a=argv: with_flag(a(e, O), "--out", _link(O, f"{O}/nowhere/x.json")), "either")
        add(sub, "outputs", "--out = a folder", lambda e, O, a=argv: with_flag(a(e, O), "--out", str(O)))
    add("eval-heads", "outputs", "--out = the Medusa-2 model's config.json",
        lambda e, O: with_flag(_evalh(e, O), "--out", e["m2_config"]))
    add("vllm-check", "outputs", "--out = its --plan", lambda e, O: _vcheck(e, O, "--plan", e["plan"])[:-2] +
        ["--out", e["plan"]])
    add("eval-heads", "outputs", "stdout=closed", lambda e, O: _evalh(e, O)[:-2])
    add("eval-heads", "outputs", "stdout=full", lambda e, O: _evalh(e, O)[:-2])

    # silent garbage and odd types
    for what, key in (("dict-of-lists", "dict_of_lists"), ("NaN", "nan_prompts"), ("pickle", "pickle_prompts")):
        add("eval-heads", "garbage", f"{what} prompts", lambda e, O, k=key: with_flag(_evalh(e, O), "--prompts", e[k]))
        add("vllm-check", "garbage", f"{what} prompts", lambda e, O, k=key: _vcheck(e, O, "--prompts", e[k]))
    add("vllm-check", "garbage", "--plan with NaN", lambda e, O: _vcheck(e, O, "--plan", e["plan_nan"]))
    add("vllm-check", "garbage", "--plan a prompts file", lambda e, O: _vcheck(e, O, "--plan", e["prompts"]))
    add("vllm-check", "garbage", "calibration with zero rows", lambda e, O: with_flag(_vcheck(e, O), "--calibration",
                                                                                       e["cal_zero"]))
    add("eval-heads", "types", "--tree with a missing parent", lambda e, O: with_flag(_evalh(e, O), "--tree",
                                                                                     "[[0],[1,0]]"))
    add("eval-heads", "types", "--tree NaN file", lambda e, O: with_flag(_evalh(e, O), "--tree", e["tree_nan"]))
    add("eval-heads", "types", "--tree a word", lambda e, O: with_flag(_evalh(e, O), "--tree", "bushy"))
    for what, key in (("no such", None), ("a file as", "prompts"), ("the heads folder as", "heads"),
                      ("a plain model (no heads) as", "model"), ("pickle heads as", "pickle"),
                      ("BERT as", "arch_bert"), ("T5 as", "arch_t5"), ("Mamba as", "arch_mamba")):
        add("eval-heads", "types", f"{what} --medusa2",
            lambda e, O, k=key: with_flag(_evalh(e, O), "--medusa2", e[k] if k else f"{O}/missing"))
    for dev in ("mps", "meta", "cuda:99"):
        add("eval-heads", "types", f"--device {dev}", lambda e, O, d=dev: with_flag(_evalh(e, O), "--device", d))
    for what, key in (("fp8", "fp8"), ("3-D", "w3d"), ("pickle as safetensors", "pickle")):
        add("eval-heads", "types", f"{what} heads", lambda e, O, k=key: with_flag(_evalh(e, O), "--heads", e[k]),
            "either" if key == "fp8" else "refuse")
        add("vllm-check", "types", f"{what} heads", lambda e, O, k=key: with_flag(_vcheck(e, O), "--heads", e[k]))
    for what, path in (("no such", "/nonexistent/python"), ("a folder as", "in"), ("a text file as", "prompts")):
        add("vllm-check", "types", f"{what} --vllm-python",
            lambda e, O, p=path: with_flag(_vcheck(e, O), "--vllm-python", e.get(p, p)))
    add("vllm-check", "types", "--model a file", lambda e, O: with_flag(_vcheck(e, O), "--model", e["prompts"]))
    add("vllm-check", "types", "--model BERT", lambda e, O: with_flag(_vcheck(e, O), "--model", e["arch_bert"]))
    add("vllm-check", "types", "--calibration a file", lambda e, O: with_flag(_vcheck(e, O), "--calibration", e["acc"]))
    add("vllm-check", "types", "a run that passes every check", lambda e, O: _vcheck(e, O))  # ends at the stand-in
    # issue 52: a sweep reader refuses, at the column or cell, any file it could not draw every output from
    for key in ("sweep_header_only", "sweep_v1_short", "sweep_no_speedup", "sweep_no_acceptance", "sweep_blank_speedup",
                "sweep_blank_kind", "sweep_version_7", "sweep_version_word"):
        add("sweep-report", "types", f"{key} for figures",
            lambda e, O, k=key: ["sweep-report", e[k], "--figures", f"{O}/figs"])
        add("sweep-report", "types", f"{key} as a table", lambda e, O, k=key: ["sweep-report", e[k]])


CASES = _cases()


# ----------------------------------------------------------------------------------------------- the subprocess runner

def snapshot(folder: Path) -> dict:
    """{relative path: sha256 (or link target)} of every file under folder."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        key = str(p.relative_to(folder))
        if p.is_symlink():
            out[key] = "link:" + os.readlink(p)
        elif p.is_file():
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


PY_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")  # Python's own warning format (warnings.formatwarning)


def verdict(expect: str, rc, err: str, changed: bool, timed_out: bool) -> str:
    """'' when the case was handled right, else what went wrong."""
    lines = [line for line in err.splitlines() if line.strip()]
    if timed_out:
        return "hang"
    if changed:
        return "input changed"
    if "Traceback" in err:
        return "traceback"
    if any(PY_WARNING.match(line) for line in lines):  # "file:line: Category: message" + its source line
        return "a warning not in one line"
    if rc == 2:
        errs = [line for line in lines if line.startswith("error: ")]
        if not (len(errs) == 1 and lines and lines[-1] == errs[0]):
            return "not one error line"
        return "refused a valid input" if expect == "ok" else ""
    if rc == 0:
        return "exit 0 on bad input" if expect == "refuse" else ""
    return f"exit {rc}"


def _run_one(repo: str, e: dict, out_root: Path, i: int, case, limit: float):
    import resource
    import subprocess
    import time

    sub, kind, cid, argv, expect = case
    O = out_root / f"c{i}"
    O.mkdir(parents=True, exist_ok=True)
    try:
        built = argv(e, O)
    except KeyError:  # an architecture this transformers lacks
        built = None
    if built is None:  # needs something this machine lacks (a device node, an architecture)
        return None
    args = [str(a) for a in built]
    before = snapshot(Path(e["in"]))
    stdout, pre = subprocess.PIPE, None
    if "stdout=full" in cid:
        stdout = open("/dev/full", "w")
    elif "stdout=closed" in cid:
        pre = lambda: os.close(1)  # noqa: E731
    env = dict(os.environ, PYTHONPATH=repo, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        p = subprocess.run([sys.executable, "-m", "workbench.cli", *args], cwd=O, env=env, stdout=stdout,
                           stderr=subprocess.PIPE, timeout=limit, preexec_fn=pre)
        rc, err, timed_out = p.returncode, p.stderr.decode(errors="replace"), False
    except subprocess.TimeoutExpired as ex:
        rc, err, timed_out = None, (ex.stderr or b"").decode(errors="replace"), True
    dt, cpu1 = time.time() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    changed = snapshot(Path(e["in"])) != before
    last = ([line for line in err.splitlines() if line.strip()] or [""])[-1][:200]
    # cpu_seconds: the CPU the case's process used (what a busy machine does not inflate as it does the wall
    # time); exact only with one case at a time (--workers 1), else it holds the other children's too
    return dict(sub=sub, kind=kind, id=cid, expect=expect, rc=rc, last=last, traceback="Traceback" in err,
                seconds=round(dt, 1), changed=changed, wrong=verdict(expect, rc, err, changed, timed_out),
                cpu_seconds=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2), argv=args)


def picked(cid: str, only) -> bool:
    """Is case `cid` among those asked for: `only` None (all), or a list of substrings of case ids."""
    return not only or any(o in cid for o in only)


def run_subprocess(repo: str, e: dict, out_root: Path, limit: float = 40.0, only=None, workers: int = 3):
    """Every case as a subprocess. Cases that may write where an input is run one at a time, each followed by a
    restore of the inputs (so one damaging case cannot spoil the next); the others run `workers` at a time."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    pristine = Path(e["root"]) / "pristine"
    if not pristine.exists():
        shutil.copytree(e["in"], pristine, symlinks=True)
    cases = [(i, c) for i, c in enumerate(CASES) if picked(c[2], only)]
    risky = [(i, c) for i, c in cases if c[1] == "outputs"]
    safe = [(i, c) for i, c in cases if c[1] != "outputs"]
    results = []

    def done(r):
        if r is not None:
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "argv"}), flush=True)

    with ThreadPoolExecutor(workers) as pool:
        for r in pool.map(lambda ic: _run_one(repo, e, out_root, ic[0], ic[1], limit), safe):
            done(r)
    for i, c in risky:
        r = _run_one(repo, e, out_root, i, c, limit)
        done(r)
        if snapshot(Path(e["in"])) != snapshot(pristine) or r and r["changed"]:
            shutil.rmtree(e["in"])
            shutil.copytree(pristine, e["in"], symlinks=True)
    return results


def run_case_inprocess(e: dict, O: Path, case, limit: float = 30.0) -> dict | None:
    """One case through workbench.cli.main in this process: stdout and stderr captured (a closed stdout is None,
    a full one /dev/full), a SIGALRM after `limit` seconds counted as a hang."""
    import contextlib
    import io
    import signal
    import time
    import traceback

    from workbench.cli import main

    sub, kind, cid, argv, expect = case
    O.mkdir(parents=True, exist_ok=True)
    try:
        built = argv(e, O)
    except KeyError:
        built = None
    if built is None:
        return None
    args = [str(a) for a in built]
    before = snapshot(Path(e["in"]))
    err = io.StringIO()
    out = None if "stdout=closed" in cid else open("/dev/full", "w") if "stdout=full" in cid else io.StringIO()

    def alarm(*_):
        raise TimeoutError(f"over {limit} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    cwd, saved_out, t0, timed_out = os.getcwd(), sys.stdout, time.time(), False
    cpu0 = time.process_time()
    try:
        os.chdir(O)
        sys.stdout = out
        with contextlib.redirect_stderr(err):
            rc = main(args)
    except TimeoutError:
        rc, timed_out = None, True
    except BaseException:  # noqa: BLE001 - anything escaping main is the finding
        rc = "exception"
        err.write(traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.stdout = saved_out
        os.chdir(cwd)
        if out is not None and not isinstance(out, io.StringIO):
            try:
                out.close()
            except OSError:
                pass
    dt, cpu = time.time() - t0, time.process_time() - cpu0
    text = err.getvalue()
    changed = snapshot(Path(e["in"])) != before
    last = ([line for line in text.splitlines() if line.strip()] or [""])[-1][:200]
    # cpu_seconds: this process's CPU time over the case (all its threads): what a busy machine does not inflate
    return dict(sub=sub, kind=kind, id=cid, expect=expect, rc=rc, last=last, traceback="Traceback" in text,
                seconds=round(dt, 1), cpu_seconds=round(cpu, 2), changed=changed,
                wrong=verdict(expect, rc, text, changed, timed_out),
                stdout=out.getvalue()[:2000] if isinstance(out, io.StringIO) else None, argv=args)


def run_inprocess(e: dict, out_root: Path, limit: float = 30.0, only=None, shard=(0, 1)) -> list[dict]:
    """Every case in this process (memory capped at 8 GiB, so a blow-up is a MemoryError, not the OOM killer);
    the inputs are restored from a pristine copy after any case that changed them."""
    import resource
    import shutil

    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    pristine = Path(e["root"]) / "pristine"
    if not pristine.exists():
        shutil.copytree(e["in"], pristine, symlinks=True)
    results = []
    for i, c in enumerate(CASES):
        if not picked(c[2], only) or i % shard[1] != shard[0]:
            continue
        r = run_case_inprocess(e, out_root / f"c{i}", c, limit)
        if r is None:
            continue
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("argv", "stdout")}), file=sys.__stderr__,
              flush=True)
        if r["changed"]:
            shutil.rmtree(e["in"])
            shutil.copytree(pristine, e["in"], symlinks=True)
    return results


if __name__ == "__main__":
    import argparse
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--out", required=True, help="results JSON lines")
    ap.add_argument("--only", action="append", help="substring of case ids (repeat for several)")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--limit", type=float, default=30.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--shard", default="0/1", help="I/N: run every N-th case from the I-th")
    ap.add_argument("--subprocess", action="store_true", help="one subprocess per case (slow: seconds of imports "
                    "each); default: in-process")
    a = ap.parse_args()
    sys.path.insert(0, a.repo)
    root = Path(tempfile.mkdtemp(prefix="hostile-"))
    e = build_env(root)
    load = os.getloadavg()
    res = run_subprocess(a.repo, e, root / "out", a.limit, a.only, a.workers) if a.subprocess else \
        run_inprocess(e, root / "out", a.limit, a.only, tuple(map(int, a.shard.split("/"))))
    head = {"note": f"tests/hostile_cases.py against {a.repo}, "
                    + (f"one subprocess per case, {a.workers} at a time" if a.subprocess else "in-process")
                    + f", {a.limit:g} s per case limit, on {os.cpu_count()} CPUs: seconds under this load are not "
                      "speeds", "loadavg_1_5_15_before": [round(x, 2) for x in load],
            "loadavg_1_5_15_after": [round(x, 2) for x in os.getloadavg()]}
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in [head] + res))
