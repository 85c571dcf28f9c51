/* Per-call cost of the driver entry points the shim wraps on the hot path. The
 * entry points are obtained as libcudart obtains them (cuGetProcAddress_v2), so
 * with the shim preloaded the timed pointers are the shim's hooks.
 *   bench N   ->  {"alloc_free_ns": ..., "launch_ns": ..., "n": N}
 * alloc_free_ns: one cuMemAlloc_v2(1 MiB) + cuMemFree_v2 pair; launch_ns: one
 * cuLaunchKernel of one block (run with FAKECUDA_NS_PER_BLOCK=0 so the fake's
 * queue never blocks). Best of 5 rounds. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vgpu_cuda.h"

typedef struct CUmod_st *CUmodule;
static CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *get(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, 12080, 0, &st) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "no %s\n", name);
        exit(2);
    }
    return p;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 2;
    *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) return 2;
    CUresult (*init)(unsigned) = get("cuInit");
    CUresult (*devget)(CUdevice *, int) = get("cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = get("cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = get("cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc");
    CUresult (*mfree)(CUdeviceptr) = get("cuMemFree");
    CUresult (*load)(CUmodule *, const void *) = get("cuModuleLoadData");
    CUresult (*getfn)(CUfunction *, CUmodule, const char *) = get("cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = get("cuLaunchKernel");
    CUresult (*sync)(void) = get("cuCtxSynchronize");
    CUdevice d;
    CUcontext c;
    CUmodule m;
    CUfunction fn;
    if (init(0) || devget(&d, 0) || retain(&c, d) || setcur(c) || load(&m, "x") ||
        getfn(&fn, m, "k"))
        return 3;
    double best_a = 1e30, best_l = 1e30;
    for (int round = 0; round < 5; round++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            CUdeviceptr p;
            if (alloc(&p, 1 << 20) || mfree(p)) return 4;
        }
        double t1 = now_ns();
        for (long i = 0; i < n; i++)
            if (launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)) return 5;
        double t2 = now_ns();
        sync();
        if ((t1 - t0) / n < best_a) best_a = (t1 - t0) / n;
        if ((t2 - t1) / n < best_l) best_l = (t2 - t1) / n;
    }
    printf("{\"alloc_free_ns\": %.1f, \"launch_ns\": %.1f, \"n\": %ld}\n", best_a, best_l, n);
    return 0;
}
