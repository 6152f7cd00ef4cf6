"""``tpu_interactive.launch(fn, nprocs=N)``: torchrun from a notebook cell.

Runs ``fn(*args)`` in N fresh worker processes (``python -m tpu_interactive._launch_worker``) with torchrun's
environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), so each joins JAX's multi-process runtime on import and ``fn`` calls
``dist.init_process_group("tpu")`` as under torchrun. Fresh processes rather than fork: the kernel
has already started XLA (which is neither fork-safe nor joinable afterwards), and the kernel stays
usable. Worker output is streamed into the cell prefixed by rank; rank 0's return value is returned.
When a rank fails, the others get ``grace_s`` seconds to finish (they are usually blocked in a
collective with the dead rank) and are then terminated; :class:`LaunchError` names the failing rank.
``fn`` and its arguments travel by pickle: cloudpickle when installed, else pickle with functions of
``__main__`` (the notebook) sent by value along with the globals they use (modules by name);
classes defined in the notebook need cloudpickle or a .py file.
"""
from __future__ import annotations

import builtins
import importlib
import marshal
import os
import pickle
import queue
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LaunchError", "launch"]


class LaunchError(RuntimeError):
    """A worker process failed; ``rank`` is the first rank that did, ``output`` its last lines."""

    def __init__(self, message: str, rank: int | None, output: str = ""):
        super().__init__(message)
        self.rank = rank
        self.output = output


def _pickler():
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return _MainByValue


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _rebuild_function(code: bytes, name: str, globs: dict, defaults, kwdefaults, cells):
    fn = types.FunctionType(marshal.loads(code), {"__builtins__": builtins, **globs}, name, defaults,
                            tuple(types.CellType(v) for v in cells) if cells is not None else None)
    fn.__kwdefaults__ = kwdefaults
    return fn


class _MainPickler(pickle.Pickler):
    """Pickles functions defined in ``__main__`` (a notebook, a script) by value: the worker's
    ``__main__`` is not the kernel's. Their code goes by marshal (the workers run this interpreter),
    with the globals it names (modules by name, other ``__main__`` functions by value again)."""

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
            names = _code_names(obj.__code__)
            globs = {k: v for k, v in obj.__globals__.items() if k in names}
            cells = [c.cell_contents for c in obj.__closure__] if obj.__closure__ else None
            return _rebuild_function, (marshal.dumps(obj.__code__), obj.__name__, globs, obj.__defaults__,
                                       obj.__kwdefaults__, cells)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        return NotImplemented


class _MainByValue:
    @staticmethod
    def dump(obj, f) -> None:
        _MainPickler(f).dump(obj)


def _ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections (Linux; the IANA range elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port_pair() -> int:
    """A port p with p and p+1 free (torch's store uses p, JAX's coordinator p+1).

    Drawn from below the ephemeral range: a port the OS picked for us (bind to 0) is free only until
    rank 0 listens on it, and in between any process's outgoing connection (gloo, a coordinator client)
    may be handed that very port (EADDRINUSE in rank 0's TCPStore). Below the range only another
    listener can take it, and a random draw makes two launches at once unlikely to collide."""
    low, _ = _ephemeral_port_range()
    candidates = range(max(1024, low // 2), low - 1) if low > 2050 else range(0)
    rng = random.SystemRandom()
    for _ in range(100 if len(candidates) else 0):
        port = rng.choice(candidates)
        if _bindable(port) and _bindable(port + 1):
            return port
    for _ in range(50):  # no room below the range: the OS's pick, racy as above
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if _bindable(port + 1):
            return port
    raise RuntimeError("launch: no free pair of consecutive ports on 127.0.0.1")


def _pump(rank: int, stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put((rank, line))
    stream.close()


def _stop(procs: list[subprocess.Popen], wait_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + wait_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(fn: Callable[..., Any], *args: Any, nprocs: int = 2, timeout_s: float | None = None,
           grace_s: float = 10.0, env: dict[str, str] | None = None, out: TextIO | None = None) -> Any:
    """Run ``fn(*args)`` on ``nprocs`` processes (one device each); return rank 0's result.

    ``timeout_s`` bounds the whole run; ``env`` adds environment variables for the workers; output
    lines go to ``out`` (default ``sys.stdout``, i.e. the notebook cell) as ``[rank N] ...``.
    """
    if nprocs < 1:
        raise ValueError(f"launch: nprocs must be >= 1, got {nprocs}")
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="tpu_launch_") as work:
        with open(os.path.join(work, "payload.pkl"), "wb") as f:
            _pickler().dump((fn, args), f)
        port = _free_port_pair()
        base = dict(os.environ, **(env or {}))
        # the workers import what the kernel can import (the notebook's directory, sys.path edits)
        paths = [p for p in sys.path if p] + [base.get("PYTHONPATH", "")]
        base.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), PYTHONUNBUFFERED="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nprocs),
                    LOCAL_WORLD_SIZE=str(nprocs))
        procs, lines = [], queue.Queue()
        try:
            for rank in range(nprocs):
                p = subprocess.Popen([sys.executable, "-m", "tpu_interactive._launch_worker", work],
                                     env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
                procs.append(p)
                threading.Thread(target=_pump, args=(rank, p.stdout, lines), daemon=True).start()
            failed = _supervise(procs, lines, out, timeout_s, grace_s)
        finally:
            _stop(procs)
            _drain(lines, out)
        if failed is not None:
            rank, why = _first_failure(work, procs, failed)
            err_path = os.path.join(work, f"error{rank}.txt")
            detail = ""
            if os.path.exists(err_path):
                with open(err_path) as f:
                    detail = f.read()
            last = detail.strip().splitlines()[-1] if detail.strip() else why
            raise LaunchError(f"launch: rank {rank} failed ({last}); the other ranks were stopped", rank, detail)
        with open(os.path.join(work, "result0.pkl"), "rb") as f:
            return pickle.load(f)


def _first_failure(work: str, procs, failed: tuple[int, str]) -> tuple[int, str]:
    """The rank whose error came first: when one rank dies, its peers' collectives fail right after
    (connection reset), and their exits may be seen in the same poll."""
    times = {}
    for r in range(len(procs)):
        path = os.path.join(work, f"error{r}.time")
        if os.path.exists(path):
            with open(path) as f:
                times[r] = float(f.read())
    if not times:
        return failed
    rank = min(times, key=times.get)
    return rank, f"exit code {procs[rank].returncode}"


def _drain(lines: queue.Queue, out: TextIO) -> None:
    while True:
        try:
            rank, line = lines.get_nowait()
        except queue.Empty:
            return
        out.write(f"[rank {rank}] {line}")


def _supervise(procs, lines: queue.Queue, out: TextIO, timeout_s, grace_s) -> tuple[int, str] | None:
    """Stream output until every worker exits; (rank, reason) of the first failure, else None."""
    start, failed, fail_time = time.monotonic(), None, None
    while True:
        try:
            rank, line = lines.get(timeout=0.05)
            out.write(f"[rank {rank}] {line}")
            continue
        except queue.Empty:
            pass
        codes = [p.poll() for p in procs]
        if failed is None:
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed, fail_time = (bad[0], f"exit code {codes[bad[0]]}"), time.monotonic()
        if all(c is not None for c in codes):
            return failed
        now = time.monotonic()
        if failed is not None and now - fail_time > grace_s:
            return failed
        if timeout_s is not None and now - start > timeout_s:
            running = [r for r, c in enumerate(codes) if c is None]
            raise TimeoutError(f"launch: timed out after {timeout_s:.0f} s; ranks {running} still running")
