//! What the device needs to know about a module before the VM runs it: each kernel's
//! parameter layout and each module variable's size, alignment, initializer and kind.
//!
//! For PTX, this is read from the interpreter's own parse of the module
//! ([`gpufuse_ptx::Module`]), so the text is parsed once and the device and the VM agree on
//! every offset and function address. Layout rule (docs/driver-interception.md, section 6):
//! `.param .<type>` has the type's size and alignment; `.param .align A .b8 name[N]` has size N
//! and alignment A; `.param .<type> name[N]` is N elements; each offset is the previous end
//! rounded up to the parameter's alignment.

use gpufuse_proto::ParamSlot;

/// A kernel entry and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<ParamSlot>,
}

/// A module-scope `.global` or `.const` variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    pub name: String,
    pub size: u64,
    pub align: u64,
    pub init: Option<Vec<u8>>,
    /// `.global .attribute(.managed)` (a `__managed__` variable): the host reaches it through
    /// unified memory. Unknown for a module known only from its cubin (`false`).
    pub managed: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Layout {
    pub kernels: Vec<Kernel>,
    pub variables: Vec<Variable>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid PTX: {0}")]
pub struct LayoutError(pub String);

/// The layout of a parsed PTX module.
pub fn from_module(m: &gpufuse_ptx::Module) -> Layout {
    Layout {
        kernels: m
            .kernels()
            .iter()
            .map(|k| Kernel {
                name: k.name.clone(),
                params: k
                    .params
                    .iter()
                    .map(|p| ParamSlot {
                        offset: p.offset,
                        size: p.size,
                    })
                    .collect(),
            })
            .collect(),
        variables: m
            .globals()
            .iter()
            .map(|v| Variable {
                name: v.name.clone(),
                size: v.size,
                align: v.align,
                init: v.init.clone(),
                managed: v.managed,
            })
            .collect(),
    }
}

/// The module of one unit's PTX, or of several units' linked (`gpufuse_ptx::Module::link`),
/// named `unit 0`, `unit 1`, ... in messages.
pub fn load_units(units: &[String]) -> Result<gpufuse_ptx::Module, gpufuse_ptx::PtxError> {
    match units {
        [one] => gpufuse_ptx::Module::parse(one),
        _ => {
            let names: Vec<String> = (0..units.len()).map(|i| format!("unit {i}")).collect();
            let list: Vec<(&str, &str)> = names
                .iter()
                .zip(units)
                .map(|(n, u)| (n.as_str(), u.as_str()))
                .collect();
            gpufuse_ptx::Module::link(&list)
        }
    }
}

/// Parses a PTX module for its layout alone (the device parses with
/// [`gpufuse_ptx::Module::parse`] and keeps the program: [`from_module`]).
pub fn parse(src: &str) -> Result<Layout, LayoutError> {
    gpufuse_ptx::Module::parse(src)
        .map(|m| from_module(&m))
        .map_err(|e| LayoutError(e.to_string()))
}

/// The layout of a module known only from its cubin (SASS): kernels and parameters from
/// `.nv.info`, variables from the symbol table (aligned to 8, the most a scalar needs).
pub fn from_cubin(info: &gpufuse_fatbin::CubinInfo) -> Layout {
    Layout {
        kernels: info
            .kernels
            .iter()
            .map(|k| Kernel {
                name: k.name.clone(),
                params: k
                    .params
                    .iter()
                    .map(|p| ParamSlot {
                        offset: p.offset,
                        size: p.size,
                    })
                    .collect(),
            })
            .collect(),
        variables: info
            .variables
            .iter()
            .map(|v| Variable {
                name: v.name.clone(),
                size: v.size,
                align: 8,
                init: v.init.clone(),
                managed: false,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvcc_vadd_layout() {
        let ptx = ".visible .entry _Z4vaddPKfS0_Pfi(\n\t.param .u32 n,\n\t.param .u64 .ptr .global .align 4 p,\n\t.param .u64 a2,\n\t.param .u32 a3\n)\n{\n\tret;\n}\n";
        let l = parse(ptx).unwrap();
        let offs: Vec<_> = l.kernels[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        // `.align 4` after `.ptr` is the pointee's: the pointer itself is 8-aligned.
        assert_eq!(offs, vec![(0, 4), (8, 8), (16, 8), (24, 4)]);
    }

    #[test]
    fn cupy_aligned_byte_arrays() {
        let ptx = ".visible .entry cupy_add__float64_float_float64(\n.param .align 8 .b8 p0[32],\n.param .f64 p1,\n.param .align 8 .b8 p2[32],\n.param .align 8 .b8 p3[24]\n)\n{ ret; }";
        let l = parse(ptx).unwrap();
        let offs: Vec<_> = l.kernels[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        assert_eq!(offs, vec![(0, 32), (32, 8), (40, 32), (72, 24)]);
    }

    #[test]
    fn kernels_named_like_instructions_and_globals() {
        let ptx = "// c\n.const .align 4 .b8 table[16] = {1, 2, 3, 4};\n.global .align 4 .f32 scale = 0f3F800000;\n.extern .shared .align 16 .b8 dyn[];\n.visible .entry vadd() { ret; }\n/* .entry nope() */";
        let l = parse(ptx).unwrap();
        assert_eq!(l.kernels.len(), 1);
        assert_eq!(l.kernels[0].name, "vadd");
        assert_eq!(l.variables[0].name, "table");
        assert_eq!(l.variables[0].size, 16);
        assert_eq!(l.variables[0].init.as_deref(), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(
            l.variables[1].init.as_deref(),
            Some(&1.0f32.to_le_bytes()[..])
        );
    }

    /// A table of function addresses (nvcc's `d_table[] = {f, g}`) holds the addresses the VM
    /// gives the functions: the same bytes as the VM's own parse of the module.
    #[test]
    fn function_addresses_in_initializers() {
        let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n            .func (.param .b32 r) g\n(\n.param .b32 a\n)\n;\n            .global .align 8 .u64 table[2] = {g, f};\n            .visible .entry k(.param .u64 p) { ret; }\n            .func (.param .b32 r) f(.param .b32 a) { st.param.b32 [r], 1; ret; }\n            .func (.param .b32 r) g(.param .b32 a) { st.param.b32 [r], 2; ret; }\n";
        let l = parse(ptx).unwrap();
        let want: Vec<u8> = [2usize, 1]
            .iter()
            .flat_map(|&i| gpufuse_ptx::function_address(i).to_le_bytes())
            .collect();
        assert_eq!(l.variables[0].init.as_deref(), Some(&want[..]));
        let m = gpufuse_ptx::Module::parse(ptx).unwrap();
        assert_eq!(m.globals()[0].init.as_deref(), Some(&want[..]));
        assert!(parse(".global .u64 t[1] = {nothing};").is_err());
    }

    /// A program built with `nvcc -rdc=true` from two units (crates/ptx/tests/fixtures/link):
    /// the image its host code registers holds each unit's PTX, and loading it links them, so
    /// the kernel of one unit calls the other's function and reads its variable.
    #[test]
    fn an_image_of_two_units_loads_linked_and_runs() {
        use crate::{Device, KernelLaunch};
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fatbin/tests/fixtures/");
        let read = |n: &str| std::fs::read(format!("{dir}{n}")).unwrap();
        let (linked, a, b) = (
            read("k.fatbin"),
            read("link_a.fatbin"),
            read("link_b.fatbin"),
        );
        let image = gpufuse_fatbin::with_prelinked_ptx(&linked, &[&a, &b]).unwrap();
        let mut d = crate::emu::EmuDevice::new(0, 1 << 30, 0x1000_0000_0000, 1 << 40);
        let m = d.load_module(&image).unwrap();
        let (offset, _) = d.global(m, "offset").unwrap();
        let mut v = [0u8; 4];
        d.read(offset, &mut v).unwrap();
        assert_eq!(u32::from_le_bytes(v), 7);
        let n = 64u32;
        let buf = d.alloc(4 * n as u64).unwrap();
        let data: Vec<u8> = (0..n).flat_map(|i| i.to_le_bytes()).collect();
        d.write(buf, &data).unwrap();
        let mut params = buf.to_le_bytes().to_vec();
        params.extend_from_slice(&n.to_le_bytes());
        d.function(m, "_Z5applyPii").unwrap();
        d.launch(&KernelLaunch {
            module: m,
            function: "_Z5applyPii",
            grid: [2, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
            params: &params,
            stream: 0,
            cooperative: false,
            cancel: None,
        })
        .unwrap();
        let mut out = vec![0u8; 4 * n as usize];
        d.read(buf, &mut out).unwrap();
        let got: Vec<u32> = out
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want: Vec<u32> = (0..n).map(|i| 3 * i + 2 + 7 + 1000 + i % 4 + 1).collect();
        assert_eq!(got, want);
        // Unit A alone cannot link: the load names what is missing.
        let alone = gpufuse_fatbin::link_image(&[("a", &a), ("a2", &a)]).unwrap();
        let e = d.load_module(&alone).unwrap_err();
        assert_eq!(e.status, crate::status::INVALID_IMAGE);
        let why = e.detail();
        assert!(why.contains("_Z5scalei"), "{why}");
    }
}
