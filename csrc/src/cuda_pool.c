/* Stream-ordered allocations, memory pools and graph memory: charged as reserved size.
 *
 * A pool keeps memory after the workload frees it, up to its release threshold, and
 * gives the rest back only at a synchronisation point or a trim; PyTorch's
 * cudaMallocAsync backend sets the threshold to the maximum, so the pool keeps all of
 * it. Memory a pool keeps is memory no other process can have, so a pool is charged
 * its reserved size (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), read back after every call
 * that can change it: an allocation (charged first with the growth it may cause,
 * against the limit), a free, a trim, a destroy, and the synchronisation calls once a
 * free has made a release possible. A stream-ordered allocation is charged to its
 * pool's device, not the current one.
 *
 * Graph allocation nodes draw on each device's graph memory pool, whose physical
 * memory is mapped when the graph is launched and kept until cuDeviceGraphMemTrim: it
 * is charged the same way (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), the growth of a
 * launch first, against the limit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "shim.h"

#define GRAIN (2ull << 20) /* pools grow in 2 MiB pieces */
#define GRAPH_POOL(ordinal) (0x6772617068000000ull | (uint64_t)(ordinal)) /* "graph"+ord */

int vg_pools_dirty;
VG_MUTEX(pool_mu);

static uint64_t round_up(uint64_t v) { return (v + GRAIN - 1) / GRAIN * GRAIN; }

static int pool_attr(CUmemoryPool pool, CUmemPool_attribute attr, uint64_t *out)
{
    cuuint64_t v = 0;
    if (!vg_real.cuMemPoolGetAttribute || vg_real.cuMemPoolGetAttribute(pool, attr, &v))
        return -1;
    *out = v;
    return 0;
}

static int graph_attr(int ordinal, CUgraphMem_attribute attr, uint64_t *out)
{
    cuuint64_t v = 0;
    if (!vg_real.cuDeviceGetGraphMemAttribute ||
        vg_real.cuDeviceGetGraphMemAttribute(ordinal, attr, &v))
        return -1;
    *out = v;
    return 0;
}

/* reserved and used bytes of a pool record (a pool, or a device's graph pool) */
static int pool_now(const vg_alloc *p, uint64_t *reserved, uint64_t *used)
{
    if (p->kind) /* a graph pool: aux is the ordinal */
        return graph_attr((int)p->aux, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, reserved) ||
               graph_attr((int)p->aux, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, used);
    CUmemoryPool pool = (CUmemoryPool)(uintptr_t)p->key;
    return pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, reserved) ||
           pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, used);
}

/* charge exactly what the pool reserves now; a pool the driver no longer knows
 * reserves nothing. A graph pool charged for a launch whose memory the driver may map
 * only when the work runs keeps that charge (its floor, in .ctx) until the pool has
 * grown to it or a synchronisation of the context has passed. Caller holds pool_mu. */
static void settle(vg_alloc *p)
{
    uint64_t reserved = 0, used = 0;
    if (pool_now(p, &reserved, &used) != 0) reserved = 0;
    if (p->kind && p->ctx) {
        if (reserved >= p->ctx) p->ctx = 0; /* grown: exact from here on */
        else reserved = p->ctx;
    }
    if (reserved > p->bytes)
        vg_state_charge(p->dev, reserved - p->bytes, VG_KIND_DEVICE, VG_CHARGE_FORCE);
    else if (reserved < p->bytes)
        vg_state_uncharge(p->dev, p->bytes - reserved, VG_KIND_DEVICE);
    p->bytes = reserved;
    vg_remember(VG_T_POOL, *p);
}

/* the record of a pool (created on first sight), or dev -1 */
static vg_alloc pool_record(uint64_t key, int dev, int graph, int ordinal)
{
    vg_alloc p;
    if (vg_peek(VG_T_POOL, key, &p)) return p;
    p = (vg_alloc){.key = key, .dev = dev, .kind = graph, .aux = (uint64_t)ordinal};
    if (dev >= 0) settle(&p); /* a pool we first meet may already hold memory */
    return p;
}

struct reconcile { int dev; uint64_t measure; /* devices of exported pools that shrank */ };

static int settle_each(vg_alloc *p, void *arg)
{
    struct reconcile *r = arg;
    if (r->dev >= 0 && p->dev != r->dev) return 0;
    uint64_t before = p->bytes;
    settle(p);
    if ((p->flags & VG_F_EXPORTED) && p->bytes < before && p->dev >= 0 && p->dev < 64)
        r->measure |= 1ull << p->dev;
    return 0;
}

/* Every pool of dev (-1: of every device) charged at what it reserves now. Only a
 * reconcile of every device clears vg_pools_dirty: one device's leaves the others', and
 * its own pools' later releases at a sync, to be settled then. */
void vg_pools_reconcile(int dev)
{
    if (dev < 0) __atomic_store_n(&vg_pools_dirty, 0, __ATOMIC_RELEASE);
    struct reconcile r = {dev, 0};
    vg_lock(&pool_mu);
    vg_each(VG_T_POOL, settle_each, &r);
    vg_unlock(&pool_mu);
    /* an exported pool gave memory back (at a sync, say): an importer may keep it */
    vg_context_untracked_now_on(r.measure);
}

/* ---- stream-ordered allocations ---- */
struct async_args { size_t bytes; CUstream s; CUmemoryPool pool; int ptsz; int from_pool; };

static CUresult do_async(CUdeviceptr *dptr, struct async_args *a)
{
    if (a->from_pool)
        return a->ptsz ? vg_real.cuMemAllocFromPoolAsync_ptsz(dptr, a->bytes, a->pool, a->s)
                       : vg_real.cuMemAllocFromPoolAsync(dptr, a->bytes, a->pool, a->s);
    return a->ptsz ? vg_real.cuMemAllocAsync_ptsz(dptr, a->bytes, a->s)
                   : vg_real.cuMemAllocAsync(dptr, a->bytes, a->s);
}

static CUresult alloc_async(CUdeviceptr *dptr, struct async_args *a)
{
    CUdevice ordinal;
    int dev;
    /* the stream's device: the driver allocates from the pool of the stream's device,
     * whatever context is current */
    if (!dptr || a->bytes == 0 || !vg_stream_device(a->s, &ordinal, &dev))
        return do_async(dptr, a);
    CUmemoryPool pool = a->pool;
    if (!a->from_pool && (!vg_real.cuDeviceGetMemPool ||
                          vg_real.cuDeviceGetMemPool(&pool, ordinal) != CUDA_SUCCESS))
        return do_async(dptr, a);
    vg_lock(&pool_mu);
    vg_alloc p = pool_record((uint64_t)(uintptr_t)pool, dev, 0, ordinal);
    if (p.dev < 0) {
        vg_unlock(&pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    vg_context_charge(p.dev);
    /* the growth this allocation may cause, charged against the limit first */
    uint64_t reserved = 0, used = 0, growth = round_up(a->bytes);
    if (pool_now(&p, &reserved, &used) == 0)
        growth = reserved - used >= a->bytes ? 0 : round_up(a->bytes - (reserved - used));
    if (growth && vg_state_charge(p.dev, growth, VG_KIND_DEVICE, 0) != 0) {
        vg_unlock(&pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p.bytes += growth;
    uint64_t before = reserved;
    CUresult r = do_async(dptr, a);
    settle(&p);
    if (r == CUDA_SUCCESS && vg_state_over_limit(p.dev, 0)) {
        /* the pool grew more than its free reserve promised (a real pool fragments):
         * the allocation goes back, the growth is trimmed, the caller is refused */
        CUresult f = a->ptsz ? vg_real.cuMemFreeAsync_ptsz(*dptr, a->s)
                             : vg_real.cuMemFreeAsync(*dptr, a->s);
        if (f == CUDA_SUCCESS) {
            if (a->ptsz) vg_real.cuStreamSynchronize_ptsz(a->s);
            else vg_real.cuStreamSynchronize(a->s);
            vg_real.cuMemPoolTrimTo(pool, before);
            settle(&p);
            VG_INFO("a pool on device %d grew past the memory limit: allocation refused", p.dev);
            vg_unlock(&pool_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r == CUDA_SUCCESS)
        vg_remember(VG_T_PTR, (vg_alloc){.key = *dptr, .bytes = a->bytes, .dev = p.dev,
                                         .kind = VG_KIND_POOL, .aux = p.key,
                                         .ctx = vg_current_ctx()});
    vg_unlock(&pool_mu);
    return r;
}

CUresult vg_impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    struct async_args a = {bytesize, hStream, NULL, 0, 0};
    return alloc_async(dptr, &a);
}

CUresult vg_impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    struct async_args a = {bytesize, hStream, NULL, 1, 0};
    return alloc_async(dptr, &a);
}

CUresult vg_impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream)
{
    struct async_args a = {bytesize, hStream, pool, 0, 1};
    return alloc_async(dptr, &a);
}

CUresult vg_impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream)
{
    struct async_args a = {bytesize, hStream, pool, 1, 1};
    return alloc_async(dptr, &a);
}

static CUresult free_async(CUdeviceptr dptr, CUstream s, int ptsz)
{
    vg_alloc a;
    if (vg_peek(VG_T_PTR, dptr, &a) && a.kind == VG_KIND_SPILL) {
        /* a spilled block is managed memory: the stream-ordered free would refuse it */
        CUresult r = vg_real.cuMemFree_v2(dptr);
        if (r == CUDA_SUCCESS && vg_forget(VG_T_PTR, dptr, &a)) vg_release(&a);
        return r;
    }
    CUresult r = ptsz ? vg_real.cuMemFreeAsync_ptsz(dptr, s) : vg_real.cuMemFreeAsync(dptr, s);
    if (r == CUDA_SUCCESS && vg_forget(VG_T_PTR, dptr, &a)) {
        if (a.kind == VG_KIND_POOL) { /* back in its pool, which may give it up at a sync */
            __atomic_store_n(&vg_pools_dirty, 1, __ATOMIC_RELEASE);
            /* or now, when an importer keeps it: the reconcile measures an exported pool
             * that shrank */
            if (a.flags & VG_F_EXPORTED) vg_pools_reconcile(a.dev);
        } else {
            vg_release(&a);
            if (a.flags & VG_F_EXPORTED) vg_context_exported_freed(a.dev); /* legacy IPC's */
        }
    }
    return r;
}

/* Pool IPC: another process that imports the pool and a pointer of it maps that memory;
 * freed here while imported there (the docs ask importers to free first), a driver may
 * keep it allocated, counted by NVML for this process, though the pool no longer
 * reserves it. The exported pointer's free, and a trim or destruction of an exported
 * pool, measure the untracked memory at once (as legacy IPC's free: cuda_memory.c). */
CUresult vg_impl_cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                  CUmemAllocationHandleType handleType,
                                                  unsigned long long flags)
{
    CUresult r = vg_real.cuMemPoolExportToShareableHandle(handle_out, pool, handleType, flags);
    if (r == CUDA_SUCCESS) {
        vg_lock(&pool_mu);
        vg_mark(VG_T_POOL, (uint64_t)(uintptr_t)pool, VG_F_EXPORTED);
        vg_unlock(&pool_mu);
    }
    return r;
}

CUresult vg_impl_cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    CUresult r = vg_real.cuMemPoolExportPointer(shareData_out, ptr);
    vg_alloc a;
    if (r == CUDA_SUCCESS && vg_peek(VG_T_PTR, ptr, &a)) {
        vg_mark(VG_T_PTR, ptr, VG_F_EXPORTED);
        vg_lock(&pool_mu); /* its pool is exported too, whoever exported the pool */
        vg_mark(VG_T_POOL, a.aux, VG_F_EXPORTED);
        vg_unlock(&pool_mu);
    }
    return r;
}

CUresult vg_impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, 0);
}

CUresult vg_impl_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, 1);
}

/* ---- pools ---- */
CUresult vg_impl_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    CUresult r = vg_real.cuMemPoolCreate(pool, props);
    if (r == CUDA_SUCCESS && pool && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        int dev = vg_dev_index(props->location.id);
        vg_lock(&pool_mu);
        pool_record((uint64_t)(uintptr_t)*pool, dev, 0, props->location.id);
        if (dev < 0) /* remembered so that allocations from it are refused */
            vg_remember(VG_T_POOL, (vg_alloc){.key = (uint64_t)(uintptr_t)*pool, .dev = -1});
        vg_unlock(&pool_mu);
    }
    return r;
}

static CUresult after_pool(CUresult r, CUmemoryPool pool, int gone)
{
    vg_alloc p;
    int exported = 0;
    vg_lock(&pool_mu);
    if (r == CUDA_SUCCESS && vg_peek(VG_T_POOL, (uint64_t)(uintptr_t)pool, &p) && p.dev >= 0) {
        settle(&p);
        exported = (p.flags & VG_F_EXPORTED) != 0;
        if (gone && vg_forget(VG_T_POOL, p.key, &p)) vg_state_uncharge(p.dev, p.bytes,
                                                                      VG_KIND_DEVICE);
    }
    vg_unlock(&pool_mu);
    if (exported) vg_context_untracked_now(p.dev); /* an importer may keep what it gave up */
    return r;
}

CUresult vg_impl_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    return after_pool(vg_real.cuMemPoolTrimTo(pool, minBytesToKeep), pool, 0);
}

CUresult vg_impl_cuMemPoolDestroy(CUmemoryPool pool)
{
    return after_pool(vg_real.cuMemPoolDestroy(pool), pool, 1);
}

/* ---- synchronisation: where a pool above its threshold gives memory back ---- */
static CUresult synced(CUresult r)
{
    if (__atomic_load_n(&vg_pools_dirty, __ATOMIC_ACQUIRE)) vg_pools_reconcile(-1);
    return r;
}

static int unfloor(vg_alloc *p, void *arg)
{
    if (p->kind && p->ctx && p->dev == *(const int *)arg) {
        p->ctx = 0;
        vg_remember(VG_T_POOL, *p);
    }
    return 0;
}

/* a context has run all its work: every graph launch's memory on its device is mapped
 * by now, so what that device's graph pool reserves is exact, floor or not */
static CUresult ctx_synced(CUresult r, CUcontext ctx)
{
    int dev = -1;
    vg_alloc c;
    if (!ctx) {
        if (!vg_current(NULL, &dev)) dev = -1;
    } else if (vg_peek(VG_T_CTX, (uint64_t)(uintptr_t)ctx, &c)) {
        dev = c.dev;
    }
    if (r == CUDA_SUCCESS && dev >= 0 && __atomic_load_n(&vg_pools_dirty, __ATOMIC_ACQUIRE)) {
        vg_lock(&pool_mu);
        vg_each(VG_T_POOL, unfloor, &dev);
        vg_unlock(&pool_mu);
    }
    return synced(r);
}

CUresult vg_impl_cuStreamSynchronize(CUstream s) { return synced(vg_real.cuStreamSynchronize(s)); }

CUresult vg_impl_cuStreamSynchronize_ptsz(CUstream s)
{
    return synced(vg_real.cuStreamSynchronize_ptsz(s));
}

CUresult vg_impl_cuCtxSynchronize(void) { return ctx_synced(vg_real.cuCtxSynchronize(), NULL); }

CUresult vg_impl_cuCtxSynchronize_v2(CUcontext ctx)
{
    return ctx_synced(vg_real.cuCtxSynchronize_v2(ctx), ctx);
}

CUresult vg_impl_cuEventSynchronize(CUevent e) { return synced(vg_real.cuEventSynchronize(e)); }

/* ---- graph memory ---- */
/* every node of a graph (malloc'd, to free), or NULL with *n = 0 */
CUgraphNode *vg_graph_nodes(CUgraph graph, size_t *n)
{
    *n = 0;
    if (!vg_real.cuGraphGetNodes || vg_real.cuGraphGetNodes(graph, NULL, n) != CUDA_SUCCESS ||
        *n == 0)
        return NULL;
    CUgraphNode *nodes = malloc(sizeof *nodes * *n);
    if (!nodes || vg_real.cuGraphGetNodes(graph, nodes, n) != CUDA_SUCCESS) {
        free(nodes);
        *n = 0;
        return NULL;
    }
    return nodes;
}

/* what a graph allocates, summed over its allocation nodes per device (finding 2: all
 * were charged to the first node's device); returns how many devices, at most
 * VG_GRAPH_DEVS (the rest are counted on the last one) */
int vg_graph_memory(CUgraph graph, vg_graph_dev out[VG_GRAPH_DEVS])
{
    int nd = 0;
    if (!vg_real.cuGraphNodeGetType || !vg_real.cuGraphMemAllocNodeGetParams) return 0;
    size_t n;
    CUgraphNode *nodes = vg_graph_nodes(graph, &n); /* all of them: the 513th too */
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        if (vg_real.cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS ||
            t != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
            vg_real.cuGraphMemAllocNodeGetParams(nodes[i], &p) != CUDA_SUCCESS)
            continue;
        int j = 0, ordinal = p.poolProps.location.id;
        while (j < nd && out[j].ordinal != ordinal) j++;
        if (j == nd) {
            if (nd == VG_GRAPH_DEVS) j = nd - 1;
            else out[nd++] = (vg_graph_dev){.ordinal = ordinal, .bytes = 0};
        }
        out[j].bytes += p.bytesize;
    }
    free(nodes);
    return nd;
}

/* before a launch of a graph that allocates: its pool's growth, against the limit */
CUresult vg_graph_launch_charge(uint64_t bytes, int ordinal)
{
    if (!bytes || ordinal < 0) return CUDA_SUCCESS;
    int dev = vg_dev_index(ordinal);
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    vg_lock(&pool_mu);
    vg_alloc p = pool_record(GRAPH_POOL(ordinal), dev, 1, ordinal);
    uint64_t reserved = 0, used = 0, growth = round_up(bytes);
    if (pool_now(&p, &reserved, &used) == 0)
        growth = reserved - used >= bytes ? 0 : round_up(bytes - (reserved - used));
    CUresult r = CUDA_SUCCESS;
    if (growth && vg_state_charge(dev, growth, VG_KIND_DEVICE, 0) != 0) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (growth) {
        p.bytes += growth;
        p.ctx = p.bytes; /* the floor: kept until the launch's memory is mapped */
    }
    vg_remember(VG_T_POOL, p);
    vg_unlock(&pool_mu);
    return r;
}

/* after a launch (or a refused one: launch is its result): the pool is read back. A
 * launch's memory may be mapped only when its work runs (after the call returns), so
 * the charge made before it stays (settle's floor), and the next synchronisation reads
 * the pool again (finding 2: it was settled on return, the charge dropped back, and an
 * allocation fitted beside memory the pool took a moment later). */
void vg_graph_launched(int ordinal, CUresult launch)
{
    vg_alloc p;
    vg_lock(&pool_mu);
    if (ordinal >= 0 && vg_peek(VG_T_POOL, GRAPH_POOL(ordinal), &p)) {
        if (launch != CUDA_SUCCESS) p.ctx = 0; /* nothing will be mapped */
        settle(&p);
        if (p.ctx) __atomic_store_n(&vg_pools_dirty, 1, __ATOMIC_RELEASE);
    }
    vg_unlock(&pool_mu);
}

/* after a launch of an executable the shim has no record of: every device's graph
 * pool is read now, and again at the next synchronisation */
void vg_graph_unknown_launched(void)
{
    int n = 0;
    if (!vg_real.cuDeviceGetCount || vg_real.cuDeviceGetCount(&n) != CUDA_SUCCESS) return;
    vg_lock(&pool_mu);
    for (int ordinal = 0; ordinal < n; ordinal++) {
        int dev = vg_dev_index(ordinal);
        if (dev < 0) continue;
        vg_alloc p = pool_record(GRAPH_POOL(ordinal), dev, 1, ordinal);
        settle(&p);
    }
    vg_unlock(&pool_mu);
    __atomic_store_n(&vg_pools_dirty, 1, __ATOMIC_RELEASE);
}

CUresult vg_impl_cuDeviceGraphMemTrim(CUdevice device)
{
    CUresult r = vg_real.cuDeviceGraphMemTrim(device);
    if (r == CUDA_SUCCESS) vg_graph_launched(device, CUDA_SUCCESS);
    return r;
}
