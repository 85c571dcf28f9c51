/* Stream-ordered allocator: memory pools that keep memory, as the real ones do, and the
 * per-device memory pool behind graph memory nodes.
 *
 * A pool has reserved bytes (physical: charged to the device and to this process when the
 * reserve grows, so NVML sees them) and used bytes (handed out).  An allocation takes free
 * reserved bytes when there are enough (they are fungible: no fragmentation), else the
 * reserve grows by what is missing, rounded up to 2 MiB.  A free gives the bytes back to
 * the pool, which keeps them reserved.  At synchronisation points a pool over its release
 * threshold releases unused reserve down to max(threshold, used); cuMemPoolTrimTo releases
 * down to max(minBytesToKeep, used); both in 2 MiB steps.  When the last context of this
 * process on a device goes, pools and graph memory of the device release all they can.
 *
 * FAKECUDA_POOL_FRAGMENTS=1: the free reserve is a list of blocks that never merge (a
 * real pool fragments). An allocation takes the first free block at least its size (the
 * rest stays a block), else the reserve grows by its whole size, rounded up to 2 MiB,
 * however much free reserve the pool holds; a trim releases whole free blocks, largest
 * first, while the reserve is above its target. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <string.h>

#include "cu.h"

struct fc_pool {
    int dev; /* physical */
    int is_default;
    int destroyed; /* cuMemPoolDestroy called: frees release at once */
    int exportable; /* created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    int exported;   /* cuMemPoolExportToShareableHandle done: its pointers can be exported */
    int imported;   /* cuMemPoolImportFromShareableHandle: another process's, no allocations */
    uint64_t used, used_high, reserved, reserved_high, threshold;
    int reuse[3]; /* the reuse-policy attributes: accepted, remembered, ignored */
    uint64_t blocks[256]; /* FAKECUDA_POOL_FRAGMENTS: the free blocks */
    int nblocks;
    CUmemoryPool handle;
    struct fc_pool *next; /* every pool of the process */
};

static struct fc_pool default_pool[FC_MAX_DEV]; /* by physical device */
static struct fc_pool *current_pool[FC_MAX_DEV];
static struct fc_pool *pools; /* the created ones, then default ones as they appear */
/* guards pools and graph memory; taken before the state lock, never under fc_obj_mutex */
static pthread_mutex_t pool_mutex = PTHREAD_MUTEX_INITIALIZER;

static uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static struct fc_pool *pool_of(CUmemoryPool h) { return fc_handle_get(h, K_POOL); }

static void pool_init(struct fc_pool *p, int dev) {
    p->dev = dev;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->next = pools;
    pools = p;
}

/* dev's default pool (created on first use), or its current pool. */
static struct fc_pool *device_pool(int dev, int current) {
    pthread_mutex_lock(&pool_mutex);
    struct fc_pool *p = &default_pool[dev];
    if (!p->handle) {
        pool_init(p, dev);
        p->is_default = 1;
        p->handle = fc_handle_new(K_POOL, p);
    }
    if (current && current_pool[dev]) p = current_pool[dev];
    pthread_mutex_unlock(&pool_mutex);
    return p;
}

/* Shrinks the reserve to round_up(max(keep, used), 2 MiB); returns the bytes to uncharge.
 * Under pool_mutex. */
static uint64_t trim_locked(struct fc_pool *p, uint64_t keep) {
    uint64_t target = fc_round_up(max64(keep, p->used), FC_GRANULARITY);
    if (p->reserved <= target) return 0;
    if (fc_knobs()->pool_fragments) { /* whole blocks, largest first */
        uint64_t released = 0;
        while (p->reserved - released > target && p->nblocks) {
            int big = 0;
            for (int i = 1; i < p->nblocks; i++)
                if (p->blocks[i] > p->blocks[big]) big = i;
            released += p->blocks[big];
            p->blocks[big] = p->blocks[--p->nblocks];
        }
        p->reserved -= released;
        return released;
    }
    uint64_t bytes = p->reserved - target;
    p->reserved = target;
    return bytes;
}

static CUresult take_fragmented(struct fc_pool *p, uint64_t size) {
    for (int i = 0; i < p->nblocks; i++) {
        if (p->blocks[i] < size) continue;
        p->blocks[i] -= size;
        if (!p->blocks[i]) p->blocks[i] = p->blocks[--p->nblocks];
        p->used += size;
        p->used_high = max64(p->used_high, p->used);
        return CUDA_SUCCESS;
    }
    uint64_t grow = fc_round_up(size, FC_GRANULARITY);
    if (fc_charge(p->dev, grow) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    p->reserved += grow;
    p->reserved_high = max64(p->reserved_high, p->reserved);
    if (grow > size && p->nblocks < 256) p->blocks[p->nblocks++] = grow - size;
    p->used += size;
    p->used_high = max64(p->used_high, p->used);
    return CUDA_SUCCESS;
}

CUresult fc_pool_take(struct fc_pool *p, uint64_t size) {
    pthread_mutex_lock(&pool_mutex);
    if (fc_knobs()->pool_fragments) {
        CUresult r = take_fragmented(p, size);
        pthread_mutex_unlock(&pool_mutex);
        return r;
    }
    uint64_t avail = p->reserved - p->used;
    if (avail < size) {
        uint64_t grow = fc_round_up(size - avail, FC_GRANULARITY);
        if (fc_charge(p->dev, grow) < 0) {
            pthread_mutex_unlock(&pool_mutex);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved += grow;
        p->reserved_high = max64(p->reserved_high, p->reserved);
    }
    p->used += size;
    p->used_high = max64(p->used_high, p->used);
    pthread_mutex_unlock(&pool_mutex);
    return CUDA_SUCCESS;
}

/* A pool whose pointers can be exported: shareable and exported already (a real driver,
 * an H200 with driver 580, refuses a pointer of a pool not exported yet: INVALID_VALUE) */
int fc_pool_pointers_exportable(const struct fc_pool *p) { return p->exportable && p->exported; }

void fc_pool_give_away(struct fc_pool *p, uint64_t size) {
    pthread_mutex_lock(&pool_mutex);
    p->used = p->used > size ? p->used - size : 0;
    p->reserved = p->reserved > size ? p->reserved - size : 0;
    pthread_mutex_unlock(&pool_mutex);
}

void fc_pool_give(struct fc_pool *p, uint64_t size) {
    pthread_mutex_lock(&pool_mutex);
    p->used = p->used > size ? p->used - size : 0;
    if (fc_knobs()->pool_fragments) {
        if (p->nblocks < 256) p->blocks[p->nblocks++] = size;
        else p->blocks[0] += size; /* the list is full: merged, as a last resort */
    }
    uint64_t release = p->destroyed ? trim_locked(p, 0) : 0;
    if (release) fc_uncharge(p->dev, release);
    pthread_mutex_unlock(&pool_mutex);
}

/* ---- graph memory: one pool per device, reserved until cuDeviceGraphMemTrim ---- */
static struct {
    uint64_t used, used_high, reserved, reserved_high;
} gmem[FC_MAX_DEV];

static uint64_t graph_trim_locked(int dev) {
    uint64_t target = fc_round_up(gmem[dev].used, FC_GRANULARITY);
    if (gmem[dev].reserved <= target) return 0;
    uint64_t bytes = gmem[dev].reserved - target;
    gmem[dev].reserved = target;
    return bytes;
}

/* maps a launch's graph memory (the pool grows to cover it). Caller holds pool_mutex. */
static CUresult graphmem_map(const uint64_t alloc[FC_MAX_DEV], const uint64_t freed[FC_MAX_DEV]) {
    int ndev = fc_knobs()->ndev;
    uint64_t grown[FC_MAX_DEV] = {0};
    for (int d = 0; d < ndev; d++) {
        uint64_t need = gmem[d].used + alloc[d];
        if (!alloc[d] || need <= gmem[d].reserved) continue;
        uint64_t grow = fc_round_up(need - gmem[d].reserved, FC_GRANULARITY);
        if (fc_charge(d, grow) < 0) {
            for (int e = 0; e < d; e++) {
                if (!grown[e]) continue;
                gmem[e].reserved -= grown[e];
                fc_uncharge(e, grown[e]);
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        grown[d] = grow;
        gmem[d].reserved += grow;
    }
    for (int d = 0; d < ndev; d++) {
        gmem[d].reserved_high = max64(gmem[d].reserved_high, gmem[d].reserved);
        gmem[d].used += alloc[d];
        gmem[d].used_high = max64(gmem[d].used_high, gmem[d].used);
        gmem[d].used = gmem[d].used > freed[d] ? gmem[d].used - freed[d] : 0;
    }
    return CUDA_SUCCESS;
}

/* FAKECUDA_GRAPHMEM_LAZY: launches whose memory is not mapped yet, in order */
#define LAZY_MAX 64
static struct { uint64_t alloc[FC_MAX_DEV], freed[FC_MAX_DEV]; } lazy[LAZY_MAX];
static int nlazy;

/* maps what lazy launches left, in order; the first that does not fit fails (the launch
 * failed on the device: the synchronisation that finds it returns OUT_OF_MEMORY), and
 * so does every launch queued behind it. Caller holds pool_mutex. */
static CUresult lazy_catch_up_locked(void) {
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < nlazy; i++)
        if (!r) r = graphmem_map(lazy[i].alloc, lazy[i].freed);
    nlazy = 0;
    return r;
}

CUresult fc_graphmem_launch(const uint64_t alloc[FC_MAX_DEV], const uint64_t freed[FC_MAX_DEV]) {
    pthread_mutex_lock(&pool_mutex);
    CUresult r = CUDA_SUCCESS;
    if (fc_knobs()->graphmem_lazy) {
        if (nlazy == LAZY_MAX) r = lazy_catch_up_locked();
        if (!r) {
            memcpy(lazy[nlazy].alloc, alloc, sizeof lazy[nlazy].alloc);
            memcpy(lazy[nlazy].freed, freed, sizeof lazy[nlazy].freed);
            nlazy++;
        }
    } else {
        r = graphmem_map(alloc, freed);
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

/* A synchronisation: pools above their release threshold give memory back, and lazy
 * graph launches (the work has run) have mapped their memory. */
CUresult fc_pools_sync(void) {
    pthread_mutex_lock(&pool_mutex);
    CUresult r = lazy_catch_up_locked();
    for (struct fc_pool *p = pools; p; p = p->next) {
        if (p->reserved <= p->threshold) continue;
        uint64_t release = trim_locked(p, p->threshold);
        if (release) fc_uncharge(p->dev, release);
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

/* cuGraphUpload: each device's pool grows to back bytes more than it has in use
 * (charged to the device and the process), nothing used yet; OUT_OF_MEMORY when the
 * device lacks it */
CUresult fc_graphmem_back(const uint64_t bytes[FC_MAX_DEV]) {
    int ndev = fc_knobs()->ndev;
    uint64_t grown[FC_MAX_DEV] = {0};
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&pool_mutex);
    (void)lazy_catch_up_locked(); /* ordered behind the launches before it */
    for (int d = 0; d < ndev && !r; d++) {
        uint64_t need = gmem[d].used + bytes[d];
        if (!bytes[d] || need <= gmem[d].reserved) continue;
        uint64_t grow = fc_round_up(need - gmem[d].reserved, FC_GRANULARITY);
        if (fc_charge(d, grow) < 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            for (int e = 0; e < d; e++) {
                gmem[e].reserved -= grown[e];
                if (grown[e]) fc_uncharge(e, grown[e]);
            }
            break;
        }
        grown[d] = grow;
        gmem[d].reserved += grow;
        gmem[d].reserved_high = max64(gmem[d].reserved_high, gmem[d].reserved);
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

void fc_graphmem_free(int dev, uint64_t size) {
    pthread_mutex_lock(&pool_mutex);
    (void)lazy_catch_up_locked(); /* a free synchronises: the launches before it have run */
    gmem[dev].used = gmem[dev].used > size ? gmem[dev].used - size : 0;
    pthread_mutex_unlock(&pool_mutex);
}

void fc_release_device_caches(int dev) {
    pthread_mutex_lock(&pool_mutex);
    (void)lazy_catch_up_locked();
    for (struct fc_pool *p = pools; p; p = p->next) {
        if (p->dev != dev) continue;
        uint64_t release = trim_locked(p, 0);
        if (release) fc_uncharge(dev, release);
    }
    uint64_t release = graph_trim_locked(dev);
    if (release) fc_uncharge(dev, release);
    pthread_mutex_unlock(&pool_mutex);
}

FC_API CUresult cuDeviceGraphMemTrim(CUdevice device) {
    int dev;
    CUresult r = fc_dev_arg(device, &dev);
    if (r) return r;
    pthread_mutex_lock(&pool_mutex);
    uint64_t release = graph_trim_locked(dev);
    if (release) fc_uncharge(dev, release);
    pthread_mutex_unlock(&pool_mutex);
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                             void *value) {
    int dev;
    CUresult r = fc_dev_arg(device, &dev);
    if (r) return r;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = gmem[dev].used; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = gmem[dev].used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = gmem[dev].reserved; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = gmem[dev].reserved_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

/* Only the high watermarks can be set, and only to 0 (a reset to the current value). */
FC_API CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr,
                                             void *value) {
    int dev;
    CUresult r = fc_dev_arg(device, &dev);
    if (r) return r;
    if (!value || *(cuuint64_t *)value != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: gmem[dev].used_high = gmem[dev].used; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: gmem[dev].reserved_high = gmem[dev].reserved; break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

/* ---- pools ---- */
FC_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device) {
    int dev;
    CUresult r = fc_dev_arg(device, &dev);
    if (r) return r;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = device_pool(dev, 0)->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice device) {
    int dev;
    CUresult r = fc_dev_arg(device, &dev);
    if (r) return r;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = device_pool(dev, 1)->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
    int dev;
    CUresult r = fc_dev_arg(device, &dev);
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!p || p->dev != dev) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    current_pool[dev] = p->is_default ? NULL : p;
    pthread_mutex_unlock(&pool_mutex);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = fc_location_dev(props->location.id);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    struct fc_pool *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    p->handle = fc_handle_new(K_POOL, p);
    p->exportable = (props->handleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
    pthread_mutex_lock(&pool_mutex);
    pool_init(p, dev);
    pthread_mutex_unlock(&pool_mutex);
    *pool = p->handle;
    return CUDA_SUCCESS;
}

/* ---- pool IPC (README.md "Pool IPC"): the shareable handle is a file descriptor of a
 * memfd naming the pool's device; the pool's pointers are exported one by one ---- */
#define POOL_FD_MAGIC "fakepool"
struct pool_fd {
    char magic[8];
    int32_t dev;
    int32_t pid;
};

FC_API CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!handle_out || !p || flags || p->imported) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !p->exportable)
        return CUDA_ERROR_INVALID_VALUE; /* a pool made without that handle type */
    int fd = memfd_create("fakecuda-pool", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct pool_fd d = {.dev = p->dev, .pid = (int32_t)getpid()};
    memcpy(d.magic, POOL_FD_MAGIC, sizeof d.magic);
    if (pwrite(fd, &d, sizeof d, 0) != (ssize_t)sizeof d) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle_out = fd;
    p->exported = 1;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                   CUmemAllocationHandleType handleType,
                                                   unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!pool_out || flags || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    struct pool_fd d;
    int fd = (int)(intptr_t)handle;
    if (pread(fd, &d, sizeof d, 0) != (ssize_t)sizeof d ||
        memcmp(d.magic, POOL_FD_MAGIC, sizeof d.magic) != 0 || d.dev < 0 ||
        d.dev >= fc_knobs()->ndev)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_pool *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    p->imported = 1;
    p->handle = fc_handle_new(K_POOL, p);
    pthread_mutex_lock(&pool_mutex);
    pool_init(p, d.dev);
    pthread_mutex_unlock(&pool_mutex);
    *pool_out = p->handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                       CUmemPoolPtrExportData *shareData) {
    struct fc_pool *p = pool_of(pool);
    if (!p || !p->imported) return CUDA_ERROR_INVALID_VALUE;
    return fc_pool_import_pointer(ptr_out, p->dev, shareData);
}

/* Releases the unused reserve at once; the rest goes as the pool's allocations are freed
 * (the real driver defers the destruction the same way). */
FC_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!p || p->is_default) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    if (current_pool[p->dev] == p) current_pool[p->dev] = NULL;
    p->destroyed = 1;
    uint64_t release = trim_locked(p, 0);
    if (release) fc_uncharge(p->dev, release);
    pthread_mutex_unlock(&pool_mutex);
    fc_handle_free(pool); /* the struct stays while allocations from it live */
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    uint64_t release = trim_locked(p, minBytesToKeep);
    if (release) fc_uncharge(p->dev, release);
    pthread_mutex_unlock(&pool_mutex);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value != 0;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0) r = CUDA_ERROR_INVALID_VALUE;
        else p->reserved_high = p->reserved;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0) r = CUDA_ERROR_INVALID_VALUE;
        else p->used_high = p->used;
        break;
    default: r = CUDA_ERROR_INVALID_VALUE; break; /* the current values are read-only */
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

FC_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!p || !value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pool_mutex);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
    pthread_mutex_unlock(&pool_mutex);
    return r;
}

/* ---- stream-ordered allocation ---- */
/* On the pool's device, whatever the current context's device is. */
FC_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream) {
    struct fc_ctx *c;
    CUresult r = fc_stream_ctx(hStream, &c, NULL);
    if (r) return r;
    struct fc_pool *p = pool_of(pool);
    if (!dptr || bytesize == 0 || !p || p->imported) return CUDA_ERROR_INVALID_VALUE;
    r = fc_pool_take(p, bytesize);
    if (r) return r;
    uint64_t ptr;
    r = fc_device_alloc(p->dev, bytesize, A_DEVICE, c, p, &ptr);
    if (!r) *dptr = ptr;
    return r;
}

FC_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream) {
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

/* From the current pool of the stream's device. */
FC_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    struct fc_ctx *c;
    CUresult r = fc_stream_ctx(hStream, &c, NULL);
    if (r) return r;
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return cuMemAllocFromPoolAsync(dptr, bytesize, device_pool(c->dev, 1)->handle, hStream);
}

FC_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

static struct fc_alloc *take_device(uint64_t key) {
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(key);
    a = (a && a->kind == A_DEVICE) ? fc_alloc_take(key) : NULL;
    pthread_mutex_unlock(&fc_obj_mutex);
    return a;
}

FC_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    struct fc_ctx *c;
    CUresult r = fc_stream_ctx(hStream, &c, NULL);
    if (r) return r;
    struct fc_alloc *a = take_device(dptr);
    if (!a && fc_free_pool_import(dptr)) return CUDA_SUCCESS; /* an imported pool pointer */
    if (!a) return fc_graph_free_va(dptr); /* a graph allocation, or INVALID_VALUE */
    fc_free_record(a);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    return cuMemFreeAsync(dptr, hStream);
}
