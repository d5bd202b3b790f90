"""Process-group setup that works the same on a laptop CPU and under the
``deepspeed`` launcher on GPUs.

DeepSpeed picks its accelerator the first time it is imported, so
``DS_ACCELERATOR=cpu`` must be in the environment *before* ``import deepspeed``.
This module therefore imports deepspeed only inside its functions, each time
right after :func:`~agent_r1.accelerator.select_accelerator`. A plain
``python script.py`` gets a one-rank world on a free local port; the
launcher's ``RANK``/``WORLD_SIZE``/... are respected.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from pathlib import Path

import torch

from agent_r1.accelerator import on_cpu, select_accelerator

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port that was free a moment ago (for a one-rank rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _remove_shm_buffer(addr: str, port: str, rank: str) -> None:
    """Unlink this rank's DeepSpeed CPU all-reduce buffer in /dev/shm.

    Why: DeepSpeed's shm comm op never removes it, and /dev/shm is RAM: left
    behind run after run, the buffers fill memory until a stage is OOM-killed.
    Name as in deepspeed/ops/csrc/cpu/comm/shm.cpp: ``<prefix>_<uid>_<addr>_<port>_<rank>``.
    """
    path = Path("/dev/shm") / f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"
    path.unlink(missing_ok=True)


def init_distributed() -> tuple[int, int]:
    """Join (or create) the process group; return ``(rank, world_size)``.

    Idempotent. Without a launcher it fills in a one-rank world (MASTER_ADDR
    127.0.0.1 on a free port, RANK=0, WORLD_SIZE=1, LOCAL_RANK=0). The backend is
    gloo on CPU, nccl on CUDA.
    """
    select_accelerator()  # before deepspeed's first import: see the module docstring
    import deepspeed
    import deepspeed.comm as dist

    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1")
    if not dist.is_initialized():
        backend = "gloo" if on_cpu() else "nccl"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
        if on_cpu():
            atexit.register(_remove_shm_buffer, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ["RANK"])
        if not on_cpu():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank, world = dist.get_rank(), dist.get_world_size()
    log.debug("distributed ready: rank %d of %d (%s)", rank, world, select_accelerator())
    return rank, world


def is_rank0() -> bool:
    select_accelerator()
    import deepspeed.comm as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    select_accelerator()
    import deepspeed.comm as dist

    if dist.is_initialized():
        dist.barrier()


def shutdown_distributed() -> None:
    """Leave the process group before the interpreter exits (every rank).

    Without it a rank sometimes aborted after writing all its outputs ("terminate
    called without an active exception", SIGABRT): a communication thread outlived
    the group, and the launcher reported the run as failed."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
