"""What every engine's export shares: the warning it returns (a code, the problem, the fix it points to: each
front end words the fix itself, the CLI with its flags, the app with its controls), the header line, and a
plan's rows by batch size."""
from __future__ import annotations

from workbench.core.notes import FieldError, Note
from workbench.trees.tree import Tree


# One export warning: `code` names what the engine does otherwise than written (stable: front ends and tests key on
# it); `text` says it in one line, with "{fix}" where the front end's wording of `fix` goes (core.notes.Note).
Warn = Note


def header(target: str, what: str) -> str:
    return f"# workbench export for {what} (targets {target})\n"


def py_list(tree: Tree) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, p)) + "]" for p in tree.paths) + "]"


def plan_rows(plan: dict) -> list[dict]:
    return plan["plans"]


def row_at(plan: dict, batch_size: int) -> tuple[dict, list[str]]:
    """The plan row serving `batch_size`: the largest planned batch size <= it (below the first, the first)."""
    rows = plan_rows(plan)
    if batch_size < 1:
        raise FieldError("batch_sizes", "below_one", f"{{field}} {batch_size}: must be >= 1")
    below = [r for r in rows if r["batch_size"] <= batch_size]
    if below:
        row = below[-1]
        return row, ([] if row["batch_size"] == batch_size else
                     [f"batch size {batch_size} is not in the plan: using the row of batch size {row['batch_size']}"])
    return rows[0], [f"batch size {batch_size} is below the plan's first ({rows[0]['batch_size']}): using that row"]
