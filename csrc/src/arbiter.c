/* Following the node's arbitration record (vgpu_arbiter_abi.h).
 *
 * A container cannot see whether the others on its GPU are busy or what their
 * priorities are; the plugin can, and publishes per GPU the highest priority active
 * there. This file maps each configured GPU's record read-only and answers one
 * question for the SM controller: must this container hold its rate at the floor?
 * The record is opened lazily (at most once a second until it exists: the plugin may
 * start after the workload) and never written. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"
#include "vgpu_arbiter_abi.h"

#define STALE_PERIODS 3
#define MIN_STALE_NS 1000000000ull  /* a record is never trusted beyond 1 s unrefreshed... */
#define RETRY_NS 1000000000ull      /* ...and a missing one is looked for once a second */

static const volatile vg_arbiter_record *rec[VG_MAX_DEVICES];
static uint64_t next_try[VG_MAX_DEVICES];
VG_MUTEX(mu);

int vg_arbiter_present(int d)
{
    return d >= 0 && d < VG_MAX_DEVICES && vg_cfg.arbiter_dir[0] && vg_cfg.dev[d].uuid[0];
}

static const volatile vg_arbiter_record *record(int d)
{
    const volatile vg_arbiter_record *r = __atomic_load_n(&rec[d], __ATOMIC_ACQUIRE);
    if (r || !vg_arbiter_present(d)) return r;
    uint64_t now = vg_now_ns();
    vg_lock(&mu);
    if (!rec[d] && now >= next_try[d]) {
        next_try[d] = now + RETRY_NS;
        char path[700];
        snprintf(path, sizeof path, "%s/%s", vg_cfg.arbiter_dir, vg_cfg.dev[d].uuid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        /* a file shorter than the record maps, but reading past its end faults */
        if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_size < VG_ARB_SIZE)) {
            close(fd);
            fd = -1;
        }
        if (fd >= 0) {
            void *p = mmap(NULL, VG_ARB_SIZE, PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (p != MAP_FAILED) {
                const volatile vg_arbiter_record *m = p;
                if (m->magic == VG_ARB_MAGIC && m->version == VG_ARB_VERSION &&
                    m->size == VG_ARB_SIZE) {
                    __atomic_store_n(&rec[d], m, __ATOMIC_RELEASE);
                    VG_DEBUG("arbiter: following %s", path);
                } else {
                    munmap(p, VG_ARB_SIZE);
                    VG_WARN("arbiter: %s is not a version %u record; ignored", path,
                            VG_ARB_VERSION);
                }
            }
        }
    }
    vg_unlock(&mu);
    return rec[d];
}

int vg_arbiter_throttle(int d, uint32_t *floor_permille)
{
    if (d < 0 || d >= VG_MAX_DEVICES) return 0;
    const volatile vg_arbiter_record *r = record(d);
    if (!r) return 0;
    for (int tries = 0; tries < 4; tries++) {
        uint64_t s0 = __atomic_load_n(&r->seq, __ATOMIC_ACQUIRE);
        if (s0 & 1) continue;
        uint64_t published = r->published_ns;
        uint32_t period = r->period_ms, active = r->active, floor = r->floor_permille;
        int32_t top = r->top_priority;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&r->seq, __ATOMIC_RELAXED) != s0) continue;
        uint64_t stale = (uint64_t)period * 1000000ull * STALE_PERIODS;
        if (stale < MIN_STALE_NS) stale = MIN_STALE_NS;
        uint64_t now = vg_realtime_ns();
        if (now > published + stale) return 0; /* the plugin stopped publishing */
        if (!active || top <= vg_cfg.priority) return 0;
        *floor_permille = floor > 1000 ? 1000 : floor;
        return 1;
    }
    return 0; /* the plugin is mid-write every time we looked: decide next tick */
}
