"""nvcc 13.5 programs with kernels (-arch=sm_80; static cudart, and -cudart shared), each also
built with line information (-lineinfo, and -G: support.KERNEL_BUILDS) and the plain ones with
relocatable device code (-rdc=true: support.RDC_BUILD)."""
import pytest

import support
from support import assert_ok, run_client

PROGRAMS = ([f"{n}{b}" for n in support.KERNEL_SOURCES for b in support.KERNEL_BUILDS]
            + [f"{n}{support.RDC_BUILD[0]}" for n in support.KERNEL_SOURCES]
            + [f"{n}_shared" for n in support.SHARED_CUDART_KERNELS])


def _stem(name):
    for suffix in ["_shared", support.RDC_BUILD[0], *support.KERNEL_BUILDS]:
        if suffix:
            name = name.removesuffix(suffix)
    return name


@pytest.mark.parametrize("prog", PROGRAMS)
def test_launches_succeed_and_synchronize(programs, server, prog):
    res = run_client(programs, server.unix, [programs.kernels[prog], "--launch-only"])
    assert_ok(res, [f"PASS {_stem(prog)} (launches only)"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("prog", PROGRAMS)
def test_kernel_results(programs, server, prog):
    res = run_client(programs, server.unix, [programs.kernels[prog]])
    assert_ok(res, [f"PASS {_stem(prog)} (results checked)"])


def test_launches_over_tcp(programs, server):
    res = run_client(programs, server.tcp, [programs.kernels["params"], "--launch-only"])
    assert_ok(res, ["PASS params (launches only)"])


# ---- programs made of named checks (kcheck.h), one process per check ------------------------------
# A check that the emulated GPU gets wrong today is a strict xfail with the reason: it fails the
# run (XPASS) once fixed, so the mark must go then.

CHECKS = {
    "warp": ["shfl_reduce", "shfl_scan", "vote", "match_redux", "match_all", "syncwarp_barrier",
             "labeled_partition"],
    "histogram": ["global_atomics", "shared_atomics", "contention", "atomic_ops"],
    "matmul": ["float", "double", "int"],
    "transpose": ["tiled", "naive"],
    "scan": ["block_scan", "multi_block"],
    "sort": ["bitonic_shared", "bitonic_global"],
    "double": ["ieee", "conversions", "reduction", "directed_rounding"],
    "math": ["float_functions", "float_intrinsics", "double_functions", "double_trig_pow"],
    "memory_spaces": ["dynamic_shared", "constant_memory", "device_globals", "local_memory",
                      "managed", "arrays", "mapped_host", "func_attributes"],
    "calls": ["noinline", "recursion", "function_pointers", "barrier_in_callee"],
    "fn_table": ["table"],
    "graphs": ["capture_replay", "fork_join", "many_nodes", "malloc_async_capture", "mem_nodes",
               "generic_nodes", "exec_update", "mem_node_freed_outside"],
    "faults": ["trap", "illegal_address", "misaligned", "assert", "reset_after_fault",
               "reset_relaunch"],
    "device_io": ["printf", "malloc", "heap_limit"],
    "textures": ["point_filter", "linear_filter", "normalized_coords", "normalized_float",
                 "fetch_linear", "pitch2d", "volume", "gather", "surface", "destroyed",
                 "cubemap", "cubemap_layered"],
    "cooperative": ["grid_sync", "too_large", "hang_fails", "persisting_l2"],
    "system_atomics": ["attribute", "concurrent_atomics", "flag_handshake", "pinned_uva"],
    "wmma": ["f16", "bf16", "tf32", "f64", "int8"],
    # Starts a child process (itself again) that opens the memory and event this one exports.
    "ipc": ["memory_and_events"],
}

# Managed memory is shared between the host and the emulated GPU (concurrentManagedAccess 1)
# only on the shared-memory transport; over a socket it moves at launches and synchronizes (0),
# and the checks that use it concurrently do not apply. A real GPU's driver (support.NATIVE)
# reports 1. Page-locked memory is reachable by kernels at its own address (unified
# addressing) on the same condition: over a socket only cudaHostAllocMapped memory is.
CONCURRENT_MANAGED = 1 if support.NATIVE or support.TRANSPORT == "shm" else 0
NEEDS_CONCURRENT_MANAGED = {("system_atomics", "concurrent_atomics"),
                            ("system_atomics", "flag_handshake"),
                            ("system_atomics", "pinned_uva")}
CHECK_ENV = {"KCHECK_CONCURRENT_MANAGED": str(CONCURRENT_MANAGED)}

XFAIL: dict = {}


def _check_params():
    for prog, checks in CHECKS.items():
        for check in checks:
            for build in support.KERNEL_BUILDS:
                if (prog, check) in NEEDS_CONCURRENT_MANAGED and not CONCURRENT_MANAGED:
                    # Not a test of this transport (the `attribute` check covers what it
                    # reports instead), so not collected: nothing skipped that would pass.
                    continue
                reason = XFAIL.get((prog + build, check))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                yield pytest.param(prog + build, check, id=f"{prog}{build}-{check}",
                                   marks=marks)


assert sorted(CHECKS) == sorted(support.CHECK_KERNEL_SOURCES)
assert all(check in CHECKS[_stem(prog)] for prog, check in XFAIL)


@pytest.mark.kernel_results
@pytest.mark.parametrize("prog,check", list(_check_params()))
def test_kernel_check(programs, server, prog, check):
    res = run_client(programs, server.unix, [programs.kernels[prog], check], env=CHECK_ENV)
    assert_ok(res, [f"PASS {check} (results checked)"])
    assert "checked" in res.stdout or "launched" in res.stdout  # each check says what it verified


@pytest.mark.skipif(support.NATIVE, reason="a native run has no TCP session")
def test_managed_memory_is_not_concurrent_over_tcp(programs, server):
    """A TCP session cannot share pages with its worker: concurrentManagedAccess reads 0 and
    managed memory keeps moving at launches and synchronizes (results still exact)."""
    res = run_client(programs, server.tcp, [programs.kernels["system_atomics"], "attribute"],
                     env={"KCHECK_CONCURRENT_MANAGED": "0"})
    assert_ok(res, ["PASS attribute (results checked)"])
    res = run_client(programs, server.tcp, [programs.kernels["memory_spaces"], "managed"])
    assert_ok(res, ["PASS managed (results checked)"])


@pytest.mark.kernel_results
def test_device_printf_order(programs, server):
    """Device printf output appears at the synchronize after its launches, in launch order and
    thread order within a warp, between the program's own lines (stdout is a pipe here, so
    the program's printf is fully buffered: the shim must write through the same stream)."""
    res = run_client(programs, server.unix, [programs.kernels["device_io"], "printf"])
    assert_ok(res, ["PASS printf (results checked)"])
    vals = [10, -20, 30, 255]

    def dev(launch, t):
        v = vals[t]
        return (f"device launch {launch} thread {t} value {v} hex {v & 0xffffffff:#x} "
                f"float {v * 0.5:.2f} str {'odd' if t % 2 else 'even'}")

    want = (["host before"] + [dev(0, t) for t in range(4)] + [dev(1, t) for t in range(2)]
            + ["host between", dev(2, 0), "host after"])
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("host", "device"))]
    assert lines == want, res.stdout


@pytest.mark.kernel_results
@pytest.mark.parametrize("check", ["if_else", "while_loop", "captured_while", "switch"])
def test_conditional_graph_nodes(programs, server, check):
    """IF/ELSE, WHILE (set by cudaGraphSetConditional in the body's kernel), a WHILE whose body
    is captured into (cudaStreamBeginCaptureToGraph), SWITCH: each over several launches with
    the results checked."""
    res = run_client(programs, server.unix, [programs.kernels["graph_conditional"], check])
    assert_ok(res, [f"PASS {check} (results checked)"])


@pytest.mark.kernel_results
@pytest.mark.parametrize("check", ["tree_sum", "children", "launch_error"])
def test_dynamic_parallelism(programs, server, check):
    """Kernels that launch kernels (CDP2, -rdc=true -lcudadevrt; the device runtime is the
    VM's, crates/ptx/src/devrt.rs): a recursive sum over a tree of grids whose tail launches
    add the halves, a child per block with arguments and dynamic shared memory, and a launch
    error that device code reads with cudaGetLastError; the host checks every result."""
    res = run_client(programs, server.unix, [programs.kernels["dynamic_parallelism"], check])
    assert_ok(res, [f"PASS {check} (results checked)"])


def test_relocatable_code_of_two_units_is_linked_and_runs(programs, server):
    """Its kernel calls a function and reads a variable of the other unit: the host code
    registers the device-linked image (SASS only) with both units' PTX, which the device links
    when it loads (the JIT linker, crates/ptx/src/link.rs). The kernel computes right and the
    host reads the other unit's variable by its symbol."""
    res = run_client(programs, server.unix, [programs.kernels["rdc_two_units"]])
    assert res.returncode == 0, res.stderr
    lines = [l for l in res.stdout.splitlines() if l.startswith(("LAUNCH", "RESULT", "BIAS"))]
    assert lines == ["LAUNCH cudaSuccess", "RESULT ok", "BIAS 5 cudaSuccess"], res.stdout
