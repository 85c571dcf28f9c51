/* The table behind cuGetProcAddress (cu_proctable.c). */
#ifndef FAKE_PROCADDR_H
#define FAKE_PROCADDR_H

#include <stddef.h>

struct proc_entry {
    const char *base; /* the name callers ask for */
    int version;      /* the CUDA version this implementation appeared in */
    int per_thread;   /* a _ptds/_ptsz variant */
    void *fn;
};

const struct proc_entry *fc_proc_table(size_t *n);

#endif
