"""``python -m tpu_interactive.conformance``: run the conformance checks and write their JSON report."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from . import conformance
from .conformance import DEFAULT_TIMEOUT_S, Result, find_ops, format_table, op_key, run, summarize
from .tables import CI_SUBSET


def _select_ops(args) -> list:
    if args.ops:
        return find_ops([o.strip() for o in args.ops.split(",") if o.strip()])
    if args.subset == "ci":
        return find_ops(CI_SUBSET)
    return find_ops()


def _child(args) -> int:
    """Run the given ops, one JSON line per result (used by the crash-isolating parent)."""
    ops = _select_ops(args)
    with open(args.jsonl, "a") as sink:
        for opinfo in ops:
            sink.write(json.dumps({"start": op_key(opinfo)}) + "\n")
            sink.flush()
            for r in run([opinfo], args.dtypes.split(","), grad=args.grad, max_samples=args.max_samples,
                         timeout_s=args.timeout, forward=not args.grad_only):
                sink.write(json.dumps(r.to_json()) + "\n")
                sink.flush()
            sink.write(json.dumps({"done": op_key(opinfo)}) + "\n")
            sink.flush()
    return 0


def _isolated(args, keys: list[str]) -> list[Result]:
    """Run in child processes; an op that crashes the interpreter is recorded as an error."""
    jsonl = args.json + ".partial.jsonl"
    open(jsonl, "w").close()
    remaining = list(keys)
    while remaining:
        cmd = [sys.executable, "-m", "tpu_interactive.conformance", "--child", "--jsonl", jsonl,
               "--ops", ",".join(remaining), "--dtypes", args.dtypes, "--max-samples", str(args.max_samples or 0),
               "--timeout", str(args.timeout)] + (["--grad"] if args.grad else []) + \
              (["--grad-only"] if args.grad_only else [])
        proc = subprocess.run(cmd)
        done, started = set(), None
        with open(jsonl) as f:
            for line in f:
                row = json.loads(line)
                if "start" in row:
                    started = row["start"]
                elif "done" in row:
                    done.add(row["done"])
        remaining = [k for k in remaining if k not in done]
        if proc.returncode != 0 and remaining:
            crashed = started if started in remaining else remaining[0]
            with open(jsonl, "a") as f:
                f.write(json.dumps(Result(crashed, "float32", "forward", "error",
                                          detail=f"interpreter crashed (exit {proc.returncode})").to_json()) + "\n")
                f.write(json.dumps({"done": crashed}) + "\n")
            remaining.remove(crashed)
        elif proc.returncode == 0:
            break
    return _read_jsonl(jsonl)


def _read_jsonl(paths: str) -> list[Result]:
    """Results of one or more (comma-separated) .partial.jsonl files; a later file's row for the same
    (op, dtype, kind) replaces an earlier one (a sweep split over runs, failing rows re-run after a fix)."""
    rows: dict[tuple, dict] = {}
    for path in paths.split(","):
        with open(path) as f:
            for row in (json.loads(line) for line in f if line.strip()):
                if "outcome" in row:
                    rows[(row["op"], row["dtype"], row["kind"])] = row
    return [Result(**row) for row in rows.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_interactive.conformance", description=conformance.__doc__.split("\n")[0])
    parser.add_argument("--report", action="store_true", help="print the human-readable table")
    parser.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    parser.add_argument("--dtypes", default="float32,bfloat16,int64,bool")
    parser.add_argument("--json", default="conformance_report.json")
    parser.add_argument("--subset", choices=("ci", "full"), default=None,
                        help="ops to run when --ops is not given (default: ci; full with --errors)")
    parser.add_argument("--errors", action="store_true",
                        help="check OpInfo error_inputs and out= misuse instead of values (conformance_errors)")
    parser.add_argument("--grad", action="store_true", help="also compare float32 gradients")
    parser.add_argument("--grad-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-samples", type=int, default=5, help="samples per op and dtype (0 = all)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per sample")
    parser.add_argument("--isolate", action="store_true",
                        help="run in child processes so an interpreter crash only loses one op")
    parser.add_argument("--from-jsonl", help="summarize the results of earlier (possibly unfinished) --isolate runs "
                        "from their .partial.jsonl files (comma-separated; later rows replace earlier ones) "
                        "instead of running anything")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jsonl", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.max_samples = args.max_samples or None
    args.subset = args.subset or ("full" if args.errors else "ci")
    if args.child:
        return _child(args)
    if args.errors:
        return _errors_main(args)
    start = time.perf_counter()
    if args.from_jsonl:
        results = _read_jsonl(args.from_jsonl)
    elif args.isolate:
        results = _isolated(args, [op_key(o) for o in _select_ops(args)])
    else:
        results = list(run(_select_ops(args), args.dtypes.split(","), grad=args.grad, max_samples=args.max_samples,
                           timeout_s=args.timeout, forward=not args.grad_only))
    wall = time.perf_counter() - start
    summary = summarize(results)
    summary["wall_seconds"] = round(wall, 1)
    summary["config"] = {"subset": None if args.ops else args.subset, "dtypes": args.dtypes,
                         "max_samples": args.max_samples, "grad": args.grad, "torch": torch.__version__}
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "results": [r.to_json() for r in results]}, f, indent=1)
    if args.report:
        print(format_table(results, summary))
    print(f"\n{len(results)} results in {wall:.0f}s; JSON written to {args.json}")
    return 0


def _errors_main(args) -> int:
    from . import conformance_errors as E

    results, wall = E.run_all(_select_ops(args))
    summary = E.summarize(results)
    summary["wall_seconds"] = round(wall, 1)
    with open(args.json, "w") as f:
        json.dump({"summary": summary, "results": [r.to_json() for r in results]}, f, indent=1)
    print(E.format_report(summary))
    print(f"\n{len(results)} error cases in {wall:.0f}s; JSON written to {args.json}")
    return 0
