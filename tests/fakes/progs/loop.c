/* Launch loop for the SM-limit tests:
 *   loop BLOCKS SECONDS [SYNC_EVERY] [DEV] [--ptds]
 * launches kernels of BLOCKS blocks back to back on DEV for SECONDS, synchronising every
 * SYNC_EVERY launches (0: only at the end), with entry points resolved through
 * cuGetProcAddress_v2 like libcudart.  Prints {"op":"use",...} then
 * {"op":"launchfor","rc":0,"launches":N,"blocks":B,"ms":...}. */
#include <stdio.h>
#include <stdlib.h>

#include "common/resolve.h"

int main(int argc, char **argv) {
    static struct api a;
    int ptds = api_take_ptds_flag(&argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: loop BLOCKS SECONDS [SYNC_EVERY] [DEV] [--ptds]\n");
        return 2;
    }
    if (api_resolve_proc(&a, PROGS_CUDA_VERSION,
                         ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0) < 0)
        return 1;
    char script[256];
    snprintf(script, sizeof script, "use %s; launchfor %.3f %s %s", argc > 4 ? argv[4] : "0",
             atof(argv[2]) * 1000.0, argv[1], argc > 3 ? argv[3] : "0");
    char *args[] = {argv[0], script, NULL};
    return interp_main(2, args, "loop", &a);
}
