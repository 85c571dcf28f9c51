/* Launch hooks: every way of putting work on the SMs is charged to the SM
 * controller before it reaches the driver: kernels, extended and cooperative
 * launches, and graph launches (charged by the number of kernel nodes counted
 * when the graph was instantiated). */
#include <pthread.h>

#include "shim.h"

static inline void charge(uint64_t blocks)
{
    if (!__atomic_load_n(&vg_sm_any_limited, __ATOMIC_RELAXED)) return;
    CUdevice dev;
    if (vg_current_device(&dev)) vg_sm_charge(dev, blocks);
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

/* graph exec -> node count, recorded at instantiation */
#define GRAPHS 1024
static struct { CUgraphExec exec; uint64_t nodes; } graphs[GRAPHS];
static pthread_mutex_t graphs_mu = PTHREAD_MUTEX_INITIALIZER;

CUresult vg_impl_cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             unsigned long long flags)
{
    CUresult r = vg_real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
    if (r != CUDA_SUCCESS || !phGraphExec) return r;
    size_t n = 0;
    if (!vg_real.cuGraphGetNodes || vg_real.cuGraphGetNodes(hGraph, NULL, &n) != CUDA_SUCCESS)
        n = 1;
    pthread_mutex_lock(&graphs_mu);
    for (int i = 0; i < GRAPHS; i++)
        if (!graphs[i].exec) {
            graphs[i].exec = *phGraphExec;
            graphs[i].nodes = n ? n : 1;
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
    return r;
}

CUresult vg_impl_cuGraphExecDestroy(CUgraphExec h)
{
    pthread_mutex_lock(&graphs_mu);
    for (int i = 0; i < GRAPHS; i++)
        if (graphs[i].exec == h && h) graphs[i].exec = NULL;
    pthread_mutex_unlock(&graphs_mu);
    return vg_real.cuGraphExecDestroy(h);
}

static void charge_graph(CUgraphExec h)
{
    if (!__atomic_load_n(&vg_sm_any_limited, __ATOMIC_RELAXED)) return;
    uint64_t nodes = 1;
    pthread_mutex_lock(&graphs_mu);
    for (int i = 0; i < GRAPHS; i++)
        if (graphs[i].exec == h && h) {
            nodes = graphs[i].nodes;
            break;
        }
    pthread_mutex_unlock(&graphs_mu);
    CUdevice dev;
    if (vg_current_device(&dev)) vg_sm_charge_graph(dev, nodes);
}

CUresult vg_impl_cuGraphLaunch(CUgraphExec h, CUstream s)
{
    charge_graph(h);
    return vg_real.cuGraphLaunch(h, s);
}

CUresult vg_impl_cuGraphLaunch_ptsz(CUgraphExec h, CUstream s)
{
    charge_graph(h);
    return vg_real.cuGraphLaunch_ptsz(h, s);
}
