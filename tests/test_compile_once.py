"""The compiled step compiles once per (batch size, tree size) for the life of an engine, whatever the prompt
lengths: the cache capacity is sized once for the run (`StepEngine.size_for`), so no timed step ever includes a
compilation, and the whole step is one graph (fullgraph: no break). Counted with a backend that wraps aot_eager
(the same graph as inductor, traced in seconds on CPU). A recompilation inside a step is an error; the step does
no host work (no scalar read, no op outside it between two packed reads)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workbench import WorkbenchError
from workbench.decode import loop
from workbench.decode.loop import Acceptance

from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import root_setup, tree_setup
from support.tiny import random_heads, tiny_model

LENGTHS = (20, 140, 270, 420, 460)  # across any power-of-two or 256-multiple bucket of prompt + new tokens + tree
NEW = 12
TREES = ([[0], [0, 0]], "mc_sim_7b_63")  # 3 and 64 tokens per sequence (+ vanilla's 1)


class CountingBackend:
    """A torch.compile backend that counts the graphs it is handed, then compiles them with aot_eager."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def _setup():
    torch._dynamo.reset()  # graphs other tests compiled for the same step function do not count here
    model = tiny_model("llama", seed=5, max_positions=1024)
    heads = random_heads(64, 128, 5, tied=True, seed=2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in LENGTHS]
    return model, heads, prompts


def _decode_all(model, heads, prompts, engine, bufs, batches):
    """Shortest prompts first (the longest comes last, as in a real run); vanilla then each tree, per chunk."""
    pairs = set()
    for b in batches:
        for i in range(0, len(prompts) - b + 1, b):
            chunk = prompts[i:i + b]
            van = vanilla_generate(model, None, chunk, NEW, eos_token_id=[], engine=engine)
            pairs.add((b, 1))
            for buf in bufs:
                med = medusa_generate(model, heads, None, chunk, buf, NEW, eos_token_id=[], engine=engine)
                assert [m.token_ids for m in med] == [v.token_ids for v in van]  # still plain greedy
                pairs.add((b, buf.size))
    return pairs


def test_one_compiled_graph_per_batch_and_tree_size_whatever_the_prompt_lengths():
    model, heads, prompts = _setup()
    counter = CountingBackend()
    engine = StepEngine(model, compile=True, backend=counter)
    bufs = [tree_setup(t, model) for t in TREES]
    engine.size_for(prompts, NEW, [root_setup(model), *bufs])
    pairs = _decode_all(model, heads, prompts, engine, bufs, (1, 3))
    assert engine.compile and len(pairs) == 6
    assert counter.graphs == len(pairs), f"{counter.graphs} graphs compiled for {len(pairs)} (batch, tree size) pairs"
    assert engine.resized == 0 and engine.compile_s > 0 and len(engine.graphs) == len(pairs)


def test_a_longer_prompt_than_reserved_recompiles_untimed_and_says_so(capsys):
    model, heads, prompts = _setup()
    counter = CountingBackend()
    engine = StepEngine(model, compile=True, backend=counter)
    buf = tree_setup(TREES[0], model)
    engine.size_for(prompts[:1], NEW, [buf])  # sized for the shortest prompt only
    from workbench.cli.shared import cli_warnings

    with cli_warnings():  # the library's warning, shown as the CLI shows it
        short = medusa_generate(model, heads, None, prompts[0], buf, NEW, eos_token_id=[], engine=engine)
        long = medusa_generate(model, heads, None, prompts[-1], buf, NEW, eos_token_id=[], engine=engine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: a generation needs") and "compiles again" in err[0]
    assert engine.resized == 1 and counter.graphs == 2 and len(engine.graphs) == 2
    assert short.compile_s > 0 and long.compile_s > 0  # each compilation ran in the untimed warm-up ...
    again = medusa_generate(model, heads, None, prompts[-2], buf, NEW, eos_token_id=[], engine=engine)
    assert again.compile_s == 0 and counter.graphs == 2  # ... and the grown size is compiled once


def test_a_recompilation_inside_a_step_is_an_error():
    """torch.compiler.set_stance("fail_on_recompile") around every step: a step shape that was not warmed up (here
    a rule whose warm-up is marked done without running) fails in one line instead of timing a compilation."""
    model, heads, prompts = _setup()
    engine = StepEngine(model, compile=True, backend=CountingBackend())
    buf = tree_setup(TREES[0], model)
    engine.size_for(prompts[:1], NEW, [buf])
    medusa_generate(model, heads, None, prompts[0], buf, NEW, eos_token_id=[], engine=engine)
    typical = Acceptance("typical", 0.7)
    plan = loop.Plan(typical, buf.depth, buf.topk)
    engine._warm.add((1, buf.size) + plan.key)  # as if warmed: the step itself would compile
    with pytest.raises(WorkbenchError, match="recompilation inside a timed step at batch 1, tree size 3") as e:
        medusa_generate(model, heads, None, prompts[0], buf, NEW, eos_token_id=[], engine=engine, acceptance=typical)
    assert "\n" not in str(e.value)


class OpsBackend(CountingBackend):
    """CountingBackend that also keeps the torch functions each graph calls."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __call__(self, gm, example_inputs):
        self.calls.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return super().__call__(gm, example_inputs)


def test_the_compiled_step_runs_the_few_row_kernels_chosen_eagerly(monkeypatch):
    """On CPU the engine runs a step shape once eagerly before compiling it, so that gemv.py chooses the few-row
    linears' kernels outside any trace; the compiled graph then calls them (here `split`, forced: one batched
    product per linear) instead of inductor's own few-row products. Greedy stays plain greedy."""
    from workbench.runtime import gemv

    monkeypatch.setenv("WORKBENCH_CPU_LINEAR", "split")
    model, heads, prompts = _setup()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.model.modules())  # the decoder's (no lm_head)
    backend = OpsBackend()
    engine = StepEngine(model, compile=True, backend=backend)
    buf = tree_setup(TREES[0], model)
    engine.size_for(prompts[:2], NEW, [buf])
    van = vanilla_generate(model, None, prompts[:2], NEW, eos_token_id=[], engine=engine)
    med = medusa_generate(model, heads, None, prompts[:2], buf, NEW, eos_token_id=[], engine=engine)
    assert [m.token_ids for m in med] == [v.token_ids for v in van]
    assert backend.graphs == 2 and {2, 2 * buf.size} <= {r for r, _, _ in gemv.chosen(model)}
    plain, tree = backend.calls  # every decoder linear and the lm_head as a batched product (the heads' own
    assert plain.count(torch.bmm) == linears + 1 and torch._C._nn.linear not in plain, plain  # linears stay linears)
    assert tree.count(torch.bmm) >= linears + 1, tree


READ = {"aten._local_scalar_dense", "aten.item", "aten.resolve_conj", "aten.resolve_neg"}  # what item() / tolist() dispatch


class OpLog(TorchDispatchMode):
    """Every aten op dispatched, tagged with whether it ran inside the decoding step."""

    def __init__(self):
        super().__init__()
        self.inside, self.ops = False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((self.inside, str(func.overloadpacket)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rule", [Acceptance(), Acceptance("typical", 0.7), Acceptance("nucleus", 0.9, seed=1)],
                         ids=["greedy", "typical", "nucleus"])
def test_the_step_does_no_host_work(monkeypatch, rule):
    """Between two packed reads nothing runs on the device but the step and the read itself (the host keeps its
    bookkeeping in Python), and the step reads no scalar back (`item`, `tolist`, `_local_scalar_dense`: a host sync on CUDA, and no CUDA
    graph could hold it). Eager, so that every op of the step is dispatched and seen."""
    model, heads, prompts = _setup()
    log = OpLog()
    real = loop.decode_step

    def step(*a, **k):
        log.inside = True
        try:
            return real(*a, **k)
        finally:
            log.inside = False
    monkeypatch.setattr(loop, "decode_step", step)
    seen = []
    engine = StepEngine(model, compile=False)
    real_finish = engine.finish

    def finish(*a):  # a sequence that stops: two small writes, host-driven, once per sequence (not per step)
        log.inside = "finish"
        real_finish(*a)
        log.inside = False
    engine.finish = finish
    for chunk, buf in ((prompts[:3], tree_setup(TREES[1], model)), (prompts[:1], tree_setup(TREES[0], model)),
                       (prompts[1:3], root_setup(model))):
        marks = []
        on_step = lambda s: marks.append(len(log.ops))  # noqa: E731 - after each step's read
        with log:
            out = loop._generate(model, None, loop.Request("medusa", chunk, buf, NEW, rule, eos_token_id=[],
                                                           on_step=on_step), engine, heads if buf.depth else None)
        inside = [op for i, op in log.ops if i is True]
        assert inside and not READ & set(inside), (buf.size, READ & set(inside))
        # between two steps' reads: nothing outside the step but the read and a stopping sequence's writes
        steps = max(len(r.steps) for r in (out if isinstance(out, list) else [out]))
        between = [[op for i, op in log.ops[a:b] if not i and op not in READ] for a, b in zip(marks, marks[1:])]
        assert len(between) == steps - 1 > 3 and all(b == [] for b in between), (buf.size, [b for b in between if b])
        seen.append(buf.size)
        log.ops = []
    assert seen == [64, 3, 1]


def test_cpu_compile_bench_runs(tmp_path):
    """bench/compile_cpu.py, the one command behind the CPU default of --compile, at its smallest: a row per
    (batch, tree, backend) with eager and compiled steps measured side by side, the compile time beside, identical
    fp32 outputs, the setting recorded."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_compile_cpu", Path(__file__).parent.parent / "bench" /
                                                  "compile_cpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "compile-cpu.json"
    assert bench.main(["--tiny", "--batches", "1,2", "--max-new-tokens", "4", "--rounds", "1", "--backend",
                       "aot_eager,eager,layers", "--tree", "[[0], [0, 0], [1]]", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    kinds = ("aot_eager", "eager", "layers")  # layers: the CPU default (the decoder layers compiled), here forced
    assert [(r["batch"], r["tree_size"], r["backend"]) for r in report["rows"]] == \
        [(b, n, k) for b in (1, 2) for n in (1, 4) for k in kinds]
    assert all(r["identical"] and r["compile_s"] > 0 and r["eager_ms"] > 0 and r["compiled_ms"] > 0
               for r in report["rows"])
    for a, b, c in zip(*(report["rows"][i::3] for i in range(3))):  # one eager median beside every backend
        assert a["eager_ms"] == b["eager_ms"] == c["eager_ms"]
        assert len({a["eager_ms"], a["compiled_ms"], b["compiled_ms"], c["compiled_ms"]}) == 4
    assert report["setting"]["device"] == "cpu" and report["setting"]["compiled"] is True
    assert report["backend"] == "aot_eager,eager,layers" and set(report["compiled_pays"]) == set(kinds)
    assert report["default_layers"] is False  # a tiny model decodes eagerly by default
