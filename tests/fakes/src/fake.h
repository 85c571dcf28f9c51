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

/* ---- knobs (knobs.c) ---- */
struct fc_knobs {
    int ndev;
    uint64_t total[FC_MAX_DEV]; /* bytes */
    uint64_t ctx_bytes;
    int sms;
    uint64_t ns_per_block; /* a kernel's work per block per wave (functions not named fake_ns_N) */
    uint64_t launch_ns;    /* fixed device-side cost of every kernel */
    uint64_t max_queue_ns;
    uint64_t sample_ns;    /* NVML utilisation sampling window */
    long host_pid_offset;
    int driver_version;
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
};
const struct fc_knobs *fc_knobs(void);

/* ---- shared state (state.c) ---- */
struct fc_seg {
    uint64_t start, end;
    uint32_t host_pid;
    uint32_t pid;
};

#define FC_PROC_HOSTPID_REAL 1u /* host_pid came from the FAKECUDA_HOST_PID_SOCK oracle */

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

struct fc_dev {
    uint64_t total;
    uint64_t used;
    uint64_t busy_until;
    uint64_t seg_next; /* segments ever written; slot = n % FC_SEGS */
    uint64_t win_next; /* the next sampling window to complete; slot = index % FC_SAMPLES */
    struct fc_sample samples[FC_SAMPLES];
    struct fc_window_acc acc[FC_SAMPLES];
    struct fc_seg seg[FC_SEGS];
};

#define FC_MAGIC 0x46414b43u /* "FAKC" */
#define FC_VERSION 4u

struct fc_shared {
    uint32_t magic, version, ndev, reserved;
    uint64_t last_reap_ns;
    uint64_t sample_ns; /* the sampling window of the process that made the state */
    uint64_t lock_storage[8]; /* a robust, process-shared pthread mutex */
    struct fc_proc procs[FC_MAX_PROCS];
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
void fc_reap_locked(void);
uint64_t fc_now(void);
void fc_sleep_until(uint64_t t_ns);
/* Slot of the calling process (registered on first use); -1 when the table is full. */
int fc_self_slot_locked(void);
void fc_release_self(void);
/* 0 or -1 (out of physical memory). */
int fc_charge(int dev, uint64_t bytes);
void fc_uncharge(int dev, uint64_t bytes);
void fc_managed(int64_t delta);
void fc_ctx_count(int dev, int delta);
/* Puts a kernel of dur ns on dev's timeline; returns its end time. */
uint64_t fc_enqueue(int dev, uint64_t dur_ns);
uint64_t fc_busy_locked(int dev, long host_pid, uint64_t t0, uint64_t t1);
uint64_t fc_oldest_locked(int dev);
/* Completes the sampling windows of dev that ended before now (lazy, from the timeline). */
void fc_sample_locked(int dev, uint64_t now);
uint64_t fc_sample_ns(void);

/* ---- helpers ---- */
void fc_uuid_bytes(int dev, unsigned char out[16]);
void fc_uuid_string(int dev, char *buf, size_t len);
void fc_device_name(int dev, char *buf, size_t len);

#endif
