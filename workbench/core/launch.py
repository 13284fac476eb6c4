"""How this process was started, read before torch loads: the rank variables of a multi-process launch, and
OpenMP's thread binding.

The CLI binds OpenMP's threads one to a core (OMP_PROC_BIND=close, OMP_PLACES=cores), as vLLM's CPU build binds
its own: on the 2-core AMD EPYC VMs the demo's plain step took 35.1 ms bound against 39.2 ms unbound (medians of
five alternating runs, docs/measurements.md). OpenMP reads these when torch loads it, so `bind_threads` runs before
anything imports torch; a value the user set is kept, and a process of a multi-process launch is left alone (each
would bind its threads to the same first cores)."""
from __future__ import annotations

import os
import sys

# (rank, world size, local rank, local world size): torchrun/accelerate, Intel MPI/MPICH, Open MPI, MVAPICH
RANK_VARS = (("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
             ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
             ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"))
BIND = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
BOUND: dict[str, str] = {}  # what bind_threads set (a child with its own binding, vLLM's worker, drops these)


def bind_threads() -> None:
    """Set BIND where the user did not, unless torch is loaded already or this is one of several launched
    processes."""
    if "torch" in sys.modules or any(os.environ.get(v[1], "1") not in ("", "1") for v in RANK_VARS):
        return
    for key, value in BIND.items():
        if key not in os.environ:
            os.environ[key] = BOUND[key] = value
