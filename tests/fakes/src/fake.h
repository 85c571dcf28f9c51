/* Internals shared by the files of the fake driver and the fake NVML. */
#ifndef FAKE_FAKE_H
#define FAKE_FAKE_H

#include <stdint.h>
#include <sys/types.h>

#define FC_API __attribute__((visibility("default")))

#define FC_MAX_DEV 16
#define FC_MAX_PROCS 512
#define FC_SEGS 65536 /* kernel-timeline segments kept per device */
#define FC_MIB (1024ull * 1024ull)

/* ---- knobs (knobs.c) ---- */
struct fc_knobs {
    int ndev;
    uint64_t total[FC_MAX_DEV]; /* bytes */
    uint64_t ctx_bytes;
    int sms;
    uint64_t ns_per_block;
    uint64_t max_queue_ns;
    long host_pid_offset;
    int driver_version;
    const char *state_path; /* NULL: process-local */
    const char *events_path;
};
const struct fc_knobs *fc_knobs(void);

/* ---- shared state (state.c) ---- */
struct fc_seg {
    uint64_t start, end;
    uint32_t host_pid;
    uint32_t pid;
};

struct fc_proc {
    int32_t pid; /* 0: free slot */
    uint32_t host_pid;
    uint64_t starttime; /* /proc/pid/stat field 22: tells a reused pid apart */
    uint64_t used[FC_MAX_DEV];
    uint64_t managed;
    uint32_t nctx[FC_MAX_DEV];
};

struct fc_dev {
    uint64_t total;
    uint64_t used;
    uint64_t busy_until;
    uint64_t seg_next; /* segments ever written; slot = n % FC_SEGS */
    struct fc_seg seg[FC_SEGS];
};

#define FC_MAGIC 0x46414b43u /* "FAKC" */
#define FC_VERSION 1u

struct fc_shared {
    uint32_t magic, version, ndev, reserved;
    uint64_t last_reap_ns;
    uint64_t lock_storage[8]; /* a robust, process-shared pthread mutex */
    struct fc_proc procs[FC_MAX_PROCS];
    struct fc_dev dev[];
};

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
struct fc_pid_busy {
    uint32_t host_pid;
    uint64_t ns;
};
int fc_busy_by_pid_locked(int dev, uint64_t t0, uint64_t t1, struct fc_pid_busy *out, int max);
uint64_t fc_oldest_locked(int dev);

/* ---- helpers ---- */
void fc_uuid_bytes(int dev, unsigned char out[16]);
void fc_uuid_string(int dev, char *buf, size_t len);
void fc_device_name(int dev, char *buf, size_t len);

#endif
