"""Honest device detection: notice when a TPU exists but JAX fell back to the CPU."""
from __future__ import annotations

import glob
import os


def _tpu_device_files() -> list[str]:
    return sorted(glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*"))


def _holders(paths: list[str]) -> list[tuple[int, str]]:
    """(pid, command) of processes holding any of ``paths`` open (best effort, via /proc)."""
    wanted = {os.path.realpath(p) for p in paths}
    found = []
    for pid_dir in glob.glob("/proc/[0-9]*"):
        pid = int(os.path.basename(pid_dir))
        if pid == os.getpid():
            continue
        try:
            for fd in os.listdir(f"{pid_dir}/fd"):
                try:
                    if os.path.realpath(f"{pid_dir}/fd/{fd}") in wanted:
                        with open(f"{pid_dir}/cmdline", "rb") as f:
                            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                        found.append((pid, cmd))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return found


def device_warnings(platform: str, device_files: list[str] | None = None,
                    lockfile: str = "/tmp/libtpu_lockfile") -> list[str]:
    """Loud warnings when TPU hardware is present but the JAX platform is not 'tpu'."""
    files = _tpu_device_files() if device_files is None else device_files
    if platform == "tpu" or not files:
        return []
    holders = _holders(files)
    msg = (f"TPU hardware is present ({', '.join(files[:4])}) but JAX is running on {platform.upper()}: "
           "the tpu device is NOT using the TPU.")
    if holders:
        pid, cmd = holders[0]
        msg += f" It is held by PID {pid} ({cmd[:80]}); stop it (kill {pid}, or restart that notebook kernel)."
    elif os.path.exists(lockfile):
        msg += f" A libtpu lock file exists ({lockfile}); if no other process uses the TPU, remove it."
    else:
        msg += " Install libtpu (pip install 'tpu_interactive[tpu]') and restart the kernel."
    return [msg]
