/* probe: the selftests' program inside a container.
 *
 * Reads one operation per stdin line and answers one JSON object per line on stdout
 * (flushed at once), until EOF or "exit N":
 *
 *   id               {"pid","ppid","uid","gid"}
 *   ns               {"pid","mnt"}: the targets of /proc/self/ns/{pid,mnt}
 *   procs            {"pids":[...]}: the numeric entries of /proc
 *   env NAME         {"value": string or null}
 *   read PATH        {"data": the first 4 KiB} or {"errno"}
 *   write PATH       append "x" (creating the file): {"ok":true} or {"errno"}
 *   stat PATH        {"ino","dev","mode","rdev_major","rdev_minor"} or {"errno"}
 *   connect PATH     connect to a unix stream socket, send "ping\n", answer its first
 *                    line: {"reply"} or {"errno","step"}
 *   bind PATH        bind a new unix socket at PATH: {"ok":true} or {"errno"}
 *   exit N           exit with status N (no answer)
 *
 * Unknown operations answer {"error":"unknown op"}. errno values are numbers; the
 * Python side compares them with the errno module.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

static void put_json_string(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c >= 0x7f) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void fail(int err) { printf("{\"errno\":%d}\n", err); }

static void op_ns(void)
{
    char pid[128] = "", mnt[128] = "";
    ssize_t a = readlink("/proc/self/ns/pid", pid, sizeof pid - 1);
    ssize_t b = readlink("/proc/self/ns/mnt", mnt, sizeof mnt - 1);
    if (a < 0 || b < 0) { fail(errno); return; }
    pid[a] = 0;
    mnt[b] = 0;
    printf("{\"pid\":\"%s\",\"mnt\":\"%s\"}\n", pid, mnt);
}

static void op_procs(void)
{
    DIR *d = opendir("/proc");
    if (!d) { fail(errno); return; }
    printf("{\"pids\":[");
    int first = 1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long v = strtol(e->d_name, &end, 10);
        if (*end || v <= 0) continue;
        printf("%s%ld", first ? "" : ",", v);
        first = 0;
    }
    closedir(d);
    printf("]}\n");
}

static void op_read(const char *path)
{
    char buf[4096];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { fail(errno); return; }
    ssize_t n = read(fd, buf, sizeof buf);
    int err = errno;
    close(fd);
    if (n < 0) { fail(err); return; }
    printf("{\"data\":");
    put_json_string(buf, (size_t)n);
    printf("}\n");
}

static void op_write(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) { fail(errno); return; }
    ssize_t n = write(fd, "x", 1);
    int err = errno;
    close(fd);
    if (n != 1) { fail(err); return; }
    printf("{\"ok\":true}\n");
}

static void op_stat(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) { fail(errno); return; }
    printf("{\"ino\":%llu,\"dev\":%llu,\"mode\":%u,\"rdev_major\":%u,\"rdev_minor\":%u}\n",
           (unsigned long long)st.st_ino, (unsigned long long)st.st_dev, (unsigned)st.st_mode,
           major(st.st_rdev), minor(st.st_rdev));
}

static int unix_addr(const char *path, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a->sun_path) return -1;
    strcpy(a->sun_path, path);
    return 0;
}

static void op_connect(const char *path)
{
    struct sockaddr_un a;
    if (unix_addr(path, &a) < 0) { fail(ENAMETOOLONG); return; }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { fail(errno); return; }
    const char *step = "connect";
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) goto bad;
    step = "send";
    if (write(fd, "ping\n", 5) != 5) goto bad;
    step = "recv";
    char buf[256];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
        if (n < 0) goto bad;
        if (n == 0) break;
        got += (size_t)n;
        if (memchr(buf, '\n', got)) break;
    }
    close(fd);
    char *nl = memchr(buf, '\n', got);
    printf("{\"reply\":");
    put_json_string(buf, nl ? (size_t)(nl - buf) : got);
    printf("}\n");
    return;
bad:;
    int err = errno;
    close(fd);
    printf("{\"errno\":%d,\"step\":\"%s\"}\n", err, step);
}

static void op_bind(const char *path)
{
    struct sockaddr_un a;
    if (unix_addr(path, &a) < 0) { fail(ENAMETOOLONG); return; }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { fail(errno); return; }
    int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    int err = errno;
    close(fd);
    if (rc < 0) fail(err);
    else printf("{\"ok\":true}\n");
}

int main(void)
{
    char line[4096];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *arg = strchr(line, ' ');
        if (arg) *arg++ = 0;
        else arg = line + strlen(line);
        if (!strcmp(line, "id"))
            printf("{\"pid\":%d,\"ppid\":%d,\"uid\":%u,\"gid\":%u}\n", (int)getpid(),
                   (int)getppid(), (unsigned)getuid(), (unsigned)getgid());
        else if (!strcmp(line, "ns")) op_ns();
        else if (!strcmp(line, "procs")) op_procs();
        else if (!strcmp(line, "env")) {
            const char *v = getenv(arg);
            printf("{\"value\":");
            if (v) put_json_string(v, strlen(v));
            else printf("null");
            printf("}\n");
        }
        else if (!strcmp(line, "read")) op_read(arg);
        else if (!strcmp(line, "write")) op_write(arg);
        else if (!strcmp(line, "stat")) op_stat(arg);
        else if (!strcmp(line, "connect")) op_connect(arg);
        else if (!strcmp(line, "bind")) op_bind(arg);
        else if (!strcmp(line, "exit")) return atoi(arg);
        else printf("{\"error\":\"unknown op\"}\n");
    }
    return 0;
}
