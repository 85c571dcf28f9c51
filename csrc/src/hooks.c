/* The entry points: every exported wrapper, generated from hooks.def, the routing of
 * a real driver pointer to its wrapper, and cuGetProcAddress. One symbol list
 * (hooks.def) makes all three, so no hooked name can be missing from one of them.
 *
 * Each wrapper:
 *   - passes straight to the driver when this thread is already inside the shim and
 *     the caller is the driver, NVML or the shim (their own calls to exported names);
 *     any other caller there is foreign code run while this thread was inside: a
 *     signal handler, a profiler's callback. It is hooked like any call, or refused
 *     while this thread holds one of the shim's locks (never passed through: that was
 *     the way past every hook);
 *   - runs the lazy one-time initialisation;
 *   - answers NOT_FOUND when the driver lacks the symbol (older driver);
 *   - otherwise runs vg_impl_<name> with the guard set, and restores the guard's
 *     previous value afterwards (never resets it: safe even if hooks ever nest).
 *
 * Pointer-identity routing: a pointer the real driver hands out (through dlsym or
 * cuGetProcAddress) is replaced by our hook for exactly that entry point. The
 * driver has already chosen the ABI (legacy/_v2/_ptsz, by name, cudaVersion and
 * flags), so the hook we return always has the caller's expected signature.
 *
 * cuGetProcAddress / cuGetProcAddress_v2: the driver resolves (name, cudaVersion,
 * flags) to an entry point with the ABI the caller expects; we then swap that
 * pointer for the hook of the same entry point. A lookup of cuGetProcAddress itself
 * returns our hook, so later lookups made through the returned pointer stay routed. */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

#define HOOK(lib, name, ret, params, args) ret vg_impl_##name params;
#include "hooks.def"

#define HOOK(lib, name, ret, params, args)                                \
    VG_EXPORT ret name params                                             \
    {                                                                     \
        if (vg_tls_guard) {                                               \
            if (vg_own_caller(__builtin_return_address(0)))               \
                return vg_real.name ? vg_real.name args : VG_MISSING_##lib; \
            if (vg_tls_locks || !vg_init_done()) return VG_REFUSED_##lib;   \
        }                                                                 \
        int saved_ = vg_tls_guard;                                        \
        vg_tls_guard = 1;                                                 \
        vg_init();                                                        \
        ret r_ = vg_real.name ? vg_impl_##name args : VG_MISSING_##lib;   \
        vg_tls_guard = saved_;                                            \
        return r_;                                                        \
    }
#include "hooks.def"

/* ---- routing ---- */
typedef struct vg_route { const char *name; void **real; void *hook; } vg_route;

static const vg_route routes[] = {
#define HOOK(lib, name, ret, params, args) {#name, (void **)&vg_real.name, (void *)&name},
#include "hooks.def"
};

#define NROUTES (sizeof routes / sizeof *routes)

VG_NO_SANITIZE void *vg_route_pointer(void *real_fn)
{
    if (!real_fn) return NULL;
    for (size_t i = 0; i < NROUTES; i++)
        if (*routes[i].real == real_fn) return routes[i].hook;
    return NULL;
}

VG_NO_SANITIZE int vg_is_hooked_name(const char *name)
{
    for (size_t i = 0; i < NROUTES; i++)
        if (!strcmp(routes[i].name, name)) return 1;
    return 0;
}

/* ---- cuGetProcAddress ---- */
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
