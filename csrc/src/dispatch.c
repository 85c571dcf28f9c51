/* The shim's one-time initialisation, and what a fork does to it.
 *
 * Nothing runs at load time (no constructors: they run inside other people's
 * processes before main and before the driver is wanted). The first hook that is
 * called runs vg_init() through pthread_once: it dlopens libcuda.so.1, resolves
 * every symbol of hooks.def with the real dlsym (real.c; a missing one stays NULL),
 * reads the config and attaches the usage state. NVML is initialised later, on first
 * need (nvml.c). The top of the shim's files: it calls down into each, none calls it
 * but the entry points (hooks.c, dlsym.c). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static void *cuda_handle, *nvml_handle;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

void *vg_cuda_handle(void) { return cuda_handle; }
static void find_own_ranges(void);
static void after_fork_child(void);
static int register_pending;

static void do_init(void)
{
    int saved = vg_tls_guard;
    vg_tls_guard = 1; /* the driver's own calls during dlopen pass straight through */
    pthread_atfork(NULL, NULL, after_fork_child); /* first: a fork may come mid-init */
    cuda_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!cuda_handle) VG_ERROR("libcuda.so.1 not loadable: %s", vg_real_dlerror());
    else vg_real_resolve(cuda_handle, 0);
    /* NVML symbols too, so that dlsym/routing can recognise them; NVML itself is
     * only initialised by vg_nvml_ready() */
    nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
    if (nvml_handle) vg_real_resolve(nvml_handle, 1);
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
    vg_set_init_done();
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
    vg_allocations_after_fork();
    if (!vg_init_done()) {
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        memcpy(&init_once, &fresh, sizeof fresh); /* it runs again, in the child */
    }
}
