/* The shim config (DESIGN.md "Shim config file"): plain key=value lines written by
 * the plugin, read once.
 *
 * Where the limits come from:
 *   - VG_MOUNT_DIR (/etc/vgpud) is a directory: Kubernetes mode. The plugin mounted it
 *     read-only; its "config" is the only source. The environment is never read for
 *     limits (VGPUD_CONFIG included), so env -i, an ssh session or a changed env can't
 *     lift them; the VGPUD_* names found are reported to the plugin at registration.
 *   - otherwise, standalone: the file $VGPUD_CONFIG if that is set, else the VGPUD_*
 *     environment (VGPUD_MEMORY_LIMIT[_<i>], VGPUD_CORE_LIMIT[_<i>], ...).
 *
 * A file that should be there and is not, or that cannot be trusted (unreadable,
 * unknown or missing version, a malformed line, a bad value for a known key, a
 * device index out of range) puts the shim in DENY mode: every device-memory
 * allocation fails with CUDA_ERROR_OUT_OF_MEMORY and the totals read 0. A garbled or
 * missing file must never lift a limit the plugin wrote, and a workload must not be
 * able to choose its limits by breaking or hiding the file. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

vg_config vg_cfg;

int vg_parse_bytes(const char *s, uint64_t *out)
{
    if (!s || !*s) return -1;
    const char *p = s;
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p)) return -1;
    while (isdigit((unsigned char)*p)) {
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
        p++;
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    case 't': case 'T': shift = 40; p++; break;
    default: break;
    }
    if (shift && (*p == 'i' || *p == 'I')) p++;
    if (shift && (*p == 'b' || *p == 'B')) p++;
    if (*p) return -1;
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = v << shift;
    return 0;
}

static int parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v;
    if (vg_parse_bytes(s, &v) != 0) return -1;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p)) return -1; /* no suffixes here */
    if (v > max) return -1;
    *out = v;
    return 0;
}

static int parse_policy(const char *s, int *out)
{
    if (!strcmp(s, "fixed")) *out = VG_POLICY_FIXED;
    else if (!strcmp(s, "balance")) *out = VG_POLICY_BALANCE;
    else if (!strcmp(s, "none")) *out = VG_POLICY_NONE;
    else return -1;
    return 0;
}

static char *trim(char *s)
{
    while (*s && isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

static int fail(vg_config *out, int line, const char *why)
{
    snprintf(out->error, sizeof out->error, "line %d: %s", line, why);
    return -1;
}

static int set_device_key(vg_config *out, int line, const char *key, const char *val)
{
    /* key is "device.<i>.<field>" */
    const char *p = key + 7;
    char *end;
    errno = 0;
    long idx = strtol(p, &end, 10);
    if (end == p || *end != '.' || errno || idx < 0)
        return fail(out, line, "bad device index");
    if (idx >= VG_MAX_DEVICES) return fail(out, line, "device index out of range");
    const char *field = end + 1;
    vg_device_config *d = &out->dev[idx];
    uint64_t v;
    if (!strcmp(field, "uuid")) {
        if (strlen(val) >= sizeof d->uuid) return fail(out, line, "uuid too long");
        strcpy(d->uuid, val);
    } else if (!strcmp(field, "memory_limit")) {
        if (parse_uint(val, UINT64_MAX, &v)) return fail(out, line, "bad memory_limit");
        d->memory_limit = v;
        d->present |= 2;
    } else if (!strcmp(field, "core_limit")) {
        if (parse_uint(val, 100, &v)) return fail(out, line, "bad core_limit (0-100)");
        d->core_limit = v == 100 ? 0 : (uint32_t)v;
    } else if (!strcmp(field, "core_policy")) {
        if (parse_policy(val, &d->core_policy)) return fail(out, line, "bad core_policy");
    } else if (!strcmp(field, "oversubscribe")) {
        if (strcmp(val, "0") && strcmp(val, "1")) return fail(out, line, "bad oversubscribe");
        d->oversubscribe = val[0] == '1';
    } else if (!strcmp(field, "spill_limit")) {
        if (parse_uint(val, UINT64_MAX, &v)) return fail(out, line, "bad spill_limit");
        d->spill_limit = v;
    } else {
        return 0; /* unknown device field: ignored (forward compatible) */
    }
    d->present |= 1;
    if (idx + 1 > out->device_count) out->device_count = (int)idx + 1;
    return 0;
}

int vg_config_parse(const char *text, vg_config *out)
{
    memset(out, 0, sizeof *out);
    out->source = VG_SRC_FILE;
    int line = 0, version = 0;
    const char *p = text;
    char buf[1024];
    while (*p) {
        line++;
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len >= sizeof buf) return fail(out, line, "line too long");
        memcpy(buf, p, len);
        buf[len] = 0;
        p = nl ? nl + 1 : p + len;
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        char *s = trim(buf);
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) return fail(out, line, "expected key=value");
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        if (!*key) return fail(out, line, "empty key");
        for (char *c = val; *c; c++)
            if (!isprint((unsigned char)*c)) return fail(out, line, "unprintable value");
        if (!strcmp(key, "version")) {
            uint64_t v;
            if (parse_uint(val, 1000000, &v)) return fail(out, line, "bad version");
            version = (int)v;
            if (version != 1) return fail(out, line, "unsupported version");
        } else if (!strncmp(key, "device.", 7)) {
            if (set_device_key(out, line, key, val)) return -1;
        } else if (!strcmp(key, "priority")) {
            char *end;
            errno = 0;
            long v = strtol(val, &end, 10);
            if (end == val || *end || errno || v < -1000 || v > 1000)
                return fail(out, line, "bad priority");
            out->priority = (int)v;
        } else if (!strcmp(key, "state_dir")) {
            if (strlen(val) >= sizeof out->state_dir) return fail(out, line, "state_dir too long");
            strcpy(out->state_dir, val);
        } else if (!strcmp(key, "register")) {
            if (strlen(val) >= sizeof out->register_path) return fail(out, line, "register too long");
            strcpy(out->register_path, val);
        } else if (!strcmp(key, "arbiter_dir")) {
            if (strlen(val) >= sizeof out->arbiter_dir) return fail(out, line, "arbiter_dir too long");
            strcpy(out->arbiter_dir, val);
        }
        /* other keys: ignored */
    }
    if (version == 0) return fail(out, line, "no version line");
    for (int i = 0; i < out->device_count; i++)
        if (out->dev[i].present && !(out->dev[i].present & 2)) {
            snprintf(out->error, sizeof out->error, "device %d has no memory_limit", i);
            return -1;
        }
    return 0;
}

static void load_env(vg_config *out)
{
    memset(out, 0, sizeof *out);
    out->source = VG_SRC_ENV;
    char name[64];
    uint64_t all_mem = 0, v;
    int all_core = 0;
    const char *s = getenv("VGPUD_MEMORY_LIMIT");
    if (s && vg_parse_bytes(s, &all_mem)) {
        VG_ERROR("VGPUD_MEMORY_LIMIT=%s is not a byte count; ignored", s);
        all_mem = 0;
    }
    s = getenv("VGPUD_CORE_LIMIT");
    if (s) {
        if (parse_uint(s, 100, &v)) VG_ERROR("VGPUD_CORE_LIMIT=%s is not 0-100; ignored", s);
        else all_core = (int)v;
    }
    for (int i = 0; i < VG_MAX_DEVICES; i++) {
        vg_device_config *d = &out->dev[i];
        d->memory_limit = all_mem;
        d->core_limit = all_core == 100 ? 0 : (uint32_t)all_core;
        snprintf(name, sizeof name, "VGPUD_MEMORY_LIMIT_%d", i);
        if ((s = getenv(name))) {
            if (vg_parse_bytes(s, &v)) VG_ERROR("%s=%s is not a byte count; ignored", name, s);
            else d->memory_limit = v;
        }
        snprintf(name, sizeof name, "VGPUD_CORE_LIMIT_%d", i);
        if ((s = getenv(name))) {
            if (parse_uint(s, 100, &v)) VG_ERROR("%s=%s is not 0-100; ignored", name, s);
            else d->core_limit = v == 100 ? 0 : (uint32_t)v;
        }
        d->present = 3;
    }
    out->device_count = VG_MAX_DEVICES;
    if ((s = getenv("VGPUD_STATE_DIR")) && strlen(s) < sizeof out->state_dir)
        strcpy(out->state_dir, s);
    if ((s = getenv("VGPUD_CORE_POLICY"))) {
        int pol;
        if (parse_policy(s, &pol) == 0)
            for (int i = 0; i < VG_MAX_DEVICES; i++) out->dev[i].core_policy = pol;
    }
}

static void deny(vg_config *out, const char *why)
{
    memset(out, 0, sizeof *out);
    out->source = VG_SRC_FILE;
    out->deny = 1;
    snprintf(out->error, sizeof out->error, "%s", why);
}

static void read_file(const char *path, vg_config *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        char why[128];
        snprintf(why, sizeof why, errno == ENOENT ? "missing" : "cannot open: %s",
                 strerror(errno));
        deny(out, why);
        return;
    }
    char *text = malloc(65537);
    ssize_t n = text ? read(fd, text, 65536) : -1;
    close(fd);
    if (n < 0) deny(out, "cannot read");
    else if (n == 65536) deny(out, "file larger than 64 KiB");
    else {
        text[n] = 0;
        if (memchr(text, 0, (size_t)n)) deny(out, "file contains NUL bytes");
        else if (vg_config_parse(text, out) != 0) out->deny = 1;
    }
    free(text);
}

extern char **environ;

/* the VGPUD_* names in the environment that Kubernetes mode ignores */
static void note_ignored_env(vg_config *out)
{
    size_t len = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "VGPUD_", 6) || !strncmp(*e, "VGPUD_LOG_LEVEL=", 16)) continue;
        const char *eq = strchr(*e, '=');
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        if (len + n + 2 >= sizeof out->env_ignored) break;
        if (len) out->env_ignored[len++] = ',';
        memcpy(out->env_ignored + len, *e, n);
        len += n;
        out->env_ignored[len] = 0;
    }
}

void vg_config_load(vg_config *out)
{
    struct stat sb;
    const char *path;
    int kube = stat(VG_MOUNT_DIR, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (kube) {
        path = VG_MOUNT_DIR "/config";
    } else {
        path = getenv("VGPUD_CONFIG");
        if (!path || !*path) {
            load_env(out);
            VG_INFO("no %s and no VGPUD_CONFIG: using the VGPUD_* environment", VG_MOUNT_DIR);
            return;
        }
    }
    read_file(path, out);
    out->kube = kube;
    if (kube) {
        note_ignored_env(out);
        if (out->env_ignored[0])
            VG_WARN("ignoring %s: limits come from %s only", out->env_ignored, path);
    }
    if (out->deny)
        VG_ERROR("config %s rejected (%s): GPU memory allocations will be refused until "
                 "the file is fixed", path, out->error);
}
