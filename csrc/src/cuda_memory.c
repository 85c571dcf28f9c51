/* Device-memory hooks. Every path that takes device memory is charged before the
 * driver is asked (so the container never goes over its limit, even for an
 * instant, summed over its processes) and uncharged when the driver fails or the
 * memory is freed. Context memory is charged once per (process, device): see
 * vg_context_charge. With oversubscribe=1, a linear allocation that does not fit
 * the limit (or that the driver refuses for lack of memory) is served from managed
 * memory instead and counted as spilled, not against the limit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "shim.h"

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static vg_alloc_table allocs;   /* device pointers and VMM handles */
static vg_alloc_table arrays;   /* CUarray / CUmipmappedArray handles */
static unsigned char ctx_charged[VG_MAX_DEVICES];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;

int vg_current_device(CUdevice *dev)
{
    if (!vg_real.cuCtxGetDevice) return 0;
    return vg_real.cuCtxGetDevice(dev) == CUDA_SUCCESS && *dev >= 0;
}

static void remember(vg_alloc_table *t, uint64_t key, uint64_t bytes, int dev, int kind)
{
    pthread_mutex_lock(&table_mu);
    int r = vg_table_put(t, (vg_alloc){.key = key, .bytes = bytes, .dev = dev, .kind = kind});
    pthread_mutex_unlock(&table_mu);
    if (r) VG_ERROR("allocation table full: %llu bytes will stay charged",
                    (unsigned long long)bytes);
}

static int forget(vg_alloc_table *t, uint64_t key, vg_alloc *out)
{
    pthread_mutex_lock(&table_mu);
    int r = vg_table_take(t, key, out);
    pthread_mutex_unlock(&table_mu);
    return r;
}

static int peek(vg_alloc_table *t, uint64_t key, vg_alloc *out)
{
    pthread_mutex_lock(&table_mu);
    int r = vg_table_peek(t, key, out);
    pthread_mutex_unlock(&table_mu);
    return r;
}

static void release(const vg_alloc *a)
{
    vg_state_uncharge(a->dev, a->bytes, a->kind == VG_KIND_SPILL ? VG_KIND_SPILL : VG_KIND_DEVICE);
}

static int oversubscribed(int dev)
{
    return !vg_cfg.deny && dev >= 0 && dev < VG_MAX_DEVICES && vg_cfg.dev[dev].oversubscribe;
}

/* ---- context memory ----
 * A context takes device memory the workload never asked for (~300 MiB on real
 * GPUs). It is charged once per (process, device), the first time the process
 * creates or uses a context there, with the size measured from NVML: this
 * process's memory on the device (by host PID) minus what the shim has already
 * charged it. When NVML cannot tell (no host PID mapping yet), nothing is charged
 * and the next attempt measures again. Released when the process exits. */
static uint64_t nvml_process_bytes(int dev, int host_pid)
{
    nvmlDevice_t h = vg_nvml_device(dev);
    if (!h || !vg_real.nvmlDeviceGetComputeRunningProcesses_v3 || host_pid <= 0) return 0;
    nvmlProcessInfo_t infos[256];
    unsigned int n = 256;
    if (vg_real.nvmlDeviceGetComputeRunningProcesses_v3(h, &n, infos) != NVML_SUCCESS) return 0;
    for (unsigned i = 0; i < n && i < 256; i++)
        if ((int)infos[i].pid == host_pid) return infos[i].usedGpuMemory;
    return 0;
}

void vg_context_charge(CUdevice dev)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES || __atomic_load_n(&ctx_charged[dev], __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&ctx_mu);
    if (!ctx_charged[dev]) {
        int hp = vg_controller_host_pid();
        if (hp > 0) { /* measured once; without a mapping, tried again later */
            uint64_t seen = nvml_process_bytes(dev, hp);
            /* what NVML sees beyond our own charges is the context */
            uint64_t ours = 0, mine;
            pthread_mutex_lock(&table_mu);
            for (size_t i = 0; i < allocs.cap; i++)
                if (allocs.slots[i].key && allocs.slots[i].dev == dev &&
                    allocs.slots[i].kind == VG_KIND_DEVICE)
                    ours += allocs.slots[i].bytes;
            for (size_t i = 0; i < arrays.cap; i++)
                if (arrays.slots[i].key && arrays.slots[i].dev == dev)
                    ours += arrays.slots[i].bytes;
            pthread_mutex_unlock(&table_mu);
            mine = seen > ours ? seen - ours : 0;
            if (vg_state_charge(dev, mine, VG_KIND_DEVICE, 1) != 0)
                VG_WARN("context memory (%llu bytes) does not fit the limit of device %d",
                        (unsigned long long)mine, dev);
            else
                VG_DEBUG("charged %llu bytes of context memory on device %d",
                         (unsigned long long)mine, dev);
            __atomic_store_n(&ctx_charged[dev], 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&ctx_mu);
}

/* ---- linear allocations ---- */
static CUresult alloc_linear(CUdeviceptr *dptr, size_t bytes, int dev,
                             CUresult (*do_alloc)(CUdeviceptr *, void *), void *arg)
{
    vg_context_charge(dev);
    int spill = 0;
    if (vg_state_charge(dev, bytes, VG_KIND_DEVICE, 0) != 0) {
        if (!oversubscribed(dev)) return CUDA_ERROR_OUT_OF_MEMORY;
        spill = 1;
    }
    if (!spill) {
        CUresult r = do_alloc(dptr, arg);
        if (r == CUDA_SUCCESS) {
            remember(&allocs, *dptr, bytes, dev, VG_KIND_DEVICE);
            return r;
        }
        vg_state_uncharge(dev, bytes, VG_KIND_DEVICE);
        if (r != CUDA_ERROR_OUT_OF_MEMORY || !oversubscribed(dev)) return r;
    }
    /* oversubscription: host-backed managed memory, migrated on demand */
    if (!vg_real.cuMemAllocManaged) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vg_real.cuMemAllocManaged(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS) return r;
    vg_state_charge(dev, bytes, VG_KIND_SPILL, 0);
    remember(&allocs, *dptr, bytes, dev, VG_KIND_SPILL);
    VG_DEBUG("spilled %zu bytes on device %d into managed memory", bytes, dev);
    return CUDA_SUCCESS;
}

static CUresult do_mem_alloc(CUdeviceptr *dptr, void *arg)
{
    return vg_real.cuMemAlloc_v2(dptr, *(size_t *)arg);
}

CUresult vg_impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CUdevice dev;
    if (!dptr || bytesize == 0 || !vg_current_device(&dev))
        return vg_real.cuMemAlloc_v2(dptr, bytesize); /* the driver's own error */
    return alloc_linear(dptr, bytesize, dev, do_mem_alloc, &bytesize);
}

CUresult vg_impl_cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
    CUdevice dev;
    if (!dptr || bytesize == 0 || !vg_current_device(&dev))
        return vg_real.cuMemAlloc(dptr, bytesize);
    vg_context_charge(dev);
    if (vg_state_charge(dev, bytesize, VG_KIND_DEVICE, 0) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vg_real.cuMemAlloc(dptr, bytesize);
    if (r == CUDA_SUCCESS) remember(&allocs, *dptr, bytesize, dev, VG_KIND_DEVICE);
    else vg_state_uncharge(dev, bytesize, VG_KIND_DEVICE);
    return r;
}

struct pitch_args { size_t *pitch; size_t w, h; unsigned elem; };

static CUresult do_pitch(CUdeviceptr *dptr, void *arg)
{
    struct pitch_args *a = arg;
    return vg_real.cuMemAllocPitch_v2(dptr, a->pitch, a->w, a->h, a->elem);
}

CUresult vg_impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes)
{
    CUdevice dev;
    if (!dptr || !pPitch || !WidthInBytes || !Height || !vg_current_device(&dev))
        return vg_real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t est = vg_pitch_bytes(WidthInBytes, Height, NULL);
    struct pitch_args a = {pPitch, WidthInBytes, Height, ElementSizeBytes};
    CUresult r = alloc_linear(dptr, est, dev, do_pitch, &a);
    if (r != CUDA_SUCCESS) return r;
    /* the driver chose the pitch: charge any difference to the estimate */
    uint64_t real = (uint64_t)*pPitch * Height;
    vg_alloc rec;
    if (real > est && peek(&allocs, *dptr, &rec) && rec.kind == VG_KIND_DEVICE) {
        if (vg_state_charge(dev, real - est, VG_KIND_DEVICE, 0) != 0) {
            forget(&allocs, *dptr, &rec);
            vg_real.cuMemFree_v2(*dptr);
            release(&rec);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        forget(&allocs, *dptr, &rec);
        remember(&allocs, *dptr, real, dev, VG_KIND_DEVICE);
    }
    return r;
}

CUresult vg_impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    /* Managed memory can be resident on the device: it counts against the limit
     * like device memory (beyond the limit only with oversubscribe=1, as spill). */
    CUdevice dev;
    if (!dptr || bytesize == 0 || !vg_current_device(&dev))
        return vg_real.cuMemAllocManaged(dptr, bytesize, flags);
    vg_context_charge(dev);
    int kind = VG_KIND_MANAGED;
    if (vg_state_charge(dev, bytesize, VG_KIND_DEVICE, 0) != 0) {
        if (!oversubscribed(dev)) return CUDA_ERROR_OUT_OF_MEMORY;
        kind = VG_KIND_SPILL;
    }
    CUresult r = vg_real.cuMemAllocManaged(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS) {
        if (kind != VG_KIND_SPILL) vg_state_uncharge(dev, bytesize, VG_KIND_DEVICE);
        return r;
    }
    if (kind == VG_KIND_SPILL) vg_state_charge(dev, bytesize, VG_KIND_SPILL, 0);
    remember(&allocs, *dptr, bytesize, dev, kind);
    return r;
}

CUresult vg_impl_cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult r = vg_real.cuMemFree_v2(dptr);
    vg_alloc a;
    if (r == CUDA_SUCCESS && forget(&allocs, dptr, &a)) release(&a);
    return r;
}

CUresult vg_impl_cuMemFree(unsigned int dptr)
{
    CUresult r = vg_real.cuMemFree(dptr);
    vg_alloc a;
    if (r == CUDA_SUCCESS && forget(&allocs, dptr, &a)) release(&a);
    return r;
}

/* ---- stream-ordered allocations and pools ----
 * Charged when requested, uncharged when the free is enqueued: the limit holds
 * for what the workload holds. Memory a pool keeps cached above that (release
 * threshold > 0) is not charged; see docs/shim.md. */
struct async_args { size_t bytes; CUstream s; CUmemoryPool pool; int ptsz; int from_pool; };

static CUresult do_async(CUdeviceptr *dptr, void *arg)
{
    struct async_args *a = arg;
    if (a->from_pool)
        return a->ptsz ? vg_real.cuMemAllocFromPoolAsync_ptsz(dptr, a->bytes, a->pool, a->s)
                       : vg_real.cuMemAllocFromPoolAsync(dptr, a->bytes, a->pool, a->s);
    return a->ptsz ? vg_real.cuMemAllocAsync_ptsz(dptr, a->bytes, a->s)
                   : vg_real.cuMemAllocAsync(dptr, a->bytes, a->s);
}

static CUresult alloc_async(CUdeviceptr *dptr, struct async_args *a)
{
    CUdevice dev;
    if (!dptr || a->bytes == 0 || !vg_current_device(&dev)) return do_async(dptr, a);
    return alloc_linear(dptr, a->bytes, dev, do_async, a);
}

CUresult vg_impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    struct async_args a = {bytesize, hStream, NULL, 0, 0};
    return alloc_async(dptr, &a);
}

CUresult vg_impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    struct async_args a = {bytesize, hStream, NULL, 1, 0};
    return alloc_async(dptr, &a);
}

CUresult vg_impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    struct async_args a = {bytesize, hStream, pool, 0, 1};
    return alloc_async(dptr, &a);
}

CUresult vg_impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream)
{
    struct async_args a = {bytesize, hStream, pool, 1, 1};
    return alloc_async(dptr, &a);
}

static CUresult free_async(CUdeviceptr dptr, CUstream s, int ptsz)
{
    vg_alloc a;
    if (peek(&allocs, dptr, &a) && a.kind == VG_KIND_SPILL) {
        /* a spilled block is managed memory: the stream-ordered free would refuse it */
        CUresult r = vg_real.cuMemFree_v2(dptr);
        if (r == CUDA_SUCCESS && forget(&allocs, dptr, &a)) release(&a);
        return r;
    }
    CUresult r = ptsz ? vg_real.cuMemFreeAsync_ptsz(dptr, s) : vg_real.cuMemFreeAsync(dptr, s);
    if (r == CUDA_SUCCESS && forget(&allocs, dptr, &a)) release(&a);
    return r;
}

CUresult vg_impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, 0);
}

CUresult vg_impl_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, 1);
}

/* ---- virtual memory management: physical memory is taken by cuMemCreate ---- */
CUresult vg_impl_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vg_real.cuMemCreate(handle, size, prop, flags); /* host/NUMA: not device memory */
    int dev = prop->location.id;
    if (dev < 0) return vg_real.cuMemCreate(handle, size, prop, flags);
    vg_context_charge(dev);
    if (vg_state_charge(dev, size, VG_KIND_DEVICE, 0) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vg_real.cuMemCreate(handle, size, prop, flags);
    if (r == CUDA_SUCCESS) remember(&allocs, *handle, size, dev, VG_KIND_DEVICE);
    else vg_state_uncharge(dev, size, VG_KIND_DEVICE);
    return r;
}

CUresult vg_impl_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = vg_real.cuMemRelease(handle);
    vg_alloc a;
    if (r == CUDA_SUCCESS && forget(&allocs, handle, &a)) release(&a);
    return r;
}

/* ---- arrays (sizes estimated from the descriptor before the driver is asked) ---- */
static CUresult charge_array(uint64_t bytes, CUdevice *dev)
{
    if (!vg_current_device(dev)) return CUDA_ERROR_INVALID_CONTEXT;
    vg_context_charge(*dev);
    return vg_state_charge(*dev, bytes, VG_KIND_DEVICE, 0) ? CUDA_ERROR_OUT_OF_MEMORY
                                                           : CUDA_SUCCESS;
}

CUresult vg_impl_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CUdevice dev;
    if (!pHandle || !d) return vg_real.cuArrayCreate_v2(pHandle, d);
    uint64_t bytes = vg_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    CUresult c = charge_array(bytes, &dev);
    if (c == CUDA_ERROR_INVALID_CONTEXT) return vg_real.cuArrayCreate_v2(pHandle, d);
    if (c != CUDA_SUCCESS) return c;
    CUresult r = vg_real.cuArrayCreate_v2(pHandle, d);
    if (r == CUDA_SUCCESS) remember(&arrays, (uint64_t)(uintptr_t)*pHandle, bytes, dev, 0);
    else vg_state_uncharge(dev, bytes, VG_KIND_DEVICE);
    return r;
}

CUresult vg_impl_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CUdevice dev;
    if (!pHandle || !d) return vg_real.cuArray3DCreate_v2(pHandle, d);
    uint64_t bytes = vg_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    CUresult c = charge_array(bytes, &dev);
    if (c == CUDA_ERROR_INVALID_CONTEXT) return vg_real.cuArray3DCreate_v2(pHandle, d);
    if (c != CUDA_SUCCESS) return c;
    CUresult r = vg_real.cuArray3DCreate_v2(pHandle, d);
    if (r == CUDA_SUCCESS) remember(&arrays, (uint64_t)(uintptr_t)*pHandle, bytes, dev, 0);
    else vg_state_uncharge(dev, bytes, VG_KIND_DEVICE);
    return r;
}

CUresult vg_impl_cuArrayDestroy(CUarray hArray)
{
    CUresult r = vg_real.cuArrayDestroy(hArray);
    vg_alloc a;
    if (r == CUDA_SUCCESS && forget(&arrays, (uint64_t)(uintptr_t)hArray, &a)) release(&a);
    return r;
}

CUresult vg_impl_cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                        const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    CUdevice dev;
    if (!pHandle || !d) return vg_real.cuMipmappedArrayCreate(pHandle, d, levels);
    uint64_t bytes = vg_mipmap_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                                     levels);
    CUresult c = charge_array(bytes, &dev);
    if (c == CUDA_ERROR_INVALID_CONTEXT) return vg_real.cuMipmappedArrayCreate(pHandle, d, levels);
    if (c != CUDA_SUCCESS) return c;
    CUresult r = vg_real.cuMipmappedArrayCreate(pHandle, d, levels);
    if (r == CUDA_SUCCESS) remember(&arrays, (uint64_t)(uintptr_t)*pHandle, bytes, dev, 0);
    else vg_state_uncharge(dev, bytes, VG_KIND_DEVICE);
    return r;
}

CUresult vg_impl_cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    CUresult r = vg_real.cuMipmappedArrayDestroy(h);
    vg_alloc a;
    if (r == CUDA_SUCCESS && forget(&arrays, (uint64_t)(uintptr_t)h, &a)) release(&a);
    return r;
}

/* ---- what the workload is told: total = limit, free = limit - container usage ---- */
static int limited(int dev)
{
    return dev >= 0 && dev < VG_MAX_DEVICES && (vg_cfg.deny || vg_cfg.dev[dev].memory_limit);
}

static void slice_info(int dev, uint64_t *free_b, uint64_t *total_b)
{
    uint64_t limit = vg_cfg.deny ? 0 : vg_cfg.dev[dev].memory_limit;
    uint64_t used = vg_state_used(dev);
    *total_b = limit;
    *free_b = used < limit ? limit - used : 0;
}

CUresult vg_impl_cuMemGetInfo_v2(size_t *free_out, size_t *total_out)
{
    size_t f = 0, t = 0; /* NULL outputs are tolerated (HC#333) */
    CUresult r = vg_real.cuMemGetInfo_v2(&f, &t);
    CUdevice dev;
    if (r == CUDA_SUCCESS && vg_current_device(&dev) && limited(dev)) {
        vg_context_charge(dev);
        uint64_t fb, tb;
        slice_info(dev, &fb, &tb);
        f = (size_t)fb;
        t = (size_t)tb;
    }
    if (r == CUDA_SUCCESS) {
        if (free_out) *free_out = f;
        if (total_out) *total_out = t;
    }
    return r;
}

static unsigned int clamp32(uint64_t v) { return v > 0xffffffffu ? 0xffffffffu : (unsigned)v; }

CUresult vg_impl_cuMemGetInfo(unsigned int *free_out, unsigned int *total_out)
{
    size_t f = 0, t = 0;
    CUresult r = vg_impl_cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        if (free_out) *free_out = clamp32(f);
        if (total_out) *total_out = clamp32(t);
    }
    return r;
}

CUresult vg_impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (!bytes) return vg_real.cuDeviceTotalMem_v2(bytes, dev);
    CUresult r = vg_real.cuDeviceTotalMem_v2(bytes, dev);
    if (r == CUDA_SUCCESS && limited(dev)) *bytes = (size_t)(vg_cfg.deny ? 0 : vg_cfg.dev[dev].memory_limit);
    return r;
}

CUresult vg_impl_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    if (!bytes) return vg_real.cuDeviceTotalMem(bytes, dev);
    size_t b = 0;
    CUresult r = vg_real.cuDeviceTotalMem_v2 ? vg_impl_cuDeviceTotalMem_v2(&b, dev)
                                             : vg_real.cuDeviceTotalMem(bytes, dev);
    if (r == CUDA_SUCCESS && vg_real.cuDeviceTotalMem_v2) *bytes = clamp32(b);
    return r;
}

/* ---- contexts ---- */
CUresult vg_impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (r == CUDA_SUCCESS) vg_context_charge(dev);
    return r;
}

CUresult vg_impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult r = vg_real.cuCtxCreate_v2(pctx, flags, dev);
    if (r == CUDA_SUCCESS) vg_context_charge(dev);
    return r;
}

CUresult vg_impl_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags,
                                CUdevice dev)
{
    CUresult r = vg_real.cuCtxCreate_v3(pctx, p, n, flags, dev);
    if (r == CUDA_SUCCESS) vg_context_charge(dev);
    return r;
}

CUresult vg_impl_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                                CUdevice dev)
{
    CUresult r = vg_real.cuCtxCreate_v4(pctx, p, flags, dev);
    if (r == CUDA_SUCCESS) vg_context_charge(dev);
    return r;
}
