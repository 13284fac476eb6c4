"""`vllm-check` asked for: its fields, checked here before vLLM or any model loads; errors name a field
(core.notes.FieldError) that each front end words as its flag or control."""
from __future__ import annotations

from dataclasses import dataclass

from workbench.core.notes import FieldError


@dataclass(frozen=True)
class VllmCheckRequest:
    """The plan (optional) and the heads run in vLLM beside our prediction and decoder (export.vllm_check)."""
    calibration: str | None = None
    plan: str | None = None
    model: str | None = None
    heads: str | None = None
    k: tuple[int, ...] = (1, 2, 3, 4)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    prompts: str = "holdout"
    limit: int | None = 16
    max_new_tokens: int = 64
    raw: bool = False
    repeats: int = 3
    vllm_eager: bool = False
    compile: bool | None = None

    def checked(self) -> VllmCheckRequest:
        for name in ("max_new_tokens", "limit", "repeats"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise FieldError(name, "below_one", f"{{field}} {value}: must be positive")
        for name in ("k", "batch_sizes"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise FieldError(name, "below_one", "{field}: give positive integers like 1,2,4")
        return self

    def run(self, python: str | None = None, work=None, progress=None) -> dict:
        """The check (export.vllm_check.vllm_check) as one JSON-ready dict; `work`: where finished parts wait."""
        # the check's machinery (torch, vLLM's runner) loads when it runs, not when the request is checked
        from workbench.export.vllm_check import vllm_check
        from workbench.plan.plan_file import read_plan

        self.checked()
        return vllm_check(self.calibration, read_plan(self.plan) if self.plan else None, self.model, self.heads,
                          list(self.k), list(self.batch_sizes), self.prompts, self.limit, self.max_new_tokens, python,
                          self.raw, progress=progress, work=work, repeats=self.repeats, eager=self.vllm_eager,
                          compile=self.compile)
