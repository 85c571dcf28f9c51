/* Context hooks: contexts made, refused and destroyed.
 *
 * Destroying a context (cuCtxDestroy, the last release of a primary context, or its
 * reset) frees its memory and every allocation made in it, in the driver; the shim
 * gives back the same: the context's charge (contexts.c), and each record that names
 * the context. Pools and VMM handles belong to the device, not to a context; pools are
 * counted again after a teardown (cuda_pool.c). */
#define _GNU_SOURCE
#include <stdint.h>

#include "shim.h"

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
    int dev = vg_context_gone(c);
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
    uint64_t est = vg_context_largest(dev);
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

/* after a release: the primary context is gone once it is no longer active */
static void released(CUresult r, CUdevice ordinal)
{
    unsigned flags = 0;
    int active = 1;
    if (r != CUDA_SUCCESS || !vg_real.cuDevicePrimaryCtxGetState ||
        vg_real.cuDevicePrimaryCtxGetState(ordinal, &flags, &active) != CUDA_SUCCESS || active)
        return;
    teardown(vg_context_primary(ordinal));
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
    if (r == CUDA_SUCCESS) teardown(vg_context_primary(dev));
    return r;
}

CUresult vg_impl_cuDevicePrimaryCtxReset(CUdevice dev)
{
    CUresult r = vg_real.cuDevicePrimaryCtxReset(dev);
    if (r == CUDA_SUCCESS) teardown(vg_context_primary(dev));
    return r;
}

/* Green contexts (CUDA 12.4+). cuGreenCtxCreate retains the device's primary context,
 * bringing it up with its memory when it was not, and provisions memory of its own;
 * nobody asked for either. The primary context is retained through the hook first, so it
 * is measured and charged as the primary context it is (and not refused, as no primary
 * context is); then the green context is made and measured as a context of its own,
 * destroyed and refused when it would pass the limit. What is allocated while its
 * CUcontext (cuCtxFromGreenCtx) is current is the primary context's memory (cuda.h): it
 * outlives the green context, so its destruction gives back only the green context's own
 * charge, and hands those records to the primary context, to go with it. */
CUresult vg_impl_cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                                  unsigned int flags)
{
    CUcontext prim = NULL;
    CUresult r = vg_impl_cuDevicePrimaryCtxRetain(&prim, dev);
    if (r != CUDA_SUCCESS) return r;
    r = vg_real.cuGreenCtxCreate(phCtx, desc, dev, flags);
    CUcontext view = NULL;
    if (r == CUDA_SUCCESS && phCtx && *phCtx && vg_real.cuCtxFromGreenCtx &&
        vg_real.cuCtxFromGreenCtx(&view, *phCtx) == CUDA_SUCCESS && view) {
        vg_context_created(view, dev, 0);
        int d = vg_dev_index(dev);
        if (d >= 0 && vg_state_over_limit(d, 0) && vg_real.cuGreenCtxDestroy(*phCtx) == CUDA_SUCCESS) {
            vg_context_gone(view);
            *phCtx = NULL;
            VG_INFO("a green context on device %d would pass the memory limit: refused", d);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    vg_impl_cuDevicePrimaryCtxRelease_v2(dev); /* the green context holds its own */
    return r;
}

CUresult vg_impl_cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    CUcontext view = NULL;
    if (!vg_real.cuCtxFromGreenCtx || vg_real.cuCtxFromGreenCtx(&view, hCtx) != CUDA_SUCCESS)
        view = NULL;
    vg_alloc rec;
    int known = view && vg_peek(VG_T_CTX, (uint64_t)(uintptr_t)view, &rec);
    CUresult r = vg_real.cuGreenCtxDestroy(hCtx);
    if (r != CUDA_SUCCESS || !known) return r;
    vg_context_gone(view);
    int ordinal = vg_dev_ordinal(rec.dev);
    CUcontext prim = vg_context_primary(ordinal);
    uint64_t from = (uint64_t)(uintptr_t)view, to = (uint64_t)(uintptr_t)prim;
    vg_rekey_ctx(VG_T_PTR, from, to);
    vg_rekey_ctx(VG_T_ARRAY, from, to);
    released(CUDA_SUCCESS, ordinal); /* its primary context, when that was the last hold */
    return r;
}
