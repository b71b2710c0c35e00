//! The kernels an image gives a GPU: what `cuModuleGetFunctionCount` and
//! `cuModuleEnumerateFunctions` list, read from the code the GPU would load (the best cubin for
//! it, else the best PTX), without loading anything.

use crate::{cubin_info, select_cubin, select_ptx, FatbinError};

/// The names of the kernels (entry functions) that a GPU of compute capability `sm` (e.g. 90)
/// loads from `image`, sorted and without repeats.
pub fn kernel_names(image: &[u8], sm: u32) -> Result<Vec<String>, FatbinError> {
    let mut names = match select_cubin(image, sm)? {
        Some((_, cubin)) => cubin_info(&cubin)?
            .kernels
            .into_iter()
            .map(|k| k.name)
            .collect(),
        None => ptx_entries(&select_ptx(image, sm)?),
    };
    names.sort();
    names.dedup();
    Ok(names)
}

/// The names after each `.entry` directive of PTX text, comments skipped.
fn ptx_entries(ptx: &str) -> Vec<String> {
    let text = strip_comments(ptx);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        // `.entry` must be a whole token: `.entryfoo` is something else.
        let starts_token = at == 0 || !is_ident(rest.as_bytes()[at - 1]);
        let trimmed = after.trim_start();
        if starts_token && trimmed.len() < after.len() {
            let name: String = trimmed
                .bytes()
                .take_while(|&b| is_ident(b))
                .map(char::from)
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
        rest = after;
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'%'
}

fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut rest = ptx;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (None, None) => {
                out.push_str(rest);
                return out;
            }
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |n| &rest[l + n..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            (Some(_), None) => unreachable!("handled by the arm above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_skip_comments_and_functions() {
        let ptx = "\
.version 8.0\n.target sm_80\n.address_size 64\n\
// .visible .entry commented_out(\n\
/* .entry also_commented( */\n\
.func (.reg .b32 r) helper(.reg .b32 a) { ret; }\n\
.visible .entry first(\n  .param .u64 p\n) { ret; }\n\
.weak .entry\tsecond() { ret; }\n\
.entry first() { ret; }\n";
        let names = kernel_names(format!("{ptx}\0").as_bytes(), 80).unwrap();
        assert_eq!(names, ["first", "second"]);
    }

    #[test]
    fn an_image_with_no_code_for_the_gpu_is_an_error() {
        assert!(kernel_names(b"\x7fELF garbage", 90).is_err());
    }
}
