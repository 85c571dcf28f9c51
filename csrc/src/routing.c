/* Pointer-identity routing: a pointer the real driver hands out (through dlsym or
 * cuGetProcAddress) is replaced by our hook for exactly that entry point. The
 * driver has already chosen the ABI (legacy/_v2/_ptsz, by name, cudaVersion and
 * flags), so the hook we return always has the caller's expected signature. */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

typedef struct vg_route { const char *name; void **real; void *hook; } vg_route;

#define HOOK(lib, name, ret, params, args) ret name params;
#include "hooks.def"

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
