/* Virtual memory management (cuMemCreate / cuMemMap / cuMemUnmap / cuMemRelease).
 *
 * Physical memory is taken by cuMemCreate and lives while its handle is held OR
 * mapped: NVIDIA's samples (and PyTorch's expandable segments) release the handle
 * right after mapping it, and the memory stays until the last cuMemUnmap. So a handle
 * is charged at cuMemCreate and given back only when it has been released and has no
 * mapping left. Mappings are recorded by virtual address; one cuMemUnmap may cover
 * several of them.
 *
 * Every handle to the allocation holds it: cuMemRetainAllocationHandle (a mapped
 * address's handle, one more reference) and an import of this process's own export
 * each need their cuMemRelease before the memory goes, however early the creator's
 * handle was released (issue 22, finding 3: retained, the memory lived on uncharged).
 * An import of another process's export is that process's memory, charged there.
 *
 * A handle this process exported (cuMemExportToShareableHandle) is marked: an import of
 * the descriptor, here or in another process, may keep the memory after this process has
 * released and unmapped it, and NVML counts it for this process then. The charge given
 * back at that point is measured again at once (contexts.c), not at most every 100 ms: a
 * loop of create, export, import, release and unmap took 3.3 GiB under a 2 GiB limit
 * between two measurements. */
#include <pthread.h>

#include "shim.h"

VG_MUTEX(vmm_mu);

CUresult vg_impl_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vg_real.cuMemCreate(handle, size, prop, flags); /* host/NUMA: not device memory */
    int dev = vg_dev_index(prop->location.id);
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    vg_context_charge(dev);
    if (vg_state_charge(dev, size, VG_KIND_DEVICE, 0) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = vg_real.cuMemCreate(handle, size, prop, flags);
    if (r == CUDA_SUCCESS)
        vg_remember(VG_T_HANDLE, (vg_alloc){.key = *handle, .bytes = size, .dev = dev,
                                            .holds = 1});
    else
        vg_state_uncharge(dev, size, VG_KIND_DEVICE);
    return r;
}

CUresult vg_impl_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = vg_real.cuMemRelease(handle);
    if (r != CUDA_SUCCESS) return r;
    vg_alloc a;
    vg_lock(&vmm_mu);
    int gone = 0;
    if (vg_peek(VG_T_HANDLE, handle, &a)) {
        if (a.holds > 1) { /* another handle (a retain, an import) still holds it */
            a.holds--;
            vg_remember(VG_T_HANDLE, a);
        } else if (a.refs > 0) { /* still mapped: the memory lives until the last unmap */
            a.holds = 0;
            a.flags |= VG_F_RELEASED;
            vg_remember(VG_T_HANDLE, a);
        } else {
            gone = vg_forget(VG_T_HANDLE, handle, &a);
        }
    }
    vg_unlock(&vmm_mu);
    if (gone) vg_release(&a);
    if (gone && (a.flags & VG_F_EXPORTED)) vg_context_untracked_now(a.dev);
    return r;
}

CUresult vg_impl_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CUresult r = vg_real.cuMemMap(ptr, size, offset, handle, flags);
    if (r != CUDA_SUCCESS) return r;
    vg_alloc a;
    vg_lock(&vmm_mu);
    if (vg_peek(VG_T_HANDLE, handle, &a)) {
        a.refs++;
        vg_remember(VG_T_HANDLE, a);
        vg_remember(VG_T_MAP, (vg_alloc){.key = ptr, .bytes = size, .aux = handle,
                                         .dev = a.dev});
    }
    vg_unlock(&vmm_mu);
    return r;
}

struct unmap { uint64_t lo, hi, measure; /* devices whose exported memory went */ };

static int unmapped(vg_alloc *m, void *arg)
{
    struct unmap *u = arg;
    if (m->key < u->lo || m->key >= u->hi) return 0;
    vg_alloc h;
    if (vg_peek(VG_T_HANDLE, m->aux, &h)) {
        if (h.refs > 0) h.refs--;
        if (h.refs == 0 && (h.flags & VG_F_RELEASED)) {
            vg_forget(VG_T_HANDLE, h.key, NULL);
            vg_release(&h);
            if ((h.flags & VG_F_EXPORTED) && h.dev >= 0 && h.dev < 64) u->measure |= 1ull << h.dev;
        } else {
            vg_remember(VG_T_HANDLE, h);
        }
    }
    return 1;
}

CUresult vg_impl_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = vg_real.cuMemUnmap(ptr, size);
    if (r != CUDA_SUCCESS) return r;
    struct unmap u = {ptr, ptr + size > ptr ? ptr + size : UINT64_MAX, 0};
    vg_lock(&vmm_mu);
    vg_each(VG_T_MAP, unmapped, &u);
    vg_unlock(&vmm_mu);
    vg_context_untracked_now_on(u.measure);
    return r;
}

/* one more handle to an allocation this process charged: it holds the memory too */
static void held_again(CUmemGenericAllocationHandle handle)
{
    vg_alloc a;
    vg_lock(&vmm_mu);
    if (vg_peek(VG_T_HANDLE, handle, &a)) {
        a.holds = (a.flags & VG_F_RELEASED) ? 1 : a.holds + 1;
        a.flags &= ~VG_F_RELEASED;
        vg_remember(VG_T_HANDLE, a);
    }
    vg_unlock(&vmm_mu);
}

CUresult vg_impl_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult r = vg_real.cuMemRetainAllocationHandle(handle, addr);
    if (r == CUDA_SUCCESS && handle) held_again(*handle);
    return r;
}

CUresult vg_impl_cuMemExportToShareableHandle(void *shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags)
{
    CUresult r = vg_real.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
    if (r == CUDA_SUCCESS) vg_mark(VG_T_HANDLE, handle, VG_F_EXPORTED);
    return r;
}

CUresult vg_impl_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                void *osHandle,
                                                CUmemAllocationHandleType type)
{
    CUresult r = vg_real.cuMemImportFromShareableHandle(handle, osHandle, type);
    if (r == CUDA_SUCCESS && handle) held_again(*handle); /* this process's own export */
    return r;
}
