/* Driver-API test program for the shim tests. It reaches the driver one of several
 * ways (--via), runs the ops given on the command line and prints one JSON object
 * per op. Built twice: drv (dlopen; the shim reaches it through dlsym /
 * cuGetProcAddress) and drv_direct (-DDIRECT: linked against libcuda.so.1 and
 * libnvidia-ml.so.1 and calling the exported symbols, as old code does).
 *
 *   --via direct   exported symbols, resolved by the dynamic linker (drv_direct)
 *   --via dlsym    dlopen("libcuda.so.1") + dlsym(handle, "cuMemAlloc_v2")
 *   --via default  dlsym(RTLD_DEFAULT, ...)
 *   --via next     dlsym(RTLD_NEXT, ...)
 *   --via proc     cuGetProcAddress_v2(base name, 12080, default stream), as cudart
 *   --via ptsz     cuGetProcAddress_v2(base name, 12080, per-thread default stream)
 *   --via proc1    cuGetProcAddress (the 11.x entry point), cudaVersion 11030
 *   --via procself cuGetProcAddress_v2 obtained from cuGetProcAddress_v2 itself
 *   --via dlmopen  a second copy of the driver, dlmopen(LM_ID_NEWLM) + dlsym on it
 *                  (exit 3 with the dlerror text when the load is refused)
 *   --via nextdlmopen  the same through dlsym(RTLD_NEXT, "dlmopen")
 *
 * NVML process queries (each one JSON line; "rc" -1 when the library lacks the function):
 *   gfxprocs [V [ROOM]]   nvmlDeviceGetGraphicsRunningProcesses (V 1, 2 or 3; default 3)
 *   mpsprocs [V [ROOM]]   nvmlDeviceGetMPSComputeRunningProcesses (V 1, 2 or 3)
 *       {"rc","version","r0","need","count","procs":[{"pid","usedGpuMemory"
 *        [,"gpuInstanceId","computeInstanceId"]}]}: r0/need from (count 0, NULL), rc/count
 *        from a call with ROOM entries (default 64)
 *   detail MODE [ROOM [VERSION]]   nvmlDeviceGetRunningProcessDetailList
 *       {"rc","mode","r0","need","count","procs":[{"pid","usedGpuMemory","gpuInstanceId",
 *        "computeInstanceId","usedGpuCcProtectedMemory"}]}
 *   utilinfo [SINCE [ROOM [VERSION]]]   nvmlDeviceGetProcessesUtilizationInfo
 *       {"rc","r0","need","count","samples":[{"pid","timeStamp","smUtil","memUtil",
 *        "encUtil","decUtil","jpgUtil","ofaUtil"}]}
 *   utilrates            nvmlDeviceGetUtilizationRates {"rc","gpu","memory"}
 *   acctmode             nvmlDeviceGetAccountingMode + BufferSize
 *       {"rc","mode","rbuf","bufferSize"}
 *   acctpids [ROOM]      nvmlDeviceGetAccountingPids {"rc","r0","need","count","pids":[...]}
 *   acctstats PID        nvmlDeviceGetAccountingStats {"rc","pid","gpuUtilization",
 *        "memoryUtilization","maxMemoryUsage","time","startTime","isRunning"}
 *   VERSION (a number) replaces the struct's version (default: the right one).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_cuda.h"
#include "vgpu_nvml.h"

typedef struct CUmod_st *CUmodule;

/* NVML types the shim's header does not have (official layouts, nvml.h; drv_ names so that
 * they never clash with it) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} drv_ProcessDetail_v1_t;
typedef struct {
    unsigned int version;
    unsigned int mode;
    unsigned int numProcArrayEntries;
    drv_ProcessDetail_v1_t *procArray;
} drv_ProcessDetailList_v1_t;
#define DRV_PROCESS_DETAIL_LIST_V1 ((unsigned)(sizeof(drv_ProcessDetailList_v1_t) | (1u << 24)))
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} drv_ProcessUtilizationInfo_v1_t;
typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    drv_ProcessUtilizationInfo_v1_t *procUtilArray;
} drv_ProcessesUtilizationInfo_v1_t;
#define DRV_PROCESSES_UTILIZATION_INFO_V1                                                  \
    ((unsigned)(sizeof(drv_ProcessesUtilizationInfo_v1_t) | (1u << 24)))
typedef struct {
    unsigned int gpuUtilization;
    unsigned int memoryUtilization;
    unsigned long long maxMemoryUsage;
    unsigned long long time;
    unsigned long long startTime;
    unsigned int isRunning;
    unsigned int reserved[5];
} drv_AccountingStats_t;
/* nvml.h's sizes on x86-64 (the fake's own copies are checked by test_abi_layout.py) */
_Static_assert(sizeof(drv_ProcessDetail_v1_t) == 32, "nvmlProcessDetail_v1_t");
_Static_assert(sizeof(drv_ProcessDetailList_v1_t) == 24, "nvmlProcessDetailList_v1_t");
_Static_assert(sizeof(drv_ProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t");
_Static_assert(sizeof(drv_ProcessesUtilizationInfo_v1_t) == 24, "nvmlProcessesUtilizationInfo_v1_t");
_Static_assert(sizeof(drv_AccountingStats_t) == 56, "nvmlAccountingStats_t");
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams, **extra;
    void *kern, *ctx;
} KNODE_V2;

/* name used with dlsym, base name used with cuGetProcAddress */
#define FUNCS(X)                                                                           \
    X(cuInit, "cuInit", CUresult, (unsigned))                                            \
    X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice *, int))                           \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice)) \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext))                         \
    X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void))                            \
    X(cuMemAlloc_v2, "cuMemAlloc", CUresult, (CUdeviceptr *, size_t))                    \
    X(cuMemFree_v2, "cuMemFree", CUresult, (CUdeviceptr))                                \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", CUresult, (CUdeviceptr *, size_t *, size_t, size_t, unsigned)) \
    X(cuMemAllocManaged, "cuMemAllocManaged", CUresult, (CUdeviceptr *, size_t, unsigned)) \
    X(cuMemAllocAsync, "cuMemAllocAsync", CUresult, (CUdeviceptr *, size_t, CUstream))    \
    X(cuMemFreeAsync, "cuMemFreeAsync", CUresult, (CUdeviceptr, CUstream))               \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", CUresult, (CUmemoryPool *, CUdevice)) \
    X(cuStreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream))                  \
    X(cuMemCreate, "cuMemCreate", CUresult, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, "cuMemRelease", CUresult, (CUmemGenericAllocationHandle))            \
    X(cuArrayCreate_v2, "cuArrayCreate", CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *)) \
    X(cuArray3DCreate_v2, "cuArray3DCreate", CUresult, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)) \
    X(cuArrayDestroy, "cuArrayDestroy", CUresult, (CUarray))                             \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", CUresult, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned)) \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", CUresult, (CUmipmappedArray))  \
    X(cuMemGetInfo_v2, "cuMemGetInfo", CUresult, (size_t *, size_t *))                   \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", CUresult, (size_t *, CUdevice))           \
    X(cuModuleLoadData, "cuModuleLoadData", CUresult, (CUmodule *, const void *))        \
    X(cuModuleGetFunction, "cuModuleGetFunction", CUresult, (CUfunction *, CUmodule, const char *)) \
    X(cuLaunchKernel, "cuLaunchKernel", CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", CUresult, (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuGraphCreate, "cuGraphCreate", CUresult, (CUgraph *, unsigned))                   \
    X(cuGraphAddKernelNode_v2, "cuGraphAddKernelNode", CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const KNODE_V2 *)) \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", CUresult, (CUgraphExec *, CUgraph, unsigned long long)) \
    X(cuGraphLaunch, "cuGraphLaunch", CUresult, (CUgraphExec, CUstream))                 \
    X(cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode", CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph)) \
    X(cuGraphDestroy, "cuGraphDestroy", CUresult, (CUgraph))

#define NVFUNCS(X)                                                                         \
    X(nvmlInit_v2, nvmlReturn_t, (void))                                                 \
    X(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t, (unsigned, nvmlDevice_t *))           \
    X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_t *))             \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_v2_t *))       \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *)) \
    X(nvmlDeviceGetProcessUtilization, nvmlReturn_t, (nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *, unsigned long long)) \
    X(nvmlDeviceGetUtilizationRates, nvmlReturn_t, (nvmlDevice_t, nvmlUtilization_t *))   \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_t *)) \
    X(nvmlDeviceGetRunningProcessDetailList, nvmlReturn_t, (nvmlDevice_t, drv_ProcessDetailList_v1_t *)) \
    X(nvmlDeviceGetProcessesUtilizationInfo, nvmlReturn_t, (nvmlDevice_t, drv_ProcessesUtilizationInfo_v1_t *)) \
    X(nvmlDeviceGetAccountingMode, nvmlReturn_t, (nvmlDevice_t, unsigned *))               \
    X(nvmlDeviceGetAccountingBufferSize, nvmlReturn_t, (nvmlDevice_t, unsigned *))         \
    X(nvmlDeviceGetAccountingPids, nvmlReturn_t, (nvmlDevice_t, unsigned *, unsigned *))   \
    X(nvmlDeviceGetAccountingStats, nvmlReturn_t, (nvmlDevice_t, unsigned, drv_AccountingStats_t *))

#ifdef DIRECT
#define X(name, base, ret, params) extern ret name params;
FUNCS(X)
#undef X
#define X(name, ret, params) extern ret name params;
NVFUNCS(X)
#undef X
#endif

static struct {
#define X(name, base, ret, params) ret(*name) params;
    FUNCS(X)
#undef X
#define X(name, ret, params) ret(*name) params;
    NVFUNCS(X)
#undef X
} f;

static unsigned long long (*fake_now)(void);
static unsigned long long (*fake_busy)(int, int, unsigned long long, unsigned long long);
static unsigned long long (*fake_window_busy)(int, int, unsigned long long);
static unsigned long long (*fake_window_ns)(void);
static unsigned long long (*fake_used)(int);
static int dev = 0;

__attribute__((unused)) static void *resolve(const char *via, void *h, const char *name, const char *base)
{
    void *p = NULL;
    if (!strcmp(via, "dlsym")) return dlsym(h, name);
    if (!strcmp(via, "default")) return dlsym(RTLD_DEFAULT, name);
    if (!strcmp(via, "next")) return dlsym(RTLD_NEXT, name);
    int ptsz = !strcmp(via, "ptsz");
    CUdriverProcAddressQueryResult st;
    if (!strcmp(via, "proc1")) {
        CUresult (*gpa)(const char *, void **, int, cuuint64_t) = dlsym(h, "cuGetProcAddress");
        if (!gpa || gpa(base, &p, 11030, 0) != CUDA_SUCCESS) return NULL;
        return p;
    }
    CUresult (*gpa2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        dlsym(h, "cuGetProcAddress_v2");
    if (!gpa2) return NULL;
    if (!strcmp(via, "procself")) {
        void *self = NULL;
        if (gpa2("cuGetProcAddress", &self, 12000, 0, &st) != CUDA_SUCCESS || !self) return NULL;
        gpa2 = self;
    }
    if (gpa2(base, &p, 12080, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st) !=
        CUDA_SUCCESS)
        return NULL;
    return p;
}

static void setup(const char *via)
{
#ifdef DIRECT
    (void)via;
#define X(name, base, ret, params) f.name = &name;
    FUNCS(X)
#undef X
#define X(name, ret, params) f.name = &name;
    NVFUNCS(X)
#undef X
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
#else
    void *h, *nh;
    if (!strcmp(via, "dlmopen") || !strcmp(via, "nextdlmopen")) {
        void *(*open_in)(Lmid_t, const char *, int) = dlmopen;
        if (!strcmp(via, "nextdlmopen")) *(void **)&open_in = dlsym(RTLD_NEXT, "dlmopen");
        h = open_in(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
        if (!h) {
            const char *e = dlerror();
            printf("{\"op\":\"setup\",\"refused\":\"%s\"}\n", e ? e : "(no dlerror)");
            exit(3);
        }
        nh = NULL;
        via = "dlsym";
    } else {
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        nh = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    }
    if (!h) {
        printf("{\"op\":\"setup\",\"error\":\"%s\"}\n", dlerror());
        exit(2);
    }
#define X(name, base, ret, params) *(void **)&f.name = resolve(via, h, #name, base);
    FUNCS(X)
#undef X
#define X(name, ret, params) *(void **)&f.name = nh ? dlsym(nh, #name) : NULL;
    NVFUNCS(X)
#undef X
#endif
    *(void **)&fake_now = dlsym(h, "fake_now_ns");
    *(void **)&fake_used = dlsym(h, "fake_device_used_bytes");
    *(void **)&fake_busy = dlsym(h, "fake_busy_ns");
    *(void **)&fake_window_busy = dlsym(h, "fake_window_busy_ns");
    *(void **)&fake_window_ns = dlsym(h, "fake_sample_window_ns");
}

typedef struct { int kind; unsigned long long v; size_t bytes; } item;
enum { K_PTR, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP };
static item items[100000];
static int nitems;

static void out(const char *op, CUresult rc, const char *extra)
{
    printf("{\"op\":\"%s\",\"rc\":%d%s%s}\n", op, (int)rc, extra && *extra ? "," : "",
           extra ? extra : "");
    fflush(stdout);
}

static int add_item(int kind, unsigned long long v, size_t bytes)
{
    items[nitems] = (item){kind, v, bytes};
    return nitems++;
}

static CUresult free_item(int i)
{
    if (i < 0 || i >= nitems || !items[i].v) return CUDA_ERROR_INVALID_VALUE;
    item *it = &items[i];
    CUresult r;
    switch (it->kind) {
    case K_ASYNC: r = f.cuMemFreeAsync(it->v, NULL); if (!r) r = f.cuStreamSynchronize(NULL); break;
    case K_VMM: r = f.cuMemRelease(it->v); break;
    case K_ARRAY: r = f.cuArrayDestroy((CUarray)(uintptr_t)it->v); break;
    case K_MIPMAP: r = f.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)it->v); break;
    default: r = f.cuMemFree_v2(it->v); break;
    }
    if (r == CUDA_SUCCESS) it->v = 0;
    return r;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ctx(void)
{
    CUcontext c;
    CUdevice d;
    CUresult r = f.cuInit(0);
    if (!r) r = f.cuDeviceGet(&d, dev);
    if (!r) r = f.cuDevicePrimaryCtxRetain(&c, d);
    if (!r) r = f.cuCtxSetCurrent(c);
    out("ctx", r, NULL);
}

/* launch BLOCKS SECONDS [KIND] [NS]: launch back to back for SECONDS; NS picks the
 * fake driver's kernel fake_ns_NS (NS ns of work per block per wave).  KIND: kernel
 * (cuLaunchKernel), ex, coop, graph (a graph of 4 kernel nodes of BLOCKS/4 blocks each),
 * nested (the same 4 kernel nodes inside one child graph node), nestedD (D levels of child
 * graphs, e.g. nested3) */
static void launch_loop(unsigned blocks, double seconds, const char *kind, const char *ns)
{
    CUmodule m;
    CUfunction fn;
    static const char image[] = "fake";
    char name[64];
    snprintf(name, sizeof name, ns ? "fake_ns_%s" : "k", ns);
    CUresult r = f.cuModuleLoadData(&m, image);
    if (!r) r = f.cuModuleGetFunction(&fn, m, name);
    CUgraphExec exec = NULL;
    int nested = !strncmp(kind, "nested", 6);
    if (!r && (!strcmp(kind, "graph") || nested)) {
        CUgraph g;
        r = f.cuGraphCreate(&g, 0);
        for (int i = 0; !r && i < 4; i++) {
            CUgraphNode n;
            KNODE_V2 p = {fn, blocks / 4 ? blocks / 4 : 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL, NULL};
            r = f.cuGraphAddKernelNode_v2(&n, g, NULL, 0, &p);
        }
        /* nested: each level a graph whose only node is a child graph node (a clone of g) */
        int levels = nested ? (kind[6] ? atoi(kind + 6) : 1) : 0;
        if (!r && levels && (!f.cuGraphAddChildGraphNode || !f.cuGraphDestroy))
            r = CUDA_ERROR_NOT_FOUND;
        for (int l = 0; !r && l < levels; l++) {
            CUgraph parent;
            CUgraphNode n;
            r = f.cuGraphCreate(&parent, 0);
            if (!r) r = f.cuGraphAddChildGraphNode(&n, parent, NULL, 0, g);
            if (!r) f.cuGraphDestroy(g);
            if (!r) g = parent;
        }
        if (!r) r = f.cuGraphInstantiateWithFlags(&exec, g, 0);
    }
    unsigned long long t0 = fake_now ? fake_now() : 0, n = 0;
    double end = now_s() + seconds;
    while (!r && now_s() < end) {
        if (!strcmp(kind, "ex")) {
            CUlaunchConfig cfg = {blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
            r = f.cuLaunchKernelEx(&cfg, fn, NULL, NULL);
        } else if (!strcmp(kind, "coop")) {
            r = f.cuLaunchCooperativeKernel(fn, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL);
        } else if (!strcmp(kind, "graph") || nested) {
            r = f.cuGraphLaunch(exec, NULL);
        } else {
            r = f.cuLaunchKernel(fn, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        }
        n++;
    }
    f.cuCtxSynchronize();
    unsigned long long t1 = fake_now ? fake_now() : 0;
    char buf[160];
    snprintf(buf, sizeof buf, "\"launches\":%llu,\"t0\":%llu,\"t1\":%llu,\"pid\":%d", n, t0, t1,
             (int)getpid());
    out("launch", r, buf);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double first_done_ms;
static volatile int stress_run;
static volatile long stress_loops;

static void *alloc_loop(void *arg)
{
    (void)arg;
    CUcontext c = NULL;
    if (f.cuDevicePrimaryCtxRetain(&c, dev) == CUDA_SUCCESS) f.cuCtxSetCurrent(c);
    while (stress_run) {
        CUdeviceptr p = 0;
        if (f.cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS) f.cuMemFree_v2(p);
        stress_loops++;
    }
    return NULL;
}

static void *first_call(void *arg)
{
    (void)arg;
    size_t fr = 0, tot = 0;
    f.cuMemGetInfo_v2(&fr, &tot); /* hooked: the shim's init runs here */
    first_done_ms = now_ms();
    return NULL;
}

static volatile sig_atomic_t sig_ran;
static volatile CUresult sig_rc;
static size_t sig_bytes;

static void on_alarm(int sig)
{
    (void)sig;
    CUdeviceptr p = 0;
    sig_rc = f.cuMemAlloc_v2(&p, sig_bytes);
    sig_ran = 1;
}

static void nulls(void)
{
    char buf[512];
    size_t fr = 0, tot = 0;
    CUresult a = f.cuMemGetInfo_v2(NULL, NULL);
    CUresult b = f.cuMemGetInfo_v2(&fr, NULL);
    CUresult c = f.cuMemGetInfo_v2(NULL, &tot);
    CUresult d = f.cuMemAlloc_v2(NULL, 1024);
    CUresult e = f.cuDeviceTotalMem_v2(NULL, dev);
    CUresult g = f.cuMemCreate(NULL, 2 << 20, NULL, 0);
    CUmemGenericAllocationHandle hh;
    CUresult h = f.cuMemCreate(&hh, 2 << 20, NULL, 0);
    CUresult i = f.cuArrayCreate_v2(NULL, NULL);
    CUresult j = f.cuMemAllocPitch_v2(NULL, NULL, 16, 16, 4);
    CUresult k = f.cuLaunchKernelEx(NULL, NULL, NULL, NULL);
    CUresult l = f.cuMemFree_v2(0);
    CUresult m = f.cuMemAllocAsync(NULL, 16, NULL);
    nvmlReturn_t n = f.nvmlDeviceGetMemoryInfo ? f.nvmlDeviceGetMemoryInfo(NULL, NULL) : 0;
    snprintf(buf, sizeof buf,
             "\"info_nn\":%d,\"info_fn\":%d,\"info_nt\":%d,\"free\":%zu,\"total\":%zu,"
             "\"alloc\":%d,\"totalmem\":%d,\"create_nh\":%d,\"create_np\":%d,\"array\":%d,"
             "\"pitch\":%d,\"launchex\":%d,\"free0\":%d,\"async\":%d,\"nvmlmem\":%d",
             a, b, c, fr, tot, d, e, g, h, i, j, k, l, m, (int)n);
    out("nulls", CUDA_SUCCESS, buf);
}

/* ---- NVML process queries: one JSON line each, into a buffer of their own ---- */
static char jbuf[32768];
static int jlen;

static void jadd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void jadd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (jlen < (int)sizeof jbuf) jlen += vsnprintf(jbuf + jlen, sizeof jbuf - (size_t)jlen, fmt, ap);
    va_end(ap);
}

/* nvmlInit_v2 + the handle of --dev; -1 when fn (the function to call) is missing */
static int nv_handle(const void *fn, nvmlDevice_t *h)
{
    if (!fn || !f.nvmlInit_v2 || !f.nvmlDeviceGetHandleByIndex_v2) return -1;
    nvmlReturn_t r = f.nvmlInit_v2();
    if (!r) r = f.nvmlDeviceGetHandleByIndex_v2((unsigned)dev, h);
    return (int)r;
}

static void nv_out(const char *op, int rc)
{
    printf("{\"op\":\"%s\",\"rc\":%d%s%s}\n", op, rc, jlen ? "," : "", jbuf);
    fflush(stdout);
    jlen = 0;
}

#define NROWS 256

/* How many of the (at most max) arguments after argv[i] are numbers: an op's optional
 * arguments. */
static int nums(int argc, char **argv, int i, int max)
{
    int n = 0;
    while (n < max && i + 1 + n < argc && isdigit((unsigned char)argv[i + 1 + n][0])) n++;
    return n;
}

/* gfxprocs / mpsprocs [V [ROOM]] */
static void op_procs(const char *op, int version, unsigned room)
{
    int mps = !strcmp(op, "mpsprocs");
    nvmlReturn_t (*v1)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *) =
        mps ? f.nvmlDeviceGetMPSComputeRunningProcesses : f.nvmlDeviceGetGraphicsRunningProcesses;
    nvmlReturn_t (*v2)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *) =
        version == 2 ? (mps ? f.nvmlDeviceGetMPSComputeRunningProcesses_v2
                            : f.nvmlDeviceGetGraphicsRunningProcesses_v2)
                     : (mps ? f.nvmlDeviceGetMPSComputeRunningProcesses_v3
                            : f.nvmlDeviceGetGraphicsRunningProcesses_v3);
    static nvmlProcessInfo_v1_t p1[NROWS];
    static nvmlProcessInfo_t p2[NROWS];
    nvmlDevice_t h;
    if (room > NROWS) room = NROWS;
    int rc = nv_handle(version == 1 ? (const void *)v1 : (const void *)v2, &h);
    int r0 = rc;
    unsigned need = 0, n = room;
    if (!rc && version == 1) {
        r0 = v1(h, &need, NULL);
        rc = v1(h, &n, p1);
    } else if (!rc) {
        r0 = v2(h, &need, NULL);
        rc = v2(h, &n, p2);
    }
    jadd("\"version\":%d,\"r0\":%d,\"need\":%u,\"count\":%u,\"procs\":[", version, r0, need, n);
    for (unsigned k = 0; !rc && k < n; k++) {
        if (version == 1)
            jadd("%s{\"pid\":%u,\"usedGpuMemory\":%llu}", k ? "," : "", p1[k].pid,
                 p1[k].usedGpuMemory);
        else
            jadd("%s{\"pid\":%u,\"usedGpuMemory\":%llu,\"gpuInstanceId\":%u,"
                 "\"computeInstanceId\":%u}",
                 k ? "," : "", p2[k].pid, p2[k].usedGpuMemory, p2[k].gpuInstanceId,
                 p2[k].computeInstanceId);
    }
    jadd("]");
    nv_out(op, rc);
}

/* detail MODE [ROOM [VERSION]] */
static void op_detail(unsigned mode, unsigned room, unsigned version)
{
    static drv_ProcessDetail_v1_t rows[NROWS];
    nvmlDevice_t h;
    if (room > NROWS) room = NROWS;
    int rc = nv_handle((const void *)f.nvmlDeviceGetRunningProcessDetailList, &h);
    int r0 = rc;
    drv_ProcessDetailList_v1_t q0 = {version, mode, 0, NULL}, q = {version, mode, room, rows};
    if (!rc) {
        r0 = f.nvmlDeviceGetRunningProcessDetailList(h, &q0);
        rc = f.nvmlDeviceGetRunningProcessDetailList(h, &q);
    }
    jadd("\"mode\":%u,\"r0\":%d,\"need\":%u,\"count\":%u,\"procs\":[", mode, r0,
         q0.numProcArrayEntries, q.numProcArrayEntries);
    for (unsigned k = 0; !rc && k < q.numProcArrayEntries; k++)
        jadd("%s{\"pid\":%u,\"usedGpuMemory\":%llu,\"gpuInstanceId\":%u,\"computeInstanceId\":%u,"
             "\"usedGpuCcProtectedMemory\":%llu}",
             k ? "," : "", rows[k].pid, rows[k].usedGpuMemory, rows[k].gpuInstanceId,
             rows[k].computeInstanceId, rows[k].usedGpuCcProtectedMemory);
    jadd("]");
    nv_out("detail", rc);
}

/* utilinfo [SINCE [ROOM [VERSION]]] */
static void op_utilinfo(unsigned long long since, unsigned room, unsigned version)
{
    static drv_ProcessUtilizationInfo_v1_t rows[NROWS];
    nvmlDevice_t h;
    if (room > NROWS) room = NROWS;
    int rc = nv_handle((const void *)f.nvmlDeviceGetProcessesUtilizationInfo, &h);
    int r0 = rc;
    drv_ProcessesUtilizationInfo_v1_t q0 = {version, 0, since, NULL}, q = {version, room, since, rows};
    if (!rc) {
        r0 = f.nvmlDeviceGetProcessesUtilizationInfo(h, &q0);
        rc = f.nvmlDeviceGetProcessesUtilizationInfo(h, &q);
    }
    jadd("\"r0\":%d,\"need\":%u,\"count\":%u,\"samples\":[", r0, q0.processSamplesCount,
         q.processSamplesCount);
    for (unsigned k = 0; !rc && k < q.processSamplesCount; k++)
        jadd("%s{\"pid\":%u,\"timeStamp\":%llu,\"smUtil\":%u,\"memUtil\":%u,\"encUtil\":%u,"
             "\"decUtil\":%u,\"jpgUtil\":%u,\"ofaUtil\":%u}",
             k ? "," : "", rows[k].pid, rows[k].timeStamp, rows[k].smUtil, rows[k].memUtil,
             rows[k].encUtil, rows[k].decUtil, rows[k].jpgUtil, rows[k].ofaUtil);
    jadd("]");
    nv_out("utilinfo", rc);
}

static void op_utilrates(void)
{
    nvmlDevice_t h;
    nvmlUtilization_t u = {0, 0};
    int rc = nv_handle((const void *)f.nvmlDeviceGetUtilizationRates, &h);
    if (!rc) rc = f.nvmlDeviceGetUtilizationRates(h, &u);
    jadd("\"gpu\":%u,\"memory\":%u", u.gpu, u.memory);
    nv_out("utilrates", rc);
}

static void op_acctmode(void)
{
    nvmlDevice_t h;
    unsigned mode = 0, size = 0;
    int rc = nv_handle((const void *)f.nvmlDeviceGetAccountingMode, &h);
    int rb = f.nvmlDeviceGetAccountingBufferSize ? rc : -1;
    if (!rc) rc = f.nvmlDeviceGetAccountingMode(h, &mode);
    if (!rb) rb = f.nvmlDeviceGetAccountingBufferSize(h, &size);
    jadd("\"mode\":%u,\"rbuf\":%d,\"bufferSize\":%u", mode, rb, size);
    nv_out("acctmode", rc);
}

/* acctpids [ROOM] */
static void op_acctpids(unsigned room)
{
    static unsigned pids[4096];
    nvmlDevice_t h;
    if (room > 4096) room = 4096;
    int rc = nv_handle((const void *)f.nvmlDeviceGetAccountingPids, &h);
    int r0 = rc;
    unsigned need = 0, n = room;
    if (!rc) {
        r0 = f.nvmlDeviceGetAccountingPids(h, &need, NULL);
        rc = f.nvmlDeviceGetAccountingPids(h, &n, pids);
    }
    jadd("\"r0\":%d,\"need\":%u,\"count\":%u,\"pids\":[", r0, need, n);
    for (unsigned k = 0; !rc && k < n; k++) jadd("%s%u", k ? "," : "", pids[k]);
    jadd("]");
    nv_out("acctpids", rc);
}

static void op_acctstats(unsigned pid)
{
    nvmlDevice_t h;
    drv_AccountingStats_t st;
    memset(&st, 0, sizeof st);
    int rc = nv_handle((const void *)f.nvmlDeviceGetAccountingStats, &h);
    if (!rc) rc = f.nvmlDeviceGetAccountingStats(h, pid, &st);
    jadd("\"pid\":%u,\"gpuUtilization\":%u,\"memoryUtilization\":%u,\"maxMemoryUsage\":%llu,"
         "\"time\":%llu,\"startTime\":%llu,\"isRunning\":%u",
         pid, st.gpuUtilization, st.memoryUtilization, st.maxMemoryUsage, st.time, st.startTime,
         st.isRunning);
    nv_out("acctstats", rc);
}

int main(int argc, char **argv)
{
    const char *via = "dlsym";
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--via") && i + 1 < argc) via = argv[++i];
        else if (!strcmp(argv[i], "--dev") && i + 1 < argc) dev = atoi(argv[++i]);
        else break;
    }
    setup(via);
    char buf[512];
    for (; i < argc; i++) {
        const char *op = argv[i];
#define ARG(k) (i + (k) < argc ? strtoull(argv[i + (k)], NULL, 0) : 0)
        if (!strcmp(op, "resolve")) {
            int missing = 0;
#define X(name, base, ret, params) missing += !f.name;
            FUNCS(X)
#undef X
            snprintf(buf, sizeof buf, "\"missing\":%d", missing);
            out(op, CUDA_SUCCESS, buf);
        } else if (!strcmp(op, "ctx")) {
            ctx();
        } else if (!strcmp(op, "alloc") || !strcmp(op, "managed") || !strcmp(op, "async") ||
                   !strcmp(op, "pool")) {
            size_t n = ARG(1);
            i++;
            CUdeviceptr p = 0;
            CUresult r;
            int kind = K_PTR;
            if (!strcmp(op, "alloc")) r = f.cuMemAlloc_v2(&p, n);
            else if (!strcmp(op, "managed")) r = f.cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL);
            else if (!strcmp(op, "async")) {
                kind = K_ASYNC;
                r = f.cuMemAllocAsync(&p, n, NULL);
            } else {
                CUmemoryPool pool;
                kind = K_ASYNC;
                r = f.cuDeviceGetDefaultMemPool(&pool, dev);
                if (!r) r = f.cuMemAllocFromPoolAsync(&p, n, pool, NULL);
            }
            int id = r ? -1 : add_item(kind, p, n);
            snprintf(buf, sizeof buf, "\"id\":%d,\"bytes\":%zu", id, n);
            out(op, r, buf);
        } else if (!strcmp(op, "pitch")) {
            size_t w = ARG(1), h = ARG(2), pitch = 0;
            i += 2;
            CUdeviceptr p = 0;
            CUresult r = f.cuMemAllocPitch_v2(&p, &pitch, w, h, 4);
            int id = r ? -1 : add_item(K_PTR, p, pitch * h);
            snprintf(buf, sizeof buf, "\"id\":%d,\"pitch\":%zu", id, pitch);
            out(op, r, buf);
        } else if (!strcmp(op, "vmm") || !strcmp(op, "vmmhost")) {
            size_t n = ARG(1);
            i++;
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = !strcmp(op, "vmm") ? CU_MEM_LOCATION_TYPE_DEVICE : 2 /* HOST */;
            prop.location.id = !strcmp(op, "vmm") ? dev : 0;
            CUmemGenericAllocationHandle hnd = 0;
            CUresult r = f.cuMemCreate(&hnd, n, &prop, 0);
            int id = r ? -1 : add_item(K_VMM, hnd, n);
            snprintf(buf, sizeof buf, "\"id\":%d,\"bytes\":%zu", id, n);
            out(op, r, buf);
        } else if (!strcmp(op, "array") || !strcmp(op, "array3d") || !strcmp(op, "mipmap")) {
            CUarray a = NULL;
            CUmipmappedArray mm = NULL;
            CUresult r;
            int kind = K_ARRAY;
            if (!strcmp(op, "array")) {
                CUDA_ARRAY_DESCRIPTOR d = {ARG(1), ARG(2), CU_AD_FORMAT_FLOAT, 1};
                i += 2;
                r = f.cuArrayCreate_v2(&a, &d);
            } else {
                CUDA_ARRAY3D_DESCRIPTOR d = {ARG(1), ARG(2), ARG(3), CU_AD_FORMAT_FLOAT, 1, 0};
                unsigned levels = (unsigned)ARG(3);
                i += 3;
                if (!strcmp(op, "array3d")) r = f.cuArray3DCreate_v2(&a, &d);
                else { /* mipmap W H LEVELS */
                    d.Depth = 0;
                    kind = K_MIPMAP;
                    r = f.cuMipmappedArrayCreate(&mm, &d, levels);
                }
            }
            unsigned long long v = kind == K_MIPMAP ? (uintptr_t)mm : (uintptr_t)a;
            int id = r ? -1 : add_item(kind, v, 0);
            snprintf(buf, sizeof buf, "\"id\":%d", id);
            out(op, r, buf);
        } else if (!strcmp(op, "free")) {
            int id = (int)ARG(1);
            i++;
            out(op, free_item(id), NULL);
        } else if (!strcmp(op, "freeall")) {
            CUresult r = CUDA_SUCCESS;
            for (int k = 0; k < nitems; k++)
                if (items[k].v && free_item(k)) r = CUDA_ERROR_UNKNOWN;
            out(op, r, NULL);
        } else if (!strcmp(op, "sync")) {
            out(op, f.cuCtxSynchronize(), NULL);
        } else if (!strcmp(op, "info")) {
            size_t fr = 0, tot = 0;
            CUresult r = f.cuMemGetInfo_v2(&fr, &tot);
            snprintf(buf, sizeof buf, "\"free\":%zu,\"total\":%zu", fr, tot);
            out(op, r, buf);
        } else if (!strcmp(op, "total")) {
            size_t tot = 0;
            CUresult r = f.cuDeviceTotalMem_v2(&tot, dev);
            snprintf(buf, sizeof buf, "\"total\":%zu", tot);
            out(op, r, buf);
        } else if (!strcmp(op, "nvml")) {
            nvmlDevice_t h;
            nvmlMemory_t m1 = {0};
            nvmlMemory_v2_t m2 = {0};
            m2.version = (unsigned)(sizeof(nvmlMemory_v2_t) | (2 << 24));
            nvmlReturn_t r = f.nvmlInit_v2();
            if (!r) r = f.nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &h);
            nvmlReturn_t r1 = r ? r : f.nvmlDeviceGetMemoryInfo(h, &m1);
            nvmlReturn_t r2 = r ? r : f.nvmlDeviceGetMemoryInfo_v2(h, &m2);
            nvmlProcessInfo_t pi[64];
            unsigned n = 64;
            nvmlReturn_t r3 = r ? r : f.nvmlDeviceGetComputeRunningProcesses_v3(h, &n, pi);
            int len = snprintf(buf, sizeof buf,
                               "\"r1\":%d,\"total\":%llu,\"used\":%llu,\"free\":%llu,\"r2\":%d,"
                               "\"total2\":%llu,\"used2\":%llu,\"free2\":%llu,\"r3\":%d,\"procs\":[",
                               r1, m1.total, m1.used, m1.free, r2, m2.total, m2.used, m2.free, r3);
            for (unsigned k = 0; !r3 && k < n && len < 400; k++)
                len += snprintf(buf + len, sizeof buf - (size_t)len, "%s[%u,%llu]", k ? "," : "",
                                pi[k].pid, pi[k].usedGpuMemory);
            snprintf(buf + len, sizeof buf - (size_t)len, "]");
            out(op, (CUresult)r, buf);
        } else if (!strcmp(op, "procutil")) {
            /* nvmlDeviceGetProcessUtilization since 0: the count asked first, then the rows */
            nvmlDevice_t h;
            nvmlProcessUtilizationSample_t s[64];
            unsigned n = 0;
            nvmlReturn_t r = f.nvmlInit_v2();
            if (!r) r = f.nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &h);
            nvmlReturn_t r0 = r ? r : f.nvmlDeviceGetProcessUtilization(h, NULL, &n, 0);
            unsigned need = n;
            n = 64;
            nvmlReturn_t r1 = r ? r : f.nvmlDeviceGetProcessUtilization(h, s, &n, 0);
            int len = snprintf(buf, sizeof buf, "\"r0\":%d,\"need\":%u,\"r1\":%d,\"samples\":[",
                               r0, need, r1);
            for (unsigned k = 0; !r1 && k < n && len < 400; k++)
                len += snprintf(buf + len, sizeof buf - (size_t)len, "%s[%u,%u]", k ? "," : "",
                                s[k].pid, s[k].smUtil);
            snprintf(buf + len, sizeof buf - (size_t)len, "]");
            out(op, (CUresult)r, buf);
        } else if (!strcmp(op, "gfxprocs") || !strcmp(op, "mpsprocs")) {
            int k = nums(argc, argv, i, 2);
            int version = k >= 1 ? (int)ARG(1) : 3;
            unsigned room = k >= 2 ? (unsigned)ARG(2) : 64;
            i += k;
            op_procs(op, version >= 1 && version <= 3 ? version : 3, room);
        } else if (!strcmp(op, "detail")) {
            int k = nums(argc, argv, i + 1, 2);
            unsigned mode = (unsigned)ARG(1);
            unsigned room = k >= 1 ? (unsigned)ARG(2) : 64;
            unsigned version = k >= 2 ? (unsigned)ARG(3) : DRV_PROCESS_DETAIL_LIST_V1;
            i += 1 + k;
            op_detail(mode, room, version);
        } else if (!strcmp(op, "utilinfo")) {
            int k = nums(argc, argv, i, 3);
            unsigned long long since = k >= 1 ? ARG(1) : 0;
            unsigned room = k >= 2 ? (unsigned)ARG(2) : 64;
            unsigned version = k >= 3 ? (unsigned)ARG(3) : DRV_PROCESSES_UTILIZATION_INFO_V1;
            i += k;
            op_utilinfo(since, room, version);
        } else if (!strcmp(op, "utilrates")) {
            op_utilrates();
        } else if (!strcmp(op, "acctmode")) {
            op_acctmode();
        } else if (!strcmp(op, "acctpids")) {
            int k = nums(argc, argv, i, 1);
            unsigned room = k ? (unsigned)ARG(1) : 4096;
            i += k;
            op_acctpids(room);
        } else if (!strcmp(op, "acctstats")) {
            unsigned pid = (unsigned)ARG(1);
            i += 1;
            op_acctstats(pid);
        } else if (!strcmp(op, "nulls")) {
            nulls();
        } else if (!strcmp(op, "physical")) {
            snprintf(buf, sizeof buf, "\"bytes\":%llu", fake_used ? fake_used(dev) : 0ull);
            out(op, CUDA_SUCCESS, buf);
        } else if (!strcmp(op, "forkstress")) {
            /* forkstress N: a thread allocates and frees in a loop while this one forks
             * N children; each child frees NULL (the shim looks up its records, the
             * driver does nothing) and exits, with 2 s to do it. How many did not. */
            int n = (int)ARG(1), hung = 0, crashed = 0;
            i += 1;
            pthread_t t;
            stress_run = 1;
            pthread_create(&t, NULL, alloc_loop, NULL);
            for (int k = 0; k < n; k++) {
                fflush(stdout);
                pid_t c = fork();
                if (c == 0) {
                    alarm(2);
                    f.cuMemFree_v2(0); /* the shim looks up its records; the driver: a no-op */
                    _exit(0);
                }
                int st = 0;
                waitpid(c, &st, 0);
                if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) hung++;
                else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) crashed++;
            }
            stress_run = 0;
            pthread_join(t, NULL);
            snprintf(buf, sizeof buf, "\"forks\":%d,\"hung\":%d,\"crashed\":%d,\"loops\":%ld",
                     n, hung, crashed, stress_loops);
            out("forkstress", CUDA_SUCCESS, buf);
        } else if (!strcmp(op, "slowinit")) {
            /* slowinit: a thread makes the process's first driver call (the shim's
             * init, and its registration with the plugin); 100 ms later this thread
             * makes its own first call: how long it waited */
            pthread_t t;
            double t0 = now_ms();
            pthread_create(&t, NULL, first_call, NULL);
            struct timespec hundred = {0, 100000000};
            nanosleep(&hundred, NULL);
            double t1 = now_ms();
            size_t fr = 0, tot = 0;
            CUresult r = f.cuMemGetInfo_v2(&fr, &tot); /* hooked: waits for the init */
            double t2 = now_ms();
            pthread_join(t, NULL);
            snprintf(buf, sizeof buf, "\"waited_ms\":%.1f,\"first_ms\":%.1f", t2 - t1,
                     first_done_ms - t0);
            out("slowinit", r, buf);
        } else if (!strcmp(op, "sigalloc")) {
            /* sigalloc SIZE: a SIGALRM handler asks SIZE bytes while this thread is
             * inside the driver (a free that blocks: FAKECUDA_FREE_PAUSE_MS); the
             * handler's answer is the op's rc */
            sig_bytes = (size_t)ARG(1);
            i += 1;
            CUdeviceptr p = 0;
            CUresult r = f.cuMemAlloc_v2(&p, 1 << 20);
            if (r == CUDA_SUCCESS) {
                struct sigaction sa = {0};
                sa.sa_handler = on_alarm;
                sigaction(SIGALRM, &sa, NULL);
                struct itimerval it = {{0, 0}, {0, 50000}};
                setitimer(ITIMER_REAL, &it, NULL);
                r = f.cuMemFree_v2(p);
            }
            snprintf(buf, sizeof buf, "\"free\":%d,\"ran\":%d,\"bytes\":%zu", (int)r,
                     sig_ran, sig_bytes);
            out("sigalloc", sig_ran ? sig_rc : CUDA_ERROR_UNKNOWN, buf);
        } else if (!strcmp(op, "launch")) {
            unsigned blocks = (unsigned)ARG(1);
            double secs = atof(i + 2 < argc ? argv[i + 2] : "1");
            const char *kind = i + 3 < argc ? argv[i + 3] : "kernel";
            const char *ns = i + 4 < argc && isdigit((unsigned char)argv[i + 4][0]) ? argv[i + 4]
                                                                                   : NULL;
            i += ns ? 4 : 3;
            launch_loop(blocks, secs, kind, ns);
        } else if (!strcmp(op, "busy")) {
            /* busy HOSTPID T0 T1 STEP: device time of HOSTPID (-1: all) per window */
            int hp = (int)strtol(i + 1 < argc ? argv[i + 1] : "-1", NULL, 0);
            unsigned long long t0 = ARG(2), t1 = ARG(3), step = ARG(4);
            i += 4;
            printf("{\"op\":\"busy\",\"rc\":0,\"windows\":[");
            for (unsigned long long t = t0, k = 0; step && t + step <= t1; t += step, k++)
                printf("%s%llu", k ? "," : "", fake_busy ? fake_busy(dev, hp, t, t + step) : 0ull);
            printf("]}\n");
            fflush(stdout);
        } else if (!strcmp(op, "windows")) {
            /* windows HOSTPID T0 T1: exact device time of HOSTPID in each of the fake's
             * sampling windows inside [T0, T1) (exact for any number of kernels) */
            int hp = (int)strtol(i + 1 < argc ? argv[i + 1] : "-1", NULL, 0);
            unsigned long long t0 = ARG(2), t1 = ARG(3);
            i += 3;
            unsigned long long w = fake_window_ns ? fake_window_ns() : 0;
            printf("{\"op\":\"windows\",\"rc\":0,\"window_ns\":%llu,\"busy\":[", w);
            for (unsigned long long k = w ? (t0 + w - 1) / w : 0, n = 0; w && (k + 1) * w <= t1;
                 k++, n++)
                printf("%s%llu", n ? "," : "", fake_window_busy(dev, hp, k * w));
            printf("]}\n");
            fflush(stdout);
        } else if (!strcmp(op, "sleep")) {
            usleep((useconds_t)ARG(1) * 1000);
            i++;
        } else if (!strcmp(op, "hold")) {
            out(op, CUDA_SUCCESS, NULL);
            for (;;) pause();
        } else if (!strcmp(op, "random")) {
            unsigned seed = (unsigned)ARG(1);
            int n = (int)ARG(2);
            size_t maxb = ARG(3);
            i += 3;
            srand(seed);
            int ok = 0, oom = 0, other = 0, frees = 0;
            for (int k = 0; k < n; k++) {
                int live[1024], nl = 0;
                for (int q = 0; q < nitems && nl < 1024; q++)
                    if (items[q].v) live[nl++] = q;
                if (nl && rand() % 100 < 40) {
                    if (free_item(live[rand() % nl]) == CUDA_SUCCESS) frees++;
                    else other++;
                } else {
                    CUdeviceptr p;
                    size_t b = 1 + (size_t)rand() % maxb;
                    CUresult r = f.cuMemAlloc_v2(&p, b);
                    if (r == CUDA_SUCCESS) { ok++; add_item(K_PTR, p, b); }
                    else if (r == CUDA_ERROR_OUT_OF_MEMORY) oom++;
                    else other++;
                }
                if (k % 16 == 0) usleep(200);
            }
            snprintf(buf, sizeof buf, "\"ok\":%d,\"oom\":%d,\"other\":%d,\"frees\":%d", ok, oom,
                     other, frees);
            out(op, CUDA_SUCCESS, buf);
        } else {
            snprintf(buf, sizeof buf, "\"unknown\":\"%s\"", op);
            out("error", CUDA_ERROR_INVALID_VALUE, buf);
            return 2;
        }
    }
    return 0;
}
