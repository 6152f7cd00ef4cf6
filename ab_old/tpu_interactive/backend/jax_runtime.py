"""Joining JAX's multi-process runtime (one process per device, like CUDA under torchrun).

``jax.distributed.initialize`` must run before anything initializes the XLA backend, and importing
the backend does (it creates arrays). So the join happens here, first thing on import, when the
process was started by torchrun (or ``tpu_interactive.launch``): ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set and ``WORLD_SIZE > 1``. JAX's coordinator listens on
``MASTER_PORT + 1`` (torch's TCPStore holds ``MASTER_PORT``) unless ``TPU_INTERACTIVE_COORDINATOR_PORT``
says otherwise; ``TPU_INTERACTIVE_DISTRIBUTED=0`` opts out.
"""
from __future__ import annotations

import os

import jax

_state: dict[str, int] = {}  # rank / world_size once joined
_refused: list[str] = []  # why the join from torchrun's variables was refused (raised by init_process_group)


def torchrun_env() -> dict[str, str] | None:
    """torchrun's variables when all four are set, else None."""
    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(os.environ.get(k) for k in keys):
        return None
    return {k: os.environ[k] for k in keys}


def coordinator_address(master_addr: str, master_port: int | str) -> str:
    port = os.environ.get("TPU_INTERACTIVE_COORDINATOR_PORT") or str(int(master_port) + 1)
    return f"{master_addr}:{port}"


def _host_device_limit() -> int | None:
    """How many processes this host can give one device each, or None where it is not bounded.

    TPU chips are the accelerator device files; XLA:CPU devices are virtual (any number of processes
    can run one), so there is no bound unless ``TPU_INTERACTIVE_HOST_DEVICES`` sets one.
    """
    forced = os.environ.get("TPU_INTERACTIVE_HOST_DEVICES")
    if forced:
        return int(forced)
    from .detect import _tpu_device_files

    platforms = os.environ.get("JAX_PLATFORMS", "")
    chips = _tpu_device_files()
    if chips and platforms in ("", "tpu"):
        return len(chips)
    return None


def check_world_fits(local_world_size: int) -> None:
    limit = _host_device_limit()
    if limit is not None and local_world_size > limit:
        raise RuntimeError(
            f"tpu: {local_world_size} processes on this host but it has {limit} device(s); the tpu "
            "process group runs one process per device (like CUDA/NCCL), so use "
            f"--nproc-per-node {limit} or fewer")


def join(rank: int, world_size: int, coordinator: str, local_world_size: int | None = None) -> None:
    """``jax.distributed.initialize`` for this process (idempotent for the same arguments)."""
    if _state:
        if (_state["rank"], _state["world_size"]) != (rank, world_size):
            raise RuntimeError(f"tpu: this process already joined JAX's runtime as rank {_state['rank']} of "
                               f"{_state['world_size']}; it cannot rejoin as rank {rank} of {world_size}")
        return
    check_world_fits(local_world_size or world_size)
    # CPU collectives across processes go through gloo (XLA:CPU has no other cross-process transport);
    # the setting only concerns the CPU client, so TPU/GPU processes are unaffected.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if jax.distributed.is_initialized():  # the user called jax.distributed.initialize() first
        if (jax.process_index(), jax.process_count()) != (rank, world_size):
            raise RuntimeError(f"tpu: JAX's runtime has this process as {jax.process_index()} of "
                               f"{jax.process_count()}, torchrun as rank {rank} of {world_size}")
    else:
        jax.distributed.initialize(coordinator, num_processes=world_size, process_id=rank)
    _state.update(rank=rank, world_size=world_size)


def join_from_env() -> bool:
    """Join when started by torchrun with more than one process; True when joined."""
    env = torchrun_env()
    if env is None or os.environ.get("TPU_INTERACTIVE_DISTRIBUTED", "1") == "0":
        return False
    world = int(env["WORLD_SIZE"])
    if world <= 1:
        return False
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    try:
        check_world_fits(local_world)
    except RuntimeError as e:  # import still works; init_process_group("tpu") raises the reason
        _refused.append(str(e))
        return False
    join(int(env["RANK"]), world, coordinator_address(env["MASTER_ADDR"], env["MASTER_PORT"]), local_world)
    return True


def refusal() -> str | None:
    return _refused[0] if _refused else None


def joined() -> bool:
    return bool(_state)


def world() -> tuple[int, int]:
    """(rank, world_size) of this process in JAX's runtime ((0, 1) when not joined)."""
    return (_state["rank"], _state["world_size"]) if _state else (0, 1)
