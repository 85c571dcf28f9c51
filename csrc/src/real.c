/* The real entry points, and the per-thread flags every hook reads.
 *
 * The bottom of the shim: every other file may use what is here, and nothing here
 * calls into another file of the shim (tests/shim/test_build.py checks that the
 * files' dependencies run one way). dispatch.c fills the table at the first hook.
 *
 * The real dlsym comes from dlvsym(RTLD_NEXT, "dlsym", <glibc version>): dlvsym is
 * not overridden, so this never recurses into our own dlsym. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "shim.h"

struct vg_real_table vg_real;
VG_TLS int vg_tls_guard;
VG_TLS int vg_tls_locks;

static int init_done;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;

VG_NO_SANITIZE static dlsym_fn find_real_dlsym(void)
{
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof *versions; i++) {
        void *p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (p) return (dlsym_fn)p;
    }
    return NULL;
}

VG_NO_SANITIZE void *vg_real_dlsym_fn(void)
{
    dlsym_fn f = __atomic_load_n(&real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (!f) {
        f = find_real_dlsym();
        if (f) __atomic_store_n(&real_dlsym_ptr, f, __ATOMIC_RELEASE);
    }
    return (void *)f;
}

VG_NO_SANITIZE void *vg_real_dlsym(void *handle, const char *name)
{
    dlsym_fn f = (dlsym_fn)vg_real_dlsym_fn();
    return f ? f(handle, name) : NULL;
}

void vg_real_resolve(void *handle, int want_nvml)
{
#define HOOK(lib, name, ret, params, args) RESOLVE_##lib(name)
#define REAL(lib, name, ret, params) RESOLVE_##lib(name)
#define RESOLVE_CU(name) if (!want_nvml) *(void **)&vg_real.name = vg_real_dlsym(handle, #name);
#define RESOLVE_NVML(name) if (want_nvml) *(void **)&vg_real.name = vg_real_dlsym(handle, #name);
#include "hooks.def"
#undef RESOLVE_CU
#undef RESOLVE_NVML
}

const char *vg_real_dlerror(void)
{
    char *(*real)(void) = NULL;
    *(void **)&real = vg_real_dlsym(RTLD_NEXT, "dlerror");
    const char *e = real ? real() : NULL;
    return e ? e : "unknown error";
}

void vg_set_init_done(void) { __atomic_store_n(&init_done, 1, __ATOMIC_RELEASE); }
int vg_init_done(void) { return __atomic_load_n(&init_done, __ATOMIC_ACQUIRE); }
