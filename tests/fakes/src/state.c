/* The shared state: one mmap'd file (FAKECUDA_STATE) or, when unset, an anonymous
 * region private to the process.  Fixed layout (struct fc_shared), guarded by a robust
 * process-shared mutex stored in the file, so a holder killed with SIGKILL never blocks
 * the others.  Creation is serialised with an OFD fcntl lock. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

_Static_assert(sizeof(pthread_mutex_t) <= sizeof(((struct fc_shared *)0)->lock_storage),
               "mutex does not fit");

static struct fc_shared *shm;
static pthread_once_t shm_once = PTHREAD_ONCE_INIT;
static int self_slot = -1;
static pid_t self_slot_pid;

#define REAP_EVERY_NS 20000000ull

static size_t state_size(int ndev) {
    return sizeof(struct fc_shared) + (size_t)ndev * sizeof(struct fc_dev);
}

static pthread_mutex_t *mtx(void) { return (pthread_mutex_t *)(void *)shm->lock_storage; }

uint64_t fc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fc_sleep_until(uint64_t t_ns) {
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000ull),
                          .tv_nsec = (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void init_region(struct fc_shared *s, const struct fc_knobs *k) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init((pthread_mutex_t *)(void *)s->lock_storage, &a);
    pthread_mutexattr_destroy(&a);
    s->ndev = (uint32_t)k->ndev;
    s->version = FC_VERSION;
    for (int d = 0; d < k->ndev; d++) s->dev[d].total = k->total[d];
    __atomic_store_n(&s->magic, FC_MAGIC, __ATOMIC_RELEASE);
}

static struct fc_shared *open_file(const struct fc_knobs *k) {
    size_t size = state_size(k->ndev);
    int fd = open(k->state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fakecuda: cannot open FAKECUDA_STATE=%s: %s\n", k->state_path,
                strerror(errno));
        return NULL;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    while (fcntl(fd, F_OFD_SETLKW, &fl) < 0 && errno == EINTR) {
    }
    struct fc_shared *s = NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) goto out;
    if (st.st_size == 0) {
        (void)fchmod(fd, 0666);
        if (ftruncate(fd, (off_t)size) < 0) {
            fprintf(stderr, "fakecuda: cannot size %s: %s\n", k->state_path, strerror(errno));
            goto out;
        }
    } else if ((size_t)st.st_size != size) {
        fprintf(stderr,
                "fakecuda: %s has %lld bytes, expected %zu (another FAKECUDA_DEVICES or "
                "layout version); delete it\n",
                k->state_path, (long long)st.st_size, size);
        goto out;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "fakecuda: mmap %s: %s\n", k->state_path, strerror(errno));
        goto out;
    }
    s = m;
    if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != FC_MAGIC) {
        init_region(s, k); /* new file, or its creator died half-way */
    } else if (s->version != FC_VERSION || s->ndev != (uint32_t)k->ndev) {
        fprintf(stderr, "fakecuda: %s was made for another layout; delete it\n", k->state_path);
        munmap(m, size);
        s = NULL;
    }
out:
    fl.l_type = F_UNLCK;
    fcntl(fd, F_OFD_SETLK, &fl);
    close(fd);
    return s;
}

static void state_open(void) {
    const struct fc_knobs *k = fc_knobs();
    if (k->ndev <= 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_DEVICES lists no device\n");
        return;
    }
    if (k->state_path) {
        shm = open_file(k);
        return;
    }
#ifdef FC_NVML
    /* Process-local mode: share the region of the fake libcuda if it is loaded. */
    void *(*region)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "fake_state_region");
    if (region) {
        shm = region();
        if (shm) return;
    }
#endif
    void *m = mmap(NULL, state_size(k->ndev), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return;
    shm = m;
    init_region(shm, k);
}

struct fc_shared *fc_state(void) {
    pthread_once(&shm_once, state_open);
    return shm;
}

void fc_lock(void) {
    if (pthread_mutex_lock(mtx()) == EOWNERDEAD) pthread_mutex_consistent(mtx());
    uint64_t now = fc_now();
    if (now - shm->last_reap_ns > REAP_EVERY_NS) {
        shm->last_reap_ns = now;
        fc_reap_locked();
    }
}

void fc_unlock(void) { pthread_mutex_unlock(mtx()); }

/* 0: no such process (or a zombie); 1: alive; starttime read into *st when alive. */
static int proc_stat(pid_t pid, uint64_t *st) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kill(pid, 0) == 0 || errno == EPERM;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] == 0) return 1;
    char state = p[2];
    if (state == 'Z' || state == 'X') return 0;
    /* fields after ')' start at 3 (state); starttime is field 22 */
    p += 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    *st = p ? strtoull(p, NULL, 10) : 0;
    return 1;
}

static void clear_slot(int i) {
    struct fc_proc *pr = &shm->procs[i];
    for (uint32_t d = 0; d < shm->ndev; d++) {
        struct fc_dev *dv = &shm->dev[d];
        dv->used = dv->used > pr->used[d] ? dv->used - pr->used[d] : 0;
    }
    memset(pr, 0, sizeof *pr);
}

void fc_reap_locked(void) {
    pid_t me = getpid();
    for (int i = 0; i < FC_MAX_PROCS; i++) {
        struct fc_proc *pr = &shm->procs[i];
        if (pr->pid == 0 || pr->pid == me) continue;
        uint64_t st = 0;
        if (!proc_stat(pr->pid, &st) || (st && pr->starttime && st != pr->starttime))
            clear_slot(i);
    }
}

int fc_self_slot_locked(void) {
    pid_t me = getpid();
    if (self_slot >= 0 && self_slot_pid == me && shm->procs[self_slot].pid == me) return self_slot;
    uint64_t st = 0;
    proc_stat(me, &st);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < FC_MAX_PROCS; i++) {
            if (shm->procs[i].pid == me && shm->procs[i].starttime == st) {
                self_slot = i;
                self_slot_pid = me;
                return i;
            }
        }
        for (int i = 0; i < FC_MAX_PROCS; i++) {
            struct fc_proc *pr = &shm->procs[i];
            if (pr->pid != 0) continue;
            memset(pr, 0, sizeof *pr);
            pr->pid = me;
            pr->host_pid = (uint32_t)((long)me + fc_knobs()->host_pid_offset);
            pr->starttime = st;
            self_slot = i;
            self_slot_pid = me;
            return i;
        }
        fc_reap_locked();
    }
    fprintf(stderr, "fakecuda: process table full (%d)\n", FC_MAX_PROCS);
    return -1;
}

void fc_release_self(void) {
    if (!shm || self_slot < 0 || self_slot_pid != getpid()) return;
    fc_lock();
    if (shm->procs[self_slot].pid == self_slot_pid) clear_slot(self_slot);
    self_slot = -1;
    fc_unlock();
}

int fc_charge(int dev, uint64_t bytes) {
    fc_lock();
    int slot = fc_self_slot_locked();
    struct fc_dev *dv = &shm->dev[dev];
    if (slot >= 0 && dv->used + bytes > dv->total) {
        fc_reap_locked();
    }
    if (slot < 0 || dv->used + bytes > dv->total || dv->used + bytes < dv->used) {
        fc_unlock();
        return -1;
    }
    dv->used += bytes;
    shm->procs[slot].used[dev] += bytes;
    fc_unlock();
    return 0;
}

void fc_uncharge(int dev, uint64_t bytes) {
    fc_lock();
    int slot = fc_self_slot_locked();
    struct fc_dev *dv = &shm->dev[dev];
    dv->used = dv->used > bytes ? dv->used - bytes : 0;
    if (slot >= 0) {
        uint64_t *u = &shm->procs[slot].used[dev];
        *u = *u > bytes ? *u - bytes : 0;
    }
    fc_unlock();
}

void fc_managed(int64_t delta) {
    fc_lock();
    int slot = fc_self_slot_locked();
    if (slot >= 0) shm->procs[slot].managed += (uint64_t)delta;
    fc_unlock();
}

void fc_ctx_count(int dev, int delta) {
    fc_lock();
    int slot = fc_self_slot_locked();
    if (slot >= 0) shm->procs[slot].nctx[dev] += (uint32_t)delta;
    fc_unlock();
}

uint64_t fc_enqueue(int dev, uint64_t dur) {
    const struct fc_knobs *k = fc_knobs();
    uint32_t pid = (uint32_t)getpid();
    uint32_t host_pid = (uint32_t)((long)pid + k->host_pid_offset);
    for (;;) {
        fc_lock();
        uint64_t now = fc_now();
        struct fc_dev *dv = &shm->dev[dev];
        if (dv->busy_until > now + k->max_queue_ns) {
            uint64_t wake = dv->busy_until - k->max_queue_ns;
            fc_unlock();
            fc_sleep_until(wake);
            continue;
        }
        uint64_t start = dv->busy_until > now ? dv->busy_until : now;
        uint64_t end = start + dur;
        if (dur > 0) {
            dv->busy_until = end;
            struct fc_seg *last = dv->seg_next ? &dv->seg[(dv->seg_next - 1) % FC_SEGS] : NULL;
            if (last && last->pid == pid && last->end == start) {
                last->end = end;
            } else {
                struct fc_seg *s = &dv->seg[dv->seg_next % FC_SEGS];
                s->start = start;
                s->end = end;
                s->pid = pid;
                s->host_pid = host_pid;
                dv->seg_next++;
            }
        }
        fc_unlock();
        return end;
    }
}

uint64_t fc_oldest_locked(int dev) {
    struct fc_dev *dv = &shm->dev[dev];
    if (dv->seg_next == 0) return 0;
    uint64_t first = dv->seg_next > FC_SEGS ? dv->seg_next - FC_SEGS : 0;
    return dv->seg[first % FC_SEGS].start;
}

/* Calls fn for each segment overlapping [t0, t1), newest first. */
#define FOR_SEGS(dv, t0, t1, body)                                                  \
    do {                                                                            \
        uint64_t n_ = (dv)->seg_next, lo_ = n_ > FC_SEGS ? n_ - FC_SEGS : 0;        \
        for (uint64_t i_ = n_; i_ > lo_; i_--) {                                    \
            const struct fc_seg *s = &(dv)->seg[(i_ - 1) % FC_SEGS];                \
            if (s->end <= (t0)) break;                                              \
            uint64_t a_ = s->start > (t0) ? s->start : (t0);                        \
            uint64_t b_ = s->end < (t1) ? s->end : (t1);                            \
            if (b_ <= a_) continue;                                                 \
            uint64_t overlap = b_ - a_;                                             \
            body;                                                                   \
        }                                                                           \
    } while (0)

uint64_t fc_busy_locked(int dev, long host_pid, uint64_t t0, uint64_t t1) {
    uint64_t total = 0;
    struct fc_dev *dv = &shm->dev[dev];
    FOR_SEGS(dv, t0, t1, {
        if (host_pid < 0 || s->host_pid == (uint32_t)host_pid) total += overlap;
    });
    return total;
}

int fc_busy_by_pid_locked(int dev, uint64_t t0, uint64_t t1, struct fc_pid_busy *out, int max) {
    int n = 0;
    struct fc_dev *dv = &shm->dev[dev];
    FOR_SEGS(dv, t0, t1, {
        int j = 0;
        while (j < n && out[j].host_pid != s->host_pid) j++;
        if (j == n) {
            if (n == max) continue;
            out[n].host_pid = s->host_pid;
            out[n].ns = 0;
            n++;
        }
        out[j].ns += overlap;
    });
    return n;
}
