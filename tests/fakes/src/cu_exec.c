/* Streams, events, modules, kernel launches and synchronisation, all on the virtual
 * timeline of state.c: one kernel at a time per device, in launch order over all
 * processes.  A kernel's blocks run in parallel on the device's SMs, in waves:
 *   duration = FAKECUDA_LAUNCH_NS + ceil(blocks / (SMs x resident blocks per SM)) x block_ns
 * with resident blocks per SM = clamp(2048 / threads per block, 1, 32) (compute capability
 * 8.0) and block_ns the kernel's own work per block: N for a function named fake_ns_N,
 * FAKECUDA_NS_PER_BLOCK for any other name.  (A model of its own, on purpose: the shim's
 * estimate of a kernel's cost must not be what the fake runs.) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu.h"

static void max_store(uint64_t *p, uint64_t v) {
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static uint64_t load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

static void wait_until(uint64_t t) {
    if (t > fc_now()) fc_sleep_until(t);
}

CUresult fc_stream_ctx(CUstream s, struct fc_ctx **ctx, struct fc_stream **st) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (st) *st = NULL;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return fc_current(ctx);
    struct fc_stream *x = fc_handle_get(s, K_STREAM);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    if (!x->ctx->active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = x->ctx;
    if (st) *st = x;
    return CUDA_SUCCESS;
}

/* ---- streams ---- */
FC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!phStream || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
    struct fc_stream *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = c;
    *phStream = fc_handle_new(K_STREAM, s);
    return CUDA_SUCCESS;
}

FC_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    (void)priority;
    return cuStreamCreate(phStream, flags);
}

FC_API CUresult cuStreamDestroy_v2(CUstream hStream) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_stream *s = fc_handle_get(hStream, K_STREAM);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    fc_handle_free(hStream);
    free(s);
    return CUDA_SUCCESS;
}

FC_API CUresult cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

/* the stream's context (the current one for the NULL and special streams) */
FC_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
    struct fc_ctx *c;
    CUresult r = fc_stream_ctx(hStream, &c, NULL);
    if (r) return r;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = c->handle;
    return CUDA_SUCCESS;
}

/* CUDA 12.8: the stream's device, as an ordinal */
FC_API CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device) {
    struct fc_ctx *c;
    CUresult r = fc_stream_ctx(hStream, &c, NULL);
    if (r) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = fc_ordinal(c->dev);
    return CUDA_SUCCESS;
}

static uint64_t stream_end(struct fc_ctx *c, struct fc_stream *s) {
    return s ? load(&s->last_end) : load(&c->last_end);
}

FC_API CUresult cuStreamSynchronize(CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    wait_until(stream_end(c, s));
    return fc_pools_sync();
}

FC_API CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return cuStreamSynchronize(hStream); }

FC_API CUresult cuStreamQuery(CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    return stream_end(c, s) > fc_now() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

FC_API CUresult cuStreamQuery_ptsz(CUstream hStream) { return cuStreamQuery(hStream); }

FC_API CUresult cuCtxSynchronize(void) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    wait_until(load(&c->last_end));
    return fc_pools_sync();
}

FC_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    if (!ctx) return cuCtxSynchronize();
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_ctx *c = fc_ctx_of(ctx);
    if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    wait_until(load(&c->last_end));
    return fc_pools_sync();
}

/* ---- events ---- */
struct fc_event {
    uint64_t t;
    struct fc_ctx *ctx;
};

FC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int flags) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!phEvent || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
    struct fc_event *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = c;
    *phEvent = fc_handle_new(K_EVENT, e);
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    __atomic_store_n(&e->t, stream_end(c, s), __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
    return cuEventRecord(hEvent, hStream);
}

FC_API CUresult cuEventSynchronize(CUevent hEvent) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    wait_until(load(&e->t));
    return fc_pools_sync();
}

FC_API CUresult cuEventQuery(CUevent hEvent) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    return load(&e->t) > fc_now() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

FC_API CUresult cuEventDestroy_v2(CUevent hEvent) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    fc_handle_free(hEvent);
    free(e);
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

/* ---- modules and functions: any image loads, any name resolves ----
 * A module is loaded into the current context and takes FAKECUDA_MODULE_MIB of its
 * device (code and globals), given back by cuModuleUnload or with the context, which
 * unloads its modules (their handles and their functions' handles die). */
struct fc_module {
    struct fc_ctx *ctx;
    uint64_t bytes; /* charged to ctx->dev */
    CUmodule handle;
    struct fc_module *next; /* the context's list */
    size_t n, cap;
    struct {
        char *name;
        CUfunction handle;
    } *funcs; /* one handle per name, as in the real driver */
};

/* Guards the modules (lists, function tables) and the libraries below. */
static pthread_mutex_t fc_module_mutex = PTHREAD_MUTEX_INITIALIZER;

/* Loads a module into c (under fc_module_mutex). */
static CUresult module_new_locked(struct fc_ctx *c, CUmodule *m) {
    uint64_t bytes = fc_knobs()->module_bytes;
    struct fc_module *mod = calloc(1, sizeof *mod);
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    if (bytes && fc_charge(c->dev, bytes) < 0) {
        free(mod);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mod->ctx = c;
    mod->bytes = bytes;
    mod->handle = fc_handle_new(K_MODULE, mod);
    if (!mod->handle) {
        if (bytes) fc_uncharge(c->dev, bytes);
        free(mod);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mod->next = c->modules;
    c->modules = mod;
    *m = mod->handle;
    return CUDA_SUCCESS;
}

static CUresult module_load(CUmodule *m) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    pthread_mutex_lock(&fc_module_mutex);
    r = c->active ? module_new_locked(c, m) : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    pthread_mutex_unlock(&fc_module_mutex);
    return r;
}

/* Takes mod off its context's list, frees its handles (under fc_module_mutex); the caller
 * gives back its memory (module_free) after unlocking. */
static void module_detach_locked(struct fc_module *mod) {
    for (struct fc_module **p = &mod->ctx->modules; *p; p = &(*p)->next) {
        if (*p == mod) {
            *p = mod->next;
            break;
        }
    }
    fc_handle_free(mod->handle);
    /* the function handles die with the module; their structs stay (a racing launch may
     * still read one), like the contexts' */
    for (size_t i = 0; i < mod->n; i++) fc_handle_free(mod->funcs[i].handle);
}

static void module_free(struct fc_module *mod) {
    if (mod->bytes) fc_uncharge(mod->ctx->dev, mod->bytes);
    for (size_t i = 0; i < mod->n; i++) free(mod->funcs[i].name);
    free(mod->funcs);
    free(mod);
}

void fc_ctx_unload_modules(struct fc_ctx *c) {
    pthread_mutex_lock(&fc_module_mutex);
    struct fc_module *list = c->modules;
    for (struct fc_module *m = list; m; m = m->next) {
        fc_handle_free(m->handle);
        for (size_t i = 0; i < m->n; i++) fc_handle_free(m->funcs[i].handle);
    }
    c->modules = NULL;
    pthread_mutex_unlock(&fc_module_mutex);
    while (list) {
        struct fc_module *next = list->next;
        module_free(list);
        list = next;
    }
}

FC_API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
    return module_load(module);
}

FC_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    return module_load(module);
}

FC_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                   CUjit_option *options, void **optionValues) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!module || !image || (numOptions && (!options || !optionValues)))
        return CUDA_ERROR_INVALID_VALUE;
    return module_load(module);
}

FC_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!module || !fatCubin) return CUDA_ERROR_INVALID_VALUE;
    return module_load(module);
}

FC_API CUresult cuModuleUnload(CUmodule hmod) {
    CUresult r = fc_check_init();
    if (r) return r;
    pthread_mutex_lock(&fc_module_mutex);
    struct fc_module *mod = fc_handle_get(hmod, K_MODULE);
    if (mod) module_detach_locked(mod);
    pthread_mutex_unlock(&fc_module_mutex);
    if (!mod) return CUDA_ERROR_INVALID_HANDLE;
    module_free(mod);
    return CUDA_SUCCESS;
}

/* ---- libraries (CUDA 12): context-independent code, loaded into a context as a module
 * of it: into the current context at load time when there is one, else (and into every
 * other context) the first time the context needs it (cuLibraryGetModule,
 * cuKernelGetFunction) — each such load takes FAKECUDA_MODULE_MIB on that context's
 * device, given back by cuLibraryUnload or with the context. */
struct fc_library {
    size_t nmods, capmods;
    struct {
        struct fc_ctx *ctx;
        CUmodule module; /* dead once its context went (or cuModuleUnload) */
    } *mods;
    size_t nkern, capkern;
    CUkernel *kernels;
};

struct fc_kernel {
    struct fc_library *lib;
    char *name;
};

static int grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return 1;
    size_t c = *cap ? *cap * 2 : 4;
    void *a = realloc(*arr, c * elem);
    if (!a) return 0;
    *arr = a;
    *cap = c;
    return 1;
}

/* The library's module in c, loaded now if it has none there (under fc_module_mutex). */
static CUresult library_module_locked(struct fc_library *lib, struct fc_ctx *c, CUmodule *out) {
    if (!c->active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    for (size_t i = 0; i < lib->nmods; i++) {
        if (lib->mods[i].ctx == c && fc_handle_get(lib->mods[i].module, K_MODULE)) {
            *out = lib->mods[i].module;
            return CUDA_SUCCESS;
        }
    }
    size_t slot = lib->nmods;
    for (size_t i = 0; i < lib->nmods; i++)
        if (!fc_handle_get(lib->mods[i].module, K_MODULE)) slot = i; /* a dead entry */
    if (slot == lib->nmods && !grow((void **)&lib->mods, &lib->capmods, lib->nmods, sizeof lib->mods[0]))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmodule m;
    CUresult r = module_new_locked(c, &m);
    if (r) return r;
    lib->mods[slot].ctx = c;
    lib->mods[slot].module = m;
    if (slot == lib->nmods) lib->nmods++;
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult library_load(CUlibrary *library, CUjit_option *jitOptions, void **jitOptionsValues,
                             unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                             void **libraryOptionValues, unsigned int numLibraryOptions) {
    if ((numJitOptions && (!jitOptions || !jitOptionsValues)) ||
        (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numLibraryOptions; i++)
        if ((unsigned)libraryOptions[i] >= CU_LIBRARY_NUM_OPTIONS) return CUDA_ERROR_INVALID_VALUE;
    struct fc_library *lib = calloc(1, sizeof *lib);
    if (!lib) return CUDA_ERROR_OUT_OF_MEMORY;
    struct fc_ctx *c = NULL;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc_module_mutex);
    if (fc_current(&c) == CUDA_SUCCESS) { /* loaded into the current context now */
        CUmodule m;
        r = library_module_locked(lib, c, &m);
    }
    CUlibrary h = NULL;
    if (!r) {
        h = fc_handle_new(K_LIBRARY, lib);
        if (!h) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fc_module *undo = NULL;
    if (r && lib->nmods) {
        undo = fc_handle_get(lib->mods[0].module, K_MODULE);
        if (undo) module_detach_locked(undo);
    }
    pthread_mutex_unlock(&fc_module_mutex);
    if (undo) module_free(undo);
    if (r) {
        free(lib->mods);
        free(lib);
        return r;
    }
    *library = h;
    return CUDA_SUCCESS;
}

FC_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!library || !code) return CUDA_ERROR_INVALID_VALUE;
    return library_load(library, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                        libraryOptionValues, numLibraryOptions);
}

FC_API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                      CUjit_option *jitOptions, void **jitOptionsValues,
                                      unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                      void **libraryOptionValues, unsigned int numLibraryOptions) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!library || !fileName) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; libraryOptions && i < numLibraryOptions; i++)
        if (libraryOptions[i] == CU_LIBRARY_BINARY_IS_PRESERVED) return CUDA_ERROR_INVALID_VALUE;
    if (access(fileName, R_OK) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
    return library_load(library, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                        libraryOptionValues, numLibraryOptions);
}

FC_API CUresult cuLibraryUnload(CUlibrary library) {
    CUresult r = fc_check_init();
    if (r) return r;
    pthread_mutex_lock(&fc_module_mutex);
    struct fc_library *lib = fc_handle_get(library, K_LIBRARY);
    struct fc_module *gone = NULL; /* its live modules, chained through next once detached */
    if (lib) {
        fc_handle_free(library);
        for (size_t i = 0; i < lib->nmods; i++) {
            struct fc_module *m = fc_handle_get(lib->mods[i].module, K_MODULE);
            if (!m) continue;
            module_detach_locked(m);
            m->next = gone;
            gone = m;
        }
        for (size_t i = 0; i < lib->nkern; i++) fc_handle_free(lib->kernels[i]);
    }
    pthread_mutex_unlock(&fc_module_mutex);
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    while (gone) {
        struct fc_module *next = gone->next;
        module_free(gone);
        gone = next;
    }
    /* the library and kernel structs stay (a racing call may still read one), like the
     * functions' */
    return CUDA_SUCCESS;
}

FC_API CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!pMod) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_module_mutex);
    struct fc_library *lib = fc_handle_get(library, K_LIBRARY);
    r = lib ? library_module_locked(lib, c, pMod) : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&fc_module_mutex);
    return r;
}

FC_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pKernel || !name || !*name) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_module_mutex);
    struct fc_library *lib = fc_handle_get(library, K_LIBRARY);
    r = lib ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; lib && i < lib->nkern; i++) {
        struct fc_kernel *k = fc_handle_get(lib->kernels[i], K_KERNEL);
        if (k && strcmp(k->name, name) == 0) { /* one handle per name */
            *pKernel = lib->kernels[i];
            r = CUDA_SUCCESS;
            lib = NULL;
        }
    }
    if (lib && grow((void **)&lib->kernels, &lib->capkern, lib->nkern, sizeof lib->kernels[0])) {
        struct fc_kernel *k = calloc(1, sizeof *k);
        char *copy = strdup(name);
        CUkernel h = (k && copy) ? fc_handle_new(K_KERNEL, k) : NULL;
        if (h) {
            k->lib = lib;
            k->name = copy;
            lib->kernels[lib->nkern++] = h;
            *pKernel = h;
            r = CUDA_SUCCESS;
        } else {
            free(k);
            free(copy);
        }
    }
    pthread_mutex_unlock(&fc_module_mutex);
    return r;
}

static CUresult module_function_locked(struct fc_module *mod, const char *name, CUfunction *hfunc);

FC_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!pFunc) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_module_mutex);
    struct fc_kernel *k = fc_handle_get(kernel, K_KERNEL);
    CUmodule m = NULL;
    r = k ? library_module_locked(k->lib, c, &m) : CUDA_ERROR_INVALID_HANDLE;
    if (!r) r = module_function_locked(fc_handle_get(m, K_MODULE), k->name, pFunc);
    pthread_mutex_unlock(&fc_module_mutex);
    return r;
}

/* "fake_ns_<N>" (N decimal) -> N; -1 for any other name. */
static int64_t ns_from_name(const char *name) {
    static const char prefix[] = "fake_ns_";
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) return -1;
    const char *p = name + sizeof prefix - 1;
    if (*p < '0' || *p > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (*end || errno || v > (unsigned long long)INT64_MAX) return -1;
    return (int64_t)v;
}

/* The function of that name in mod (one handle per name), under fc_module_mutex. */
static CUresult module_function_locked(struct fc_module *mod, const char *name, CUfunction *hfunc) {
    if (!mod) return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < mod->n; i++) {
        if (strcmp(mod->funcs[i].name, name) == 0) {
            *hfunc = mod->funcs[i].handle;
            return CUDA_SUCCESS;
        }
    }
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (mod->n == mod->cap) {
        size_t cap = mod->cap ? mod->cap * 2 : 8;
        void *f = realloc(mod->funcs, cap * sizeof mod->funcs[0]);
        if (f) {
            mod->funcs = f;
            mod->cap = cap;
        }
    }
    struct fc_func *fn = calloc(1, sizeof *fn);
    char *copy = strdup(name);
    if (fn && copy && mod->n < mod->cap) {
        int64_t ns = ns_from_name(name);
        fn->block_ns = ns >= 0 ? (uint64_t)ns : fc_knobs()->ns_per_block;
        CUfunction h = fc_handle_new(K_FUNC, fn);
        if (h) {
            mod->funcs[mod->n].name = copy;
            mod->funcs[mod->n++].handle = h;
            *hfunc = h;
            fn = NULL, copy = NULL;
            r = CUDA_SUCCESS;
        }
    }
    free(fn);
    free(copy);
    return r;
}

FC_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!hfunc || !name || !*name) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_module_mutex);
    r = module_function_locked(fc_handle_get(hmod, K_MODULE), name, hfunc);
    pthread_mutex_unlock(&fc_module_mutex);
    return r;
}

/* ---- launches ---- */
CUresult fc_check_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, struct fc_func **fn) {
    *fn = fc_handle_get(f, K_FUNC);
    if (!*fn) return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if (gy > 65535 || gz > 65535 || bz > 64 || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Blocks of threads threads that one SM holds at once (compute capability 8.0: 2048
 * threads, 32 blocks). */
static uint64_t resident_per_sm(uint64_t threads) {
    uint64_t per_sm = 2048 / threads;
    return per_sm < 1 ? 1 : per_sm > 32 ? 32 : per_sm;
}

uint64_t fc_kernel_ns(const struct fc_func *fn, uint64_t blocks, uint64_t threads, int sms) {
    const struct fc_knobs *k = fc_knobs();
    if (sms <= 0) sms = k->sms; /* a green context runs on its own SMs */
    uint64_t slots = (uint64_t)(sms > 0 ? sms : 1) * resident_per_sm(threads);
    uint64_t waves = (blocks + slots - 1) / slots;
    return k->launch_ns + waves * fn->block_ns;
}

void fc_run(struct fc_ctx *c, struct fc_stream *s, uint64_t dur) {
    uint64_t end = fc_enqueue(c->dev, dur);
    max_store(&c->last_end, end);
    if (s) max_store(&s->last_end, end);
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, CUstream hStream, int cooperative) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    struct fc_func *fn;
    r = fc_check_launch(f, gx, gy, gz, bx, by, bz, &fn);
    if (r) return r;
    uint64_t blocks = (uint64_t)gx * gy * gz, threads = (uint64_t)bx * by * bz;
    /* a cooperative grid must be resident at once: one wave */
    if (cooperative && blocks > (uint64_t)(c->sms > 0 ? c->sms : fc_knobs()->sms) *
                                    resident_per_sm(threads))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    r = fc_ctx_first_launch(c); /* the context grows at its first launch */
    if (r) return r;
    fc_run(c, s, fc_kernel_ns(fn, blocks, threads, c->sms));
    return CUDA_SUCCESS;
}

FC_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra) {
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, 0);
}

FC_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams, extra);
}

FC_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                 void **extra) {
    (void)kernelParams, (void)extra;
    CUresult r = fc_check_init();
    if (r) return r;
    if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, 0);
}

FC_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra) {
    return cuLaunchKernelEx(config, f, kernelParams, extra);
}

FC_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                          unsigned int gz, unsigned int bx, unsigned int by,
                                          unsigned int bz, unsigned int sharedMemBytes,
                                          CUstream hStream, void **kernelParams) {
    (void)sharedMemBytes, (void)kernelParams;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, 1);
}

FC_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx, unsigned int by,
                                               unsigned int bz, unsigned int sharedMemBytes,
                                               CUstream hStream, void **kernelParams) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream,
                                     kernelParams);
}
