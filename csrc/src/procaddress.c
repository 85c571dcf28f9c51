/* cuGetProcAddress / cuGetProcAddress_v2: the driver resolves (name, cudaVersion,
 * flags) to an entry point with the ABI the caller expects; we then swap that
 * pointer for the hook of the same entry point (pointer identity, routing.c). A
 * lookup of cuGetProcAddress itself returns our hook, so later lookups made
 * through the returned pointer stay routed. */
#include "shim.h"

static void route(CUresult r, void **pfn)
{
    if (r != CUDA_SUCCESS || !pfn || !*pfn) return;
    void *hook = vg_route_pointer(*pfn);
    if (hook) *pfn = hook;
}

CUresult vg_impl_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags)
{
    CUresult r = vg_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    route(r, pfn);
    return r;
}

CUresult vg_impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    CUresult r = vg_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
    route(r, pfn);
    return r;
}
