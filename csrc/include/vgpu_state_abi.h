/* The usage-state file: shared by every process of one container (mapped
 * MAP_SHARED from <state_dir>/usage.v1) and read by the plugin's metrics through
 * the Python view vgpud/node/usage_state.py. Version 1; a new layout gets a new version number
 * AND a new file name, so an old shim and a new one never share a file.
 *
 * Invariants (all byte counts are bytes of device memory):
 *   header.used[d] == sum over slots s with s.pid != 0 of s.used[d]
 *   s.context[d] <= s.used[d]      (context memory is part of a process's usage)
 * Both are maintained under header.lock (a robust, process-shared mutex: the kernel
 * marks it owner-dead when its holder dies, the next locker repairs header.used from
 * the slots). Fields are naturally aligned 64-bit words written atomically, so a
 * lock-free reader (the plugin) never sees a torn value; it may see a slot and the
 * header one update apart, and uses header.generation to retry. */
#ifndef VGPU_STATE_ABI_H
#define VGPU_STATE_ABI_H

#include <stdint.h>
#include <stddef.h>

#define VG_STATE_MAGIC 0x3176646170677601ULL /* "\x01vgpgadv1" little-endian, arbitrary */
#define VG_STATE_VERSION 1u
#define VG_STATE_FILE "usage.v1"
#define VG_MAX_DEVICES 16
#define VG_MAX_SLOTS 512
#define VG_HEADER_SIZE 4096
#define VG_SLOT_SIZE 512
#define VG_LOCK_BYTES 64

typedef struct vg_state_header {
    uint64_t magic;                      /*    0 VG_STATE_MAGIC, written last at creation */
    uint32_t version;                    /*    8 VG_STATE_VERSION */
    uint32_t header_size;                /*   12 VG_HEADER_SIZE */
    uint32_t slot_size;                  /*   16 VG_SLOT_SIZE */
    uint32_t max_slots;                  /*   20 VG_MAX_SLOTS */
    uint32_t max_devices;                /*   24 VG_MAX_DEVICES */
    uint32_t device_count;               /*   28 devices named by the config */
    uint64_t generation;                 /*   32 +1 on every change of used/slots */
    uint64_t limit[VG_MAX_DEVICES];      /*   40 memory limit in bytes, 0 = unlimited */
    uint32_t core_limit[VG_MAX_DEVICES]; /*  168 percent, 0 = unlimited */
    uint64_t used[VG_MAX_DEVICES];       /*  232 device bytes charged, all processes */
    uint64_t spilled[VG_MAX_DEVICES];    /*  360 managed bytes spilled (oversubscribe) */
    int64_t sm_tokens[VG_MAX_DEVICES];   /*  488 SM bucket: GPU-ns credit (may be < 0) */
    uint64_t sm_refill[VG_MAX_DEVICES];  /*  616 SM bucket: CLOCK_MONOTONIC ns of last refill */
    uint32_t sm_rate[VG_MAX_DEVICES];    /*  744 effective SM rate, permille of the device */
    uint32_t reserved0;                  /*  808 */
    uint32_t reserved1;                  /*  812 */
    unsigned char lock[VG_LOCK_BYTES];   /*  816 pthread_mutex_t, robust + pshared */
    unsigned char pad[VG_HEADER_SIZE - 880];
} vg_state_header;

typedef struct vg_state_slot {
    int32_t pid;                         /*   0 pid in the container's namespace; 0 = free */
    int32_t host_pid;                    /*   4 pid as NVML reports it; 0 = unknown */
    uint64_t start_time;                 /*   8 /proc/<pid>/stat starttime, tells pid reuse */
    uint64_t last_seen;                  /*  16 CLOCK_REALTIME ns of the last update */
    uint64_t used[VG_MAX_DEVICES];       /*  24 device bytes charged to this process */
    uint64_t context[VG_MAX_DEVICES];    /* 152 of which context memory */
    uint64_t spilled[VG_MAX_DEVICES];    /* 280 managed bytes spilled */
    uint32_t flags;                      /* 408 VG_SLOT_LOCKED: alive while its lock byte is held */
    uint32_t adopted[VG_MAX_DEVICES];    /* 412 of used, 64 KiB units another process of the
                                          * container charged here: memory NVML counts for this
                                          * process that no measurement of its own had charged
                                          * (an IPC allocation its exporter freed); this
                                          * process's next measurement takes it as its own */
    unsigned char pad[VG_SLOT_SIZE - 476];
} vg_state_slot;

/* A slot's process holds an OFD write lock on byte VG_SLOT_LOCK_BASE + its index of the
 * file for as long as it lives (the kernel drops it when the process is gone): liveness
 * that holds across PID namespaces, where two containers sharing one state (a DRA claim's)
 * each run as PID 1. Slots without the flag (an older shim) are judged by PID. */
#define VG_SLOT_LOCKED 1u
#define VG_SLOT_LOCK_BASE 1

typedef struct vg_state_file {
    vg_state_header header;
    vg_state_slot slots[VG_MAX_SLOTS];
} vg_state_file;

_Static_assert(sizeof(vg_state_header) == VG_HEADER_SIZE, "header size");
_Static_assert(sizeof(vg_state_slot) == VG_SLOT_SIZE, "slot size");
_Static_assert(offsetof(vg_state_header, limit) == 40, "limit offset");
_Static_assert(offsetof(vg_state_header, core_limit) == 168, "core_limit offset");
_Static_assert(offsetof(vg_state_header, used) == 232, "used offset");
_Static_assert(offsetof(vg_state_header, spilled) == 360, "spilled offset");
_Static_assert(offsetof(vg_state_header, sm_tokens) == 488, "sm_tokens offset");
_Static_assert(offsetof(vg_state_header, sm_refill) == 616, "sm_refill offset");
_Static_assert(offsetof(vg_state_header, sm_rate) == 744, "sm_rate offset");
_Static_assert(offsetof(vg_state_header, lock) == 816, "lock offset");
_Static_assert(offsetof(vg_state_slot, used) == 24, "slot used offset");
_Static_assert(offsetof(vg_state_slot, context) == 152, "slot context offset");
_Static_assert(offsetof(vg_state_slot, spilled) == 280, "slot spilled offset");
_Static_assert(sizeof(vg_state_file) == VG_HEADER_SIZE + VG_MAX_SLOTS * VG_SLOT_SIZE, "file size");

#endif
