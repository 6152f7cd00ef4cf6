"""program_store: eager programs found on disk by a second process without tracing or lowering."""
from __future__ import annotations

import functools
import os
import textwrap
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
from helpers import run_result_script

import tpu_interactive  # noqa: F401
from tpu_interactive.backend import op_jit, program_store

# A small training step touching every kind of stored program: planned functional and in-place ops
# (donating), foreach (AdamW), view reads and writes, a never-written buffer's zeros, backward.
_STEP = textwrap.dedent("""
    import json, os, torch, tpu_interactive as tt
    from tpu_interactive.backend import program_store

    if os.environ.get("STORE_OFF") == "1":  # the store neither answers nor keeps: JAX's cache does
        program_store.directory = lambda: None

    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(6, 8).to(device)
        losses = []
        for _ in range(2):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        buf = torch.zeros(5, 6, device=device)
        buf[1:3, ::2] = torch.arange(6.0, device=device).view(2, 3)
        buf.t()[2].mul_(3.0)
        return losses, [p.detach().cpu().tolist() for p in model.parameters()], buf.cpu().tolist()

    tt.reset_stats()
    ours = run("tpu")
    stats = tt.stats()
    print("RESULT " + json.dumps({"ours": ours, "cpu": run("cpu"), "counts": program_store.COUNTS,
                                  "compiles": stats["xla_compiles"], "disk": stats["xla_disk_hits"]}))
""")


def _run_step(cache_dir: str, fused: bool = False, store: bool = True) -> dict:
    return run_result_script(_STEP, {"TPU_INTERACTIVE_CACHE_DIR": cache_dir, "TPU_DEFER_AND_FUSE": str(int(fused)),
                                     "STORE_OFF": str(int(not store))})


def _flat(value) -> list:
    return [x for v in value for x in _flat(v)] if isinstance(value, list) else [value]


def _close(a, b) -> None:
    torch.testing.assert_close(torch.tensor(_flat(a), dtype=torch.float64), torch.tensor(_flat(b), dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)


def test_a_second_process_loads_the_programs_the_first_compiled(tmp_path):
    first = _run_step(str(tmp_path))
    second = _run_step(str(tmp_path))
    for result in (first, second):
        for ours, cpu in zip(result["ours"], result["cpu"]):
            _close(ours, cpu)
    assert first["counts"]["stored"] > 20 and first["counts"]["loaded"] == 0
    # every program the first process stored is loaded, none compiled again
    assert second["counts"] == {"stored": 0, "loaded": first["counts"]["stored"], "unstable": 0}
    assert second["disk"] >= second["counts"]["loaded"]  # loads are reported as disk hits
    assert second["ours"] == first["ours"]  # bit for bit


_LINALG_FIRST = textwrap.dedent("""
    import json, torch, tpu_interactive
    from tpu_interactive.backend import program_store

    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(0)) + 5 * torch.eye(5)
    # LAPACK custom calls (getrf, gesdd, syevd) before any other linalg op of the process
    ours = [torch.linalg.inv(a.to("tpu")).cpu(), torch.linalg.svdvals(a.to("tpu")).cpu(),
            torch.linalg.eigvalsh((a @ a.T).to("tpu")).cpu()]
    cpu = [torch.linalg.inv(a), torch.linalg.svdvals(a), torch.linalg.eigvalsh(a @ a.T)]
    print("RESULT " + json.dumps({"close": all(torch.allclose(o, c, rtol=1e-4, atol=1e-5) for o, c in zip(ours, cpu)),
                                  "counts": program_store.COUNTS}))
""")


def test_a_stored_lapack_program_runs_first_in_a_new_process(tmp_path):
    """A loaded program skips jax's lowering, which is where jax fills in the LAPACK function table:
    the second process used to segfault on its first linalg op."""
    env = {"TPU_INTERACTIVE_CACHE_DIR": str(tmp_path), "TPU_DEFER_AND_FUSE": "0"}
    first = run_result_script(_LINALG_FIRST, env)
    second = run_result_script(_LINALG_FIRST, env)
    assert first["close"] and second["close"]
    assert first["counts"]["stored"] >= 3 and second["counts"]["loaded"] >= 3 and second["counts"]["stored"] == 0


def test_fused_segments_are_stored_and_loaded_too(tmp_path):
    first = _run_step(str(tmp_path), fused=True)
    second = _run_step(str(tmp_path), fused=True)
    assert first["counts"]["stored"] >= 2 and second["counts"]["stored"] == 0
    assert second["counts"]["loaded"] == first["counts"]["stored"]
    for ours, cpu in zip(second["ours"], second["cpu"]):
        _close(ours, cpu)
    assert second["ours"] == first["ours"]


def test_a_program_jaxs_cache_answered_is_not_stored(tmp_path):
    """An XLA:CPU executable read from JAX's persistent cache serializes without its compiled
    functions: storing it would make the next process fail ("Function ... not found")."""
    first = _run_step(str(tmp_path), store=False)  # compiled into JAX's cache only
    assert first["counts"]["stored"] == 0 and not any(name.startswith("tpu-") for name in os.listdir(tmp_path))
    again = _run_step(str(tmp_path))  # every program is a JAX cache hit now
    assert again["counts"]["stored"] == 0
    third = _run_step(str(tmp_path))
    for ours, cpu in zip(third["ours"], third["cpu"]):
        _close(ours, cpu)


_HELD_IN_MEMORY = textwrap.dedent("""
    import functools, json
    import jax.numpy as jnp
    import tpu_interactive
    from tpu_interactive.backend import op_jit, program_store

    def scaled(factor, x):
        return x * factor + 1

    def other(x):
        return x - 7

    x = jnp.arange(4.0, dtype=jnp.bfloat16)
    program = op_jit.Program(functools.partial(scaled, 3.0), functools.partial(scaled, 3.0))
    stage = STAGE
    if stage == 0:  # jax compiles it for a plain jitted call: JAX's cache has it, the store does not
        out = program._jit(0)(x)
    elif stage == 1:
        program._jit(0)(x)  # read from JAX's cache, held by the jitted function
        op_jit.Program(other, other)(jnp.arange(5.0))  # a fresh compile on this thread
        out = program.executable((x,))(x)  # lower().compile(): jax hands back the executable it holds
    else:
        out = program(x)
    print("RESULT " + json.dumps({"out": [float(v) for v in out], "counts": program_store.COUNTS}))
""")


def test_an_executable_jax_held_in_memory_is_not_stored(tmp_path):
    """``lower().compile()`` of a jitted function already called with those inputs fires no compile
    event and returns the executable jax holds, here one read from JAX's cache: stored, the next
    process failed at its first run (NOT_FOUND: Function add_convert_fusion not found)."""
    outs = [run_result_script(_HELD_IN_MEMORY.replace("STAGE", str(stage)), {"TPU_INTERACTIVE_CACHE_DIR": str(tmp_path)})
            for stage in range(3)]
    assert [o["out"] for o in outs] == [[1.0, 4.0, 7.0, 10.0]] * 3
    assert outs[1]["counts"]["stored"] == 1  # `other`, compiled fresh; not `scaled`, held from JAX's cache


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    from tpu_interactive.backend import compile_log
    from tpu_interactive.backend.config import config

    monkeypatch.setattr(config, "persistent_cache_dir", str(tmp_path))
    compile_log.follow_persistent_cache_config()
    yield tmp_path
    monkeypatch.undo()
    compile_log.follow_persistent_cache_config()


def _scaled(factor, x):
    return x * factor + 1


def test_an_unreadable_entry_warns_and_the_program_compiles_again(store_dir):
    program = op_jit.Program(functools.partial(_scaled, 3.0), functools.partial(_scaled, 3.0))
    x = jnp.arange(4.0)
    assert program(x).tolist() == [1.0, 4.0, 7.0, 10.0]
    entries = [p for p in store_dir.iterdir() if p.name.startswith("tpu-")]
    assert len(entries) == 1
    entries[0].write_bytes(b"not an executable")
    program_store._warned[0] = False
    fresh = op_jit.Program(functools.partial(_scaled, 3.0), functools.partial(_scaled, 3.0))
    with pytest.warns(RuntimeWarning, match="could not read the stored program"):
        assert fresh(x).tolist() == [1.0, 4.0, 7.0, 10.0]
    assert not entries[0].exists() or entries[0].read_bytes() != b"not an executable"


def test_programs_are_named_by_what_they_compute():
    name = program_store.function_name
    assert name(functools.partial(_scaled, 2.0)) != name(functools.partial(_scaled, 3.0))

    def make(k):
        def inner(x):
            return x * k
        return inner

    assert name(make(2)) != name(make(3)) and name(make(2)) == name(make(2))
    with pytest.raises(program_store.Unstable):
        name(lambda x: x)
    with pytest.raises(program_store.Unstable):
        name(make(object()))  # a closure over something with no stable text
    with pytest.raises(program_store.Unstable):
        program_store.stable({"a": object()})
    assert program_store.stable((torch.float32, jnp.float32, None, 1.5, slice(1, None))) == \
        program_store.stable((torch.float32, jnp.float32, None, 1.5, slice(1, None)))
    kinds = [jnp.dtype(k) for k in ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8")]
    assert len({program_store.stable(k) for k in kinds}) == len(kinds)  # same sizes, different kinds


def test_an_unnamable_program_runs_and_is_not_stored(store_dir):
    program = op_jit.Program(lambda x: x - 1, lambda x: x - 1)
    before = dict(program_store.COUNTS)
    assert program(jnp.ones(3)).tolist() == [0.0, 0.0, 0.0]
    assert program_store.COUNTS["stored"] == before["stored"]
    assert not [p for p in store_dir.iterdir() if p.name.startswith("tpu-")]


def test_the_key_follows_settings_a_lowering_may_read(store_dir):
    signature = op_jit._signature([jnp.ones(3)])
    key = functools.partial(program_store._path, str(store_dir), "f", (), signature, 0)
    before = key()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert key() != before
    finally:
        torch.set_default_dtype(previous)
    assert key() == before
    with jax.default_matmul_precision("highest"):  # a thread-local jax setting a trace reads
        assert key() != before
    assert program_store._path(str(store_dir), "f", (), signature, 1) != before  # donation
    other = op_jit._signature([jnp.ones(4)])
    assert program_store._path(str(store_dir), "f", (), other, 0) != before


def test_the_key_follows_the_host_cpu(store_dir, monkeypatch):
    """XLA:CPU compiles for the host's CPU: a cache directory shared by different hosts (an NFS home)
    must not hand one CPU's machine code to another."""
    assert len(program_store.host_cpu()) == 64  # Linux: a digest of /proc/cpuinfo's model and flags
    signature = op_jit._signature([jnp.ones(3)])
    program_store._environment.cache_clear()
    here = program_store._path(str(store_dir), "f", (), signature, 0)
    program_store._environment.cache_clear()
    with monkeypatch.context() as patch:
        patch.setattr(program_store, "host_cpu", lambda: "another cpu without avx512")
        try:
            assert program_store._path(str(store_dir), "f", (), signature, 0) != here
        finally:
            program_store._environment.cache_clear()
    assert program_store._path(str(store_dir), "f", (), signature, 0) == here


def test_no_store_without_the_persistent_cache(tmp_path, monkeypatch):
    from tpu_interactive.backend import compile_log

    monkeypatch.setattr(compile_log, "persistent_cache_dir", lambda: None)
    program = op_jit.Program(functools.partial(_scaled, 5.0), functools.partial(_scaled, 5.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert program(jnp.ones(2)).tolist() == [6.0, 6.0]
    assert program_store.load(program.name, (), op_jit._signature([jnp.ones(2)]), 0) == (None, None)


def test_zeros_of_a_new_shape_compile_nothing():
    """torch.zeros / zeros_like (an optimizer's moments) of a new shape: small ones are copied from
    the host instead of compiling a program per shape; zero_ keeps them."""
    tpu_interactive.reset_stats()
    small = torch.zeros(37, 5, device="tpu")
    like = torch.zeros_like(small, dtype=torch.bfloat16)
    assert tpu_interactive.stats()["xla_compiles"] == 0
    assert small.cpu().equal(torch.zeros(37, 5)) and like.dtype == torch.bfloat16 and not like.cpu().any()
    small.add_(2.0).zero_()  # a written buffer: zero_ really zeroes it
    assert not small.cpu().any()
    big = torch.zeros(1 << 21, device="tpu")  # 8 MiB: one program (a host copy would cost more)
    assert not big.cpu().any() and tpu_interactive.stats()["xla_compiles"] >= 1


def test_a_stored_program_is_not_also_written_to_jaxs_cache(tmp_path):
    """The store keeps it (a later process finds it before lowering): a second serialized copy in
    JAX's cache would only cost the compiling thread time and the cache directory space."""
    (tmp_path / "store").mkdir()
    (tmp_path / "jax").mkdir()
    stored = _run_step(str(tmp_path / "store"))
    _run_step(str(tmp_path / "jax"), store=False)

    def jax_entries(folder) -> int:
        return sum(1 for name in os.listdir(folder) if not name.startswith(("tpu-", ".")))

    assert stored["counts"]["stored"] > 20
    assert jax_entries(tmp_path / "store") <= jax_entries(tmp_path / "jax") - stored["counts"]["stored"]


_SHARDED = textwrap.dedent("""
    import json, os
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from tpu_interactive.backend import program_store
    folder = os.environ["TPU_INTERACTIVE_CACHE_DIR"]
    x = jax.device_put(jnp.arange(8.0), NamedSharding(jax.make_mesh((2,), ("x",)), PartitionSpec("x")))
    before = set(os.listdir(folder))
    compiled = program_store.compile_and_store(jax.jit(lambda v: v * 7 + 1).lower(x), os.path.join(folder, "tpu-x-cache"))
    print("RESULT " + json.dumps({"out": [float(v) for v in compiled(x)], "new": sorted(set(os.listdir(folder)) - before)}))
""")


def test_a_program_the_store_does_not_keep_still_goes_to_jaxs_cache(tmp_path):
    """A program over several devices is not stored (one device's executables only): JAX's cache then
    keeps it, as before the store skipped JAX's writes for the programs it keeps."""
    result = run_result_script(_SHARDED, {"TPU_INTERACTIVE_CACHE_DIR": str(tmp_path),
                                          "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert result["out"] == [7.0 * v + 1 for v in range(8)]
    assert result["new"] and not any(name.startswith("tpu-") for name in result["new"])


def test_a_program_reuses_its_last_executable_only_for_the_same_signature():
    """Program.executable skips hashing the signature when the inputs' aval and sharding objects are
    the last call's (a loop's); a call with another shape, dtype, weak type or donation still gets
    its own executable, and alternating between them never hands one the other's."""
    program = op_jit.Program(functools.partial(_scaled, 2.0), functools.partial(_scaled, 2.0))
    small, big, ints = jnp.ones(2), jnp.ones(3), jnp.ones(2, jnp.int32)
    for _ in range(2):
        for x in (small, big, small, ints, program(small)):
            out, expected = program(x), _scaled(2.0, x)
            assert out.shape == expected.shape and out.dtype == expected.dtype
            assert out.tolist() == expected.tolist()
    weak = jax.device_put(3.0)  # a Python scalar's weak type: a signature of its own
    assert program(weak).weak_type and not program(jnp.float32(3.0)).weak_type
    donating = program.executable([jnp.ones(2)], 1)
    assert donating is not program.executable([jnp.ones(2)], 0)
    assert program.executable([jnp.ones(2)], 1) is donating
