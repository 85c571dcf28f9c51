/* Internals shared by the cu*.c files of the fake driver. */
#ifndef FAKE_CU_H
#define FAKE_CU_H

#include <pthread.h>

#include "cutypes.h"
#include "fake.h"

struct fc_pool;

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
    K_LIBRARY,
    K_KERNEL,
    K_GREEN,
    K_RESDESC,
};
void *fc_handle_new(int kind, void *data);
void *fc_handle_get(const void *handle, int kind); /* NULL when not a live handle of kind */
void fc_handle_free(const void *handle);

/* ---- allocation table: returned address/handle -> record ---- */
enum fc_akind {
    A_DEVICE = 1, A_DEVICE32, A_ARRAY, A_MIPMAP, A_MANAGED, A_HOST, A_VMM, A_VA,
    A_GRAPHVA, /* the address of a graph mem alloc node (cu_graph.c) */
    A_IPC,     /* another process's allocation opened by cuIpcOpenMemHandle (refs: opens),
                * or imported from its pool by cuMemPoolImportPointer (pool_import) */
};
struct fc_alloc {
    uint64_t key;
    uint64_t size;    /* bytes charged (device), counted (managed) or reserved (VA) */
    int kind;
    int dev;          /* physical device; -1: not device memory */
    void *ctx;        /* struct fc_ctx* that owns it (freed with the context) */
    void *pool;       /* struct fc_pool* for pool/async allocations (not charged one by one) */
    void *host;       /* real host memory */
    int refs;         /* A_VMM: references to the handle value (cuMemCreate / import: 1, each
                       * cuMemRetainAllocationHandle +1, each cuMemRelease -1); 0: released,
                       * the record stays while mappings made with it remain */
    int maps;         /* A_VMM: live mappings; A_GRAPHVA: references (its graph, its execs) */
    void *vmm;        /* A_VMM: struct fc_vmm_phys*, the physical memory the handle names */
    int live;         /* A_GRAPHVA: mapped by a launch, not freed yet */
    int freed_in_graph; /* A_GRAPHVA: a free node for it exists (in its own graph or another) */
    int ipc_index;    /* A_DEVICE exported by cuIpcGetMemHandle (ipc_id != 0), A_IPC: the */
    uint64_t ipc_id;  /* shared state's export entry (state.c, struct fc_ipc) */
    int pool_import;  /* A_IPC: by cuMemPoolImportPointer (freed with cuMemFree[Async]) */
};
void fc_alloc_put(struct fc_alloc *a);
struct fc_alloc *fc_alloc_get(uint64_t key);
struct fc_alloc *fc_alloc_take(uint64_t key); /* removes it */
/* Calls fn on every record (the table may be modified by fn via fc_alloc_take). */
void fc_alloc_each(void (*fn)(struct fc_alloc *, void *), void *arg);
uint64_t fc_addr_new(uint64_t size, uint64_t align, int low32);
void fc_addr_free(uint64_t addr, uint64_t size, int low32);
extern pthread_mutex_t fc_obj_mutex; /* guards handles and the allocation table */

/* ---- devices (cu_device.c): CUdevice values are CUDA_VISIBLE_DEVICES ordinals; the
 * state, contexts and allocations use physical devices (the NVML indexes) ---- */
/* check_init, then the ordinal's physical device (CUDA_ERROR_INVALID_DEVICE when none) */
CUresult fc_dev_arg(CUdevice dev, int *phys);
/* the ordinal of a physical device (-1 when not visible) */
CUdevice fc_ordinal(int phys);
/* CU_MEM_LOCATION_TYPE_DEVICE location id -> physical device, or -1 */
int fc_location_dev(int id);

/* ---- contexts (cu_device.c) ---- */
/* The limits cuCtxSetLimit changes device memory with (CU_LIMIT_STACK_SIZE,
 * CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE: the first three values). */
#define FC_MEM_LIMITS 3
struct fc_ctx {
    int dev; /* physical */
    int primary;
    int active;
    uint64_t last_end; /* end of the last kernel this context queued */
    CUcontext handle;
    /* Device memory of the context beyond FAKECUDA_CTX_MIB, charged to dev and given back
     * with the context (cu_device.c, under its ctx_mem_mutex): */
    uint64_t limit[CU_LIMIT_MAX];               /* cuCtxGetLimit's values */
    uint64_t limit_bytes[FC_MEM_LIMITS];        /* charged beyond the default limits */
    int launched;                               /* its first kernel launch happened */
    uint64_t grow_bytes;                        /* FAKECUDA_CTX_GROW_MIB, at that launch */
    struct fc_module *modules;                  /* loaded in it (cu_exec.c, fc_module_mutex) */
    int sms;                                    /* a green context's SMs (0: the device's) */
};
extern int fc_initialized;
CUresult fc_check_init(void);
CUresult fc_check_dev(CUdevice dev);
/* The calling thread's current context (CUDA_ERROR_INVALID_CONTEXT when none). */
CUresult fc_current(struct fc_ctx **out);
struct fc_ctx *fc_ctx_of(CUcontext h);
void fc_free_ctx_allocations(struct fc_ctx *c);
/* hands what was allocated in context from to context to (a green context's, to its
 * device's primary context, whose memory it was) */
void fc_reown_ctx_allocations(struct fc_ctx *from, struct fc_ctx *to);
/* active contexts of this process on a physical device */
int fc_active_contexts(int dev);
/* A context's first kernel launch grows it by FAKECUDA_CTX_GROW_MIB (CUDA_ERROR_OUT_OF_MEMORY
 * when the device lacks it: the launch must fail and run nothing). */
CUresult fc_ctx_first_launch(struct fc_ctx *c);
/* SMs of a physical device as CUDA reports them (its MIG compute instance's, if any). */
int fc_dev_sms(int dev);

/* ---- streams / timeline (cu_exec.c) ---- */
struct fc_stream {
    struct fc_ctx *ctx;
    uint64_t last_end;
};
/* Resolves a stream argument; per_thread: the call came through a _ptsz/_ptds name. */
CUresult fc_stream_ctx(CUstream s, struct fc_ctx **ctx, struct fc_stream **st);

/* Modules (cu_exec.c): each takes FAKECUDA_MODULE_MIB of its context's device; a
 * context's modules (and their functions) die with it. */
struct fc_module;
/* Unloads every module of the context (at its destruction); their handles go. */
void fc_ctx_unload_modules(struct fc_ctx *c);

/* A function: cuModuleGetFunction(&f, mod, "fake_ns_<N>") runs N ns per block per wave;
 * any other name FAKECUDA_NS_PER_BLOCK. */
struct fc_func {
    uint64_t block_ns;
};
/* Checks a launch's handle and dimensions; *fn = the function. */
CUresult fc_check_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, struct fc_func **fn);
/* Device time of a kernel: FAKECUDA_LAUNCH_NS + waves x block_ns, where a wave is
 * SMs x clamp(2048 / threads, 1, 32) resident blocks (a compute capability 8.0 SM). */
/* sms: the context's own (a green context's), 0 for the device's */
uint64_t fc_kernel_ns(const struct fc_func *fn, uint64_t blocks, uint64_t threads, int sms);
/* Queues dur ns of work on the context's device (the stream's, when s). */
void fc_run(struct fc_ctx *c, struct fc_stream *s, uint64_t dur);

/* ---- memory (cu_memory.c) ---- */
void fc_free_record(struct fc_alloc *a);
/* Records an allocation of size bytes on dev under a fresh address, charging the device
 * unless pool (whose reserve already holds the bytes). */
CUresult fc_device_alloc(int dev, uint64_t size, int kind, struct fc_ctx *ctx,
                         struct fc_pool *pool, uint64_t *out);
uint64_t fc_round_up(uint64_t v, uint64_t a);
#define FC_GRANULARITY (2ull * FC_MIB)

/* ---- stream-ordered pools and the graph memory pool (cu_pool.c) ---- */
/* Takes size bytes from the pool, growing its reserve (charged) by what is missing,
 * rounded up to 2 MiB; CUDA_ERROR_OUT_OF_MEMORY when the device lacks it. */
CUresult fc_pool_take(struct fc_pool *p, uint64_t size);
/* Gives size bytes back to the pool (still reserved). */
void fc_pool_give(struct fc_pool *p, uint64_t size);
/* An exported allocation freed while another process has it imported: its bytes leave
 * the pool (used and reserved) without being uncharged; the export entry holds them. */
void fc_pool_give_away(struct fc_pool *p, uint64_t size);
/* The pool was created with a POSIX file descriptor handle type and exported already
 * (cuMemPoolExportPointer may export its allocations). */
int fc_pool_pointers_exportable(const struct fc_pool *p);
/* Maps the export entry (index, id) into this process under a fresh address: an A_IPC
 * record (pool_import: a pool pointer's import). Under fc_obj_mutex. */
CUresult fc_ipc_map(int index, uint64_t id, struct fc_ctx *c, int pool_import, uint64_t *out);
/* cuMemPoolImportPointer's work, for an imported pool of physical device pool_dev. */
CUresult fc_pool_import_pointer(CUdeviceptr *ptr_out, int pool_dev,
                                const CUmemPoolPtrExportData *shareData);
/* Frees key if it is a pointer imported from another process's pool (1), else 0. */
int fc_free_pool_import(uint64_t key);
/* Synchronisation point: pools over their release threshold release what they can. */
CUresult fc_pools_sync(void);
/* No context of this process left on dev: pools and graph memory of dev release every
 * unused reserved byte. */
void fc_release_device_caches(int dev);
/* Graph memory of a launch: per physical device, alloc = bytes its allocations map, freed =
 * bytes of them (or of other graphs' allocations) its free nodes return. */
CUresult fc_graphmem_launch(const uint64_t alloc[FC_MAX_DEV], const uint64_t freed[FC_MAX_DEV]);
void fc_graphmem_free(int dev, uint64_t size);
CUresult fc_graphmem_back(const uint64_t bytes[FC_MAX_DEV]);

/* ---- graphs (cu_graph.c) ---- */
/* cuMemFree/cuMemFreeAsync of a graph allocation's address (record a, A_GRAPHVA). */
CUresult fc_graph_free_va(uint64_t key);

#endif
