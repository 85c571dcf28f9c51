/* Initialisation, devices, contexts (created and primary) and the fake_* test exports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu.h"

int fc_initialized;

CUresult fc_check_init(void) {
    return __atomic_load_n(&fc_initialized, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS
                                                              : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult fc_check_dev(CUdevice dev) {
    CUresult r = fc_check_init();
    if (r) return r;
    return (dev >= 0 && dev < fc_knobs()->nvis) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult fc_dev_arg(CUdevice dev, int *phys) {
    CUresult r = fc_check_dev(dev);
    if (!r) *phys = fc_knobs()->vis[dev];
    return r;
}

CUdevice fc_ordinal(int phys) {
    const struct fc_knobs *k = fc_knobs();
    for (int i = 0; i < k->nvis; i++)
        if (k->vis[i] == phys) return i;
    return -1;
}

int fc_location_dev(int id) {
    const struct fc_knobs *k = fc_knobs();
    return (id >= 0 && id < k->nvis) ? k->vis[id] : -1;
}

FC_API CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    /* CUDA_VISIBLE_DEVICES naming no device (empty, or an invalid first entry) */
    if (fc_knobs()->nvis <= 0) return CUDA_ERROR_NO_DEVICE;
    struct fc_shared *s = fc_state();
    if (!s) return fc_knobs()->ndev <= 0 ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_UNKNOWN;
    fc_lock();
    fc_visible_resolve(s); /* a MIG-... entry naming no existing instance ends the list */
    if (fc_knobs()->nvis <= 0) {
        fc_unlock();
        return CUDA_ERROR_NO_DEVICE;
    }
    int slot = fc_self_slot_locked();
    fc_unlock();
    if (slot < 0) return CUDA_ERROR_UNKNOWN;
    __atomic_store_n(&fc_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

FC_API CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = fc_knobs()->driver_version;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= fc_knobs()->nvis) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetCount(int *count) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = fc_knobs()->nvis;
    return CUDA_SUCCESS;
}

/* The ordinal CUDA_VISIBLE_DEVICES' MIG device has (cuInit resolved it). */
static int is_mig(CUdevice dev) { return fc_knobs()->mig_ordinal == dev; }

FC_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    int phys;
    CUresult r = fc_dev_arg(dev, &phys);
    if (r) return r;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (is_mig(dev)) { /* "NVIDIA Fake GPU 80GB MIG 1g.10gb", as NVML names it */
        const struct fc_knobs *k = fc_knobs();
        char parent[96], prof[64];
        fc_device_name(phys, parent, sizeof parent);
        fc_mig_profile_name(phys, k->mig_gslices, k->mig_cslices, k->mig_mem_slices, prof,
                            sizeof prof);
        snprintf(name, (size_t)len, "%s MIG %s", parent, prof);
        return CUDA_SUCCESS;
    }
    fc_device_name(phys, name, (size_t)len);
    return CUDA_SUCCESS;
}

/* The physical device's UUID: the 16 bytes whose string form is NVML's GPU-... UUID.  On
 * a MIG device, v2 gives the MIG device's UUID (MIG-...) and the legacy entry point its
 * GPU's, as the real driver does.  The entry points share a static body: an LD_PRELOADed
 * library that exports one of the names must not be reached from inside the driver. */
static CUresult device_uuid(CUuuid *uuid, CUdevice dev, int v2) {
    int phys;
    CUresult r = fc_dev_arg(dev, &phys);
    if (r) return r;
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    const struct fc_knobs *k = fc_knobs();
    if (is_mig(dev) && v2)
        fc_mig_uuid_bytes(phys, k->mig_gen, k->mig_gi, k->mig_ci, (unsigned char *)uuid->bytes);
    else if (is_mig(dev))
        fc_uuid_bytes_gen(phys, k->mig_gen, (unsigned char *)uuid->bytes);
    else
        fc_uuid_bytes(phys, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return device_uuid(uuid, dev, 0); }

FC_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return device_uuid(uuid, dev, 1); }

FC_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    int phys;
    CUresult r = fc_dev_arg(dev, &phys);
    if (r) return r;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (is_mig(dev)) /* the GPU instance's memory */
        *bytes = fc_mig_mem_mib(phys, fc_knobs()->mig_mem_slices) * FC_MIB;
    else
        *bytes = fc_knobs()->total[phys];
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    size_t b = 0;
    CUresult r = cuDeviceTotalMem_v2(bytes ? &b : NULL, dev);
    if (r == CUDA_SUCCESS) *bytes = b > 0xffffffffull ? 0xffffffffu : (unsigned int)b;
    return r;
}

FC_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    int phys;
    CUresult r = fc_dev_arg(dev, &phys);
    if (r) return r;
    if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1410000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        v = is_mig(dev) ? (int)fc_mig_sms(fc_knobs()->mig_cslices) : fc_knobs()->sms;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = phys; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 40 * 1024 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 8; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */
#define STACK_MAX 64
static __thread struct fc_ctx *stack[STACK_MAX];
static __thread int depth;

static struct fc_ctx primary[FC_MAX_DEV]; /* by physical device */
static int primary_refs[FC_MAX_DEV];
static pthread_mutex_t primary_mutex = PTHREAD_MUTEX_INITIALIZER;
static int active[FC_MAX_DEV]; /* active contexts per physical device */

int fc_active_contexts(int dev) { return __atomic_load_n(&active[dev], __ATOMIC_ACQUIRE); }

struct fc_ctx *fc_ctx_of(CUcontext h) { return fc_handle_get(h, K_CTX); }

CUresult fc_current(struct fc_ctx **out) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_ctx *c = depth ? stack[depth - 1] : NULL;
    if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* ---- the context's own memory beyond FAKECUDA_CTX_MIB: limits and lazy growth ---- */
/* Guards limit, limit_bytes, launched and grow_bytes of every context. */
static pthread_mutex_t ctx_mem_mutex = PTHREAD_MUTEX_INITIALIZER;

/* cuCtxGetLimit of a new context: the real driver's defaults (the memory of the three
 * memory limits at these values is part of FAKECUDA_CTX_MIB). */
static const uint64_t limit_default[CU_LIMIT_MAX] = {
    [CU_LIMIT_STACK_SIZE] = 1024,
    [CU_LIMIT_PRINTF_FIFO_SIZE] = 1024 * 1024,
    [CU_LIMIT_MALLOC_HEAP_SIZE] = 8 * 1024 * 1024,
    [CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2,
    [CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048,
};

int fc_dev_sms(int dev) {
    const struct fc_knobs *k = fc_knobs();
    int sms = (k->mig_ordinal >= 0 && k->mig_phys == dev) ? (int)fc_mig_sms(k->mig_cslices) : k->sms;
    return sms > 0 ? sms : 1;
}

/* Device bytes a memory limit of value takes on dev: the stack is reserved for every thread
 * the device can hold at once (value x SMs x 2048 threads per SM, compute capability 8.0);
 * the printf FIFO and the malloc heap are their size.  0 when it overflows. */
static int limit_mem(int dev, CUlimit limit, uint64_t value, uint64_t *bytes) {
    if (limit != CU_LIMIT_STACK_SIZE) {
        *bytes = value;
        return 1;
    }
    uint64_t threads = (uint64_t)fc_dev_sms(dev) * 2048;
    if (value > UINT64_MAX / threads) return 0;
    *bytes = value * threads;
    return 1;
}

/* What a memory limit of value charges beyond the default's memory (0 at or below it). */
static int limit_extra(int dev, CUlimit limit, uint64_t value, uint64_t *extra) {
    uint64_t want, base;
    if (!limit_mem(dev, limit, value, &want)) return 0;
    limit_mem(dev, limit, limit_default[limit], &base);
    *extra = want > base ? want - base : 0;
    return 1;
}

FC_API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if ((unsigned)limit >= CU_LIMIT_MAX) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (limit == CU_LIMIT_SHMEM_SIZE || limit == CU_LIMIT_CIG_ENABLED)
        return CUDA_ERROR_INVALID_VALUE; /* query only (cuda.h) */
    pthread_mutex_lock(&ctx_mem_mutex);
    if (!c->active) {
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    } else if ((unsigned)limit < FC_MEM_LIMITS) {
        uint64_t want, have = c->limit_bytes[limit];
        if (!limit_extra(c->dev, limit, value, &want))
            r = CUDA_ERROR_OUT_OF_MEMORY; /* more than any device holds */
        else if (want > have && fc_charge(c->dev, want - have) < 0)
            r = CUDA_ERROR_OUT_OF_MEMORY; /* the limit stays as it was */
        else if (want < have)
            fc_uncharge(c->dev, have - want);
        if (!r) c->limit_bytes[limit] = want;
    }
    if (!r) c->limit[limit] = value;
    pthread_mutex_unlock(&ctx_mem_mutex);
    return r;
}

FC_API CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!pvalue) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned)limit >= CU_LIMIT_MAX) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    pthread_mutex_lock(&ctx_mem_mutex);
    *pvalue = c->limit[limit];
    pthread_mutex_unlock(&ctx_mem_mutex);
    return CUDA_SUCCESS;
}

CUresult fc_ctx_first_launch(struct fc_ctx *c) {
    if (__atomic_load_n(&c->launched, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&ctx_mem_mutex);
    if (!c->launched && c->active) {
        uint64_t g = fc_knobs()->ctx_grow_bytes;
        if (g && fc_charge(c->dev, g) < 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY; /* not grown: the next launch tries again */
        } else {
            c->grow_bytes = g;
            __atomic_store_n(&c->launched, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&ctx_mem_mutex);
    return r;
}

/* Charges the context's own memory, as the real driver does. */
static CUresult ctx_activate(struct fc_ctx *c, int dev) {
    if (fc_charge(dev, fc_knobs()->ctx_bytes) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    fc_ctx_count(dev, +1);
    pthread_mutex_lock(&ctx_mem_mutex);
    memcpy(c->limit, limit_default, sizeof c->limit);
    memset(c->limit_bytes, 0, sizeof c->limit_bytes);
    c->grow_bytes = 0;
    __atomic_store_n(&c->launched, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ctx_mem_mutex);
    c->dev = dev;
    c->active = 1;
    c->last_end = 0;
    __atomic_add_fetch(&active[dev], 1, __ATOMIC_ACQ_REL);
    return CUDA_SUCCESS;
}

/* Frees the context's memory, its modules and every allocation made in it, as the real
 * driver does; a device left without contexts gives back what its pools and graph memory
 * keep. */
static void ctx_deactivate(struct fc_ctx *c) {
    if (!c->active) return;
    pthread_mutex_lock(&ctx_mem_mutex);
    c->active = 0;
    uint64_t extra = c->grow_bytes;
    for (int i = 0; i < FC_MEM_LIMITS; i++) extra += c->limit_bytes[i];
    memset(c->limit_bytes, 0, sizeof c->limit_bytes);
    c->grow_bytes = 0;
    pthread_mutex_unlock(&ctx_mem_mutex);
    fc_ctx_unload_modules(c);
    fc_free_ctx_allocations(c);
    fc_uncharge(c->dev, fc_knobs()->ctx_bytes + extra);
    fc_ctx_count(c->dev, -1);
    __atomic_sub_fetch(&active[c->dev], 1, __ATOMIC_ACQ_REL);
    for (int d = 0; d < fc_knobs()->ndev; d++)
        if (fc_active_contexts(d) == 0) fc_release_device_caches(d);
}

static void push(struct fc_ctx *c) {
    if (depth < STACK_MAX) stack[depth++] = c;
}

FC_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    int phys;
    CUresult r = fc_dev_arg(dev, &phys);
    if (r) return r;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    struct fc_ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    r = ctx_activate(c, phys);
    if (r) {
        free(c);
        return r;
    }
    c->handle = fc_handle_new(K_CTX, c);
    push(c);
    *pctx = c->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return cuCtxCreate_v2(pctx, flags, dev);
}

FC_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned int flags, CUdevice dev) {
    if (n < 0 || (n > 0 && !params)) return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

FC_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev) {
    if (params && params->numExecAffinityParams < 0) return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

FC_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_ctx *c = fc_ctx_of(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = depth - 1; i >= 0; i--) {
        if (stack[i] == c) {
            memmove(&stack[i], &stack[i + 1], (size_t)(depth - i - 1) * sizeof stack[0]);
            depth--;
        }
    }
    ctx_deactivate(c);
    fc_handle_free(ctx); /* the struct stays: other threads may still hold it */
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

FC_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = depth ? stack[depth - 1]->handle : NULL;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!ctx) {
        if (depth) depth--;
        return CUDA_SUCCESS;
    }
    struct fc_ctx *c = fc_ctx_of(ctx);
    if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    if (depth)
        stack[depth - 1] = c;
    else
        push(c);
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_ctx *c = fc_ctx_of(ctx);
    if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    if (depth >= STACK_MAX) return CUDA_ERROR_INVALID_VALUE;
    push(c);
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

FC_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!depth) return CUDA_ERROR_INVALID_CONTEXT;
    struct fc_ctx *c = stack[--depth];
    if (pctx) *pctx = c->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

FC_API CUresult cuCtxGetDevice(CUdevice *device) {
    if (!device) {
        CUresult r = fc_check_init();
        return r ? r : CUDA_ERROR_INVALID_VALUE;
    }
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    *device = fc_ordinal(c->dev);
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    if (!ctx) return cuCtxGetDevice(device);
    CUresult r = fc_check_init();
    if (r) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    struct fc_ctx *c = fc_ctx_of(ctx);
    if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    *device = fc_ordinal(c->dev);
    return CUDA_SUCCESS;
}

/* ---- primary contexts ---- */
FC_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice ord) {
    int dev;
    CUresult r = fc_dev_arg(ord, &dev);
    if (r) return r;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_mutex);
    struct fc_ctx *c = &primary[dev];
    if (!c->handle) {
        c->primary = 1;
        c->dev = dev;
        c->handle = fc_handle_new(K_CTX, c);
    }
    if (!c->active) r = ctx_activate(c, dev);
    if (!r) {
        primary_refs[dev]++;
        *pctx = c->handle;
    }
    pthread_mutex_unlock(&primary_mutex);
    return r;
}

FC_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice ord) {
    int dev;
    CUresult r = fc_dev_arg(ord, &dev);
    if (r) return r;
    pthread_mutex_lock(&primary_mutex);
    if (primary_refs[dev] == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--primary_refs[dev] == 0) {
        ctx_deactivate(&primary[dev]);
    }
    pthread_mutex_unlock(&primary_mutex);
    return r;
}

FC_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

/* ---- green contexts (CUDA 12.4+) ----
 * cuGreenCtxCreate retains the device's primary context (activating it, with its memory,
 * when it was not) and provisions FAKECUDA_GREEN_CTX_MIB for the green context itself;
 * cuCtxFromGreenCtx's CUcontext runs kernels on the green context's SMs only, and what is
 * allocated in it is the primary context's memory (it stays when the green context goes,
 * and goes with the primary context); cuGreenCtxDestroy gives back what it provisioned
 * and releases the primary context. As cuda.h describes them; the SM split follows the
 * real rules only as far as the tests need (groups of minCount rounded up to 2 SMs). */
struct fc_resdesc {
    int sms;
};
struct fc_green {
    int dev;
    struct fc_ctx view; /* what cuCtxFromGreenCtx returns */
    CUgreenCtx handle;
};

#define SM_ALIGN 2u

static void sm_resource(CUdevResource *r, unsigned sms) {
    memset(r, 0, sizeof *r);
    r->type = CU_DEV_RESOURCE_TYPE_SM;
    r->sm.smCount = sms;
    r->sm.minSmPartitionSize = SM_ALIGN;
    r->sm.smCoscheduledAlignment = SM_ALIGN;
}

FC_API CUresult cuDeviceGetDevResource(CUdevice ord, CUdevResource *res, CUdevResourceType type) {
    int dev;
    CUresult r = fc_dev_arg(ord, &dev);
    if (r) return r;
    if (!res) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    sm_resource(res, (unsigned)fc_dev_sms(dev));
    return CUDA_SUCCESS;
}

FC_API CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups,
                                            const CUdevResource *input, CUdevResource *remainder,
                                            unsigned int flags, unsigned int minCount) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!nbGroups || !input || flags) return CUDA_ERROR_INVALID_VALUE;
    if (input->type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    unsigned size = minCount < SM_ALIGN ? SM_ALIGN : (minCount + SM_ALIGN - 1) / SM_ALIGN * SM_ALIGN;
    unsigned fit = input->sm.smCount / size;
    if (fit == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    unsigned n = result ? (*nbGroups < fit ? *nbGroups : fit) : fit;
    for (unsigned i = 0; result && i < n; i++) sm_resource(&result[i], size);
    if (remainder) sm_resource(remainder, input->sm.smCount - n * size);
    *nbGroups = n;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources,
                                          unsigned int nbResources) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!phDesc || !resources || nbResources == 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned sms = 0;
    for (unsigned i = 0; i < nbResources; i++) {
        if (resources[i].type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
        sms += resources[i].sm.smCount;
    }
    if (sms == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    struct fc_resdesc *d = calloc(1, sizeof *d);
    if (!d) return CUDA_ERROR_OUT_OF_MEMORY;
    d->sms = (int)sms;
    *phDesc = fc_handle_new(K_RESDESC, d);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice ord,
                                 unsigned int flags) {
    int dev;
    CUresult r = fc_dev_arg(ord, &dev);
    if (r) return r;
    struct fc_resdesc *d = fc_handle_get(desc, K_RESDESC);
    if (!phCtx || !d || (flags & ~(unsigned)CU_GREEN_CTX_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (d->sms > fc_dev_sms(dev)) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    struct fc_green *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext prim;
    r = cuDevicePrimaryCtxRetain(&prim, ord); /* its memory, when it was not active */
    if (r) {
        free(g);
        return r;
    }
    if (fc_charge(dev, fc_knobs()->green_bytes) < 0) {
        cuDevicePrimaryCtxRelease_v2(ord);
        free(g);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->dev = dev;
    g->view.dev = dev;
    g->view.primary = 1; /* "treated as if it were a primary context" (cuda.h) */
    g->view.active = 1;
    g->view.sms = d->sms;
    g->view.launched = 1; /* growth at a first launch is the primary context's */
    memcpy(g->view.limit, limit_default, sizeof g->view.limit);
    g->view.handle = fc_handle_new(K_CTX, &g->view);
    g->handle = fc_handle_new(K_GREEN, g);
    *phCtx = g->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pContext) return CUDA_ERROR_INVALID_VALUE;
    struct fc_green *g = fc_handle_get(hCtx, K_GREEN);
    if (!g) return CUDA_ERROR_INVALID_CONTEXT;
    *pContext = g->view.handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource *res,
                                         CUdevResourceType type) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_green *g = fc_handle_get(hCtx, K_GREEN);
    if (!g) return CUDA_ERROR_INVALID_CONTEXT;
    if (!res) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    sm_resource(res, (unsigned)g->view.sms);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_green *g = fc_handle_get(hCtx, K_GREEN);
    if (!g) return CUDA_ERROR_INVALID_CONTEXT;
    fc_handle_free(hCtx);
    /* a thread that still has it current gets CONTEXT_IS_DESTROYED from then on */
    g->view.active = 0;
    fc_reown_ctx_allocations(&g->view, &primary[g->dev]);
    fc_uncharge(g->dev, fc_knobs()->green_bytes);
    cuDevicePrimaryCtxRelease_v2(fc_ordinal(g->dev));
    /* the view's handle stays allocated (a dangling CUcontext must read as destroyed,
     * not as another object), and so does g */
    return CUDA_SUCCESS;
}

FC_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice ord) {
    int dev;
    CUresult r = fc_dev_arg(ord, &dev);
    if (r) return r;
    pthread_mutex_lock(&primary_mutex);
    ctx_deactivate(&primary[dev]);
    primary_refs[dev] = 0;
    pthread_mutex_unlock(&primary_mutex);
    return CUDA_SUCCESS;
}

FC_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

FC_API CUresult cuDevicePrimaryCtxGetState(CUdevice ord, unsigned int *flags, int *pactive) {
    int dev;
    CUresult r = fc_dev_arg(ord, &dev);
    if (r) return r;
    if (!flags || !pactive) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&primary_mutex);
    *flags = 0;
    *pactive = primary[dev].active;
    pthread_mutex_unlock(&primary_mutex);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    (void)pExportTableId;
    if (ppExportTable) *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- test-only exports (devices are physical: NVML indexes) ---- */
FC_API void *fake_state_region(void) { return fc_state(); }
FC_API int fake_state_fd(void) { return fc_state_fd(); }

/* The state lock taken and given back by hand (tests of the lock itself): the time of
 * the acquisition, of the release.  0 without state. */
FC_API unsigned long long fake_state_lock(void) {
    if (!fc_state()) return 0;
    fc_lock();
    return fc_now();
}

FC_API unsigned long long fake_state_unlock(void) {
    if (!fc_state()) return 0;
    uint64_t t = fc_now();
    fc_unlock();
    return t;
}

/* The host pid the fake believes this process has (FAKECUDA_HOST_PID_SOCK, else
 * getpid() + FAKECUDA_HOST_PID_OFFSET). */
FC_API int fake_host_pid(void) { return (int)fc_ident()->host_pid; }

/* Not CUDA: what a graphics API's allocation (vkAllocateMemory) does to the device, which
 * no CUDA hook sees.  0, or -1 when the device has no room (or no such device). */
FC_API int fake_graphics_alloc(int dev, unsigned long long bytes) {
    if (!fc_state() || dev < 0 || dev >= fc_knobs()->ndev || bytes == 0) return -1;
    return fc_graphics_charge(dev, bytes);
}

FC_API unsigned long long fake_now_ns(void) { return fc_now(); }

static int valid_dev(int dev) { return fc_state() && dev >= 0 && dev < fc_knobs()->ndev; }

FC_API unsigned long long fake_busy_ns(int dev, int host_pid, unsigned long long t0,
                                       unsigned long long t1) {
    if (!valid_dev(dev) || t1 <= t0) return 0;
    fc_lock();
    uint64_t v = fc_busy_locked(dev, host_pid, t0, t1);
    fc_unlock();
    return v;
}

/* The exact device time host_pid's kernels took in the completed NVML sampling window
 * that contains t_ns (fake_now_ns time); 0 when that window is not kept (or not over).
 * Exact however many kernels ran: the windows are completed as launches happen. */
FC_API unsigned long long fake_window_busy_ns(int dev, int host_pid, unsigned long long t_ns) {
    if (!valid_dev(dev)) return 0;
    fc_lock();
    fc_sample_locked(dev, fc_now());
    uint64_t W = fc_sample_ns(), v = 0, index = t_ns / W;
    const struct fc_sample *smp = &fc_state()->dev[dev].samples[index % FC_SAMPLES];
    if (smp->end_us && smp->index == index)
        for (uint32_t j = 0; j < smp->n; j++)
            if ((int)smp->pid[j].host_pid == host_pid) v = smp->pid[j].busy_ns;
    fc_unlock();
    return v;
}

FC_API unsigned long long fake_sample_window_ns(void) {
    if (!fc_state()) return 0;
    return fc_sample_ns();
}

FC_API unsigned long long fake_timeline_oldest_ns(int dev) {
    if (!valid_dev(dev)) return 0;
    fc_lock();
    uint64_t v = fc_oldest_locked(dev);
    fc_unlock();
    return v;
}

FC_API unsigned long long fake_device_used_bytes(int dev) {
    if (!valid_dev(dev)) return 0;
    fc_lock();
    fc_reap_locked();
    uint64_t v = fc_state()->dev[dev].used;
    fc_unlock();
    return v;
}

FC_API unsigned long long fake_managed_bytes(int host_pid) {
    struct fc_shared *s = fc_state();
    if (!s) return 0;
    uint64_t v = 0;
    fc_lock();
    fc_reap_locked();
    for (int i = 0; i < FC_MAX_PROCS; i++)
        if (s->procs[i].pid && s->procs[i].host_pid == (uint32_t)host_pid) v += s->procs[i].managed;
    fc_unlock();
    return v;
}

__attribute__((destructor)) static void fc_at_exit(void) { fc_release_self(); }
