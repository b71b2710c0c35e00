//! `cudaGraphSetConditional(handle, value)` in device code (nvcc 13.5, `-rdc=true`): the VM
//! stores the value in the 4-byte word at the handle, the device address the client makes a
//! conditional handle of; a null handle is an illegal address.

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

/// `__global__ void k(char *p, cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, *p); }`
const PTX: &str = ".version 9.5\n.target sm_80\n.address_size 64\n\
.extern .func cudaGraphSetConditional\n(\n.param .b64 cudaGraphSetConditional_param_0,\n\
.param .b32 cudaGraphSetConditional_param_1\n)\n;\n\
.visible .entry _Z1kPcy(\n.param .u64 _Z1kPcy_param_0,\n.param .u64 _Z1kPcy_param_1\n)\n{\n\
.reg .b32 %r<2>;\n.reg .b64 %rd<4>;\n\
ld.param.u64 %rd1, [_Z1kPcy_param_0];\nld.param.u64 %rd2, [_Z1kPcy_param_1];\n\
cvta.to.global.u64 %rd3, %rd1;\nld.global.s8 %r1, [%rd3];\n\
{ // callseq 0, 0\n.reg .b32 temp_param_reg;\n.param .b64 param0;\n\
st.param.b64 [param0+0], %rd2;\n.param .b32 param1;\nst.param.b32 [param1+0], %r1;\n\
call.uni \ncudaGraphSetConditional, \n(\nparam0, \nparam1\n);\n} // callseq 0\nret;\n}\n";

fn launch(m: &Module, mem: &VecMemory, handle: u64) -> Result<(), ExecError> {
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let params: Vec<u8> = [BASE, handle]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    m.launch_on("_Z1kPcy", &cfg, &params, mem, &|_| None, 1)
        .map(|_| ())
}

#[test]
fn set_conditional_stores_the_value_at_the_handle() {
    let m = Module::parse(PTX).unwrap();
    let mut mem = VecMemory::new(BASE, 4096);
    mem.write(256, &[0xff; 8]);
    for v in [7u8, 0, 1] {
        mem.write(0, &[v]);
        launch(&m, &mem, BASE + 256).unwrap();
        // The value (a sign-extended char here) fills the word; the next word is untouched.
        assert_eq!(mem.read(256, 8), [v, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    }
}

#[test]
fn set_conditional_on_a_null_handle_is_an_illegal_address() {
    let m = Module::parse(PTX).unwrap();
    let mem = VecMemory::new(BASE, 4096);
    assert_eq!(launch(&m, &mem, 0), Err(ExecError::IllegalAddress(0)));
}
