"""Few-row linears on CPU (workbench/runtime/gemv.py): the class swap keeps the model's parameters and products,
each row count's kernel is chosen once, in the engine's untimed warm-up and never inside a timed step, and
greedy decoding is HF generate's token for token whichever kernel runs."""
import inspect

import pytest
import torch
from torch import nn

from workbench import WorkbenchError
from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.runtime import gemv
from workbench.runtime.engine import StepEngine
from support.tiny import random_heads, tiny_model


@pytest.mark.unit
@pytest.mark.parametrize("kernel", list(gemv.KERNELS))
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16])
def test_every_kernel_is_the_same_product(rows, kernel):
    torch.manual_seed(rows)
    w, x = torch.randn(96, 40), torch.randn(rows, 40)
    assert gemv.usable(kernel, w) == (kernel != "onednn" or torch.backends.mkldnn.is_available())
    if gemv.usable(kernel, w):
        assert gemv.KERNELS[kernel](x, w).shape == (rows, 96)
        torch.testing.assert_close(gemv.KERNELS[kernel](x, w), x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", list(gemv.KERNELS))
def test_every_kernel_compiles_with_inductor(kernel):
    """The compiled step calls the kernel chosen eagerly (RowLinear): inductor must lower each one (oneDNN's linear
    it lowers only on weights its own freezing packed, so ours is an opaque op there)."""
    torch._dynamo.reset()
    w, x = torch.randn(96, 40), torch.randn(5, 40)
    if gemv.usable(kernel, w):
        step = torch.compile(lambda x, w: gemv.KERNELS[kernel](x, w).relu(), fullgraph=True)
        torch.testing.assert_close(step(x, w), (x @ w.T).relu(), rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_adopt_swaps_plain_cpu_linears_only_and_shares_one_table(monkeypatch):
    monkeypatch.setenv("WORKBENCH_CPU_LINEAR", "transposed")

    class Sub(nn.Linear):
        pass
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Sub(16, 16), nn.Linear(16, 4, bias=False))
    other = nn.Sequential(nn.Linear(4, 4))
    keys = list(model.state_dict())
    x = torch.randn(3, 2, 8)
    want = model(x)
    table = gemv.adopt(model)
    assert [type(m).__name__ for m in model] == ["RowLinear", "ReLU", "Sub", "RowLinear"]  # a subclass is its own
    assert gemv.adopt(model, other) is table and len(table.linears) == 3  # idempotent; `other` joins the table
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)  # 6 rows through the transposed kernel
    assert gemv.chosen(model) == {(6, 16, 8): "transposed", (6, 4, 16): "transposed", (6, 4, 4): "transposed"}
    assert gemv.chosen(nn.ReLU()) == {}
    assert model(torch.randn(gemv.MAX_ROWS + 1, 8)).shape == (gemv.MAX_ROWS + 1, 4)
    assert len(table.rows) == 3  # over MAX_ROWS a GEMM proper: the plain call, nothing chosen
    assert gemv.adopt(nn.Sequential(nn.Linear(2, 2, device="meta"))) is None  # off the CPU: left alone


@pytest.mark.unit
def test_a_kernel_is_measured_once_per_machine_and_kept(monkeypatch, tmp_path):
    """Measured the first time a row count is seen, then kept on disk: a model loaded later (a resumed run in
    another process) takes the kept kernel, even one another process measured differently, without timing."""
    monkeypatch.delenv("WORKBENCH_CPU_LINEAR", raising=False)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(gemv, "MIN_BYTES", 0)
    timed = []
    real = gemv.transposed
    monkeypatch.setitem(gemv.KERNELS, "transposed", lambda x, w: timed.append(x.shape[0]) or real(x, w))
    lin = nn.Linear(32, 32)
    table = gemv.adopt(lin)
    for _ in range(3):
        lin(torch.randn(2, 32))
    kind = table.rows[2, 32, 32]
    assert kind in gemv.KERNELS
    assert timed == [2] * (gemv.REPEATS + 1 + (3 if kind == "transposed" else 0))  # timed passes, then the calls
    (kept,) = (tmp_path / "cpu-linear").iterdir()
    other = next(k for k in gemv.KERNELS if k != kind)
    kept.write_text(f'{{"kernel": "{other}"}}')  # as if another process had kept another choice first
    timed.clear()
    later = nn.Linear(32, 32)
    gemv.adopt(later)
    x = torch.randn(2, 32)
    torch.testing.assert_close(later(x), x @ later.weight.T + later.bias, rtol=1e-5, atol=1e-5)
    assert gemv.chosen(later) == {(2, 32, 32): other} and len(timed) == (other == "transposed")  # no timing


@pytest.mark.unit
def test_weights_that_fit_in_a_cache_keep_the_plain_call(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKBENCH_CPU_LINEAR", raising=False)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(gemv, "timings", lambda *a: pytest.fail("timed weights that fit in a cache"))
    lin = nn.Linear(64, 64)
    gemv.adopt(lin)
    lin(torch.randn(3, 64))
    assert gemv.chosen(lin) == {(3, 64, 64): "linear"} and not (tmp_path / "cpu-linear").exists()


@pytest.mark.unit
def test_an_unknown_kernel_is_one_error(monkeypatch):
    monkeypatch.setenv("WORKBENCH_CPU_LINEAR", "fast")
    with pytest.raises(WorkbenchError, match="WORKBENCH_CPU_LINEAR=fast: unknown kernel"):
        gemv.forced()


def test_a_short_run_takes_the_plain_call_and_keeps_nothing(monkeypatch, tmp_path):
    """A run that says it ends before compiled.PAYBACK_STEPS steps per shape never times a row count (a second each
    on a 2-core CPU) and reads no kept choice (a resumed run must compute what the unbroken one did, whatever a long
    run kept in between); a long run on the same model then chooses as before, and a fixed kernel runs in both."""
    from workbench.measure.latency import measured_setting
    from workbench.runtime import compiled

    monkeypatch.delenv("WORKBENCH_CPU_LINEAR", raising=False)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(gemv, "MIN_BYTES", 0)  # the tiny model's linears would keep the plain call anyway
    model, heads = tiny_model("llama", seed=3), random_heads(64, 128, 4, seed=3)
    prompts, tree = [[5, 6, 7], [8, 9, 10, 11, 12]], [[0], [1], [0, 0]]

    def run(steps):
        engine = StepEngine(model, compile=False, steps=steps)
        out = medusa_generate(model, heads, None, prompts, tree, 12, eos_token_id=[], engine=engine)
        return [r.token_ids for r in out], measured_setting(model, engine, "decoder-step")["cpu_linear"]
    real_timings, real_kept = gemv.timings, gemv._kept
    monkeypatch.setattr(gemv, "timings", lambda *a: pytest.fail("a short run timed the kernels"))
    monkeypatch.setattr(gemv, "_kept", lambda path: pytest.fail("a short run read a kept choice"))
    short, how = run(compiled.PAYBACK_STEPS - 1)
    assert how == "linear" and gemv.chosen(model) == {} and not (tmp_path / "cpu-linear").exists()
    monkeypatch.setattr(gemv, "timings", real_timings)
    monkeypatch.setattr(gemv, "_kept", real_kept)
    long, how = run(compiled.PAYBACK_STEPS)
    assert how == "measured" and {2, 2 * 4} <= {r for r, _, _ in gemv.chosen(model)}
    assert (tmp_path / "cpu-linear").is_dir() and long == short  # no near-ties in the tiny model: the same tokens
    monkeypatch.setenv("WORKBENCH_CPU_LINEAR", "transposed")
    model = tiny_model("llama", seed=3)
    fixed, how = run(1)
    assert how == "transposed" and set(gemv.chosen(model).values()) == {"transposed"} and fixed == short


def test_kernels_are_chosen_in_the_untimed_warm_up_only(monkeypatch):
    """Every row count a step runs is chosen while the engine warms that step shape up (or before: the prefill and
    the first token), never during a step the decoder times."""
    monkeypatch.delenv("WORKBENCH_CPU_LINEAR", raising=False)
    model = tiny_model("llama", seed=3)
    heads = random_heads(64, 128, 4, seed=3)
    calls = []
    real = gemv._choose

    def choose(table, rows):  # where each choice is made
        names = {f.function for f in inspect.stack()}
        calls.append((rows, "step" in names and "warm" not in names))
        return real(table, rows)
    monkeypatch.setattr(gemv, "_choose", choose)
    engine = StepEngine(model, compile=False)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    medusa_generate(model, heads, None, prompts, [[0], [1], [0, 0]], 12, eos_token_id=[], engine=engine)
    vanilla_generate(model, None, prompts, 12, eos_token_id=[], engine=engine)
    # the first tokens' logits and plain steps, the 4-node tree, the prefill: each once, none in a timed step
    assert sorted(calls) == [(2, False), (2 * 4, False), (2 * 5, False)], calls


@pytest.mark.parametrize("kernel", list(gemv.KERNELS))
@pytest.mark.parametrize("arch", ["llama", "gemma"])
def test_greedy_equals_generate_with_either_kernel(monkeypatch, kernel, arch):
    monkeypatch.setenv("WORKBENCH_CPU_LINEAR", kernel)
    model = tiny_model(arch, seed=0 if arch == "gemma" else 10, tied=arch == "gemma")
    heads = random_heads(64, 128, 4, seed=7)
    ids = [5, 17, 30, 42]
    truth = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=64, eos_token_id=None)[0, 4:].tolist()
    assert gemv.chosen(model) == {}  # HF ran its own linears
    van = vanilla_generate(model, None, ids, 64, eos_token_id=[])
    med = medusa_generate(model, heads, None, ids, "mc_sim_7b_63", 64, eos_token_id=[])
    assert van.token_ids == med.token_ids == truth
    assert set(gemv.chosen(model).values()) == {kernel} and {1, 64} <= {r for r, _, _ in gemv.chosen(model)}
