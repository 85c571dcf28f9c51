/* Launch loop for the SM-limit tests:
 *   loop BLOCKS SECONDS [SYNC_EVERY] [DEV] [--ptds] [--ns NS]
 * launches kernels of BLOCKS blocks back to back on DEV for SECONDS, synchronising every
 * SYNC_EVERY launches (0: only at the end), with entry points resolved through
 * cuGetProcAddress_v2 like libcudart.  --ns NS launches the function fake_ns_NS (NS ns per
 * block per wave) instead of the default one (FAKECUDA_NS_PER_BLOCK).  Prints
 * {"op":"use",...} (and {"op":"kernel",...} with --ns) then
 * {"op":"launchfor","rc":0,"launches":N,"blocks":B,"ms":...}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/resolve.h"

/* Removes "--ns N" (or "--ns=N") from argv; NULL when absent. */
static const char *take_ns(int *argc, char **argv) {
    const char *ns = NULL;
    for (int i = 1; i < *argc; i++) {
        int drop = 0;
        if (!strcmp(argv[i], "--ns") && i + 1 < *argc) {
            ns = argv[i + 1];
            drop = 2;
        } else if (!strncmp(argv[i], "--ns=", 5)) {
            ns = argv[i] + 5;
            drop = 1;
        }
        if (drop) {
            memmove(&argv[i], &argv[i + drop], (size_t)(*argc - i - drop + 1) * sizeof argv[0]);
            *argc -= drop;
            i--;
        }
    }
    return ns;
}

int main(int argc, char **argv) {
    static struct api a;
    int ptds = api_take_ptds_flag(&argc, argv);
    const char *ns = take_ns(&argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: loop BLOCKS SECONDS [SYNC_EVERY] [DEV] [--ptds] [--ns NS]\n");
        return 2;
    }
    if (api_resolve_proc(&a, PROGS_CUDA_VERSION,
                         ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0) < 0)
        return 1;
    char kernel[64] = "";
    if (ns) snprintf(kernel, sizeof kernel, "kernel %s; ", ns);
    char script[320];
    snprintf(script, sizeof script, "use %s; %slaunchfor %.3f %s %s", argc > 4 ? argv[4] : "0",
             kernel, atof(argv[2]) * 1000.0, argv[1], argc > 3 ? argv[3] : "0");
    char *args[] = {argv[0], script, NULL};
    return interp_main(2, args, "loop", &a);
}
