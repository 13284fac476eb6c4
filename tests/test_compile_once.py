"""The compiled step compiles once per (batch size, tree size) for the life of an engine, whatever the prompt
lengths: the cache capacity is sized once for the run (`StepEngine.size_for`), so no timed step ever includes a
compilation. Counted with a backend that wraps aot_eager (the same graph as inductor, traced in seconds on CPU)."""
import torch

from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.runtime.engine import StepEngine, root_setup, tree_setup
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
    assert engine.resized == 0 and engine.unplanned == 0 and engine.compile_s > 0 and len(engine.graphs) == len(pairs)


def test_a_longer_prompt_than_reserved_recompiles_untimed_and_says_so(capsys):
    model, heads, prompts = _setup()
    counter = CountingBackend()
    engine = StepEngine(model, compile=True, backend=counter)
    buf = tree_setup(TREES[0], model)
    engine.size_for(prompts[:1], NEW, [buf])  # sized for the shortest prompt only
    short = medusa_generate(model, heads, None, prompts[0], buf, NEW, eos_token_id=[], engine=engine)
    long = medusa_generate(model, heads, None, prompts[-1], buf, NEW, eos_token_id=[], engine=engine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: a generation needs") and "compiles again" in err[0]
    assert engine.resized == 1 and counter.graphs == 2 and len(engine.graphs) == 2
    assert short.compile_s > 0 and long.compile_s > 0  # each compilation ran in the untimed warm-up ...
    again = medusa_generate(model, heads, None, prompts[-2], buf, NEW, eos_token_id=[], engine=engine)
    assert again.compile_s == 0 and counter.graphs == 2  # ... and the grown size is compiled once
