/* Internals shared by the files of the fake driver and the fake NVML. */
#ifndef FAKE_FAKE_H
#define FAKE_FAKE_H

#include <stdint.h>
#include <sys/types.h>

#define FC_API __attribute__((visibility("default")))

#define FC_MAX_DEV 16
#define FC_MAX_PROCS 512
#define FC_SEGS 65536 /* kernel-timeline segments kept per device */
#define FC_SAMPLES 64      /* NVML utilisation windows kept per device */
#define FC_SAMPLE_PIDS 64  /* processes kept per window */
#define FC_MIB (1024ull * 1024ull)
#define FC_MIG_GI 15 /* GPU instance ids 0..14: the A100's partition (swizzle) ids */
#define FC_MIG_CI 8  /* compute instance ids per GPU instance */
#define FC_ACCT 4000 /* accounting records per device (the real default buffer size) */
#define FC_IPC 256        /* legacy CUDA IPC exports live at once, all processes */
#define FC_IPC_OPENERS 16 /* processes that may hold one export open at once */

/* ---- knobs (knobs.c) ---- */
struct fc_knobs {
    int ndev;
    uint64_t total[FC_MAX_DEV]; /* bytes */
    uint64_t ctx_bytes;
    uint64_t module_bytes;   /* FAKECUDA_MODULE_MIB: device memory of each loaded module */
    uint64_t ctx_grow_bytes; /* FAKECUDA_CTX_GROW_MIB: a context's growth at its first launch */
    uint64_t green_bytes;    /* FAKECUDA_GREEN_CTX_MIB: what a green context provisions */
    int sms;
    uint64_t ns_per_block; /* a kernel's work per block per wave (functions not named fake_ns_N) */
    uint64_t launch_ns;    /* fixed device-side cost of every kernel */
    uint64_t max_queue_ns;
    uint64_t sample_ns;    /* NVML utilisation sampling window */
    long host_pid_offset;
    int driver_version;
    int pool_fragments;     /* FAKECUDA_POOL_FRAGMENTS=1: a pool's freed blocks do not merge */
    int nvml_window_to_one; /* FAKECUDA_NVML_WINDOW_TO_ONE=1: a window's utilisation goes to one process */
    int reuse_addresses;    /* FAKECUDA_REUSE_ADDRESSES=1: a freed address is handed out again */
    uint64_t free_pause_ms; /* FAKECUDA_FREE_PAUSE_MS: cuMemFree returns this long after freeing */
    int graphmem_lazy;      /* FAKECUDA_GRAPHMEM_LAZY=1: a graph launch maps its memory when
                             * the work runs (at the next synchronisation), not in the call */
    char nvml_driver_version[80]; /* nvmlSystemGetDriverVersion */
    int nvml_driver_major;        /* >= 560: process lists in the caller's PID namespace */
    const char *host_pid_sock;    /* FAKECUDA_HOST_PID_SOCK: NULL when unset */
    const char *state_path; /* NULL: process-local */
    const char *events_path;
    /* FAKECUDA_NVLINK ("0-1,2-3"): NVLink pairs; links[d] lists d's peers in order */
    int nlinks[FC_MAX_DEV];
    int links[FC_MAX_DEV][FC_MAX_DEV];
    /* FAKECUDA_RETIRE_PENDING ("1,3"): devices with a page retirement pending */
    int retire_pending[FC_MAX_DEV];
    /* CUDA_VISIBLE_DEVICES (CUDA side only): visible ordinal -> physical device */
    int nvis;
    int vis[FC_MAX_DEV];
    /* the one MIG device CUDA_VISIBLE_DEVICES may name (MIG-... UUID): its ordinal (-1:
     * none), parent physical device, board generation, GPU and compute instance ids;
     * resolved against the MIG tables by cuInit (fc_visible_resolve) */
    int mig_ordinal;
    int mig_phys;
    unsigned mig_gen, mig_gi, mig_ci;
    unsigned mig_gslices, mig_cslices, mig_mem_slices; /* set by fc_visible_resolve */
    /* FAKECUDA_ABSENT ("3" or "2,3"): devices not on the bus at start (NVML) */
    int absent[FC_MAX_DEV];
    /* FAKECUDA_MIG ("0,1"): devices in MIG mode at start; FAKECUDA_MIG_LAYOUT */
    int mig[FC_MAX_DEV];
    const char *mig_layout;
    int mps;        /* FAKECUDA_MPS=1: this process is an MPS client (FC_PROC_MPS) */
    int accounting; /* FAKECUDA_ACCOUNTING (default 1): NVML accounting mode enabled */
};
const struct fc_knobs *fc_knobs(void);

/* ---- shared state (state.c) ---- */
struct fc_seg {
    uint64_t start, end;
    uint32_t host_pid;
    uint32_t pid;
};

#define FC_PROC_HOSTPID_REAL 1u /* host_pid came from the FAKECUDA_HOST_PID_SOCK oracle */
#define FC_PROC_MIG 2u          /* its CUDA device mig_dev is MIG instance (mig_gi, mig_ci) */
#define FC_PROC_MPS 4u          /* an MPS client (FAKECUDA_MPS=1 in its environment) */
#define FC_PROC_GRAPHICS 8u     /* took memory through a graphics API (fake_graphics_alloc) */

struct fc_proc {
    int32_t pid; /* getpid() of the process, in its own PID namespace; 0: free slot */
    uint32_t host_pid;
    uint64_t starttime; /* /proc/pid/stat field 22: tells a reused pid apart */
    uint64_t ns_ino;    /* inode of its /proc/self/ns/pid (0: unknown) */
    int64_t ns_offset;  /* its FAKECUDA_HOST_PID_OFFSET: (ns_ino, ns_offset) is its namespace */
    uint32_t flags;     /* FC_PROC_* */
    uint32_t reserved;
    uint64_t used[FC_MAX_DEV];
    uint64_t managed;
    uint32_t nctx[FC_MAX_DEV];
    int32_t mig_dev; /* with FC_PROC_MIG: the physical device whose MIG instance it uses */
    uint32_t mig_gi, mig_ci;
    uint32_t reserved2;
    uint32_t acct[FC_MAX_DEV]; /* 1 + index of its accounting record per device (0: none) */
};

/* NVML accounting: one record per process and device, opened when the process first holds
 * a context or memory there (or launches), closed when it exits or is found dead; a ring
 * of FC_ACCT per device whose oldest closed records are overwritten. */
struct fc_acct {
    uint32_t host_pid; /* 0: an empty record */
    int32_t pid;       /* in its own PID namespace */
    uint64_t ns_ino;   /* its namespace, as fc_proc's */
    int64_t ns_offset;
    uint32_t running;
    uint32_t reserved;
    uint64_t start_ns; /* CLOCK_MONOTONIC: its first use of the device */
    uint64_t start_us; /* the same as CLOCK_REALTIME microseconds */
    uint64_t end_ns;   /* CLOCK_MONOTONIC: when it was seen to end (0 while running) */
    uint64_t busy_ns;  /* device time of its kernels there */
    uint64_t max_used; /* the most device memory it held there */
};

/* One completed NVML sampling window: [index * sample_ns, (index + 1) * sample_ns) of
 * CLOCK_MONOTONIC, from the window's accumulator once the window is over. */
struct fc_sample {
    uint64_t index;
    uint64_t end_us;   /* the window's end as CLOCK_REALTIME microseconds (0: empty slot) */
    uint32_t gpu_util; /* round(100 * busy / window), all processes */
    uint32_t n;        /* processes that ran kernels in it */
    struct {
        uint32_t host_pid;
        uint32_t sm_util; /* round(100 * busy_ns / window_ns) */
        uint64_t busy_ns; /* exact, for tests (fake_window_busy_ns); NVML sees sm_util */
    } pid[FC_SAMPLE_PIDS];
};

/* Device time per process in one sampling window, added to as kernels are enqueued
 * (a kernel's share of each window it overlaps), so a window is exact however many
 * kernels ran in it. */
struct fc_window_acc {
    uint64_t index; /* the window; a slot is reused for index + FC_SAMPLES */
    uint64_t total;
    uint32_t n;
    uint32_t reserved;
    struct {
        uint32_t host_pid;
        uint32_t reserved;
        uint64_t ns;
    } pid[FC_SAMPLE_PIDS];
};

/* MIG (mig.c): the GPU and compute instances of a device, shared by every process. */
struct fc_ci {
    uint32_t live;
    uint32_t profile; /* compute instance profile id */
    uint32_t start, size; /* compute slices within the GPU instance */
};

struct fc_gi {
    uint32_t live;
    uint32_t profile; /* GPU instance profile id (the real A100's: 19, 15, 14, 9, 5, 0) */
    uint32_t start, size; /* memory slices */
    uint64_t used;        /* device memory CUDA processes hold in it */
    struct fc_ci ci[FC_MIG_CI];
};

struct fc_mig {
    uint32_t mode;  /* NVML_DEVICE_MIG_ENABLE / DISABLE (current = pending) */
    uint32_t gen;   /* board generation (FAKECUDA_EVENTS `replace`) the tables belong to */
    uint32_t epoch; /* bus attachments (`remove`, `replace`) the instances belong to */
    uint32_t reserved;
    struct fc_gi gi[FC_MIG_GI]; /* by GPU instance id */
};

struct fc_dev {
    uint64_t total;
    uint64_t used;
    uint64_t busy_until;
    uint64_t seg_next; /* segments ever written; slot = n % FC_SEGS */
    uint64_t win_next; /* the next sampling window to complete; slot = index % FC_SAMPLES */
    struct fc_mig mig;
    struct fc_sample samples[FC_SAMPLES];
    struct fc_window_acc acc[FC_SAMPLES];
    uint64_t acct_next; /* accounting records ever opened; slot = n % FC_ACCT */
    struct fc_acct acct[FC_ACCT];
    struct fc_seg seg[FC_SEGS];
};

/* Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle): one export of a linear
 * allocation, shared by every process.  The physical memory lives while the exporter's
 * allocation does or any opener holds it open; it is charged to one process's slot
 * (owner): the exporter while it lives, then an opener. */
struct fc_ipc {
    uint64_t id;      /* 0: a free entry; else unique over the state's life (stale handles) */
    uint64_t size;
    int32_t dev;      /* physical device */
    int32_t exporter; /* the exporting process's slot; -1 once it exited */
    int32_t owner;    /* the slot the memory is charged to */
    uint32_t freed;   /* the exporter freed its allocation (or exited): openers keep it */
    int32_t opener[FC_IPC_OPENERS]; /* slots holding it open (-1: none) */
};

#define FC_MAGIC 0x46414b43u /* "FAKC" */
#define FC_VERSION 9u

struct fc_shared {
    uint32_t magic, version, ndev, reserved;
    uint64_t last_reap_ns;
    uint64_t sample_ns; /* the sampling window of the process that made the state */
    uint32_t lock_word;     /* the state lock: 0, or its holder's lock id (| FC_LOCK_WAITERS) */
    uint32_t reserved3;
    uint64_t lock_next_id;  /* lock ids handed out (one per process, again after fork) */
    uint64_t reserved2[6];
    struct fc_proc procs[FC_MAX_PROCS];
    uint64_t ipc_next_id;
    struct fc_ipc ipc[FC_IPC];
    struct fc_dev dev[];
};

/* ---- who this process is (state.c): computed once per process (again after fork) ---- */
struct fc_ident {
    int32_t pid;       /* getpid() */
    uint32_t host_pid; /* from FAKECUDA_HOST_PID_SOCK, else pid + FAKECUDA_HOST_PID_OFFSET */
    uint64_t ns_ino;   /* inode of /proc/self/ns/pid */
    int64_t offset;    /* FAKECUDA_HOST_PID_OFFSET */
    int host_real;     /* host_pid came from the oracle */
    int is_host;       /* host_pid == pid and offset 0: the host PID namespace */
};
const struct fc_ident *fc_ident(void);

/* Opens (or, in this process, finds) the state; NULL with a message on stderr when the
 * state file cannot be used. */
struct fc_shared *fc_state(void);
void fc_lock(void);
void fc_unlock(void);
int fc_state_fd(void); /* the file of the state, for a second fake library of this process */
void fc_reap_locked(void);
uint64_t fc_now(void);
void fc_sleep_until(uint64_t t_ns);
/* Slot of the calling process (registered on first use); -1 when the table is full. */
int fc_self_slot_locked(void);
void fc_release_self(void);
/* 0 or -1 (out of physical memory). */
int fc_charge(int dev, uint64_t bytes);
int fc_graphics_charge(int dev, uint64_t bytes);
void fc_uncharge(int dev, uint64_t bytes);
void fc_managed(int64_t delta);
void fc_ctx_count(int dev, int delta);
/* Legacy IPC (state.c; README.md "Legacy CUDA IPC").  Export: a new entry for this
 * process's allocation of size bytes on dev (already charged to it): 0 and *index, *id,
 * or -1 (table full).  Open: this process becomes an opener of (index, id): 0 (*dev,
 * *size set), -1 (no such live export: INVALID_HANDLE), -2 (this process exported it:
 * INVALID_CONTEXT), -3 (no room for another opener: TOO_MANY_PEERS).
 * Close: this process stops holding it; the memory goes with the last opener once the
 * exporter freed it.  Exporter free: 1 when openers keep the memory (still charged: do not
 * uncharge; to_opener: charged to an opener from now on, as NVML counts a legacy IPC
 * allocation on a real driver), 0 when the caller gives it back as usual (the entry is
 * gone). */
int fc_ipc_export(int dev, uint64_t size, int *index, uint64_t *id);
int fc_ipc_open(int index, uint64_t id, int *dev, uint64_t *size);
void fc_ipc_close(int index, uint64_t id);
int fc_ipc_exporter_free(int index, uint64_t id, int to_opener);
/* Puts a kernel of dur ns on dev's timeline; returns its end time. */
uint64_t fc_enqueue(int dev, uint64_t dur_ns);
uint64_t fc_busy_locked(int dev, long host_pid, uint64_t t0, uint64_t t1);
uint64_t fc_oldest_locked(int dev);
/* The accounting record of this process (slot) on dev, opened if it has none; under the lock. */
struct fc_acct *fc_acct_locked(int slot, int dev);
/* Completes the sampling windows of dev that ended before now (lazy, from the timeline). */
void fc_sample_locked(int dev, uint64_t now);
uint64_t fc_sample_ns(void);

/* Device memory in use and total as CUDA sees dev (this process's MIG instance when dev is
 * its MIG device's parent); under the lock. */
void fc_meminfo_locked(int dev, uint64_t *used, uint64_t *total);

/* ---- helpers ---- */
/* GPU-fa4ecda0-GGGG-4000-8000-00000000000N: N the physical device, GGGG its board
 * generation (FAKECUDA_EVENTS `replace`; 0 at start) */
void fc_uuid_bytes(int dev, unsigned char out[16]);
void fc_uuid_bytes_gen(int dev, unsigned gen, unsigned char out[16]);
void fc_uuid_string(int dev, char *buf, size_t len);
void fc_uuid_string_gen(int dev, unsigned gen, char *buf, size_t len);
void fc_uuid_format(const unsigned char b[16], const char *prefix, char *buf, size_t len);
void fc_device_name(int dev, char *buf, size_t len);
/* CUDA_VISIBLE_DEVICES' MIG entry checked against the MIG tables (by cuInit, under the
 * lock): the list stops before it when the instance does not exist. */
void fc_visible_resolve(const struct fc_shared *s);

/* ---- MIG model (mig.c): an A100-like GPU, 7 compute slices and 8 memory slices ---- */
#define FC_MIG_DISABLE 0u
#define FC_MIG_ENABLE 1u
struct fc_gi_profile {
    unsigned constant;           /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned id;                 /* the real A100's profile id */
    unsigned compute, mem;       /* compute slices, memory slices */
    unsigned count;              /* instanceCount = number of placements */
    unsigned starts[7];          /* placements: memory slices [start, start + mem) */
    unsigned ce, dec, jpeg, ofa; /* engines */
};
extern const struct fc_gi_profile fc_gi_profiles[];
extern const unsigned fc_gi_nprofiles;
const struct fc_gi_profile *fc_gi_profile_by_const(unsigned constant);
const struct fc_gi_profile *fc_gi_profile_by_id(unsigned id);
/* GPU instance id of a placement (the A100's swizzle id): 8 slices 0, 4: 1-2, 2: 3-6, 1: 7-13 */
unsigned fc_gi_id(unsigned start, unsigned size);
/* memorySizeMB of m memory slices: m x (device MiB / 8) x 95 / 100 */
uint64_t fc_mig_mem_mib(int dev, unsigned mem_slices);
/* the GB of a profile name: ceil(m x (device MiB / 8) / 1024) (81920 MiB: 10, 20, 40, 80) */
unsigned fc_mig_name_gb(int dev, unsigned mem_slices);
unsigned fc_mig_sms(unsigned compute_slices); /* slices x (FAKECUDA_SMS / 7) */
/* "1g.10gb" (cslices == gslices) or "1c.3g.40gb" */
void fc_mig_profile_name(int dev, unsigned gslices, unsigned cslices, unsigned mem_slices,
                         char *buf, size_t len);
/* compute slices of a compute instance profile id (0..4: 1, 2, 3, 4, 7), 0 if none */
unsigned fc_ci_slices(unsigned ci_profile);
/* Under the lock.  A GPU instance of profile p at placement start (-1: the lowest free one):
 * its id, or -1 (no free placement / overlap: INSUFFICIENT_RESOURCES) or -2 (start is not a
 * placement of p). */
int fc_mig_create_gi_locked(struct fc_mig *m, const struct fc_gi_profile *p, int start);
/* A compute instance of profile ci_profile in GPU instance g at compute slice start (-1: the
 * lowest free placement), with the lowest free id: its id, -1 no room / overlap, -2 profile
 * not supported by this GPU instance, -3 start is not a placement of the profile. */
int fc_mig_create_ci_locked(struct fc_gi *g, unsigned ci_profile, int start);
/* Compute slices of GPU instance g (from its profile). */
unsigned fc_gi_compute(const struct fc_gi *g);
/* The tables of a board: mode from FAKECUDA_MIG (keep_mode: as it is), no instances. */
void fc_mig_reset_locked(struct fc_mig *m, int dev, uint32_t gen, uint32_t epoch, int keep_mode);
/* FAKECUDA_MIG and FAKECUDA_MIG_LAYOUT applied to a new state (init_region). */
void fc_mig_init_region(struct fc_shared *s);
/* MIG-fa4ecda1-GGGG-40gg-80cc-00000000000N: device N, generation GGGG, GPU instance gg,
 * compute instance cc (hex) */
void fc_mig_uuid_bytes(int dev, unsigned gen, unsigned gi, unsigned ci, unsigned char out[16]);
void fc_mig_uuid_string(int dev, unsigned gen, unsigned gi, unsigned ci, char *buf, size_t len);
/* Parse a full MIG-... / GPU-... UUID (case-insensitive) of the fake's format; 0 when it
 * is one (the device number is not checked against FAKECUDA_DEVICES). */
int fc_mig_uuid_parse(const char *s, size_t len, int *dev, unsigned *gen, unsigned *gi,
                      unsigned *ci);
int fc_gpu_uuid_parse(const char *s, size_t len, int *dev, unsigned *gen);

#endif
