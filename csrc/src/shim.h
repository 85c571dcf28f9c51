/* Private declarations shared by the shim's translation units. Nothing here is
 * exported: the build uses -fvisibility=hidden and a version script generated
 * from hooks.def. */
#ifndef VGPU_SHIM_H
#define VGPU_SHIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "vgpu_cuda.h"
#include "vgpu_nvml.h"
#include "vgpu_state_abi.h"

#define VG_EXPORT __attribute__((visibility("default")))
#define VG_HIDDEN __attribute__((visibility("hidden")))
#define VG_TLS __thread __attribute__((tls_model("initial-exec")))
/* dlsym can be called by a sanitizer runtime before it is initialised: the code on
 * that path must not be instrumented */
#define VG_NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

#define VG_MISSING_CU CUDA_ERROR_NOT_FOUND
#define VG_MISSING_NVML NVML_ERROR_FUNCTION_NOT_FOUND
/* a hooked call that cannot be served safely (foreign code re-entering while this
 * thread holds one of the shim's locks, or before the shim is initialised) */
#define VG_REFUSED_CU CUDA_ERROR_NOT_PERMITTED
#define VG_REFUSED_NVML NVML_ERROR_NO_PERMISSION

/* ---- real.c: the real entry points, the per-thread flags (the bottom: calls no file) ---- */
struct vg_real_table {
#define HOOK(lib, name, ret, params, args) ret (*name) params;
#define REAL(lib, name, ret, params) ret (*name) params;
#include "hooks.def"
};
extern struct vg_real_table vg_real;
extern VG_TLS int vg_tls_guard;      /* set while this thread runs inside the shim */
extern VG_TLS int vg_tls_locks;      /* how many of the shim's locks this thread holds */
/* The shim's own mutexes, each declared with VG_MUTEX: listed in one section, so that a
 * forked child can re-initialise them all (another thread of the parent may have held
 * one at the fork; in the child, where that thread does not exist, it would stay held). */
#define VG_MUTEX(name)                                                                     \
    static pthread_mutex_t name = PTHREAD_MUTEX_INITIALIZER;                               \
    static pthread_mutex_t *const name##_listed                                            \
        __attribute__((section("vg_mutexes"), used)) = &name
/* the shim's locks, counted: a hook entered again while one is held must not run */
static inline void vg_lock(pthread_mutex_t *m) { pthread_mutex_lock(m); vg_tls_locks++; }
static inline void vg_unlock(pthread_mutex_t *m) { vg_tls_locks--; pthread_mutex_unlock(m); }
void *vg_real_dlsym(void *handle, const char *name);
void *vg_real_dlsym_fn(void);         /* glibc's dlsym itself */
void vg_real_resolve(void *handle, int want_nvml); /* fill vg_real from a loaded library */
const char *vg_real_dlerror(void);    /* glibc's dlerror, never NULL */
void vg_set_init_done(void);
int vg_init_done(void);              /* the shim is initialised (vg_real resolved) */

/* ---- dispatch.c: the one-time initialisation (the top, with the entry points) ---- */
/* 1 when a hook's return address lies in the driver, NVML or the shim (their own calls
 * to exported names), or before those are known; 0 for any other code (a signal
 * handler or a profiler's callback that runs while this thread is inside the driver) */
int vg_own_caller(const void *ret);
void vg_init(void);                  /* lazy, once; safe to call from any hook */
void *vg_cuda_handle(void);

/* ---- hooks.c: the entry points; pointer identity -> hook ---- */
void *vg_route_pointer(void *real_fn);   /* our hook for a real driver pointer, or NULL */
int vg_is_hooked_name(const char *name);

/* ---- log.c ---- */
enum { VG_LOG_ERROR = 0, VG_LOG_WARN = 1, VG_LOG_INFO = 2, VG_LOG_DEBUG = 3 };
void vg_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define VG_ERROR(...) vg_log(VG_LOG_ERROR, __VA_ARGS__)
#define VG_WARN(...) vg_log(VG_LOG_WARN, __VA_ARGS__)
#define VG_INFO(...) vg_log(VG_LOG_INFO, __VA_ARGS__)
#define VG_DEBUG(...) vg_log(VG_LOG_DEBUG, __VA_ARGS__)

/* ---- config.c ---- */
enum vg_policy { VG_POLICY_FIXED = 0, VG_POLICY_BALANCE = 1, VG_POLICY_NONE = 2 };
enum vg_config_source { VG_SRC_NONE = 0, VG_SRC_FILE = 1, VG_SRC_ENV = 2 };
#define VG_MOUNT_DIR "/etc/vgpud" /* the plugin's read-only per-allocation directory */

typedef struct vg_device_config {
    char uuid[96];
    uint64_t memory_limit;      /* bytes, 0 = unlimited; device + spilled bytes */
    uint64_t spill_limit;       /* bytes that may spill into host memory (oversubscribe) */
    uint32_t core_limit;        /* percent, 0 = unlimited (100 is stored as 0) */
    int core_policy;            /* enum vg_policy */
    int oversubscribe;
    int present;
} vg_device_config;

typedef struct vg_config {
    int source;                 /* enum vg_config_source */
    int kube;                   /* VG_MOUNT_DIR is mounted: the plugin's file is the only source */
    int deny;                   /* unusable file: every device allocation is refused */
    int device_count;           /* highest device index + 1 */
    int priority;
    char state_dir[512];
    char register_path[512];    /* the plugin's registration socket ("" = none) */
    char arbiter_dir[512];      /* the plugin's per-GPU arbitration records ("" = none) */
    char env_ignored[256];      /* VGPUD_* variables present but ignored (Kubernetes mode) */
    vg_device_config dev[VG_MAX_DEVICES];
    char error[256];            /* why the file was rejected (deny == 1) */
} vg_config;

/* Parse the text of a config file. Returns 0, or -1 with out->error set (the
 * caller then applies the deny mode). Pure: no I/O. */
int vg_config_parse(const char *text, vg_config *out);
/* Parse a byte count with an optional k/m/g/t suffix (binary). -1 on error. */
int vg_parse_bytes(const char *s, uint64_t *out);
/* Load the config (see config.c for where from). */
void vg_config_load(vg_config *out);
extern vg_config vg_cfg;

/* ---- budget.c: pure accounting helpers ---- */
int vg_budget_fits(uint64_t used, uint64_t request, uint64_t limit); /* limit 0 = unlimited */
uint64_t vg_pitch_bytes(size_t width, size_t height, size_t *pitch_out);
uint64_t vg_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels);
uint64_t vg_mipmap_bytes(size_t w, size_t h, size_t d, int format, unsigned channels,
                         unsigned levels);

/* A table of live allocations of this process: key -> record. */
enum vg_kind { VG_KIND_DEVICE = 0, VG_KIND_SPILL = 1, VG_KIND_MANAGED = 2, VG_KIND_POOL = 3 };
typedef struct vg_alloc {
    uint64_t key;     /* device pointer, handle, pool, context or graph exec; never 0 */
    uint64_t bytes;
    uint64_t ctx;     /* the CUcontext it was made in (0: none) */
    uint64_t aux;     /* a pool pointer's pool; a mapping's handle */
    int32_t dev;      /* config index (devmap.c), not the CUDA ordinal */
    int32_t kind;     /* enum vg_kind */
    int32_t refs;     /* a VMM handle's live mappings */
    int32_t flags;    /* VG_F_* */
    int32_t holds;    /* a VMM allocation's handles not released yet (create, retain, import);
                       * a graph exec's devices past the first (their bytes at ctx) */
} vg_alloc;
#define VG_F_RELEASED 1 /* a VMM handle released while still mapped */
#define VG_F_PENDING 2  /* a context whose memory is not measured yet */
#define VG_F_PRIMARY 4  /* a primary context */
#define VG_F_EXPORTED 8 /* a pointer cuIpcGetMemHandle or cuMemPoolExportPointer exported, a VMM
                         * handle cuMemExportToShareableHandle did, or a
                         * pool cuMemPoolExportToShareableHandle did: other processes may keep
                         * its memory after this one frees it */
typedef struct vg_alloc_table { vg_alloc *slots; size_t cap; size_t len; } vg_alloc_table;
int vg_table_put(vg_alloc_table *t, vg_alloc a);     /* 0, or -1 when out of memory */
int vg_table_take(vg_alloc_table *t, uint64_t key, vg_alloc *out); /* 1 found+removed */
int vg_table_peek(const vg_alloc_table *t, uint64_t key, vg_alloc *out);
void vg_table_free(vg_alloc_table *t);

/* ---- state.c: the shared usage file ---- */
int vg_state_attach(const vg_config *cfg);   /* 0 shared file, 1 process-local, -1 none */
/* Charge bytes to config device dev for this process. VG_KIND_DEVICE counts against
 * the limit (device + spilled <= memory_limit); VG_KIND_SPILL against spill_limit and
 * the same total. With VG_CHARGE_FORCE the bytes are charged even over the limit:
 * memory that exists whatever we say (a context, a pool's reservation). Returns 0, or
 * -1 when it would exceed. */
#define VG_CHARGE_FORCE 1
#define VG_CHARGE_CONTEXT 2
int vg_state_charge(int dev, uint64_t bytes, int kind, int flags);
void vg_state_uncharge(int dev, uint64_t bytes, int kind);
void vg_state_uncharge_context(int dev, uint64_t bytes); /* context memory given back */
uint64_t vg_state_used(int dev);             /* device bytes, all processes */
uint64_t vg_state_spilled(int dev);          /* spilled bytes, all processes */
int vg_state_over_limit(int dev, uint64_t more); /* used + spilled + more past the limit */
uint64_t vg_state_own_used(int dev);         /* device bytes charged to this process */
void vg_state_adopt(int dev, const int *pids, const uint64_t *bytes, int n, int by_ns_pid);
uint64_t vg_state_take_adopted(int dev);
int vg_state_processes(int dev, int *cpids, int *hpids, uint64_t *used, int max);
void vg_state_set_host_pid(int host_pid);
int vg_state_own_host_pid(void);
int vg_state_own_slot(void);
uint64_t vg_state_own_start(void);           /* /proc/self/stat starttime */
vg_state_header *vg_state_header_ptr(void);
void vg_state_reclaim(void);

/* ---- devmap.c: CUDA ordinals -> the config's devices, by UUID ---- */
int vg_dev_index(CUdevice ordinal);          /* config index, or -1: no device memory there */
int vg_dev_ordinal(int index);               /* a CUDA ordinal of config device index, or -1 */
int vg_current(CUdevice *ordinal, int *index); /* 1 when a context is current */
/* the device a stream's work runs on (the current context's for the NULL stream) */
int vg_stream_device(CUstream s, CUdevice *ordinal, int *index);

/* ---- allocations.c: this process's allocations ---- */
enum { VG_T_PTR, VG_T_ARRAY, VG_T_HANDLE, VG_T_MAP, VG_T_POOL, VG_T_CTX, VG_T_GRAPH, VG_T_N };
int vg_remember(int table, vg_alloc a); /* 0, or -1 (logged) when it cannot be kept */
int vg_forget(int table, uint64_t key, vg_alloc *out);
int vg_peek(int table, uint64_t key, vg_alloc *out);
int vg_mark(int table, uint64_t key, int32_t flags); /* flags OR-ed into a record: 1 found */
/* Call fn on (a copy of) every record of a table; fn returns 1 to remove the record. */
void vg_each(int table, int (*fn)(vg_alloc *a, void *arg), void *arg);
uint64_t vg_current_ctx(void);
/* every record of table made in context from is from now on context to's */
void vg_rekey_ctx(int table, uint64_t from, uint64_t to);
void vg_release(const vg_alloc *a);          /* uncharge a forgotten record */
void vg_allocations_after_fork(void);        /* a forked child owns no records */

/* ---- cuda_memory.c ---- */
int vg_oversubscribed(int dev);

/* ---- contexts.c: the memory contexts (and the driver, outside the hooks) take ---- */
void vg_context_charge(int dev);             /* measure contexts still pending on dev */
void vg_context_untracked_now(int dev);      /* measure untracked memory now (see contexts.c) */
void vg_context_untracked_now_on(uint64_t devices); /* ... on each device of a mask */
void vg_context_exported_freed(int dev);   /* and what NVML moved to another process */
void vg_context_created(CUcontext ctx, CUdevice ordinal, int primary);
int vg_context_gone(CUcontext ctx);          /* its charge given back; its device or -1 */
CUcontext vg_context_primary(CUdevice ordinal); /* the primary context known, or NULL */
uint64_t vg_context_largest(int dev);        /* the largest one context measured on dev */

/* ---- cuda_pool.c ---- */
void vg_pools_reconcile(int dev);            /* dev -1: every device */
extern int vg_pools_dirty;                   /* a pool may have released memory */
#define VG_GRAPH_DEVS 8
typedef struct { int ordinal; uint64_t bytes; } vg_graph_dev;
int vg_graph_memory(CUgraph graph, vg_graph_dev out[VG_GRAPH_DEVS]);
CUresult vg_graph_launch_charge(uint64_t bytes, int ordinal);
void vg_graph_launched(int ordinal, CUresult launch);
void vg_graph_unknown_launched(void);
CUgraphNode *vg_graph_nodes(CUgraph graph, size_t *n); /* every node, malloc'd; NULL if none */

/* ---- nvml.c ---- */
int vg_nvml_ready(void);             /* initialises NVML on first use; 1 if usable */
nvmlDevice_t vg_nvml_device(int dev);       /* NVML handle of config device dev, or NULL */
/* every row NVML has (malloc'd, to free), however many processes there are */
nvmlReturn_t vg_nvml_samples(nvmlDevice_t device, unsigned long long since,
                             nvmlProcessUtilizationSample_t **out, unsigned *count);
nvmlReturn_t vg_nvml_compute_processes(nvmlDevice_t device, nvmlProcessInfo_t **out,
                                       unsigned *count);
int vg_nvml_namespace_pids(void);           /* the driver's process lists use our PIDs (>= 560) */

/* ---- pidmap.c ---- */
int vg_pidmap_host_pid(int pid);            /* from NSpid or the initial namespace; 0 unknown */
int vg_host_pid(void);                      /* this process's host PID, 0 while unknown */

/* ---- register.c ---- */
/* Register this process with the plugin (vg_cfg.register_path): the plugin learns our
 * host PID from the kernel (SO_PEERCRED) and answers it. >0 the host PID, 0 not now
 * (retry later), -1 never (no socket configured, or the plugin refused). */
int vg_register(int slot, uint64_t start_time);

/* ---- controller.c: SM limit ---- */
extern int vg_sm_any_limited;               /* fast-path flag */
void vg_sm_setup(void);
void vg_sm_charge(CUdevice dev, uint64_t blocks);
void vg_sm_charge_graph(CUdevice dev, uint64_t kernel_nodes);

/* ---- time ---- */
/* ---- arbiter.c: the node's priority decision, per GPU ---- */
/* 1 when a higher-priority container is active on config device d and this one must
 * hold its SM rate at *floor_permille; 0 otherwise (no record, a stale one, or none
 * higher). Cheap: a mapped page read under a sequence lock. */
int vg_arbiter_throttle(int d, uint32_t *floor_permille);
int vg_arbiter_present(int d);          /* a record is configured for device d */

uint64_t vg_now_ns(void);                   /* CLOCK_MONOTONIC */
uint64_t vg_realtime_ns(void);

#endif
