/* Test program: dlopen("libcuda.so.1") and dlsym of each versioned name. */
#include "common/resolve.h"

int main(int argc, char **argv) {
    static struct api a;
    if (api_resolve_dlsym(&a) < 0) return 1;
    return interp_main(argc, argv, "dlsym", &a);
}
