/* Test program: dlsym only cuGetProcAddress_v2, then resolve every entry point through it
 * at CUDA 12080, as libcudart does.  --ptds asks for the per-thread-default-stream
 * variants (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). */
#include "common/resolve.h"

int main(int argc, char **argv) {
    static struct api a;
    int ptds = api_take_ptds_flag(&argc, argv);
    if (api_resolve_proc(&a, PROGS_CUDA_VERSION,
                         ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0) < 0)
        return 1;
    return interp_main(argc, argv, ptds ? "proc-ptds" : "proc", &a);
}
