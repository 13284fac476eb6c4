"""A live decode asked for (the CLI's `decode`, the app's Live page): its fields, checked and with their defaults
applied here, once; errors name a field (core.notes.FieldError) that each front end words as its flag or control."""
from __future__ import annotations

import math
from dataclasses import dataclass

from workbench import ACCEPTANCE_KINDS
from workbench.core.notes import FieldError

DEFAULT_EPSILON, DEFAULT_TOP_P, SAMPLED_TEMPERATURE = 0.09, 0.8, 0.7


def check_positions(model, longest_prompt: int, max_new_tokens: int, tree_nodes: int) -> None:
    """Refuse a run whose longest sequence (prompt + max_new_tokens + one step's tree) passes the model's
    positions, before the cache for it is allocated or the generation starts."""
    # transformers' config reader: only once a model is loaded
    from workbench.runtime.generation import context_length

    total, limit = longest_prompt + max_new_tokens + tree_nodes + 1, context_length(model)
    if limit is not None and total > limit:
        raise FieldError("max_new_tokens", "past_context",
                         f"prompt + {{field}} + the tree = {total} positions, more than the model's {limit}: "
                         "lower {field}")


@dataclass
class DecodeRequest:
    """What to decode and how to accept: None is "the default" (acceptance "auto": greedy at temperature 0,
    nucleus when top_p is given, else typical at temperature 0.7)."""
    max_new_tokens: int = 256
    batch_sizes: int = 1
    acceptance: str = "auto"
    temperature: float | None = None
    epsilon: float | None = None
    delta: float | str | None = None
    top_p: float | None = None
    seed: int | None = None
    medusa_entropy: bool = False
    limit: int | None = None
    prompt_set: bool = False  # several prompts (a file or set name), which `limit` cuts

    def kind(self) -> str:
        if self.acceptance not in ("auto", *ACCEPTANCE_KINDS):
            raise FieldError("acceptance", "unknown", f"{{field}} {self.acceptance!r}: unknown (use auto, "
                             f"{', '.join(ACCEPTANCE_KINDS)})")
        if self.acceptance != "auto":
            return self.acceptance
        return "greedy" if not self.temperature else "nucleus" if self.top_p is not None else "typical"

    def check(self) -> None:
        """Each field in its range, and no field set that the acceptance does not use."""
        for name, value in (("max_new_tokens", self.max_new_tokens), ("batch_sizes", self.batch_sizes)):
            if not isinstance(value, int) or value < 1:
                raise FieldError(name, "below_one", f"{{field}} {value}: give 1 or more")
        if self.limit is not None and not self.prompt_set:
            raise FieldError("limit", "without_prompt_set", "{field} picks the first N of a prompt set: give {also}, "
                             "or drop {field}", also="prompt_set")
        for name, value, low, high in (("temperature", self.temperature, 0.0, math.inf),
                                       ("epsilon", self.epsilon, 0.0, 1.0), ("top_p", self.top_p, 0.0, 1.0)):
            if value is not None and not (math.isfinite(value) and (low <= value if name == "temperature"
                                                                    else low < value) and value <= high):
                raise FieldError(name, "out_of_range", f"{{field}} {value}: outside "
                                 f"{'[' if name == 'temperature' else '('}{low:g}, {high:g}]")
        kind = self.kind()
        if kind == "greedy" and self.temperature:
            raise FieldError("temperature", "greedy_temperature", "{also} greedy takes no {field} (use typical or "
                             "nucleus to sample)", also="acceptance")
        unused = [name for name, given, used in (
            ("top_p", self.top_p is not None, kind == "nucleus"), ("seed", self.seed is not None, kind == "nucleus"),
            ("epsilon", self.epsilon not in (None, DEFAULT_EPSILON), kind == "typical"),
            ("delta", self.delta not in (None, "sqrt"), kind == "typical"),
            ("medusa_entropy", self.medusa_entropy, kind == "typical")) if given and not used]
        if unused:
            one = len(unused) == 1
            raise FieldError(unused[0], "unused", f"{{field}}{'' if one else ', {also}'} "
                             f"{'has' if one else 'have'} no effect with acceptance {kind}: drop "
                             f"{'it' if one else 'them'} or pick the acceptance that uses it (top_p/seed: nucleus; "
                             "epsilon/delta: typical)", also=None if one else unused[1])

    def rule(self):
        """The acceptance rule, defaults applied (checked first)."""
        # torch, when the rule is built: the parser and the app's pages stay without it
        from workbench.decode.acceptance import Acceptance

        self.check()
        kind = self.kind()
        temperature = self.temperature if self.temperature is not None else \
            (0.0 if kind == "greedy" else SAMPLED_TEMPERATURE)
        epsilon = DEFAULT_EPSILON if self.epsilon is None else self.epsilon
        return Acceptance(kind, temperature, epsilon, self.delta, DEFAULT_TOP_P if self.top_p is None else self.top_p,
                          self.seed, "medusa" if self.medusa_entropy else "exact")

    def check_prompts(self, prompts: list[list[int]], model, tree_nodes: int) -> None:
        """The prompts against the request: enough for one batch, and each fitting the model with its answer."""
        if self.batch_sizes > len(prompts):
            raise FieldError("batch_sizes", "above_prompts", f"{{field}} {self.batch_sizes} but {len(prompts)} "
                             "prompt(s) given: lower it or give more prompts")
        check_positions(model, max(map(len, prompts)), self.max_new_tokens, tree_nodes)
