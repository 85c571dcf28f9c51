/* The exported wrappers, generated from hooks.def. Each one:
 *   - passes straight to the driver when this thread is already inside the shim and
 *     the caller is the driver, NVML or the shim (their own calls to exported names);
 *     any other caller there is foreign code run while this thread was inside: a
 *     signal handler, a profiler's callback. It is hooked like any call, or refused
 *     while this thread holds one of the shim's locks (never passed through: that was
 *     the way past every hook);
 *   - runs the lazy one-time initialisation;
 *   - answers NOT_FOUND when the driver lacks the symbol (older driver);
 *   - otherwise runs vg_impl_<name> with the guard set, and restores the guard's
 *     previous value afterwards (never resets it: safe even if hooks ever nest). */
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
