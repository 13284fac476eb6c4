"""The latency surface a plan is priced on: one latency file read once (every batch size and tree policy), the
engine that timed it and that engine's serving rules as data, and the surface at one batch size and context (`At`).

Whose steps a table timed decides what can be weighed on it: our decoder runs any tree and steps all B rows of a
batch to the end; vLLM 0.32 drafts top-1 chains only (vllm/v1/spec_decode/medusa.py takes each head's argmax), its
round at a K it did not time is not known (a served round is no verify forward plus a constant), and it drops a
finished request, so a batch's tail runs at the smaller batch's cost (speed.shrinking_cost).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from workbench.core.provenance import read_setting
from workbench.core.speed import priced, shrinking_cost
from workbench.measure.latency_file import every_batch, latency_engine, latency_surface, policy_rows, read_latency


@dataclass(frozen=True)
class Serving:
    """An engine's serving rules, as the planner weighs them."""

    trees: bool  # drafts trees (False: top-1 chains only)
    untimed: bool  # prices a draft at a token count it did not time (the next timed size up: speed.latency_at)
    drops_finished: bool  # drops a finished request: a batch's tail costs a smaller batch's rounds

    def serves(self, kind: str, nodes: int, timed) -> bool:
        """Whether a candidate (`kind`, `nodes`) runs on this engine, `timed` the token counts its table timed."""
        if kind == "none":
            return True
        if kind != "chain" and not self.trees:
            return False
        return self.untimed or nodes + 1 in timed


SERVING = {"workbench": Serving(trees=True, untimed=True, drops_finished=False),
           "vllm": Serving(trees=False, untimed=False, drops_finished=True)}


@dataclass(frozen=True)
class At:
    """The surface at one batch size and context: {tokens: seconds} read non-decreasing (`seconds`), its quartiles
    {tokens: (q1, q3)} or None (`spread`), the table as measured (`measured`), the heads' cost
    (latency_file.read_head_cost) or None, the engine and its rules, and what a batch's tail is priced on where the
    engine drops finished sequences ({batch size: {tokens: seconds}} at this context, else None)."""

    batch: int
    context: int
    seconds: dict
    spread: dict | None
    measured: dict
    head_cost: dict | None
    engine: str
    serving: Serving
    tail: dict | None

    def cost(self):
        """The source's `cost` of a batch's tail steps here (speed.shrinking_cost), None without a tail."""
        return None if self.tail is None else shrinking_cost(self.tail, self.batch)

    def price(self, tokens_per_step: float, nodes: int, depth: int | None):
        """(speedup, range, relative_latency) of `nodes` nodes `depth` heads deep: speed.priced on this table."""
        return priced(self.seconds, self.spread, self.head_cost, tokens_per_step, nodes, depth)


class Surface:
    """A latency table's static rows (`frame`), its per-step rows (`dynamic`, None when none were timed), the engine
    that timed them (`engine`, `engine_version`, `serving`) and its setting; `what` names it in errors, after the
    request's `field` that gave it where one did (core.notes.named: the CLI words it as --latency, the app as its
    control)."""

    def __init__(self, frame: pd.DataFrame, dynamic: pd.DataFrame | None = None, path=None, what: str = "latency",
                 field: str | None = None):
        self.frame, self.dynamic, self.path, self.what, self.field = frame, dynamic, path, what, field
        self.engine, self.engine_version = latency_engine(frame)
        self.serving = SERVING[self.engine]
        self.setting = read_setting(frame)
        self._at: dict = {}
        self._tails: dict = {}

    @classmethod
    def read(cls, path, field: str = "latency") -> Surface:
        """The latency CSV at `path`, read and checked once (latency_file.read_latency); `field`: the request field
        that gave it."""
        every = read_latency(path, field, policy=None)
        return cls(policy_rows(every, "static"), policy_rows(every, "dynamic"), path, str(path), field)

    def context(self, batches, context: int | None = None, target: float | None = None) -> int:
        """The context every batch size in `batches` is read at: `context`, else the one measured at all of them
        nearest `target`, else the only one (latency_file.latency_surface; one error naming what is missing)."""
        return latency_surface(self.frame, batches, context, target, self.what, self.field)[1]

    def at(self, batch: int, context: int) -> At:
        """The surface at one batch size and a context `context` picked by `context()`."""
        key = (int(batch), int(context))
        if key not in self._at:
            s = latency_surface(self.frame, [batch], context, None, self.what, self.field)[0][batch]
            tail = self._tail(context) if self.serving.drops_finished else None
            self._at[key] = At(int(batch), int(context), s["seconds"], s["spread"], s["measured"], s["head_cost"],
                               self.engine, self.serving, tail)
        return self._at[key]

    def _tail(self, context: int) -> dict:
        if context not in self._tails:
            self._tails[context] = every_batch(self.frame, context)
        return self._tails[context]

    def per_step(self, batches, context: int) -> dict[int, At]:
        """The per-step trees' surface at every batch size of `batches` ({B: At}, each relative to the same plain
        step; a per-step tree runs on our decoder only, which keeps every row to the end: no tail); a WorkbenchError
        where a batch size or the context lacks them."""
        rows = latency_surface(self.dynamic, batches, context, what=f"{self.what} (per-step trees)",
                               field=self.field)[0]
        return {b: At(b, int(context), s["seconds"], s["spread"], s["measured"], s["head_cost"], self.engine,
                      self.serving, None) for b, s in rows.items()}

    @property
    def envelope(self) -> int | None:
        """The nodes the per-step trees were chosen from (`latency --envelope`), None without per-step rows."""
        return None if self.dynamic is None else int(self.dynamic["envelope"].dropna().iloc[0])
