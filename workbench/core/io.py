"""File helpers every writer shares: the one atomic writer, output checks made before long work, run locks and the
checked JSON/CSV readers (the work state a long run keeps beside its output file: work.py).

Atomic: a file is written to a hidden temp file beside it and renamed over it, so an interrupted run never
leaves half a file. Checked: an output location that cannot be written is refused in one line naming the
request's field (core.notes.FieldError: the CLI words it as its flag, the app as its control) and the path before
any model loads, not with a traceback an hour later. Locked: two long runs on the same
folder would interleave their parts, so the second refuses while the first (whose pid the lock file holds) lives.
"""
from __future__ import annotations

import fcntl
import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from workbench.core.notes import named, refused

LOCK_NAME = ".workbench.lock"


def cache_dir() -> Path:
    """Where the workbench keeps what it makes once per machine ($WORKBENCH_CACHE, else ~/.cache/workbench)."""
    root = os.environ.get("WORKBENCH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "workbench"
    return Path(root)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _drop_stale_temps(path: Path) -> None:
    """Temp files of this target left by a killed writer (its pid is dead): a killed run leaves no litter."""
    for f in path.parent.glob(f".{path.name}.*.tmp*"):
        pid = f.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            f.unlink(missing_ok=True)


def _remove(f: Path) -> None:
    try:
        f.unlink(missing_ok=True)
    except OSError:
        pass


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def refuses_writes(st: os.stat_result) -> bool:
    """Linux's /dev/full (character device 1:7): every write to it fails with 'No space left on device', so a
    command writing there is refused before its work, not after it."""
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 7)


def atomic_write(path: str | Path, write, field: str | None = None) -> Path:
    """`write(tmp)` fills a temp file beside `path` (same suffix, so savefig/to_parquet see the format), which
    then replaces `path` in one rename. Any OS failure is one error naming the request's `field` (e.g. "out", a
    FieldError; None: the path alone) and the path. The temp file goes on failure; one a killed writer left goes
    with the next write of `path`. A symbolic link is followed (its target is what gets written, as `>` in a
    shell would); a device or pipe (/dev/null, /dev/stdout) is written in place: a rename would replace the device
    node itself."""
    label = named(field, path)
    path = Path(path)
    try:
        if path.is_symlink():
            path = Path(os.path.realpath(path))
        device = path.exists() and not path.is_file() and not path.is_dir()  # a character device, a fifo
    except OSError as e:  # a name too long, a loop of links
        raise refused(field, "unwritable", f"{label}: cannot write it ({_reason(e)})") from None
    if device:
        try:
            write(path)
        except OSError as e:
            raise refused(field, "unwritable", f"{label}: cannot write it ({_reason(e)})") from None
        except Exception:
            check_output(path, field, "file", label)
            raise
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_stale_temps(path)
        write(tmp)
        os.replace(tmp, path)
    except Exception as e:  # writers wrap OS errors in their own types (safetensors): find the precise reason
        _remove(tmp)
        check_output(path, field, "file", label)  # a folder there, a parent that is a file, no write permission
        if isinstance(e, OSError):  # disk full, name too long, ...
            raise refused(field, "unwritable", f"{label}: cannot write it ({_reason(e)})") from None
        raise
    except BaseException:
        _remove(tmp)
        raise
    return path


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:  # the close, where a full device reports, raises here too
        f.write(text)


def atomic_write_text(path: str | Path, text: str, field: str | None = None) -> Path:
    return atomic_write(path, lambda tmp: _write_text(Path(tmp), text), field)


def atomic_write_json(path: str | Path, obj, field: str | None = None) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n", field)


def check_output(path: str | Path | None, field: str | None, kind: str = "file", label: str = "") -> None:
    """Refuse, in one line naming the request's `field` (core.notes.FieldError) and the path, an output location
    that cannot be written: a file where a folder is needed or the reverse, a parent that is a file, a folder we
    may not write in. Creates nothing (a probe file in the nearest existing folder is made and removed at once).
    kind: 'file' or 'folder'. `label` words the output otherwise (with `field` None: no field names it)."""
    if path is None or path == "":
        return
    path = Path(path)
    label = label or named(field, path)
    try:
        _check_output(path, kind, label, field)
    except OSError as e:  # a name too long, a loop of links, ...: the stat calls themselves fail
        raise refused(field, "unwritable", f"{label}: cannot write there ({_reason(e)})") from None


def _check_output(path: Path, kind: str, label: str, field: str | None) -> None:
    if path.exists():
        if kind == "file" and path.is_dir():
            raise refused(field, "is_folder", f"{label}: is a folder; give a file name")
        if kind == "folder" and not path.is_dir():
            raise refused(field, "is_file", f"{label}: is a file, not a folder; give a folder")
        if refuses_writes(path.stat()):
            raise refused(field, "unwritable", f"{label}: cannot write it (No space left on device: every write "
                          "there fails)")
    folder = path if kind == "folder" else path.parent
    existing = folder if str(folder) else Path(".")
    while not existing.exists():
        if existing.is_symlink():
            raise refused(field, "broken_link", f"{label}: {existing} is a broken link")
        existing = existing.parent
    if not existing.is_dir():
        raise refused(field, "parent_file", f"{label}: {existing} is a file, not a folder")
    probe = existing / f".workbench-probe.{os.getpid()}.tmp"
    try:
        probe.touch()
        probe.unlink()
    except OSError as e:
        where = "" if existing == folder else f" (cannot create folders under {existing})"
        raise refused(field, "unwritable", f"{label}: cannot write there{where}: {_reason(e)}") from None


@contextmanager
def gate(folder: str | Path):
    """Hold `folder`'s own flock for the block: the short critical sections of every process on a folder (taking
    or leaving its run lock, preparing it, checking who finished) happen one at a time. Blocks while another
    process holds it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def run_lock(target: str | Path, field: str, kind: str = "folder", launch=None):
    """Hold a run's lock on its folder (or file) for the duration of the block.

    The lock file (`.workbench.lock` in the folder, `.NAME.lock` beside a file) names its owner; the lock itself
    is an flock, which the kernel drops when the owner dies, so a lock left by a killed run (pid dead) is simply
    taken over. A plain run holds it alone (the file holds its pid). The processes of one data-parallel launch
    (`launch`, a parallel.Launch of several processes) hold it together, shared (the file holds the launcher's
    pid and the launch's id): they work on one folder by design, each on its own share. Any other run on the same
    target refuses in one line naming the owner's pid and the request's `field` that named the target. A folder
    the lock had to create is removed again if the run left it empty (a refused run writes nothing). No file
    (None, results on stdout) or a device (/dev/null) is nobody's output alone: nothing is locked."""
    if target is None or (kind == "file" and work_folder(target) is None):
        yield None
        return
    target = Path(target)
    folder = target if kind == "folder" else target.parent
    top = folder  # the outermost folder this lock creates (removed again if the run leaves it empty)
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    created = not top.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise refused(field, "unwritable", f"{named(field, target)}: cannot create the folder ({_reason(e)})") \
            from None
    path = folder / LOCK_NAME if kind == "folder" else folder / f".{target.name}.lock"
    shared = launch is not None and launch.world > 1
    owner = f"{launch.launcher} {launch.id}" if shared else str(os.getpid())
    with gate(folder):  # nobody else takes, converts or leaves the lock meanwhile
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{owner}\n".encode())
            if shared:
                fcntl.flock(fd, fcntl.LOCK_SH)  # the launch's other processes join it
        except BlockingIOError:
            held = os.read(fd, 200).decode(errors="replace").split()
            if not (shared and held[1:] == [launch.id]):
                os.close(fd)
                raise refused(field, "locked", f"{named(field, target)}: another run (pid "
                              f"{held[0] if held else 'unknown'}) is writing there right now; wait for it to finish "
                              f"or use another {named(field)} (lock file {path})") from None
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a process of the same launch holds it: join
    try:
        yield path
    finally:
        with gate(folder):
            last = True
            if shared:  # the last process of the launch to leave removes the file
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    last = False
            if last:
                path.unlink(missing_ok=True)
            os.close(fd)
        while created and last and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            if folder == top:
                break
            folder = folder.parent


def work_folder(out: str | Path | None) -> Path | None:
    """Where a long run that writes the file `out` keeps its finished pieces: `OUT.work/` beside it. None when
    there is no file to write beside (results on stdout, or a device such as /dev/null)."""
    if not out:
        return None
    out = Path(out)
    if out.exists() and not out.is_file():
        return None
    return out.with_name(out.name + ".work")


def read_json(path: str | Path, what, kind: type = dict, field: str | None = None):
    """A JSON file that must hold a `kind` (an object by default), or one line naming the file and what is wrong:
    `what` labels it, after the request's `field` that named it where one did (core.notes.named)."""
    path, label = Path(path), named(field, what)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        msg = str(e).splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise refused(field, "unreadable", f"{label}: {path.name} is not readable JSON ({msg})") from None
    if not isinstance(obj, kind):
        raise refused(field, "not_" + ("object" if kind is dict else kind.__name__), f"{label}: {path.name} should "
                      f"hold a JSON {'object' if kind is dict else kind.__name__}, found {type(obj).__name__}")
    return obj


def read_csv(path, field: str | None, columns: tuple[str, ...], maker: str, what=None):
    """A results CSV (a DataFrame) with at least one row and these columns, or one line naming the request's
    `field` that gave it (core.notes.FieldError: a flag in the CLI, a control in the app), the file (or `what`),
    what is wrong and who writes it: the one checked reader of the latency and sweep CSVs."""
    label = named(field, path if what is None else what)
    if not Path(path).is_file():
        raise refused(field, "missing", f"{label}: no such file (make one with `{maker}`)")
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as e:
        msg = str(e).splitlines()[0][:100] if str(e).strip() else type(e).__name__
        raise refused(field, "unreadable", f"{label}: not a readable CSV ({msg})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing or df.empty:
        raise refused(field, "columns", f"{label}: needs rows with columns {','.join(columns)} "
                      f"({'missing column(s) ' + ', '.join(missing) if missing else 'no rows'}; `{maker}` writes it)")
    return df


def find_csvs(roots, columns: tuple[str, ...]) -> list[Path]:
    """The CSVs under `roots` (recursively, sorted per root) whose header has these columns: the results files of
    one kind (a sweep's or a latency's required columns) wherever they were written."""
    out = []
    for root in map(Path, roots):
        for f in sorted(root.rglob("*.csv")) if root.is_dir() else []:
            try:
                with f.open() as fh:
                    header = fh.readline().strip().split(",")
            except (OSError, UnicodeDecodeError):
                continue
            if all(c in header for c in columns):
                out.append(f)
    return out
