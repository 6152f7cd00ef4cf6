"""One worker of ``tpu_interactive.launch``: ``python -m tpu_interactive._launch_worker WORKDIR``.

A module of its own (not ``launcher``, which the package imports) so ``-m`` runs it exactly once.
"""
from __future__ import annotations

import os
import pickle
import sys
import time
import traceback


def _worker(work: str) -> int:
    rank = int(os.environ["RANK"])
    try:
        import tpu_interactive  # noqa: F401  (joins JAX's runtime from the environment, registers tpu)

        with open(os.path.join(work, "payload.pkl"), "rb") as f:
            fn, args = pickle.load(f)
        result = fn(*args)
        if rank == 0:
            from .launcher import _pickler

            with open(os.path.join(work, "result0.pkl"), "wb") as f:
                _pickler().dump(result, f)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        from .backend import jax_runtime

        if jax_runtime.joined():
            import jax

            jax.distributed.shutdown()  # waits for every rank: rank 0 hosts the coordinator
        return 0
    except BaseException:  # noqa: BLE001  (anything fn raises is reported, naming this rank)
        with open(os.path.join(work, f"error{rank}.time"), "w") as f:
            f.write(repr(time.time()))  # the launcher names the rank that failed first
        text = traceback.format_exc()
        with open(os.path.join(work, f"error{rank}.txt"), "w") as f:
            f.write(text)
        sys.stderr.write(text)
        sys.stderr.flush()
        return 1


if __name__ == "__main__":
    code = _worker(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip atexit: JAX's shutdown barrier would wait for ranks that already failed
