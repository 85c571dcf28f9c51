/* Test program: the driver entry points linked directly (-lcuda), like old code. */
#include "common/api.h"

#define DECLARE(sym, base, ver, params) extern CUresult sym params;
API_LIST(DECLARE)

int main(int argc, char **argv) {
    static struct api a;
#define DIRECT(sym, base, ver, params) a.sym = sym;
    API_LIST(DIRECT)
    return interp_main(argc, argv, "direct", &a);
}
