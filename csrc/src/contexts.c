/* Contexts: the memory they take, and the memory the driver takes outside the hooks.
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
 * The context hooks (cuda_context.c) tell this file of each context made and
 * destroyed; the allocation hooks ask it to measure before they charge.
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
        untracked[dev] += vg_state_take_adopted(dev); /* charged here by another process */
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

/* A free the driver may not honour at once (an IPC-exported allocation another process
 * still has open stays allocated, and NVML counts it for this process): measure right
 * after it, not at most every 100 ms, so the allocation that follows cannot take the
 * limit's room a second time. */
void vg_context_untracked_now(int dev)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES) return;
    __atomic_store_n(&untracked_next[dev], 0, __ATOMIC_RELEASE);
    charge_untracked(dev);
}

/* A free of an IPC-exported allocation, which another process of the container may still
 * have open: this process's untracked memory is measured at once (above), and so is the
 * opener's. A real driver keeps the memory and NVML counts it for the opener from then on
 * (seen on an H200: 820 MiB moved from the exporter's figure to the opener's at the free).
 * The opener's shim would charge it at its own next measurement, which an opener that
 * holds the mapping and makes no call never takes, and the exporter's next allocation took
 * the room again (2.8 GiB under a 2 GiB limit). What NVML counts for another process of
 * the container beyond its charge is charged to it now (vg_state_adopt), and that
 * process's next measurement takes it as its own, given back as its figure falls. */
void vg_context_exported_freed(int dev)
{
    vg_context_untracked_now(dev);
    if (dev < 0 || dev >= VG_MAX_DEVICES || !vg_cfg.dev[dev].memory_limit) return;
    nvmlDevice_t h = vg_nvml_device(dev);
    nvmlProcessInfo_t *infos;
    unsigned int n;
    if (!h || vg_nvml_compute_processes(h, &infos, &n) != NVML_SUCCESS) return;
    int *pids = calloc(n ? n : 1, sizeof *pids);
    uint64_t *bytes = calloc(n ? n : 1, sizeof *bytes);
    if (pids && bytes) {
        int k = 0;
        for (unsigned i = 0; i < n; i++)
            if (infos[i].usedGpuMemory != ~0ull) {
                pids[k] = (int)infos[i].pid;
                bytes[k++] = infos[i].usedGpuMemory;
            }
        vg_state_adopt(dev, pids, bytes, k, vg_nvml_namespace_pids());
    }
    free(pids);
    free(bytes);
    free(infos);
}

/* vg_context_untracked_now for each device of a mask (bit d: device d) */
void vg_context_untracked_now_on(uint64_t devices)
{
    for (int d = 0; d < VG_MAX_DEVICES && devices >> d; d++)
        if (devices & (1ull << d)) vg_context_untracked_now(d);
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

/* A destroyed context's own record forgotten and its charge given back; its config
 * device, or -1 when the shim never knew it. */
int vg_context_gone(CUcontext c)
{
    uint64_t ctx = (uint64_t)(uintptr_t)c;
    vg_alloc rec;
    int dev = -1;
    if (!ctx) return -1;
    vg_lock(&ctx_mu);
    if (vg_forget(VG_T_CTX, ctx, &rec)) {
        dev = rec.dev;
        if (rec.flags & VG_F_PENDING) __atomic_sub_fetch(&pending[dev], 1, __ATOMIC_ACQ_REL);
        else vg_state_uncharge_context(dev, rec.bytes);
    }
    vg_unlock(&ctx_mu);
    return dev;
}

CUcontext vg_context_primary(CUdevice ordinal)
{
    if (ordinal < 0 || ordinal >= ORDINALS) return NULL;
    vg_lock(&ctx_mu);
    CUcontext c = primary[ordinal];
    vg_unlock(&ctx_mu);
    return c;
}

uint64_t vg_context_largest(int dev)
{
    return dev >= 0 && dev < VG_MAX_DEVICES ? __atomic_load_n(&largest[dev], __ATOMIC_RELAXED) : 0;
}
