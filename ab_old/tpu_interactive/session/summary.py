"""Plain-text views of the backend's state: the %%tpu cell report and the %tpu subcommands.

The widgets show the same data as HTML; these strings are also their text fallback (terminal
IPython, saved notebooks). No IPython here.
"""
from __future__ import annotations

from typing import Any, Mapping

from tpu_interactive import backend
from tpu_interactive.backend import compiler
from tpu_interactive.backend import stats as backend_stats
from tpu_interactive.backend.compile_log import persistent_cache_dir

from . import namespace
from .fmt import fmt_bytes, fmt_seconds, fmt_shape, short_op, text_table
from .tracker import TRACKER, CellDelta


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _top(counter: Mapping[str, float], n: int) -> list[tuple[str, float]]:
    return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _counts(counter: Mapping[str, int], n: int = 6) -> str:
    items = _top(counter, n)
    text = ", ".join(f"{short_op(k)} x{v}" for k, v in items)
    more = len(counter) - len(items)
    return text + (f", ... (+{more} more)" if more > 0 else "")


# ---------------------------------------------------------------- the %%tpu cell report
def cell_report(delta: CellDelta, *, sync: bool, compile_details: bool = False, profile: bool = False,
                top: int = 5) -> str:
    d = delta.diff
    op_counts, op_seconds = d.get("op_counts", {}), d.get("op_seconds", {})
    timing = "device time, synced per op" if sync else "dispatch time: async; --sync for device time"
    lines = [f"[tpu] cell: {fmt_seconds(delta.wall_seconds)} wall, sync {_on_off(sync)}"]
    total = sum(op_counts.values())
    if total:
        ranked = sorted(op_counts, key=lambda k: (-op_seconds.get(k, 0.0), -op_counts[k], k))[:top]
        compiling = d.get("xla_compile_op_seconds", {})
        tops = ", ".join(f"{short_op(k)} x{op_counts[k]} {fmt_seconds(op_seconds.get(k, 0.0))}"
                         + (f" ({fmt_seconds(compiling[k])} compiling)" if compiling.get(k, 0.0) >= 1e-3 else "")
                         for k in ranked)
        lines.append(f"  ops        {total} executed ({len(op_counts)} kinds); top by time ({timing}): {tops}")
    else:
        lines.append("  ops        none ran on tpu")
    lines += compile_lines(delta)
    lines += fused_lines(d.get("fused_segments", 0), d.get("recent_fused", []))
    fallbacks = d.get("fallback_counts", {})
    if fallbacks:
        calls = sum(fallbacks.values())
        lines.append(f"  fallbacks  {calls} op call{'s' if calls != 1 else ''} ran on CPU: {_counts(fallbacks)}")
    else:
        lines.append("  fallbacks  none (everything ran on tpu)")
    lines.append(f"  transfers  host->device {d.get('h2d_count', 0)} ({fmt_bytes(d.get('h2d_bytes', 0))}), "
                 f"device->host {d.get('d2h_count', 0)} ({fmt_bytes(d.get('d2h_bytes', 0))})")
    lines.append(f"  memory     {fmt_bytes(delta.memory_delta, signed=True)} -> {fmt_bytes(delta.live_after)} live, "
                 f"cell peak {fmt_bytes(delta.peak)}")
    if compile_details:
        lines.append(_compile_events(_cell_compiles(delta)))
    if profile:
        lines.append(op_table(op_counts, op_seconds, title="  per-op device time (sync mode; not jax.profiler):"))
    return "\n".join(lines)


def fused_lines(segments: int, recent: list[dict]) -> list[str]:
    """Fused eager mode's segments (the newest ``segments`` events of the ring): how many ran from a
    cached program, compiled, or ran op by op, and why each new program was compiled."""
    if not segments:
        return []
    events = recent[-segments:]
    modes = {m: sum(e["mode"] == m for e in events) for m in ("cached", "compiled", "op by op", "in pieces")}
    ops = sum(e["ops"] for e in events)
    lines = [f"  fused      {_plural(segments, 'segment')} of {ops} recorded ops: {modes['cached']} from a cached "
             f"program, {modes['compiled']} compiled, {modes['op by op']} op by op"
             + (f", {modes['in pieces']} in pieces" if modes["in pieces"] else "")]
    seen: set = set()
    for e in events:
        if e["mode"] != "cached" and (e["cause"], e["where"]) not in seen:
            seen.add((e["cause"], e["where"]))
            lines.append(f"             {e['mode']}: {e['cause']}; first op at {e['where'] or '?'}, "
                         f"flushed by {e['reason']} ({fmt_seconds(e['seconds'])})")
    return lines[:6]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def cell_xla_compiles(diff: Mapping[str, Any]) -> list[dict]:
    """The XLA compiles of one measured span (the newest ``xla_compiles`` events of the ring)."""
    n = diff.get("xla_compiles", 0)
    return diff.get("recent_xla_compiles", [])[-n:] if n else []


def compile_lines(delta: CellDelta) -> list[str]:
    """The cell's compiles: XLA programs (eager ops and compiled graphs), where they came from, and a
    note when compiling dominated the cell or one line keeps compiling for new shapes."""
    d = delta.diff
    n, seconds = d.get("xla_compiles", 0), d.get("xla_compile_seconds", 0.0)
    hits, misses = d.get("compile_hits", 0), d.get("compile_misses", 0)
    graphs = f"; torch.compile graphs: {misses} compiled, {hits} cached" if hits or misses else ""
    if not n:
        return [f"  compiles   none{graphs}"]
    share = 100 * seconds / delta.wall_seconds if delta.wall_seconds > 0 else 0.0
    disk = d.get("xla_disk_hits", 0)
    head = (f"  compiles   {_plural(n, 'XLA program')} ({fmt_seconds(seconds)}, {min(share, 100):.0f}% of the cell"
            + (f"; {disk} loaded from the persistent cache" if disk else "") + f"){graphs}")
    events = cell_xla_compiles(d)
    by_line: dict[tuple[str, str], list[dict]] = {}
    for e in events:
        by_line.setdefault((e["where"], e["source"]), []).append(e)
    ranked = sorted(by_line.items(), key=lambda kv: -sum(e["seconds"] for e in kv[1]))[:3]
    lines = [head]
    for (where, source), group in ranked:
        first = group[0]
        place = f"{where}" + (f" ({source})" if source else "") if where else "inside the library"
        lines.append(f"             {len(group)} at {place}: first {short_op(first['op'])} {first['shapes']}")
    lines += _compile_notes(events, seconds, share)
    return lines


def _compile_notes(events: list[dict], seconds: float, share: float) -> list[str]:
    notes = []
    if share >= 50 and seconds >= 0.5:
        notes.append("  note       most of this cell was compiling: each op compiles once per new input shape "
                     "(cached on disk for the next process); run the cell again for the warm speed, or run the "
                     "step as one program with tpu_interactive.compile_train_step / torch.compile(backend='tpu')")
    shapes_by_site: dict[str, dict[str, list[str]]] = {}  # line -> op -> distinct input shapes, in order
    for e in events:
        if e["where"]:
            seen = shapes_by_site.setdefault(e["where"], {}).setdefault(e["op"], [])
            if e["shapes"] not in seen:
                seen.append(e["shapes"])
    for where, ops in shapes_by_site.items():
        varying = {op: shapes for op, shapes in ops.items() if len(shapes) >= 3}
        if not varying or not TRACKER.first_warning(("recompile", where)):
            continue
        op, shapes = max(varying.items(), key=lambda kv: len(kv[1]))
        changes = " -> ".join(f"[{s}]" for s in shapes[:3]) + (" -> ..." if len(shapes) > 3 else "")
        others = sorted(short_op(o) for o in varying if o != op)
        notes.append(f"  note       {where} keeps compiling for new shapes: {short_op(op)} compiled for "
                     f"{len(shapes)} different inputs {changes}"
                     + (f" (also {', '.join(others)})" if others else "")
                     + ". Pad or bucket the varying length, use a static KV cache "
                     "(generate(cache_implementation='static')), or compile the loop")
    return notes


def _cell_compiles(delta: CellDelta) -> list[dict]:
    n = delta.diff.get("compile_hits", 0) + delta.diff.get("compile_misses", 0)
    events = delta.diff.get("recent_compiles", [])
    return events[-n:] if n else []


def _compile_events(events: list[dict]) -> str:
    if not events:
        return "  compile events: none in this cell"
    rows = [(e["name"], "hit" if e["hit"] else "miss", e["cause"], fmt_seconds(e["seconds"])) for e in events]
    return "  compile events:\n" + text_table(("graph", "", "cause", "time"), rows, indent="    ")


def op_table(op_counts: Mapping[str, int], op_seconds: Mapping[str, float], title: str = "", top: int = 20) -> str:
    if not op_counts:
        return (title + "\n" if title else "") + "  no ops recorded"
    total = sum(op_seconds.get(k, 0.0) for k in op_counts) or 1e-12
    ranked = sorted(op_counts, key=lambda k: (-op_seconds.get(k, 0.0), -op_counts[k], k))[:top]
    rows = [(short_op(k), op_counts[k], fmt_seconds(op_seconds.get(k, 0.0)),
             fmt_seconds(op_seconds.get(k, 0.0) / op_counts[k]), f"{100 * op_seconds.get(k, 0.0) / total:.0f}%")
            for k in ranked]
    table = text_table(("op", "count", "total", "mean", "share"), rows)
    more = len(op_counts) - len(ranked)
    return (title + "\n" if title else "") + table + (f"\n  ... {more} more op kinds" if more > 0 else "")


# ---------------------------------------------------------------- %tpu subcommands
def clear_compile_cache() -> str:
    compiler.clear_cache()
    return "compile cache cleared"


def status_text() -> str:
    info = backend.backend_info()
    cfg = backend.config
    mem = backend.memory_stats()
    s = backend_stats.snapshot()
    lines = [f"backend    {info.summary}"]
    lines += [f"WARNING    {w}" for w in info.warnings]
    lines.append(f"switches   sync {_on_off(cfg.sync)}, nan_check {_on_off(cfg.nan_check)}, "
                 f"pallas {_on_off(cfg.pallas)}, cpu_fallback {_on_off(cfg.cpu_fallback)}, fuse {_on_off(cfg.fuse)}")
    lines.append(f"memory     {fmt_bytes(mem['bytes_in_use'])} in use in {s['live_buffers']} buffers, "
                 f"peak {fmt_bytes(session_peak(mem))}, limit {fmt_bytes(mem['bytes_limit'])}")
    lines.append(f"ops        {sum(s['op_counts'].values())} executed, {sum(s['fallback_counts'].values())} "
                 f"fell back to CPU ({len(s['fallback_counts'])} kinds)")
    lines.append(f"compiles   {s['xla_compiles']} XLA programs ({fmt_seconds(s['xla_compile_seconds'])}, "
                 f"{s['xla_disk_hits']} from the persistent cache); torch.compile graphs: "
                 f"{s['compile_misses']} compiled, {s['compile_hits']} cached")
    if s.get("compile_ahead_calls"):
        lines.append(f"ahead      {s['compile_ahead_calls']} op calls ran after their programs compiled in the "
                     f"background ({fmt_seconds(s['compile_ahead_seconds'])} of compiling, overlapped; "
                     f"compile_ahead {_on_off(cfg.compile_ahead)})")
    return "\n".join(lines)


def session_peak(mem: Mapping[str, Any]) -> int:
    if mem.get("source") == "device":
        return mem["peak_bytes_in_use"]
    return max(mem["peak_bytes_in_use"], TRACKER.peak_now())


def memory_text(ns: Mapping[str, Any], top: int = 10) -> str:
    mem = backend.memory_stats()
    used, limit = mem["bytes_in_use"], mem["bytes_limit"]
    share = f" ({100 * used / limit:.0f}% of {fmt_bytes(limit)})" if limit else " (no limit reported)"
    lines = [f"bytes in use {fmt_bytes(used)}{share}, peak {fmt_bytes(session_peak(mem))} [source: {mem['source']}]"]
    if TRACKER.last is not None:
        last = TRACKER.last
        lines.append(f"previous cell {fmt_bytes(last.memory_delta, signed=True)}, peak {fmt_bytes(last.peak)}")
    live = namespace.live_tensors(ns)
    named = sum(t.nbytes for t in live)
    if live:
        rows = [(", ".join(t.names), fmt_shape(t.shape), t.dtype, fmt_bytes(t.nbytes)) for t in live[:top]]
        lines.append("largest live tpu tensors:\n" + text_table(("variable", "shape", "dtype", "bytes"), rows))
        if len(live) > top:
            lines.append(f"  ... {len(live) - top} more")
    else:
        lines.append("no tpu tensors in the namespace")
    unnamed = mem["tracked_bytes_in_use"] - named
    if unnamed > 0:
        lines.append(f"  {fmt_bytes(unnamed)} held elsewhere (autograd graph, temporaries, "
                     "objects not in the namespace)")
    return "\n".join(lines)


def cache_text() -> str:
    s = backend_stats.snapshot()
    hits, misses = s["compile_hits"], s["compile_misses"]
    rate = f"{100 * hits / (hits + misses):.0f}%" if hits + misses else "-"
    cache_dir = persistent_cache_dir()
    lines = [f"compile cache: {s['xla_compiles']} XLA programs compiled ({fmt_seconds(s['xla_compile_seconds'])}), "
             f"{s['xla_disk_hits']} of them loaded from the persistent cache "
             f"({cache_dir if cache_dir else 'off: TPU_INTERACTIVE_CACHE_DIR is empty'})"]
    by_op = _top(s["xla_compile_counts"], 8)
    if by_op:
        lines.append("  by op or graph: " + ", ".join(f"{short_op(k)} x{v}" for k, v in by_op))
    recent = s["recent_xla_compiles"][-5:]
    if recent:
        rows = [(short_op(e["op"]), e["shapes"], "disk" if e["from_disk"] else "compiled", fmt_seconds(e["seconds"]),
                 e["where"]) for e in recent]
        lines.append("  latest:\n" + text_table(("op", "inputs", "", "time", "at"), rows, indent="    "))
    lines.append(f"torch.compile graph cache: {hits} hits, {misses} misses, hit rate {rate}, "
                 f"{fmt_seconds(s['compile_seconds'])} compiling")
    if s["fused_segments"]:
        lines.append(f"fused eager segments: {s['fused_cached']} cached, {s['fused_compiled']} compiled, "
                     f"{s['fused_op_by_op']} op by op, {s['fused_in_pieces']} in pieces ({s['fused_ops']} ops recorded)"
                     + (f", {s['fused_not_recorded']} not recorded (new shapes each time: run as plain eager)"
                        if s["fused_not_recorded"] else ""))
        lines += fused_lines(min(s["fused_segments"], 5), s["recent_fused"])[1:]
    events = s["recent_compiles"]
    if events:
        lines.append(_compile_events(events[-10:]).replace("compile events:", "recent compiles:"))
    return "\n".join(lines)


def placement_text(ns: Mapping[str, Any]) -> str:
    rows = [(p.name + (" (mixed!)" if p.mixed else ""), p.device, p.shape, p.dtype, fmt_bytes(p.nbytes),
             "yes" if p.requires_grad else "no") for p in namespace.placements(ns)]
    if not rows:
        return "no tensors or nn.Modules in the namespace"
    return text_table(("variable", "device", "shape", "dtype", "bytes", "requires_grad"), rows)


def fallbacks_text() -> str:
    s = backend_stats.snapshot()
    fb, dec = s["fallback_counts"], s["decomposition_counts"]
    lines = []
    if fb:
        lines.append(f"{len(fb)} ops ran on CPU (copied to host and back; they need lowerings):")
        lines.append(text_table(("op", "calls"), [(k, v) for k, v in _top(fb, len(fb))]))
    else:
        lines.append("no CPU fallbacks: every op ran on tpu")
    if dec:
        lines.append(f"{len(dec)} ops ran as torch._decomp decompositions (on tpu):")
        lines.append(text_table(("op", "calls"), [(k, v) for k, v in _top(dec, len(dec))]))
    if not backend.config.cpu_fallback:
        lines.append("cpu_fallback is off: ops without a lowering raise NotImplementedError")
    return "\n".join(lines)


def ops_text(top: int = 20) -> str:
    s = backend_stats.snapshot()
    timing = "device time (sync on)" if backend.config.sync else "dispatch time (sync off: async)"
    text = op_table(s["op_counts"], s["op_seconds"], title=f"ops since the last reset, by {timing}:", top=top)
    return text + skipped_text()


def lowerings_text(substring: str = "") -> str:
    """The registry of lowerings (``registry.table()``) as a table: op, module, function, promote,
    dtypes (the result dtypes CPU's kernel takes) and flags (raw: torch values in and out; spec: reads
    torch's output metadata; pallas: has a Pallas variant; data-dependent: no meta kernel), for the
    ops whose name contains ``substring``."""
    from tpu_interactive.backend.registry import table

    rows = [r for r in table() if substring.lower() in r["op"].lower()]
    if not rows:
        return f"no lowering's op name contains {substring!r}"
    lines = [[r["op"], r["module"], r["function"], r["promote"] or "-", r["dtypes"] or "any", _flags(r)] for r in rows]
    title = f"{len(rows)} lowerings" + (f" of ops containing {substring!r}" if substring else "") + ":"
    return title + "\n" + text_table(["op", "module", "function", "promote", "dtypes", "flags"], lines)


def _flags(row: Mapping[str, Any]) -> str:
    flags = [name for name, on in (("raw", row["raw"]), ("spec", row["needs_spec"]), ("pallas", row["pallas"]),
                                   ("data-dependent", not row["meta"])) if on]
    return " ".join(flags) or "-"


def skipped_text() -> str:
    """The lowerings the installed torch cannot take (removed ops, version-bound lowerings), or ''."""
    from tpu_interactive.backend.registry import TORCH_VERSION, skipped

    rows = skipped()
    if not rows:
        return ""
    lines = [(f"\nlowerings skipped with torch {TORCH_VERSION} (those ops, where torch has them, run through "
              "torch's decompositions or the CPU fallback):")]
    lines += [f"  {op}: {reason}" for op, reason in rows.items()]
    return "\n".join(lines)
