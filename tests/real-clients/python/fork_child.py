"""A forked child uses CUDA through its own session (crates/shim/src/global.rs: the shim finds
the session through a per-thread reference that a pthread_atfork child handler invalidates, so
the child connects anew instead of writing into its parent's connection), while the parent's
session goes on. cuda-python's driver bindings; memory round trips checked byte for byte.
"""
import os
import sys

from cuda.bindings import driver as cu


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr, flush=True)
    os._exit(1)


def ck(result, what):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        fail(f"{what}: {err!r}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def round_trip(who, seed):
    dev = ck(cu.cuDeviceGet(0), f"{who} cuDeviceGet")
    ctx = ck(cu.cuDevicePrimaryCtxRetain(dev), f"{who} cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), f"{who} cuCtxSetCurrent")
    data = bytes((seed + i * 7) % 256 for i in range(1 << 16))
    ptr = ck(cu.cuMemAlloc(len(data)), f"{who} cuMemAlloc")
    ck(cu.cuMemcpyHtoD(ptr, data, len(data)), f"{who} cuMemcpyHtoD")
    back = bytearray(len(data))
    ck(cu.cuMemcpyDtoH(back, ptr, len(data)), f"{who} cuMemcpyDtoH")
    if bytes(back) != data:
        fail(f"{who}: the round trip changed the bytes")
    ck(cu.cuMemFree(ptr), f"{who} cuMemFree")
    ck(cu.cuCtxSynchronize(), f"{who} cuCtxSynchronize")


def main():
    ck(cu.cuInit(0), "cuInit")
    round_trip("parent", 1)
    pid = os.fork()
    if pid == 0:
        ck(cu.cuInit(0), "child cuInit")
        round_trip("child", 2)
        print("child ok", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        fail(f"the child exited with {os.waitstatus_to_exitcode(status)}")
    round_trip("parent after the fork", 3)
    print("PASS fork_child (results checked)", flush=True)


main()
