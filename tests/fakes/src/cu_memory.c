/* Every path that takes device memory, plus managed and host memory.  Device memory is
 * charged to the shared state (physical, across processes); the table of this process
 * maps each returned address or handle to what it charged. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

#include "cu.h"

#define GRANULARITY FC_GRANULARITY

uint64_t fc_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Records an allocation under a fresh address; charges size bytes on dev unless it comes
 * from a pool (whose reserve was charged when it grew: fc_pool_take). */
CUresult fc_device_alloc(int dev, uint64_t size, int kind, struct fc_ctx *ctx,
                         struct fc_pool *pool, uint64_t *out) {
    if (!pool && fc_charge(dev, size) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (!a) {
        if (pool)
            fc_pool_give(pool, size);
        else
            fc_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fc_obj_mutex);
    a->key = fc_addr_new(size, size >= GRANULARITY ? GRANULARITY : 512, kind == A_DEVICE32);
    a->size = size;
    a->kind = kind;
    a->dev = dev;
    a->ctx = ctx;
    a->pool = pool;
    int ok = a->key != 0;
    if (ok) fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    if (!ok) {
        fc_free_record(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a->key;
    return CUDA_SUCCESS;
}

struct fc_vmm_phys;
static void vmm_drop(struct fc_vmm_phys *p);
static void vmm_sweep(void);

void fc_free_record(struct fc_alloc *a) {
    switch (a->kind) {
    case A_DEVICE:
    case A_DEVICE32:
    case A_ARRAY:
    case A_MIPMAP:
        if (a->pool && a->ipc_id && fc_ipc_exporter_free(a->ipc_index, a->ipc_id, 0))
            fc_pool_give_away(a->pool, a->size); /* imported elsewhere: kept, charged here */
        else if (a->pool)
            fc_pool_give(a->pool, a->size); /* back to the pool: still reserved */
        else if (a->ipc_id && fc_ipc_exporter_free(a->ipc_index, a->ipc_id, 1))
            ; /* exported and open elsewhere: the memory stays, charged to an opener now */
        else if (a->dev >= 0)
            fc_uncharge(a->dev, a->size);
        break;
    case A_IPC: fc_ipc_close(a->ipc_index, a->ipc_id); break;
    case A_GRAPHVA:
        if (a->live) fc_graphmem_free(a->dev, a->size);
        break;
    case A_MANAGED: fc_managed(-(int64_t)a->size); break;
    case A_HOST: free(a->host); break;
    case A_VMM: vmm_drop(a->vmm); break;
    default: break;
    }
    free(a);
}

int fc_free_pool_import(uint64_t key) {
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(key);
    a = (a && a->kind == A_IPC && a->pool_import) ? fc_alloc_take(key) : NULL;
    pthread_mutex_unlock(&fc_obj_mutex);
    if (!a) return 0;
    uint64_t held = a->size;
    fc_free_record(a); /* this process stops holding it */
    fc_addr_free(key, held, 0);
    return 1;
}

/* Removes the record of key if it is one of the kinds in mask (bit per kind). */
static struct fc_alloc *take_kind(uint64_t key, unsigned mask) {
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(key);
    if (a && (mask & (1u << a->kind)) && !(a->kind == A_VMM && a->maps))
        a = fc_alloc_take(key);
    else
        a = NULL;
    pthread_mutex_unlock(&fc_obj_mutex);
    return a;
}

struct ctx_sweep {
    struct fc_ctx *ctx;
    struct fc_alloc **list;
    size_t n, cap;
    uint64_t graph_freed[FC_MAX_DEV];
};

static void sweep_one(struct fc_alloc *a, void *arg) {
    struct ctx_sweep *s = arg;
    if (a->ctx != s->ctx || a->kind == A_VMM || a->kind == A_VA) return;
    if (a->kind == A_GRAPHVA && a->maps > 0) {
        /* the address stays with its alloc node; only the mapping goes */
        if (a->live) s->graph_freed[a->dev] += a->size;
        a->live = 0;
        a->ctx = NULL;
        return;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct fc_alloc **l = realloc(s->list, cap * sizeof *l);
        if (!l) return;
        s->list = l;
        s->cap = cap;
    }
    s->list[s->n++] = a;
}

struct reown { struct fc_ctx *from, *to; };

static void reown_one(struct fc_alloc *a, void *arg) {
    struct reown *r = arg;
    if (a->ctx == r->from) a->ctx = r->to;
}

void fc_reown_ctx_allocations(struct fc_ctx *from, struct fc_ctx *to) {
    struct reown r = {from, to};
    pthread_mutex_lock(&fc_obj_mutex);
    fc_alloc_each(reown_one, &r);
    pthread_mutex_unlock(&fc_obj_mutex);
}

void fc_free_ctx_allocations(struct fc_ctx *c) {
    struct ctx_sweep s = {.ctx = c};
    pthread_mutex_lock(&fc_obj_mutex);
    fc_alloc_each(sweep_one, &s);
    for (size_t i = 0; i < s.n; i++) fc_alloc_take(s.list[i]->key);
    pthread_mutex_unlock(&fc_obj_mutex);
    for (size_t i = 0; i < s.n; i++) fc_free_record(s.list[i]);
    free(s.list);
    for (int d = 0; d < FC_MAX_DEV; d++)
        if (s.graph_freed[d]) fc_graphmem_free(d, s.graph_freed[d]);
}

/* ---- info ---- */
FC_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    vmm_sweep(); /* VMM memory only exported fds kept, now unheld */
    uint64_t used, tot;
    fc_lock();
    fc_reap_locked();
    fc_meminfo_locked(c->dev, &used, &tot); /* a MIG device: its GPU instance's */
    fc_unlock();
    *total = tot;
    *free_bytes = used < tot ? tot - used : 0;
    return CUDA_SUCCESS;
}

static unsigned int clamp32(uint64_t v) { return v > 0xffffffffull ? 0xffffffffu : (unsigned)v; }

FC_API CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(free_bytes ? &f : NULL, total ? &t : NULL);
    if (r) return r;
    *free_bytes = clamp32(f);
    *total = clamp32(t);
    return CUDA_SUCCESS;
}

/* ---- linear device memory ---- */
FC_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t p;
    r = fc_device_alloc(c->dev, bytesize, A_DEVICE, c, NULL, &p);
    if (!r) *dptr = p;
    return r;
}

FC_API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t p;
    r = fc_device_alloc(c->dev, bytesize, A_DEVICE32, c, NULL, &p);
    if (!r) *dptr = (CUdeviceptr_v1)p;
    return r;
}

FC_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (dptr == 0) return CUDA_SUCCESS; /* freeing NULL is a no-op, as in the real driver */
    struct fc_alloc *a = take_kind(dptr, 1u << A_DEVICE | 1u << A_DEVICE32 | 1u << A_MANAGED);
    if (!a && fc_free_pool_import(dptr)) return CUDA_SUCCESS;
    if (!a) return fc_graph_free_va(dptr); /* a graph allocation, or INVALID_VALUE */
    uint64_t key = a->key, size = a->size;
    int linear = (a->kind == A_DEVICE || a->kind == A_DEVICE32) && !a->pool;
    int low32 = a->kind == A_DEVICE32;
    fc_free_record(a);
    if (linear) fc_addr_free(key, size, low32);
    /* a real free can block (it waits for the device); the address is free meanwhile */
    uint64_t pause = fc_knobs()->free_pause_ms;
    if (pause) usleep((useconds_t)(pause * 1000));
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemFree(CUdeviceptr_v1 dptr) { return cuMemFree_v2(dptr); }

FC_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height,
                                   unsigned int elementSizeBytes) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!dptr || !pPitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = fc_round_up(width, 512), p;
    r = fc_device_alloc(c->dev, pitch * height, A_DEVICE, c, NULL, &p);
    if (r) return r;
    *dptr = p;
    *pPitch = pitch;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int width,
                                unsigned int height, unsigned int elementSizeBytes) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!dptr || !pPitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = fc_round_up(width, 512), p;
    r = fc_device_alloc(c->dev, pitch * height, A_DEVICE32, c, NULL, &p);
    if (r) return r;
    *dptr = (CUdeviceptr_v1)p;
    *pPitch = (unsigned int)pitch;
    return CUDA_SUCCESS;
}

/* ---- arrays ---- */
static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

/* Bytes of a W x H x D array (0 for an invalid description). */
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    uint64_t eb = format_bytes(f);
    if (!eb || w == 0 || (ch != 1 && ch != 2 && ch != 4)) return 0;
    return fc_round_up(w * (h ? h : 1) * (d ? d : 1) * eb * ch, 512);
}

static CUresult array_alloc(uint64_t bytes, int kind, uint64_t *out) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    return fc_device_alloc(c->dev, bytes, kind, c, NULL, out);
}

FC_API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    r = array_alloc(array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), A_ARRAY, &h);
    if (!r) *pHandle = (CUarray)(uintptr_t)h;
    return r;
}

FC_API CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    if (!d) return fc_check_init() ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY_DESCRIPTOR v2 = {d->Width, d->Height, d->Format, d->NumChannels};
    return cuArrayCreate_v2(pHandle, &v2);
}

FC_API CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pHandle || !d) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    r = array_alloc(array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), A_ARRAY,
                    &h);
    if (!r) *pHandle = (CUarray)(uintptr_t)h;
    return r;
}

FC_API CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    if (!d) return fc_check_init() ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR v2 = {d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                                  d->Flags};
    return cuArray3DCreate_v2(pHandle, &v2);
}

FC_API CUresult cuArrayDestroy(CUarray hArray) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_alloc *a = take_kind((uint64_t)(uintptr_t)hArray, 1u << A_ARRAY);
    if (!a) return CUDA_ERROR_INVALID_HANDLE;
    fc_free_record(a);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int numLevels) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pHandle || !d || numLevels == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0, w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned i = 0; i < numLevels; i++) {
        uint64_t b = array_bytes(w, h, z, d->Format, d->NumChannels);
        if (!b) return CUDA_ERROR_INVALID_VALUE;
        total += b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    uint64_t handle;
    r = array_alloc(total, A_MIPMAP, &handle);
    if (!r) *pHandle = (CUmipmappedArray)(uintptr_t)handle;
    return r;
}

FC_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_alloc *a = take_kind((uint64_t)(uintptr_t)h, 1u << A_MIPMAP);
    if (!a) return CUDA_ERROR_INVALID_HANDLE;
    fc_free_record(a);
    return CUDA_SUCCESS;
}

/* ---- managed and host memory ---- */
FC_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    fc_managed((int64_t)bytesize);
    pthread_mutex_lock(&fc_obj_mutex);
    a->key = fc_addr_new(bytesize, GRANULARITY, 0);
    a->size = bytesize;
    a->kind = A_MANAGED;
    a->dev = -1;
    a->ctx = c;
    fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    *dptr = a->key;
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t bytesize) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!pp || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    struct fc_alloc *a = calloc(1, sizeof *a);
    void *mem = NULL;
    if (!a || posix_memalign(&mem, 4096, bytesize) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->key = (uint64_t)(uintptr_t)mem;
    a->host = mem;
    a->size = bytesize;
    a->kind = A_HOST;
    a->dev = -1;
    a->ctx = c;
    pthread_mutex_lock(&fc_obj_mutex);
    fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    *pp = mem;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return host_alloc(pp, bytesize); }

FC_API CUresult cuMemAllocHost(void **pp, unsigned int bytesize) { return host_alloc(pp, bytesize); }

FC_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    if (flags & ~0x7u) return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

FC_API CUresult cuMemFreeHost(void *p) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_alloc *a = take_kind((uint64_t)(uintptr_t)p, 1u << A_HOST);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    fc_free_record(a);
    return CUDA_SUCCESS;
}

/* ---- copies and memset: no data moves; the range must lie in a live allocation ---- */
struct range_q {
    uint64_t p, n;
    int found;
};

static void range_one(struct fc_alloc *a, void *arg) {
    struct range_q *q = arg;
    if (a->kind != A_DEVICE && a->kind != A_DEVICE32 && a->kind != A_MANAGED && a->kind != A_IPC)
        return;
    if (q->p >= a->key && q->p + q->n <= a->key + a->size) q->found = 1;
}

static CUresult check_range(uint64_t p, uint64_t n) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    struct range_q q = {p, n, 0};
    pthread_mutex_lock(&fc_obj_mutex);
    fc_alloc_each(range_one, &q);
    pthread_mutex_unlock(&fc_obj_mutex);
    return q.found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    CUresult r = check_range(dst, n);
    return r ? r : (src ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}
FC_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) {
    return cuMemcpyHtoD_v2(dst, src, n);
}
FC_API CUresult cuMemcpyHtoD(CUdeviceptr_v1 dst, const void *src, unsigned int n) {
    return cuMemcpyHtoD_v2(dst, src, n);
}
FC_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    CUresult r = check_range(src, n);
    return r ? r : (dst ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}
FC_API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) {
    return cuMemcpyDtoH_v2(dst, src, n);
}
FC_API CUresult cuMemcpyDtoH(void *dst, CUdeviceptr_v1 src, unsigned int n) {
    return cuMemcpyDtoH_v2(dst, src, n);
}
FC_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n) {
    (void)uc;
    return check_range(dst, n);
}
FC_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char uc, size_t n) {
    return cuMemsetD8_v2(dst, uc, n);
}
FC_API CUresult cuMemsetD8(CUdeviceptr_v1 dst, unsigned char uc, unsigned int n) {
    return cuMemsetD8_v2(dst, uc, n);
}

/* ---- virtual memory management ----
 * A handle (an A_VMM record, keyed by the handle value) names a physical allocation (struct
 * fc_vmm_phys).  The handle's record lives while it has references (cuMemCreate or an import:
 * 1; each cuMemRetainAllocationHandle: +1; each cuMemRelease: -1) or mappings made with it.
 * The physical memory lives while a handle record of it lives, or — once exported — while
 * any process holds an exported (or importing) file descriptor open: the real driver's rule
 * ("once all shareable handles are closed and the allocation is released, the memory is
 * released").  Charged to the creating process from cuMemCreate until it is freed. */
struct fc_vmm_phys {
    uint64_t id; /* unique in this process; what an exported fd names */
    uint64_t size;
    int dev;      /* physical; -1: host memory */
    int charged;  /* created here: charged to dev until freed */
    int nrec;     /* handle records naming it in this process */
    int orphan;   /* no record left, kept by open exported fds (rechecked lazily) */
    int file_fd;  /* the memfd naming it (-1: never exported / imported); holds no lock */
    int held_fd;  /* imported from another process: our own locked description of its fd,
                   * which keeps the creator's memory alive while we use it */
    CUmemAllocationProp prop;
    struct fc_vmm_phys *next;
};

struct mapping {
    uint64_t va, size, handle;
};
static struct mapping *maps;
static size_t nmaps, capmaps;

/* Guards the phys list (taken after fc_obj_mutex when both are needed, never before). */
static pthread_mutex_t vmm_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct fc_vmm_phys *phys_list;
static int n_orphans;
static uint64_t phys_next_id = 1;
/* what an exported fd says of its creator: pid, PID namespace and a per-process nonce */
static pid_t nonce_pid;
static uint64_t nonce;

#define VMM_MAGIC "fakecuda-vmm-1"

/* Whether a description of the file other than fd holds a lock: an exported or importing
 * fd is still open somewhere (OFD locks go with the last fd of their description). */
static int fd_held(int fd) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0) return 0;
    return fl.l_type != F_UNLCK;
}

/* A new description of fd's file (/proc/self/fd), read-locked: -1 on failure. */
static int locked_reopen(int fd) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0) return -1;
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(nfd, F_OFD_SETLK, &fl) < 0) {
        close(nfd);
        return -1;
    }
    return nfd;
}

static void phys_unlink_locked(struct fc_vmm_phys *p) {
    for (struct fc_vmm_phys **q = &phys_list; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
}

static void phys_free(struct fc_vmm_phys *p) {
    if (p->file_fd >= 0) close(p->file_fd);
    if (p->held_fd >= 0) close(p->held_fd);
    if (p->charged && p->dev >= 0) fc_uncharge(p->dev, p->size);
    free(p);
}

/* A handle record of p went: the memory goes with the last one unless an fd holds it. */
static void vmm_drop(struct fc_vmm_phys *p) {
    if (!p) return;
    pthread_mutex_lock(&vmm_mutex);
    int gone = --p->nrec == 0;
    if (gone && p->charged && p->file_fd >= 0 && fd_held(p->file_fd)) {
        p->orphan = 1;
        n_orphans++;
        gone = 0;
    }
    if (gone) phys_unlink_locked(p);
    pthread_mutex_unlock(&vmm_mutex);
    if (gone) phys_free(p);
}

/* Frees the orphans whose exported fds have all been closed (lazily: at VMM calls and
 * cuMemGetInfo). */
static void vmm_sweep(void) {
    if (!__atomic_load_n(&n_orphans, __ATOMIC_RELAXED)) return;
    struct fc_vmm_phys *dead = NULL;
    pthread_mutex_lock(&vmm_mutex);
    for (struct fc_vmm_phys **q = &phys_list; *q;) {
        struct fc_vmm_phys *p = *q;
        if (p->orphan && !fd_held(p->file_fd)) {
            *q = p->next;
            n_orphans--;
            p->next = dead;
            dead = p;
        } else {
            q = &p->next;
        }
    }
    pthread_mutex_unlock(&vmm_mutex);
    while (dead) {
        struct fc_vmm_phys *n = dead->next;
        phys_free(dead);
        dead = n;
    }
}

/* A new handle record naming p (p->nrec already counts it); 0 when out of memory. */
static uint64_t handle_new(struct fc_vmm_phys *p) {
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (!a) return 0;
    pthread_mutex_lock(&fc_obj_mutex);
    a->key = fc_addr_new(p->size, GRANULARITY, 0) | 1; /* handles are not addresses */
    a->size = p->size;
    a->kind = A_VMM;
    a->dev = p->dev;
    a->refs = 1;
    a->vmm = p;
    if (a->key != 1) fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    if (a->key == 1) {
        free(a);
        return 0;
    }
    return a->key;
}

static CUresult check_prop(const CUmemAllocationProp *prop, int *dev) {
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        *dev = fc_location_dev(prop->location.id); /* a CUDA_VISIBLE_DEVICES ordinal */
        return *dev < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: *dev = -1; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

FC_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    CUresult r = fc_check_init();
    if (r) return r;
    int dev;
    if (!granularity || option > CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) return CUDA_ERROR_INVALID_VALUE;
    r = check_prop(prop, &dev);
    if (r) return r;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

static struct fc_vmm_phys *phys_new(uint64_t size, int dev, const CUmemAllocationProp *prop) {
    struct fc_vmm_phys *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->size = size;
    p->dev = dev;
    p->nrec = 1;
    p->file_fd = p->held_fd = -1;
    p->prop = *prop;
    pthread_mutex_lock(&vmm_mutex);
    p->id = phys_next_id++;
    p->next = phys_list;
    phys_list = p;
    pthread_mutex_unlock(&vmm_mutex);
    return p;
}

/* p without records (its creation failed half-way). */
static void phys_abandon(struct fc_vmm_phys *p) {
    pthread_mutex_lock(&vmm_mutex);
    phys_unlink_locked(p);
    pthread_mutex_unlock(&vmm_mutex);
    phys_free(p);
}

FC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    vmm_sweep();
    int dev;
    if (!handle || size == 0 || size % GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    r = check_prop(prop, &dev);
    if (r) return r;
    if (dev >= 0 && fc_charge(dev, size) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct fc_vmm_phys *p = phys_new(size, dev, prop);
    if (!p) {
        if (dev >= 0) fc_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->charged = 1;
    uint64_t h = handle_new(p);
    if (!h) {
        phys_abandon(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = h;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_alloc *a = NULL;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *h = fc_alloc_get(handle);
    if (h && h->kind == A_VMM && h->refs > 0) {
        if (--h->refs == 0 && !h->maps) a = fc_alloc_take(handle);
        r = CUDA_SUCCESS;
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    if (a) fc_free_record(a);
    vmm_sweep();
    return r;
}

FC_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags) {
    (void)addr;
    CUresult r = fc_check_init();
    if (r) return r;
    if (!ptr || size == 0 || size % GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fc_obj_mutex);
    a->key = fc_addr_new(size, alignment > GRANULARITY ? alignment : GRANULARITY, 0);
    a->size = size;
    a->kind = A_VA;
    a->dev = -1;
    fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    *ptr = a->key;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CUresult r = fc_check_init();
    if (r) return r;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(ptr);
    if (a && a->kind == A_VA && a->size == size)
        a = fc_alloc_take(ptr);
    else
        a = NULL;
    pthread_mutex_unlock(&fc_obj_mutex);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    free(a);
    return CUDA_SUCCESS;
}

struct va_q {
    uint64_t p, n;
    int found;
};

static void va_one(struct fc_alloc *a, void *arg) {
    struct va_q *q = arg;
    if (a->kind == A_VA && q->p >= a->key && q->p + q->n <= a->key + a->size) q->found = 1;
}

FC_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (size == 0 || flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *h = fc_alloc_get(handle);
    struct va_q q = {ptr, size, 0};
    fc_alloc_each(va_one, &q);
    if (!h || h->kind != A_VMM || h->refs <= 0) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (!q.found || offset + size > h->size) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (size_t i = 0; i < nmaps; i++)
            if (ptr < maps[i].va + maps[i].size && maps[i].va < ptr + size) r = CUDA_ERROR_INVALID_VALUE;
        if (!r && nmaps == capmaps) {
            size_t cap = capmaps ? capmaps * 2 : 64;
            struct mapping *m = realloc(maps, cap * sizeof *m);
            if (m) {
                maps = m;
                capmaps = cap;
            } else {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (!r) {
            maps[nmaps++] = (struct mapping){ptr, size, handle};
            h->maps++;
        }
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    return r;
}

FC_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_alloc *to_free[16];
    int nfree = 0, hit = 0;
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t i = 0; i < nmaps;) {
        struct mapping m = maps[i];
        if (m.va >= ptr && m.va + m.size <= ptr + size) {
            hit = 1;
            maps[i] = maps[--nmaps];
            struct fc_alloc *h = fc_alloc_get(m.handle);
            if (h && --h->maps == 0 && h->refs == 0 && nfree < 16) to_free[nfree++] = fc_alloc_take(m.handle);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    for (int i = 0; i < nfree; i++) fc_free_record(to_free[i]);
    vmm_sweep();
    return hit ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            fc_location_dev(desc[i].location.id) < 0)
            return CUDA_ERROR_INVALID_DEVICE;
    }
    uint64_t covered = 0;
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t i = 0; i < nmaps; i++) {
        uint64_t a = maps[i].va > ptr ? maps[i].va : ptr;
        uint64_t b = maps[i].va + maps[i].size < ptr + size ? maps[i].va + maps[i].size : ptr + size;
        if (b > a) covered += b - a;
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The handle value a mapping containing addr was made with, one more reference to it. */
FC_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!handle || !addr) return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = (uint64_t)(uintptr_t)addr;
    r = CUDA_ERROR_INVALID_VALUE; /* not mapped */
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t i = 0; i < nmaps; i++) {
        if (p < maps[i].va || p >= maps[i].va + maps[i].size) continue;
        struct fc_alloc *h = fc_alloc_get(maps[i].handle);
        if (h && h->kind == A_VMM) {
            h->refs++; /* a released handle still mapped comes back to life */
            *handle = h->key;
            r = CUDA_SUCCESS;
        }
        break;
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    return r;
}

/* The live handle's physical allocation (INVALID_VALUE when not one). */
static CUresult phys_of(CUmemGenericAllocationHandle handle, struct fc_vmm_phys **out) {
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *h = fc_alloc_get(handle);
    int ok = h && h->kind == A_VMM && h->refs > 0 && h->vmm;
    if (ok) *out = h->vmm;
    pthread_mutex_unlock(&fc_obj_mutex);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                       CUmemGenericAllocationHandle handle) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_vmm_phys *p;
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    r = phys_of(handle, &p);
    if (!r) *prop = p->prop;
    return r;
}

static void nonce_locked(void) {
    if (nonce_pid == getpid() && nonce) return;
    nonce_pid = getpid();
    nonce = fc_now() ^ ((uint64_t)(uintptr_t)&nonce << 16) ^ (uint64_t)nonce_pid;
    if (!nonce) nonce = 1;
}

/* The memfd naming p (made at its first export); -1 on failure.  Under vmm_mutex. */
static int phys_file_locked(struct fc_vmm_phys *p) {
    if (p->file_fd >= 0) return p->file_fd;
    if (p->held_fd >= 0) return p->held_fd; /* imported: the creator's file */
    nonce_locked();
    int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
    if (fd < 0) return -1;
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%s %d %llu %llu %llu %d %llu %d\n", VMM_MAGIC,
                     (int)nonce_pid, (unsigned long long)fc_ident()->ns_ino,
                     (unsigned long long)nonce, (unsigned long long)p->id, p->dev,
                     (unsigned long long)p->size, (int)p->prop.requestedHandleTypes);
    if (n <= 0 || n >= (int)sizeof buf || write(fd, buf, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    p->file_fd = fd;
    return fd;
}

FC_API CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                             CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    vmm_sweep();
    struct fc_vmm_phys *p;
    if (!shareableHandle || flags) return CUDA_ERROR_INVALID_VALUE;
    r = phys_of(handle, &p);
    if (r) return r;
    /* a type the allocation was not created for (prop.requestedHandleTypes) */
    if (handleType == CU_MEM_HANDLE_TYPE_NONE ||
        ((unsigned)p->prop.requestedHandleTypes & (unsigned)handleType) != (unsigned)handleType)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&vmm_mutex);
    int file = phys_file_locked(p);
    int fd = file >= 0 ? locked_reopen(file) : -1;
    pthread_mutex_unlock(&vmm_mutex);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType) {
    CUresult r = fc_check_init();
    if (r) return r;
    vmm_sweep();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return shHandleType == CU_MEM_HANDLE_TYPE_NONE ? CUDA_ERROR_INVALID_VALUE
                                                       : CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle;
    char buf[256];
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    if (n <= 0) return CUDA_ERROR_INVALID_VALUE;
    buf[n] = 0;
    char magic[32];
    int pid, dev, types;
    unsigned long long ino, nc, id, size;
    if (sscanf(buf, "%31s %d %llu %llu %llu %d %llu %d", magic, &pid, &ino, &nc, &id, &dev, &size,
               &types) != 8 ||
        strcmp(magic, VMM_MAGIC) != 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_vmm_phys *p = NULL;
    pthread_mutex_lock(&vmm_mutex);
    if (pid == (int)getpid() && ino == fc_ident()->ns_ino && nonce_pid == getpid() && nc == nonce) {
        /* exported by this process: a new handle to the same physical allocation */
        for (p = phys_list; p && p->id != id; p = p->next) {
        }
        if (p) {
            if (p->orphan) {
                p->orphan = 0;
                n_orphans--;
            }
            p->nrec++;
        }
        pthread_mutex_unlock(&vmm_mutex);
        if (!p) return CUDA_ERROR_INVALID_VALUE; /* freed: every fd had been closed */
    } else {
        pthread_mutex_unlock(&vmm_mutex);
        /* another process's memory (charged to it): held here by a locked description */
        if (dev < -1 || dev >= fc_knobs()->ndev) return CUDA_ERROR_INVALID_VALUE;
        int held = locked_reopen(fd);
        if (held < 0) return CUDA_ERROR_INVALID_VALUE;
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = (CUmemAllocationHandleType)types;
        prop.location.type = dev >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST_NUMA;
        prop.location.id = dev >= 0 ? fc_ordinal(dev) : 0;
        p = phys_new(size, dev, &prop);
        if (!p) {
            close(held);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->held_fd = held; /* a re-export reopens the same file */
    }
    uint64_t h = handle_new(p);
    if (!h) {
        vmm_drop(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = h;
    return CUDA_SUCCESS;
}

/* ---- legacy CUDA IPC (README.md "Legacy CUDA IPC"): the export lives in the shared
 * state (state.c); the handle names its entry ---- */
#define IPC_MAGIC "fakeipc1"
struct ipc_handle { /* the 64 bytes of a CUipcMemHandle */
    char magic[8];
    int32_t index;
    int32_t dev;
    uint64_t id;
    uint64_t size;
    int32_t pid; /* the exporter's, for the curious; the entry is what counts */
    char pad[CU_IPC_HANDLE_SIZE - 36];
};
_Static_assert(sizeof(struct ipc_handle) == CU_IPC_HANDLE_SIZE, "CUipcMemHandle is 64 bytes");

/* a's export entry (made on its first export) in the 64 bytes at out, under magic.
 * Under fc_obj_mutex. */
static CUresult export_entry(struct fc_alloc *a, const char *magic, void *out) {
    if (!a->ipc_id && fc_ipc_export(a->dev, a->size, &a->ipc_index, &a->ipc_id) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* the export table is full */
    struct ipc_handle h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, magic, sizeof h.magic);
    h.index = a->ipc_index;
    h.dev = a->dev;
    h.id = a->ipc_id;
    h.size = a->size;
    h.pid = (int32_t)getpid();
    memcpy(out, &h, sizeof h);
    return CUDA_SUCCESS;
}

FC_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(dptr);
    /* the base of a cuMemAlloc allocation (not a pool's: the real driver refuses those) */
    if (!a || (a->kind != A_DEVICE && a->kind != A_DEVICE32) || a->pool) {
        pthread_mutex_unlock(&fc_obj_mutex);
        return CUDA_ERROR_INVALID_VALUE;
    }
    r = export_entry(a, IPC_MAGIC, pHandle); /* the same handle each time for one allocation */
    pthread_mutex_unlock(&fc_obj_mutex);
    return r;
}

/* ---- pool IPC (README.md "Pool IPC"): a pool pointer's export is an entry of the same
 * table as legacy IPC's; the 64 bytes of its CUmemPoolPtrExportData name it ---- */
#define POOL_PTR_MAGIC "fakepptr"
_Static_assert(sizeof(struct ipc_handle) == sizeof(CUmemPoolPtrExportData),
               "CUmemPoolPtrExportData is 64 bytes");

FC_API CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!shareData_out) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(ptr);
    /* the base of an allocation of a pool made shareable */
    if (!a || a->kind != A_DEVICE || !a->pool || !fc_pool_pointers_exportable(a->pool)) {
        pthread_mutex_unlock(&fc_obj_mutex);
        return CUDA_ERROR_INVALID_VALUE;
    }
    r = export_entry(a, POOL_PTR_MAGIC, shareData_out);
    pthread_mutex_unlock(&fc_obj_mutex);
    return r;
}

CUresult fc_pool_import_pointer(CUdeviceptr *ptr_out, int pool_dev,
                                const CUmemPoolPtrExportData *shareData) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!ptr_out || !shareData) return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle h;
    memcpy(&h, shareData, sizeof h);
    if (memcmp(h.magic, POOL_PTR_MAGIC, sizeof h.magic) != 0 || h.dev != pool_dev)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t key;
    pthread_mutex_lock(&fc_obj_mutex);
    r = fc_ipc_map(h.index, h.id, c, 1, &key);
    pthread_mutex_unlock(&fc_obj_mutex);
    if (r == CUDA_ERROR_INVALID_HANDLE) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) *ptr_out = key;
    return r;
}

struct ipc_q {
    uint64_t id;
    struct fc_alloc *found;
};

static void ipc_one(struct fc_alloc *a, void *arg) {
    struct ipc_q *q = arg;
    if (a->kind == A_IPC && a->ipc_id == q->id) q->found = a;
}

FC_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle h;
    memcpy(&h, &handle, sizeof h);
    if (memcmp(h.magic, IPC_MAGIC, sizeof h.magic) != 0) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&fc_obj_mutex);
    struct ipc_q q = {h.id, NULL};
    fc_alloc_each(ipc_one, &q);
    if (q.found) { /* opened here already: the same address, one more reference */
        q.found->refs++;
        *pdptr = q.found->key;
        pthread_mutex_unlock(&fc_obj_mutex);
        return CUDA_SUCCESS;
    }
    uint64_t key;
    r = fc_ipc_map(h.index, h.id, c, 0, &key);
    if (!r) *pdptr = key;
    pthread_mutex_unlock(&fc_obj_mutex);
    return r;
}

CUresult fc_ipc_map(int index, uint64_t id, struct fc_ctx *c, int pool_import, uint64_t *out) {
    int dev;
    uint64_t size;
    int o = fc_ipc_open(index, id, &dev, &size);
    if (o < 0)
        return o == -2 ? CUDA_ERROR_INVALID_CONTEXT
               : o == -3 ? CUDA_ERROR_TOO_MANY_PEERS
                         : CUDA_ERROR_INVALID_HANDLE;
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (a) a->key = fc_addr_new(size, size >= GRANULARITY ? GRANULARITY : 512, 0);
    if (!a || !a->key) {
        free(a);
        fc_ipc_close(index, id);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    a->kind = A_IPC;
    a->dev = dev;
    a->ctx = c;
    a->refs = 1;
    a->ipc_index = index;
    a->ipc_id = id;
    a->pool_import = pool_import;
    fc_alloc_put(a);
    *out = a->key;
    return CUDA_SUCCESS;
}

FC_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
    return cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

FC_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(dptr);
    if (!a || a->kind != A_IPC || a->pool_import) {
        pthread_mutex_unlock(&fc_obj_mutex);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (--a->refs > 0) a = NULL;
    else fc_alloc_take(dptr);
    pthread_mutex_unlock(&fc_obj_mutex);
    if (a) {
        uint64_t key = a->key, size = a->size;
        fc_free_record(a);
        fc_addr_free(key, size, 0);
    }
    return CUDA_SUCCESS;
}
