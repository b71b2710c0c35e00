/* The conformance probe: asks the CUDA driver everything an application can ask and prints
 * each fact as one `key = value` line, in a stable order, with no addresses, handles or timings,
 * so that its output natively on a GPU and through gpufuse on the same GPU can be diffed
 * (scripts/conformance-diff.py; docs/conformance.md).
 *
 *   gcc -O1 -I<dir of cuda.h> -o probe tests/conformance/probe.c -ldl
 *   ./probe                                      # natively
 *   gpufuse run --server unix:/tmp/g.sock -- ./probe   # through gpufuse
 *
 * Builds against cuda.h only (for its types; no link library): libcuda.so.1 is opened with
 * dlopen and every entry point looked up with cuGetProcAddress_v2 (falling back to dlsym), so
 * the shim is used when it comes first on LD_LIBRARY_PATH. Only types of cuda.h are used, never
 * its newer enum constants: the numeric ranges come from cuda_names.h (generated), so the keys
 * are the same whichever cuda.h the probe was compiled against.
 *
 * It never crashes as a whole: the sections run in a child process (this program re-executed
 * with --from N), each ending with `section.NAME = ok`; when the child dies in a section, that
 * section prints `section.NAME = signal N` (or `timeout`, `exit N`) and a new child goes on with
 * the next. Calls that could crash a real driver (double destroys, bogus handles) come last,
 * each reported as `risky_process.NAME`. `--inprocess` runs everything in one process. A failing
 * call prints `error N` (its CUresult) as the value. Keys that start with `intended.` are allowed to differ (see scripts/conformance-diff.py).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_names.h"

/* The CUDA version every entry point is asked for: the driver the fixture comes from (580,
 * CUDA 13.0), whatever cuda.h this was built with. */
#define PROBE_CUDA_VERSION 13000
#define SECTION_TIMEOUT_S 60
/* The child asks for a new process for the next step (its context is broken). */
#define RESTART_EXIT 3

typedef unsigned long long u64;

/* ---- output ------------------------------------------------------------------------------ */

static void kv(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kv(const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s = ", key);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* `0` for success, else `error N`. */
static const char *rcs(CUresult rc) {
    static char buf[8][32];
    static int i;
    i = (i + 1) % 8;
    if (rc == CUDA_SUCCESS) return "0";
    snprintf(buf[i], sizeof buf[i], "error %d", (int)rc);
    return buf[i];
}

/* A formatted string, from a ring of buffers (a key and its value can both be K(...)). */
static const char *K(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *K(const char *fmt, ...) {
    static char bufs[8][512];
    static int i;
    i = (i + 1) % 8;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(bufs[i], sizeof bufs[i], fmt, ap);
    va_end(ap);
    return bufs[i];
}

/* ---- the driver's entry points -------------------------------------------------------------- */

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static void *lib;
static gpa_t gpa;

/* Looks `name` up with cuGetProcAddress_v2 (version PROBE_CUDA_VERSION); failing that, dlsym of
 * `fallback` (the versioned export name, e.g. cuMemAlloc_v2). NULL if neither has it. */
static void *sym(const char *name, const char *fallback) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = 0;
    if (gpa && gpa(name, &p, PROBE_CUDA_VERSION, 0, &st) == CUDA_SUCCESS && p) return p;
    return dlsym(lib, fallback ? fallback : name);
}

#define FN(name, ret, args) static ret(*p_##name) args;
#define DRIVER_FUNCTIONS(X)                                                                          \
    X(cuInit, CUresult, (unsigned))                                                                  \
    X(cuDriverGetVersion, CUresult, (int *))                                                         \
    X(cuGetErrorName, CUresult, (CUresult, const char **))                                           \
    X(cuDeviceGetCount, CUresult, (int *))                                                           \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                                      \
    X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                                            \
    X(cuDeviceTotalMem, CUresult, (size_t *, CUdevice))                                              \
    X(cuDeviceGetAttribute, CUresult, (int *, int, CUdevice))                                        \
    X(cuDeviceGetUuid, CUresult, (CUuuid *, CUdevice))                                               \
    X(cuDeviceGetPCIBusId, CUresult, (char *, int, CUdevice))                                        \
    X(cuDeviceComputeCapability, CUresult, (int *, int *, CUdevice))                                 \
    X(cuDeviceCanAccessPeer, CUresult, (int *, CUdevice, CUdevice))                                  \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                                   \
    X(cuDevicePrimaryCtxRelease, CUresult, (CUdevice))                                               \
    X(cuDevicePrimaryCtxGetState, CUresult, (CUdevice, unsigned *, int *))                           \
    X(cuDeviceGetDefaultMemPool, CUresult, (CUmemoryPool *, CUdevice))                               \
    X(cuDeviceGetMemPool, CUresult, (CUmemoryPool *, CUdevice))                                      \
    X(cuMemPoolGetAttribute, CUresult, (CUmemoryPool, int, void *))                                  \
    X(cuCtxSetCurrent, CUresult, (CUcontext))                                                        \
    X(cuCtxGetCurrent, CUresult, (CUcontext *))                                                      \
    X(cuCtxGetLimit, CUresult, (size_t *, int))                                                      \
    X(cuCtxSetLimit, CUresult, (int, size_t))                                                        \
    X(cuCtxGetCacheConfig, CUresult, (int *))                                                        \
    X(cuCtxGetSharedMemConfig, CUresult, (int *))                                                    \
    X(cuCtxGetStreamPriorityRange, CUresult, (int *, int *))                                         \
    X(cuCtxGetApiVersion, CUresult, (CUcontext, unsigned *))                                         \
    X(cuCtxGetFlags, CUresult, (unsigned *))                                                         \
    /* CUDA 13.0's cuGetProcAddress gives the _v2 of these two (a context argument); an older   \
     * driver's version ignores the extra argument. */                                            \
    X(cuCtxGetDevice, CUresult, (CUdevice *, CUcontext))                                                        \
    X(cuCtxGetId, CUresult, (CUcontext, u64 *))                                                      \
    X(cuCtxSynchronize, CUresult, (CUcontext))                                                            \
    X(cuMemGetInfo, CUresult, (size_t *, size_t *))                                                  \
    X(cuMemAlloc, CUresult, (CUdeviceptr *, size_t))                                                 \
    X(cuMemFree, CUresult, (CUdeviceptr))                                                            \
    X(cuMemAllocHost, CUresult, (void **, size_t))                                                   \
    X(cuMemFreeHost, CUresult, (void *))                                                             \
    X(cuMemHostAlloc, CUresult, (void **, size_t, unsigned))                                         \
    X(cuMemHostGetFlags, CUresult, (unsigned *, void *))                                             \
    X(cuMemHostGetDevicePointer, CUresult, (CUdeviceptr *, void *, unsigned))                        \
    X(cuMemHostRegister, CUresult, (void *, size_t, unsigned))                                       \
    X(cuMemHostUnregister, CUresult, (void *))                                                       \
    X(cuMemAllocManaged, CUresult, (CUdeviceptr *, size_t, unsigned))                                \
    X(cuMemAllocAsync, CUresult, (CUdeviceptr *, size_t, CUstream))                                  \
    X(cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                             \
    X(cuMemGetAddressRange, CUresult, (CUdeviceptr *, size_t *, CUdeviceptr))                        \
    X(cuMemcpyHtoD, CUresult, (CUdeviceptr, const void *, size_t))                                   \
    X(cuMemcpyDtoH, CUresult, (void *, CUdeviceptr, size_t))                                         \
    X(cuMemsetD8, CUresult, (CUdeviceptr, unsigned char, size_t))                                    \
    X(cuPointerGetAttribute, CUresult, (void *, int, CUdeviceptr))                                   \
    X(cuPointerGetAttributes, CUresult, (unsigned, int *, void **, CUdeviceptr))                     \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                                        \
    X(cuModuleUnload, CUresult, (CUmodule))                                                          \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))                         \
    X(cuModuleGetGlobal, CUresult, (CUdeviceptr *, size_t *, CUmodule, const char *))                \
    X(cuFuncGetAttribute, CUresult, (int *, int, CUfunction))                                        \
    X(cuFuncSetAttribute, CUresult, (CUfunction, int, int))                                          \
    X(cuLaunchKernel, CUresult,                                                                      \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,   \
       void **, void **))                                                                            \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, CUresult, (int *, CUfunction, int, size_t))       \
    X(cuOccupancyMaxPotentialBlockSize, CUresult, (int *, int *, CUfunction, void *, size_t, int))   \
    X(cuOccupancyAvailableDynamicSMemPerBlock, CUresult, (size_t *, CUfunction, int, int))           \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned))                                              \
    X(cuStreamCreateWithPriority, CUresult, (CUstream *, unsigned, int))                             \
    X(cuStreamDestroy, CUresult, (CUstream))                                                         \
    X(cuStreamSynchronize, CUresult, (CUstream))                                                     \
    X(cuStreamQuery, CUresult, (CUstream))                                                           \
    X(cuStreamGetPriority, CUresult, (CUstream, int *))                                              \
    X(cuStreamGetFlags, CUresult, (CUstream, unsigned *))                                            \
    X(cuEventCreate, CUresult, (CUevent *, unsigned))                                                \
    X(cuEventDestroy, CUresult, (CUevent))                                                           \
    X(cuEventQuery, CUresult, (CUevent))                                                             \
    X(cuEventSynchronize, CUresult, (CUevent))                                                       \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                                  \
    X(cuEventElapsedTime, CUresult, (float *, CUevent, CUevent))                                     \
    X(cuGetExportTable, CUresult, (const void **, const CUuuid *))
DRIVER_FUNCTIONS(FN)

/* dlsym names for the fallback path (the versioned exports of libcuda.so.1). */
static const char *fallback_name(const char *name) {
    static const char *const v2[] = {
        "cuDeviceTotalMem", "cuDeviceGetUuid", "cuDevicePrimaryCtxRelease", "cuMemGetInfo",
        "cuMemAlloc", "cuMemFree", "cuMemAllocHost", "cuMemHostGetDevicePointer",
        "cuMemHostRegister", "cuMemGetAddressRange", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemsetD8",
        "cuModuleGetGlobal", "cuStreamDestroy", "cuEventDestroy", "cuEventElapsedTime", NULL};
    static char buf[128];
    for (int i = 0; v2[i]; i++)
        if (!strcmp(v2[i], name)) {
            snprintf(buf, sizeof buf, "%s_v2", name);
            return buf;
        }
    return name;
}

static CUresult missing(void) { return (CUresult)-1; }

static int load_driver(void) {
    const char *path = getenv("CONFORMANCE_LIBCUDA");
    lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        kv("probe.dlopen", "failed");
        return -1;
    }
    gpa = (gpa_t)dlsym(lib, "cuGetProcAddress_v2");
#define LOAD(name, ret, args)                                                                        \
    p_##name = (ret(*) args)sym(#name, fallback_name(#name));                                        \
    if (!p_##name) p_##name = (ret(*) args)(void *)missing;
    DRIVER_FUNCTIONS(LOAD)
    return 0;
}

/* A missing entry point reports -1: `error -1`. */

/* ---- a tiny module ------------------------------------------------------------------------- */

static const char ptx_main[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .global .align 4 .u32 conf_global[64];\n"
    "\n"
    ".visible .entry conf_kernel(.param .u64 conf_kernel_p)\n"
    "{\n"
    "  .reg .b32 %r<6>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [conf_kernel_p];\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mad.lo.s32 %r4, %r2, %r3, %r1;\n"
    "  mul.wide.u32 %rd3, %r4, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  add.s32 %r5, %r4, 7;\n"
    "  st.global.u32 [%rd4], %r5;\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry conf_shared(.param .u64 conf_shared_p)\n"
    "{\n"
    "  .shared .align 4 .b8 conf_sbuf[4096];\n"
    "  .reg .b32 %r<5>;\n"
    "  .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd1, [conf_shared_p];\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mov.u32 %r1, %tid.x;\n"
    "  mul.wide.u32 %rd3, %r1, 4;\n"
    "  mov.u64 %rd4, conf_sbuf;\n"
    "  add.s64 %rd5, %rd4, %rd3;\n"
    "  st.shared.u32 [%rd5], %r1;\n"
    "  bar.sync 0;\n"
    "  xor.b32 %r2, %r1, 1;\n"
    "  mul.wide.u32 %rd3, %r2, 4;\n"
    "  add.s64 %rd5, %rd4, %rd3;\n"
    "  ld.shared.u32 %r3, [%rd5];\n"
    "  mul.wide.u32 %rd3, %r1, 4;\n"
    "  add.s64 %rd5, %rd2, %rd3;\n"
    "  st.global.u32 [%rd5], %r3;\n"
    "  ret;\n"
    "}\n";

/* The __managed__ variable in a module of its own, so the main module loads where it is not
 * supported. */
static const char ptx_managed[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .global .attribute(.managed) .align 4 .u32 conf_managed[16];\n";

/* ---- common setup -------------------------------------------------------------------------- */

static CUdevice dev;
static CUcontext ctx;
static int have_ctx;

static int setup(void) {
    CUresult rc = p_cuInit(0);
    if (rc != CUDA_SUCCESS) {
        kv("setup.cuInit", "%s", rcs(rc));
        return -1;
    }
    if ((rc = p_cuDeviceGet(&dev, 0)) != CUDA_SUCCESS) {
        kv("setup.cuDeviceGet", "%s", rcs(rc));
        return -1;
    }
    if ((rc = p_cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) {
        kv("setup.cuDevicePrimaryCtxRetain", "%s", rcs(rc));
        return -1;
    }
    if ((rc = p_cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) {
        kv("setup.cuCtxSetCurrent", "%s", rcs(rc));
        return -1;
    }
    have_ctx = 1;
    return 0;
}

static void teardown(void) {
    if (have_ctx) p_cuDevicePrimaryCtxRelease(dev);
}

static CUmodule load_module(const char *ptx, const char *key) {
    CUmodule m = NULL;
    CUresult rc = p_cuModuleLoadData(&m, ptx);
    kv(key, "%s", rcs(rc));
    return rc == CUDA_SUCCESS ? m : NULL;
}

/* ---- section: device ----------------------------------------------------------------------- */

static void section_device(void) {
    int v = -1;
    kv("driver.cuInit", "%s", rcs(p_cuInit(0)));
    CUresult rc = p_cuDriverGetVersion(&v);
    kv("driver.version", "%s", rc ? rcs(rc) : K("%d", v));
    kv("driver.cuInit_flags_1", "%s", rcs(p_cuInit(1)));
    int n = -1;
    rc = p_cuDeviceGetCount(&n);
    kv("driver.device_count", "%s", rc ? rcs(rc) : K("%d", n));
    for (int i = 0; i < n && i < 16; i++) {
        CUdevice d;
        rc = p_cuDeviceGet(&d, i);
        kv(K("dev%d.cuDeviceGet", i), "%s", rcs(rc));
        if (rc) continue;
        char name[256] = {0};
        rc = p_cuDeviceGetName(name, sizeof name, d);
        kv(K("dev%d.name", i), "%s", rc ? rcs(rc) : name);
        size_t total = 0;
        rc = p_cuDeviceTotalMem(&total, d);
        kv(K("intended.dev%d.total_mem", i), "%s", rc ? rcs(rc) : K("%zu", total));
        int major = -1, minor = -1;
        rc = p_cuDeviceComputeCapability(&major, &minor, d);
        kv(K("dev%d.compute_capability_deprecated_call", i), "%s",
           rc ? rcs(rc) : K("%d.%d", major, minor));
        CUuuid u;
        memset(&u, 0, sizeof u);
        rc = p_cuDeviceGetUuid(&u, d);
        if (rc) {
            kv(K("intended.dev%d.uuid", i), "%s", rcs(rc));
        } else {
            char hex[40];
            for (int b = 0; b < 16; b++) sprintf(hex + 2 * b, "%02x", (unsigned char)u.bytes[b]);
            kv(K("intended.dev%d.uuid", i), "%s", hex);
            int zero = 1;
            for (int b = 0; b < 16; b++) zero &= u.bytes[b] == 0;
            kv(K("dev%d.uuid_nonzero", i), "%s", zero ? "no" : "yes");
        }
        char bus[64] = {0};
        rc = p_cuDeviceGetPCIBusId(bus, sizeof bus, d);
        kv(K("intended.dev%d.pci_bus_id", i), "%s", rc ? rcs(rc) : bus);
        int can = -1;
        rc = p_cuDeviceCanAccessPeer(&can, d, d);
        kv(K("dev%d.can_access_peer_self", i), "%s", rc ? rcs(rc) : K("%d", can));
        unsigned flags = 0;
        int active = -1;
        rc = p_cuDevicePrimaryCtxGetState(d, &flags, &active);
        kv(K("dev%d.primary_ctx_state_before_retain", i), "%s",
           rc ? rcs(rc) : K("flags=0x%x active=%d", flags, active));
        for (int a = 1; a <= CONF_DEV_ATTR_LAST; a++) {
            const char *an = conf_dev_attr_names[a] ? conf_dev_attr_names[a] : "UNNAMED";
            int val = 0;
            rc = p_cuDeviceGetAttribute(&val, a, d);
            /* The PCI location is the machine's, which a virtualizer may renumber. */
            const char *pre = (a == 33 || a == 34 || a == 50) ? "intended." : "";
            kv(K("%sdev%d.attr.%03d.%s", pre, i, a, an), "%s", rc ? rcs(rc) : K("%d", val));
        }
        for (int a = CONF_DEV_ATTR_LAST + 1; a <= CONF_DEV_ATTR_LAST + 3; a++) {
            int val = 0;
            rc = p_cuDeviceGetAttribute(&val, a, d);
            kv(K("dev%d.attr.unknown_last_plus_%d", i, a - CONF_DEV_ATTR_LAST), "%s",
               rc ? rcs(rc) : "success");
        }
    }
}

/* ---- section: context ---------------------------------------------------------------------- */

static void mempool_attrs(const char *prefix, CUmemoryPool pool) {
    for (int a = 1; a <= CONF_MEMPOOL_ATTR_LAST; a++) {
        unsigned char buf[16];
        memset(buf, 0, sizeof buf);
        CUresult rc = p_cuMemPoolGetAttribute(pool, a, buf);
        const char *an = conf_mempool_attr_names[a] ? conf_mempool_attr_names[a] : "UNNAMED";
        /* 64-bit attributes: thresholds and sizes; the rest are int. */
        int wide = (a >= 4 && a <= 8) || a == 13;
        u64 v = 0;
        if (wide)
            memcpy(&v, buf, 8);
        else {
            int iv;
            memcpy(&iv, buf, 4);
            v = (u64)(long long)iv;
        }
        kv(K("%s.%02d.%s", prefix, a, an), "%s", rc ? rcs(rc) : K("%lld", (long long)v));
    }
}

static void section_context(void) {
    CUresult rc;
    unsigned flags = 0;
    int active = -1;
    rc = p_cuDevicePrimaryCtxGetState(dev, &flags, &active);
    kv("ctx.primary_state_after_retain", "%s",
       rc ? rcs(rc) : K("flags=0x%x active=%d", flags, active));
    for (int l = 0; l <= CONF_LIMIT_LAST + 1; l++) {
        size_t v = 0;
        rc = p_cuCtxGetLimit(&v, l);
        const char *ln = l <= CONF_LIMIT_LAST && conf_limit_names[l] ? conf_limit_names[l] : "UNKNOWN";
        kv(K("ctx.limit.%02d.%s", l, ln), "%s", rc ? rcs(rc) : K("%zu", v));
    }
    /* Setting limits: stack size, printf FIFO and heap, read back (the driver may round). */
    static const struct { int limit; size_t value; } sets[] = {
        {0, 4096}, {0, 1000}, {1, 4 << 20}, {2, 16 << 20}, {5, 64}, {7, 1}, {99, 1}};
    for (unsigned i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        size_t before = 0, after = 0;
        p_cuCtxGetLimit(&before, sets[i].limit);
        rc = p_cuCtxSetLimit(sets[i].limit, sets[i].value);
        CUresult rc2 = p_cuCtxGetLimit(&after, sets[i].limit);
        kv(K("ctx.set_limit.%d.%zu", sets[i].limit, sets[i].value), "%s -> %s", rcs(rc),
           rc2 ? rcs(rc2) : K("%zu", after));
        if (rc == CUDA_SUCCESS) p_cuCtxSetLimit(sets[i].limit, before);
    }
    int cfg = -1;
    rc = p_cuCtxGetCacheConfig(&cfg);
    kv("ctx.cache_config", "%s", rc ? rcs(rc) : K("%d", cfg));
    cfg = -1;
    rc = p_cuCtxGetSharedMemConfig(&cfg);
    kv("ctx.shared_mem_config", "%s", rc ? rcs(rc) : K("%d", cfg));
    int lo = 99, hi = 99;
    rc = p_cuCtxGetStreamPriorityRange(&lo, &hi);
    kv("ctx.stream_priority_range", "%s", rc ? rcs(rc) : K("least=%d greatest=%d", lo, hi));
    unsigned api = 0;
    rc = p_cuCtxGetApiVersion(ctx, &api);
    kv("ctx.api_version", "%s", rc ? rcs(rc) : K("%u", api));
    rc = p_cuCtxGetApiVersion(NULL, &api);
    kv("ctx.api_version_null_ctx", "%s", rc ? rcs(rc) : K("%u", api));
    flags = 0;
    rc = p_cuCtxGetFlags(&flags);
    kv("ctx.flags", "%s", rc ? rcs(rc) : K("0x%x", flags));
    CUdevice d = -1;
    rc = p_cuCtxGetDevice(&d, ctx);
    kv("ctx.device", "%s", rc ? rcs(rc) : K("%d", (int)d));
    CUcontext cur = NULL;
    rc = p_cuCtxGetCurrent(&cur);
    kv("ctx.current_is_primary", "%s", rc ? rcs(rc) : (cur == ctx ? "yes" : "no"));
    u64 id = 0;
    rc = p_cuCtxGetId(ctx, &id);
    kv("ctx.id_nonzero", "%s", rc ? rcs(rc) : (id ? "yes" : "no"));
    kv("ctx.synchronize", "%s", rcs(p_cuCtxSynchronize(ctx)));
    size_t fr = 0, tot = 0;
    rc = p_cuMemGetInfo(&fr, &tot);
    kv("intended.ctx.mem_info.total", "%s", rc ? rcs(rc) : K("%zu", tot));
    kv("intended.ctx.mem_info.free", "%s", rc ? rcs(rc) : K("%zu", fr));
    if (!rc) kv("ctx.mem_info.free_le_total", "%s", fr <= tot ? "yes" : "no");
    size_t dtot = 0;
    if (!rc && p_cuDeviceTotalMem(&dtot, dev) == CUDA_SUCCESS)
        kv("ctx.mem_info.total_eq_device_total", "%s", dtot == tot ? "yes" : "no");

    CUmemoryPool pool = NULL, pool2 = NULL;
    rc = p_cuDeviceGetDefaultMemPool(&pool, dev);
    kv("mempool.default.get", "%s", rcs(rc));
    rc = p_cuDeviceGetMemPool(&pool2, dev);
    kv("mempool.current.get", "%s", rc ? rcs(rc) : (pool2 == pool ? "default" : "other"));
    if (pool) mempool_attrs("mempool.default.attr", pool);

    /* Streams: default priority and flags. */
    CUstream s = NULL;
    rc = p_cuStreamCreate(&s, 0);
    kv("stream.create", "%s", rcs(rc));
    if (!rc) {
        int prio = 99;
        unsigned sf = 99;
        rc = p_cuStreamGetPriority(s, &prio);
        kv("stream.priority", "%s", rc ? rcs(rc) : K("%d", prio));
        rc = p_cuStreamGetFlags(s, &sf);
        kv("stream.flags", "%s", rc ? rcs(rc) : K("0x%x", sf));
        kv("stream.query_idle", "%s", rcs(p_cuStreamQuery(s)));
        kv("stream.destroy", "%s", rcs(p_cuStreamDestroy(s)));
    }
    rc = p_cuStreamCreateWithPriority(&s, 1, -1000);
    kv("stream.create_priority_-1000_nonblocking", "%s", rcs(rc));
    if (!rc) {
        int prio = 99;
        unsigned sf = 99;
        rc = p_cuStreamGetPriority(s, &prio);
        kv("stream.priority_clamped", "%s", rc ? rcs(rc) : K("%d", prio));
        rc = p_cuStreamGetFlags(s, &sf);
        kv("stream.flags_nonblocking", "%s", rc ? rcs(rc) : K("0x%x", sf));
        p_cuStreamDestroy(s);
    }
    int prio = 99;
    rc = p_cuStreamGetPriority(NULL, &prio);
    kv("stream.null_priority", "%s", rc ? rcs(rc) : K("%d", prio));
    kv("stream.null_query", "%s", rcs(p_cuStreamQuery(NULL)));
}

/* ---- sections: pointer attributes ---------------------------------------------------------- */

struct region {
    const char *kind;
    CUdeviceptr ptr;   /* the pointer asked about */
    CUdeviceptr base;  /* the allocation it is in */
    size_t size;
    void *host;        /* the host pointer of host memory, else NULL */
};

static CUdeviceptr mapped_dev; /* cuMemHostGetDevicePointer's answer, 0 if none */
static CUmemoryPool default_pool;

static const char *addr_rel(u64 v, const struct region *r) {
    static char buf[64];
    if (v == 0) return "null";
    if (v == r->ptr) return "ptr";
    if (v == r->base) return "base";
    if (r->host && v == (u64)(uintptr_t)r->host) return "host_ptr";
    if (mapped_dev && v == mapped_dev) return "mapped_device_ptr";
    if (v > r->base && v < r->base + r->size) {
        snprintf(buf, sizeof buf, "base+%llu", (unsigned long long)(v - r->base));
        return buf;
    }
    return "other";
}

static int ptr_attr_wide(int a) {
    return a == 1 || a == 3 || a == 4 || a == 7 || a == 11 || a == 12 || a == 14 || a == 17 ||
           a == 18 || a == 19 || a == 20;
}

static const char *ptr_value(int a, const unsigned char *buf, const struct region *r) {
    static char out[96];
    u64 w = 0;
    unsigned u = 0;
    memcpy(&w, buf, 8);
    memcpy(&u, buf, 4);
    switch (a) {
    case 1: /* CONTEXT */
        return w == 0 ? "null" : (w == (u64)(uintptr_t)ctx ? "current" : "other");
    case 3: case 4: case 11: case 19: /* addresses */
        return addr_rel(w, r);
    case 5: /* P2P_TOKENS: handles */
        return "returned";
    case 7: case 20: /* unique ids */
        return w ? "nonzero" : "0";
    case 17: /* MEMPOOL_HANDLE */
        return w == 0 ? "null" : (w == (u64)(uintptr_t)default_pool ? "default_pool" : "other");
    default:
        if (ptr_attr_wide(a))
            snprintf(out, sizeof out, "%llu", (unsigned long long)w);
        else
            snprintf(out, sizeof out, "%d", (int)u);
        return out;
    }
}

static void describe(const struct region *r) {
    const char *k = r->kind;
    mapped_dev = 0;
    if (r->host) {
        unsigned f = 0xdead;
        CUresult rc = p_cuMemHostGetFlags(&f, r->host);
        kv(K("ptr.%s.host_get_flags", k), "%s", rc ? rcs(rc) : K("0x%x", f));
        CUdeviceptr dp = 0;
        rc = p_cuMemHostGetDevicePointer(&dp, r->host, 0);
        if (!rc) mapped_dev = dp;
        kv(K("ptr.%s.host_get_device_pointer", k), "%s",
           rc ? rcs(rc) : (dp == (CUdeviceptr)(uintptr_t)r->host ? "host_ptr" : (dp ? "other" : "null")));
    } else {
        unsigned f = 0xdead;
        CUresult rc = p_cuMemHostGetFlags(&f, (void *)(uintptr_t)r->ptr);
        kv(K("ptr.%s.host_get_flags", k), "%s", rc ? rcs(rc) : K("0x%x", f));
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult rc = p_cuMemGetAddressRange(&base, &size, r->ptr);
    kv(K("ptr.%s.address_range", k), "%s",
       rc ? rcs(rc) : K("%s size=%zu", addr_rel(base, r), size));
    for (int a = 1; a <= CONF_PTR_ATTR_LAST; a++) {
        unsigned char buf[32];
        memset(buf, 0, sizeof buf);
        rc = p_cuPointerGetAttribute(buf, a, r->ptr);
        const char *an = conf_ptr_attr_names[a] ? conf_ptr_attr_names[a] : "UNNAMED";
        kv(K("ptr.%s.attr.%02d.%s", k, a, an), "%s", rc ? rcs(rc) : ptr_value(a, buf, r));
    }
    /* cuPointerGetAttributes: attributes 1-20 but the deprecated P2P tokens, in one call (one
     * attribute the driver does not know fails the whole call: 21 and 22 are asked singly). */
    int attrs[CONF_PTR_ATTR_LAST];
    unsigned char store[CONF_PTR_ATTR_LAST][32];
    void *data[CONF_PTR_ATTR_LAST];
    unsigned n = 0;
    for (int a = 1; a <= 20 && a <= CONF_PTR_ATTR_LAST; a++) {
        if (a == 5) continue;
        attrs[n] = a;
        memset(store[n], 0, sizeof store[n]);
        data[n] = store[n];
        n++;
    }
    rc = p_cuPointerGetAttributes(n, attrs, data, r->ptr);
    kv(K("ptr.%s.attrs_call", k), "%s", rcs(rc));
    if (!rc)
        for (unsigned i = 0; i < n; i++)
            kv(K("ptr.%s.attrs.%02d.%s", k, attrs[i], conf_ptr_attr_names[attrs[i]]), "%s",
               ptr_value(attrs[i], store[i], r));
}

static void section_ptr_device(void) {
    CUresult rc;
    p_cuDeviceGetDefaultMemPool(&default_pool, dev);
    CUdeviceptr d = 0;
    rc = p_cuMemAlloc(&d, 4096);
    kv("ptr.device.alloc", "%s", rcs(rc));
    if (!rc) {
        struct region r = {"device", d, d, 4096, NULL};
        describe(&r);
        struct region r2 = {"device_offset_256", d + 256, d, 4096, NULL};
        describe(&r2);
        kv("ptr.device.free", "%s", rcs(p_cuMemFree(d)));
        struct region r3 = {"device_freed", d, d, 4096, NULL};
        describe(&r3);
    }
    CUstream s = NULL;
    p_cuStreamCreate(&s, 1);
    d = 0;
    rc = p_cuMemAllocAsync(&d, 4096, s);
    kv("ptr.pool.alloc_async", "%s", rcs(rc));
    if (!rc) {
        kv("ptr.pool.sync", "%s", rcs(p_cuStreamSynchronize(s)));
        struct region r = {"pool", d, d, 4096, NULL};
        describe(&r);
        mempool_attrs("ptr.pool.default_pool_attr_while_allocated", default_pool);
        kv("ptr.pool.free_async", "%s", rcs(p_cuMemFreeAsync(d, s)));
        kv("ptr.pool.sync_after_free", "%s", rcs(p_cuStreamSynchronize(s)));
    }
    if (s) p_cuStreamDestroy(s);
    /* A null pointer and a made-up one. */
    struct region rn = {"null", 0, 0, 0, NULL};
    describe(&rn);
    struct region rb = {"bogus_device_address", 0xdead0000ull, 0xdead0000ull, 16, NULL};
    describe(&rb);
}

static void *aligned_malloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n)) return NULL;
    memset(p, 0, n);
    return p;
}

static void section_ptr_host(void) {
    CUresult rc;
    p_cuDeviceGetDefaultMemPool(&default_pool, dev);
    void *h = NULL;
    rc = p_cuMemAllocHost(&h, 4096);
    kv("ptr.alloc_host.alloc", "%s", rcs(rc));
    if (!rc) {
        struct region r = {"alloc_host", (CUdeviceptr)(uintptr_t)h, (CUdeviceptr)(uintptr_t)h, 4096, h};
        describe(&r);
        struct region r2 = {"alloc_host_offset_256", (CUdeviceptr)(uintptr_t)h + 256,
                            (CUdeviceptr)(uintptr_t)h, 4096, (char *)h + 256};
        describe(&r2);
        kv("ptr.alloc_host.free", "%s", rcs(p_cuMemFreeHost(h)));
    }
    static const char *const fl[] = {"0", "portable", "devicemap", "portable_devicemap",
                                     "writecombined", "portable_writecombined",
                                     "devicemap_writecombined", "portable_devicemap_writecombined"};
    for (unsigned f = 0; f < 8; f++) {
        char kind[96];
        snprintf(kind, sizeof kind, "host_alloc_%s", fl[f]);
        h = NULL;
        rc = p_cuMemHostAlloc(&h, 4096, f);
        kv(K("ptr.%s.alloc", kind), "%s", rcs(rc));
        if (rc) continue;
        struct region r = {kind, (CUdeviceptr)(uintptr_t)h, (CUdeviceptr)(uintptr_t)h, 4096, h};
        describe(&r);
        kv(K("ptr.%s.free", kind), "%s", rcs(p_cuMemFreeHost(h)));
    }
    static const char *const rf[] = {"0", "portable", "devicemap", "portable_devicemap",
                                     "read_only"};
    static const unsigned rv[] = {0, 1, 2, 3, 8};
    for (unsigned i = 0; i < 5; i++) {
        char kind[96];
        snprintf(kind, sizeof kind, "registered_%s", rf[i]);
        void *m = aligned_malloc(8192);
        rc = p_cuMemHostRegister(m, 8192, rv[i]);
        kv(K("ptr.%s.register", kind), "%s", rcs(rc));
        if (!rc) {
            struct region r = {kind, (CUdeviceptr)(uintptr_t)m, (CUdeviceptr)(uintptr_t)m, 8192, m};
            describe(&r);
            if (i == 0) {
                kv("err.host_register_twice", "%s", rcs(p_cuMemHostRegister(m, 8192, 0)));
            }
            kv(K("ptr.%s.unregister", kind), "%s", rcs(p_cuMemHostUnregister(m)));
            if (i == 0)
                kv("err.host_unregister_twice", "%s", rcs(p_cuMemHostUnregister(m)));
        }
        free(m);
    }
    /* Registering part of a malloc'd buffer, unaligned. */
    char *m = malloc(10000);
    rc = p_cuMemHostRegister(m + 100, 5000, 0);
    kv("ptr.registered_unaligned.register", "%s", rcs(rc));
    if (!rc) {
        struct region r = {"registered_unaligned", (CUdeviceptr)(uintptr_t)(m + 100),
                           (CUdeviceptr)(uintptr_t)(m + 100), 5000, m + 100};
        describe(&r);
        p_cuMemHostUnregister(m + 100);
    }
    free(m);
    void *pg = aligned_malloc(4096);
    struct region r = {"pageable_malloc", (CUdeviceptr)(uintptr_t)pg, (CUdeviceptr)(uintptr_t)pg, 4096, pg};
    describe(&r);
    kv("err.mem_free_host_of_malloc", "%s", rcs(p_cuMemFreeHost(pg)));
    free(pg);
    int local = 0;
    struct region rs = {"stack", (CUdeviceptr)(uintptr_t)&local, (CUdeviceptr)(uintptr_t)&local,
                        sizeof local, &local};
    describe(&rs);
}

static void section_ptr_managed(void) {
    CUresult rc;
    p_cuDeviceGetDefaultMemPool(&default_pool, dev);
    static const struct { const char *kind; unsigned flags; } kinds[] = {
        {"managed_global", 1}, {"managed_host", 2}};
    for (int i = 0; i < 2; i++) {
        CUdeviceptr d = 0;
        rc = p_cuMemAllocManaged(&d, 4096, kinds[i].flags);
        kv(K("ptr.%s.alloc", kinds[i].kind), "%s", rcs(rc));
        if (rc) continue;
        struct region r = {kinds[i].kind, d, d, 4096, NULL};
        describe(&r);
        /* Host access to managed memory. */
        volatile unsigned *hp = (volatile unsigned *)(uintptr_t)d;
        hp[3] = 0x5a5a;
        kv(K("ptr.%s.host_write_read", kinds[i].kind), "0x%x", hp[3]);
        kv(K("ptr.%s.free", kinds[i].kind), "%s", rcs(p_cuMemFree(d)));
    }
    CUdeviceptr d = 0;
    kv("err.mem_alloc_managed_flags_0", "%s", rcs(p_cuMemAllocManaged(&d, 4096, 0)));
    if (d) p_cuMemFree(d);
    d = 0;
    kv("err.mem_alloc_managed_size_0", "%s", rcs(p_cuMemAllocManaged(&d, 0, 1)));
    if (d) p_cuMemFree(d);
}

static void section_ptr_module(void) {
    CUresult rc;
    p_cuDeviceGetDefaultMemPool(&default_pool, dev);
    CUmodule m = load_module(ptx_main, "module.main.load");
    if (m) {
        CUdeviceptr g = 0;
        size_t sz = 0;
        rc = p_cuModuleGetGlobal(&g, &sz, m, "conf_global");
        kv("module.main.get_global", "%s", rc ? rcs(rc) : K("size=%zu", sz));
        if (!rc) {
            struct region r = {"module_global", g, g, sz, NULL};
            describe(&r);
        }
        g = 0;
        rc = p_cuModuleGetGlobal(&g, NULL, m, "conf_global");
        kv("module.main.get_global_null_size", "%s", rcs(rc));
        rc = p_cuModuleGetGlobal(&g, &sz, m, "no_such_global");
        kv("err.module_get_global_bad_name", "%s", rcs(rc));
        kv("module.main.unload", "%s", rcs(p_cuModuleUnload(m)));
    }
    m = load_module(ptx_managed, "module.managed.load");
    if (m) {
        CUdeviceptr g = 0;
        size_t sz = 0;
        rc = p_cuModuleGetGlobal(&g, &sz, m, "conf_managed");
        kv("module.managed.get_global", "%s", rc ? rcs(rc) : K("size=%zu", sz));
        if (!rc) {
            struct region r = {"module_managed", g, g, sz, NULL};
            describe(&r);
        }
        kv("module.managed.unload", "%s", rcs(p_cuModuleUnload(m)));
    }
}

/* ---- section: kernel (function attributes, occupancy, launches) ----------------------------- */

static void section_kernel(void) {
    CUresult rc;
    CUmodule m = load_module(ptx_main, "kernel.module_load");
    if (!m) return;
    CUfunction f = NULL, fs = NULL, fx = NULL;
    kv("kernel.get_function", "%s", rcs(p_cuModuleGetFunction(&f, m, "conf_kernel")));
    kv("kernel.get_function_shared", "%s", rcs(p_cuModuleGetFunction(&fs, m, "conf_shared")));
    kv("err.module_get_function_bad_name", "%s",
       rcs(p_cuModuleGetFunction(&fx, m, "no_such_kernel")));
    const struct { const char *name; CUfunction fn; } fns[] = {{"conf_kernel", f}, {"conf_shared", fs}};
    for (int i = 0; i < 2; i++) {
        if (!fns[i].fn) continue;
        for (int a = 0; a <= CONF_FUNC_ATTR_LAST + 1; a++) {
            int v = -1;
            rc = p_cuFuncGetAttribute(&v, a, fns[i].fn);
            const char *an =
                a <= CONF_FUNC_ATTR_LAST && conf_func_attr_names[a] ? conf_func_attr_names[a] : "UNKNOWN";
            kv(K("func.%s.attr.%02d.%s", fns[i].name, a, an), "%s", rc ? rcs(rc) : K("%d", v));
        }
        static const int blocks[] = {1, 32, 64, 128, 256, 512, 1024, 1025};
        static const size_t smem[] = {0, 4096, 49152, 100000};
        for (unsigned b = 0; b < sizeof blocks / sizeof blocks[0]; b++)
            for (unsigned s = 0; s < sizeof smem / sizeof smem[0]; s++) {
                int n = -1;
                rc = p_cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, fns[i].fn, blocks[b], smem[s]);
                kv(K("occupancy.%s.block_%d.smem_%zu", fns[i].name, blocks[b], smem[s]), "%s",
                   rc ? rcs(rc) : K("%d", n));
            }
        int mg = -1, bs = -1;
        rc = p_cuOccupancyMaxPotentialBlockSize(&mg, &bs, fns[i].fn, NULL, 0, 0);
        kv(K("occupancy.%s.max_potential_block_size", fns[i].name), "%s",
           rc ? rcs(rc) : K("min_grid=%d block=%d", mg, bs));
        rc = p_cuOccupancyMaxPotentialBlockSize(&mg, &bs, fns[i].fn, NULL, 8192, 256);
        kv(K("occupancy.%s.max_potential_block_size_smem8192_limit256", fns[i].name), "%s",
           rc ? rcs(rc) : K("min_grid=%d block=%d", mg, bs));
        static const int nb[][2] = {{1, 128}, {4, 256}, {16, 1024}};
        for (int j = 0; j < 3; j++) {
            size_t av = 0;
            rc = p_cuOccupancyAvailableDynamicSMemPerBlock(&av, fns[i].fn, nb[j][0], nb[j][1]);
            kv(K("occupancy.%s.available_dynamic_smem.blocks_%d.threads_%d", fns[i].name, nb[j][0],
                 nb[j][1]),
               "%s", rc ? rcs(rc) : K("%zu", av));
        }
    }
    if (!f) return;
    CUdeviceptr out = 0;
    rc = p_cuMemAlloc(&out, 4096);
    if (rc) {
        kv("launch.alloc", "%s", rcs(rc));
        return;
    }
    p_cuMemsetD8(out, 0, 4096);
    void *params[] = {&out};
    rc = p_cuLaunchKernel(f, 2, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    kv("launch.ok", "%s", rcs(rc));
    kv("launch.ok_sync", "%s", rcs(p_cuCtxSynchronize(ctx)));
    unsigned host[64];
    memset(host, 0, sizeof host);
    rc = p_cuMemcpyDtoH(host, out, sizeof host);
    unsigned sum = 0;
    for (int i = 0; i < 64; i++) sum += host[i];
    kv("launch.ok_result_sum", "%s", rc ? rcs(rc) : K("%u", sum)); /* sum(i + 7), i < 64 = 2464 */
    /* Launches the driver must refuse (none of them is sticky). Cheap ones first: once one is
     * accepted, the large grids are not tried (an emulated GPU would run them). */
    static const struct {
        const char *name;
        unsigned g[3], b[3], smem;
    } bad[] = {
        {"block_1025", {1, 1, 1}, {1025, 1, 1}, 0},
        {"block_1024x2", {1, 1, 1}, {1024, 2, 1}, 0},
        {"block_z_65", {1, 1, 1}, {1, 1, 65}, 0},
        {"block_0", {1, 1, 1}, {0, 1, 1}, 0},
        {"grid_0", {0, 1, 1}, {32, 1, 1}, 0},
        {"smem_49153_no_optin", {1, 1, 1}, {32, 1, 1}, 49153},
        {"smem_1MiB", {1, 1, 1}, {32, 1, 1}, 1 << 20},
        {"grid_y_65536", {1, 65536, 1}, {32, 1, 1}, 0},
        {"grid_x_2pow31", {0x80000000u, 1, 1}, {32, 1, 1}, 0},
    };
    int accepted = 0;
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (accepted && bad[i].g[0] * bad[i].g[1] > 1) {
            kv(K("err.launch.%s", bad[i].name), "skipped (an invalid launch was accepted)");
            continue;
        }
        rc = p_cuLaunchKernel(f, bad[i].g[0], bad[i].g[1], bad[i].g[2], bad[i].b[0], bad[i].b[1],
                              bad[i].b[2], bad[i].smem, NULL, params, NULL);
        kv(K("err.launch.%s", bad[i].name), "%s", rcs(rc));
        if (rc == CUDA_SUCCESS) accepted = 1;
    }
    kv("launch.sync_after_refused", "%s", rcs(p_cuCtxSynchronize(ctx)));
    /* Opting into more dynamic shared memory, then launching with it. */
    rc = p_cuFuncSetAttribute(f, 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */, 100000);
    kv("func.conf_kernel.set_max_dynamic_smem_100000", "%s", rcs(rc));
    int v = -1;
    rc = p_cuFuncGetAttribute(&v, 8, f);
    kv("func.conf_kernel.max_dynamic_smem_after_set", "%s", rc ? rcs(rc) : K("%d", v));
    rc = p_cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 100000, NULL, params, NULL);
    kv("launch.smem_100000_after_optin", "%s", rcs(rc));
    kv("launch.smem_100000_after_optin_sync", "%s", rcs(p_cuCtxSynchronize(ctx)));
    rc = p_cuFuncSetAttribute(f, 8, 1 << 20);
    kv("err.func_set_max_dynamic_smem_1MiB", "%s", rcs(rc));
    rc = p_cuFuncSetAttribute(f, 9 /* PREFERRED_SHARED_MEMORY_CARVEOUT */, 50);
    kv("func.conf_kernel.set_carveout_50", "%s", rcs(rc));
    rc = p_cuFuncGetAttribute(&v, 9, f);
    kv("func.conf_kernel.carveout_after_set", "%s", rc ? rcs(rc) : K("%d", v));
    if (fs) {
        rc = p_cuLaunchKernel(fs, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL);
        kv("launch.shared_kernel", "%s", rcs(rc));
        kv("launch.shared_kernel_sync", "%s", rcs(p_cuCtxSynchronize(ctx)));
        rc = p_cuMemcpyDtoH(host, out, sizeof host);
        sum = 0;
        for (int i = 0; i < 64; i++) sum += host[i] * (unsigned)(i + 1);
        kv("launch.shared_kernel_checksum", "%s", rc ? rcs(rc) : K("%u", sum));
    }
    p_cuMemFree(out);
    kv("kernel.module_unload", "%s", rcs(p_cuModuleUnload(m)));
}

/* ---- section: errors (calls that must fail, each safe on a real driver) ---------------------- */

static void section_errors(void) {
    CUresult rc;
    CUdevice d;
    int n = 0;
    p_cuDeviceGetCount(&n);
    kv("err.device_get_minus_1", "%s", rcs(p_cuDeviceGet(&d, -1)));
    kv("err.device_get_count", "%s", rcs(p_cuDeviceGet(&d, n)));
    int v;
    kv("err.device_attribute_0", "%s", rcs(p_cuDeviceGetAttribute(&v, 0, dev)));
    kv("err.device_attribute_9999", "%s", rcs(p_cuDeviceGetAttribute(&v, 9999, dev)));
    kv("err.device_attribute_bad_device", "%s", rcs(p_cuDeviceGetAttribute(&v, 1, 99)));
    /* Not asked: cuDeviceGetName with length 0 (a segfault in driver 580). */
    size_t lim;
    kv("err.ctx_get_limit_99", "%s", rcs(p_cuCtxGetLimit(&lim, 99)));
    CUdeviceptr p = 0;
    rc = p_cuMemAlloc(&p, 0);
    kv("err.mem_alloc_0", "%s", rcs(rc));
    if (!rc && p) p_cuMemFree(p);
    size_t total = 0;
    p_cuDeviceTotalMem(&total, dev);
    p = 0;
    rc = p_cuMemAlloc(&p, total * 2);
    kv("err.mem_alloc_twice_device_total", "%s", rcs(rc));
    if (!rc) p_cuMemFree(p);
    p = 0;
    rc = p_cuMemAlloc(&p, (size_t)1 << 62);
    kv("err.mem_alloc_2pow62", "%s", rcs(rc));
    if (!rc) p_cuMemFree(p);
    kv("err.mem_free_0", "%s", rcs(p_cuMemFree(0)));
    kv("err.mem_free_bogus", "%s", rcs(p_cuMemFree(0xdead0000ull)));
    p = 0;
    rc = p_cuMemAlloc(&p, 4096);
    kv("err.setup_alloc", "%s", rcs(rc));
    if (!rc) {
        kv("err.mem_free_interior", "%s", rcs(p_cuMemFree(p + 256)));
        kv("err.mem_free_first", "%s", rcs(p_cuMemFree(p)));
        kv("err.mem_free_twice", "%s", rcs(p_cuMemFree(p)));
        char buf[64] = {0};
        kv("err.memcpy_htod_freed", "%s", rcs(p_cuMemcpyHtoD(p, buf, sizeof buf)));
        kv("err.memcpy_dtoh_freed", "%s", rcs(p_cuMemcpyDtoH(buf, p, sizeof buf)));
        kv("err.memset_d8_freed", "%s", rcs(p_cuMemsetD8(p, 0, 64)));
        kv("err.sync_after_freed_copies", "%s", rcs(p_cuCtxSynchronize(ctx)));
    }
    p = 0;
    rc = p_cuMemAlloc(&p, 4096);
    if (!rc) {
        char buf[8192] = {0};
        kv("err.memcpy_htod_past_end", "%s", rcs(p_cuMemcpyHtoD(p, buf, 8192)));
        kv("err.memcpy_dtoh_past_end", "%s", rcs(p_cuMemcpyDtoH(buf, p + 4000, 200)));
        kv("err.memset_d8_past_end", "%s", rcs(p_cuMemsetD8(p, 0, 8192)));
        kv("err.memcpy_htod_size_0", "%s", rcs(p_cuMemcpyHtoD(p, buf, 0)));
        kv("err.sync_after_past_end", "%s", rcs(p_cuCtxSynchronize(ctx)));
        p_cuMemFree(p);
    }
    void *h = NULL;
    rc = p_cuMemHostAlloc(&h, 0, 0);
    kv("err.mem_host_alloc_0", "%s", rc ? rcs(rc) : (h ? "0 non-null" : "0 null"));
    if (!rc && h) p_cuMemFreeHost(h);
    h = NULL;
    rc = p_cuMemHostAlloc(&h, 4096, 0x80);
    kv("err.mem_host_alloc_bad_flags", "%s", rcs(rc));
    if (!rc && h) p_cuMemFreeHost(h);
    h = NULL;
    rc = p_cuMemAllocHost(&h, 0);
    kv("err.mem_alloc_host_0", "%s", rc ? rcs(rc) : (h ? "0 non-null" : "0 null"));
    if (!rc && h) p_cuMemFreeHost(h);
    void *m = aligned_malloc(4096);
    kv("err.mem_host_unregister_not_registered", "%s", rcs(p_cuMemHostUnregister(m)));
    kv("err.mem_host_register_size_0", "%s", rcs(p_cuMemHostRegister(m, 0, 0)));
    kv("err.mem_host_register_bad_flags", "%s", rcs(p_cuMemHostRegister(m, 4096, 0x40)));
    unsigned fl;
    kv("err.mem_host_get_flags_malloc", "%s", rcs(p_cuMemHostGetFlags(&fl, m)));
    CUdeviceptr dp;
    kv("err.mem_host_get_device_pointer_malloc", "%s", rcs(p_cuMemHostGetDevicePointer(&dp, m, 0)));
    free(m);
    CUdeviceptr base;
    size_t sz;
    kv("err.mem_get_address_range_bogus", "%s",
       rcs(p_cuMemGetAddressRange(&base, &sz, 0xdead0000ull)));
    CUmodule mod = NULL;
    static const char junk[] = "this is not a module";
    rc = p_cuModuleLoadData(&mod, junk);
    kv("err.module_load_data_text", "%s", rcs(rc));
    if (!rc) p_cuModuleUnload(mod);
    static const char badptx[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
                                 ".visible .entry k() { bogus.instruction; ret; }\n";
    rc = p_cuModuleLoadData(&mod, badptx);
    kv("err.module_load_data_bad_ptx", "%s", rcs(rc));
    if (!rc) p_cuModuleUnload(mod);
    static const char newptx[] = ".version 9.9\n.target sm_90\n.address_size 64\n"
                                 ".visible .entry k() { ret; }\n";
    rc = p_cuModuleLoadData(&mod, newptx);
    kv("err.module_load_data_ptx_isa_9_9", "%s", rcs(rc));
    if (!rc) p_cuModuleUnload(mod);
    static const char futptx[] = ".version 7.0\n.target sm_200\n.address_size 64\n"
                                 ".visible .entry k() { ret; }\n";
    rc = p_cuModuleLoadData(&mod, futptx);
    kv("err.module_load_data_target_sm_200", "%s", rcs(rc));
    if (!rc) p_cuModuleUnload(mod);

    CUstream s = NULL;
    rc = p_cuStreamCreate(&s, 0xff);
    kv("err.stream_create_bad_flags", "%s", rcs(rc));
    if (!rc) p_cuStreamDestroy(s);
    CUevent e = NULL, e2 = NULL;
    rc = p_cuEventCreate(&e, 0xff);
    kv("err.event_create_bad_flags", "%s", rcs(rc));
    if (!rc) p_cuEventDestroy(e);
    e = NULL;
    p_cuEventCreate(&e, 0);
    p_cuEventCreate(&e2, 0);
    if (e && e2) {
        float ms;
        kv("err.event_query_unrecorded", "%s", rcs(p_cuEventQuery(e)));
        kv("err.event_synchronize_unrecorded", "%s", rcs(p_cuEventSynchronize(e)));
        kv("err.event_elapsed_unrecorded", "%s", rcs(p_cuEventElapsedTime(&ms, e, e2)));
        p_cuEventRecord(e, NULL);
        kv("err.event_elapsed_one_unrecorded", "%s", rcs(p_cuEventElapsedTime(&ms, e, e2)));
        p_cuEventRecord(e2, NULL);
        p_cuEventSynchronize(e2);
        rc = p_cuEventElapsedTime(&ms, e, e2);
        kv("event.elapsed_recorded", "%s", rc ? rcs(rc) : (ms >= 0 ? "nonnegative" : "negative"));
        p_cuEventDestroy(e);
        p_cuEventDestroy(e2);
    }
    CUevent nt = NULL;
    rc = p_cuEventCreate(&nt, 2 /* DISABLE_TIMING */);
    if (!rc) {
        CUevent t = NULL;
        p_cuEventCreate(&t, 0);
        p_cuEventRecord(nt, NULL);
        p_cuEventRecord(t, NULL);
        p_cuCtxSynchronize(ctx);
        float ms;
        kv("err.event_elapsed_disable_timing", "%s", rcs(p_cuEventElapsedTime(&ms, nt, t)));
        p_cuEventDestroy(nt);
        if (t) p_cuEventDestroy(t);
    }
    kv("err.ctx_synchronize_at_end", "%s", rcs(p_cuCtxSynchronize(ctx)));
}

/* ---- risky calls: each in its own process --------------------------------------------------- */



static void risky(const char *name) {
    CUresult rc = (CUresult)-2;
    p_cuCtxSetCurrent(ctx);
    if (!strcmp(name, "ctx_set_current_bogus")) {
        rc = p_cuCtxSetCurrent((CUcontext)(uintptr_t)0x1000);
        p_cuCtxSetCurrent(ctx);
    } else if (!strcmp(name, "stream_destroy_twice")) {
        CUstream s;
        p_cuStreamCreate(&s, 0);
        p_cuStreamDestroy(s);
        rc = p_cuStreamDestroy(s);
    } else if (!strcmp(name, "stream_query_destroyed")) {
        CUstream s;
        p_cuStreamCreate(&s, 0);
        p_cuStreamDestroy(s);
        rc = p_cuStreamQuery(s);
    } else if (!strcmp(name, "event_destroy_twice")) {
        CUevent e;
        p_cuEventCreate(&e, 0);
        p_cuEventDestroy(e);
        rc = p_cuEventDestroy(e);
    } else if (!strcmp(name, "event_query_destroyed")) {
        CUevent e;
        p_cuEventCreate(&e, 0);
        p_cuEventDestroy(e);
        rc = p_cuEventQuery(e);
    } else if (!strcmp(name, "module_unload_twice")) {
        CUmodule m = NULL;
        if (p_cuModuleLoadData(&m, ptx_main) == CUDA_SUCCESS) {
            p_cuModuleUnload(m);
            rc = p_cuModuleUnload(m);
        }
    } else if (!strcmp(name, "launch_null_function")) {
        rc = p_cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    } else if (!strcmp(name, "mem_alloc_null_out")) {
        rc = p_cuMemAlloc(NULL, 16);
    } else if (!strcmp(name, "memcpy_htod_bogus")) {
        char buf[16] = {0};
        rc = p_cuMemcpyHtoD(0xdead0000ull, buf, sizeof buf);
    } else if (!strcmp(name, "get_export_table_null_uuid")) {
        const void *t = NULL;
        rc = p_cuGetExportTable(&t, NULL);
    } else if (!strcmp(name, "launch_null_params")) {
        /* Last: if the driver launched it, the kernel faults and the context is lost. */
        CUmodule m = NULL;
        CUfunction f = NULL;
        if (p_cuModuleLoadData(&m, ptx_main) == CUDA_SUCCESS &&
            p_cuModuleGetFunction(&f, m, "conf_kernel") == CUDA_SUCCESS) {
            rc = p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            kv("risky.launch_null_params.sync", "%s", rcs(p_cuCtxSynchronize(ctx)));
        }
    }
    kv(K("risky.%s", name), "%s", rcs(rc));
}

/* ---- section: export tables ----------------------------------------------------------------- */

static void section_export(void) {
    static const struct { const char *name; unsigned char id[16]; } tables[] = {
        {"d4082055_integrity", {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}},
        {"42d85a81_tools_tls", {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}},
        {"a094798c_hooks", {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}},
        {"6bd5fb6c_cudart_interface", {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}},
        {"263e8860_ctx_wrapper", {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}},
        {"c693336e_context_local_storage", {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}},
        {"f8cff951_unknown", {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9}},
        {"21318c60_tools_context", {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}},
        {"6e163fbe_tools_module", {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e}},
        {"da9151d3_nvrtc", {0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41, 0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33, 0xe3, 0x28}},
        {"1734dc26", {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca}},
        {"0ca50b8c_ctx_create_bypass", {0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7, 0x72, 0x86}},
        {"195bcbf4_heap_access", {0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6, 0x31, 0xae}},
        {"b10541e1_device_extended_rt", {0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2, 0x23, 0xbe, 0x99, 0xf1, 0xe2}},
        {"00000000_zero", {0}},
    };
    for (unsigned i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        const void *t = NULL;
        CUuuid u;
        memcpy(u.bytes, tables[i].id, 16);
        CUresult rc = p_cuGetExportTable(&t, &u);
        if (rc) {
            kv(K("export.%s", tables[i].name), "%s%s", rcs(rc), t ? " table non-null" : "");
            continue;
        }
        if (!t) {
            kv(K("export.%s", tables[i].name), "0 null table");
            continue;
        }
        u64 slot0 = *(const u64 *)t;
        if (slot0 < 4096)
            kv(K("export.%s", tables[i].name), "0 size=%llu", (unsigned long long)slot0);
        else
            kv(K("export.%s", tables[i].name), "0 slot0=function");
    }
}

/* ---- section: entry points ------------------------------------------------------------------ */

static void section_procaddr(void) {
    kv("procaddr.cuGetProcAddress_v2_exported", "%s", gpa ? "yes" : "no");
    if (!gpa) return;
    for (unsigned i = 0; i < sizeof conf_driver_functions / sizeof conf_driver_functions[0]; i++) {
        const char *n = conf_driver_functions[i];
        void *p = NULL;
        CUdriverProcAddressQueryResult st = 0;
        CUresult rc = gpa(n, &p, PROBE_CUDA_VERSION, 0, &st);
        kv(K("procaddr.%s", n), "%s", rc ? K("%s status=%d", rcs(rc), (int)st)
                                           : (p ? "found" : K("0 null status=%d", (int)st)));
    }
    /* The per-thread default stream variants. */
    static const char *const ptds[] = {"cuLaunchKernel", "cuMemcpyAsync", "cuStreamSynchronize"};
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = 0;
        CUresult rc = gpa(ptds[i], &p, PROBE_CUDA_VERSION, 2 /* PER_THREAD_DEFAULT_STREAM */, &st);
        kv(K("procaddr.ptds.%s", ptds[i]), "%s", rc ? rcs(rc) : (p ? "found" : "null"));
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult st = 0;
    CUresult rc = gpa("cuNoSuchFunction", &p, PROBE_CUDA_VERSION, 0, &st);
    kv("procaddr.unknown_symbol", "%s status=%d", rcs(rc), (int)st);
    rc = gpa("cuMemAlloc", &p, 1000, 0, &st);
    kv("procaddr.cuMemAlloc_version_1000", "%s status=%d", rcs(rc), (int)st);
}

/* ---- driver ----------------------------------------------------------------------------------- */

/* Steps run in order, all in one process (one driver initialization, as an application); when
 * that process dies in a step, the step is reported (`signal N`, `timeout`) and a new process
 * goes on with the next one. */
struct step {
    const char *name; /* `section.NAME` or `risky_process.NAME` */
    void (*fn)(void);
    const char *risky;
};

static const struct step steps[] = {
    {"section.device", section_device, NULL},
    {"section.context", section_context, NULL},
    {"section.ptr_device", section_ptr_device, NULL},
    {"section.ptr_host", section_ptr_host, NULL},
    {"section.ptr_managed", section_ptr_managed, NULL},
    {"section.ptr_module", section_ptr_module, NULL},
    {"section.kernel", section_kernel, NULL},
    {"section.errors", section_errors, NULL},
    {"section.export", section_export, NULL},
    {"section.procaddr", section_procaddr, NULL},
    /* Calls a real driver might crash on; launch_null_params last (it may lose the context).
     * Left out because driver 580 segfaults on them (H200, 2026-11-28): cuCtxSetCurrent of a
     * made-up context; cuStreamDestroy, cuStreamQuery, cuEventDestroy and cuEventQuery of a
     * destroyed stream or event. */
    {"risky_process.module_unload_twice", NULL, "module_unload_twice"},
    {"risky_process.launch_null_function", NULL, "launch_null_function"},
    {"risky_process.mem_alloc_null_out", NULL, "mem_alloc_null_out"},
    {"risky_process.memcpy_htod_bogus", NULL, "memcpy_htod_bogus"},
    {"risky_process.get_export_table_null_uuid", NULL, "get_export_table_null_uuid"},
    {"risky_process.launch_null_params", NULL, "launch_null_params"},
};
#define NSTEPS ((int)(sizeof steps / sizeof steps[0]))

/* The child: runs steps first.. and prints `STEP = ok` after each. */
static int run_steps(int first) {
    if (load_driver()) return 1;
    p_cuInit(0);
    int ready = setup() == 0;
    for (int i = first; i < NSTEPS; i++) {
        if (i > 0 && !ready && strcmp(steps[i].name, "section.procaddr") &&
            strcmp(steps[i].name, "section.device")) {
            kv(steps[i].name, "skipped (no context)");
            continue;
        }
        if (steps[i].fn)
            steps[i].fn();
        else
            risky(steps[i].risky);
        if (have_ctx) p_cuCtxSetCurrent(ctx);
        /* A step that left the context broken (a sticky error such as 700): the next steps
         * run in a new process, so that one failure is reported once. */
        CUresult sticky = have_ctx ? p_cuCtxSynchronize(ctx) : CUDA_SUCCESS;
        if (sticky != CUDA_SUCCESS) kv(K("%s.context_after", steps[i].name), "%s", rcs(sticky));
        kv(steps[i].name, "ok");
        fflush(stdout);
        if (sticky != CUDA_SUCCESS && i + 1 < NSTEPS) _exit(RESTART_EXIT);
    }
    teardown();
    return 0;
}

/* Runs `probe --from FIRST` with its stdout through a pipe; returns the index of the step it
 * died in (NSTEPS when it finished; minus the next step when it asked for a restart), having printed what it printed and how that step ended. */
static int spawn(int first, int timeout_s) {
    int fds[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fds)) {
        kv("probe.pipe", "failed");
        return NSTEPS;
    }
    pid_t pid = fork();
    if (pid < 0) {
        kv("probe.fork", "failed");
        return NSTEPS;
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 1);
        close(fds[1]);
        alarm(timeout_s);
        char arg[16];
        snprintf(arg, sizeof arg, "%d", first);
        execl("/proc/self/exe", "probe", "--from", arg, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    char line[4096];
    int next = first;
    while (in && fgets(line, sizeof line, in)) {
        fputs(line, stdout);
        size_t n = strlen(line);
        if (n && line[n - 1] != '\n') fputc('\n', stdout);
        for (int i = next; i < NSTEPS; i++) {
            size_t l = strlen(steps[i].name);
            if (!strncmp(line, steps[i].name, l) && !strncmp(line + l, " = ", 3)) {
                next = i + 1;
                break;
            }
        }
    }
    if (in) fclose(in);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (next >= NSTEPS) return NSTEPS;
    if (WIFEXITED(st) && WEXITSTATUS(st) == RESTART_EXIT && next > first) return -next;
    if (WIFSIGNALED(st)) {
        if (WTERMSIG(st) == SIGALRM)
            kv(steps[next].name, "timeout (%d s)", timeout_s);
        else
            kv(steps[next].name, "signal %d", WTERMSIG(st));
    } else {
        kv(steps[next].name, "exit %d", WEXITSTATUS(st));
    }
    return next;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && !strcmp(argv[1], "--from")) return run_steps(atoi(argv[2]));
    if (argc == 2 && !strcmp(argv[1], "--inprocess")) return run_steps(0);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--inprocess]\n", argv[0]);
        return 2;
    }
    kv("probe.format", "1");
    if (load_driver()) {
        kv("probe.complete", "no");
        return 1;
    }
    int failed = 0, i = 0;
    while (i < NSTEPS) {
        int died = spawn(i, SECTION_TIMEOUT_S);
        if (died >= NSTEPS) break;
        if (died < 0) { /* a restart asked for: go on with step -died */
            i = -died;
            continue;
        }
        failed = 1;
        i = died + 1;
    }
    kv("probe.complete", "yes");
    return failed ? 1 : 0;
}
