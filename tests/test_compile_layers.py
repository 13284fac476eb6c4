"""The CPU default compiles the decoder layers (runtime/compiled.py): one graph for every layer of a step shape
(the layer index stays symbolic), compiled in the untimed warm-up, never for the prefill; tokens equal the eager
engine's, greedy and typical; a layer that does not compile leaves the engine eager with one warning; the setting
says "layers". Counted with a backend that wraps aot_eager (dynamo's graphs are the same as inductor's)."""
import pytest
import torch

from workbench import WorkbenchError
from workbench.decode import loop
from workbench.decode.loop import Acceptance, medusa_generate, vanilla_generate
from workbench.measure.latency import measured_setting
from workbench.core.provenance import describe
from workbench.runtime import compiled
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import root_setup, tree_setup
from support.tiny import CountingBackend, random_heads, tiny_model

LAYERS = 4
NEW = 10


def _setup(monkeypatch, layers: str = "1"):
    torch._dynamo.reset()
    monkeypatch.setenv("WORKBENCH_CPU_LAYERS", layers)
    model = tiny_model("llama", seed=7, layers=LAYERS, max_positions=1024)
    heads = random_heads(64, 128, 5, tied=True, seed=3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (17, 90, 41, 160, 64, 23)]
    return model, heads, prompts


def _decode(model, heads, prompts, engine, bufs, rule=Acceptance()):
    out = {}
    for b in (1, 3):
        for i in range(0, len(prompts) - b + 1, b):
            chunk = prompts[i:i + b]
            van = vanilla_generate(model, None, chunk, NEW, eos_token_id=[], engine=engine)
            out[b, i, 1] = [v.token_ids for v in van]
            for buf in bufs:
                med = medusa_generate(model, heads, None, chunk, buf, NEW, eos_token_id=[], engine=engine,
                                      acceptance=rule)
                out[b, i, buf.size] = [m.token_ids for m in med]
    return out


@pytest.mark.parametrize("rule", [Acceptance(), Acceptance("typical", 0.7, seed=3)], ids=["greedy", "typical"])
def test_the_default_compiles_each_step_shape_once_for_all_layers_and_decodes_as_eager(monkeypatch, rule):
    model, heads, prompts = _setup(monkeypatch)
    counter = CountingBackend()
    engine = StepEngine(model, backend=counter)  # the default: compile=None
    bufs = [tree_setup(t, model) for t in ([[0], [0, 0]], "mc_sim_7b_63")]
    engine.size_for(prompts, NEW, [root_setup(model), *bufs])
    assert engine.compiled_as == "layers" and not engine.compile
    got = _decode(model, heads, prompts, engine, bufs, rule)
    shapes = {(b, n) for b, _, n in got}
    # layer 0's index is specialised (0 and 1 always are): at most two graphs per shape, not one per layer
    assert 0 < counter.graphs <= 2 * len(shapes) < LAYERS * len(shapes), counter.graphs
    assert engine.compile_s > 0
    first = counter.graphs
    assert _decode(model, heads, prompts, engine, bufs, rule) == got and counter.graphs == first  # nothing new
    eager = StepEngine(model, compile=False)
    assert eager.compiled_as is False and eager.layers is None
    assert _decode(model, heads, prompts, eager, bufs, rule) == got  # token for token (fp32)
    if rule.kind == "greedy":
        assert all(got[b, i, n] == got[b, i, 1] for b, i, n in got)  # Medusa greedy = plain greedy
    assert counter.graphs == first  # the eager engine on the same model compiled nothing


def test_the_prefill_stays_eager(monkeypatch):
    """Prompts of six lengths, one plain step shape: the graphs are those of the step alone."""
    model, heads, prompts = _setup(monkeypatch)
    counter = CountingBackend()
    engine = StepEngine(model, backend=counter)
    engine.size_for(prompts, NEW, [root_setup(model)])
    for p in prompts:
        vanilla_generate(model, None, [p], NEW, eos_token_id=[], engine=engine)
    assert counter.graphs == 2  # layer 0, then the other layers: one shape, whatever the prompt lengths


def test_a_recompilation_inside_a_step_is_an_error(monkeypatch):
    """A step shape whose warm-up is marked done without running compiles inside the timed step: one error line."""
    model, heads, prompts = _setup(monkeypatch)
    engine = StepEngine(model, backend=CountingBackend())
    small, big = tree_setup([[0], [0, 0]], model), tree_setup("mc_sim_7b_63", model)
    engine.size_for(prompts, NEW, [small, big])
    medusa_generate(model, heads, None, prompts[0], small, NEW, eos_token_id=[], engine=engine)
    engine._warm.add((1, big.size) + loop.Plan(Acceptance(), big.depth, big.topk).key)  # as if warmed
    with pytest.raises(WorkbenchError, match=f"recompilation inside a timed step at batch 1, tree size {big.size}") as e:
        medusa_generate(model, heads, None, prompts[0], big, NEW, eos_token_id=[], engine=engine)
    assert "\n" not in str(e.value)


def test_layers_that_do_not_compile_leave_the_engine_eager_with_one_warning(monkeypatch, capsys):
    model, heads, prompts = _setup(monkeypatch)
    from workbench.cli.shared import cli_warnings

    engine = StepEngine(model, backend=CountingBackend(fail=True))
    with cli_warnings():  # the library's warning, shown as the CLI shows it
        out = vanilla_generate(model, None, prompts[:2], NEW, eos_token_id=[], engine=engine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: cannot compile the decoder layers") and "eagerly" in err[0]
    assert engine.compiled_as is False
    again = vanilla_generate(model, None, prompts[:2], NEW, eos_token_id=[], engine=StepEngine(model, compile=False))
    assert [o.token_ids for o in out] == [o.token_ids for o in again]


def test_the_default_rule_and_the_setting(monkeypatch):
    model, _, _ = _setup(monkeypatch, layers="")
    assert not compiled.default_on(model)  # a tiny model: compiling would cost more than it saves
    monkeypatch.setattr(compiled, "MIN_BYTES", 0)
    assert compiled.default_on(model) and compiled.default_on(model, steps=compiled.PAYBACK_STEPS)
    # a run that ends before its compiling pays back (decode --compare of one prompt, a small sweep) stays eager
    assert not compiled.default_on(model, steps=compiled.PAYBACK_STEPS - 1)
    assert StepEngine(model, steps=64).compiled_as is False and StepEngine(model, steps=10 ** 6).layers is not None
    monkeypatch.setenv("WORKBENCH_CPU_LAYERS", "1")
    assert StepEngine(model, steps=64).layers is not None  # forced on: whatever the run's length
    monkeypatch.setenv("WORKBENCH_CPU_LAYERS", "0")
    assert not compiled.default_on(model) and StepEngine(model).compiled_as is False
    monkeypatch.setenv("WORKBENCH_CPU_LAYERS", "yes")
    with pytest.raises(WorkbenchError, match="WORKBENCH_CPU_LAYERS=yes: use 1"):
        compiled.default_on(model)
    monkeypatch.setenv("WORKBENCH_CPU_LAYERS", "1")
    assert StepEngine(model, compile=False).layers is None  # --no-compile: eager
    assert StepEngine(model, compile=True, backend="aot_eager").layers is None  # --compile: the whole step
    engine = StepEngine(model)
    s = measured_setting(model, engine, "decoder-step")
    assert s["compiled"] == "layers" and "layers compiled" in describe(s)
    assert measured_setting(model, StepEngine(model, compile=False), "decoder-step")["compiled"] is False


def test_latency_times_the_engine_of_the_run_it_prices(monkeypatch, tmp_path, capsys):
    """`latency` prices a short run's engine by default (eager, the plain few-row call: no cold compiling a short
    decode or sweep would not do either); --run-steps N of a long run times the engine such a run uses (the layers
    compiled, the kernels chosen by this machine's rule); every row says which (issue 72)."""
    import json

    from workbench.cli import main
    from workbench.measure.latency_file import read_latency
    from workbench.runtime import engine as engine_module

    monkeypatch.delenv("WORKBENCH_CPU_LAYERS", raising=False)
    monkeypatch.delenv("WORKBENCH_CPU_LINEAR", raising=False)
    monkeypatch.setattr(compiled, "MIN_BYTES", 0)  # the tiny model as if large enough to compile
    real = engine_module.StepEngine
    monkeypatch.setattr(engine_module, "StepEngine", lambda model, **kw: real(model, backend="aot_eager", **kw))
    argv = ["latency", "--random-config", "tiny", "--sizes", "2", "--context", "8", "--repeats", "1", "--warmup", "0",
            "--device", "cpu"]
    torch._dynamo.reset()
    for extra, want in (([], (False, "linear")), (["--run-steps", str(compiled.PAYBACK_STEPS - 1)], (False, "linear")),
                        (["--run-steps", str(compiled.PAYBACK_STEPS)], ("layers", "measured")),
                        (["--run-steps", str(compiled.PAYBACK_STEPS), "--no-compile"], (False, "measured"))):
        out = tmp_path / f"{len(extra)}-{extra[-1] if extra else ''}.csv"
        assert main(argv + extra + ["--out", str(out)]) == 0
        s = json.loads(read_latency(out)["setting"].iloc[0])
        assert (s["compiled"], s["cpu_linear"]) == want, extra
    assert main(argv + ["--run-steps", "0", "--out", str(tmp_path / "x.csv")]) == 2
    with pytest.raises(SystemExit):
        main(["latency", "--help"])
    assert f"from {compiled.PAYBACK_STEPS}:" in " ".join(capsys.readouterr().out.split())  # the help's threshold
