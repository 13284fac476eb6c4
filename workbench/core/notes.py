"""What the library returns for the front ends to word: a `Note` (a code, the text, the fix it points to) and a
`FieldError` (a request's field refused, with a code). The library names a request's *field*; the CLI words it as
its flag (`max_new_tokens` -> `--max-new-tokens`), the app as its control's label: one message, two faces."""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from workbench import WorkbenchError

Names = Mapping[str, str] | Callable[[str], str]


def flag(field: str) -> str:
    """A field's default CLI flag: `max_new_tokens` -> `--max-new-tokens` (a front end maps the exceptions)."""
    return "--" + field.replace("_", "-")


def _name(names: Names | None, field: str) -> str:
    if names is None:
        return flag(field)
    if callable(names):
        return names(field)
    return names.get(field) or flag(field)


class Note(NamedTuple):
    """One thing the user should know about a result. `code` names it (stable: front ends and tests key on it);
    `text` says it in one line, with "{fix}" where the front end's wording of `fix` goes (a field, or an export's
    own fix name); `field` is the request field it concerns, if any ("{field}" in `text`)."""
    code: str
    text: str
    fix: str | None = None
    field: str | None = None

    def words(self, fixes: Names | None = None) -> str:
        text = self.text
        if self.fix:
            text = text.replace("{fix}", fixes[self.fix] if isinstance(fixes, Mapping) and self.fix in fixes
                                else _name(fixes, self.fix))
        if self.field:
            text = text.replace("{field}", _name(fixes, self.field))
        return text


class FieldError(WorkbenchError):
    """A request's field refused: `field` is the request's attribute, `code` why (stable), `text` the reason with
    "{field}" where the front end's name of the field goes (other fields it names: `also`, "{also}" in `text`; a
    tuple of them: "{also}", "{also2}", "{also3}"...). Its str() is the CLI's default wording (the fields as
    flags); `words(names)` words it for another front end."""

    def __init__(self, field: str, code: str, text: str, also: str | tuple[str, ...] | None = None):
        self.field, self.code, self.text, self.also = field, code, text, also
        super().__init__(self.words())

    def __reduce__(self):  # pickled across processes (a worker's error) with its field and code
        return type(self), (self.field, self.code, self.text, self.also)

    def words(self, names: Names | None = None) -> str:
        text = self.text.replace("{field}", _name(names, self.field))
        for i, other in enumerate((self.also,) if isinstance(self.also, str) else self.also or ()):
            text = text.replace("{also" + (str(i + 1) if i else "") + "}", _name(names, other))
        return text


def named(field: str | None, what="", slot: str = "field") -> str:
    """A reader's label in an error's text: "{field} WHAT" where a request's field named the input (each front end
    names the field: the CLI by its flag, the app by its control; `slot` "also" where the error's own field is
    another), else WHAT as it is (an input no request field names)."""
    if not field:
        return str(what)
    return "{" + slot + "}" + (f" {what}" if str(what) else "")


def refused(field: str | None, code: str, text: str, also: str | tuple[str, ...] | None = None) -> WorkbenchError:
    """The error of a reader whose label `named` made: a FieldError where a field named the input, else a plain
    WorkbenchError (`text` then names no field)."""
    return FieldError(field, code, text, also) if field else WorkbenchError(text)


def worded(said, names: Names | None = None) -> str:
    """Any error or note as a front end shows it: a FieldError or a Note in the front end's names, anything else
    (a plain error, a note's text) as it is."""
    return said.words(names) if isinstance(said, (FieldError, Note)) else str(said)
