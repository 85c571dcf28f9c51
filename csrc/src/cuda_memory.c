/* Device-memory hooks: linear allocations, arrays, and what the workload is told.
 *
 * Every path that takes device memory is charged before the driver is asked (so the
 * container never goes over its limit, even for an instant, summed over its
 * processes) and uncharged when the driver fails or the memory is freed. Devices are
 * the config's (devmap.c: by UUID), never raw CUDA ordinals. Each record keeps the
 * context it was made in, so a destroyed context gives back what the driver freed
 * with it (cuda_context.c). Virtual memory management is in cuda_vmm.c, stream-ordered
 * pools and graph memory in cuda_pool.c.
 *
 * Oversubscription (device.N.oversubscribe=1): when the driver itself is out of memory
 * (the GPU's physical memory is shared past its size), a linear or managed allocation
 * is served from managed memory instead and counted as spilled; spilled bytes are
 * bounded by device.N.spill_limit, and device plus spilled bytes by memory_limit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

int vg_oversubscribed(int dev)
{
    return !vg_cfg.deny && dev >= 0 && dev < VG_MAX_DEVICES && vg_cfg.dev[dev].oversubscribe;
}

static void keep(int table, uint64_t key, uint64_t bytes, int dev, int kind)
{
    vg_remember(table, (vg_alloc){.key = key, .bytes = bytes, .dev = dev, .kind = kind,
                                  .ctx = vg_current_ctx()});
}

/* ---- linear allocations ---- */
typedef CUresult (*alloc_fn)(CUdeviceptr *dptr, void *arg);

/* spill: managed memory the driver migrates on demand, counted as spilled */
static CUresult spill(CUdeviceptr *dptr, uint64_t bytes, int dev)
{
    if (!vg_real.cuMemAllocManaged || vg_state_charge(dev, bytes, VG_KIND_SPILL, 0) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vg_real.cuMemAllocManaged(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (r != CUDA_SUCCESS) {
        vg_state_uncharge(dev, bytes, VG_KIND_SPILL);
        return r;
    }
    keep(VG_T_PTR, *dptr, bytes, dev, VG_KIND_SPILL);
    VG_DEBUG("spilled %llu bytes of device %d into managed memory", (unsigned long long)bytes,
             dev);
    return CUDA_SUCCESS;
}

static CUresult alloc_linear(CUdeviceptr *dptr, uint64_t bytes, int dev, alloc_fn do_alloc,
                             void *arg, int *spilled)
{
    vg_context_charge(dev);
    if (vg_state_charge(dev, bytes, VG_KIND_DEVICE, 0) != 0) {
        if (vg_pools_dirty) { /* a pool may have given memory back: recount, try once more */
            vg_pools_reconcile(dev);
            if (vg_state_charge(dev, bytes, VG_KIND_DEVICE, 0) == 0) goto charged;
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
charged:;
    CUresult r = do_alloc(dptr, arg);
    if (r == CUDA_SUCCESS) {
        keep(VG_T_PTR, *dptr, bytes, dev, VG_KIND_DEVICE);
        return r;
    }
    vg_state_uncharge(dev, bytes, VG_KIND_DEVICE);
    if (r != CUDA_ERROR_OUT_OF_MEMORY || !vg_oversubscribed(dev)) return r;
    /* the GPU is physically full: spill, if this container may */
    r = spill(dptr, bytes, dev);
    if (r == CUDA_SUCCESS && spilled) *spilled = 1;
    return r;
}

static CUresult do_mem_alloc(CUdeviceptr *dptr, void *arg)
{
    return vg_real.cuMemAlloc_v2(dptr, *(size_t *)arg);
}

CUresult vg_impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    int dev;
    if (!dptr || bytesize == 0 || !vg_current(NULL, &dev))
        return vg_real.cuMemAlloc_v2(dptr, bytesize); /* the driver's own error */
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    return alloc_linear(dptr, bytesize, dev, do_mem_alloc, &bytesize, NULL);
}

static CUresult do_mem_alloc32(CUdeviceptr *dptr, void *arg)
{
    unsigned int p = 0;
    CUresult r = vg_real.cuMemAlloc(&p, *(unsigned int *)arg);
    *dptr = p;
    return r;
}

CUresult vg_impl_cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
    int dev;
    if (!dptr || bytesize == 0 || !vg_current(NULL, &dev))
        return vg_real.cuMemAlloc(dptr, bytesize);
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    vg_context_charge(dev);
    if (vg_state_charge(dev, bytesize, VG_KIND_DEVICE, 0) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr p = 0;
    CUresult r = do_mem_alloc32(&p, &bytesize); /* 32-bit pointers: never spilled */
    if (r == CUDA_SUCCESS) {
        *dptr = (unsigned int)p;
        keep(VG_T_PTR, p, bytesize, dev, VG_KIND_DEVICE);
    } else {
        vg_state_uncharge(dev, bytesize, VG_KIND_DEVICE);
    }
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
    int dev;
    if (!dptr || !pPitch || !WidthInBytes || !Height || !vg_current(NULL, &dev))
        return vg_real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t est_pitch = 0;
    uint64_t est = vg_pitch_bytes(WidthInBytes, Height, &est_pitch);
    struct pitch_args a = {pPitch, WidthInBytes, Height, ElementSizeBytes};
    int spilled = 0;
    CUresult r = alloc_linear(dptr, est, dev, do_pitch, &a, &spilled);
    if (r != CUDA_SUCCESS) return r;
    if (spilled) { /* managed memory has no pitch of its own: ours is the contract */
        *pPitch = est_pitch;
        return r;
    }
    /* the driver chose the pitch: charge any difference to the estimate */
    uint64_t real = (uint64_t)*pPitch * Height;
    vg_alloc rec;
    if (real > est && vg_peek(VG_T_PTR, *dptr, &rec)) {
        if (vg_state_charge(dev, real - est, VG_KIND_DEVICE, 0) != 0) {
            vg_forget(VG_T_PTR, *dptr, &rec);
            vg_real.cuMemFree_v2(*dptr);
            vg_release(&rec);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        rec.bytes = real;
        vg_remember(VG_T_PTR, rec);
    }
    return r;
}

/* the pre-3.2 entry point: 32-bit pointer, pitch and sizes; never spilled (managed memory
 * has no 32-bit address to give) */
CUresult vg_impl_cuMemAllocPitch(unsigned int *dptr, unsigned int *pPitch,
                                 unsigned int WidthInBytes, unsigned int Height,
                                 unsigned int ElementSizeBytes)
{
    int dev;
    if (!dptr || !pPitch || !WidthInBytes || !Height || !vg_current(NULL, &dev))
        return vg_real.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t est_pitch = 0;
    uint64_t est = vg_pitch_bytes(WidthInBytes, Height, &est_pitch);
    vg_context_charge(dev);
    if (vg_state_charge(dev, est, VG_KIND_DEVICE, 0) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vg_real.cuMemAllocPitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        vg_state_uncharge(dev, est, VG_KIND_DEVICE);
        return r;
    }
    uint64_t real = (uint64_t)*pPitch * Height, bytes = est;
    if (real > est) { /* the driver chose a wider pitch: charge the difference */
        if (vg_state_charge(dev, real - est, VG_KIND_DEVICE, 0) != 0) {
            vg_real.cuMemFree(*dptr);
            vg_state_uncharge(dev, est, VG_KIND_DEVICE);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        bytes = real;
    }
    keep(VG_T_PTR, *dptr, bytes, dev, VG_KIND_DEVICE);
    return r;
}

CUresult vg_impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    /* Managed memory can be resident on the device: it counts against the limit
     * like device memory (beyond the limit only with oversubscribe=1, as spill). */
    int dev;
    if (!dptr || bytesize == 0 || !vg_current(NULL, &dev))
        return vg_real.cuMemAllocManaged(dptr, bytesize, flags);
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    vg_context_charge(dev);
    int kind = VG_KIND_MANAGED;
    if (vg_state_charge(dev, bytesize, VG_KIND_DEVICE, 0) != 0) {
        if (!vg_oversubscribed(dev) || vg_state_charge(dev, bytesize, VG_KIND_SPILL, 0) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        kind = VG_KIND_SPILL;
    }
    CUresult r = vg_real.cuMemAllocManaged(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS) {
        vg_state_uncharge(dev, bytesize, kind == VG_KIND_SPILL ? VG_KIND_SPILL : VG_KIND_DEVICE);
        return r;
    }
    keep(VG_T_PTR, *dptr, bytesize, dev, kind);
    return r;
}

/* A free forgets the shim's record *before* the driver frees: the driver may hand the
 * address to another thread's allocation the moment it is free (and a free can block),
 * and a forget after it would take that allocation's record. The charge is given back
 * once the driver has freed; a free the driver refuses gets its record back. */
CUresult vg_impl_cuMemFree_v2(CUdeviceptr dptr)
{
    vg_alloc a;
    int known = vg_forget(VG_T_PTR, dptr, &a);
    CUresult r = vg_real.cuMemFree_v2(dptr);
    if (!known) return r;
    if (r != CUDA_SUCCESS) {
        vg_remember(VG_T_PTR, a);
        return r;
    }
    vg_release(&a);
    if (a.kind == VG_KIND_POOL) vg_pools_reconcile(a.dev); /* freed and synchronised */
    if (a.flags & VG_F_EXPORTED) vg_context_exported_freed(a.dev); /* an opener may keep it */
    return r;
}

CUresult vg_impl_cuMemFree(unsigned int dptr)
{
    vg_alloc a;
    int known = vg_forget(VG_T_PTR, dptr, &a);
    CUresult r = vg_real.cuMemFree(dptr);
    if (!known) return r;
    if (r != CUDA_SUCCESS) {
        vg_remember(VG_T_PTR, a);
        return r;
    }
    vg_release(&a);
    if (a.flags & VG_F_EXPORTED) vg_context_exported_freed(a.dev);
    return r;
}

/* Legacy IPC: another process that opens the handle maps this allocation, and a real
 * driver keeps it allocated while it is open there, even after this process frees it:
 * NVML counts it for this process while it holds it, for the opener from its free on.
 * The record is marked so that its free measures at once both this process's untracked
 * memory and what the container's other processes now hold uncharged (contexts.c); the
 * opener's mapping is not charged while the exporter's allocation is. */
CUresult vg_impl_cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CUresult r = vg_real.cuIpcGetMemHandle(pHandle, dptr);
    if (r == CUDA_SUCCESS) vg_mark(VG_T_PTR, dptr, VG_F_EXPORTED);
    return r;
}

/* The opener's close: a mapping whose exporter has freed it was this process's memory in
 * NVML's eyes (charged here by vg_context_exported_freed, or by a measurement), and it goes
 * with the last close: measured at once, so that the charge goes with it. */
CUresult vg_impl_cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult r = vg_real.cuIpcCloseMemHandle(dptr);
    if (r == CUDA_SUCCESS) vg_context_untracked_now_on(~0ull); /* its device is not known */
    return r;
}

/* ---- arrays (sizes estimated from the descriptor before the driver is asked) ---- */
static CUresult charge_array(uint64_t bytes, int *dev)
{
    if (!vg_current(NULL, dev)) return CUDA_ERROR_INVALID_CONTEXT;
    if (*dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    vg_context_charge(*dev);
    return vg_state_charge(*dev, bytes, VG_KIND_DEVICE, 0) ? CUDA_ERROR_OUT_OF_MEMORY
                                                           : CUDA_SUCCESS;
}

#define ARRAY_CREATE(call, handle, bytes)                                      \
    do {                                                                       \
        int dev_;                                                              \
        CUresult c_ = charge_array((bytes), &dev_);                            \
        if (c_ == CUDA_ERROR_INVALID_CONTEXT) return call;                     \
        if (c_ != CUDA_SUCCESS) return c_;                                     \
        CUresult r_ = call;                                                    \
        if (r_ == CUDA_SUCCESS)                                                \
            keep(VG_T_ARRAY, (uint64_t)(uintptr_t)*(handle), (bytes), dev_, 0); \
        else                                                                   \
            vg_state_uncharge(dev_, (bytes), VG_KIND_DEVICE);                  \
        return r_;                                                             \
    } while (0)

CUresult vg_impl_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!pHandle || !d) return vg_real.cuArrayCreate_v2(pHandle, d);
    uint64_t bytes = vg_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    ARRAY_CREATE(vg_real.cuArrayCreate_v2(pHandle, d), pHandle, bytes);
}

CUresult vg_impl_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (!pHandle || !d) return vg_real.cuArray3DCreate_v2(pHandle, d);
    uint64_t bytes = vg_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    ARRAY_CREATE(vg_real.cuArray3DCreate_v2(pHandle, d), pHandle, bytes);
}

CUresult vg_impl_cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (!pHandle || !d) return vg_real.cuArrayCreate(pHandle, d);
    uint64_t bytes = vg_array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    ARRAY_CREATE(vg_real.cuArrayCreate(pHandle, d), pHandle, bytes);
}

CUresult vg_impl_cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (!pHandle || !d) return vg_real.cuArray3DCreate(pHandle, d);
    uint64_t bytes = vg_array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    ARRAY_CREATE(vg_real.cuArray3DCreate(pHandle, d), pHandle, bytes);
}

CUresult vg_impl_cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                        const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    if (!pHandle || !d) return vg_real.cuMipmappedArrayCreate(pHandle, d, levels);
    uint64_t bytes = vg_mipmap_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                                     levels);
    ARRAY_CREATE(vg_real.cuMipmappedArrayCreate(pHandle, d, levels), pHandle, bytes);
}

CUresult vg_impl_cuArrayDestroy(CUarray hArray)
{
    CUresult r = vg_real.cuArrayDestroy(hArray);
    vg_alloc a;
    if (r == CUDA_SUCCESS && vg_forget(VG_T_ARRAY, (uint64_t)(uintptr_t)hArray, &a))
        vg_release(&a);
    return r;
}

CUresult vg_impl_cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    CUresult r = vg_real.cuMipmappedArrayDestroy(h);
    vg_alloc a;
    if (r == CUDA_SUCCESS && vg_forget(VG_T_ARRAY, (uint64_t)(uintptr_t)h, &a)) vg_release(&a);
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
    uint64_t used = vg_state_used(dev) + vg_state_spilled(dev);
    *total_b = limit;
    *free_b = used < limit ? limit - used : 0;
}

CUresult vg_impl_cuMemGetInfo_v2(size_t *free_out, size_t *total_out)
{
    size_t f = 0, t = 0; /* NULL outputs are tolerated (HC#333) */
    CUresult r = vg_real.cuMemGetInfo_v2(&f, &t);
    int dev;
    if (r == CUDA_SUCCESS && vg_current(NULL, &dev)) {
        if (dev < 0) {
            f = t = 0;
        } else if (limited(dev)) {
            vg_context_charge(dev);
            if (vg_pools_dirty) vg_pools_reconcile(dev);
            uint64_t fb, tb;
            slice_info(dev, &fb, &tb);
            f = (size_t)fb;
            t = (size_t)tb;
        }
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

CUresult vg_impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice ordinal)
{
    CUresult r = vg_real.cuDeviceTotalMem_v2(bytes, ordinal);
    if (r != CUDA_SUCCESS || !bytes) return r;
    int dev = vg_dev_index(ordinal);
    if (dev < 0) *bytes = 0;
    else if (limited(dev)) *bytes = (size_t)(vg_cfg.deny ? 0 : vg_cfg.dev[dev].memory_limit);
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
