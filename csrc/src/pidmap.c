/* Container PID -> host PID (the PID NVML reports).
 *
 *  1. The slot's host_pid, when the plugin (or an earlier attempt) filled it in
 *     (controller.c asks the slot first).
 *  2. A host /proc mounted in the container (config key host_proc): the process
 *     whose NSpid ends with our PID and whose start time (field 22 of stat, ticks
 *     since boot: the same in every PID namespace) equals ours. With two or more
 *     candidates (rare: same PID and same start tick in two containers) the one
 *     whose cgroup file ends like ours (cgroup v1 and v2 lines, ignoring the
 *     prefix a cgroup namespace hides) wins; if that is still ambiguous, none.
 *  3. /proc/self/status NSpid with more than one entry: our /proc shows an outer
 *     namespace (hostPID pods): its first entry is the host PID.
 *  4. We are in the initial PID namespace: our PID is the host PID.
 * Without any of these the SM controller cannot be fed and the shim says so. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
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

static unsigned long long start_time(const char *stat_path)
{
    char buf[1024];
    if (slurp(stat_path, buf, sizeof buf) < 0) return 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

/* every line of ours ("id:controllers:path") has a host line with the same id and
 * controllers whose path ends with ours */
static int cgroup_matches(const char *host_cg, const char *own_cg)
{
    char own[4096];
    snprintf(own, sizeof own, "%s", own_cg);
    for (char *save = NULL, *line = strtok_r(own, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *c2 = strchr(line, ':');
        char *c3 = c2 ? strchr(c2 + 1, ':') : NULL;
        if (!c3) continue;
        size_t prefix = (size_t)(c3 - line) + 1;
        const char *path = c3 + 1;
        int found = 0;
        for (const char *h = host_cg; h && *h;) {
            const char *eol = strchr(h, '\n');
            size_t len = eol ? (size_t)(eol - h) : strlen(h);
            if (len >= prefix && !strncmp(h, line, prefix)) {
                size_t plen = strlen(path), hlen = len - prefix;
                if (!strcmp(path, "/") || (hlen >= plen && !strncmp(h + len - plen, path, plen)))
                    found = 1;
            }
            h = eol ? eol + 1 : NULL;
        }
        if (!found) return 0;
    }
    return 1;
}

static int scan_host_proc(const char *host_proc, int pid);

int vg_pidmap_host_pid(const char *host_proc, int pid)
{
    int ns[8];
    /* configured host /proc: authoritative (until it shows us, no guessing) */
    if (host_proc && host_proc[0]) return scan_host_proc(host_proc, pid);
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

static int scan_host_proc(const char *host_proc, int pid)
{
    int ns[8];
    char path[768];
    unsigned long long mine = start_time("/proc/self/stat");
    char own_cg[4096];
    if (slurp("/proc/self/cgroup", own_cg, sizeof own_cg) < 0) own_cg[0] = 0;
    DIR *d = opendir(host_proc);
    if (!d) return 0;
    int found = 0, candidates = 0, cg_found = 0, cg_candidates = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long hp = strtol(e->d_name, &end, 10);
        if (*end || hp <= 0) continue;
        snprintf(path, sizeof path, "%s/%ld/status", host_proc, hp);
        int m = nspids(path, ns, 8);
        if (m < 2 || ns[m - 1] != pid) continue;
        snprintf(path, sizeof path, "%s/%ld/stat", host_proc, hp);
        if (mine && start_time(path) != mine) continue;
        candidates++;
        found = (int)hp;
        char host_cg[4096];
        snprintf(path, sizeof path, "%s/%ld/cgroup", host_proc, hp);
        if (own_cg[0] && slurp(path, host_cg, sizeof host_cg) >= 0 &&
            cgroup_matches(host_cg, own_cg)) {
            cg_candidates++;
            cg_found = (int)hp;
        }
    }
    closedir(d);
    if (candidates == 1) return found;
    if (cg_candidates == 1) return cg_found;
    return 0;
}
