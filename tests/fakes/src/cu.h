/* Internals shared by the cu*.c files of the fake driver. */
#ifndef FAKE_CU_H
#define FAKE_CU_H

#include <pthread.h>

#include "cutypes.h"
#include "fake.h"

/* ---- handles (cu_objects.c): opaque, checked, never dereferenced by callers ---- */
enum fc_kind {
    K_CTX = 1,
    K_STREAM,
    K_EVENT,
    K_MODULE,
    K_FUNC,
    K_GRAPH,
    K_NODE,
    K_EXEC,
    K_POOL,
};
void *fc_handle_new(int kind, void *data);
void *fc_handle_get(const void *handle, int kind); /* NULL when not a live handle of kind */
void fc_handle_free(const void *handle);

/* ---- allocation table: returned address/handle -> record ---- */
enum fc_akind { A_DEVICE = 1, A_DEVICE32, A_ARRAY, A_MIPMAP, A_MANAGED, A_HOST, A_VMM, A_VA };
struct fc_alloc {
    uint64_t key;
    uint64_t size;    /* bytes charged (device), counted (managed) or reserved (VA) */
    int kind;
    int dev;          /* -1: not device memory */
    void *ctx;        /* struct fc_ctx* that owns it (freed with the context) */
    void *pool;       /* struct fc_pool* for pool/async allocations */
    void *host;       /* real host memory */
    int released;     /* A_VMM: cuMemRelease called, waiting for unmaps */
    int maps;         /* A_VMM: live mappings */
};
void fc_alloc_put(struct fc_alloc *a);
struct fc_alloc *fc_alloc_get(uint64_t key);
struct fc_alloc *fc_alloc_take(uint64_t key); /* removes it */
/* Calls fn on every record (the table may be modified by fn via fc_alloc_take). */
void fc_alloc_each(void (*fn)(struct fc_alloc *, void *), void *arg);
uint64_t fc_addr_new(uint64_t size, uint64_t align, int low32);
extern pthread_mutex_t fc_obj_mutex; /* guards handles and the allocation table */

/* ---- contexts (cu_device.c) ---- */
struct fc_ctx {
    int dev;
    int primary;
    int active;
    uint64_t last_end; /* end of the last kernel this context queued */
    CUcontext handle;
};
extern int fc_initialized;
CUresult fc_check_init(void);
CUresult fc_check_dev(CUdevice dev);
/* The calling thread's current context (CUDA_ERROR_INVALID_CONTEXT when none). */
CUresult fc_current(struct fc_ctx **out);
struct fc_ctx *fc_ctx_of(CUcontext h);
void fc_free_ctx_allocations(struct fc_ctx *c);

/* ---- streams / timeline (cu_exec.c) ---- */
struct fc_stream {
    struct fc_ctx *ctx;
    uint64_t last_end;
};
/* Resolves a stream argument; per_thread: the call came through a _ptsz/_ptds name. */
CUresult fc_stream_ctx(CUstream s, struct fc_ctx **ctx, struct fc_stream **st);

/* ---- memory (cu_memory.c) ---- */
void fc_free_record(struct fc_alloc *a);

#endif
