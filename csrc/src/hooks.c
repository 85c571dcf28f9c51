/* The exported wrappers, generated from hooks.def. Each one:
 *   - passes straight to the driver when this thread is already inside the shim
 *     (the driver calling its own exported symbols, or our own calls);
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
        if (vg_tls_guard)                                                 \
            return vg_real.name ? vg_real.name args : VG_MISSING_##lib;   \
        int saved_ = vg_tls_guard;                                        \
        vg_tls_guard = 1;                                                 \
        vg_init();                                                        \
        ret r_ = vg_real.name ? vg_impl_##name args : VG_MISSING_##lib;   \
        vg_tls_guard = saved_;                                            \
        return r_;                                                        \
    }
#include "hooks.def"
