/* Private declarations shared by the shim's translation units. Nothing here is
 * exported: the build uses -fvisibility=hidden and a version script generated
 * from hooks.def. */
#ifndef VGPU_SHIM_H
#define VGPU_SHIM_H

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

/* ---- dispatch.c: the real entry points ---- */
struct vg_real_table {
#define HOOK(lib, name, ret, params, args) ret (*name) params;
#define REAL(lib, name, ret, params) ret (*name) params;
#include "hooks.def"
};
extern struct vg_real_table vg_real;
extern VG_TLS int vg_tls_guard;      /* set while this thread runs inside the shim */

void vg_init(void);                  /* lazy, once; safe to call from any hook */
void *vg_real_dlsym(void *handle, const char *name);
void *vg_real_dlsym_fn(void);         /* glibc's dlsym itself */
void *vg_cuda_handle(void);
int vg_nvml_ready(void);             /* loads + initialises NVML on first use; 1 if usable */

/* ---- routing.c: pointer identity -> hook ---- */
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

typedef struct vg_device_config {
    char uuid[96];
    uint64_t memory_limit;      /* bytes, 0 = unlimited */
    uint32_t core_limit;        /* percent, 0 = unlimited (100 is stored as 0) */
    int core_policy;            /* enum vg_policy */
    int oversubscribe;
    int present;
} vg_device_config;

typedef struct vg_config {
    int source;                 /* enum vg_config_source */
    int deny;                   /* garbled file: every device allocation is refused */
    int device_count;           /* highest device index + 1 */
    int priority;
    char state_dir[512];
    char host_proc[512];        /* host /proc mounted in the container, for PID mapping */
    vg_device_config dev[VG_MAX_DEVICES];
    char error[256];            /* why the file was rejected (deny == 1) */
} vg_config;

/* Parse the text of a config file. Returns 0, or -1 with out->error set (the
 * caller then applies the deny mode). Pure: no I/O. */
int vg_config_parse(const char *text, vg_config *out);
/* Parse a byte count with an optional k/m/g/t suffix (binary). -1 on error. */
int vg_parse_bytes(const char *s, uint64_t *out);
/* Load the config: file at $VGPUD_CONFIG or /etc/vgpud/config, else env. */
void vg_config_load(vg_config *out);
extern vg_config vg_cfg;

/* ---- budget.c: pure accounting helpers ---- */
int vg_budget_fits(uint64_t used, uint64_t request, uint64_t limit); /* limit 0 = unlimited */
uint64_t vg_pitch_bytes(size_t width, size_t height, size_t *pitch_out);
uint64_t vg_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels);
uint64_t vg_mipmap_bytes(size_t w, size_t h, size_t d, int format, unsigned channels,
                         unsigned levels);

/* A table of live allocations of this process: key -> (bytes, device, kind). */
enum vg_kind { VG_KIND_DEVICE = 0, VG_KIND_SPILL = 1, VG_KIND_MANAGED = 2 };
typedef struct vg_alloc { uint64_t key; uint64_t bytes; int32_t dev; int32_t kind; } vg_alloc;
typedef struct vg_alloc_table { vg_alloc *slots; size_t cap; size_t len; } vg_alloc_table;
int vg_table_put(vg_alloc_table *t, vg_alloc a);     /* 0, or -1 when out of memory */
int vg_table_take(vg_alloc_table *t, uint64_t key, vg_alloc *out); /* 1 found+removed */
int vg_table_peek(const vg_alloc_table *t, uint64_t key, vg_alloc *out);
void vg_table_free(vg_alloc_table *t);

/* ---- state.c: the shared usage file ---- */
int vg_state_attach(const vg_config *cfg);   /* 0 shared file, 1 process-local, -1 none */
/* Charge bytes to device dev of this process. kind: VG_KIND_DEVICE counts
 * against the limit; VG_KIND_SPILL only in spilled. force=1 charges even over
 * the limit (never used for allocations). Returns 0, or -1 when it would exceed. */
int vg_state_charge(int dev, uint64_t bytes, int kind, int is_context);
void vg_state_uncharge(int dev, uint64_t bytes, int kind);
uint64_t vg_state_used(int dev);
uint64_t vg_state_limit(int dev);            /* 0 = unlimited */
int vg_state_processes(int dev, int *cpids, int *hpids, uint64_t *used, int max);
void vg_state_set_host_pid(int host_pid);
int vg_state_own_host_pid(void);
vg_state_header *vg_state_header_ptr(void);
void vg_state_reclaim(void);

/* ---- pidmap.c ---- */
int vg_pidmap_host_pid(const char *host_proc, int pid); /* >0, or 0 unknown */

/* ---- cuda_memory.c ---- */
int vg_current_device(CUdevice *dev);       /* 1 when a context is current */
void vg_context_charge(CUdevice dev);       /* charge context memory once per device */

/* ---- controller.c: SM limit ---- */
extern int vg_sm_any_limited;               /* fast-path flag */
void vg_sm_setup(void);
void vg_sm_charge(CUdevice dev, uint64_t blocks);
void vg_sm_charge_graph(CUdevice dev, uint64_t kernel_nodes);
int vg_controller_host_pid(void);           /* 0 until the mapping is known */

/* ---- nvml.c ---- */
nvmlDevice_t vg_nvml_device(int dev);       /* NVML handle of CUDA ordinal dev, or NULL */

/* ---- time ---- */
uint64_t vg_now_ns(void);                   /* CLOCK_MONOTONIC */
uint64_t vg_realtime_ns(void);

#endif
