/* Registration with the plugin: how a process in a container learns its host PID.
 *
 * NVML names processes by host PID; inside a container's PID namespace nothing tells
 * us ours. The plugin (in the host PID namespace) serves a unix socket in each
 * allocation's read-only directory (config key "register", /etc/vgpud/register.sock
 * in the container). We connect and say who we think we are; the plugin believes none
 * of it: the kernel tells it our host PID (SO_PEERCRED), it checks that PID's cgroup
 * belongs to the allocation's pod, and answers the PID. Nothing of the host's /proc
 * is mounted into the container.
 *
 *   shim   -> plugin: "vgpud-register 1 pid=<pid> start=<ticks> slot=<n> ignored=<names>\n"
 *   plugin -> shim:   "ok <host pid>\n"  or  "refused <why>\n"
 *
 * One round trip, bounded by 2 s timeouts; any failure means "try again later" (the
 * caller retries, pidmap.c), so a plugin restart costs nothing but a delay. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"

static int refused_logged;

int vg_register(int slot, uint64_t start_time)
{
    const char *path = vg_cfg.register_path;
    if (!path[0]) return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        VG_ERROR("registration socket path too long: %s", path);
        return -1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int host = 0;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        VG_DEBUG("registration: connect %s: %s", path, strerror(errno));
        goto out;
    }
    char msg[512];
    int n = snprintf(msg, sizeof msg, "vgpud-register 1 pid=%d start=%llu slot=%d ignored=%s\n",
                     (int)getpid(), (unsigned long long)start_time, slot,
                     vg_cfg.env_ignored[0] ? vg_cfg.env_ignored : "-");
    if (n < 0 || (size_t)n >= sizeof msg || write(fd, msg, (size_t)n) != n) goto out;
    char reply[160];
    size_t got = 0;
    while (got < sizeof reply - 1) {
        ssize_t r = read(fd, reply + got, sizeof reply - 1 - got);
        if (r <= 0) break;
        got += (size_t)r;
        if (memchr(reply, '\n', got)) break;
    }
    reply[got] = 0;
    char *nl = strchr(reply, '\n');
    if (!nl) goto out;
    *nl = 0;
    if (!strncmp(reply, "ok ", 3)) {
        char *end;
        long v = strtol(reply + 3, &end, 10);
        if (*end == 0 && v > 0 && v < (1L << 30)) host = (int)v;
    } else if (!strncmp(reply, "refused", 7) && !__atomic_exchange_n(&refused_logged, 1,
                                                                      __ATOMIC_ACQ_REL)) {
        VG_ERROR("the plugin refused this process's registration: %s", reply + 7);
    }
out:
    close(fd);
    return host;
}
