/* Resolution of the real entry points, and the shim's one-time initialisation.
 *
 * Nothing runs at load time (no constructors: they run inside other people's
 * processes before main and before the driver is wanted). The first hook that is
 * called runs vg_init() through pthread_once: it dlopens libcuda.so.1, resolves
 * every symbol of hooks.def with the real dlsym (a missing one stays NULL), reads
 * the config and attaches the usage state. NVML is loaded later, on first need.
 *
 * The real dlsym comes from dlvsym(RTLD_NEXT, "dlsym", <glibc version>): dlvsym is
 * not overridden, so this never recurses into our own dlsym. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

struct vg_real_table vg_real;
VG_TLS int vg_tls_guard;
VG_TLS int vg_tls_locks;

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_ptr;
static void *cuda_handle, *nvml_handle;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_ok;

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

void *vg_cuda_handle(void) { return cuda_handle; }
static void find_own_ranges(void);
static void after_fork_child(void);
static int init_done, register_pending;

static void resolve(void *handle, int want_nvml)
{
#define HOOK(lib, name, ret, params, args) RESOLVE_##lib(name)
#define REAL(lib, name, ret, params) RESOLVE_##lib(name)
#define RESOLVE_CU(name) if (!want_nvml) *(void **)&vg_real.name = vg_real_dlsym(handle, #name);
#define RESOLVE_NVML(name) if (want_nvml) *(void **)&vg_real.name = vg_real_dlsym(handle, #name);
#include "hooks.def"
#undef RESOLVE_CU
#undef RESOLVE_NVML
}

static void do_init(void)
{
    int saved = vg_tls_guard;
    vg_tls_guard = 1; /* the driver's own calls during dlopen pass straight through */
    pthread_atfork(NULL, NULL, after_fork_child); /* first: a fork may come mid-init */
    cuda_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!cuda_handle) VG_ERROR("libcuda.so.1 not loadable: %s", dlerror());
    else resolve(cuda_handle, 0);
    /* NVML symbols too, so that dlsym/routing can recognise them; NVML itself is
     * only initialised by vg_nvml_ready() */
    nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
    if (nvml_handle) resolve(nvml_handle, 1);
    vg_config_load(&vg_cfg);
    /* a container whose usage state cannot be shared would have each process hold its
     * own limit: named but unusable, the state refuses the GPU instead */
    if (vg_state_attach(&vg_cfg) != 0 && vg_cfg.state_dir[0] && !vg_cfg.deny) {
        VG_ERROR("usage state in %s unusable: GPU memory allocations are refused (the "
                 "container's limit cannot be shared between its processes)", vg_cfg.state_dir);
        vg_cfg.deny = 1;
        snprintf(vg_cfg.error, sizeof vg_cfg.error, "usage state unusable");
    }
    /* registered right after, outside the once: other threads' first calls must not
     * wait on the plugin */
    if (vg_cfg.register_path[0]) __atomic_store_n(&register_pending, 1, __ATOMIC_RELEASE);
    vg_sm_setup();
    find_own_ranges();
    __atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
    vg_tls_guard = saved;
}

void vg_init(void)
{
    pthread_once(&init_once, do_init);
    /* register now, so that the plugin sees the process at once (the thread that wins
     * the flag asks; the others go on) */
    if (__atomic_load_n(&register_pending, __ATOMIC_ACQUIRE) &&
        __atomic_exchange_n(&register_pending, 0, __ATOMIC_ACQ_REL))
        vg_host_pid();
}

/* The executable segments of the driver, NVML (and the driver's own helper libraries)
 * and the shim: a hook called from there while this thread is inside the shim is their
 * own call to an exported name. Written once, by do_init, before own_ready is set. */
#define OWN_RANGES 32
static uintptr_t own_lo[OWN_RANGES], own_hi[OWN_RANGES];
static int own_count, own_ready;

static int own_object(const char *path, const char *shim)
{
    if (!path || !*path) return 0;
    if (shim && !strcmp(path, shim)) return 1;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return !strncmp(base, "libcuda.so", 10) || !strncmp(base, "libnvidia-", 10);
}

static int add_ranges(struct dl_phdr_info *info, size_t size, void *shim)
{
    (void)size;
    if (!own_object(info->dlpi_name, shim)) return 0;
    for (int i = 0; i < info->dlpi_phnum && own_count < OWN_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        own_lo[own_count] = info->dlpi_addr + ph->p_vaddr;
        own_hi[own_count] = own_lo[own_count] + ph->p_memsz;
        own_count++;
    }
    return 0;
}

static void find_own_ranges(void)
{
    Dl_info me;
    const char *shim = dladdr((void *)vg_init, &me) ? me.dli_fname : NULL;
    dl_iterate_phdr(add_ranges, (void *)shim);
    __atomic_store_n(&own_ready, 1, __ATOMIC_RELEASE);
}

int vg_own_caller(const void *ret)
{
    if (!__atomic_load_n(&own_ready, __ATOMIC_ACQUIRE)) return 1;
    uintptr_t a = (uintptr_t)ret;
    for (int i = 0; i < own_count; i++)
        if (a >= own_lo[i] && a < own_hi[i]) return 1;
    return 0;
}

int vg_init_done(void) { return __atomic_load_n(&init_done, __ATOMIC_ACQUIRE); }

extern pthread_mutex_t *const __start_vg_mutexes[] VG_HIDDEN;
extern pthread_mutex_t *const __stop_vg_mutexes[] VG_HIDDEN;

/* A forked child has one thread: every mutex another thread held at the fork would stay
 * held, and an init another thread was running would never finish. 51 of 300 children
 * forked beside a thread allocating in a loop hung on their first driver call. */
static void after_fork_child(void)
{
    for (pthread_mutex_t *const *m = __start_vg_mutexes; m < __stop_vg_mutexes; m++)
        pthread_mutex_init(*m, NULL);
    vg_tls_locks = 0;
    vg_memory_after_fork();
    if (!__atomic_load_n(&init_done, __ATOMIC_ACQUIRE)) {
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        memcpy(&init_once, &fresh, sizeof fresh); /* it runs again, in the child */
    }
}

static void do_nvml(void)
{
    if (!vg_real.nvmlInit_v2) {
        VG_INFO("NVML unavailable: SM limits and context measurement degrade");
        return;
    }
    nvmlReturn_t r = vg_real.nvmlInit_v2();
    nvml_ok = r == NVML_SUCCESS;
    if (!nvml_ok) VG_WARN("nvmlInit_v2 failed (%d)", (int)r);
}

int vg_nvml_ready(void)
{
    vg_init();
    pthread_once(&nvml_once, do_nvml);
    return nvml_ok;
}
