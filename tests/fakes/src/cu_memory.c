/* Every path that takes device memory, plus managed and host memory.  Device memory is
 * charged to the shared state (physical, across processes); the table of this process
 * maps each returned address or handle to what it charged. */
#include <stdlib.h>
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

void fc_free_record(struct fc_alloc *a) {
    switch (a->kind) {
    case A_DEVICE:
    case A_DEVICE32:
    case A_ARRAY:
    case A_MIPMAP:
    case A_VMM:
        if (a->pool)
            fc_pool_give(a->pool, a->size); /* back to the pool: still reserved */
        else if (a->dev >= 0)
            fc_uncharge(a->dev, a->size);
        break;
    case A_GRAPHVA:
        if (a->live) fc_graphmem_free(a->dev, a->size);
        break;
    case A_MANAGED: fc_managed(-(int64_t)a->size); break;
    case A_HOST: free(a->host); break;
    default: break;
    }
    free(a);
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
    if (a->kind != A_DEVICE && a->kind != A_DEVICE32 && a->kind != A_MANAGED) return;
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

/* ---- virtual memory management ---- */
struct mapping {
    uint64_t va, size, handle;
};
static struct mapping *maps;
static size_t nmaps, capmaps;

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

FC_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    int dev;
    if (!handle || size == 0 || size % GRANULARITY || flags) return CUDA_ERROR_INVALID_VALUE;
    r = check_prop(prop, &dev);
    if (r) return r;
    if (dev >= 0 && fc_charge(dev, size) < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (!a) {
        if (dev >= 0) fc_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fc_obj_mutex);
    a->key = fc_addr_new(size, GRANULARITY, 0) | 1; /* handles are not addresses */
    a->size = size;
    a->kind = A_VMM;
    a->dev = dev;
    fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    *handle = a->key;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_alloc *a = NULL;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *h = fc_alloc_get(handle);
    if (h && h->kind == A_VMM && !h->released) {
        h->released = 1;
        if (!h->maps) a = fc_alloc_take(handle);
        r = CUDA_SUCCESS;
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    if (a) fc_free_record(a);
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
    if (!h || h->kind != A_VMM || h->released) {
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
            if (h && --h->maps == 0 && h->released && nfree < 16) to_free[nfree++] = fc_alloc_take(m.handle);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    for (int i = 0; i < nfree; i++) fc_free_record(to_free[i]);
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
