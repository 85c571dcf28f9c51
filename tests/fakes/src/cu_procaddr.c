/* cuGetProcAddress / cuGetProcAddress_v2 over the table of cu_proctable.c. */
#include <string.h>

#include "cu.h"
#include "procaddr.h"

FC_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn || (flags & ~(cuuint64_t)3)) return CUDA_ERROR_INVALID_VALUE;
    if (cudaVersion > fc_knobs()->driver_version) return CUDA_ERROR_INVALID_VALUE;
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc_entry *best = NULL;
    int known = 0;
    size_t n;
    const struct proc_entry *table = fc_proc_table(&n);
    for (size_t i = 0; i < n; i++) {
        const struct proc_entry *e = &table[i];
        if (strcmp(e->base, symbol) != 0) continue;
        known = 1;
        if (e->version > cudaVersion || (e->per_thread && !want_pt)) continue;
        if (!best || e->per_thread > best->per_thread ||
            (e->per_thread == best->per_thread && e->version > best->version))
            best = e;
    }
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best    ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
