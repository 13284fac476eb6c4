"""Export warnings as each front end shows them (export.common.Warn worded with the CLI's or the app's fixes):
the tests read the words a user reads."""
from workbench.cli.export import EXPORT_FIXES as CLI_FIXES
from workbench.export import engines


def app_fixes() -> dict:
    from workbench.ui.tree_export import EXPORT_FIXES  # deferred: streamlit, for the tests that word for the app

    return EXPORT_FIXES


def export_tree(*args, front: str = "cli", **kwargs):
    """engines.export_tree with its warnings worded for `front` ("cli" or "app")."""
    text, warns = engines.export_tree(*args, **kwargs)
    fixes = CLI_FIXES if front == "cli" else app_fixes()
    return text, [w.words(fixes) for w in warns]


def export_plan(*args, **kwargs):
    """engines.export_plan with its warnings worded for the CLI."""
    text, warns, notes = engines.export_plan(*args, **kwargs)
    return text, [w.words(CLI_FIXES) for w in warns], notes
