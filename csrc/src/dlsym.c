/* dlsym override. For a name in hooks.def whose lookup yields the real driver's
 * entry point, the caller gets our hook instead; that holds for every handle,
 * RTLD_NEXT included (the usual bypass of LD_PRELOAD shims).
 *
 * Every other lookup must behave exactly as glibc's, and glibc resolves RTLD_NEXT
 * relative to the object that *called* dlsym, which it finds from its return
 * address. So on x86-64 our dlsym is a small assembly trampoline: it asks
 * vg_dlsym_entry whether the lookup is ours; if not, it restores the arguments
 * and JUMPS to the real dlsym, which then sees the original caller's return
 * address. Nothing else is called on that path (sanitizer runtimes and other
 * interposers call dlsym during their own initialisation, before they can serve
 * a dlopen or a malloc). Elsewhere a C version calls the real dlsym; there,
 * RTLD_NEXT lookups of other names resolve relative to this library (documented
 * in docs/shim.md). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

VG_NO_SANITIZE static int driver_name(const char *name)
{
    return (name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4);
}

extern void *vg_real_dlsym_fn(void);
VG_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode);
VG_EXPORT char *dlerror(void);

/* Returns the answer with *done = 1, or the real dlsym's address with *done = 0. */
VG_HIDDEN VG_NO_SANITIZE void *vg_dlsym_entry(void *handle, const char *name, long *done)
{
    *done = 0;
    if (name && !vg_tls_guard && name[0] == 'd' && name[1] == 'l' &&
        (!strcmp(name, "dlmopen") || !strcmp(name, "dlerror"))) {
        *done = 1; /* dlsym(RTLD_NEXT, "dlmopen") is the usual way round an override */
        return !strcmp(name, "dlmopen") ? (void *)dlmopen : (void *)dlerror;
    }
    if (!name || vg_tls_guard || !driver_name(name) || !vg_is_hooked_name(name))
        return vg_real_dlsym_fn();
    *done = 1;
    vg_tls_guard = 1;
    vg_init();
    vg_tls_guard = 0;
    /* RTLD_NEXT: whoever asks for a driver entry point by name wants the driver's;
     * the driver is the one to ask */
    void *p;
    if (handle == RTLD_NEXT) {
        void *h = vg_cuda_handle();
        p = h ? vg_real_dlsym(h, name) : NULL;
        if (!p) p = vg_real_dlsym(RTLD_DEFAULT, name);
    } else {
        p = vg_real_dlsym(handle, name);
    }
    void *hook = vg_route_pointer(p);
    return hook ? hook : p;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  push %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  push %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  sub $8, %rsp\n"           /* the 'done' word; keeps the stack 16-aligned */
        "  .cfi_adjust_cfa_offset 8\n"
        "  mov %rsp, %rdx\n"
        "  call vg_dlsym_entry\n"
        "  mov (%rsp), %rcx\n"
        "  add $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  pop %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  pop %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  test %rcx, %rcx\n"
        "  jnz 1f\n"
        "  test %rax, %rax\n"
        "  jz 1f\n"
        "  jmp *%rax\n"              /* tail call: glibc sees our caller */
        "1:\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
VG_EXPORT VG_NO_SANITIZE void *dlsym(void *handle, const char *name)
{
    long done;
    void *r = vg_dlsym_entry(handle, name, &done);
    if (done) return r;
    return r ? ((void *(*)(void *, const char *))r)(handle, name) : NULL;
}
#endif

/* dlmopen override. A library loaded into another link namespace gets a copy of
 * everything it needs there, and the preload is not one of them: a second libcuda (or
 * NVML) in a new namespace would run outside every hook. A load that brings the driver
 * into a namespace other than the base one is undone and refused; the reason is what
 * the caller's next dlerror() returns. Everything else loads as glibc loads it. */
static __thread char refused[400];

static int is_driver_object(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return !strncmp(base, "libcuda.so", 10) || !strncmp(base, "libnvidia-ml.so", 15);
}

/* the first driver object among the objects of handle's namespace, or NULL */
static const char *driver_in_namespace(void *handle)
{
    struct link_map *lm = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm) return NULL;
    while (lm->l_prev) lm = lm->l_prev;
    for (; lm; lm = lm->l_next)
        if (lm->l_name && is_driver_object(lm->l_name)) return lm->l_name;
    return NULL;
}

VG_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode)
{
    void *(*real)(Lmid_t, const char *, int) = NULL;
    *(void **)&real = vg_real_dlsym(RTLD_NEXT, "dlmopen");
    if (!real) return NULL;
    void *h = real(lmid, file, mode);
    if (!h || lmid == LM_ID_BASE) return h;
    const char *driver = driver_in_namespace(h);
    if (!driver) return h;
    snprintf(refused, sizeof refused,
             "vgpud: %s would load %s into a link namespace of its own, outside the GPU "
             "limits; refused (load it with dlopen)", file ? file : "(null)", driver);
    VG_ERROR("%s", refused + strlen("vgpud: "));
    dlclose(h);
    return NULL;
}

VG_EXPORT char *dlerror(void)
{
    char *(*real)(void) = NULL;
    *(void **)&real = vg_real_dlsym(RTLD_NEXT, "dlerror");
    char *glibc = real ? real() : NULL; /* read (and cleared) either way */
    if (refused[0]) {
        static __thread char given[sizeof refused];
        memcpy(given, refused, sizeof given);
        refused[0] = 0;
        return given;
    }
    return glibc;
}
