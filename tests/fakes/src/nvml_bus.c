/* Which GPUs are on the bus, as a function of FAKECUDA_ABSENT and the FAKECUDA_EVENTS file:
 *   lost DEV     the GPU falls off the bus: it still counts and enumerates, but every query
 *                of its handle answers NVML_ERROR_GPU_IS_LOST (and an Xid 79 event is
 *                delivered, nvml_events.c)
 *   remove DEV   it leaves the bus: not counted, later devices' indexes shift down, its
 *                UUID / PCI bus id are not found, old handles answer GPU_IS_LOST
 *   add DEV      an absent device joins the bus (same board: same UUID), not lost
 *   replace DEV  a new board in the slot: a new UUID generation, present, not lost, MIG
 *                back to the start-up state
 * Lines apply in file order; the state depends on the file's content only (re-read when
 * its identity, size or mtime changed), so every process reading it agrees. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvml_int.h"

static pthread_mutex_t bus_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct fn_bus cached;
static int cached_valid;
static struct stat cached_st; /* st_ino 0 with cached_valid: no file */

static void initial(struct fn_bus *b) {
    const struct fc_knobs *k = fc_knobs();
    memset(b, 0, sizeof *b);
    for (int d = 0; d < k->ndev; d++) b->present[d] = !k->absent[d];
}

static void apply(struct fn_bus *b, const char *line) {
    char word[16];
    int d;
    if (sscanf(line, "%15s %d", word, &d) != 2 || d < 0 || d >= fc_knobs()->ndev) return;
    if (strcmp(word, "lost") == 0) {
        if (b->present[d]) b->lost[d] = 1;
    } else if (strcmp(word, "remove") == 0) {
        if (b->present[d]) b->epoch[d]++;
        b->present[d] = 0;
        b->lost[d] = 0;
    } else if (strcmp(word, "add") == 0) {
        if (!b->present[d]) {
            b->present[d] = 1;
            b->lost[d] = 0;
        }
    } else if (strcmp(word, "replace") == 0) {
        b->gen[d]++;
        b->epoch[d]++;
        b->present[d] = 1;
        b->lost[d] = 0;
    }
}

static void parse_file(struct fn_bus *b, int fd) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        ssize_t got = pread(fd, buf + n, cap - n, (off_t)n);
        if (got <= 0) break;
        n += (size_t)got;
    }
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != '\n') continue; /* an unterminated last line is still being written */
        buf[i] = 0;
        apply(b, buf + start);
        start = i + 1;
    }
    free(buf);
}

void fn_bus_get(struct fn_bus *out) {
    const char *path = fc_knobs()->events_path;
    pthread_mutex_lock(&bus_mutex);
    struct stat st;
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0 || fstat(fd, &st) < 0) {
        if (!cached_valid || cached_st.st_ino != 0) {
            initial(&cached);
            memset(&cached_st, 0, sizeof cached_st);
            cached_valid = 1;
        }
    } else if (!cached_valid || st.st_ino != cached_st.st_ino || st.st_dev != cached_st.st_dev ||
               st.st_size != cached_st.st_size ||
               st.st_mtim.tv_sec != cached_st.st_mtim.tv_sec ||
               st.st_mtim.tv_nsec != cached_st.st_mtim.tv_nsec) {
        initial(&cached);
        parse_file(&cached, fd);
        cached_st = st;
        if (cached_st.st_ino == 0) cached_st.st_ino = 1;
        cached_valid = 1;
    }
    if (fd >= 0) close(fd);
    *out = cached;
    pthread_mutex_unlock(&bus_mutex);
}
