#!/usr/bin/env python3
"""Static scan for the export-table UUIDs an x86-64 ELF library passes to cuGetExportTable.

NVIDIA's libraries fetch private driver tables with
``cuGetExportTable(const void **table, const CUuuid *id)``; the shim has to know every ``id`` any
of them can ask for.  This script finds them without running anything:

1. **Seeds.** Every occurrence of a known UUID (``KNOWN`` below, 16 bytes in memory order) in the
   file's allocated sections, plus every pointer slot that a ``R_X86_64_RELATIVE`` relocation
   points at such an occurrence.
2. **References.** All RIP-relative references to the seeds in executable sections, found with
   numpy: for every byte position ``p`` the 4 bytes there, read as a signed displacement, name the
   address ``vaddr(p) + 4 + disp``; a reference is a position whose target is a seed (up to 4 bytes
   below, for instructions with a trailing immediate).  Each hit is confirmed with capstone (the
   decoded instruction really addresses the seed through ``rip``).
3. **Wrappers.** From each reference the code is decoded forward, following register copies of the
   address, to the first call (or tail jump) that receives it in ``rsi`` (the second argument).
   That call's target is a *wrapper*: a direct function (``call rel32``; named when it is a PLT
   stub), a function-pointer slot (``call [rip+G]``, or ``mov reg,[rip+G]`` ... ``call reg``), or
   an indirect call that cannot be followed statically (reported).  Calls to known non-wrappers
   (memcmp, memcpy, ...) are recorded as "other uses" and ignored; an internal function is
   accepted as a wrapper only if its body makes an indirect call/jump or calls a named
   ``cuGetExportTable``/``cudaGetExportTable``/another wrapper.
4. **Call sites.** Every call of every wrapper: ``E8``/``E9`` ``rel32`` whose target is the
   wrapper (the same numpy pass as step 2, since a call's target is also ``vaddr(p) + 4 +
   rel32``), or every use of a pointer slot followed by the call through it.  Before each call the
   code is decoded backwards (from several start offsets ``call-N``, keeping the longest decoding
   that lands exactly on the call) and ``rsi`` is traced back through register copies to
   ``lea rsi,[rip+X]`` (the UUID is the 16 bytes at ``X``) or ``mov rsi,[rip+P]`` with ``P`` a
   relocated pointer to ``X``.  Anything else is reported as *unresolved* with its address.
5. **Iterate.** UUIDs proven in step 4 become seeds; repeat steps 2-4 until no new wrapper shows.

Cross-check ("candidates", not proven): the 16-byte values next to every seed/proven UUID (same
16-byte stride, a few entries either way) that look random (>= 12 distinct bytes, not text).

Usage:  export_table_scan.py LIB... [--json]
Needs python3, numpy, capstone.  Libraries that contain neither a known UUID nor the string
``cuGetExportTable`` are reported as skipped.
"""

import argparse
import glob
import json
import mmap
import os
import struct
import sys
import uuid as uuidmod

import numpy as np
import capstone
from capstone import x86 as cx86

# Known UUIDs, hex in memory order -> name.
KNOWN = {
    "6bd5fb6c5bf4e74a8987d93912fd9df9": "CUDART_INTERFACE",
    "a094798c2e742e7493f20800200c0a66": "hooks",
    "42d85a8123f6cb478298f6e78a3aecdc": "TOOLS_TLS",
    "c693336e1121df11a8c368f355d89593": "context-local storage (CLS)",
    "263e88607cd2614392f6bbd5006dfa7e": "context wrapper",
    "d4082055bde6704b8d34ba123c66e1f2": "integrity check",
    "f8cff95121468b4eb9e2fb469e7c0dd9": "cudart (refused)",
    "21318c60971432488ca641ff7324c8f2": "tools context (CU_ETID_ToolsContext)",
    "6e163fbeb958444d835ce182aff1991e": "tools module (UUID_TOOLS_MODULE)",
    "da9151d33ae6cc41a5c04f26d533e328": "NVRTC (refused)",
    "1734dc26800d47458726c0f1e7dd8bca": "cuBLASLt",
    "0ca50b8c1004929a89a7d0df10e77286": "known 0ca50b8c",
    "195bcbf4d67d024aacc51d29cea631ae": "known 195bcbf4",
    "b10541e1f7c7c74a9f64f223be99f1e2": "known b10541e1",
}

# Named call targets that take a UUID pointer in rsi but are not driver wrappers.
NOT_WRAPPERS = {"memcmp", "bcmp", "memcpy", "memmove", "strncmp", "strcmp", "__memcpy_chk",
                "memset", "strlen", "fwrite", "printf", "fprintf", "snprintf", "sprintf"}
EXPORT_TABLE_NAMES = {"cuGetExportTable", "cudaGetExportTable"}

FWD_BYTES = 0x180      # forward window after a reference
BACK_BYTES = 0x80      # backward window before a call site
BODY_BYTES = 0x400     # window used to check a wrapper's body

SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
SHT_NOBITS, SHT_RELA, SHT_DYNSYM, SHT_SYMTAB = 8, 4, 11, 2
R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE = 1, 6, 7, 8


def canonical(b):
    """16 bytes in memory order -> 8-4-4-4-12 form of the same bytes (no swapping)."""
    return str(uuidmod.UUID(bytes=bytes(b)))


# --------------------------------------------------------------------------------------------
# ELF
# --------------------------------------------------------------------------------------------

class Elf:
    """Minimal ELF64 little-endian reader: sections, segments, relocations, symbols."""

    def __init__(self, path):
        self.path = path
        self.f = open(path, "rb")
        self.mm = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
        mm = self.mm
        if mm[:4] != b"\x7fELF" or mm[4] != 2 or mm[5] != 1:
            raise ValueError("not an ELF64 little-endian file")
        (e_phoff, e_shoff) = struct.unpack_from("<QQ", mm, 0x20)
        (e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = struct.unpack_from("<HHHHH", mm, 0x36)
        if struct.unpack_from("<H", mm, 0x12)[0] != 62:
            raise ValueError("not x86-64")
        self.loads = []
        for i in range(e_phnum):
            p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, _ = \
                struct.unpack_from("<IIQQQQQQ", mm, e_phoff + i * e_phentsize)
            if p_type == 1:
                self.loads.append((p_vaddr, p_offset, p_filesz, p_memsz))
        raw = []
        for i in range(e_shnum):
            raw.append(struct.unpack_from("<IIQQQQIIQQ", mm, e_shoff + i * e_shentsize))
        strtab_off = raw[e_shstrndx][4] if e_shnum else 0
        self.sections = []
        for (name, typ, flags, addr, off, size, link, info, align, entsize) in raw:
            end = mm.find(b"\0", strtab_off + name)
            self.sections.append(dict(name=mm[strtab_off + name:end].decode("ascii", "replace"),
                                      type=typ, flags=flags, addr=addr, off=off, size=size,
                                      link=link, entsize=entsize))
        self.exec_secs = [s for s in self.sections
                          if s["flags"] & SHF_EXECINSTR and s["type"] != SHT_NOBITS and s["size"]]
        self._load_relocs()

    # address mapping ------------------------------------------------------------------------
    def off_of(self, vaddr):
        for (va, off, filesz, memsz) in self.loads:
            if va <= vaddr < va + filesz:
                return off + vaddr - va
        return None

    def vaddr_of(self, off):
        for (va, foff, filesz, memsz) in self.loads:
            if foff <= off < foff + filesz:
                return va + off - foff
        return None

    def section_of(self, vaddr):
        for s in self.sections:
            if s["flags"] & SHF_ALLOC and s["addr"] <= vaddr < s["addr"] + s["size"]:
                return s
        return None

    def read(self, vaddr, n):
        s = self.section_of(vaddr)
        if s is None or s["type"] == SHT_NOBITS:
            return None
        off = self.off_of(vaddr)
        if off is None:
            return None
        return bytes(self.mm[off:off + n])

    def is_exec(self, vaddr):
        s = self.section_of(vaddr)
        return bool(s and s["flags"] & SHF_EXECINSTR)

    # relocations and symbols ----------------------------------------------------------------
    def _symbols(self, sec):
        strsec = self.sections[sec["link"]]
        n = sec["size"] // 24
        syms = np.frombuffer(self.mm, dtype=np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                                                      ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]),
                             count=n, offset=sec["off"])
        return syms, strsec

    def _symname(self, strsec, idx):
        start = strsec["off"] + idx
        end = self.mm.find(b"\0", start)
        return self.mm[start:end].decode("ascii", "replace")

    def _load_relocs(self):
        """slot_names: address -> symbol name (GOT/PLT slots); relative: (slot addresses, addends)."""
        self.slot_names = {}
        rel_off, rel_add = [], []
        dt = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
        for sec in self.sections:
            if sec["type"] != SHT_RELA or not sec["size"]:
                continue
            rel = np.frombuffer(self.mm, dtype=dt, count=sec["size"] // 24, offset=sec["off"])
            typ = rel["info"] & 0xffffffff
            m = typ == R_X86_64_RELATIVE
            rel_off.append(rel["offset"][m].astype(np.int64))
            rel_add.append(rel["addend"][m])
            symsec = self.sections[sec["link"]] if sec["link"] else None
            if symsec is None or symsec["type"] not in (SHT_DYNSYM, SHT_SYMTAB):
                continue
            syms, strsec = self._symbols(symsec)
            for r in rel[(typ == R_X86_64_GLOB_DAT) | (typ == R_X86_64_JUMP_SLOT) | (typ == R_X86_64_64)]:
                symidx = int(r["info"] >> 32)
                if symidx:
                    self.slot_names[int(r["offset"])] = self._symname(strsec, int(syms[symidx]["name"]))
        if rel_off:
            self.rel_slots = np.concatenate(rel_off)
            self.rel_addends = np.concatenate(rel_add)
        else:
            self.rel_slots = np.zeros(0, np.int64)
            self.rel_addends = np.zeros(0, np.int64)
        self.function_syms = {}
        for sec in self.sections:
            if sec["type"] in (SHT_DYNSYM, SHT_SYMTAB) and sec["size"]:
                syms, strsec = self._symbols(sec)
                funcs = syms[((syms["info"] & 0xf) == 2) & (syms["value"] != 0)]
                for s in funcs:
                    self.function_syms.setdefault(int(s["value"]), self._symname(strsec, int(s["name"])))

    def pointer_target(self, slot):
        """The address a RELATIVE relocation stores at `slot`, if any."""
        idx = np.nonzero(self.rel_slots == slot)[0]
        return int(self.rel_addends[idx[0]]) if len(idx) else None

    def slots_pointing_to(self, targets):
        m = np.isin(self.rel_addends, np.asarray(sorted(targets), dtype=np.int64))
        return [(int(s), int(a)) for s, a in zip(self.rel_slots[m], self.rel_addends[m])]

    def find_all(self, needle):
        """File offsets of every occurrence of `needle`."""
        out, i = [], self.mm.find(needle)
        while i != -1:
            out.append(i)
            i = self.mm.find(needle, i + 1)
        return out

    # numpy scan of rel32 / rip-relative displacements ----------------------------------------
    def scan_disp32(self, targets, slack=4, chunk=1 << 25):
        """Positions p (vaddr of a 4-byte field in an executable section) with
        vaddr(p) + 4 + int32(p) in [T - slack, T] for some T in targets.
        Returns a list of (p, T, T - (vaddr(p)+4+disp), byte before p)."""
        tarr = np.asarray(sorted(set(targets)), dtype=np.int64)
        hits = []
        if not len(tarr):
            return hits
        for sec in self.exec_secs:
            base, off, size = sec["addr"], sec["off"], sec["size"]
            for start in range(0, size, chunk):
                n = min(chunk + 3, size - start)
                buf = np.frombuffer(self.mm, dtype=np.uint8, count=n, offset=off + start)
                for k in range(4):
                    cnt = (n - k) // 4
                    if cnt <= 0:
                        continue
                    d = buf[k:k + 4 * cnt].view("<i4").astype(np.int64)
                    pos = np.arange(cnt, dtype=np.int64) * 4 + k
                    if start + k + 4 * cnt > size:  # never past the section
                        cnt = (size - start - k) // 4
                        d, pos = d[:cnt], pos[:cnt]
                    tgt = d + (pos + (base + start + 4))
                    idx = np.searchsorted(tarr, tgt)
                    idx[idx == len(tarr)] = len(tarr) - 1
                    diff = tarr[idx] - tgt
                    for j in np.nonzero((diff >= 0) & (diff <= slack))[0]:
                        p = int(pos[j]) + start
                        prev = buf[pos[j] - 1] if pos[j] > 0 else (self.mm[off + start - 1] if start else 0)
                        hits.append((base + p, int(tarr[idx[j]]), int(diff[j]), int(prev)))
        # positions in overlapping chunk tails are seen twice
        return sorted(set(hits))

    def exec_bytes(self, vaddr, n):
        for sec in self.exec_secs:
            if sec["addr"] <= vaddr < sec["addr"] + sec["size"]:
                n = min(n, sec["addr"] + sec["size"] - vaddr)
                o = sec["off"] + vaddr - sec["addr"]
                return bytes(self.mm[o:o + n])
        return b""

    def exec_bytes_before(self, vaddr, n):
        for sec in self.exec_secs:
            if sec["addr"] < vaddr <= sec["addr"] + sec["size"]:
                start = max(sec["addr"], vaddr - n)
                o = sec["off"] + start - sec["addr"]
                return start, bytes(self.mm[o:o + vaddr - start])
        return vaddr, b""


# --------------------------------------------------------------------------------------------
# Disassembly helpers
# --------------------------------------------------------------------------------------------

MD = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
MD.detail = True

_SUB = {}
for _r64, _subs in {
        "rax": "eax ax al ah", "rbx": "ebx bx bl bh", "rcx": "ecx cx cl ch", "rdx": "edx dx dl dh",
        "rsi": "esi si sil", "rdi": "edi di dil", "rbp": "ebp bp bpl", "rsp": "esp sp spl"}.items():
    _SUB[_r64] = _r64
    for _s in _subs.split():
        _SUB[_s] = _r64
for _i in range(8, 16):
    for _suf in ("", "d", "w", "b"):
        _SUB["r%d%s" % (_i, _suf)] = "r%d" % _i
CALLEE_SAVED = {"rbx", "rbp", "r12", "r13", "r14", "r15"}
PREFIXES = set(range(0x40, 0x50)) | {0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x3E, 0x26, 0x64, 0x65, 0x36}


def reg64(md_insn, reg_id):
    name = md_insn.reg_name(reg_id)
    return _SUB.get(name, name)


def decode(code, addr, limit=None):
    out = []
    for ins in MD.disasm(code, addr):
        out.append(ins)
        if limit and len(out) >= limit:
            break
    return out


def rip_target(ins):
    """Address of the rip-relative memory operand of `ins`, or None."""
    for op in ins.operands:
        if op.type == cx86.X86_OP_MEM and op.mem.base == cx86.X86_REG_RIP:
            return ins.address + ins.size + op.mem.disp
    return None


def writes(ins):
    try:
        return {reg64(ins, r) for r in ins.regs_access()[1]}
    except capstone.CsError:
        return set()


def is_call(ins):
    return ins.mnemonic.startswith("call")


def is_jmp(ins):
    """Unconditional jump."""
    return ins.mnemonic.startswith("jmp")


def is_jcc(ins):
    """Conditional jump (jcc, jrcxz, loop...)."""
    return ins.group(capstone.CS_GRP_JUMP) and not is_jmp(ins)


def branch_target(ins):
    """('direct', addr) | ('slot', G) | ('reg', name) | ('mem', text) for a call/jmp."""
    op = ins.operands[0]
    if op.type == cx86.X86_OP_IMM:
        return ("direct", op.imm)
    if op.type == cx86.X86_OP_REG:
        return ("reg", reg64(ins, op.reg))
    if op.mem.base == cx86.X86_REG_RIP:
        return ("slot", ins.address + ins.size + op.mem.disp)
    if op.mem.base and not op.mem.index:
        return ("memreg", (reg64(ins, op.mem.base), op.mem.disp))
    return ("mem", ins.op_str)


def mov_reg_reg(ins):
    """(dst, src) for a 64-bit/32-bit register copy, else None."""
    if ins.mnemonic in ("mov", "movq") and len(ins.operands) == 2 and \
            all(o.type == cx86.X86_OP_REG for o in ins.operands):
        return reg64(ins, ins.operands[0].reg), reg64(ins, ins.operands[1].reg)
    return None


def decode_before(elf, call_addr, nbytes=BACK_BYTES):
    """Instructions ending exactly at call_addr (longest decoding that lands on it)."""
    start, code = elf.exec_bytes_before(call_addr, nbytes)
    best = []
    for s in range(0, len(code)):
        insns, a = [], start + s
        for ins in MD.disasm(code[s:], start + s):
            insns.append(ins)
            a = ins.address + ins.size
        if a == call_addr and insns:
            # accept only if it decoded all the way (disasm stops on invalid bytes)
            return insns
    return best


# --------------------------------------------------------------------------------------------
# Scanner
# --------------------------------------------------------------------------------------------

class Scanner:
    def __init__(self, path):
        self.elf = Elf(path)
        self.wrappers = {}        # key -> dict(kind, addr, name, verified, found_via)
        self.other_uses = {}      # name -> count
        self.unfollowed = []      # references whose use could not be followed
        self.uuids = {}           # hex -> dict(locations, sites)
        self.unresolved = []      # (call site, wrapper key, why)
        self.seed_locs = {}       # vaddr -> hex
        self._body_cache = {}

    # naming -------------------------------------------------------------------------------
    def plt_name(self, addr):
        """Symbol name if addr is a PLT stub (jmp [rip+GOT]) or a named function."""
        for ins in decode(self.elf.exec_bytes(addr, 16), addr, limit=2):
            if ins.mnemonic == "endbr64":
                continue
            if is_jmp(ins):
                kind, g = branch_target(ins)
                if kind == "slot":
                    return self.elf.slot_names.get(g, "slot@%#x" % g)
            break
        return self.elf.function_syms.get(addr)

    def target_key(self, kind, value):
        if kind == "direct":
            name = self.plt_name(value)
            return ("func", value, name)
        if kind == "slot":
            return ("slot", value, self.elf.slot_names.get(value))
        return (kind, value, None)

    # step 1 -----------------------------------------------------------------------------
    def find_seeds(self, hexes):
        for h in hexes:
            for off in self.elf.find_all(bytes.fromhex(h)):
                va = self.elf.vaddr_of(off)
                if va is not None and self.elf.section_of(va) is not None:
                    self.seed_locs[va] = h
                    self.uuids.setdefault(h, dict(locations=set(), sites={}))["locations"].add(va)

    # step 2-3 ---------------------------------------------------------------------------
    def confirm_ref(self, p, target, diff):
        """Decode the instruction whose disp32 sits at p and addresses `target`."""
        def at(start):
            ins = decode(self.elf.exec_bytes(start, 16), start, limit=1)
            if ins and rip_target(ins[0]) == target and ins[0].address + ins[0].size == p + 4 + diff:
                return ins[0]
            return None
        for k in range(1, 11):
            found = at(p - k)
            if found is None:
                continue
            # the shortest match may have lost its prefixes (REX.W/R, 66, ...): extend over them
            start = p - k
            for _ in range(4):
                b = self.elf.exec_bytes(start - 1, 1)
                if not b or b[0] not in PREFIXES:
                    break
                longer = at(start - 1)
                if longer is None:
                    break
                found, start = longer, start - 1
            return found
        return None

    def follow_forward(self, ins0, holders):
        """From ins0 (which put the address in `holders`), find the call getting it in rsi.
        Returns ('call', branch-target tuple, call addr) | ('store', text) | None."""
        addr = ins0.address + ins0.size
        code = self.elf.exec_bytes(addr, FWD_BYTES)
        last_load, last_lea = {}, {}   # reg -> G for `mov reg,[rip+G]` / `lea reg,[rip+G]`
        for ins in MD.disasm(code, addr):
            if is_call(ins) or is_jmp(ins):
                if "rsi" in holders:
                    kind, val = branch_target(ins)
                    if kind == "reg" and val in last_load:
                        kind, val = "slot", last_load[val]
                    elif kind == "memreg" and val[0] in last_lea:
                        kind, val = "slot", last_lea[val[0]] + val[1]
                    elif kind in ("memreg", "reg"):
                        # the pointer was set up before the UUID reference: trace it backwards
                        reg = val[0] if kind == "memreg" else val
                        org = self.reg_origin(ins.address, reg)
                        if org and org[0] == ("lea" if kind == "memreg" else "load"):
                            kind, val = "slot", org[1] + (val[1] if kind == "memreg" else 0)
                        elif org and org[0] == "ret" and kind == "reg":
                            kind, val = "reg", "%s = result of %s" % (val, self.describe_call(org[1]))
                        elif kind == "memreg":
                            kind, val = "mem", "[%s%+#x]" % val
                    if is_jmp(ins) and kind == "direct" and not self._looks_like_function(val, ins):
                        return None
                    return ("call", (kind, val), ins.address)
                if is_jmp(ins):
                    return None
                holders = holders & CALLEE_SAVED
                if not holders:
                    return None
                continue
            if ins.mnemonic.startswith("ret"):
                return None
            mv = mov_reg_reg(ins)
            w = writes(ins)
            if mv and mv[1] in holders:
                holders = holders | {mv[0]}
                continue
            if ins.mnemonic in ("mov", "lea") and len(ins.operands) == 2 and \
                    ins.operands[0].type == cx86.X86_OP_REG and ins.operands[1].type == cx86.X86_OP_MEM:
                g = rip_target(ins)
                r = reg64(ins, ins.operands[0].reg)
                last_load.pop(r, None)
                last_lea.pop(r, None)
                if g is not None:
                    (last_load if ins.mnemonic == "mov" else last_lea)[r] = g
            if ins.mnemonic == "mov" and ins.operands[0].type == cx86.X86_OP_MEM and \
                    ins.operands[1].type == cx86.X86_OP_REG and reg64(ins, ins.operands[1].reg) in holders \
                    and not (holders - {reg64(ins, ins.operands[1].reg)}):
                return ("store", "%#x: %s %s" % (ins.address, ins.mnemonic, ins.op_str))
            holders = holders - w
            if not holders:
                return None
        return None

    def _looks_like_function(self, target, ins):
        # a jmp to far away code is a tail call; a short jump is a branch inside the function
        return abs(target - ins.address) > 0x200 or target in self.elf.function_syms

    def find_wrappers(self, seed_addrs):
        """Steps 2-3 for the given seed addresses. Returns the set of new wrapper keys."""
        seeds = set(seed_addrs)
        ptr_slots = dict(self.elf.slots_pointing_to(seeds))  # slot -> uuid addr
        new = set()
        for (p, target, diff, prev) in self.elf.scan_disp32(seeds | set(ptr_slots)):
            ins = self.confirm_ref(p, target, diff)
            if ins is None:
                continue
            if ins.mnemonic == "lea":
                holders = {reg64(ins, ins.operands[0].reg)}
            elif ins.mnemonic == "mov" and target in ptr_slots and ins.operands[0].type == cx86.X86_OP_REG:
                holders = {reg64(ins, ins.operands[0].reg)}
            else:
                self.unfollowed.append("%#x: %s %s (reads the bytes)" % (ins.address, ins.mnemonic, ins.op_str))
                continue
            res = self.follow_forward(ins, holders)
            if res is None:
                self.unfollowed.append("%#x: %s %s (no call with it in rsi)" % (ins.address, ins.mnemonic, ins.op_str))
                continue
            if res[0] == "store":
                self.unfollowed.append("%s (stored to memory)" % res[1])
                continue
            kind, val = res[1]
            key = self.target_key(kind, val)
            if key[2] in NOT_WRAPPERS or (key[2] or "").split("@")[0] in NOT_WRAPPERS:
                self.other_uses[key[2]] = self.other_uses.get(key[2], 0) + 1
                continue
            if key[0] in ("reg", "mem", "memreg"):
                # the UUID reaches an indirect call whose target is not statically known: count the
                # UUID as asked for at this site (marked indirect), and list the site
                how = "indirect call %s %s" % key[:2]
                h = self.seed_locs.get(target) or self.seed_locs.get(ptr_slots.get(target))
                if h:
                    self.uuids[h]["sites"][res[2]] = "INDIRECT " + how
                    self.uuids[h].setdefault("indirect", set()).add(res[2])
                if "cuGetExportTable" not in how:
                    self.unresolved.append(("%#x" % res[2], how, "call target not statically known"))
                continue
            if key not in self.wrappers:
                ok, why = self.verify_wrapper(key)
                self.wrappers[key] = dict(verified=ok, why=why, found_via="%#x" % ins.address, sites=0)
                if ok:
                    new.add(key)
        return new

    def verify_wrapper(self, key):
        kind, val, name = key
        if name and name.split("@")[0] in EXPORT_TABLE_NAMES:
            return True, "named %s" % name
        if kind == "slot":
            return True, "function pointer slot%s" % (" (%s)" % name if name else "")
        if name and not name.startswith("slot@") and name not in self.elf.function_syms.values():
            return False, "PLT stub for %s" % name
        return self.forwards_uuid(val, depth=3)

    def forwards_uuid(self, func, depth):
        """Does `func` pass its second argument (rsi) on to an indirect call, directly or through
        direct calls up to `depth` deep?  Explores the body's branches (bounded)."""
        if (func, depth) in self._body_cache:
            return self._body_cache[(func, depth)]
        self._body_cache[(func, depth)] = (False, "recursive")
        result = (False, "rsi not passed on to an indirect call")
        for ins, k, t in self.calls_with_rsi(func, {"rsi"}):
            if k in ("reg", "slot", "mem", "memreg"):
                result = (True, "passes rsi to an indirect call at %#x" % ins.address)
                break
            n = self.plt_name(t) if k == "direct" else None
            if n and n.split("@")[0] in EXPORT_TABLE_NAMES:
                result = (True, "passes rsi to %s at %#x" % (n, ins.address))
                break
            if k == "direct" and not n and depth > 0 and self.elf.is_exec(t):
                ok, why = self.forwards_uuid(t, depth - 1)
                if ok:
                    result = (True, "passes rsi to %#x, which %s" % (t, why))
                    break
        self._body_cache[(func, depth)] = result
        return result

    def calls_with_rsi(self, start, holders, max_insns=600):
        """Explore code from `start` (following both ways of conditional jumps and near
        unconditional jumps) while some register in `holders` holds the value of interest; yield
        (insn, kind, target) for every call, or far/indirect tail jump, made with it in rsi."""
        work, seen, count = [(start, frozenset(holders))], set(), 0
        while work and count < max_insns:
            addr, hold = work.pop()
            if (addr, hold) in seen:
                continue
            seen.add((addr, hold))
            hold = set(hold)
            for ins in MD.disasm(self.elf.exec_bytes(addr, 0x200), addr):
                count += 1
                if is_jcc(ins):
                    if ins.operands and ins.operands[0].type == cx86.X86_OP_IMM:
                        work.append((ins.operands[0].imm, frozenset(hold)))
                    continue
                if is_call(ins) or is_jmp(ins):
                    k, t = branch_target(ins)
                    near = k == "direct" and abs(t - ins.address) < 0x2000 and \
                        t not in self.elf.function_syms
                    if is_jmp(ins) and near:
                        work.append((t, frozenset(hold)))
                        if ins.mnemonic == "jmp":
                            break
                        continue
                    if "rsi" in hold:
                        yield ins, k, t
                    if is_jmp(ins):
                        if ins.mnemonic == "jmp":
                            break
                        continue
                    hold &= CALLEE_SAVED
                    if not hold:
                        break
                    continue
                if ins.mnemonic.startswith("ret") or ins.mnemonic in ("ud2", "hlt", "int3"):
                    break
                mv = mov_reg_reg(ins)
                if mv and mv[1] in hold:
                    hold.add(mv[0])
                    continue
                hold -= writes(ins)
                if not hold or count >= max_insns:
                    break

    # step 4 -----------------------------------------------------------------------------
    def call_sites(self, keys):
        """(call addr, wrapper key) for every call of the given wrappers."""
        funcs = {k[1]: k for k in keys if k[0] == "func"}
        slots = {k[1]: k for k in keys if k[0] == "slot"}
        sites = []
        for (p, target, diff, prev) in self.elf.scan_disp32(set(funcs) | set(slots), slack=0):
            if target in funcs and prev in (0xE8, 0xE9):
                # make sure it really is a call/jmp instruction here
                ins = decode(self.elf.exec_bytes(p - 1, 5), p - 1, limit=1)
                if ins and (is_call(ins[0]) or is_jmp(ins[0])):
                    sites.append((p - 1, funcs[target]))
            elif target in slots:
                ins = self.confirm_ref(p, target, diff)
                if ins is None:
                    continue
                if is_call(ins) or is_jmp(ins):
                    sites.append((ins.address, slots[target]))
                elif ins.mnemonic in ("mov", "lea") and ins.operands[0].type == cx86.X86_OP_REG:
                    for site in self.find_call_through(ins, reg64(ins, ins.operands[0].reg),
                                                       ins.mnemonic == "lea"):
                        sites.append((site, slots[target]))
        return sites

    def find_call_through(self, ins0, reg, is_address):
        """After `mov reg,[rip+G]` find the `call reg`s; after `lea reg,[rip+G]` the `call [reg]`s."""
        addr = ins0.address + ins0.size
        holders, sites = {reg}, []
        for ins in MD.disasm(self.elf.exec_bytes(addr, FWD_BYTES), addr):
            if is_call(ins) or is_jmp(ins):
                k, v = branch_target(ins)
                if (not is_address and k == "reg" and v in holders) or \
                        (is_address and k == "memreg" and v[0] in holders and v[1] == 0):
                    sites.append(ins.address)
                if is_call(ins):
                    holders &= CALLEE_SAVED
                else:
                    break
            if ins.mnemonic.startswith("ret"):
                break
            mv = mov_reg_reg(ins)
            if mv and mv[1] in holders:
                holders.add(mv[0])
                continue
            holders -= writes(ins)
            if not holders:
                break
        return sites

    def reg_origin(self, at, reg):
        """Trace `reg` backwards from address `at`:
        ('lea', G) | ('load', G) | ('ret', call address) when it is a call's result | None."""
        for ins in reversed(decode_before(self.elf, at)):
            if is_call(ins):
                if reg == "rax":
                    return ("ret", ins.address)
                if reg not in CALLEE_SAVED:
                    return None
                continue
            if reg not in writes(ins):
                continue
            mv = mov_reg_reg(ins)
            if mv and mv[0] == reg:
                reg = mv[1]
                continue
            if ins.mnemonic in ("lea", "mov") and ins.operands[1].type == cx86.X86_OP_MEM:
                g = rip_target(ins)
                if g is not None:
                    return ("lea" if ins.mnemonic == "lea" else "load", g)
            return None
        return None

    def describe_call(self, call_addr):
        """'call <target>(..., "string in rsi")' for a call whose rsi is a C string (dlsym...)."""
        ins = decode(self.elf.exec_bytes(call_addr, 16), call_addr, limit=1)[0]
        k, t = branch_target(ins)
        name = (self.plt_name(t) or "%#x" % t) if k == "direct" else ins.op_str
        res = self.resolve_rsi(call_addr)
        arg = ""
        if res[0] == "uuid":
            b = self.elf.read(res[1], 64) or b""
            text = b.split(b"\0")[0]
            if text and all(32 <= c < 127 for c in text):
                arg = '..., "%s"' % text.decode()
        return "call at %#x to %s(%s)" % (call_addr, name, arg)

    def resolve_rsi(self, call_addr):
        """('uuid', vaddr) or ('unresolved', why)."""
        insns = decode_before(self.elf, call_addr)
        want = "rsi"
        for ins in reversed(insns):
            if is_call(ins):
                return ("unresolved", "rsi not set after the previous call at %#x" % ins.address)
            if want not in writes(ins):
                continue
            if ins.mnemonic == "lea" and reg64(ins, ins.operands[0].reg) == want:
                x = rip_target(ins)
                if x is not None:
                    return ("uuid", x)
                return ("unresolved", "%#x: %s %s" % (ins.address, ins.mnemonic, ins.op_str))
            mv = mov_reg_reg(ins)
            if mv and mv[0] == want:
                want = mv[1]
                continue
            if ins.mnemonic == "mov" and ins.operands[1].type == cx86.X86_OP_MEM:
                g = rip_target(ins)
                if g is not None:
                    x = self.elf.pointer_target(g)
                    if x is not None:
                        return ("uuid", x)
            return ("unresolved", "%#x: %s %s" % (ins.address, ins.mnemonic, ins.op_str))
        return ("unresolved", "no write of %s in the %d bytes before the call" % (want, BACK_BYTES))

    # driver ------------------------------------------------------------------------------
    def run(self):
        self.find_seeds(KNOWN)
        pending = self.find_wrappers(set(self.seed_locs))
        done, seen_sites = set(), set()
        rounds = 0
        while pending and rounds < 6:
            rounds += 1
            done |= pending
            new_locs = set()
            for site, key in self.call_sites(pending):
                if site in seen_sites:
                    continue
                seen_sites.add(site)
                self.wrappers[key]["sites"] += 1
                res = self.resolve_rsi(site)
                if res[0] == "uuid":
                    b = self.elf.read(res[1], 16)
                    if b is None or self.elf.is_exec(res[1]):
                        self.unresolved.append(("%#x" % site, self.key_text(key),
                                                "rsi = %#x (%s)" % (res[1], "no file data" if b is None else "code")))
                        continue
                    h = b.hex()
                    u = self.uuids.setdefault(h, dict(locations=set(), sites={}))
                    u["sites"][site] = self.key_text(key)
                    if res[1] not in u["locations"]:
                        u["locations"].add(res[1])
                    if res[1] not in self.seed_locs:
                        self.seed_locs[res[1]] = h
                        new_locs.add(res[1])
                else:
                    self.unresolved.append(("%#x" % site, self.key_text(key), res[1]))
            pending = self.find_wrappers(new_locs) - done if new_locs else set()
        return self

    def key_text(self, key):
        kind, val, name = key
        if kind == "func":
            return "call %#x%s" % (val, " <%s>" % name if name else "")
        if kind == "slot":
            return "call via pointer at %#x%s" % (val, " <%s>" % name if name else "")
        return "%s %s" % (kind, val)

    # cross-check -------------------------------------------------------------------------
    def candidates(self, radius=8):
        """Random-looking 16-byte values contiguous with UUID locations (same 16-byte stride,
        walking outwards from each location until a value does not look random)."""
        def looks_random(b):
            return b is not None and len(b) == 16 and len(set(b)) >= 12 and \
                sum(32 <= c < 127 for c in b) < 14
        out = {}
        for loc in sorted(self.seed_locs):
            for step in (-16, 16):
                for i in range(1, radius + 1):
                    b = self.elf.read(loc + step * i, 16)
                    if not looks_random(b):
                        break
                    out.setdefault(b.hex(), set()).add(loc + step * i)
            out.setdefault(self.elf.read(loc, 16).hex(), set()).add(loc)
        return out


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

def package_of(path):
    """(distribution name, version) of the wheel that installed `path`, from *.dist-info/RECORD."""
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    while d and d != "/":
        for rec in glob.glob(os.path.join(d, "*.dist-info", "RECORD")):
            rel = os.path.relpath(path, d)
            with open(rec, errors="replace") as f:
                for line in f:
                    if line.split(",", 1)[0] == rel:
                        meta = os.path.join(os.path.dirname(rec), "METADATA")
                        name = version = "?"
                        if os.path.exists(meta):
                            with open(meta, errors="replace") as m:
                                for l in m:
                                    if l.startswith("Name:"):
                                        name = l.split(":", 1)[1].strip()
                                    elif l.startswith("Version:"):
                                        version = l.split(":", 1)[1].strip()
                                    elif not l.strip():
                                        break
                        return name, version
        d = os.path.dirname(d)
    return None, None


def scan(path):
    r = dict(library=path)
    r["package"], r["version"] = package_of(path)
    try:
        elf = Elf(path)
    except (ValueError, OSError) as e:
        r["skipped"] = "not scannable: %s" % e
        return r
    has_str = elf.mm.find(b"cuGetExportTable") != -1
    has_uuid = any(elf.mm.find(bytes.fromhex(h)) != -1 for h in KNOWN)
    r["has_cuGetExportTable_string"] = has_str
    if not has_str and not has_uuid:
        r["skipped"] = "no known UUID and no cuGetExportTable string"
        return r
    s = Scanner(path).run()
    proven = {}
    for h, u in s.uuids.items():
        proven[h] = dict(uuid=canonical(bytes.fromhex(h)), name=KNOWN.get(h, "UNKNOWN (new)"),
                         known=h in KNOWN, call_sites=len(u["sites"]),
                         indirect_sites=len(u.get("indirect", ())),
                         locations=["%#x" % a for a in sorted(u["locations"])],
                         sites=["%#x" % a for a in sorted(u["sites"])])
    r["uuids"] = proven
    r["wrappers"] = [dict(target=s.key_text(k), verified=v["verified"], why=v["why"],
                          found_via=v["found_via"], call_sites=v["sites"])
                     for k, v in sorted(s.wrappers.items(), key=lambda kv: str(kv[0]))]
    r["unresolved"] = [dict(site=a, wrapper=w, why=y) for a, w, y in s.unresolved]
    r["unfollowed_references"] = s.unfollowed
    r["other_uses"] = s.other_uses
    cands = s.candidates()
    r["candidates"] = {h: dict(uuid=canonical(bytes.fromhex(h)), name=KNOWN.get(h, ""),
                               proven=h in proven and proven[h]["call_sites"] > 0,
                               locations=["%#x" % a for a in sorted(v)][:6])
                       for h, v in sorted(cands.items())}
    return r


def print_text(r, out=sys.stdout):
    w = out.write
    w("=" * 100 + "\n")
    w("%s\n" % r["library"])
    w("package: %s %s\n" % (r.get("package") or "(no wheel record)", r.get("version") or ""))
    if "skipped" in r:
        w("SKIPPED: %s\n\n" % r["skipped"])
        return
    w("cuGetExportTable string present: %s\n" % ("yes" if r["has_cuGetExportTable_string"] else "no"))
    w("\nUUIDs (call sites = calls of a wrapper proven to pass this UUID in rsi):\n")
    rows = sorted(r["uuids"].items(), key=lambda kv: (-kv[1]["call_sites"], kv[0]))
    for h, u in rows:
        flag = "" if u["known"] else "   <== NOT IN KNOWN LIST"
        ind = " (%d via an indirect call)" % u["indirect_sites"] if u["indirect_sites"] else ""
        w("  %s  %s  sites=%-4d %s%s%s\n" % (h, u["uuid"], u["call_sites"], u["name"], ind, flag))
        w("      in file at: %s%s\n" % (", ".join(u["locations"][:8]),
                                        " ... (%d)" % len(u["locations"]) if len(u["locations"]) > 8 else ""))
    w("\nWrappers (targets of calls that receive a UUID in rsi):\n")
    for wr in r["wrappers"]:
        w("  %-60s %s sites=%d  [%s; found via %s]\n" % (
            wr["target"], "ok " if wr["verified"] else "REJECTED", wr["call_sites"], wr["why"], wr["found_via"]))
    if r["other_uses"]:
        w("\nOther uses of UUID addresses (not wrappers): %s\n" %
          ", ".join("%s x%d" % kv for kv in sorted(r["other_uses"].items())))
    if r["unresolved"]:
        w("\nUnresolved call sites (%d):\n" % len(r["unresolved"]))
        for u in r["unresolved"][:40]:
            w("  %s  %s: %s\n" % (u["site"], u["wrapper"], u["why"]))
        if len(r["unresolved"]) > 40:
            w("  ... %d more\n" % (len(r["unresolved"]) - 40))
    if r["unfollowed_references"]:
        w("\nReferences to UUIDs whose use was not followed to a call (%d):\n" % len(r["unfollowed_references"]))
        for t in r["unfollowed_references"][:20]:
            w("  %s\n" % t)
        if len(r["unfollowed_references"]) > 20:
            w("  ... %d more\n" % (len(r["unfollowed_references"]) - 20))
    w("\nCandidates (random-looking 16-byte values next to UUID locations; not proven unless marked):\n")
    for h, c in r["candidates"].items():
        mark = "proven" if c["proven"] else ("known " if c["name"] else "      ")
        w("  %s  %s  %s %s%s\n" % (h, c["uuid"], mark, c["name"],
                                   "" if c["name"] or c["proven"] else "  <== not in known list"))
    w("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("libs", nargs="+", metavar="LIB")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    a = ap.parse_args()
    results = []
    for lib in a.libs:
        r = scan(lib)
        results.append(r)
        if not a.json:
            print_text(r)
            sys.stdout.flush()
    if a.json:
        json.dump(results, sys.stdout, indent=1, default=list)
        print()


if __name__ == "__main__":
    main()
