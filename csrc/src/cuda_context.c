/* Contexts: their memory, and what goes with them.
 *
 * A context takes device memory the workload never asked for (300-500 MiB on real
 * GPUs). It is charged to the process once it exists — forced: it exists whatever the
 * limit says — with its size measured from NVML: this process's memory on the device
 * minus what the shim has already charged it. NVML names the process by host PID
 * (drivers >= 560 by the PID in our namespace, nvml.c tells which); a measurement
 * that cannot be made yet (the host PID not known yet, the process not in NVML's list
 * yet) stays pending and is tried again at the next allocation on that device, never
 * given up.
 *
 * Destroying a context (cuCtxDestroy, the last release of a primary context, or its
 * reset) frees its memory and every allocation made in it, in the driver; the shim
 * gives back the same: the context's charge, and each record that names the context.
 * Pools and VMM handles belong to the device, not to a context; pools are counted
 * again after a teardown (cuda_pool.c).
 *
 * The driver also takes memory no hook sees: module code and __device__ globals,
 * cuCtxSetLimit's stacks (bytes per thread x every resident thread), heap and printf
 * FIFO, a context's growth at its first launch, IPC and external imports. Under a
 * memory limit, at most every 100 ms at an allocation or a query, the same measure is
 * taken again: NVML's figure for this process beyond what the shim charged it is
 * charged too ("untracked", forced: it exists), and given back as the figure falls.
 * The next allocation past the limit is refused, cuMemGetInfo and NVML show it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim.h"

#define ORDINALS 64
VG_MUTEX(ctx_mu);
static int pending[VG_MAX_DEVICES];       /* contexts not measured yet, per device */
static CUcontext primary[ORDINALS];       /* the primary context of each ordinal */
static uint64_t largest[VG_MAX_DEVICES];  /* the largest single context measured */
static uint64_t untracked[VG_MAX_DEVICES];  /* charged for memory no hook saw */
static uint64_t untracked_next[VG_MAX_DEVICES]; /* when to measure it again */
#define UNTRACKED_EVERY_NS 100000000ull

/* This process's device memory on config device dev as NVML sees it, or -1 when NVML
 * cannot tell yet (no host PID, not listed yet, no usage figure). */
static int64_t nvml_process_bytes(int dev)
{
    nvmlDevice_t h = vg_nvml_device(dev);
    if (!h || !vg_real.nvmlDeviceGetComputeRunningProcesses_v3) return -1;
    int want = vg_nvml_namespace_pids() ? getpid() : vg_host_pid();
    if (want <= 0) return -1;
    nvmlProcessInfo_t *infos;
    unsigned int n;
    if (vg_nvml_compute_processes(h, &infos, &n) != NVML_SUCCESS) return -1;
    int64_t bytes = -1;
    for (unsigned i = 0; i < n; i++)
        if ((int)infos[i].pid == want && infos[i].usedGpuMemory != ~0ull) {
            bytes = (int64_t)infos[i].usedGpuMemory;
            break;
        }
    free(infos);
    return bytes;
}

struct measure { int dev; uint64_t bytes; int done; };

static int assign(vg_alloc *a, void *arg)
{
    struct measure *m = arg;
    if (a->dev != m->dev || !(a->flags & VG_F_PENDING)) return 0;
    /* NVML shows the sum of the pending contexts: the first one carries it */
    a->bytes = m->done ? 0 : m->bytes;
    a->flags &= ~VG_F_PENDING;
    m->done = 1;
    vg_remember(VG_T_CTX, *a);
    return 0;
}

/* NVML's figure for this process beyond what the shim charged it, charged (see above) */
static void charge_untracked(int dev)
{
    uint64_t now = vg_now_ns();
    if (!vg_cfg.dev[dev].memory_limit || vg_cfg.deny ||
        now < __atomic_load_n(&untracked_next[dev], __ATOMIC_ACQUIRE))
        return;
    __atomic_store_n(&untracked_next[dev], now + UNTRACKED_EVERY_NS, __ATOMIC_RELEASE);
    int64_t seen = nvml_process_bytes(dev);
    if (seen < 0) return;
    vg_lock(&ctx_mu);
    if (!pending[dev]) { /* a context not measured yet is the context charge's */
        uint64_t was = untracked[dev], own = vg_state_own_used(dev);
        uint64_t tracked = own > was ? own - was : 0;
        uint64_t want = (uint64_t)seen > tracked ? (uint64_t)seen - tracked : 0;
        if (want > was)
            vg_state_charge(dev, want - was, VG_KIND_DEVICE, VG_CHARGE_FORCE);
        else if (want < was)
            vg_state_uncharge(dev, was - want, VG_KIND_DEVICE);
        if (want != was)
            VG_DEBUG("device %d: %llu bytes the driver holds that no hook saw", dev,
                     (unsigned long long)want);
        untracked[dev] = want;
    }
    vg_unlock(&ctx_mu);
}

void vg_context_charge(int dev)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES) return;
    charge_untracked(dev);
    if (!__atomic_load_n(&pending[dev], __ATOMIC_ACQUIRE)) return;
    if (!vg_nvml_namespace_pids()) vg_host_pid(); /* asked before the lock: it may wait on the plugin */
    vg_lock(&ctx_mu);
    if (pending[dev]) {
        int64_t seen = nvml_process_bytes(dev);
        uint64_t ours = vg_state_own_used(dev);
        if (seen >= 0) {
            struct measure m = {dev, (uint64_t)seen > ours ? (uint64_t)seen - ours : 0, 0};
            if (pending[dev] == 1 && m.bytes > largest[dev]) /* one context's size */
                __atomic_store_n(&largest[dev], m.bytes, __ATOMIC_RELAXED);
            vg_each(VG_T_CTX, assign, &m);
            vg_state_charge(dev, m.bytes, VG_KIND_DEVICE, VG_CHARGE_FORCE | VG_CHARGE_CONTEXT);
            VG_DEBUG("charged %llu bytes of context memory on device %d",
                     (unsigned long long)m.bytes, dev);
            __atomic_store_n(&pending[dev], 0, __ATOMIC_RELEASE);
        }
    }
    vg_unlock(&ctx_mu);
}

void vg_context_created(CUcontext ctx, CUdevice ordinal, int is_primary)
{
    int dev = vg_dev_index(ordinal);
    if (!ctx || dev < 0) return;
    vg_lock(&ctx_mu);
    if (is_primary && ordinal < ORDINALS) primary[ordinal] = ctx;
    if (!vg_peek(VG_T_CTX, (uint64_t)(uintptr_t)ctx, NULL)) {
        vg_remember(VG_T_CTX, (vg_alloc){.key = (uint64_t)(uintptr_t)ctx, .dev = dev,
                                         .flags = VG_F_PENDING | (is_primary ? VG_F_PRIMARY : 0)});
        __atomic_add_fetch(&pending[dev], 1, __ATOMIC_ACQ_REL);
    }
    vg_unlock(&ctx_mu);
    vg_context_charge(dev);
}

static int made_in(vg_alloc *a, void *arg)
{
    if (a->ctx != *(uint64_t *)arg) return 0;
    vg_release(a);
    return 1;
}

static void teardown(CUcontext c)
{
    uint64_t ctx = (uint64_t)(uintptr_t)c;
    if (!ctx) return;
    vg_alloc rec;
    int dev = -1;
    vg_lock(&ctx_mu);
    if (vg_forget(VG_T_CTX, ctx, &rec)) {
        dev = rec.dev;
        if (rec.flags & VG_F_PENDING) __atomic_sub_fetch(&pending[dev], 1, __ATOMIC_ACQ_REL);
        else vg_state_uncharge_context(dev, rec.bytes);
    }
    vg_unlock(&ctx_mu);
    vg_each(VG_T_PTR, made_in, &ctx);
    vg_each(VG_T_ARRAY, made_in, &ctx);
    vg_pools_reconcile(dev);
    VG_DEBUG("context %p destroyed: its memory given back", (void *)c);
}

/* A context of its own (cuCtxCreate*) is refused when it would not fit: its memory is
 * not asked for, but it is taken all the same (20 contexts of 300 MiB fitted a 1 GiB
 * limit). Before the driver is asked, against the largest context measured on the
 * device so far; after, against what it was measured to take (then it is destroyed).
 * A primary context is not refused: it is the one every runtime needs, the first and
 * only one of most processes. */
static CUresult refuse_early(CUdevice ordinal)
{
    int dev = vg_dev_index(ordinal);
    if (dev < 0) return CUDA_SUCCESS;
    uint64_t est = __atomic_load_n(&largest[dev], __ATOMIC_RELAXED);
    return est && vg_state_over_limit(dev, est) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

static CUresult created(CUresult r, CUcontext *pctx, CUdevice ordinal)
{
    if (r != CUDA_SUCCESS || !pctx || !*pctx) return r;
    vg_context_created(*pctx, ordinal, 0);
    int dev = vg_dev_index(ordinal);
    if (dev < 0) return r;
    if (vg_state_over_limit(dev, 0)) {
        CUcontext c = *pctx;
        if (vg_real.cuCtxDestroy_v2(c) == CUDA_SUCCESS) teardown(c);
        *pctx = NULL;
        VG_INFO("a new context on device %d would pass the memory limit: refused", dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

CUresult vg_impl_cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult e = refuse_early(dev);
    return e ? e : created(vg_real.cuCtxCreate(pctx, flags, dev), pctx, dev);
}

CUresult vg_impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult e = refuse_early(dev);
    return e ? e : created(vg_real.cuCtxCreate_v2(pctx, flags, dev), pctx, dev);
}

CUresult vg_impl_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags,
                                CUdevice dev)
{
    CUresult e = refuse_early(dev);
    return e ? e : created(vg_real.cuCtxCreate_v3(pctx, p, n, flags, dev), pctx, dev);
}

CUresult vg_impl_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                                CUdevice dev)
{
    CUresult e = refuse_early(dev);
    return e ? e : created(vg_real.cuCtxCreate_v4(pctx, p, flags, dev), pctx, dev);
}

CUresult vg_impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r == CUDA_SUCCESS && pctx) vg_context_created(*pctx, dev, 1);
    return r;
}

CUresult vg_impl_cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult r = vg_real.cuCtxDestroy_v2(ctx);
    if (r == CUDA_SUCCESS) teardown(ctx);
    return r;
}

CUresult vg_impl_cuCtxDestroy(CUcontext ctx)
{
    CUresult r = vg_real.cuCtxDestroy(ctx);
    if (r == CUDA_SUCCESS) teardown(ctx);
    return r;
}

static CUcontext primary_of(CUdevice ordinal)
{
    if (ordinal < 0 || ordinal >= ORDINALS) return NULL;
    vg_lock(&ctx_mu);
    CUcontext c = primary[ordinal];
    vg_unlock(&ctx_mu);
    return c;
}

/* after a release: the primary context is gone once it is no longer active */
static void released(CUresult r, CUdevice ordinal)
{
    unsigned flags = 0;
    int active = 1;
    if (r != CUDA_SUCCESS || !vg_real.cuDevicePrimaryCtxGetState ||
        vg_real.cuDevicePrimaryCtxGetState(ordinal, &flags, &active) != CUDA_SUCCESS || active)
        return;
    teardown(primary_of(ordinal));
}

CUresult vg_impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxRelease_v2(dev);
    released(r, dev);
    return r;
}

CUresult vg_impl_cuDevicePrimaryCtxRelease(CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxRelease(dev);
    released(r, dev);
    return r;
}

CUresult vg_impl_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxReset_v2(dev);
    if (r == CUDA_SUCCESS) teardown(primary_of(dev));
    return r;
}

CUresult vg_impl_cuDevicePrimaryCtxReset(CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxReset(dev);
    if (r == CUDA_SUCCESS) teardown(primary_of(dev));
    return r;
}
