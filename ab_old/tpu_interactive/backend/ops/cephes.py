"""Coefficient tables of the Cephes ports in special.py (data only), read from ``cephes.json``.

From ATen/native/Math.h (Cephes Math Library, 3-clause BSD), highest degree first. The JSON keeps
the source's decimal literals; each table is a tuple of floats (hashable, for jit's static args)."""
from __future__ import annotations

import json
from pathlib import Path

_TABLES = json.loads(Path(__file__).with_name("cephes.json").read_text())


def _table(name: str) -> dict[str, tuple[float, ...]]:
    return {key: tuple(values) for key, values in _TABLES[name].items()}


# Euler-Maclaurin coefficients of Hurwitz zeta (ATen's zeta)
ZETA_A: tuple[float, ...] = tuple(_TABLES["ZETA_A"])
AIRY_AI = _table("AIRY_AI")
BESSEL_J0 = _table("BESSEL_J0")
BESSEL_J1 = _table("BESSEL_J1")
_ASYMPTOTIC = ("PP", "PQ", "QP", "QQ")  # Y0/Y1 share J0/J1's asymptotic tables
BESSEL_Y0 = {**{k: BESSEL_J0[k] for k in _ASYMPTOTIC}, **_table("BESSEL_Y0")}
BESSEL_Y1 = {**{k: BESSEL_J1[k] for k in _ASYMPTOTIC}, **_table("BESSEL_Y1")}
MODIFIED_BESSEL_K0 = _table("MODIFIED_BESSEL_K0")
MODIFIED_BESSEL_K1 = _table("MODIFIED_BESSEL_K1")
# same Chebyshev coefficients; only the final exp(x) scaling differs
SCALED_MODIFIED_BESSEL_K0 = MODIFIED_BESSEL_K0
SCALED_MODIFIED_BESSEL_K1 = MODIFIED_BESSEL_K1
