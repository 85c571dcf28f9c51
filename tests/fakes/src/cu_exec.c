/* Streams, events, modules, kernel launches, graphs and synchronisation, all on the
 * virtual timeline of state.c: a kernel of B blocks occupies its device for
 * B x FAKECUDA_NS_PER_BLOCK ns, one kernel at a time, in launch order over all processes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu.h"

static void max_store(uint64_t *p, uint64_t v) {
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static uint64_t load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

static void wait_until(uint64_t t) {
    if (t > fc_now()) fc_sleep_until(t);
}

CUresult fc_stream_ctx(CUstream s, struct fc_ctx **ctx, struct fc_stream **st) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (st) *st = NULL;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return fc_current(ctx);
    struct fc_stream *x = fc_handle_get(s, K_STREAM);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    if (!x->ctx->active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = x->ctx;
    if (st) *st = x;
    return CUDA_SUCCESS;
}

/* ---- streams ---- */
FC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!phStream || (flags & ~1u)) return CUDA_ERROR_INVALID_VALUE;
    struct fc_stream *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = c;
    *phStream = fc_handle_new(K_STREAM, s);
    return CUDA_SUCCESS;
}

FC_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    (void)priority;
    return cuStreamCreate(phStream, flags);
}

FC_API CUresult cuStreamDestroy_v2(CUstream hStream) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_stream *s = fc_handle_get(hStream, K_STREAM);
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    fc_handle_free(hStream);
    free(s);
    return CUDA_SUCCESS;
}

FC_API CUresult cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

static uint64_t stream_end(struct fc_ctx *c, struct fc_stream *s) {
    return s ? load(&s->last_end) : load(&c->last_end);
}

FC_API CUresult cuStreamSynchronize(CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    wait_until(stream_end(c, s));
    return CUDA_SUCCESS;
}

FC_API CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return cuStreamSynchronize(hStream); }

FC_API CUresult cuStreamQuery(CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    return stream_end(c, s) > fc_now() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

FC_API CUresult cuStreamQuery_ptsz(CUstream hStream) { return cuStreamQuery(hStream); }

FC_API CUresult cuCtxSynchronize(void) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    wait_until(load(&c->last_end));
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    if (!ctx) return cuCtxSynchronize();
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_ctx *c = fc_ctx_of(ctx);
    if (!c || !c->active) return CUDA_ERROR_INVALID_CONTEXT;
    wait_until(load(&c->last_end));
    return CUDA_SUCCESS;
}

/* ---- events ---- */
struct fc_event {
    uint64_t t;
    struct fc_ctx *ctx;
};

FC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int flags) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!phEvent || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
    struct fc_event *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = c;
    *phEvent = fc_handle_new(K_EVENT, e);
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    __atomic_store_n(&e->t, stream_end(c, s), __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
    return cuEventRecord(hEvent, hStream);
}

FC_API CUresult cuEventSynchronize(CUevent hEvent) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    wait_until(load(&e->t));
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventQuery(CUevent hEvent) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    return load(&e->t) > fc_now() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

FC_API CUresult cuEventDestroy_v2(CUevent hEvent) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_event *e = fc_handle_get(hEvent, K_EVENT);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    fc_handle_free(hEvent);
    free(e);
    return CUDA_SUCCESS;
}

FC_API CUresult cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

/* ---- modules and functions: any image loads, any name resolves ---- */
static int module_token;

static CUresult module_new(CUmodule *m) {
    *m = fc_handle_new(K_MODULE, &module_token);
    return *m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FC_API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
    return module_new(module);
}

FC_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    struct fc_ctx *c;
    CUresult r = fc_current(&c);
    if (r) return r;
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    return module_new(module);
}

FC_API CUresult cuModuleUnload(CUmodule hmod) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!fc_handle_get(hmod, K_MODULE)) return CUDA_ERROR_INVALID_HANDLE;
    fc_handle_free(hmod);
    return CUDA_SUCCESS;
}

FC_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!hfunc || !name || !*name) return CUDA_ERROR_INVALID_VALUE;
    if (!fc_handle_get(hmod, K_MODULE)) return CUDA_ERROR_INVALID_HANDLE;
    *hfunc = fc_handle_new(K_FUNC, &module_token);
    return *hfunc ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- launches ---- */
static CUresult check_dims(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz) {
    if (!fc_handle_get(f, K_FUNC)) return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if (gy > 65535 || gz > 65535 || bz > 64 || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult run(struct fc_ctx *c, struct fc_stream *s, uint64_t blocks) {
    uint64_t end = fc_enqueue(c->dev, blocks * fc_knobs()->ns_per_block);
    max_store(&c->last_end, end);
    if (s) max_store(&s->last_end, end);
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, CUstream hStream, int cooperative) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    r = check_dims(f, gx, gy, gz, bx, by, bz);
    if (r) return r;
    uint64_t blocks = (uint64_t)gx * gy * gz;
    if (cooperative) {
        uint64_t per_sm = 2048 / ((uint64_t)bx * by * bz);
        if (blocks > (uint64_t)fc_knobs()->sms * (per_sm ? per_sm : 1))
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    return run(c, s, blocks);
}

FC_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz,
                               unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                               void **extra) {
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, 0);
}

FC_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams, extra);
}

FC_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                 void **extra) {
    (void)kernelParams, (void)extra;
    CUresult r = fc_check_init();
    if (r) return r;
    if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, 0);
}

FC_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra) {
    return cuLaunchKernelEx(config, f, kernelParams, extra);
}

FC_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                          unsigned int gz, unsigned int bx, unsigned int by,
                                          unsigned int bz, unsigned int sharedMemBytes,
                                          CUstream hStream, void **kernelParams) {
    (void)sharedMemBytes, (void)kernelParams;
    return launch(f, gx, gy, gz, bx, by, bz, hStream, 1);
}

FC_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx, unsigned int by,
                                               unsigned int bz, unsigned int sharedMemBytes,
                                               CUstream hStream, void **kernelParams) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream,
                                     kernelParams);
}

/* ---- graphs: kernel nodes only; a launch runs them back to back ---- */
struct fc_graph {
    size_t n, cap;
    uint64_t *blocks;
    CUgraphNode *nodes;
};

struct fc_exec {
    uint64_t blocks; /* sum over the kernel nodes */
};

FC_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!phGraph || flags) return CUDA_ERROR_INVALID_VALUE;
    struct fc_graph *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = fc_handle_new(K_GRAPH, g);
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *node, CUgraph hGraph, const CUgraphNode *deps,
                                size_t ndeps, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                unsigned bx, unsigned by, unsigned bz) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (!node || (ndeps && !deps)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (fc_handle_get(deps[i], K_NODE) != g) return CUDA_ERROR_INVALID_VALUE;
    r = check_dims(f, gx, gy, gz, bx, by, bz);
    if (r) return r;
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        uint64_t *b = realloc(g->blocks, cap * sizeof *b);
        if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
        g->blocks = b;
        CUgraphNode *n = realloc(g->nodes, cap * sizeof *n);
        if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = n;
        g->cap = cap;
    }
    g->blocks[g->n] = (uint64_t)gx * gy * gz;
    g->nodes[g->n] = fc_handle_new(K_NODE, g);
    *node = g->nodes[g->n++];
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                        size_t ndeps, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
    if (!p) return fc_check_init() ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(node, g, deps, ndeps, p->func, p->gridDimX, p->gridDimY, p->gridDimZ,
                           p->blockDimX, p->blockDimY, p->blockDimZ);
}

FC_API CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                     size_t ndeps, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    if (!p) return fc_check_init() ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(node, g, deps, ndeps, p->func, p->gridDimX, p->gridDimY, p->gridDimZ,
                           p->blockDimX, p->blockDimY, p->blockDimZ);
}

FC_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phExec, CUgraph hGraph,
                                            unsigned long long flags) {
    (void)flags;
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!phExec || !g) return CUDA_ERROR_INVALID_VALUE;
    struct fc_exec *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < g->n; i++) e->blocks += g->blocks[i];
    *phExec = fc_handle_new(K_EXEC, e);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphInstantiate(CUgraphExec *phExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                   char *logBuffer, size_t bufferSize) {
    if (phErrorNode) *phErrorNode = NULL;
    if (logBuffer && bufferSize) logBuffer[0] = 0;
    return cuGraphInstantiateWithFlags(phExec, hGraph, 0);
}

FC_API CUresult cuGraphInstantiate_v2(CUgraphExec *phExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                      char *logBuffer, size_t bufferSize) {
    return cuGraphInstantiate(phExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

FC_API CUresult cuGraphLaunch(CUgraphExec hExec, CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    CUresult r = fc_stream_ctx(hStream, &c, &s);
    if (r) return r;
    struct fc_exec *e = fc_handle_get(hExec, K_EXEC);
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    return e->blocks ? run(c, s, e->blocks) : CUDA_SUCCESS;
}

FC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hExec, CUstream hStream) {
    return cuGraphLaunch(hExec, hStream);
}

FC_API CUresult cuGraphExecDestroy(CUgraphExec hExec) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_exec *e = fc_handle_get(hExec, K_EXEC);
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    fc_handle_free(hExec);
    free(e);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphDestroy(CUgraph hGraph) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->n; i++) fc_handle_free(g->nodes[i]);
    fc_handle_free(hGraph);
    free(g->blocks);
    free(g->nodes);
    free(g);
    return CUDA_SUCCESS;
}
