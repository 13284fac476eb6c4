"""Typical acceptance with the exact entropy (-sum p log p, ours) beside Medusa's code's (-sum p log(p + 1e-5)).

    python bench/entropy.py --threads 1                   # demo model + shipped heads, 16 Alpaca-eval prompts
    python bench/entropy.py --tiny --limit 2              # tiny random Llama with random heads: the plumbing only

Two counts per temperature. Node decisions: along the exact-entropy run, every tree node of every step is judged
by both forms on the same logits (`acceptance.typical_decisions`); how many decisions and accepted lengths differ.
Emitted tokens: the same prompts decoded again with Medusa's form; how many prompts' outputs differ from the exact
run's, and where the first difference is. Prints a table and writes JSON (bench/results/entropy.json unless --out).
"""
from __future__ import annotations

import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from workbench import WorkbenchError  # noqa: E402
from workbench.cli.shared import ScriptParser, parse_floats, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.core.provenance import load_average  # noqa: E402
from workbench.decode import acceptance  # noqa: E402
from workbench.decode.loop import Acceptance, medusa_generate
from workbench.decode.acceptance import best_path, typical_decisions  # noqa: E402
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import tree_setup  # noqa: E402
from workbench.runtime.generation import prepare_prompt  # noqa: E402
from workbench.runtime.models import load_model_and_heads, model_label  # noqa: E402

HERE = Path(__file__).resolve().parent
DEMO_TREE = HERE.parent / "trees" / "smollm2-135m-instruct-alpaca-eval-joint-16.json"


class DecisionCounter(StepEngine):
    """An eager StepEngine whose steps also judge every node under both entropy forms (counting only): the step's
    typical acceptance is wrapped while it runs, so the counts see the logits the step itself computed."""

    def __init__(self, model, rule: Acceptance):
        super().__init__(model, compile=False)
        self.rule = rule
        self.nodes = self.differ = self.lengths_differ = self.steps = 0

    def step(self, fn, buf, key, args):
        real = acceptance.accept_typical

        def counted(logits, tokens, tree, *a):
            self.count(logits, tokens, tree)
            return real(logits, tokens, tree, *a)
        acceptance.accept_typical = counted
        try:
            return super().step(fn, buf, key, args)
        finally:
            acceptance.accept_typical = real

    def count(self, logits, tokens, tree):
        r = self.rule
        ok = {form: typical_decisions(logits, tokens, tree, r.temperature, r.epsilon, r.delta, form)[0]
              for form in ("exact", "medusa")}                               # [B, N] each
        alive = torch.tensor(self.host_alive, device=tokens.device)          # [B]
        lengths = {form: best_path(o, None, tree)[1] for form, o in ok.items()}  # [B] each
        self.steps += int(alive.sum())
        self.nodes += int(alive.sum()) * (tokens.shape[1] - 1)
        self.differ += int((ok["exact"] != ok["medusa"])[alive][:, 1:].sum())
        self.lengths_differ += int((lengths["exact"] != lengths["medusa"])[alive].sum())


def first_difference(a: list[int], b: list[int]) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return n if n is not None or len(a) == len(b) else min(len(a), len(b))


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--heads")
    ap.add_argument("--tree", default=None, help=f"tree spec (default: {DEMO_TREE.name}, or mc_sim_7b_63 with --tiny)")
    ap.add_argument("--prompts", default="alpaca-eval")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", default="0.7,1.0", help="comma-separated temperatures (> 0)")
    ap.add_argument("--epsilon", type=float, default=0.09)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--tiny", action="store_true", help="tiny random Llama + random heads (plumbing only)")
    ap.add_argument("--out", default=str(HERE / "results" / "entropy.json"))
    return run_script(ap, _run, argv)


def _run(args) -> int:
    try:
        temperatures = parse_floats(args.temperature, "--temperature")
        if not all(t > 0 for t in temperatures):
            raise WorkbenchError(f"--temperature {args.temperature}: each must be > 0 (at 0 both forms agree)")
        if args.threads:
            torch.set_num_threads(args.threads)
        if args.tiny:
            from tests.support.tiny import random_heads, tiny_model, tiny_tokenizer
            model, tok = tiny_model("llama", seed=0, hidden_size=256, layers=4), tiny_tokenizer()
            heads, label = random_heads(256, 128, 5, tied=True, seed=1), "tiny-random-llama"
            prompts = ["Explain how a rainbow forms.", "Write a haiku about autumn."][:args.limit]
        else:
            from workbench.core.data import load_prompts
            model, tok, heads = load_model_and_heads(args.model, args.heads)
            label, prompts = model_label(args.model), load_prompts(args.prompts, args.limit)
        tree = args.tree or ("mc_sim_7b_63" if args.tiny else str(DEMO_TREE))
        buf = tree_setup(tree, model, heads.num_heads)
        encoded = [prepare_prompt(tok, p) for p in prompts]
        rows = []
        for t in temperatures:
            exact = Acceptance("typical", t, args.epsilon)
            counter = DecisionCounter(model, exact)
            a = [medusa_generate(model, heads, tok, ids, buf, args.max_new_tokens, exact, engine=counter)
                 for ids in encoded]
            medusa = Acceptance("typical", t, args.epsilon, entropy="medusa")
            b = [medusa_generate(model, heads, tok, ids, buf, args.max_new_tokens, medusa) for ids in encoded]
            firsts = [first_difference(x.token_ids, y.token_ids) for x, y in zip(a, b)]
            rows.append(dict(temperature=t, epsilon=args.epsilon, delta=exact.delta, steps=counter.steps,
                             node_decisions=counter.nodes, node_decisions_differ=counter.differ,
                             accepted_lengths_differ=counter.lengths_differ, prompts=len(encoded),
                             tokens=sum(len(x.token_ids) for x in a),
                             prompts_differ=sum(f is not None for f in firsts),
                             first_differences=firsts))
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{label}, tree {buf.tree.name or tree} ({buf.size - 1} nodes), {len(encoded)} prompts x "
          f"{args.max_new_tokens} tokens, epsilon {args.epsilon}, delta {rows[0]['delta']:.3f}")
    print(f"{'T':>5} {'steps':>7} {'node decisions':>15} {'differ':>7} {'lengths differ':>15} {'outputs differ':>15}")
    for r in rows:
        print(f"{r['temperature']:>5g} {r['steps']:>7} {r['node_decisions']:>15} {r['node_decisions_differ']:>7} "
              f"{r['accepted_lengths_differ']:>15} {r['prompts_differ']:>9} / {r['prompts']}")
    atomic_write_json(args.out, dict(model=label, tree=buf.tree.name or tree, nodes=buf.size - 1,
                                     max_new_tokens=args.max_new_tokens, threads=torch.get_num_threads(),
                                     machine=platform.machine(), load_average=load_average(), rows=rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
