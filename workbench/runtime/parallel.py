"""Data-parallel runs without communication: which share of the work a process does, and how the processes of one
launch share a folder (its run lock in io.py, a shard lock per process here).

`accelerate launch` or `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK), MPI (PMI_*, OMPI_COMM_WORLD_*) or a script of
one's own (`RANK=r WORLD_SIZE=n workbench ...` per process) start N processes. Each takes a contiguous share of
the work, cut as accelerate's `split_between_processes` cuts a list (the first n % N processes take one item
more), writes its own part files, and the last one to finish merges them. No process group is created: nothing
waits on another process, so a process that dies stops nobody and costs only its own share. (accelerate's
`PartialState` is not used for the rank: it creates a process group, and on a machine without GPUs it reports one
process unless accelerate itself was told --cpu, which starts several only through MPI.)

The processes of one launch are told apart from those of another by their launcher: the parent process (the
accelerate/torchrun agent, mpirun's proxy, the user's shell script) and its start time, or, for processes on
several machines, $WORKBENCH_LAUNCH_ID set to the same value in each.
"""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench import WorkbenchError
from workbench.core.notes import FieldError, named, refused
from workbench.core.io import gate

# (rank, world size, local rank, local world size): torchrun/accelerate, Intel MPI/MPICH, Open MPI, MVAPICH
RANK_VARS = (("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
             ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
             ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"))


def _start_time(pid: int) -> str:
    """A process's start time in clock ticks since boot (Linux), so that a reused pid is another launcher."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return "0"


@dataclass(frozen=True)
class Launch:
    """This process's place in a launch of `world` processes (world 1: a plain run)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0       # among the processes on this machine (picks the GPU)
    local_world: int = 1
    launcher: int = 0         # the pid messages name: the launcher's, or this process's own when world is 1
    id: str = ""              # the same in every process of one launch, another for the next launch (and run)

    def share(self, n: int) -> range:
        """This process's contiguous share of n items (accelerate's split_between_processes)."""
        per, extra = divmod(n, self.world)
        start = self.rank * per + min(self.rank, extra)
        return range(start, start + per + (self.rank < extra))

    def device(self, device: str | None, device_map: str | None = None) -> str | None:
        """The device this process runs on: with several processes, `auto` or `cuda` means the GPU of its local
        rank (each process its own GPU, made the current one); anything else is taken as given. A device map
        spreads one model over every visible GPU, so it takes a machine (or a CUDA_VISIBLE_DEVICES group) per
        process."""
        if device_map is not None:
            if self.local_world > 1:
                raise FieldError("device_map", "many_processes", f"{{field}} {device_map} with {self.local_world} "
                                 "processes on this machine: each would spread its model over every visible GPU; "
                                 "start one process per group of GPUs yourself (CUDA_VISIBLE_DEVICES, RANK, "
                                 "WORLD_SIZE: README, 'Bigger models')")
            return device
        if self.world > 1 and device in (None, "auto", "cuda") and torch.cuda.is_available():
            index = self.local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)  # what a library allocates on "cuda" lands on this process's GPU too
            return f"cuda:{index}"
        return device


def current_launch() -> Launch:
    """The launch this process belongs to, read from the variables its launcher set."""
    for names in RANK_VARS:
        if names[1] not in os.environ:
            continue
        try:
            rank, world, local, local_world = (int(os.environ.get(n, d)) for n, d in zip(names, ("0", "1", "-1", "-1")))
        except ValueError:
            raise WorkbenchError(f"{names[0]}={os.environ.get(names[0])!r}, {names[1]}={os.environ.get(names[1])!r}: "
                                 "a launcher's rank and world size must be integers") from None
        if not 0 <= rank < world:
            raise WorkbenchError(f"{names[0]}={rank} with {names[1]}={world}: a process's rank must be in "
                                 f"[0, {world})")
        if world > 1:  # across machines the parents differ: WORKBENCH_LAUNCH_ID, the same in every process, joins them
            ppid = os.getppid()
            return Launch(rank, world, rank if local < 0 else local, 1 if local_world < 0 else local_world, ppid,
                          os.environ.get("WORKBENCH_LAUNCH_ID") or f"{ppid}@{_start_time(ppid)}")
    pid = os.getpid()
    return Launch(launcher=pid, id=f"{pid}@{time.time_ns()}")  # a run of its own: every call is a new launch


def one_process_warning() -> str | None:
    """`accelerate launch --cpu --num_processes N` (N > 1) starts ONE process unless MPI is set up: say so rather
    than let a user believe N processes share the work."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") and "MASTER_ADDR" in os.environ \
            and current_launch().world == 1:
        return ("warning: `accelerate launch --cpu` started one process (on CPU accelerate starts several only "
                "through MPI, --mpirun_hostfile); this one does all the work. Several CPU processes without MPI: "
                "`accelerate launch --multi_gpu --num_processes N ... --device cpu` or `torchrun --nproc_per_node N`")
    return None


# ----------------------------------------------------------------------------------------------- folder sharing

def _read_state(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


class Shard:
    """This process's share of a launch on a folder: `.rank-R.lock` there, flock-held while the process works,
    reading `LAUNCH_ID PID running`, then `... done` once its share is on disk. The others read it: held = at
    work, `done` = finished, free but not done = died. With one process there is nothing to share (no file).

        with Shard(folder, launch, folder, "out") as shard:
            ...write this process's parts...
            last = shard.finish()   # True in exactly one process of the launch: it merges
    """

    def __init__(self, folder: str | Path, launch: Launch, what, field: str | None = None):
        """`what` names the run's output in errors, after the request's `field` that named it (core.notes.named)."""
        self.folder, self.launch, self.field, self.fd = Path(folder), launch, field, None
        self.what = what = named(field, what)
        if launch.world == 1:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f".rank-{launch.rank}.lock"
        with gate(self.folder):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owner = (_read_state(path) + ["?", "?"])[1]
                raise refused(field, "rank_running", f"{what}: process {launch.rank} of this launch already runs "
                              f"(pid {owner}); give every process its own RANK") from None
            self.fd = fd
            self._write("running")

    def _write(self, state: str) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{self.launch.id} {os.getpid()} {state}\n".encode(), 0)

    def finish(self) -> bool:
        """Mark this share done. True when this is the last process of the launch to finish (it then merges or
        trains), False while another still works or has not started yet (that one will be last). Raises when a
        process of this launch died before finishing its share: the finished shares are kept, and launching the
        same command again does only what is missing."""
        if self.fd is None:
            return True
        with gate(self.folder):
            self._write("done")
            for r in range(self.launch.world):
                if r == self.launch.rank:
                    continue
                path = self.folder / f".rank-{r}.lock"
                state = _read_state(path)
                if len(state) != 3 or state[0] != self.launch.id:
                    return False  # not started yet (a lock of an earlier launch, or none)
                if state[2] == "last":
                    return False  # another process found everyone done first
                if state[2] != "done":
                    if self._held(path):
                        return False
                    raise refused(self.field, "share_died", f"{self.what}: process {r} of {self.launch.world} (pid "
                                  f"{state[1]}) ended without finishing its share; the finished shares are kept: run "
                                  "the same command again to do only what is missing")
            self._write("last")
            return True

    @staticmethod
    def _held(path: Path) -> bool:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the flock goes with it; the state stays for the others to read
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
