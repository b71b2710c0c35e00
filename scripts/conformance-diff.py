#!/usr/bin/env python3
"""Compares two outputs of the conformance probe (tests/conformance/probe.c or probe.py): the
reference (natively on a GPU) and the candidate (through gpufuse on the same GPU, or an emulated
model), and prints every difference that is not an intended one.

    scripts/conformance-diff.py NATIVE.txt GPUFUSE.txt [--known FILE] [--quiet]

Lines are `key = value`; other lines (and `#` comments) are ignored. Keys that start with
`intended.` may differ only when one of INTENDED below names them, each with its reason (the
same list is in docs/conformance.md). `--known FILE`: more keys expected to differ, one regular
expression per line (`#` comments allowed), e.g. the figures in which an emulated model differs
from the GPU it is named after; they are listed as known, not as differences.

Exit status: 0 when the only differences are intended or known, 1 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import re
import sys

# (pattern of keys, why they may differ). Keep it short: every item is a documented, deliberate
# difference between a program's view of a GPU natively and through gpufuse.
INTENDED: list[tuple[str, str]] = [
    (r"^intended\.(dev\d+\.total_mem|cuda_python\.total_mem)$",
     "device memory: a gpufuse session sees its slice (--vram) as the whole device"),
    (r"^intended\.(ctx\.mem_info\.(total|free)|cuda_python\.mem_get_info|torch\.cuda\.mem_get_info"
     r"|cupy\.runtime\.memGetInfo)$",
     "total is the slice; free also depends on everything else on the GPU at that moment"),
    (r"^intended\.(torch|cupy)\.props\.(total_?memory|totalGlobalMem)$",
     "the slice, as above"),
    (r"^intended\.(dev\d+\.uuid|(torch|cupy)\.props\.(uuid|luid\w*))$",
     "device identity: a session's device may be a different (or a virtual) GPU of the pool"),
    (r"^intended\.(dev\d+\.pci_bus_id|(dev\d+|cuda_python)\.attr\.0(33|34|50)\.PCI_\w+"
     r"|(torch|cupy)\.props\.pci\w*)$",
     "PCI location: the server's GPU may sit at another bus address than a local one would"),
    (r"^ptr\.\w+\.attrs?\.15\.IS_GPU_DIRECT_RDMA_CAPABLE$",
     "GPUDirect RDMA needs the GPU in the application's own host: never through gpufuse"),
    (r"^export\.(00000000_zero|195bcbf4_heap_access)$",
     "an export table the driver does not have is answered with a table of fallbacks that "
     "return 801, never NULL: a library that asks for a newer driver's table and does not "
     "check the answer must not crash (docs/export-tables.md)"),
]


def parse(path: str) -> dict[str, str]:
    facts: dict[str, str] = {}
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError as e:
        sys.exit(f"conformance-diff: {e}")
    for line in text.splitlines():
        if not line or line.startswith("#") or " = " not in line:
            continue
        k, v = line.split(" = ", 1)
        facts[k.strip()] = v.strip()
    return facts


def load_known(path: str | None) -> list[re.Pattern]:
    if not path:
        return []
    pats = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if line:
            pats.append(re.compile(line))
    return pats


def reason_for(key: str) -> str | None:
    for pat, why in INTENDED:
        if re.search(pat, key):
            return why
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", help="the native output")
    ap.add_argument("candidate", help="the output through gpufuse")
    ap.add_argument("--known", help="file of key patterns expected to differ")
    ap.add_argument("--quiet", action="store_true", help="print only the unexplained differences")
    a = ap.parse_args()
    ref, cand = parse(a.reference), parse(a.candidate)
    if not ref or not cand:
        print(f"conformance-diff: no `key = value` lines in "
              f"{a.reference if not ref else a.candidate}", file=sys.stderr)
        return 2
    known = load_known(a.known)
    unexplained: list[str] = []
    intended: list[str] = []
    known_hits: list[str] = []
    for key in sorted(set(ref) | set(cand)):
        r, c = ref.get(key), cand.get(key)
        if r == c:
            continue
        text = f"{key}: {r if r is not None else '(missing)'} -> {c if c is not None else '(missing)'}"
        why = reason_for(key)
        if why:
            intended.append(f"{text}   [{why}]")
        elif any(p.search(key) for p in known):
            known_hits.append(text)
        else:
            unexplained.append(text)
    if not a.quiet:
        for t in intended:
            print(f"intended: {t}")
        for t in known_hits:
            print(f"known:    {t}")
    for t in unexplained:
        print(f"DIFF:     {t}")
    # A known pattern that no longer matches a difference is a gap closed: the list must say so.
    stale = [p.pattern for p in known
             if not any(p.search(t.split(": ", 1)[0]) for t in known_hits)]
    for p in stale:
        print(f"STALE:    {p}   (matches no difference any more: remove it from {a.known})")
    print(f"conformance-diff: {len(ref)} reference facts, {len(cand)} candidate facts; "
          f"{len(unexplained)} unexplained difference(s), {len(intended)} intended, "
          f"{len(known_hits)} known, {len(stale)} stale known pattern(s)")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
