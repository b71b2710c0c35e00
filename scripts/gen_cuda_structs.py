"""C structs of NVIDIA's cuda.h as #[repr(C)] Rust types, with their layout (used by gen_cuda_types.py).

A small parser for the subset of C that cuda.h's type declarations use: typedef'd structs and
unions with scalar, pointer, array, nested named and anonymous struct/union members; typedef
aliases, enums, handle typedefs (pointers to opaque structs) and callback typedefs. The layout
(size, alignment, member offsets) follows the x86-64/aarch64 Linux C ABI; the generated Rust
asserts it at compile time and the generated C file asserts the same numbers against the
header itself (scripts/check_cuda_types.sh compiles it).
"""
import re

# The structs the shim and client read or write, by their header names; what they contain is
# generated too.
STRUCTS = [
    "CUDA_MEMCPY2D", "CUDA_MEMCPY3D", "CUDA_ARRAY_DESCRIPTOR", "CUDA_ARRAY3D_DESCRIPTOR",
    "CUDA_RESOURCE_DESC", "CUDA_TEXTURE_DESC", "CUDA_RESOURCE_VIEW_DESC",
    "CUDA_KERNEL_NODE_PARAMS", "CUDA_MEMSET_NODE_PARAMS", "CUDA_HOST_NODE_PARAMS",
    "CUDA_MEM_ALLOC_NODE_PARAMS", "CUgraphEdgeData", "CUlaunchConfig", "CUlaunchAttribute",
    "CUmemLocation", "CUmemAllocationProp", "CUmemAccessDesc", "CUdevprop",
    "CUgraphNodeParams", "CUDA_MEMCPY_NODE_PARAMS", "CUDA_MEMSET_NODE_PARAMS_v2",
    "CUDA_CONDITIONAL_NODE_PARAMS",
]

PRIMITIVES = {
    "char": ("c_char", 1), "signed char": ("i8", 1), "unsigned char": ("u8", 1),
    "short": ("i16", 2), "unsigned short": ("u16", 2), "int": ("c_int", 4),
    "unsigned int": ("c_uint", 4), "unsigned": ("c_uint", 4), "long": ("i64", 8),
    "unsigned long": ("u64", 8), "long long": ("i64", 8), "unsigned long long": ("u64", 8),
    "float": ("f32", 4), "double": ("f64", 8), "size_t": ("usize", 8), "void": ("c_void", 0),
    "cuuint32_t": ("u32", 4), "cuuint64_t": ("u64", 8),
}
RUST_KEYWORDS = {"type", "fn", "ref", "mod", "move", "match", "impl", "loop", "self", "use", "where", "box", "dyn", "in", "as", "crate", "super", "trait", "unsafe", "async", "await", "final", "override", "priv", "macro", "virtual", "yield", "try", "abstract", "become", "do", "typeof", "unsized"}
TOKEN = re.compile(r"[A-Za-z_]\w*|\d+[uUlL]*|0x[0-9a-fA-F]+|\S")


def strip(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    src = re.sub(r"//[^\n]*", " ", src)
    return "\n".join(l for l in src.splitlines() if not l.lstrip().startswith("#"))


class Header:
    """The typedefs of one header: structs/unions (parsed bodies), aliases, enums, handles."""

    def __init__(self, src):
        self.toks = TOKEN.findall(strip(src))
        self.records = {}  # name -> ("struct"|"union", members)
        self.aliases = {}  # typedef name -> base type name
        self.enums = set()
        self.handles = set()  # typedefs of pointers (opaque handles, callbacks)
        self.tags = {}  # struct tag -> typedef name
        self.defines = {}
        for m in re.finditer(r"#define\s+(\w+)\s+(\d+)\s*$", src, re.M):
            self.defines[m.group(1)] = int(m.group(2))
        self._scan()

    def _scan(self):
        t, i = self.toks, 0
        while i < len(t):
            if t[i] != "typedef":
                i += 1
                continue
            i += 1
            if t[i] in ("struct", "union", "enum"):
                kind = t[i]
                i += 1
                tag = None
                if t[i] != "{":
                    tag = t[i]
                    i += 1
                if t[i] == "{":
                    if kind == "enum":
                        i = self._skip(i)
                        body = None
                    else:
                        try:
                            body, _ = self._members(i)
                        except (ValueError, KeyError, AssertionError) as e:
                            body = e  # reported only if a generated struct needs it
                        i = self._skip(i)
                    # declarators: NAME [, *PNAME]* ;
                    while t[i] != ";":
                        if t[i] == "*":
                            self.handles.add(t[i + 1])
                            i += 2
                        elif t[i] == ",":
                            i += 1
                        else:
                            name = t[i]
                            if kind == "enum":
                                self.enums.add(name)
                            elif name not in self.records:
                                self.records[name] = (kind, body)
                                if tag:
                                    self.tags[tag] = name
                            i += 1
                    i += 1
                else:
                    # typedef struct TAG NAME; / typedef struct TAG *NAME;
                    if t[i] == "*":
                        self.handles.add(t[i + 1])
                    elif kind == "enum":
                        self.enums.add(t[i])
                    else:
                        self.aliases.setdefault(t[i], "struct " + tag)
                    while t[i] != ";":
                        i += 1
                    i += 1
            else:
                j = i
                while t[j] != ";":
                    j += 1
                decl = t[i:j]
                if "(" in decl:
                    # a callback: RET (CUDA_CB *NAME)(...)
                    k = decl.index("(")
                    if k + 1 < len(decl) and "*" in decl[k:k + 3]:
                        self.handles.add(decl[decl.index("*", k) + 1])
                elif decl[-2] == "*":
                    self.handles.add(decl[-1])
                else:
                    self.aliases.setdefault(decl[-1], " ".join(x for x in decl[:-1] if x != "const"))
                i = j + 1

    def _skip(self, i):
        depth = 0
        while True:
            if self.toks[i] == "{":
                depth += 1
            elif self.toks[i] == "}":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1

    def _members(self, i):
        """Members of a `{ ... }` body at token i: [(name, type)], type one of
        ("prim"/"named", text), ("ptr", pointee type, const), ("array", type, n),
        ("record", kind, members)."""
        t = self.toks
        assert t[i] == "{"
        i += 1
        out = []
        while t[i] != "}":
            if t[i] in ("struct", "union") and t[i + 1] == "{":
                kind = t[i]
                body, i = self._members(i + 1)
                ty = ("record", kind, body)
            else:
                words = []
                while t[i] not in ("*", ";", "[", ",") and not (t[i + 1] in (";", "[", ",") and words):
                    words.append(t[i])
                    i += 1
                const = "const" in words
                words = [w for w in words if w not in ("const", "struct", "volatile")]
                ty = ("named", " ".join(words))
                stars = 0
                while t[i] == "*":
                    stars += 1
                    i += 1
                    if t[i] == "const":
                        i += 1
                for _ in range(stars):
                    ty = ("ptr", ty, const)
                    const = False
            while True:
                name = t[i] if t[i] != ";" else ""
                if name:
                    i += 1
                fty = ty
                dims = []
                while t[i] == "[":
                    j = t.index("]", i)
                    dims.append(self._dim(t[i + 1:j]))
                    i = j + 1
                for n in reversed(dims):
                    fty = ("array", fty, n)
                out.append((name, fty))
                if t[i] == ",":
                    i += 1
                    continue
                break
            assert t[i] == ";", t[i - 5:i + 5]
            i += 1
        return out, i + 1

    def _dim(self, toks):
        """An array length: a number, a #define, or arithmetic with sizeof of a scalar/enum."""
        expr, k = [], 0
        while k < len(toks):
            x = toks[k]
            if x == "sizeof":
                end = toks.index(")", k)
                name = self.resolve(" ".join(toks[k + 2:end]))
                if name.endswith("*"):
                    size = 8
                else:
                    size = 4 if name in self.enums else PRIMITIVES[name][1]
                expr.append(str(size))
                k = end + 1
                continue
            if x[0].isdigit():
                expr.append(str(int(x.rstrip("uUlL"), 0)))
            elif x in self.defines:
                expr.append(str(self.defines[x]))
            elif x in "+-*/()":
                expr.append(x.replace("/", "//"))
            else:
                raise ValueError(f"array length {' '.join(toks)}")
            k += 1
        return int(eval(" ".join(expr), {"__builtins__": {}}))

    def resolve(self, name):
        seen = 0
        # Stop at a known primitive: cuda.h aliases cuuint64_t per platform (MSVC's __int64).
        while name in self.aliases and name not in PRIMITIVES and seen < 20:
            name = self.aliases[name]
            if name.startswith("struct "):
                name = self.tags.get(name[7:], name)
            seen += 1
        return name


class Generator:
    def __init__(self, header):
        self.h = header
        self.order = []  # (rust name, kind, [(field, rust type)], size, align, [(field, offset)])
        self.done = {}
        self.type_aliases = {}
        self.anonymous = set()  # generated names of anonymous records (`Owner_anonK`)

    def layout_of(self, ty, owner, field):
        """(rust type, size, align) of a member type; nested records are generated."""
        kind = ty[0]
        if kind == "named":
            name = self.h.resolve(ty[1])
            if name in PRIMITIVES:
                r, s = PRIMITIVES[name]
                if ty[1] != name and ty[1] not in PRIMITIVES:
                    self.type_aliases[ty[1]] = r
                    r = ty[1]
                return r, s, max(s, 1)
            if name in self.h.enums or ty[1] in self.h.enums:
                self.type_aliases[ty[1]] = "c_int"
                return ty[1], 4, 4
            if name in self.h.handles or ty[1] in self.h.handles:
                self.type_aliases[ty[1]] = "*mut c_void"
                return ty[1], 8, 8
            if name in self.h.records:
                rname, size, align = self.record(name)
                if ty[1] != rname:
                    self.type_aliases[ty[1]] = rname
                return ty[1], size, align
            raise KeyError(f"{owner}.{field}: unknown type {ty[1]}")
        if kind == "ptr":
            inner = ty[1]
            mut = "*const" if ty[2] else "*mut"
            if inner[0] == "named" and self.h.resolve(inner[1]) == "void":
                return f"{mut} c_void", 8, 8
            try:
                r, _, _ = self.layout_of(inner, owner, field)
            except KeyError:
                r = "c_void"
            return f"{mut} {r}", 8, 8
        if kind == "array":
            r, s, a = self.layout_of(ty[1], owner, field)
            return f"[{r}; {ty[2]}]", s * ty[2], a
        if kind == "record":
            return self.emit(f"{owner}_{field}", ty[1], ty[2])
        raise ValueError(ty)

    def record(self, name):
        if name in self.done:
            return self.done[name]
        kind, members = self.h.records[name]
        if isinstance(members, Exception):
            raise ValueError(f"{name}: {members}")
        return self.emit(name, kind, members)

    def emit(self, name, kind, members):
        fields, offsets, off, align, size = [], [], 0, 1, 0
        for k, (fname, fty) in enumerate(members):
            if not fname:
                # An anonymous union or struct (C11): Rust names it `anon<k>`; C reaches its
                # members directly, which the C check follows (`anonymous`).
                if fty[0] != "record":
                    raise ValueError(f"{name}: an anonymous member that is not a record")
                fname = f"anon{k}"
                self.anonymous.add(f"{name}_{fname}")
            r, s, a = self.layout_of(fty, name, fname)
            align = max(align, a)
            if kind == "struct":
                off = (off + a - 1) // a * a
                offsets.append((fname, off))
                off += s
            else:
                size = max(size, s)
            fields.append((fname, r))
        if kind == "struct":
            size = off
        size = (size + align - 1) // align * align
        self.order.append((name, kind, fields, size, align, offsets))
        self.done[name] = (name, size, align)
        return name, size, align

    def run(self):
        for s in STRUCTS:
            name = self.h.resolve(s)
            r = self.record(name)
            if s != name:
                self.type_aliases[s] = name
        return self

    def rust(self):
        out = ["use core::ffi::{c_char, c_int, c_uint, c_void};\n"]
        for alias, target in sorted(self.type_aliases.items()):
            if alias != target:
                out.append(f"pub type {alias} = {target};")
        out.append("")
        for name, kind, fields, size, align, offsets in self.order:
            out.append(f"/// `{name}` ({size} bytes).")
            out.append("#[repr(C)]\n#[derive(Clone, Copy)]")
            out.append(f"pub {kind} {name} {{")
            for f, r in fields:
                out.append(f"    pub {ident(f)}: {r},")
            out.append("}")
            out.append(f"const _: () = assert!(core::mem::size_of::<{name}>() == {size});")
            out.append(f"const _: () = assert!(core::mem::align_of::<{name}>() == {align});")
            for f, o in offsets:
                out.append(f"const _: () = assert!(core::mem::offset_of!({name}, {ident(f)}) == {o});")
            out.append("")
        return "\n".join(out)

    def c_check(self):
        """_Static_asserts of the same layout against the header (nested records by path)."""
        out = ["#include <stddef.h>", "#include <cuda.h>", ""]
        nested = {}
        for name, kind, fields, size, align, offsets in self.order:
            for f, r in fields:
                nested.setdefault(r, (name, f))

        def path(name):
            # A nested anonymous record is reached from its top-level owner by member names.
            if name in nested and name.startswith(nested[name][0] + "_"):
                owner, f = nested[name]
                top, p = path(owner)
                return top, (p + "." if p else "") + f
            return name, ""

        # An anonymous record's members, as C names them in its owner: (member, offset in
        # the record); a union's members all start at its start.
        members = {}
        for name, kind, fields, size, align, offsets in self.order:
            if name in self.anonymous:
                members[name] = offsets if kind == "struct" else [(f, 0) for f, _ in fields]

        def checks(owner, p, fields, offsets):
            """offsetof asserts of a record's members; an anonymous member's by its members."""
            types = dict(fields)
            out = []
            for f, o in offsets:
                inner = [(f, 0)]
                if types[f] in self.anonymous:
                    inner = members[types[f]]
                for g, go in inner:
                    if p:
                        expr = f"offsetof({owner}, {p}.{g}) - offsetof({owner}, {p})"
                    else:
                        expr = f"offsetof({owner}, {g})"
                    out.append(f'_Static_assert({expr} == {o + go}, "{owner}.{p + "." if p else ""}{g}");')
            return out

        # Every header version: the structs the shim takes keep their size and alignment (the
        # ABI). What they contain may grow between versions (CUDA 13's node parameters did):
        # those are checked against the header generated from only, below.
        wanted = {self.h.resolve(s) for s in STRUCTS}
        for name, kind, fields, size, align, offsets in self.order:
            if name in self.anonymous or name not in wanted:
                continue
            if path(name)[1] == "":
                out.append(f'_Static_assert(sizeof({name}) == {size}, "{name} size");')
                out.append(f'_Static_assert(_Alignof({name}) == {align}, "{name} align");')
        # The header generated from: every member, nested ones by their path.
        out.append(f"\n#if CUDA_VERSION / 1000 == {self.major}")
        for name, kind, fields, size, align, offsets in self.order:
            if name in self.anonymous:
                continue  # C cannot name it: its owner checks its members (`checks`)
            top, p = path(name)
            if not p and name not in wanted:
                out.append(f'_Static_assert(sizeof({name}) == {size}, "{name} size");')
                out.append(f'_Static_assert(_Alignof({name}) == {align}, "{name} align");')
            if p:
                expr = f"((({top} *)0)->{p})"
                out.append(f'_Static_assert(sizeof({expr}) == {size}, "{name} size");')
                out.append(f'_Static_assert(_Alignof(__typeof__({expr})) == {align}, "{name} align");')
            out.extend(checks(top, p, fields, offsets))
        out.append("#endif")
        return "\n".join(out) + "\n"


def snake(name):
    """A C member name in Rust's snake case: srcXInBytes -> src_x_in_bytes, SIMDWidth ->
    simd_width, win32HandleMetaData -> win32_handle_meta_data, pitch2D -> pitch2d."""
    out = []
    for i, c in enumerate(name):
        prev = name[i - 1] if i else ""
        nxt = name[i + 1] if i + 1 < len(name) else ""
        if c.isupper() and i and (prev.islower() or ((prev.isdigit() or prev.isupper()) and nxt.islower())):
            out.append("_")
        out.append(c.lower())
    return "".join(out)


def ident(name):
    name = snake(name)
    return "r#" + name if name in RUST_KEYWORDS else name


def generate(cuda_h):
    g = Generator(Header(cuda_h))
    g.major = int(re.search(r"#define\s+CUDA_VERSION\s+(\d+)", cuda_h).group(1)) // 1000
    return g.run()
