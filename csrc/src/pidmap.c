/* This process's host PID (the PID NVML reports), found once and cached:
 *
 *  1. The slot's host_pid, when an earlier attempt (or another writer) filled it in.
 *  2. Registration with the plugin (register.c): the kernel tells the plugin.
 *  3. /proc/self/status NSpid with more than one entry: our /proc shows an outer
 *     namespace (hostPID pods): its first entry is the host PID.
 *  4. We are in the initial PID namespace: our PID is the host PID.
 * Until one of these answers, the SM controller cannot calibrate and context memory
 * cannot be measured; they ask again (at most every 200 ms) and say so once. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

static ssize_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = 0;
    return n;
}

/* NSpid entries of a status file; returns the count (up to max) */
static int nspids(const char *status_path, int *out, int max)
{
    char buf[4096];
    if (slurp(status_path, buf, sizeof buf) < 0) return 0;
    char *p = !strncmp(buf, "NSpid:", 6) ? buf - 1 : strstr(buf, "\nNSpid:");
    if (!p) return 0;
    p += 7;
    int n = 0;
    while (n < max) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        out[n++] = (int)v;
        p = end;
        if (*p == '\n' || !*p) break;
    }
    return n;
}

int vg_pidmap_host_pid(int pid)
{
    int ns[8];
    int n = nspids("/proc/self/status", ns, 8);
    if (n > 1 && ns[n - 1] == pid) return ns[0];
    /* the initial PID namespace (a fixed inode number in every kernel): our PID is
     * the host PID (standalone use outside containers) */
    char link[64];
    ssize_t l = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (l > 0) {
        link[l] = 0;
        if (!strcmp(link, "pid:[4026531836]")) return pid;
    }
    return 0;
}

static int host_pid_cache;
static int host_pid_of; /* the getpid() it belongs to (a forked child starts over) */
static uint64_t host_pid_next_try;
static int host_pid_busy; /* a thread is asking (the registration's I/O: up to 2 s) */
VG_MUTEX(host_pid_mu);

/* The host PID, or 0 while it is not known. One thread at a time asks for it, and
 * without a lock held across the asking (a round trip to the plugin, bounded by 2 s):
 * the others go on with 0 rather than wait on the plugin. */
int vg_host_pid(void)
{
    int me = getpid();
    int hp = __atomic_load_n(&host_pid_cache, __ATOMIC_ACQUIRE);
    if (hp > 0 && __atomic_load_n(&host_pid_of, __ATOMIC_ACQUIRE) == me) return hp;
    uint64_t now = vg_now_ns();
    if (__atomic_load_n(&host_pid_of, __ATOMIC_ACQUIRE) == me &&
        now < __atomic_load_n(&host_pid_next_try, __ATOMIC_ACQUIRE))
        return 0;
    vg_lock(&host_pid_mu);
    if (host_pid_of != me) { /* first call, or a forked child */
        host_pid_cache = 0;
        host_pid_next_try = 0;
        host_pid_busy = 0;
        __atomic_store_n(&host_pid_of, me, __ATOMIC_RELEASE);
    }
    int ask = host_pid_cache <= 0 && now >= host_pid_next_try && !host_pid_busy;
    if (ask) {
        host_pid_next_try = now + 200000000ull;
        host_pid_busy = 1;
    }
    vg_unlock(&host_pid_mu);
    if (!ask) return __atomic_load_n(&host_pid_cache, __ATOMIC_ACQUIRE);
    hp = vg_state_own_host_pid();
    if (hp <= 0) hp = vg_register(vg_state_own_slot(), vg_state_own_start());
    if (hp <= 0) hp = vg_pidmap_host_pid(me);
    vg_lock(&host_pid_mu);
    if (hp > 0 && host_pid_of == me) {
        vg_state_set_host_pid(hp);
        __atomic_store_n(&host_pid_cache, hp, __ATOMIC_RELEASE);
        VG_INFO("host pid %d", hp);
    }
    host_pid_busy = 0;
    vg_unlock(&host_pid_mu);
    return __atomic_load_n(&host_pid_cache, __ATOMIC_ACQUIRE);
}
