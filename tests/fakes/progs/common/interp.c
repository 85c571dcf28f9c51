/* The script interpreter shared by the test programs.  One op per line (or per
 * ';'-separated piece of argv); one JSON object per op on stdout.  See README.md. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "api.h"

static struct api *A;
static const char *HOW;
static int cur_dev;
static int inited;
static CUcontext prim[64];
static CUmodule module;
static CUcontext module_ctx; /* the context module was loaded in (it dies with it) */
static CUfunction kernel;
static char kernel_name[64] = "fake_kernel"; /* "kernel NS": fake_ns_NS */
static unsigned threads_per_block = 128;     /* "threads T" */

#define MAX_IDS 65536
enum rkind {
    R_FREE = 0, R_ALLOC, R_ALLOC32, R_ARRAY, R_MIPMAP, R_MANAGED, R_HOST, R_ASYNC, R_VMM,
    R_HANDLE, R_POOL, R_STREAM, R_CTX, R_GRAPH, R_MODULE, R_LIBRARY, R_GREEN, R_IPC
};
struct rec {
    int kind;
    uint64_t ptr, size, handle;
    int released; /* R_VMM: cuMemRelease done ("memrelease"), the mapping kept */
    uint64_t oldptr; /* the address an unmapped id had ("retain" of an unmapped address) */
    CUmemoryPool pool;
    CUstream stream;
    CUcontext ctx;
    CUgraph graph;
    CUgraphExec exec;
    CUmodule module;
    CUlibrary library;
    CUgreenCtx green; /* R_GREEN (ctx: its CUcontext, cuCtxFromGreenCtx) */
};
static struct rec recs[MAX_IDS];
static int nrecs;

/* ---- output ---- */
static void emit(const char *op, int rc, const char *fmt, ...) {
    char extra[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(extra, sizeof extra, fmt, ap);
        va_end(ap);
    }
    printf("{\"op\":\"%s\",\"rc\":%d%s%s}\n", op, rc, *extra ? "," : "", extra);
    fflush(stdout);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#define MISSING (-1)
#define CALL(f, ...) (A->f ? (int)A->f(__VA_ARGS__) : MISSING)

static uint64_t parse_size(const char *s) {
    if (!s) return 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
    }
    return v;
}

static int new_id(struct rec r) {
    if (nrecs >= MAX_IDS) return -1;
    recs[nrecs] = r;
    return nrecs++;
}

static struct rec *get_id(const char *s) {
    if (!s) return NULL;
    int id = atoi(s);
    if (id < 0 || id >= nrecs || recs[id].kind == R_FREE) return NULL;
    return &recs[id];
}

/* Makes dev's primary context current, as libcudart does on first use (cuInit included). */
static int ensure(int dev) {
    int rc;
    if (!inited) {
        rc = CALL(cuInit, 0);
        if (rc) return rc;
        inited = 1;
    }
    CUdevice cur;
    if (CALL(cuCtxGetDevice, &cur) == 0 && cur == dev) return 0;
    if (dev < 0 || dev >= 64) return CUDA_ERROR_INVALID_DEVICE;
    if (!prim[dev]) {
        rc = CALL(cuDevicePrimaryCtxRetain, &prim[dev], dev);
        if (rc) return rc;
    }
    return CALL(cuCtxSetCurrent, prim[dev]);
}

/* A descriptor another process shared: PATH is opened (/proc/PID/fd/N: a new open of the
 * same file, which a memfd allows), PID:FD is duplicated from that process
 * (pidfd_getfd: the same open file, as SCM_RIGHTS would pass it; what a real driver's
 * descriptors need). */
static int open_shared(const char *what) {
    if (what[0] == '/') return open(what, O_RDONLY | O_CLOEXEC);
    int pid = atoi(what), fd = atoi(strchr(what, ':') + 1);
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) return -1;
    int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    close(pidfd);
    return got;
}

/* The image the module ops load: "fake cubin" (the fake driver's), or the contents of the
 * file INTERP_IMAGE names (for a real driver: PTX text, which cuModuleLoadData compiles;
 * benchmarks/gpu_verify.py). */
static const char *module_image(void) {
    static char *image;
    if (image) return image;
    const char *path = getenv("INTERP_IMAGE");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        image = n >= 0 ? calloc(1, (size_t)n + 1) : NULL;
        if (image && (fseek(f, 0, SEEK_SET) != 0 || fread(image, 1, (size_t)n, f) != (size_t)n)) {
            free(image);
            image = NULL;
        }
    }
    if (f) fclose(f);
    if (!image) image = "fake cubin";
    return image;
}

static int ensure_kernel(void) {
    int rc = ensure(cur_dev);
    if (rc) return rc;
    if (kernel) return 0;
    if (!module) {
        rc = CALL(cuModuleLoadData, &module, module_image());
        if (rc) return rc;
        CALL(cuCtxGetCurrent, &module_ctx);
    }
    return CALL(cuModuleGetFunction, &kernel, module, kernel_name);
}

/* kernel [NS]: the following launches use the function fake_ns_NS (NS ns per block per
 * wave); without NS the default function (FAKECUDA_NS_PER_BLOCK). */
static void op_kernel(char **a) {
    if (a[0])
        snprintf(kernel_name, sizeof kernel_name, "fake_ns_%llu", (unsigned long long)parse_size(a[0]));
    else
        snprintf(kernel_name, sizeof kernel_name, "fake_kernel");
    kernel = NULL;
    int rc = ensure_kernel();
    emit("kernel", rc, "\"name\":\"%s\"", kernel_name);
}

static void uuid_string(const CUuuid *u, char *buf, size_t len) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static int dev_arg(const char *s) { return s ? atoi(s) : cur_dev; }

static CUstream stream_arg(const char *s) {
    struct rec *r = get_id(s);
    return (r && r->kind == R_STREAM) ? r->stream : NULL;
}

/* ---- allocation ops: DEV first, record an id ---- */
static void op_alloc(const char *op, char **a) {
    int dev = dev_arg(a[0]);
    uint64_t size = parse_size(a[1]);
    int rc = ensure(dev);
    struct rec r = {0};
    if (!rc) {
        if (!strcmp(op, "alloc")) {
            CUdeviceptr p = 0;
            rc = CALL(cuMemAlloc_v2, &p, size);
            r = (struct rec){.kind = R_ALLOC, .ptr = p, .size = size};
        } else if (!strcmp(op, "alloc32")) {
            CUdeviceptr_v1 p = 0;
            rc = CALL(cuMemAlloc, &p, (unsigned int)size);
            r = (struct rec){.kind = R_ALLOC32, .ptr = p, .size = size};
        } else if (!strcmp(op, "managed")) {
            CUdeviceptr p = 0;
            rc = CALL(cuMemAllocManaged, &p, size, CU_MEM_ATTACH_GLOBAL);
            r = (struct rec){.kind = R_MANAGED, .ptr = p, .size = size};
        } else if (!strcmp(op, "host") || !strcmp(op, "hostalloc")) {
            void *p = NULL;
            rc = !strcmp(op, "host") ? CALL(cuMemAllocHost_v2, &p, size)
                                     : CALL(cuMemHostAlloc, &p, size, 0);
            r = (struct rec){.kind = R_HOST, .ptr = (uint64_t)(uintptr_t)p, .size = size};
        } else if (!strcmp(op, "async")) {
            CUdeviceptr p = 0;
            rc = CALL(cuMemAllocAsync, &p, size, stream_arg(a[2])); /* [STREAMID] */
            r = (struct rec){.kind = R_ASYNC, .ptr = p, .size = size};
        } else if (!strcmp(op, "defpoolalloc")) {
            CUmemoryPool pool = NULL;
            CUdeviceptr p = 0;
            rc = CALL(cuDeviceGetDefaultMemPool, &pool, dev);
            if (!rc) rc = CALL(cuMemAllocFromPoolAsync, &p, size, pool, NULL);
            r = (struct rec){.kind = R_ASYNC, .ptr = p, .size = size};
        }
    }
    int id = rc ? -1 : new_id(r);
    emit(op, rc, "\"id\":%d,\"ptr\":\"0x%" PRIx64 "\",\"size\":%" PRIu64, id, r.ptr, size);
}

static void op_pitch(char **a) {
    int dev = dev_arg(a[0]);
    uint64_t w = parse_size(a[1]), h = parse_size(a[2]);
    unsigned elem = a[3] ? (unsigned)atoi(a[3]) : 4;
    CUdeviceptr p = 0;
    size_t pitch = 0;
    int rc = ensure(dev);
    if (!rc) rc = CALL(cuMemAllocPitch_v2, &p, &pitch, w, h, elem);
    int id = rc ? -1 : new_id((struct rec){.kind = R_ALLOC, .ptr = p, .size = pitch * h});
    emit("pitch", rc, "\"id\":%d,\"ptr\":\"0x%llx\",\"pitch\":%zu,\"size\":%" PRIu64, id,
         (unsigned long long)p, pitch, (uint64_t)pitch * h);
}

/* pitch1 D W H [ELEM]: the pre-3.2 entry point (32-bit pointer and sizes) */
static void op_pitch1(char **a) {
    int dev = dev_arg(a[0]);
    unsigned w = (unsigned)parse_size(a[1]), h = (unsigned)parse_size(a[2]);
    unsigned elem = a[3] ? (unsigned)atoi(a[3]) : 4;
    CUdeviceptr_v1 p = 0;
    unsigned pitch = 0;
    int rc = ensure(dev);
    if (!rc) rc = CALL(cuMemAllocPitch, &p, &pitch, w, h, elem);
    int id = rc ? -1 : new_id((struct rec){.kind = R_ALLOC32, .ptr = p,
                                           .size = (uint64_t)pitch * h});
    emit("pitch1", rc, "\"id\":%d,\"ptr\":\"0x%x\",\"pitch\":%u,\"size\":%" PRIu64, id, p,
         pitch, (uint64_t)pitch * h);
}

/* racefree SIZE: cuMemFree of a SIZE block in a second thread while this one allocates
 * SIZE again 50 ms later (with FAKECUDA_REUSE_ADDRESSES and FAKECUDA_FREE_PAUSE_MS the
 * driver hands out the freed address while the free has not returned); the id is the
 * second block's. */
struct race { CUdeviceptr p; int rc; };

static void *race_free(void *arg) {
    struct race *r = arg;
    r->rc = CALL(cuMemFree_v2, r->p);
    return NULL;
}

static void op_racefree(char **a) {
    uint64_t size = parse_size(a[0]);
    CUdeviceptr second = 0;
    struct race r = {0, -1};
    int rc = ensure(cur_dev);
    if (!rc) rc = CALL(cuMemAlloc_v2, &r.p, size);
    pthread_t t;
    if (!rc && pthread_create(&t, NULL, race_free, &r) != 0) rc = CUDA_ERROR_UNKNOWN;
    if (!rc) {
        usleep(50000);
        rc = CALL(cuMemAlloc_v2, &second, size);
        pthread_join(t, NULL);
    }
    int id = rc ? -1 : new_id((struct rec){.kind = R_ALLOC, .ptr = second, .size = size});
    emit("racefree", rc, "\"id\":%d,\"first\":\"0x%llx\",\"second\":\"0x%llx\",\"free_rc\":%d",
         id, (unsigned long long)r.p, (unsigned long long)second, r.rc);
}

static void op_array(const char *op, char **a) {
    int dev = dev_arg(a[0]);
    int rc = ensure(dev);
    CUarray arr = NULL;
    CUmipmappedArray mip = NULL;
    int kind = R_ARRAY;
    if (!rc) {
        size_t w = parse_size(a[1]), h = parse_size(a[2]);
        if (!strcmp(op, "array")) {
            CUDA_ARRAY_DESCRIPTOR d = {w, h, CU_AD_FORMAT_UNSIGNED_INT8,
                                       a[3] ? (unsigned)atoi(a[3]) : 1};
            rc = CALL(cuArrayCreate_v2, &arr, &d);
        } else if (!strcmp(op, "array1")) { /* the pre-3.2 descriptor */
            CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)w, (unsigned)h, CU_AD_FORMAT_UNSIGNED_INT8,
                                          a[3] ? (unsigned)atoi(a[3]) : 1};
            rc = CALL(cuArrayCreate, &arr, &d);
        } else if (!strcmp(op, "array3d1")) {
            CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)w, (unsigned)h, (unsigned)parse_size(a[3]),
                                            CU_AD_FORMAT_UNSIGNED_INT8,
                                            a[4] ? (unsigned)atoi(a[4]) : 1, 0};
            rc = CALL(cuArray3DCreate, &arr, &d);
        } else if (!strcmp(op, "array3d")) {
            CUDA_ARRAY3D_DESCRIPTOR d = {w, h, parse_size(a[3]), CU_AD_FORMAT_UNSIGNED_INT8,
                                         a[4] ? (unsigned)atoi(a[4]) : 1, 0};
            rc = CALL(cuArray3DCreate_v2, &arr, &d);
        } else {
            CUDA_ARRAY3D_DESCRIPTOR d = {w, h, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
            rc = CALL(cuMipmappedArrayCreate, &mip, &d, a[3] ? (unsigned)atoi(a[3]) : 1);
            kind = R_MIPMAP;
        }
    }
    uint64_t h = kind == R_ARRAY ? (uint64_t)(uintptr_t)arr : (uint64_t)(uintptr_t)mip;
    int id = rc ? -1 : new_id((struct rec){.kind = kind, .handle = h});
    emit(op, rc, "\"id\":%d,\"handle\":\"0x%" PRIx64 "\"", id, h);
}

static CUmemAllocationProp prop_for(int dev, int host) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = host ? 0 : dev;
    return p;
}

static void op_vmm(const char *op, char **a) {
    int host = !strcmp(op, "memcreatehost");
    int dev = host ? cur_dev : dev_arg(a[0]);
    uint64_t size = parse_size(host ? a[0] : a[1]);
    const char *share = host ? a[1] : (a[1] ? a[2] : NULL);
    if (!inited && CALL(cuInit, 0) == 0) inited = 1; /* VMM needs no context */
    CUmemAllocationProp prop = prop_for(dev, host);
    if (share && !strcmp(share, "fd")) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    int rc = CALL(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    if (!rc) rc = CALL(cuMemCreate, &h, size, &prop, 0);
    if (!rc && !strcmp(op, "vmm")) {
        rc = CALL(cuMemAddressReserve, &va, size, 0, 0, 0);
        if (!rc) rc = CALL(cuMemMap, va, size, 0, h, 0);
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, {dev}}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (!rc) rc = CALL(cuMemSetAccess, va, size, &acc, 1);
    }
    int id = -1;
    if (!rc)
        id = new_id((struct rec){.kind = va ? R_VMM : R_HANDLE, .ptr = va, .size = size, .handle = h});
    emit(op, rc, "\"id\":%d,\"ptr\":\"0x%llx\",\"handle\":\"0x%llx\",\"granularity\":%zu", id,
         (unsigned long long)va, (unsigned long long)h, gran);
}

/* The context ctx is gone, and the kernel's module with it if it was loaded there. */
static void forget_module_of(CUcontext ctx) {
    if (module && module_ctx == ctx) module = NULL, kernel = NULL, module_ctx = NULL;
}

static int free_rec(struct rec *r) {
    int rc = 0;
    switch (r->kind) {
    case R_ALLOC:
    case R_MANAGED: rc = CALL(cuMemFree_v2, r->ptr); break;
    case R_ALLOC32: rc = CALL(cuMemFree, (CUdeviceptr_v1)r->ptr); break;
    case R_ARRAY: rc = CALL(cuArrayDestroy, (CUarray)(uintptr_t)r->handle); break;
    case R_MIPMAP: rc = CALL(cuMipmappedArrayDestroy, (CUmipmappedArray)(uintptr_t)r->handle); break;
    case R_HOST: rc = CALL(cuMemFreeHost, (void *)(uintptr_t)r->ptr); break;
    case R_ASYNC: rc = CALL(cuMemFreeAsync, r->ptr, NULL); break;
    case R_VMM:
        rc = CALL(cuMemUnmap, r->ptr, r->size);
        if (!rc && !r->released) rc = CALL(cuMemRelease, r->handle);
        if (!rc) rc = CALL(cuMemAddressFree, r->ptr, r->size);
        break;
    case R_GRAPH:
        rc = CALL(cuGraphExecDestroy, r->exec);
        if (!rc) rc = CALL(cuGraphDestroy, r->graph);
        break;
    case R_HANDLE: rc = CALL(cuMemRelease, r->handle); break;
    case R_IPC: rc = CALL(cuIpcCloseMemHandle, r->ptr); break;
    case R_POOL: rc = CALL(cuMemPoolDestroy, r->pool); break;
    case R_STREAM: rc = CALL(cuStreamDestroy_v2, r->stream); break;
    case R_CTX:
        rc = CALL(cuCtxDestroy_v2, r->ctx);
        if (!rc) forget_module_of(r->ctx);
        break;
    case R_GREEN: rc = CALL(cuGreenCtxDestroy, r->green); break;
    case R_MODULE: rc = CALL(cuModuleUnload, r->module); break;
    case R_LIBRARY: rc = CALL(cuLibraryUnload, r->library); break;
    default: rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (!rc) r->kind = R_FREE;
    return rc;
}

static const struct {
    const char *name;
    CUmemPool_attribute attr;
    int is_int; /* the reuse policies are ints, the rest cuuint64_t */
} pool_attrs[] = {
    {"followevent", CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, 1},
    {"opportunistic", CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 1},
    {"internal", CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 1},
    {"threshold", CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0},
    {"reserved", CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 0},
    {"reservedhigh", CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0},
    {"used", CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0},
    {"usedhigh", CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0},
};

static void op_pool(const char *op, char **a) {
    if (!strcmp(op, "defpool") || !strcmp(op, "curpool")) {
        int dev = dev_arg(a[0]);
        int rc = ensure(dev);
        CUmemoryPool pool = NULL;
        if (!rc)
            rc = !strcmp(op, "defpool") ? CALL(cuDeviceGetDefaultMemPool, &pool, dev)
                                        : CALL(cuDeviceGetMemPool, &pool, dev);
        int id = rc ? -1 : new_id((struct rec){.kind = R_POOL, .pool = pool});
        emit(op, rc, "\"id\":%d,\"pool\":\"%p\"", id, (void *)pool);
        return;
    }
    if (!strcmp(op, "setpool")) { /* setpool D POOLID */
        int dev = dev_arg(a[0]);
        struct rec *p = get_id(a[1]);
        int rc = ensure(dev);
        if (!rc) rc = (p && p->kind == R_POOL) ? CALL(cuDeviceSetMemPool, dev, p->pool) : CUDA_ERROR_INVALID_VALUE;
        emit(op, rc, NULL);
        return;
    }
    if (!strcmp(op, "pool")) { /* pool [D [ipc]]: ipc, shareable by a POSIX fd */
        int dev = dev_arg(a[0]);
        int rc = ensure(dev);
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        if (a[0] && a[1] && !strcmp(a[1], "ipc"))
            props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        CUmemoryPool pool = NULL;
        if (!rc) rc = CALL(cuMemPoolCreate, &pool, &props);
        int id = rc ? -1 : new_id((struct rec){.kind = R_POOL, .pool = pool});
        emit(op, rc, "\"id\":%d", id);
        return;
    }
    struct rec *p = get_id(a[0]);
    if (!p || p->kind != R_POOL) {
        emit(op, CUDA_ERROR_INVALID_VALUE, "\"error\":\"not a pool id\"");
        return;
    }
    if (!strcmp(op, "poolalloc")) {
        uint64_t size = parse_size(a[1]);
        CUdeviceptr ptr = 0;
        int rc = CALL(cuMemAllocFromPoolAsync, &ptr, size, p->pool, NULL);
        int id = rc ? -1 : new_id((struct rec){.kind = R_ASYNC, .ptr = ptr, .size = size});
        emit(op, rc, "\"id\":%d,\"ptr\":\"0x%llx\",\"size\":%" PRIu64, id, (unsigned long long)ptr, size);
    } else if (!strcmp(op, "trim")) {
        emit(op, CALL(cuMemPoolTrimTo, p->pool, parse_size(a[1])), NULL);
    } else if (!strcmp(op, "poolexport")) { /* poolexport POOLID: its shareable fd */
        int fd = -1;
        int rc = CALL(cuMemPoolExportToShareableHandle, &fd, p->pool,
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        emit(op, rc, "\"fd\":%d", rc ? -1 : fd);
    } else if (!strcmp(op, "ptrimport")) { /* ptrimport POOLID HEX: an imported pool's */
        CUmemPoolPtrExportData d;
        memset(&d, 0, sizeof d);
        const char *h = a[1] ? a[1] : "";
        for (size_t i = 0; i < sizeof d.reserved && h[2 * i] && h[2 * i + 1]; i++) {
            char b[3] = {h[2 * i], h[2 * i + 1], 0};
            d.reserved[i] = (unsigned char)strtoul(b, NULL, 16);
        }
        CUdeviceptr ptr = 0;
        int rc = CALL(cuMemPoolImportPointer, &ptr, p->pool, &d);
        emit(op, rc, "\"ptr\":\"0x%llx\"", (unsigned long long)ptr);
    } else if (!strcmp(op, "poolsetattr")) { /* poolsetattr POOLID NAME VALUE */
        int k = -1;
        for (size_t i = 0; a[1] && i < sizeof pool_attrs / sizeof pool_attrs[0]; i++)
            if (!strcmp(a[1], pool_attrs[i].name)) k = (int)i;
        if (k < 0) {
            emit(op, CUDA_ERROR_INVALID_VALUE, "\"error\":\"unknown attribute\"");
            return;
        }
        cuuint64_t v64 = parse_size(a[2]);
        int v32 = (int)v64;
        int rc = CALL(cuMemPoolSetAttribute, p->pool, pool_attrs[k].attr,
                      pool_attrs[k].is_int ? (void *)&v32 : (void *)&v64);
        emit(op, rc, "\"name\":\"%s\",\"value\":%" PRIu64, a[1], (uint64_t)v64);
    } else { /* poolattr: every attribute */
        char out[768] = "";
        size_t len = 0;
        int rc = 0;
        for (size_t i = 0; !rc && i < sizeof pool_attrs / sizeof pool_attrs[0]; i++) {
            cuuint64_t v64 = 0;
            int v32 = 0;
            rc = CALL(cuMemPoolGetAttribute, p->pool, pool_attrs[i].attr,
                      pool_attrs[i].is_int ? (void *)&v32 : (void *)&v64);
            len += (size_t)snprintf(out + len, sizeof out - len, "%s\"%s\":%" PRIu64, i ? "," : "",
                                    pool_attrs[i].name, pool_attrs[i].is_int ? (uint64_t)v32 : (uint64_t)v64);
        }
        emit(op, rc, "%s", out);
    }
}

/* ---- launches ---- */
static int launch_one(const char *kind, unsigned blocks, CUstream s) {
    unsigned t = threads_per_block;
    if (!strcmp(kind, "launchex")) {
        CUlaunchConfig cfg = {blocks, 1, 1, t, 1, 1, 0, s, NULL, 0};
        return CALL(cuLaunchKernelEx, &cfg, kernel, NULL, NULL);
    }
    if (!strcmp(kind, "coop")) return CALL(cuLaunchCooperativeKernel, kernel, blocks, 1, 1, t, 1, 1, 0, s, NULL);
    return CALL(cuLaunchKernel, kernel, blocks, 1, 1, t, 1, 1, 0, s, NULL, NULL);
}

static void op_launch(const char *op, char **a) {
    unsigned blocks = a[0] ? (unsigned)parse_size(a[0]) : 1;
    long n = a[1] ? atol(a[1]) : 1;
    CUstream s = stream_arg(a[2]);
    int rc = ensure_kernel();
    double t0 = now_ms();
    long done = 0;
    for (; !rc && done < n; done++) rc = launch_one(op, blocks, s);
    if (rc && done) done--;
    emit(op, rc, "\"launches\":%ld,\"ms\":%.3f", rc ? done : n, now_ms() - t0);
}

static void op_graph(char **a) {
    unsigned blocks = a[0] ? (unsigned)parse_size(a[0]) : 1;
    int nodes = a[1] ? atoi(a[1]) : 1;
    long n = a[2] ? atol(a[2]) : 1;
    int rc = ensure_kernel();
    CUgraph g = NULL;
    CUgraphExec ex = NULL;
    if (!rc) rc = CALL(cuGraphCreate, &g, 0);
    CUgraphNode prev = NULL;
    for (int i = 0; !rc && i < nodes; i++) {
        CUDA_KERNEL_NODE_PARAMS_v2 p;
        memset(&p, 0, sizeof p);
        p.func = kernel;
        p.gridDimX = blocks;
        p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = threads_per_block;
        p.blockDimY = p.blockDimZ = 1;
        CUgraphNode node;
        rc = CALL(cuGraphAddKernelNode_v2, &node, g, prev ? &prev : NULL, prev ? 1 : 0, &p);
        prev = node;
    }
    /* cuGraphGetNodes: the count, then a fill with room for two more (NULL-padded) */
    size_t count = 0, filled = 0;
    int padded = 1;
    if (!rc) rc = CALL(cuGraphGetNodes, g, NULL, &count);
    if (!rc) {
        CUgraphNode *all = calloc(count + 2, sizeof *all);
        filled = count + 2;
        rc = all ? CALL(cuGraphGetNodes, g, all, &filled) : CUDA_ERROR_OUT_OF_MEMORY;
        padded = all && !all[count] && !all[count + 1] && (count == 0 || all[count - 1]);
        free(all);
    }
    if (!rc) rc = CALL(cuGraphInstantiateWithFlags, &ex, g, 0);
    double t0 = now_ms();
    for (long i = 0; !rc && i < n; i++) rc = CALL(cuGraphLaunch, ex, NULL);
    double ms = now_ms() - t0;
    if (ex) CALL(cuGraphExecDestroy, ex);
    if (g) CALL(cuGraphDestroy, g);
    emit("graph", rc, "\"launches\":%ld,\"ms\":%.3f,\"nodes\":%zu,\"filled\":%zu,\"padded\":%d", n, ms,
         count, filled, padded);
}

static void op_launchfor(char **a) {
    double ms = a[0] ? atof(a[0]) : 1000;
    unsigned blocks = a[1] ? (unsigned)parse_size(a[1]) : 1;
    long every = a[2] ? atol(a[2]) : 0;
    int rc = ensure_kernel();
    double t0 = now_ms();
    long n = 0;
    while (!rc && now_ms() - t0 < ms) {
        rc = launch_one("launch", blocks, NULL);
        if (!rc) n++;
        if (!rc && every > 0 && n % every == 0) rc = CALL(cuCtxSynchronize);
    }
    if (!rc) rc = CALL(cuCtxSynchronize);
    emit("launchfor", rc, "\"launches\":%ld,\"blocks\":%u,\"ms\":%.3f", n, blocks, now_ms() - t0);
}

/* ---- graph memory ---- */
/* graphalloc D SIZE [FREE] [INST] [PAD]: a graph with one mem alloc node on D (and a free
 * node of it when FREE=1), after PAD kernel nodes, instantiated through INST (flags:
 * cuGraphInstantiateWithFlags, the default; v1: the unversioned cuGraphInstantiate; v2:
 * cuGraphInstantiate_v2; params: cuGraphInstantiateWithParams; up: the same with
 * CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD on the NULL stream); the id frees both ("free ID"). */
static void op_graphalloc(char **a) {
    int dev = dev_arg(a[0]);
    uint64_t size = parse_size(a[1]);
    int with_free = a[2] && atoi(a[2]);
    int rc = ensure(dev);
    CUgraph g = NULL;
    CUgraphExec ex = NULL;
    CUgraphNode an = NULL, fn = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p, back;
    memset(&p, 0, sizeof p);
    memset(&back, 0, sizeof back);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = dev;
    p.bytesize = size;
    size_t nodes = 0;
    CUgraphNodeType types[2] = {99, 99};
    if (!rc) rc = CALL(cuGraphCreate, &g, 0);
    int pad = a[2] && a[3] && a[4] ? atoi(a[4]) : 0;
    if (!rc && pad > 0) rc = ensure_kernel();
    for (int i = 0; !rc && i < pad; i++) {
        CUDA_KERNEL_NODE_PARAMS_v2 kp;
        memset(&kp, 0, sizeof kp);
        kp.func = kernel;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
        CUgraphNode kn;
        rc = CALL(cuGraphAddKernelNode_v2, &kn, g, NULL, 0, &kp);
    }
    if (!rc) rc = CALL(cuGraphAddMemAllocNode, &an, g, NULL, 0, &p);
    if (!rc) rc = CALL(cuGraphMemAllocNodeGetParams, an, &back);
    if (!rc && back.dptr != p.dptr) rc = CUDA_ERROR_UNKNOWN;
    if (!rc && with_free) rc = CALL(cuGraphAddMemFreeNode, &fn, g, &an, 1, p.dptr);
    if (!rc) rc = CALL(cuGraphGetNodes, g, NULL, &nodes);
    if (!rc) rc = CALL(cuGraphNodeGetType, an, &types[0]);
    if (!rc && fn) rc = CALL(cuGraphNodeGetType, fn, &types[1]);
    const char *inst = a[2] && a[3] ? a[3] : "flags";
    if (!rc && !strcmp(inst, "v1")) rc = CALL(cuGraphInstantiate, &ex, g, NULL, NULL, 0);
    else if (!rc && !strcmp(inst, "v2")) rc = CALL(cuGraphInstantiate_v2, &ex, g, NULL, NULL, 0);
    else if (!rc && (!strcmp(inst, "params") || !strcmp(inst, "up"))) {
        CUDA_GRAPH_INSTANTIATE_PARAMS ip;
        memset(&ip, 0, sizeof ip);
        if (!strcmp(inst, "up")) ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
        rc = CALL(cuGraphInstantiateWithParams, &ex, g, &ip);
        if (!rc && ip.result_out != CUDA_GRAPH_INSTANTIATE_SUCCESS) rc = CUDA_ERROR_UNKNOWN;
    } else if (!rc) rc = CALL(cuGraphInstantiateWithFlags, &ex, g, 0);
    int id = -1;
    if (!rc) {
        id = new_id((struct rec){.kind = R_GRAPH, .graph = g, .exec = ex, .ptr = p.dptr, .size = size});
    } else {
        if (ex) CALL(cuGraphExecDestroy, ex);
        if (g) CALL(cuGraphDestroy, g);
    }
    emit("graphalloc", rc, "\"id\":%d,\"ptr\":\"0x%llx\",\"size\":%" PRIu64 ",\"nodes\":%zu,\"types\":[%d,%d]",
         id, (unsigned long long)p.dptr, size, nodes, (int)types[0], fn ? (int)types[1] : -1);
}

/* graphalloc2 D1 SIZE1 D2 SIZE2: one graph with an allocation node on each of two
 * devices (the context is D1's), instantiated; its id works with graphlaunch */
static void op_graphalloc2(char **a) {
    int d1 = dev_arg(a[0]), d2 = a[1] && a[2] ? dev_arg(a[2]) : 0;
    uint64_t s1 = parse_size(a[1]), s2 = a[2] ? parse_size(a[3]) : 0;
    int rc = ensure(d1);
    CUgraph g = NULL;
    CUgraphExec ex = NULL;
    CUgraphNode n1 = NULL, n2 = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p1, p2;
    memset(&p1, 0, sizeof p1);
    p1.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p1.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p1.poolProps.location.id = d1;
    p1.bytesize = s1;
    p2 = p1;
    p2.poolProps.location.id = d2;
    p2.bytesize = s2;
    if (!rc) rc = CALL(cuGraphCreate, &g, 0);
    if (!rc) rc = CALL(cuGraphAddMemAllocNode, &n1, g, NULL, 0, &p1);
    if (!rc) rc = CALL(cuGraphAddMemAllocNode, &n2, g, NULL, 0, &p2);
    if (!rc) rc = CALL(cuGraphInstantiateWithFlags, &ex, g, 0);
    int id = -1;
    if (!rc) {
        id = new_id((struct rec){.kind = R_GRAPH, .graph = g, .exec = ex, .ptr = p1.dptr,
                                 .size = s1});
    } else {
        if (ex) CALL(cuGraphExecDestroy, ex);
        if (g) CALL(cuGraphDestroy, g);
    }
    emit("graphalloc2", rc, "\"id\":%d", id);
}

/* graphupload ID: cuGraphUpload of a graphalloc id's executable on the NULL stream */
static void op_graphupload(char **a) {
    struct rec *r = get_id(a[0]);
    int rc = ensure(cur_dev);
    if (!rc && (!r || r->kind != R_GRAPH)) rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc) rc = CALL(cuGraphUpload, r->exec, NULL);
    emit("graphupload", rc, "");
}

static void op_graphlaunch(char **a) {
    struct rec *r = get_id(a[0]);
    long n = a[1] ? atol(a[1]) : 1;
    int rc = ensure(cur_dev);
    if (!rc && (!r || r->kind != R_GRAPH)) rc = CUDA_ERROR_INVALID_VALUE;
    long done = 0;
    for (; !rc && done < n; done++) rc = CALL(cuGraphLaunch, r->exec, NULL);
    if (rc && done) done--;
    emit("graphlaunch", rc, "\"launches\":%ld", done);
}

/* ---- child graphs ---- */
/* Adds k kernel nodes of blocks blocks (the current kernel and threads) to g, in a chain. */
static int add_kernels(CUgraph g, int k, unsigned blocks) {
    int rc = 0;
    CUgraphNode prev = NULL;
    for (int i = 0; !rc && i < k; i++) {
        CUDA_KERNEL_NODE_PARAMS_v2 p;
        memset(&p, 0, sizeof p);
        p.func = kernel;
        p.gridDimX = blocks;
        p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = threads_per_block;
        p.blockDimY = p.blockDimZ = 1;
        CUgraphNode node;
        rc = CALL(cuGraphAddKernelNode_v2, &node, g, prev ? &prev : NULL, prev ? 1 : 0, &p);
        prev = node;
    }
    return rc;
}

/* The only node of g (*node) and the count of g's nodes. */
static int first_node(CUgraph g, CUgraphNode *node, size_t *count) {
    *node = NULL;
    int rc = CALL(cuGraphGetNodes, g, NULL, count);
    size_t room = 1;
    if (!rc && *count) rc = CALL(cuGraphGetNodes, g, node, &room);
    return rc;
}

/* graphnest D K BLOCKS [NS]: a graph whose only node is a child graph node whose embedded
 * graph's only node is a child graph node ... D levels (D 0: the kernels in the top graph),
 * the innermost graph holding K kernel nodes of BLOCKS blocks (NS: the kernel fake_ns_NS,
 * as "kernel NS" does, for the later ops too); each level's original graph is destroyed once
 * embedded (the node holds a clone).  Walks back down through cuGraphGetNodes,
 * cuGraphNodeGetType and cuGraphChildGraphNodeGetGraph; instantiates the top graph.  The id
 * launches it ("graphlaunch ID [N]", "graphlaunchfor ID MS") and frees it ("free ID"). */
static void op_graphnest(char **a) {
    int depth = a[0] ? atoi(a[0]) : 1;
    int k = a[1] ? atoi(a[1]) : 1;
    unsigned blocks = a[2] ? (unsigned)parse_size(a[2]) : 1;
    if (a[3]) {
        snprintf(kernel_name, sizeof kernel_name, "fake_ns_%llu", (unsigned long long)parse_size(a[3]));
        kernel = NULL;
    }
    int rc = depth < 0 || k < 0 ? CUDA_ERROR_INVALID_VALUE : ensure_kernel();
    CUgraph g = NULL;
    CUgraphExec ex = NULL;
    if (!rc) rc = CALL(cuGraphCreate, &g, 0);
    if (!rc) rc = add_kernels(g, k, blocks);
    for (int level = 0; !rc && level < depth; level++) {
        CUgraph parent = NULL;
        CUgraphNode node;
        rc = CALL(cuGraphCreate, &parent, 0);
        if (!rc) rc = CALL(cuGraphAddChildGraphNode, &node, parent, NULL, 0, g);
        if (!rc) rc = CALL(cuGraphDestroy, g); /* the node has its own clone */
        if (rc) {
            if (parent) CALL(cuGraphDestroy, parent);
        } else {
            g = parent;
        }
    }
    /* back down: every level one child graph node, the innermost K kernel nodes */
    int levels = 0, types_ok = 1;
    size_t inner = 0;
    CUgraph cur = g;
    while (!rc) {
        CUgraphNode node;
        size_t count = 0;
        CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
        rc = first_node(cur, &node, &count);
        if (!rc && count) rc = CALL(cuGraphNodeGetType, node, &t);
        if (rc || count != 1 || t != CU_GRAPH_NODE_TYPE_GRAPH || levels == depth) {
            inner = count;
            break;
        }
        rc = CALL(cuGraphChildGraphNodeGetGraph, node, &cur);
        levels++;
    }
    CUgraphNodeType top = (CUgraphNodeType)-1;
    if (!rc && levels > 0) {
        CUgraphNode node;
        size_t count;
        rc = first_node(g, &node, &count);
        if (!rc) rc = CALL(cuGraphNodeGetType, node, &top);
        types_ok = top == CU_GRAPH_NODE_TYPE_GRAPH;
    }
    if (!rc) rc = CALL(cuGraphInstantiateWithFlags, &ex, g, 0);
    int id = -1;
    if (!rc) {
        id = new_id((struct rec){.kind = R_GRAPH, .graph = g, .exec = ex});
    } else {
        if (ex) CALL(cuGraphExecDestroy, ex);
        if (g) CALL(cuGraphDestroy, g);
    }
    emit("graphnest", rc, "\"id\":%d,\"depth\":%d,\"levels\":%d,\"kernels\":%zu,\"toptype\":%d,\"typesok\":%d",
         id, depth, levels, inner, (int)top, types_ok);
}

/* A graph with one memory alloc node on the current device (no memory is taken). */
static int mem_graph(CUgraph *g) {
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = cur_dev;
    p.bytesize = 1 << 20;
    CUgraphNode node;
    int rc = CALL(cuGraphCreate, g, 0);
    if (!rc) rc = CALL(cuGraphAddMemAllocNode, &node, *g, NULL, 0, &p);
    return rc;
}

/* graphchild BLOCKS [EMB]: a graph P with one child graph node cloned from a graph C of one
 * kernel node of BLOCKS blocks; then one more kernel node is added to C (not P's: the node
 * holds a clone) and EMB to the embedded graph cuGraphChildGraphNodeGetGraph returns (P's).
 * Reports the node counts of C ("orig") and of the embedded graph ("embedded"), the node's
 * type, and the rcs of: cuGraphAddChildGraphNode of a graph with a memory alloc node
 * ("memchild"), cuGraphAddMemAllocNode on the embedded graph ("memembedded"), cuGraphDestroy
 * of the embedded graph ("destroyembedded").  P instantiated: the id launches it
 * ("graphlaunch ID [N]") and frees it ("free ID"). */
static void op_graphchild(char **a) {
    unsigned blocks = a[0] ? (unsigned)parse_size(a[0]) : 1;
    int emb = a[1] ? atoi(a[1]) : 0;
    int rc = ensure_kernel();
    CUgraph c = NULL, p = NULL, e = NULL, m = NULL;
    CUgraphExec ex = NULL;
    CUgraphNode node = NULL, other;
    CUgraphNodeType type = (CUgraphNodeType)-1;
    size_t orig = 0, embedded = 0;
    int memchild = MISSING, memembedded = MISSING, destroyembedded = MISSING;
    if (!rc) rc = CALL(cuGraphCreate, &c, 0);
    if (!rc) rc = add_kernels(c, 1, blocks);
    if (!rc) rc = CALL(cuGraphCreate, &p, 0);
    if (!rc) rc = CALL(cuGraphAddChildGraphNode, &node, p, NULL, 0, c);
    if (!rc) rc = add_kernels(c, 1, blocks);
    if (!rc) rc = CALL(cuGraphChildGraphNodeGetGraph, node, &e);
    if (!rc) rc = add_kernels(e, emb, blocks);
    if (!rc) rc = CALL(cuGraphGetNodes, c, NULL, &orig);
    if (!rc) rc = CALL(cuGraphGetNodes, e, NULL, &embedded);
    if (!rc) rc = CALL(cuGraphNodeGetType, node, &type);
    if (!rc) rc = mem_graph(&m);
    if (!rc) memchild = CALL(cuGraphAddChildGraphNode, &other, p, NULL, 0, m);
    if (!rc) {
        CUDA_MEM_ALLOC_NODE_PARAMS mp;
        memset(&mp, 0, sizeof mp);
        mp.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        mp.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        mp.poolProps.location.id = cur_dev;
        mp.bytesize = 1 << 20;
        memembedded = CALL(cuGraphAddMemAllocNode, &other, e, NULL, 0, &mp);
        destroyembedded = CALL(cuGraphDestroy, e);
    }
    if (!rc) rc = CALL(cuGraphInstantiateWithFlags, &ex, p, 0);
    if (m) CALL(cuGraphDestroy, m);
    if (c) CALL(cuGraphDestroy, c);
    int id = -1;
    if (!rc) {
        id = new_id((struct rec){.kind = R_GRAPH, .graph = p, .exec = ex});
    } else {
        if (ex) CALL(cuGraphExecDestroy, ex);
        if (p) CALL(cuGraphDestroy, p);
    }
    emit("graphchild", rc,
         "\"id\":%d,\"orig\":%zu,\"embedded\":%zu,\"type\":%d,\"memchild\":%d,\"memembedded\":%d,"
         "\"destroyembedded\":%d",
         id, orig, embedded, (int)type, memchild, memembedded, destroyembedded);
}

/* graphlaunchfor ID MS [EVERY]: cuGraphLaunch of a graph id back to back for MS ms
 * (cuCtxSynchronize every EVERY launches, and at the end), as launchfor does for kernels */
static void op_graphlaunchfor(char **a) {
    struct rec *r = get_id(a[0]);
    double ms = a[1] ? atof(a[1]) : 1000;
    long every = a[2] ? atol(a[2]) : 0;
    int rc = ensure(cur_dev);
    if (!rc && (!r || r->kind != R_GRAPH)) rc = CUDA_ERROR_INVALID_VALUE;
    double t0 = now_ms();
    long n = 0;
    while (!rc && now_ms() - t0 < ms) {
        rc = CALL(cuGraphLaunch, r->exec, NULL);
        if (!rc) n++;
        if (!rc && every > 0 && n % every == 0) rc = CALL(cuCtxSynchronize);
    }
    if (!rc) rc = CALL(cuCtxSynchronize);
    emit("graphlaunchfor", rc, "\"launches\":%ld,\"ms\":%.3f", n, now_ms() - t0);
}

static void op_graphmem(char **a) {
    int dev = dev_arg(a[0]);
    cuuint64_t v[4] = {0, 0, 0, 0};
    int rc = ensure(dev);
    for (int i = 0; !rc && i < 4; i++) rc = CALL(cuDeviceGetGraphMemAttribute, dev, (CUgraphMem_attribute)i, &v[i]);
    emit("graphmem", rc,
         "\"used\":%" PRIu64 ",\"usedhigh\":%" PRIu64 ",\"reserved\":%" PRIu64 ",\"reservedhigh\":%" PRIu64,
         (uint64_t)v[0], (uint64_t)v[1], (uint64_t)v[2], (uint64_t)v[3]);
}

/* graphmemreset D: both high watermarks back to the current values */
static void op_graphmemreset(char **a) {
    int dev = dev_arg(a[0]);
    cuuint64_t zero = 0;
    int rc = ensure(dev);
    if (!rc) rc = CALL(cuDeviceSetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero);
    if (!rc) rc = CALL(cuDeviceSetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero);
    emit("graphmemreset", rc, NULL);
}

/* ---- VMM step by step ---- */
/* memrelease ID: cuMemRelease of a vmm id's handle, its mapping kept (or of a handle id) */
static void op_memrelease(char **a) {
    struct rec *r = get_id(a[0]);
    int rc;
    if (r && r->kind == R_VMM && !r->released) {
        rc = CALL(cuMemRelease, r->handle);
        if (!rc) r->released = 1;
    } else if (r && r->kind == R_HANDLE) {
        rc = CALL(cuMemRelease, r->handle);
        if (!rc) r->kind = R_FREE;
    } else {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    emit("memrelease", rc, NULL);
}

/* unmap ID: cuMemUnmap + cuMemAddressFree of a vmm id; the handle stays unless released */
static void op_unmap(char **a) {
    struct rec *r = get_id(a[0]);
    int rc = (r && r->kind == R_VMM) ? CALL(cuMemUnmap, r->ptr, r->size) : CUDA_ERROR_INVALID_VALUE;
    if (!rc) rc = CALL(cuMemAddressFree, r->ptr, r->size);
    if (!rc) {
        r->kind = r->released ? R_FREE : R_HANDLE;
        r->oldptr = r->ptr;
        r->ptr = 0;
        r->released = 0;
    }
    emit("unmap", rc, NULL);
}

/* retain ID [OFFSET] | retain 0xADDR: cuMemRetainAllocationHandle of the address of a vmm
 * id (+ OFFSET; an unmapped id: the address it had, or NULL) or of an address; a new handle
 * id ("memrelease" it); same: the handle is the id's own */
static void op_retain(char **a) {
    struct rec *r = NULL;
    uint64_t addr = 0;
    if (a[0] && !strncmp(a[0], "0x", 2)) {
        addr = strtoull(a[0], NULL, 16);
    } else {
        r = get_id(a[0]);
        if (r) addr = (r->kind == R_VMM ? r->ptr : r->oldptr);
        if (r && addr && a[1]) addr += parse_size(a[1]);
    }
    if (!inited && CALL(cuInit, 0) == 0) inited = 1;
    CUmemGenericAllocationHandle h = 0;
    int rc = CALL(cuMemRetainAllocationHandle, &h, (void *)(uintptr_t)addr);
    int id = -1;
    if (!rc) id = new_id((struct rec){.kind = R_HANDLE, .size = r ? r->size : 0, .handle = h});
    emit("retain", rc, "\"id\":%d,\"handle\":\"0x%llx\",\"same\":%d", id, (unsigned long long)h,
         r && !rc && r->handle == h);
}

/* export ID: cuMemExportToShareableHandle (POSIX fd) of a vmm / handle id's handle */
static void op_export(char **a) {
    struct rec *r = get_id(a[0]);
    int fd = -1, rc;
    if (r && (r->kind == R_VMM || r->kind == R_HANDLE))
        rc = CALL(cuMemExportToShareableHandle, &fd, r->handle,
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    emit("export", rc, "\"fd\":%d", rc ? -1 : fd);
}

/* import FD | import PATH: cuMemImportFromShareableHandle of an fd of this process, or of
 * a file opened (and closed after) for it, e.g. /proc/PID/fd/N of another process; a new
 * handle id */
static void op_import(char **a) {
    const char *s = a[0] ? a[0] : "-1";
    int fd, opened = 0;
    if (s[0] == '/') {
        fd = open(s, O_RDONLY | O_CLOEXEC);
        opened = fd >= 0;
    } else {
        fd = atoi(s);
    }
    if (!inited && CALL(cuInit, 0) == 0) inited = 1;
    CUmemGenericAllocationHandle h = 0;
    int rc = CALL(cuMemImportFromShareableHandle, &h, (void *)(intptr_t)fd,
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (opened) close(fd);
    int id = -1;
    if (!rc) id = new_id((struct rec){.kind = R_HANDLE, .handle = h});
    emit("import", rc, "\"id\":%d,\"handle\":\"0x%llx\"", id, (unsigned long long)h);
}

/* ipcget ID: cuIpcGetMemHandle of an alloc id's address (or of 0xADDR); the 64 bytes as
 * 128 hex digits */
static void op_ipcget(char **a) {
    int rc = ensure(cur_dev);
    uint64_t p = 0;
    if (a[0] && !strncmp(a[0], "0x", 2)) {
        p = strtoull(a[0], NULL, 16);
    } else {
        struct rec *r = get_id(a[0]);
        p = r ? r->ptr : 0;
    }
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    if (!rc) rc = CALL(cuIpcGetMemHandle, &h, p);
    char hex[2 * CU_IPC_HANDLE_SIZE + 1];
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
    emit("ipcget", rc, "\"handle\":\"%s\"", rc ? "" : hex);
}

/* ipcopen HEX [FLAGS [v1]]: cuIpcOpenMemHandle_v2 (v1: the legacy name) of a handle given
 * as hex digits (missing ones are 0); a new ipc id ("ipcclose" or "free" it) */
static void op_ipcopen(char **a) {
    int rc = ensure(cur_dev);
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    const char *s = a[0] ? a[0] : "";
    for (int i = 0; i < CU_IPC_HANDLE_SIZE && s[2 * i] && s[2 * i + 1]; i++) {
        char b[3] = {s[2 * i], s[2 * i + 1], 0};
        h.reserved[i] = (char)strtoul(b, NULL, 16);
    }
    unsigned flags = a[0] && a[1] ? (unsigned)strtoul(a[1], NULL, 0) : CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
    int v1 = a[0] && a[1] && a[2] && !strcmp(a[2], "v1");
    CUdeviceptr p = 0;
    if (!rc) rc = v1 ? CALL(cuIpcOpenMemHandle, &p, h, flags) : CALL(cuIpcOpenMemHandle_v2, &p, h, flags);
    int id = -1;
    if (!rc) id = new_id((struct rec){.kind = R_IPC, .ptr = p});
    emit("ipcopen", rc, "\"id\":%d,\"ptr\":\"0x%llx\"", id, (unsigned long long)p);
}

/* ipcclose ID | ipcclose 0xADDR: cuIpcCloseMemHandle (an id is forgotten at its last close:
 * one "ipcclose" per "ipcopen" that returned the same address, each with its own id) */
static void op_ipcclose(char **a) {
    int rc = ensure(cur_dev);
    struct rec *r = NULL;
    uint64_t p = 0;
    if (a[0] && !strncmp(a[0], "0x", 2)) {
        p = strtoull(a[0], NULL, 16);
    } else {
        r = get_id(a[0]);
        p = r ? r->ptr : 0;
    }
    if (!rc) rc = CALL(cuIpcCloseMemHandle, p);
    if (!rc && r) r->kind = R_FREE;
    emit("ipcclose", rc, NULL);
}

/* map ID SIZE [D]: AddressReserve + Map + SetAccess (device D) of a handle id (memcreate,
 * retain, import); it becomes a vmm id */
static void op_map(char **a) {
    struct rec *r = get_id(a[0]);
    uint64_t size = a[0] ? parse_size(a[1]) : 0;
    int dev = a[0] && a[1] ? dev_arg(a[2]) : cur_dev;
    CUdeviceptr va = 0;
    int rc = (r && r->kind == R_HANDLE) ? CALL(cuMemAddressReserve, &va, size, 0, 0, 0)
                                        : CUDA_ERROR_INVALID_VALUE;
    if (!rc) {
        rc = CALL(cuMemMap, va, size, 0, r->handle, 0);
        if (rc) CALL(cuMemAddressFree, va, size);
    }
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, {dev}}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (!rc) rc = CALL(cuMemSetAccess, va, size, &acc, 1);
    if (!rc) {
        r->kind = R_VMM;
        r->ptr = va;
        r->size = size;
        r->released = 0;
    }
    emit("map", rc, "\"id\":%d,\"ptr\":\"0x%llx\"", rc ? -1 : (int)(r - recs),
         (unsigned long long)va);
}

/* ---- memory the driver takes outside allocations: modules, limits ---- */
/* module D [HOW]: a module loaded into D's primary context (current) by HOW: data
 * (cuModuleLoadData, the default), dataex (cuModuleLoadDataEx, no options), fatbin
 * (cuModuleLoadFatBinary), file (cuModuleLoad of /proc/self/exe), library
 * (cuLibraryLoadData: loaded into the current context at once) or libfile
 * (cuLibraryLoadFromFile); "unmodule ID" / "free ID" unload it (a library: cuLibraryUnload). */
static void op_module(char **a) {
    int dev = dev_arg(a[0]);
    const char *how = a[1] ? a[1] : "data";
    const char *image = module_image();
    CUmodule m = NULL;
    CUlibrary lib = NULL;
    int rc = ensure(dev);
    if (rc) {
    } else if (!strcmp(how, "data")) {
        rc = CALL(cuModuleLoadData, &m, image);
    } else if (!strcmp(how, "dataex")) {
        rc = CALL(cuModuleLoadDataEx, &m, image, 0, NULL, NULL);
    } else if (!strcmp(how, "fatbin")) {
        rc = CALL(cuModuleLoadFatBinary, &m, image);
    } else if (!strcmp(how, "file")) {
        rc = CALL(cuModuleLoad, &m, "/proc/self/exe");
    } else if (!strcmp(how, "library")) {
        rc = CALL(cuLibraryLoadData, &lib, image, NULL, NULL, 0, NULL, NULL, 0);
    } else if (!strcmp(how, "libfile")) {
        rc = CALL(cuLibraryLoadFromFile, &lib, "/proc/self/exe", NULL, NULL, 0, NULL, NULL, 0);
    } else {
        emit("module", CUDA_ERROR_INVALID_VALUE, "\"error\":\"unknown HOW\"");
        return;
    }
    int id = -1;
    if (!rc)
        id = new_id(lib ? (struct rec){.kind = R_LIBRARY, .library = lib}
                        : (struct rec){.kind = R_MODULE, .module = m});
    emit("module", rc, "\"id\":%d,\"dev\":%d,\"how\":\"%s\",\"handle\":\"%p\"", id, dev, how,
         lib ? (void *)lib : (void *)m);
}

/* libmodule ID: cuLibraryGetModule of a library id in the current context (loading it
 * there if it is not yet); libfunc ID [NAME]: cuLibraryGetKernel + cuKernelGetFunction. */
static void op_libmodule(const char *op, char **a) {
    struct rec *r = get_id(a[0]);
    int rc = ensure(cur_dev);
    CUmodule m = NULL;
    CUkernel k = NULL;
    CUfunction f = NULL;
    if (!rc && (!r || r->kind != R_LIBRARY)) rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc && !strcmp(op, "libmodule")) {
        rc = CALL(cuLibraryGetModule, &m, r->library);
    } else if (!rc) {
        rc = CALL(cuLibraryGetKernel, &k, r->library, a[1] ? a[1] : "fake_kernel");
        if (!rc) rc = CALL(cuKernelGetFunction, &f, k);
    }
    emit(op, rc, "\"id\":%d,\"handle\":\"%p\"", a[0] ? atoi(a[0]) : -1,
         !strcmp(op, "libmodule") ? (void *)m : (void *)f);
}

static const struct {
    const char *name;
    CUlimit limit;
} limit_names[] = {
    {"stack", CU_LIMIT_STACK_SIZE},
    {"fifo", CU_LIMIT_PRINTF_FIFO_SIZE},
    {"heap", CU_LIMIT_MALLOC_HEAP_SIZE},
};

/* setlimit KIND BYTES / getlimit KIND: cuCtxSetLimit / cuCtxGetLimit in the current
 * context; KIND stack, fifo, heap (or the CUlimit number) */
static void op_limit(const char *op, char **a) {
    int rc = ensure(cur_dev);
    const char *kind = a[0] ? a[0] : "";
    CUlimit limit = (CUlimit)(a[0] ? atoi(a[0]) : -1);
    for (size_t i = 0; i < sizeof limit_names / sizeof limit_names[0]; i++)
        if (!strcmp(kind, limit_names[i].name)) limit = limit_names[i].limit;
    size_t v = !strcmp(op, "setlimit") ? (size_t)parse_size(a[1]) : 0;
    if (!rc) rc = !strcmp(op, "setlimit") ? CALL(cuCtxSetLimit, limit, v) : CALL(cuCtxGetLimit, &v, limit);
    emit(op, rc, "\"kind\":\"%s\",\"value\":%zu", kind, v);
}

/* nvml [D]: NVML's view of device D (an NVML index; default: the current CUDA ordinal)
 * through libnvidia-ml.so.1: nvmlDeviceGetMemoryInfo and every compute process
 * (nvmlDeviceGetComputeRunningProcesses_v3) with its usedGpuMemory; self is this process's
 * row (pid getpid() or the fake's host pid), -1 when it has none.  rc is the NVML code (-1:
 * no library). */
struct nvml_mem { unsigned long long total, free, used; };
struct nvml_proc { unsigned pid; unsigned long long used; unsigned gi, ci; };

static void op_nvml(char **a) {
    unsigned dev = (unsigned)dev_arg(a[0]);
    static void *lib;
    if (!lib) lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    int (*init)(void) = lib ? (int (*)(void))dlsym(lib, "nvmlInit_v2") : NULL;
    int (*handle)(unsigned, void **) = lib ? (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*mem)(void *, struct nvml_mem *) = lib ? (int (*)(void *, struct nvml_mem *))dlsym(lib, "nvmlDeviceGetMemoryInfo") : NULL;
    int (*procs)(void *, unsigned *, struct nvml_proc *) =
        lib ? (int (*)(void *, unsigned *, struct nvml_proc *))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3") : NULL;
    if (!init || !handle || !mem || !procs) {
        emit("nvml", MISSING, "\"error\":\"no NVML\"");
        return;
    }
    void *h = NULL;
    struct nvml_mem m = {0, 0, 0};
    struct nvml_proc p[64];
    unsigned n = 64;
    int rc = init();
    if (!rc) rc = handle(dev, &h);
    if (!rc) rc = mem(h, &m);
    if (!rc) rc = procs(h, &n, p);
    if (rc) n = 0;
    void *hp = dlsym(RTLD_DEFAULT, "fake_host_pid");
    unsigned me = (unsigned)getpid(), host = hp ? (unsigned)((int (*)(void))hp)() : me;
    long long self = -1;
    char rows[2048] = "";
    size_t len = 0;
    for (unsigned i = 0; i < n && len < sizeof rows - 64; i++) {
        len += (size_t)snprintf(rows + len, sizeof rows - len, "%s[%u,%llu]", i ? "," : "", p[i].pid, p[i].used);
        if (p[i].pid == me || p[i].pid == host) self = (long long)p[i].used;
    }
    emit("nvml", rc, "\"dev\":%u,\"total\":%llu,\"used\":%llu,\"free\":%llu,\"procs\":[%s],\"self\":%lld",
         dev, m.total, m.used, m.free, rows, self);
}

/* ---- devices ---- */
static int ensure_init(void) {
    if (inited) return 0;
    int rc = CALL(cuInit, 0);
    inited = !rc;
    return rc;
}

/* uuid D [legacy]: cuDeviceGetUuid_v2 (legacy: cuDeviceGetUuid) as a GPU-... string */
static void op_uuid(char **a) {
    int dev = dev_arg(a[0]);
    int legacy = a[1] && !strcmp(a[1], "legacy");
    CUuuid u;
    char s[64] = "";
    memset(&u, 0, sizeof u);
    int rc = ensure_init();
    if (!rc) rc = legacy ? CALL(cuDeviceGetUuid, &u, dev) : CALL(cuDeviceGetUuid_v2, &u, dev);
    if (!rc) uuid_string(&u, s, sizeof s);
    emit("uuid", rc, "\"dev\":%d,\"uuid\":\"%s\"", dev, s);
}

/* visible: cuDeviceGetCount and the UUID of every ordinal */
static void op_visible(void) {
    int count = 0;
    char out[2048] = "";
    size_t len = 0;
    int rc = ensure_init();
    if (!rc) rc = CALL(cuDeviceGetCount, &count);
    for (int d = 0; !rc && d < count; d++) {
        CUdevice dev = -1;
        CUuuid u;
        char s[64];
        rc = CALL(cuDeviceGet, &dev, d);
        if (!rc) rc = CALL(cuDeviceGetUuid_v2, &u, dev);
        if (rc) break;
        uuid_string(&u, s, sizeof s);
        len += (size_t)snprintf(out + len, sizeof out - len, "%s\"%s\"", d ? "," : "", s);
    }
    emit("visible", rc, "\"count\":%d,\"uuids\":[%s]", count, out);
}

/* ---- NULL-argument probes: the call must fail cleanly, never crash ---- */
static void op_null(const char *what) {
    int rc;
    if (!strcmp(what, "info")) {
        ensure(cur_dev);
        rc = CALL(cuMemGetInfo_v2, NULL, NULL);
    } else if (!strcmp(what, "infofree")) {
        size_t t;
        ensure(cur_dev);
        rc = CALL(cuMemGetInfo_v2, NULL, &t);
    } else if (!strcmp(what, "alloc")) {
        ensure(cur_dev);
        rc = CALL(cuMemAlloc_v2, NULL, 1024);
    } else if (!strcmp(what, "pitch")) {
        CUdeviceptr p;
        ensure(cur_dev);
        rc = CALL(cuMemAllocPitch_v2, &p, NULL, 1024, 4, 4);
    } else if (!strcmp(what, "count")) {
        rc = CALL(cuDeviceGetCount, NULL);
    } else if (!strcmp(what, "totalmem")) {
        rc = CALL(cuDeviceTotalMem_v2, NULL, cur_dev);
    } else if (!strcmp(what, "name")) {
        rc = CALL(cuDeviceGetName, NULL, 64, cur_dev);
    } else if (!strcmp(what, "uuid")) {
        rc = CALL(cuDeviceGetUuid_v2, NULL, cur_dev);
    } else if (!strcmp(what, "ctxget")) {
        rc = CALL(cuCtxGetCurrent, NULL);
    } else if (!strcmp(what, "getdev")) {
        rc = CALL(cuCtxGetDevice, NULL);
    } else if (!strcmp(what, "proc")) {
        rc = CALL(cuGetProcAddress_v2, "cuMemAlloc", NULL, 12000, 0, NULL);
    } else if (!strcmp(what, "memcreate")) {
        CUmemGenericAllocationHandle h;
        rc = CALL(cuMemCreate, &h, 2 << 20, NULL, 0);
    } else if (!strcmp(what, "array")) {
        CUarray arr;
        ensure(cur_dev);
        rc = CALL(cuArrayCreate_v2, &arr, NULL);
    } else if (!strcmp(what, "launchex")) {
        rc = ensure_kernel();
        if (!rc) rc = CALL(cuLaunchKernelEx, NULL, kernel, NULL, NULL);
    } else if (!strcmp(what, "graphnodes") || !strcmp(what, "allocnode") ||
               !strcmp(what, "nodetype") || !strcmp(what, "allocparams")) {
        CUgraph g = NULL;
        CUgraphNode node = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = cur_dev;
        p.bytesize = 1 << 20;
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuGraphCreate, &g, 0);
        if (!rc && strcmp(what, "allocnode")) rc = CALL(cuGraphAddMemAllocNode, &node, g, NULL, 0, &p);
        if (!rc) {
            if (!strcmp(what, "graphnodes")) rc = CALL(cuGraphGetNodes, g, NULL, NULL);
            else if (!strcmp(what, "allocnode")) rc = CALL(cuGraphAddMemAllocNode, &node, g, NULL, 0, NULL);
            else if (!strcmp(what, "nodetype")) rc = CALL(cuGraphNodeGetType, node, NULL);
            else rc = CALL(cuGraphMemAllocNodeGetParams, node, NULL);
        }
        if (g) CALL(cuGraphDestroy, g);
    } else if (!strcmp(what, "graphmemattr")) {
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuDeviceGetGraphMemAttribute, cur_dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, NULL);
    } else if (!strcmp(what, "poolattr")) {
        CUmemoryPool pool = NULL;
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuDeviceGetDefaultMemPool, &pool, cur_dev);
        if (!rc) rc = CALL(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL);
    } else if (!strcmp(what, "defpool")) {
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuDeviceGetDefaultMemPool, NULL, cur_dev);
    } else {
        emit("null", CUDA_ERROR_INVALID_VALUE, "\"error\":\"unknown probe\"");
        return;
    }
    emit("null", rc, "\"what\":\"%s\"", what);
}

static void op_proc(char **a) {
    if (!a[0]) {
        emit("proc", CUDA_ERROR_INVALID_VALUE, "\"error\":\"usage: proc NAME VERSION [ptds]\"");
        return;
    }
    int ver = a[1] ? atoi(a[1]) : 12080;
    cuuint64_t flags = (a[2] && !strcmp(a[2], "ptds")) ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                       : (a[2] && !strcmp(a[2], "legacy")) ? CU_GET_PROC_ADDRESS_LEGACY_STREAM
                                                            : 0;
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 99;
    int rc = CALL(cuGetProcAddress_v2, a[0], &fn, ver, flags, &st);
    Dl_info info;
    const char *sym = (fn && dladdr(fn, &info) && info.dli_sname) ? info.dli_sname : "";
    const char *lib = (fn && dladdr(fn, &info) && info.dli_fname) ? info.dli_fname : "";
    emit("proc", rc, "\"name\":\"%s\",\"version\":%d,\"status\":%d,\"sym\":\"%s\",\"lib\":\"%s\",\"ptr\":\"%p\"",
         a[0], ver, (int)st, sym, lib, fn);
}

static void op_dev(char **a) {
    int dev = dev_arg(a[0]);
    char name[128] = "", uuid[64] = "";
    CUuuid u;
    size_t total = 0;
    int sms = 0;
    int rc = CALL(cuDeviceGetName, name, sizeof name, dev);
    if (!rc) rc = CALL(cuDeviceGetUuid_v2, &u, dev);
    if (!rc) uuid_string(&u, uuid, sizeof uuid);
    if (!rc) rc = CALL(cuDeviceTotalMem_v2, &total, dev);
    if (!rc) rc = CALL(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    emit("dev", rc, "\"dev\":%d,\"name\":\"%s\",\"uuid\":\"%s\",\"total\":%zu,\"sms\":%d", dev, name,
         uuid, total, sms);
}

static void op_ctx(const char *op, char **a) {
    int dev = dev_arg(a[0]);
    int rc = 0;
    if (!inited) {
        rc = CALL(cuInit, 0);
        inited = !rc;
    }
    CUcontext c = NULL;
    if (!rc && !strcmp(op, "ctx4")) rc = CALL(cuCtxCreate_v4, &c, NULL, 0, dev);
    else if (!rc && !strcmp(op, "ctx1")) rc = CALL(cuCtxCreate, &c, 0, dev); /* pre-3.2 */
    else if (!rc) rc = CALL(cuCtxCreate_v2, &c, 0, dev);
    int id = rc ? -1 : new_id((struct rec){.kind = R_CTX, .ctx = c});
    emit(op, rc, "\"id\":%d,\"ctx\":\"%p\"", id, (void *)c);
}

/* green D SMS: a green context on D with a group of SMS SMs (cuDeviceGetDevResource,
 * cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtxCreate); its id works
 * with greenuse (cuCtxFromGreenCtx + cuCtxSetCurrent) and free (cuGreenCtxDestroy) */
static void op_green(char **a) {
    int dev = dev_arg(a[0]);
    unsigned want = a[1] ? (unsigned)strtoul(a[1], NULL, 0) : 2;
    int rc = 0;
    if (!inited) {
        rc = CALL(cuInit, 0);
        inited = !rc;
    }
    CUdevResource all, group, rest;
    unsigned n = 1;
    CUdevResourceDesc desc = NULL;
    CUgreenCtx g = NULL;
    CUcontext c = NULL;
    if (!rc) rc = CALL(cuDeviceGetDevResource, dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (!rc) rc = CALL(cuDevSmResourceSplitByCount, &group, &n, &all, &rest, 0, want);
    if (!rc) rc = CALL(cuDevResourceGenerateDesc, &desc, &group, 1);
    if (!rc) rc = CALL(cuGreenCtxCreate, &g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (!rc) rc = CALL(cuCtxFromGreenCtx, &c, g);
    int id = rc ? -1 : new_id((struct rec){.kind = R_GREEN, .ctx = c, .green = g});
    emit("green", rc, "\"id\":%d,\"sms\":%u", id, rc ? 0 : group.sm.smCount);
}

static void op_sync(const char *op, char **a) {
    int rc = ensure(cur_dev);
    double t0 = now_ms();
    if (!rc && !strcmp(op, "sync")) {
        rc = CALL(cuCtxSynchronize);
    } else if (!rc && !strcmp(op, "sync2")) { /* CUDA 13: the context named */
        CUcontext c = NULL;
        rc = CALL(cuCtxGetCurrent, &c);
        if (!rc) rc = CALL(cuCtxSynchronize_v2, c);
    } else if (!rc && !strcmp(op, "streamsync")) {
        struct rec *r = get_id(a[0]);
        rc = (r && r->kind == R_STREAM) ? CALL(cuStreamSynchronize, r->stream) : CUDA_ERROR_INVALID_HANDLE;
    } else if (!rc) { /* eventsync [STREAMID] */
        CUevent e = NULL;
        rc = CALL(cuEventCreate, &e, 0);
        if (!rc) rc = CALL(cuEventRecord, e, stream_arg(a[0]));
        if (!rc) rc = CALL(cuEventSynchronize, e);
        if (e) CALL(cuEventDestroy_v2, e);
    }
    emit(op, rc, "\"ms\":%.3f", now_ms() - t0);
}

/* The fake driver's test-only exports (absent from a real driver: rc -1). */
static void op_fake(const char *op, char **a) {
    void *f = dlsym(RTLD_DEFAULT, op);
    if (!f) {
        emit(op, MISSING, "\"error\":\"not exported\"");
        return;
    }
    unsigned long long v;
    if (!strcmp(op, "fake_now_ns") || !strcmp(op, "fake_state_lock") ||
        !strcmp(op, "fake_state_unlock")) {
        v = ((unsigned long long (*)(void))f)();
    } else if (!strcmp(op, "fake_busy_ns")) {
        v = ((unsigned long long (*)(int, int, unsigned long long, unsigned long long))f)(
            a[0] ? atoi(a[0]) : 0, a[1] ? atoi(a[1]) : -1, a[2] ? strtoull(a[2], NULL, 0) : 0,
            a[3] ? strtoull(a[3], NULL, 0) : ~0ull);
    } else if (!strcmp(op, "fake_device_used_bytes") || !strcmp(op, "fake_timeline_oldest_ns")) {
        v = ((unsigned long long (*)(int))f)(a[0] ? atoi(a[0]) : 0);
    } else if (!strcmp(op, "fake_managed_bytes")) {
        v = ((unsigned long long (*)(int))f)(a[0] ? atoi(a[0]) : (int)getpid());
    } else if (!strcmp(op, "fake_host_pid")) {
        v = (unsigned long long)((int (*)(void))f)();
    } else {
        emit(op, MISSING, "\"error\":\"unknown fake op\"");
        return;
    }
    emit(op, 0, "\"value\":%llu", v);
}

static void run_line(char *line) {
    char *argv[16] = {0};
    int n = 0;
    for (char *tok = strtok(line, " \t\r\n"); tok && n < 15; tok = strtok(NULL, " \t\r\n")) argv[n++] = tok;
    if (n == 0 || argv[0][0] == '#') return;
    const char *op = argv[0];
    char **a = &argv[1];
    int rc;
    if (!strcmp(op, "init")) {
        rc = CALL(cuInit, a[0] ? (unsigned)atoi(a[0]) : 0);
        if (!rc) inited = 1;
        emit(op, rc, "\"how\":\"%s\"", HOW);
    } else if (!strcmp(op, "version")) {
        int v = 0;
        rc = CALL(cuDriverGetVersion, &v);
        emit(op, rc, "\"version\":%d", v);
    } else if (!strcmp(op, "count")) {
        int c = 0;
        rc = CALL(cuDeviceGetCount, &c);
        emit(op, rc, "\"count\":%d", c);
    } else if (!strcmp(op, "dev")) {
        op_dev(a);
    } else if (!strcmp(op, "totalmem")) {
        size_t t = 0;
        rc = CALL(cuDeviceTotalMem_v2, &t, dev_arg(a[0]));
        emit(op, rc, "\"total\":%zu", t);
    } else if (!strcmp(op, "attr")) {
        int v = 0;
        rc = CALL(cuDeviceGetAttribute, &v, (CUdevice_attribute)(a[1] ? atoi(a[1]) : 16), dev_arg(a[0]));
        emit(op, rc, "\"value\":%d", v);
    } else if (!strcmp(op, "use")) {
        cur_dev = dev_arg(a[0]);
        rc = ensure(cur_dev);
        emit(op, rc, "\"dev\":%d,\"ctx\":\"%p\"", cur_dev, (void *)prim[cur_dev & 63]);
    } else if (!strcmp(op, "ctx") || !strcmp(op, "ctx4") || !strcmp(op, "ctx1")) {
        op_ctx(op, a);
    } else if (!strcmp(op, "green")) {
        op_green(a);
    } else if (!strcmp(op, "greenuse")) {
        struct rec *r = get_id(a[0]);
        rc = (r && r->kind == R_GREEN) ? CALL(cuCtxSetCurrent, r->ctx) : CUDA_ERROR_INVALID_VALUE;
        emit(op, rc, NULL);
    } else if (!strcmp(op, "current")) {
        CUcontext c = NULL;
        rc = CALL(cuCtxGetCurrent, &c);
        emit(op, rc, "\"ctx\":\"%p\"", (void *)c);
    } else if (!strcmp(op, "getdev")) {
        CUdevice d = -1;
        rc = CALL(cuCtxGetDevice, &d);
        emit(op, rc, "\"dev\":%d", d);
    } else if (!strcmp(op, "push")) {
        struct rec *r = get_id(a[0]);
        rc = (r && r->kind == R_CTX) ? CALL(cuCtxPushCurrent_v2, r->ctx) : CUDA_ERROR_INVALID_VALUE;
        emit(op, rc, NULL);
    } else if (!strcmp(op, "pop")) {
        CUcontext c = NULL;
        rc = CALL(cuCtxPopCurrent_v2, &c);
        emit(op, rc, "\"ctx\":\"%p\"", (void *)c);
    } else if (!strcmp(op, "release")) {
        int d = dev_arg(a[0]);
        rc = CALL(cuDevicePrimaryCtxRelease_v2, d);
        if (!rc && d >= 0 && d < 64) forget_module_of(prim[d]), prim[d] = NULL;
        emit(op, rc, NULL);
    } else if (!strcmp(op, "reset")) {
        int d = dev_arg(a[0]);
        rc = CALL(cuDevicePrimaryCtxReset_v2, d);
        if (!rc && d >= 0 && d < 64) forget_module_of(prim[d]), prim[d] = NULL;
        emit(op, rc, NULL);
    } else if (!strcmp(op, "info")) {
        size_t f = 0, t = 0;
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuMemGetInfo_v2, &f, &t);
        emit(op, rc, "\"free\":%zu,\"total\":%zu", f, t);
    } else if (!strcmp(op, "nullinfo")) {
        op_null("info");
    } else if (!strcmp(op, "null")) {
        op_null(a[0] ? a[0] : "");
    } else if (!strcmp(op, "gfxalloc")) { /* gfxalloc D SIZE: memory no CUDA call takes */
        int (*gfx)(int, unsigned long long) =
            (int (*)(int, unsigned long long))dlsym(RTLD_DEFAULT, "fake_graphics_alloc");
        uint64_t size = parse_size(a[1]);
        if (!gfx) emit(op, MISSING, "\"error\":\"not the fake driver\"");
        else emit(op, gfx(dev_arg(a[0]), size) ? 2 : 0, "\"size\":%" PRIu64, size);
    } else if (!strcmp(op, "alloc") || !strcmp(op, "alloc32") || !strcmp(op, "managed") ||
               !strcmp(op, "host") || !strcmp(op, "hostalloc") || !strcmp(op, "async") ||
               !strcmp(op, "defpoolalloc")) {
        op_alloc(op, a);
    } else if (!strcmp(op, "pitch")) {
        op_pitch(a);
    } else if (!strcmp(op, "racefree")) {
        op_racefree(a);
    } else if (!strcmp(op, "pitch1")) {
        op_pitch1(a);
    } else if (!strcmp(op, "array") || !strcmp(op, "array3d") || !strcmp(op, "mipmap") ||
               !strcmp(op, "array1") || !strcmp(op, "array3d1")) {
        op_array(op, a);
    } else if (!strcmp(op, "vmm") || !strcmp(op, "memcreate") || !strcmp(op, "memcreatehost")) {
        op_vmm(op, a);
    } else if (!strcmp(op, "gran")) {
        size_t g = 0;
        if (!inited && CALL(cuInit, 0) == 0) inited = 1;
        CUmemAllocationProp p = prop_for(dev_arg(a[0]), 0);
        rc = CALL(cuMemGetAllocationGranularity, &g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        emit(op, rc, "\"granularity\":%zu", g);
    } else if (!strcmp(op, "poolimport")) { /* poolimport PATH|FD|PID:FD: a pool id */
        const char *path = a[0] ? a[0] : "-1";
        int opened = path[0] == '/' || strchr(path, ':'); /* else this process's fd */
        int fd = opened ? open_shared(path) : atoi(path);
        CUmemoryPool pool = NULL;
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuMemPoolImportFromShareableHandle, &pool, (void *)(intptr_t)fd,
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (opened && fd >= 0) close(fd);
        int id = rc ? -1 : new_id((struct rec){.kind = R_POOL, .pool = pool});
        emit(op, rc, "\"id\":%d", id);
    } else if (!strcmp(op, "ptrexport")) { /* ptrexport 0xADDR: 128 hex digits */
        CUmemPoolPtrExportData d;
        memset(&d, 0, sizeof d);
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuMemPoolExportPointer, &d, a[0] ? strtoull(a[0], NULL, 0) : 0);
        char hex[2 * sizeof d.reserved + 1];
        for (size_t i = 0; i < sizeof d.reserved; i++)
            snprintf(hex + 2 * i, 3, "%02x", d.reserved[i]);
        emit(op, rc, "\"data\":\"%s\"", rc ? "" : hex);
    } else if (!strcmp(op, "pool") || !strcmp(op, "poolalloc") || !strcmp(op, "trim") ||
               !strcmp(op, "poolexport") || !strcmp(op, "ptrimport") ||
               !strcmp(op, "poolattr") || !strcmp(op, "poolsetattr") || !strcmp(op, "defpool") ||
               !strcmp(op, "curpool") || !strcmp(op, "setpool")) {
        op_pool(op, a);
    } else if (!strcmp(op, "memrelease")) {
        op_memrelease(a);
    } else if (!strcmp(op, "unmap")) {
        op_unmap(a);
    } else if (!strcmp(op, "retain")) {
        op_retain(a);
    } else if (!strcmp(op, "export")) {
        op_export(a);
    } else if (!strcmp(op, "import")) {
        op_import(a);
    } else if (!strcmp(op, "map")) {
        op_map(a);
    } else if (!strcmp(op, "ipcget")) {
        op_ipcget(a);
    } else if (!strcmp(op, "ipcopen")) {
        op_ipcopen(a);
    } else if (!strcmp(op, "ipcclose")) {
        op_ipcclose(a);
    } else if (!strcmp(op, "closefd")) {
        rc = a[0] ? close(atoi(a[0])) : -1;
        emit(op, rc ? CUDA_ERROR_INVALID_VALUE : 0, NULL);
    } else if (!strcmp(op, "graphalloc")) {
        op_graphalloc(a);
    } else if (!strcmp(op, "graphalloc2")) {
        op_graphalloc2(a);
    } else if (!strcmp(op, "graphupload")) {
        op_graphupload(a);
    } else if (!strcmp(op, "graphlaunch")) {
        op_graphlaunch(a);
    } else if (!strcmp(op, "graphnest")) {
        op_graphnest(a);
    } else if (!strcmp(op, "graphchild")) {
        op_graphchild(a);
    } else if (!strcmp(op, "graphlaunchfor")) {
        op_graphlaunchfor(a);
    } else if (!strcmp(op, "graphmem")) {
        op_graphmem(a);
    } else if (!strcmp(op, "graphmemreset")) {
        op_graphmemreset(a);
    } else if (!strcmp(op, "graphtrim")) {
        int dev = dev_arg(a[0]);
        rc = ensure(dev);
        if (!rc) rc = CALL(cuDeviceGraphMemTrim, dev);
        emit(op, rc, NULL);
    } else if (!strcmp(op, "module")) {
        op_module(a);
    } else if (!strcmp(op, "unmodule")) {
        struct rec *r = get_id(a[0]);
        rc = (r && (r->kind == R_MODULE || r->kind == R_LIBRARY)) ? free_rec(r) : CUDA_ERROR_INVALID_VALUE;
        emit(op, rc, "\"id\":%d", a[0] ? atoi(a[0]) : -1);
    } else if (!strcmp(op, "libmodule") || !strcmp(op, "libfunc")) {
        op_libmodule(op, a);
    } else if (!strcmp(op, "setlimit") || !strcmp(op, "getlimit")) {
        op_limit(op, a);
    } else if (!strcmp(op, "nvml")) {
        op_nvml(a);
    } else if (!strcmp(op, "uuid")) {
        op_uuid(a);
    } else if (!strcmp(op, "visible")) {
        op_visible();
    } else if (!strcmp(op, "kernel")) {
        op_kernel(a);
    } else if (!strcmp(op, "threads")) {
        unsigned t = a[0] ? (unsigned)atoi(a[0]) : 128;
        rc = (t >= 1 && t <= 1024) ? 0 : CUDA_ERROR_INVALID_VALUE;
        if (!rc) threads_per_block = t;
        emit(op, rc, "\"threads\":%u", threads_per_block);
    } else if (!strcmp(op, "hostpid")) {
        void *f = dlsym(RTLD_DEFAULT, "fake_host_pid");
        int hp = f ? ((int (*)(void))f)() : -1;
        emit(op, f ? 0 : MISSING, "\"hostpid\":%d,\"pid\":%d", hp, (int)getpid());
    } else if (!strcmp(op, "free")) {
        struct rec *r = get_id(a[0]);
        rc = r ? free_rec(r) : CUDA_ERROR_INVALID_VALUE;
        emit(op, rc, "\"id\":%d", a[0] ? atoi(a[0]) : -1);
    } else if (!strcmp(op, "freeall")) {
        int freed = 0;
        rc = 0;
        for (int i = nrecs - 1; i >= 0; i--) {
            if (recs[i].kind == R_FREE || recs[i].kind == R_CTX || recs[i].kind == R_GREEN ||
                recs[i].kind == R_POOL ||
                recs[i].kind == R_STREAM || recs[i].kind == R_GRAPH || recs[i].kind == R_MODULE ||
                recs[i].kind == R_LIBRARY)
                continue;
            int r = free_rec(&recs[i]);
            if (r && !rc) rc = r;
            freed += !r;
        }
        emit(op, rc, "\"freed\":%d", freed);
    } else if (!strcmp(op, "freeptr")) {
        rc = CALL(cuMemFree_v2, a[0] ? strtoull(a[0], NULL, 0) : 0);
        emit(op, rc, NULL);
    } else if (!strcmp(op, "freeasync")) {
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuMemFreeAsync, a[0] ? strtoull(a[0], NULL, 0) : 0, NULL);
        emit(op, rc, NULL);
    } else if (!strcmp(op, "memcpy") || !strcmp(op, "memset")) {
        struct rec *r = get_id(a[0]);
        char buf[64] = {0};
        rc = ensure(cur_dev);
        if (!rc && !r) rc = CUDA_ERROR_INVALID_VALUE;
        if (!rc && !strcmp(op, "memcpy")) {
            rc = CALL(cuMemcpyHtoD_v2, r->ptr, buf, sizeof buf);
            if (!rc) rc = CALL(cuMemcpyDtoH_v2, buf, r->ptr, sizeof buf);
        } else if (!rc) {
            rc = CALL(cuMemsetD8_v2, r->ptr, 0, r->size);
        }
        emit(op, rc, NULL);
    } else if (!strcmp(op, "stream")) {
        CUstream s = NULL;
        rc = ensure(cur_dev);
        if (!rc) rc = CALL(cuStreamCreate, &s, 0);
        int id = rc ? -1 : new_id((struct rec){.kind = R_STREAM, .stream = s});
        emit(op, rc, "\"id\":%d", id);
    } else if (!strcmp(op, "launch") || !strcmp(op, "launchex") || !strcmp(op, "coop")) {
        op_launch(op, a);
    } else if (!strcmp(op, "graph")) {
        op_graph(a);
    } else if (!strcmp(op, "launchfor")) {
        op_launchfor(a);
    } else if (!strcmp(op, "sync") || !strcmp(op, "sync2") || !strcmp(op, "streamsync") ||
               !strcmp(op, "eventsync")) {
        op_sync(op, a);
    } else if (!strcmp(op, "proc")) {
        op_proc(a);
    } else if (!strcmp(op, "errstr")) {
        const char *name = NULL, *str = NULL;
        CUresult code = (CUresult)(a[0] ? atoi(a[0]) : 0);
        rc = CALL(cuGetErrorName, code, &name);
        int rc2 = CALL(cuGetErrorString, code, &str);
        emit(op, rc ? rc : rc2, "\"name\":\"%s\",\"str\":\"%s\"", name ? name : "", str ? str : "");
    } else if (!strcmp(op, "exporttable")) {
        const void *t = NULL;
        CUuuid id;
        memset(&id, 0, sizeof id);
        rc = CALL(cuGetExportTable, &t, &id);
        emit(op, rc, NULL);
    } else if (!strncmp(op, "fake_", 5)) {
        op_fake(op, a);
    } else if (!strcmp(op, "pid")) {
        emit(op, 0, "\"pid\":%d", (int)getpid());
    } else if (!strcmp(op, "mark")) {
        emit(op, 0, "\"text\":\"%s\"", a[0] ? a[0] : "");
    } else if (!strcmp(op, "sleep")) {
        double ms = a[0] ? atof(a[0]) : 0;
        struct timespec ts = {(time_t)(ms / 1000), (long)(((long long)(ms * 1e6)) % 1000000000LL)};
        nanosleep(&ts, NULL);
        emit(op, 0, NULL);
    } else if (!strcmp(op, "exit")) {
        fflush(stdout);
        _exit(a[0] ? atoi(a[0]) : 0);
    } else if (!strcmp(op, "abort")) {
        fflush(stdout);
        abort();
    } else {
        emit(op, CUDA_ERROR_INVALID_VALUE, "\"error\":\"unknown op\"");
    }
}

int interp_main(int argc, char **argv, const char *how, struct api *api) {
    A = api;
    HOW = how;
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1) {
        size_t len = 0;
        for (int i = 1; i < argc; i++) len += strlen(argv[i]) + 1;
        char *script = calloc(1, len + 1);
        for (int i = 1; i < argc; i++) {
            strcat(script, argv[i]);
            strcat(script, " ");
        }
        char *save = NULL;
        for (char *line = strtok_r(script, ";\n", &save); line; line = strtok_r(NULL, ";\n", &save))
            run_line(line);
        free(script);
    } else {
        char line[4096];
        while (fgets(line, sizeof line, stdin)) run_line(line);
    }
    return 0;
}
