/* Launch hooks: every way of putting work on the SMs is charged to the SM
 * controller before it reaches the driver: kernels, extended and cooperative
 * launches, and graph launches (charged by the number of kernel nodes counted
 * when the graph was instantiated). A graph with allocation nodes is also charged
 * the growth of its device's graph memory pool before it is launched (cuda_pool.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static inline void charge(uint64_t blocks)
{
    if (!__atomic_load_n(&vg_sm_any_limited, __ATOMIC_RELAXED)) return;
    int dev;
    if (vg_current(NULL, &dev) && dev >= 0) vg_sm_charge(dev, blocks);
}

static inline uint64_t grid(unsigned x, unsigned y, unsigned z)
{
    return (uint64_t)(x ? x : 1) * (y ? y : 1) * (z ? z : 1);
}

CUresult vg_impl_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                unsigned int bx, unsigned int by, unsigned int bz,
                                unsigned int shmem, CUstream s, void **params, void **extra)
{
    charge(grid(gx, gy, gz));
    return vg_real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

CUresult vg_impl_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                     unsigned int gz, unsigned int bx, unsigned int by,
                                     unsigned int bz, unsigned int shmem, CUstream s,
                                     void **params, void **extra)
{
    charge(grid(gx, gy, gz));
    return vg_real.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

CUresult vg_impl_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                  void **extra)
{
    if (config) charge(grid(config->gridDimX, config->gridDimY, config->gridDimZ));
    return vg_real.cuLaunchKernelEx(config, f, params, extra);
}

CUresult vg_impl_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                       void **params, void **extra)
{
    if (config) charge(grid(config->gridDimX, config->gridDimY, config->gridDimZ));
    return vg_real.cuLaunchKernelEx_ptsz(config, f, params, extra);
}

CUresult vg_impl_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                           unsigned int gz, unsigned int bx, unsigned int by,
                                           unsigned int bz, unsigned int shmem, CUstream s,
                                           void **params)
{
    charge(grid(gx, gy, gz));
    return vg_real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

CUresult vg_impl_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                unsigned int gz, unsigned int bx,
                                                unsigned int by, unsigned int bz,
                                                unsigned int shmem, CUstream s, void **params)
{
    charge(grid(gx, gy, gz));
    return vg_real.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

/* ---- graphs: per exec, its kernel nodes (aux) and its allocations (bytes, on the
 * device of ordinal refs), recorded at instantiation ---- */
#define GRAPH_DEPTH 16 /* child graphs are followed this deep */

/* A graph's kernel nodes, its child graphs' included, whatever their depth (finding 11:
 * a graph of child graphs counted one kernel). A node of unknown type is taken for a
 * kernel; a conditional node for one (its body runs zero or more times: the launch
 * cannot know, and calibration corrects the estimate by what NVML sees). */
static size_t kernel_nodes(CUgraph graph, int depth)
{
    size_t n = 0, kernels = 0;
    CUgraphNode *nodes = vg_graph_nodes(graph, &n);
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        CUgraph child;
        if (!vg_real.cuGraphNodeGetType || vg_real.cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS ||
            t == CU_GRAPH_NODE_TYPE_KERNEL || t == CU_GRAPH_NODE_TYPE_CONDITIONAL)
            kernels++;
        else if (t == CU_GRAPH_NODE_TYPE_GRAPH)
            kernels += depth < GRAPH_DEPTH && vg_real.cuGraphChildGraphNodeGetGraph &&
                               vg_real.cuGraphChildGraphNodeGetGraph(nodes[i], &child) ==
                                   CUDA_SUCCESS
                           ? kernel_nodes(child, depth + 1)
                           : 1;
    }
    free(nodes);
    return kernels;
}

static CUresult instantiated(CUresult r, CUgraphExec *exec, CUgraph graph)
{
    if (r != CUDA_SUCCESS || !exec || !*exec) return r;
    size_t kernels = kernel_nodes(graph, 0);
    VG_DEBUG("graph exec %p: %zu kernel nodes", (void *)*exec, kernels);
    /* what it allocates, per device: the first device in the record, the others (a
     * graph with allocation nodes on several GPUs) in an array the record points to */
    vg_graph_dev devs[VG_GRAPH_DEVS];
    int nd = vg_graph_memory(graph, devs);
    vg_graph_dev *more = NULL;
    if (nd > 1 && (more = malloc(sizeof *more * (size_t)(nd - 1))) != NULL)
        memcpy(more, devs + 1, sizeof *more * (size_t)(nd - 1));
    if (nd > 1 && !more) { /* what it allocates past the first device cannot be kept */
        vg_real.cuGraphExecDestroy(*exec);
        *exec = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (vg_remember(VG_T_GRAPH, (vg_alloc){.key = (uint64_t)(uintptr_t)*exec,
                                           .bytes = nd ? devs[0].bytes : 0,
                                           .refs = nd ? devs[0].ordinal : -1,
                                           .aux = kernels ? kernels : 1,
                                           .ctx = (uint64_t)(uintptr_t)more,
                                           .holds = more ? nd - 1 : 0}) != 0) {
        /* an executable the shim cannot remember would launch uncharged: refused */
        free(more);
        vg_real.cuGraphExecDestroy(*exec);
        *exec = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

CUresult vg_impl_cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags)
{
    return instantiated(vg_real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags),
                        phGraphExec, hGraph);
}

CUresult vg_impl_cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                    CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
    return instantiated(vg_real.cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer,
                                                   bufferSize),
                        phGraphExec, hGraph);
}

CUresult vg_impl_cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer,
                                       size_t bufferSize)
{
    return instantiated(vg_real.cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode,
                                                      logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

static CUresult graph_upload(CUgraphExec h, CUstream s, int ptsz);
CUresult vg_impl_cuGraphExecDestroy(CUgraphExec h);

/* CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD backs the graph's memory at instantiation: the
 * driver is asked to instantiate only, and the upload goes through the shim's, charged */
static CUresult instantiate_params(CUgraphExec *exec, CUgraph graph,
                                   CUDA_GRAPH_INSTANTIATE_PARAMS *params, int ptsz)
{
    CUDA_GRAPH_INSTANTIATE_PARAMS own, *p = params;
    if (params && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {
        own = *params;
        own.flags &= ~CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
        p = &own;
    }
    CUresult r = instantiated(ptsz ? vg_real.cuGraphInstantiateWithParams_ptsz(exec, graph, p)
                                   : vg_real.cuGraphInstantiateWithParams(exec, graph, p),
                              exec, graph);
    if (p == params) return r;
    params->hErrNode_out = own.hErrNode_out;
    params->result_out = own.result_out;
    if (r != CUDA_SUCCESS) return r;
    r = graph_upload(*exec, params->hUploadStream, ptsz);
    if (r != CUDA_SUCCESS) {
        vg_impl_cuGraphExecDestroy(*exec);
        *exec = NULL;
        params->result_out = 1; /* CUDA_GRAPH_INSTANTIATE_ERROR */
    }
    return r;
}

CUresult vg_impl_cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return instantiate_params(phGraphExec, hGraph, params, 0);
}

CUresult vg_impl_cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    return instantiate_params(phGraphExec, hGraph, params, 1);
}

CUresult vg_impl_cuGraphExecDestroy(CUgraphExec h)
{
    CUresult r = vg_real.cuGraphExecDestroy(h);
    vg_alloc g;
    if (r == CUDA_SUCCESS && vg_forget(VG_T_GRAPH, (uint64_t)(uintptr_t)h, &g))
        free((void *)(uintptr_t)g.ctx);
    return r;
}

/* a launch's (or an upload's) growth of each device's graph pool, charged first */
static CUresult graph_charge(const vg_alloc *g)
{
    const vg_graph_dev *more = (const vg_graph_dev *)(uintptr_t)g->ctx;
    CUresult c = vg_graph_launch_charge(g->bytes, g->refs);
    for (int i = 0; c == CUDA_SUCCESS && i < g->holds; i++) {
        c = vg_graph_launch_charge(more[i].bytes, more[i].ordinal);
        if (c != CUDA_SUCCESS) { /* give back what the others' pools were charged */
            vg_graph_launched(g->refs, c);
            for (int j = 0; j < i; j++) vg_graph_launched(more[j].ordinal, c);
        }
    }
    return c;
}

/* after the driver's call (r): the pools read back. An executable the shim never saw
 * instantiated (none should be: every instantiate is hooked, and one it cannot remember
 * is refused) may allocate anywhere: every graph pool is read now and again at the
 * next synchronisation */
static void graph_settle(const vg_alloc *g, int known, CUresult r)
{
    const vg_graph_dev *more = (const vg_graph_dev *)(uintptr_t)g->ctx;
    if (g->bytes) vg_graph_launched(g->refs, r);
    for (int i = 0; i < g->holds; i++) vg_graph_launched(more[i].ordinal, r);
    if (!known && r == CUDA_SUCCESS) vg_graph_unknown_launched();
}

static CUresult graph_launch(CUgraphExec h, CUstream s, int ptsz)
{
    vg_alloc g = {.aux = 1, .refs = -1};
    int known = vg_peek(VG_T_GRAPH, (uint64_t)(uintptr_t)h, &g);
    CUresult c = graph_charge(&g);
    if (c != CUDA_SUCCESS) return c;
    if (__atomic_load_n(&vg_sm_any_limited, __ATOMIC_RELAXED)) {
        int dev;
        if (vg_current(NULL, &dev) && dev >= 0) vg_sm_charge_graph(dev, g.aux);
    }
    CUresult r = ptsz ? vg_real.cuGraphLaunch_ptsz(h, s) : vg_real.cuGraphLaunch(h, s);
    graph_settle(&g, known, r);
    return r;
}

/* cuGraphUpload backs the graph's memory before any launch (finding 19: the pool grew
 * uncharged): charged as a launch is, without the kernels */
static CUresult graph_upload(CUgraphExec h, CUstream s, int ptsz)
{
    vg_alloc g = {.aux = 1, .refs = -1};
    int known = vg_peek(VG_T_GRAPH, (uint64_t)(uintptr_t)h, &g);
    CUresult c = graph_charge(&g);
    if (c != CUDA_SUCCESS) return c;
    CUresult r = ptsz ? vg_real.cuGraphUpload_ptsz(h, s) : vg_real.cuGraphUpload(h, s);
    graph_settle(&g, known, r);
    return r;
}

CUresult vg_impl_cuGraphUpload(CUgraphExec h, CUstream s) { return graph_upload(h, s, 0); }

CUresult vg_impl_cuGraphUpload_ptsz(CUgraphExec h, CUstream s) { return graph_upload(h, s, 1); }

CUresult vg_impl_cuGraphLaunch(CUgraphExec h, CUstream s) { return graph_launch(h, s, 0); }

CUresult vg_impl_cuGraphLaunch_ptsz(CUgraphExec h, CUstream s) { return graph_launch(h, s, 1); }
