"""Small text formatting helpers shared by the magics and the widgets (no IPython here)."""
from __future__ import annotations

from typing import Sequence


def fmt_bytes(n: int | float | None, signed: bool = False) -> str:
    if n is None:
        return "-"
    sign = ""
    if signed:
        sign = "+" if n > 0 else ("-" if n < 0 else "±")
        n = abs(n)
    elif n < 0:
        sign, n = "-", -n
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            text = f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
            return sign + text
        n /= 1024
    return sign + str(n)


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def short_op(name: str) -> str:
    """'aten::addmm.default' -> 'addmm'; other overloads keep their suffix ('sum.IntList_out')."""
    name = name.removeprefix("aten::")
    return name.removesuffix(".default")


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)
