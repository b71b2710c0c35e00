//! `cudaGraphSetConditional(handle, value)` in device code: a kernel of a CUDA graph sets the
//! value that a conditional node (IF, WHILE, SWITCH) of the graph looks at when it is reached.
//! The client makes each conditional handle the device address of a 4-byte word of the
//! session's memory (`gpufuse_client::graph`), so setting it is a store of the value there;
//! the client reads the word when the replay reaches the conditional node. As on a GPU,
//! calls from several threads at once leave one of their values (CUDA calls that undefined).

use crate::code::{CallSite, Src};
use crate::space::{load, store, LOCAL_WINDOW};
use crate::warp::{Bits, Env, Group, Warp};
use crate::ExecError;

/// The call's lanes `run` store their value at their handle, then go on.
pub fn set_conditional(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    run: u32,
) -> Result<(), ExecError> {
    let (&[handle, value], []) = (cs.args.as_slice(), cs.rets.as_slice()) else {
        return Err(ExecError::Unsupported(
            "cudaGraphSetConditional without its two arguments".into(),
        ));
    };
    let arg = |w: &mut Warp, env: &mut Env, a: Src, size: u8| -> Result<[u64; 32], ExecError> {
        match a {
            Src::FrameParam(off) => {
                let mut v = [0; 32];
                for l in Bits(run) {
                    v[l] = load(w, env, l, LOCAL_WINDOW + g.base + off, u64::from(size))?;
                }
                Ok(v)
            }
            a => crate::lanes::val(w, env, g, a, size),
        }
    };
    let handles = arg(w, env, handle, 8)?;
    let values = arg(w, env, value, 4)?;
    for l in Bits(run) {
        if handles[l] == 0 {
            return Err(ExecError::IllegalAddress(0));
        }
        store(w, env, l, handles[l], 4, values[l] & 0xffff_ffff)?;
    }
    w.goto(run, g.pc + 1);
    Ok(())
}
