/* Filling struct api through dlopen+dlsym or through cuGetProcAddress_v2. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "resolve.h"

static void *open_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) printf("{\"op\":\"dlopen\",\"rc\":-1,\"error\":\"%s\"}\n", dlerror());
    return h;
}

int api_resolve_dlsym(struct api *a) {
    void *h = open_driver();
    if (!h) return -1;
#define BY_DLSYM(sym, base, ver, params) a->sym = (CUresult(*) params)dlsym(h, #sym);
    API_LIST(BY_DLSYM)
    return 0;
}

int api_resolve_proc(struct api *a, int version, cuuint64_t flags) {
    void *h = open_driver();
    if (!h) return -1;
    a->cuGetProcAddress_v2 = (CUresult(*)(const char *, void **, int, cuuint64_t,
                                          CUdriverProcAddressQueryResult *))dlsym(h, "cuGetProcAddress_v2");
    if (!a->cuGetProcAddress_v2) {
        printf("{\"op\":\"resolve\",\"rc\":-1,\"name\":\"cuGetProcAddress_v2\"}\n");
        return -1;
    }
    /* an entry point newer than the driver (cuCtxSynchronize_v2 is CUDA 13's) stays NULL
     * without a word: its op answers -1 */
    int driver = 0;
    CUresult (*get_version)(int *) = (CUresult(*)(int *))dlsym(h, "cuDriverGetVersion");
    if (get_version) get_version(&driver);
#define BY_PROC(sym, base, ver, params)                                                     \
    do {                                                                                    \
        void *fn = NULL;                                                                    \
        CUdriverProcAddressQueryResult st;                                                  \
        int v = (ver) ? (ver) : version;                                                    \
        CUresult r = v > driver && driver ? CUDA_ERROR_NOT_FOUND                            \
                                          : a->cuGetProcAddress_v2(#base, &fn, v, flags, &st); \
        if (v > driver && driver) break;                                                    \
        if (r != CUDA_SUCCESS || !fn)                                                       \
            printf("{\"op\":\"resolve\",\"rc\":%d,\"name\":\"%s\",\"version\":%d,\"status\":%d}\n", \
                   (int)r, #base, v, (int)st);                                              \
        a->sym = (CUresult(*) params)fn;                                                    \
    } while (0);
    API_LIST(BY_PROC)
    fflush(stdout);
    return 0;
}

/* argv options shared by the programs: --ptds (per-thread default stream lookups). */
int api_take_ptds_flag(int *argc, char **argv) {
    int found = 0;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--ptds") == 0) {
            found = 1;
            memmove(&argv[i], &argv[i + 1], (size_t)(*argc - i) * sizeof argv[0]);
            (*argc)--;
            i--;
        }
    }
    return found;
}
