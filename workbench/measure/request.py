"""The long measuring commands asked for (`latency`, `sweep`): their fields, checked and with their defaults applied
here, once, before any model loads; errors name a field (core.notes.FieldError) that each front end words as its
flag or control. `resolved()` returns the request with every default filled in (a fact the front end reports)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workbench.core.notes import FieldError
from workbench.measure.latency_file import DEFAULT_BATCHES, DEFAULT_CONTEXTS, DEFAULT_SIZES

# decoder-step's defaults (measure.latency times them; named here, where the request's defaults live)
DECODER_SIZES = (1, 2, 3, 4, 5, 8, 16, 32, 64)
DECODER_BATCHES = (1, 2, 4, 8)
DEFAULT_BUDGETS = (4, 8, 16, 32, 64, 128, 256)  # sweep's optimal trees


def _needs_calibration(req) -> None:
    if req.prompts == "holdout" and not req.calibration:
        raise FieldError("prompts", "holdout_without_calibration", "{field} holdout needs {also} DIR (its held-out "
                         "prompts)", also="calibration")


@dataclass(frozen=True)
class LatencyRequest:
    """`latency` on our decoder. mode None: decoder-step, or verify with random_config or context."""
    mode: str | None = None
    random_config: str | None = None
    sizes: tuple[int, ...] | None = None
    context: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    repeats: int | None = None
    warmup: int | None = None
    envelope: str | None = None
    prompts: str = "alpaca-eval"
    calibration: str | None = None
    own_model: bool = False  # --model, --heads or --device-map given (random_config builds its own)

    @property
    def step(self) -> bool:
        return (self.mode or self.resolved().mode) == "decoder-step"

    def resolved(self) -> LatencyRequest:
        mode = self.mode or ("verify" if self.random_config or self.context else "decoder-step")
        if mode not in ("decoder-step", "verify"):
            raise FieldError("mode", "unknown", f"{{field}} {mode}: use decoder-step or verify")
        step = mode == "decoder-step"
        if step and (self.random_config or self.context):
            raise FieldError("mode", "step_on_fixed_context", "{field} decoder-step decodes real prompts (their "
                             "contexts grow as in decoding): drop {also}/{also2}, or use {field} verify",
                             also=("random_config", "context"))
        if self.envelope and not step:
            raise FieldError("envelope", "not_step", "{field} times per-step trees inside the decoder's step: use "
                             "{also} decoder-step", also="mode")
        if step:
            _needs_calibration(self)
        if self.random_config and self.own_model:
            raise FieldError("random_config", "own_model", "{field} builds its own model on {also}: drop "
                             "{also2}/{also3}/{also4}", also=("device", "model", "heads", "device_map"))
        return replace(self, mode=mode,
                       sizes=tuple(self.sizes or (DECODER_SIZES if step else DEFAULT_SIZES)),
                       context=None if step else tuple(self.context or DEFAULT_CONTEXTS),  # step: grows
                       batch_sizes=tuple(self.batch_sizes or (DECODER_BATCHES if step else DEFAULT_BATCHES)),
                       repeats=self.repeats if self.repeats is not None else (4 if step else 10),
                       warmup=self.warmup if self.warmup is not None else (1 if step else 3))


def _check_fits(need: int, what: str, device) -> None:
    # torch: only once a model or device is at hand
    from workbench.runtime.kvcache import free_bytes

    free = free_bytes(device)
    if free is not None and need > free:
        raise FieldError(what[0], "too_big", f"{what[1]} needs about {need / 2 ** 30:.1f} GiB but "
                         f"{free / 2 ** 30:.1f} GiB are free: ask for less", also=what[2] if len(what) > 2 else None)


def random_config_fits(spec: str, device) -> None:
    """A random model's shape: each number in range, its fp32 weights in the device's free memory."""
    # torch: only once a model or device is at hand
    from workbench.runtime.models import parse_random_config

    _, kw = parse_random_config(spec)
    numbers = {k: v for k, v in kw.items() if isinstance(v, int) and k != "max_position_embeddings"}
    bad = {k: v for k, v in numbers.items() if not 1 <= v <= 1 << 20}
    if bad:
        k, v = next(iter(bad.items()))
        raise FieldError("random_config", "out_of_range", f"{{field}} {spec!r}: {k}={v} is outside 1..{1 << 20}")
    h, n = kw["hidden_size"], kw["num_hidden_layers"]
    params = 2 * kw["vocab_size"] * h + n * (4 * h * h + 3 * h * kw["intermediate_size"])
    _check_fits(params * 4, ("random_config", f"{{field}} {spec!r} ({params / 1e9:.1f} B parameters)"), device)


def latency_fits(model, req: LatencyRequest) -> None:
    """The largest point's cache and logits in the model's device's free memory (a model the cache can hold)."""
    # torch: only once a model or device is at hand
    from workbench.runtime.engine import check_cacheable
    from workbench.runtime.kvcache import cache_bytes

    check_cacheable(model)
    b, c, n = req.batch_sizes[-1], (req.context or DEFAULT_CONTEXTS)[-1], req.sizes[-1]  # step: its longest
    vocab = model.get_output_embeddings().weight.shape[0]
    _check_fits(cache_bytes(model, b, c + n) + 4 * b * n * vocab,
                ("batch_sizes", f"the cache and logits of {{field}} {b} x {{also}} {c} + {n} tokens", "context"),
                model.device)


@dataclass(frozen=True)
class SweepRequest:
    """`sweep`: trees (given, or optimal at budgets from a calibration, or a plan's) x temperatures x epsilons."""
    temperature: tuple[float, ...] = (0.0,)
    epsilon: tuple[float, ...] = (0.09,)
    batch_sizes: tuple[int, ...] = (1,)
    budgets: tuple[int, ...] | None = None
    trees: tuple[str, ...] = ()
    plan: str | None = None
    joint: bool = False
    replay: bool = False
    envelope: str | None = None
    prompts: str = "alpaca-eval"
    calibration: str | None = None
    limit: int | None = None
    max_new_tokens: int = 128

    def resolved(self, plan_rows: list[dict] | None = None) -> SweepRequest:
        """Checked, defaults filled; `plan_rows`: the plan's rows when `plan` is given (its batch sizes, greedy)."""
        if not self.epsilon or not all(0 < e <= 1 for e in self.epsilon):
            raise FieldError("epsilon", "out_of_range", f"{{field}} {','.join(f'{e:g}' for e in self.epsilon)}: "
                             "every epsilon must be in (0, 1]")
        if not all(t >= 0 and math.isfinite(t) for t in self.temperature):
            raise FieldError("temperature", "out_of_range", "{field}: every temperature must be a finite number >= 0")
        if self.max_new_tokens < 1:
            raise FieldError("max_new_tokens", "below_one", f"{{field}} {self.max_new_tokens}: must be >= 1")
        given = self.trees or self.plan
        if self.joint and not self.budgets and given:
            raise FieldError("joint", "needs_budgets", "{field} builds the {also} trees from measured joint paths: "
                             "add {also}", also="budgets")
        if self.replay and not self.budgets and given:
            raise FieldError("replay", "needs_budgets", "{field} chooses between the optimum and a dense tree per "
                             "budget: add {also}", also="budgets")
        req = self
        if self.plan:
            if self.trees or self.budgets or tuple(self.batch_sizes) != (1,):
                raise FieldError("plan", "own_choices", "{field} sweeps the plan's own trees at its own batch sizes: "
                                 "drop {also}, {also2} and {also3}", also=("trees", "budgets", "batch_sizes"))
            if self.envelope:
                raise FieldError("plan", "own_envelope", "{field} sweeps the plan's own choices (its per-step trees "
                                 "too): drop {also}", also="envelope")
            req = replace(req, batch_sizes=tuple(r["batch_size"] for r in plan_rows or []), temperature=(0.0,))
        else:
            req = replace(req, budgets=self.budgets or (None if self.trees else DEFAULT_BUDGETS))
        return req

    def check_prompts(self, count: int) -> None:
        if self.batch_sizes[-1] > count:
            raise FieldError("batch_sizes", "above_prompts", f"{{field}} {','.join(map(str, self.batch_sizes))}: "
                             f"batch {self.batch_sizes[-1]} but {count} prompts: lower the batch size or give more "
                             "prompts ({also})", also="limit")


@dataclass(frozen=True)
class VllmLatencyRequest:
    """`latency --engine vllm`: vLLM's served rounds per batch size and K, drafted by our heads (method None or
    medusa) or by another drafter (method, draft_model). `decoder_fields`: the fields of our decoder's latency that
    were given (refused here: vLLM serves real prompts, CPU build, fp32)."""
    method: str | None = None
    draft_model: str | None = None
    heads: str | None = None
    k: tuple[int, ...] | None = None  # besides K = 0 (plain vLLM, always timed)
    batch_sizes: tuple[int, ...] | None = None
    repeats: int | None = None
    warmup: int | None = None
    prompts: str = "alpaca-eval"
    calibration: str | None = None
    decoder_fields: tuple[str, ...] = ()

    @property
    def medusa(self) -> bool:
        return self.method in (None, "medusa")

    def resolved(self, methods: tuple[str, ...] = ()) -> VllmLatencyRequest:
        """Checked (`methods`: the drafters vLLM knows), defaults filled; K's default waits for the heads (ks)."""
        if self.decoder_fields:
            others = self.decoder_fields[1:]
            rest = "".join(f", {{also{i + 2}}}" for i in range(len(others)))
            raise FieldError(self.decoder_fields[0], "decoder_only", "{field}" + rest + ": our decoder's; {also} "
                             "vllm serves real prompts in vLLM (CPU build, fp32): drop them", also=("engine", *others))
        if (self.method or self.draft_model) and self.heads:
            raise FieldError("heads", "two_drafters", "{field} (Medusa heads) or {also}/{also2} (another "
                             "drafter), not both", also=("method", "draft_model"))
        if self.draft_model and self.method is None:
            raise FieldError("draft_model", "needs_method", "{field} names a drafter's weights: give {also} too (its "
                             "drafter: draft_model, eagle3, ...)", also="method")
        if self.method == "medusa" and self.draft_model:
            raise FieldError("draft_model", "medusa_heads", "{also} medusa drafts with our heads: give them as "
                             "{also2} DIR, not {field}", also=("method", "heads"))
        if self.method is not None and methods and self.method not in methods:
            raise FieldError("method", "unknown", f"{{field}} {self.method}: vLLM's drafters are {', '.join(methods)}")
        if self.method in ("eagle", "eagle3", "draft_model") and not self.draft_model:
            raise FieldError("method", "needs_draft_model", f"{{field}} {self.method} needs {{also}} DIR (the "
                             "drafter's weights)", also="draft_model")
        _needs_calibration(self)
        return replace(self, batch_sizes=tuple(self.batch_sizes or (1, 2, 4, 8)),
                       repeats=self.repeats or 4, warmup=1 if self.warmup is None else self.warmup)

    def ks(self, num_heads: int | None, default: tuple[int, ...]) -> list[int]:
        """The K timed besides 0: the request's, or 1 to the heads' count (Medusa), or `default` (another drafter)."""
        ks = list(self.k) if self.k is not None else \
            list(range(1, num_heads + 1) if self.medusa else default)
        if self.medusa and ks and ks[-1] > num_heads:
            raise FieldError("k", "above_heads", f"{{field}} {ks[-1]}: the heads draft at most {num_heads} tokens")
        return ks
