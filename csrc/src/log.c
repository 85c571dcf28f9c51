/* One line per message on stderr: "vgpud[<pid>] <LEVEL> <text>". The level comes
 * from VGPUD_LOG_LEVEL (error|warn|info|debug or 0-3), read once. The shim never
 * writes log files. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

static int log_level = -1;

static int read_level(void)
{
    const char *s = getenv("VGPUD_LOG_LEVEL");
    if (!s || !*s) return VG_LOG_WARN;
    if (!strcmp(s, "error") || !strcmp(s, "0")) return VG_LOG_ERROR;
    if (!strcmp(s, "warn") || !strcmp(s, "1")) return VG_LOG_WARN;
    if (!strcmp(s, "info") || !strcmp(s, "2")) return VG_LOG_INFO;
    if (!strcmp(s, "debug") || !strcmp(s, "3")) return VG_LOG_DEBUG;
    return VG_LOG_WARN;
}

void vg_log(int level, const char *fmt, ...)
{
    int cur = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    if (cur < 0) {
        cur = read_level();
        __atomic_store_n(&log_level, cur, __ATOMIC_RELAXED);
    }
    if (level > cur) return;
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char buf[512];
    int n = snprintf(buf, sizeof buf, "vgpud[%d] %s ", (int)getpid(), names[level & 3]);
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(2, buf, len); /* one write: lines of concurrent processes don't mix */
    (void)w;
}
