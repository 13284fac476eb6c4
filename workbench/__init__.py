"""Medusa tree workbench: calibrate heads, optimise `medusa_choices` trees, verify them with a live decoder."""
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
# acceptance.py's rules, named here so that the CLI's parser lists them without importing torch (seconds per run)
ACCEPTANCE_KINDS = ("greedy", "typical", "nucleus")


class WorkbenchError(ValueError):
    """A problem with the user's input. The CLI prints it as one line `error: ...` and exits with status 2."""
