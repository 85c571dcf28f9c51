/* preload: a stand-in for the shim in /etc/ld.so.preload. Its constructor marks the
 * process's environment, so a test can see that the preload file took effect. */
#include <stdlib.h>

__attribute__((constructor)) static void mark(void)
{
    setenv("VGPUD_OCI_PRELOADED", "1", 1);
}
