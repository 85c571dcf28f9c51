/* Graphs: kernel nodes, child graph nodes, memory alloc nodes and memory free nodes.
 *
 * A launch runs the graph's kernel nodes back to back (one timeline interval of their
 * summed durations, each node by the wave model of cu_exec.c), the kernel nodes of its
 * child graphs (to any depth) included.  cuGraphAddChildGraphNode clones the child graph
 * into the node (later changes to the original do not reach the node); the clone is owned
 * by the node (cuGraphChildGraphNodeGetGraph returns it; cuGraphDestroy of it:
 * INVALID_VALUE) and goes with the parent graph.  As cuda.h says, a child graph with
 * memory alloc/free nodes is refused (INVALID_VALUE) and none can be added to an embedded
 * graph (INVALID_VALUE).  Memory nodes use the
 * device's graph memory pool (cu_pool.c): an alloc node gets its address when it is added;
 * each launch maps the graph's allocations (the pool's reserve grows, rounded to 2 MiB, to
 * cover them: physical memory charged to the device and to the process;
 * CUDA_ERROR_OUT_OF_MEMORY from cuGraphLaunch when the device lacks it); memory freed by a
 * free node of the same launch is unused-but-reserved at its end; an allocation not freed
 * in its graph stays used until cuMemFreeAsync/cuMemFree of its address (or a free node of
 * another graph); the reserve stays until cuDeviceGraphMemTrim or the last context of the
 * process on the device goes.  With FAKECUDA_GRAPHMEM_LAZY the mapping happens when the
 * launch's work runs instead: at the next synchronisation (cu_pool.c).
 *
 * Each alloc node's address is an A_GRAPHVA record of the allocation table: live while
 * mapped; its maps field counts the graph and the execs that hold it (the record goes when
 * nothing holds it and it is not mapped). */
#include <stdlib.h>
#include <string.h>

#include "cu.h"

struct fc_graph;

struct fc_gnode {
    CUgraphNodeType type;
    struct fc_graph *g;
    CUgraphNode handle;
    uint64_t dur;                      /* kernel: device time */
    CUDA_MEM_ALLOC_NODE_PARAMS params; /* alloc: as given, dptr filled in */
    CUmemAccessDesc *access;           /* alloc: the node's copy of params.accessDescs */
    int dev;                           /* alloc: physical device */
    uint64_t dptr;                     /* alloc / free: the address */
    struct fc_graph *child;            /* child graph: the embedded clone */
    CUgraph child_handle;              /* child graph: its handle */
};

struct fc_graph {
    size_t n, cap;
    struct fc_gnode **nodes;
    int embedded; /* owned by a child graph node */
};

struct exec_alloc {
    uint64_t key, size;
    int dev;
    int freed_here; /* a free node of the same graph frees it */
};

struct fc_exec {
    uint64_t dur; /* kernel nodes back to back */
    size_t nkernels;
    int auto_free; /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */
    size_t nalloc, nfree;
    struct exec_alloc *allocs;
    uint64_t *frees; /* addresses of other graphs' allocations its free nodes free */
};

#define AUTO_FREE_ON_LAUNCH 1ull

FC_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    if (!phGraph || flags) return CUDA_ERROR_INVALID_VALUE;
    struct fc_graph *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = fc_handle_new(K_GRAPH, g);
    return CUDA_SUCCESS;
}

static struct fc_gnode *node_of(CUgraphNode h) { return fc_handle_get(h, K_NODE); }

/* Checks the graph and dependencies of a new node; *out = the graph. */
static CUresult check_add(CUgraphNode *node, CUgraph hGraph, const CUgraphNode *deps,
                          size_t ndeps, struct fc_graph **out) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!g || !node || (ndeps && !deps)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++) {
        struct fc_gnode *d = node_of(deps[i]);
        if (!d || d->g != g) return CUDA_ERROR_INVALID_VALUE;
    }
    *out = g;
    return CUDA_SUCCESS;
}

/* Appends n (filled in but for g and handle) to g; frees it on failure. */
static CUresult add_node(struct fc_graph *g, struct fc_gnode *n, CUgraphNode *out) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        struct fc_gnode **nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes) {
            free(n);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g->nodes = nodes;
        g->cap = cap;
    }
    n->g = g;
    n->handle = fc_handle_new(K_NODE, n);
    if (!n->handle) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->nodes[g->n++] = n;
    *out = n->handle;
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *node, CUgraph hGraph, const CUgraphNode *deps,
                                size_t ndeps, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                unsigned bx, unsigned by, unsigned bz) {
    struct fc_graph *g;
    CUresult r = check_add(node, hGraph, deps, ndeps, &g);
    if (r) return r;
    struct fc_func *fn;
    r = fc_check_launch(f, gx, gy, gz, bx, by, bz, &fn);
    if (r) return r;
    struct fc_gnode *n = calloc(1, sizeof *n);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->type = CU_GRAPH_NODE_TYPE_KERNEL;
    n->dur = fc_kernel_ns(fn, (uint64_t)gx * gy * gz, (uint64_t)bx * by * bz, 0);
    return add_node(g, n, node);
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

/* ---- memory nodes ---- */
FC_API CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                       const CUgraphNode *dependencies, size_t numDependencies,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    struct fc_graph *g;
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies, &g);
    if (r) return r;
    if (g->embedded) return CUDA_ERROR_INVALID_VALUE; /* cuGraphChildGraphNodeGetGraph's */
    const CUDA_MEM_ALLOC_NODE_PARAMS *p = nodeParams;
    if (!p || p->bytesize == 0 || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = fc_location_dev(p->poolProps.location.id);
    if (dev < 0 || (p->accessDescCount && !p->accessDescs) ||
        p->accessDescCount > (size_t)fc_knobs()->nvis)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < p->accessDescCount; i++)
        if (p->accessDescs[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            fc_location_dev(p->accessDescs[i].location.id) < 0)
            return CUDA_ERROR_INVALID_VALUE;
    struct fc_gnode *n = calloc(1, sizeof *n);
    struct fc_alloc *a = calloc(1, sizeof *a);
    CUmemAccessDesc *access = p->accessDescCount ? calloc(p->accessDescCount, sizeof *access) : NULL;
    if (!n || !a || (p->accessDescCount && !access)) {
        free(n), free(a), free(access);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (access) memcpy(access, p->accessDescs, p->accessDescCount * sizeof *access);
    pthread_mutex_lock(&fc_obj_mutex);
    a->key = fc_addr_new(p->bytesize, p->bytesize >= FC_GRANULARITY ? FC_GRANULARITY : 512, 0);
    a->size = p->bytesize;
    a->kind = A_GRAPHVA;
    a->dev = dev;
    a->maps = 1; /* refs: the graph */
    fc_alloc_put(a);
    pthread_mutex_unlock(&fc_obj_mutex);
    n->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    n->dev = dev;
    n->dptr = a->key;
    n->params = *p;
    n->params.accessDescs = access;
    n->params.dptr = a->key;
    n->access = access;
    r = add_node(g, n, phGraphNode);
    if (r) {
        pthread_mutex_lock(&fc_obj_mutex);
        fc_alloc_take(a->key);
        pthread_mutex_unlock(&fc_obj_mutex);
        free(a), free(access);
        return r;
    }
    nodeParams->dptr = n->dptr;
    return CUDA_SUCCESS;
}

/* Frees an address returned by an alloc node (of this graph, or of another graph that does
 * not free it itself), once. */
FC_API CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                      const CUgraphNode *dependencies, size_t numDependencies,
                                      CUdeviceptr dptr) {
    struct fc_graph *g;
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies, &g);
    if (r) return r;
    if (g->embedded) return CUDA_ERROR_INVALID_VALUE; /* cuGraphChildGraphNodeGetGraph's */
    struct fc_gnode *n = calloc(1, sizeof *n);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(dptr);
    if (!a || a->kind != A_GRAPHVA || a->freed_in_graph)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        a->freed_in_graph = 1;
    pthread_mutex_unlock(&fc_obj_mutex);
    if (r) {
        free(n);
        return r;
    }
    n->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    n->dptr = dptr;
    r = add_node(g, n, phGraphNode);
    if (r) {
        pthread_mutex_lock(&fc_obj_mutex);
        if ((a = fc_alloc_get(dptr)) != NULL) a->freed_in_graph = 0;
        pthread_mutex_unlock(&fc_obj_mutex);
    }
    return r;
}

FC_API CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_gnode *n = node_of(hNode);
    if (!n || !params_out || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    *params_out = n->params;
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_gnode *n = node_of(hNode);
    if (!n || !dptr_out || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
    *dptr_out = n->dptr;
    return CUDA_SUCCESS;
}

/* ---- child graph nodes ---- */
static void destroy_graph(struct fc_graph *g);

/* An embedded graph that no node holds (a failed add). */
static void drop_embedded(struct fc_graph *g, CUgraph handle) {
    fc_handle_free(handle);
    destroy_graph(g);
}

/* Whether g or a graph embedded in it has memory nodes. */
static int has_mem_nodes(const struct fc_graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        const struct fc_gnode *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
            return 1;
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && has_mem_nodes(n->child)) return 1;
    }
    return 0;
}

/* A new embedded graph: a clone of src (kernel and child graph nodes; no memory nodes),
 * with its own handle.  NULL when out of memory. */
static struct fc_graph *clone_graph(const struct fc_graph *src, CUgraph *handle) {
    struct fc_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->embedded = 1;
    *handle = fc_handle_new(K_GRAPH, g);
    if (!*handle) {
        free(g);
        return NULL;
    }
    for (size_t i = 0; i < src->n; i++) {
        const struct fc_gnode *s = src->nodes[i];
        struct fc_gnode *n = calloc(1, sizeof *n);
        if (!n) goto fail;
        n->type = s->type;
        n->dur = s->dur;
        if (s->type == CU_GRAPH_NODE_TYPE_GRAPH) {
            n->child = clone_graph(s->child, &n->child_handle);
            if (!n->child) {
                free(n);
                goto fail;
            }
        }
        CUgraphNode h;
        struct fc_graph *child = n->child;
        CUgraph child_handle = n->child_handle;
        if (add_node(g, n, &h)) { /* n is freed */
            if (child) drop_embedded(child, child_handle);
            goto fail;
        }
    }
    return g;
fail:
    drop_embedded(g, *handle);
    return NULL;
}

FC_API CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *dependencies, size_t numDependencies,
                                         CUgraph childGraph) {
    struct fc_graph *g;
    CUresult r = check_add(phGraphNode, hGraph, dependencies, numDependencies, &g);
    if (r) return r;
    struct fc_graph *src = fc_handle_get(childGraph, K_GRAPH);
    if (!src || has_mem_nodes(src)) return CUDA_ERROR_INVALID_VALUE;
    struct fc_gnode *n = calloc(1, sizeof *n);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->type = CU_GRAPH_NODE_TYPE_GRAPH;
    n->child = clone_graph(src, &n->child_handle);
    if (!n->child) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fc_graph *child = n->child;
    CUgraph child_handle = n->child_handle;
    r = add_node(g, n, phGraphNode); /* frees n on failure */
    if (r) drop_embedded(child, child_handle);
    return r;
}

/* The embedded graph itself (no clone): changes to it are the node's. */
FC_API CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_gnode *n = node_of(hNode);
    if (!n || !phGraph || n->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *phGraph = n->child_handle;
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_gnode *n = node_of(hNode);
    if (!n || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}

/* Every node, whatever its kind; nodes NULL: the count only. */
FC_API CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!g || !numNodes) return CUDA_ERROR_INVALID_VALUE;
    if (!nodes) {
        *numNodes = g->n;
        return CUDA_SUCCESS;
    }
    size_t room = *numNodes;
    for (size_t i = 0; i < room; i++) nodes[i] = i < g->n ? g->nodes[i]->handle : NULL;
    *numNodes = room < g->n ? room : g->n;
    return CUDA_SUCCESS;
}

/* ---- instantiation and launch ---- */
/* One reference less on an alloc node's address record; gone when nothing holds it.
 * Under fc_obj_mutex. */
static void unref_locked(uint64_t key) {
    struct fc_alloc *a = fc_alloc_get(key);
    if (!a || a->kind != A_GRAPHVA) return;
    if (a->maps > 0) a->maps--;
    if (a->maps == 0 && !a->live) free(fc_alloc_take(key));
}

/* The kernel work of g's kernel nodes and of its child graphs', to any depth. */
static void kernel_work(const struct fc_graph *g, uint64_t *dur, size_t *nkernels) {
    for (size_t i = 0; i < g->n; i++) {
        const struct fc_gnode *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) *dur += n->dur, ++*nkernels;
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH) kernel_work(n->child, dur, nkernels);
    }
}

static void exec_free(struct fc_exec *e) {
    free(e->allocs);
    free(e->frees);
    free(e);
}

FC_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phExec, CUgraph hGraph,
                                            unsigned long long flags) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!phExec || !g) return CUDA_ERROR_INVALID_VALUE;
    struct fc_exec *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->auto_free = (flags & AUTO_FREE_ON_LAUNCH) != 0;
    size_t na = 0, nf = 0;
    for (size_t i = 0; i < g->n; i++) {
        na += g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        nf += g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_FREE;
    }
    e->allocs = na ? calloc(na, sizeof *e->allocs) : NULL;
    e->frees = nf ? calloc(nf, sizeof *e->frees) : NULL;
    if ((na && !e->allocs) || (nf && !e->frees)) {
        exec_free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    kernel_work(g, &e->dur, &e->nkernels);
    for (size_t i = 0; i < g->n; i++) {
        const struct fc_gnode *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            e->allocs[e->nalloc++] = (struct exec_alloc){n->dptr, n->params.bytesize, n->dev, 0};
    }
    for (size_t i = 0; i < g->n; i++) {
        const struct fc_gnode *n = g->nodes[i];
        if (n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) continue;
        size_t k = 0;
        while (k < e->nalloc && e->allocs[k].key != n->dptr) k++;
        if (k < e->nalloc)
            e->allocs[k].freed_here = 1;
        else
            e->frees[e->nfree++] = n->dptr;
    }
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t k = 0; k < e->nalloc; k++) {
        struct fc_alloc *a = fc_alloc_get(e->allocs[k].key);
        if (a) a->maps++; /* the exec holds the address too */
    }
    pthread_mutex_unlock(&fc_obj_mutex);
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

/* Maps the launch's graph memory; CUDA_ERROR_OUT_OF_MEMORY when the device lacks it. */
static CUresult launch_memory(struct fc_exec *e, struct fc_ctx *c) {
    uint64_t alloc[FC_MAX_DEV] = {0}, freed[FC_MAX_DEV] = {0}, autofreed[FC_MAX_DEV] = {0};
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t k = 0; k < e->nalloc && !r; k++) {
        struct fc_alloc *a = fc_alloc_get(e->allocs[k].key);
        if (!a || a->kind != A_GRAPHVA) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else if (a->live) {
            /* the previous launch's allocation is still in use */
            if (!e->auto_free) r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (!r) {
        for (size_t k = 0; k < e->nalloc; k++) {
            struct fc_alloc *a = fc_alloc_get(e->allocs[k].key);
            if (a->live) { /* auto free on launch */
                autofreed[a->dev] += a->size;
                a->live = 0;
                a->ctx = NULL;
            }
            alloc[a->dev] += a->size;
            if (e->allocs[k].freed_here) freed[a->dev] += a->size;
        }
        for (size_t k = 0; k < e->nfree; k++) {
            struct fc_alloc *a = fc_alloc_get(e->frees[k]);
            if (a && a->kind == A_GRAPHVA && a->live) freed[a->dev] += a->size;
        }
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    if (r) return r;
    for (int d = 0; d < FC_MAX_DEV; d++)
        if (autofreed[d]) fc_graphmem_free(d, autofreed[d]);
    r = fc_graphmem_launch(alloc, freed);
    if (r) return r;
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t k = 0; k < e->nalloc; k++) {
        struct fc_alloc *a = fc_alloc_get(e->allocs[k].key);
        if (a && !e->allocs[k].freed_here) {
            a->live = 1;
            a->ctx = c; /* freed with the context */
        }
    }
    for (size_t k = 0; k < e->nfree; k++) {
        struct fc_alloc *a = fc_alloc_get(e->frees[k]);
        if (!a || a->kind != A_GRAPHVA || !a->live) continue;
        a->live = 0;
        a->ctx = NULL;
        if (a->maps == 0) free(fc_alloc_take(e->frees[k]));
    }
    pthread_mutex_unlock(&fc_obj_mutex);
    return CUDA_SUCCESS;
}

/* An executable and the stream it goes on (launch, upload). */
static CUresult exec_on(CUgraphExec hExec, CUstream hStream, struct fc_exec **e,
                        struct fc_ctx **c, struct fc_stream **s) {
    CUresult r = fc_stream_ctx(hStream, c, s);
    if (r) return r;
    *e = fc_handle_get(hExec, K_EXEC);
    return *e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuGraphLaunch(CUgraphExec hExec, CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    struct fc_exec *e;
    CUresult r = exec_on(hExec, hStream, &e, &c, &s);
    if (r) return r;
    if (e->nkernels) { /* kernels: the context grows at its first launch */
        r = fc_ctx_first_launch(c);
        if (r) return r;
    }
    if (e->nalloc || e->nfree) {
        r = launch_memory(e, c);
        if (r) return r;
    }
    if (e->dur) fc_run(c, s, e->dur);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphExecDestroy(CUgraphExec hExec);

/* cuGraphUpload: the graph's memory is backed (its device's pool grows to cover every
 * allocation node, as a launch would) without running anything; a launch after it finds
 * the reserve there. */
FC_API CUresult cuGraphUpload(CUgraphExec hExec, CUstream hStream) {
    struct fc_ctx *c;
    struct fc_stream *s;
    struct fc_exec *e;
    CUresult r = exec_on(hExec, hStream, &e, &c, &s);
    if (r) return r;
    uint64_t bytes[FC_MAX_DEV] = {0};
    for (size_t k = 0; k < e->nalloc; k++) bytes[e->allocs[k].dev] += e->allocs[k].size;
    return e->nalloc ? fc_graphmem_back(bytes) : CUDA_SUCCESS;
}

FC_API CUresult cuGraphUpload_ptsz(CUgraphExec hExec, CUstream hStream) {
    return cuGraphUpload(hExec, hStream);
}

/* CUDA 12's instantiate: the flags of cuGraphInstantiateWithFlags, and
 * CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, which uploads it (cuGraphUpload) on hUploadStream. */
FC_API CUresult cuGraphInstantiateWithParams(CUgraphExec *phExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    params->hErrNode_out = NULL;
    CUresult r = cuGraphInstantiateWithFlags(
        phExec, hGraph, params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    if (!r && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) {
        r = cuGraphUpload(*phExec, params->hUploadStream);
        if (r) {
            cuGraphExecDestroy(*phExec);
            *phExec = NULL;
        }
    }
    params->result_out = r ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return r;
}

FC_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return cuGraphInstantiateWithParams(phExec, hGraph, params);
}

FC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hExec, CUstream hStream) {
    return cuGraphLaunch(hExec, hStream);
}

/* cuMemFree / cuMemFreeAsync of an address a graph launch mapped. */
CUresult fc_graph_free_va(uint64_t key) {
    pthread_mutex_lock(&fc_obj_mutex);
    struct fc_alloc *a = fc_alloc_get(key);
    if (!a || a->kind != A_GRAPHVA || !a->live) {
        pthread_mutex_unlock(&fc_obj_mutex);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int dev = a->dev;
    uint64_t size = a->size;
    a->live = 0;
    a->ctx = NULL;
    if (a->maps == 0) free(fc_alloc_take(key));
    pthread_mutex_unlock(&fc_obj_mutex);
    fc_graphmem_free(dev, size);
    return CUDA_SUCCESS;
}

FC_API CUresult cuGraphExecDestroy(CUgraphExec hExec) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_exec *e = fc_handle_get(hExec, K_EXEC);
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    fc_handle_free(hExec);
    pthread_mutex_lock(&fc_obj_mutex);
    for (size_t k = 0; k < e->nalloc; k++) unref_locked(e->allocs[k].key);
    pthread_mutex_unlock(&fc_obj_mutex);
    exec_free(e);
    return CUDA_SUCCESS;
}

/* g, its nodes and their embedded graphs (the caller has freed g's handle, or g has none
 * yet).  Allocations still mapped stay until freed. */
static void destroy_graph(struct fc_graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        struct fc_gnode *n = g->nodes[i];
        fc_handle_free(n->handle);
        if (n->type == CU_GRAPH_NODE_TYPE_GRAPH) {
            fc_handle_free(n->child_handle);
            destroy_graph(n->child);
            free(n);
            continue;
        }
        pthread_mutex_lock(&fc_obj_mutex);
        struct fc_alloc *a = fc_alloc_get(n->dptr);
        if (a && a->kind == A_GRAPHVA) {
            if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
                unref_locked(n->dptr);
            } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
                a->freed_in_graph = 0;
            }
        }
        pthread_mutex_unlock(&fc_obj_mutex);
        free(n->access);
        free(n);
    }
    free(g->nodes);
    free(g);
}

/* An embedded graph is its node's: INVALID_VALUE (it goes with the parent graph). */
FC_API CUresult cuGraphDestroy(CUgraph hGraph) {
    CUresult r = fc_check_init();
    if (r) return r;
    struct fc_graph *g = fc_handle_get(hGraph, K_GRAPH);
    if (!g || g->embedded) return CUDA_ERROR_INVALID_VALUE;
    fc_handle_free(hGraph);
    destroy_graph(g);
    return CUDA_SUCCESS;
}
