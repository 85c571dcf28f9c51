/* The shared state: one mmap'd file (FAKECUDA_STATE) or, when unset, a memfd region
 * private to the process (and its forks).  Fixed layout (struct fc_shared).
 *
 * The state lock is a futex word in the file (lock_word) holding its holder's *lock id*,
 * a number handed out once per process (again after fork) from the file: unlike a TID,
 * unique across PID namespaces.  Taking it free is one compare-and-swap; a waiter sleeps
 * on the futex (shared: the file's page, whatever the namespace).  A holder killed with
 * SIGKILL cannot give it back, so each process also holds, for its life, an OFD fcntl
 * lock on byte LIVE_BASE + its id through its own open file description: the kernel drops
 * that with the process's last descriptor.  A waiter that slept WAIT_NS without the lock
 * asks whether its holder's byte is still locked; when it is not, the holder is gone and
 * the waiter takes the word over.  Threads of one process first take a process-local
 * mutex (one id per process).
 *
 * It was a robust pthread mutex until CI caught what that cannot do: its owner is a TID of
 * the holder's PID namespace, every container's first process is TID 1, and when a waiter
 * is killed the kernel releases the lock if the owner TID equals the waiter's own, so a
 * waiter killed in one container stole the lock a process of another container held.  An
 * OFD lock taken for each critical section fixed that but cost two system calls a lock
 * (a launch went from 0.25 to 2.5 us).  Creation is serialised with an OFD lock on byte
 * INIT_LOCK_BYTE. */
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <linux/futex.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

static struct fc_shared *shm;
static int region_fd = -1; /* the file mapped at shm */
static int lock_fd = -1;   /* this process's own open file description of it */
static pthread_mutex_t local_mtx = PTHREAD_MUTEX_INITIALIZER;

static uint32_t lock_id; /* this process's (0: none: no state) */

#define INIT_LOCK_BYTE 0
#define LIVE_BASE (1 << 20) /* byte LIVE_BASE + id: held by the process with lock id id */
#define LOCK_ID_MASK 0x7fffffffu
#define FC_LOCK_WAITERS 0x80000000u
#define WAIT_NS 10000000 /* a waiter checks on its holder after 10 ms */
static pthread_once_t shm_once = PTHREAD_ONCE_INIT;
static int self_slot = -1;
static pid_t self_slot_pid;

#define REAP_EVERY_NS 20000000ull

static size_t state_size(int ndev) {
    return sizeof(struct fc_shared) + (size_t)ndev * sizeof(struct fc_dev);
}


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

/* ---- identity: pid, host pid, PID namespace ---- */
static struct fc_ident ident;
static int ident_valid;
static pthread_mutex_t ident_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void ident_child(void) {
    /* the child of a fork is another process: learn its identity again */
    pthread_mutex_init(&ident_mutex, NULL);
    __atomic_store_n(&ident_valid, 0, __ATOMIC_RELEASE);
}

static void atfork_register(void) { pthread_atfork(NULL, NULL, ident_child); }

/* The host pid as the FAKECUDA_HOST_PID_SOCK server sees it (SO_PEERCRED); 0 with *why
 * set when the socket cannot be used. */
static uint32_t ask_host_pid(const char *path, const char **why) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        *why = "path too long for a unix socket";
        return 0;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *why = strerror(errno);
        return 0;
    }
    struct timeval tv = {.tv_sec = 2, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof sa)) < 0 && errno == EINTR) {
    }
    if (rc < 0) {
        *why = strerror(errno);
        close(fd);
        return 0;
    }
    char buf[32];
    size_t n = 0;
    while (n < sizeof buf - 1) {
        ssize_t got = read(fd, buf + n, sizeof buf - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
        if (memchr(buf, '\n', n)) break;
    }
    close(fd);
    buf[n] = 0;
    char *end = NULL;
    unsigned long v = strtoul(buf, &end, 10);
    if (end == buf || (*end && *end != '\n') || v == 0 || v > 0x7fffffffUL) {
        *why = n ? "the answer is not a pid (is the peer visible from the server?)"
                 : "no answer";
        return 0;
    }
    return (uint32_t)v;
}

static void ident_compute(struct fc_ident *id) {
    const struct fc_knobs *k = fc_knobs();
    memset(id, 0, sizeof *id);
    id->pid = (int32_t)getpid();
    id->offset = k->host_pid_offset;
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) id->ns_ino = (uint64_t)st.st_ino;
    id->host_pid = (uint32_t)((long)id->pid + k->host_pid_offset);
    if (k->host_pid_sock) {
        const char *why = "unknown error";
        uint32_t hp = ask_host_pid(k->host_pid_sock, &why);
        if (hp) {
            id->host_pid = hp;
            id->host_real = 1;
        } else {
            fprintf(stderr,
                    "fakecuda: FAKECUDA_HOST_PID_SOCK=%s: %s; using getpid() + "
                    "FAKECUDA_HOST_PID_OFFSET as the host pid\n",
                    k->host_pid_sock, why);
        }
    }
    /* the host PID namespace: host pid == pid, offset 0.  With the oracle configured but
     * unusable we cannot tell (a container's pid looks the same): not the host, so
     * nothing of other namespaces is judged from here. */
    id->is_host = id->offset == 0 && id->host_pid == (uint32_t)id->pid &&
                  (id->host_real || !k->host_pid_sock);
}

const struct fc_ident *fc_ident(void) {
    if (__atomic_load_n(&ident_valid, __ATOMIC_ACQUIRE)) return &ident;
    pthread_once(&atfork_once, atfork_register);
    pthread_mutex_lock(&ident_mutex);
    if (!__atomic_load_n(&ident_valid, __ATOMIC_ACQUIRE)) {
        ident_compute(&ident);
        __atomic_store_n(&ident_valid, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ident_mutex);
    return &ident;
}

static void init_region(struct fc_shared *s, const struct fc_knobs *k) {
    s->ndev = (uint32_t)k->ndev;
    s->version = FC_VERSION;
    s->sample_ns = k->sample_ns;
    uint64_t now = fc_now();
    for (int d = 0; d < k->ndev; d++) {
        s->dev[d].total = k->total[d];
        s->dev[d].win_next = now / k->sample_ns; /* sampling starts with the state */
    }
    fc_mig_init_region(s); /* FAKECUDA_MIG, FAKECUDA_MIG_LAYOUT: once, with the state */
    __atomic_store_n(&s->magic, FC_MAGIC, __ATOMIC_RELEASE);
}

static int ofd_lock(int fd, short type, off_t byte) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    int rc;
    while ((rc = fcntl(fd, type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW, &fl)) < 0 &&
           errno == EINTR) {
    }
    return rc;
}

/* A new open file description of the file mapped at the region (through /proc/self/fd,
 * else by FAKECUDA_STATE's path, checked to be the same file): its own lock owner. */
static int reopen_region(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", region_fd);
    const struct fc_knobs *k = fc_knobs();
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && k->state_path) fd = open(k->state_path, O_RDWR | O_CLOEXEC);
    struct stat a, b;
    if (fd >= 0 && (fstat(fd, &a) < 0 || fstat(region_fd, &b) < 0 || a.st_dev != b.st_dev ||
                    a.st_ino != b.st_ino)) {
        close(fd); /* FAKECUDA_STATE names another file now (deleted and made again) */
        fd = -1;
        errno = ESTALE;
    }
    return fd;
}

/* A lock id drawn from region s, its liveness byte held through lock_fd (0: none). */
static void take_lock_id(struct fc_shared *s) {
    lock_id = 0;
    if (lock_fd < 0) return;
    uint32_t id;
    do { /* 0 is "free"; ids wrap after 2^31 processes, long gone by then */
        id = (uint32_t)__atomic_add_fetch(&s->lock_next_id, 1, __ATOMIC_RELAXED) & LOCK_ID_MASK;
    } while (!id);
    if (ofd_lock(lock_fd, F_WRLCK, LIVE_BASE + (off_t)id) == 0) lock_id = id;
}

/* The child of a fork shares its parent's descriptions (and its lock id): it takes its
 * own, and the threads it did not inherit cannot hold its mutex. */
static void lock_child(void) {
    pthread_mutex_init(&local_mtx, NULL);
    if (lock_fd < 0) return;
    int fd = reopen_region(); /* the parent's description holds the parent's id */
    close(lock_fd);
    lock_fd = fd;
    take_lock_id(shm);
    if (!lock_id) shm = NULL; /* no lock of its own: no state (calls fail), never unlocked */
}

static struct fc_shared *open_file(const struct fc_knobs *k) {
    size_t size = state_size(k->ndev);
    int fd = open(k->state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fakecuda: cannot open FAKECUDA_STATE=%s: %s\n", k->state_path,
                strerror(errno));
        return NULL;
    }
    ofd_lock(fd, F_WRLCK, INIT_LOCK_BYTE);
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
    ofd_lock(fd, F_UNLCK, INIT_LOCK_BYTE);
    if (s)
        region_fd = fd;
    else
        close(fd);
    return s;
}

/* Process-local: a memfd, so that there is a file to lock. */
static struct fc_shared *open_memfd(const struct fc_knobs *k) {
    size_t size = state_size(k->ndev);
    int fd = memfd_create("fakecuda-state", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        fprintf(stderr, "fakecuda: cannot make the process-local state: %s\n", strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    region_fd = fd;
    init_region(m, k);
    return m;
}

static void state_open(void) {
    const struct fc_knobs *k = fc_knobs();
    if (k->ndev <= 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_DEVICES lists no device\n");
        return;
    }
    struct fc_shared *s = NULL;
    if (k->state_path) {
        s = open_file(k);
    } else {
#ifdef FC_NVML
        /* Process-local mode: share the region of the fake libcuda if it is loaded. */
        void *(*region)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "fake_state_region");
        int (*fd_of)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_state_fd");
        if (region && fd_of && (s = region())) region_fd = fd_of();
#endif
        if (!s) s = open_memfd(k);
    }
    if (!s) return;
    pthread_atfork(NULL, NULL, lock_child); /* first: a fork from now on takes its own */
    lock_fd = reopen_region();
    take_lock_id(s);
    if (!lock_id) {
        fprintf(stderr, "fakecuda: cannot lock the state: %s\n", strerror(errno));
        return;
    }
    shm = s;
}

int fc_state_fd(void) { return fc_state() ? region_fd : -1; }

struct fc_shared *fc_state(void) {
    pthread_once(&shm_once, state_open);
    return shm;
}

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *timeout) {
    return syscall(SYS_futex, word, op, val, timeout, NULL, 0);
}

/* The holder with lock id id is gone: no process holds its byte any more. */
static int holder_gone(uint32_t id) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = LIVE_BASE + (off_t)id, .l_len = 1};
    if (fcntl(lock_fd, F_OFD_GETLK, &fl) < 0) return 0;
    return fl.l_type == F_UNLCK;
}

static void word_lock(void) {
    uint32_t *w = &shm->lock_word;
    uint32_t mine = lock_id, cur = 0;
    if (!mine) abort(); /* no lock id means no state: a caller that went on regardless */
    if (__atomic_compare_exchange_n(w, &cur, mine, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return;
    /* contended: from here on take it marked (others may sleep), sleep marked */
    mine |= FC_LOCK_WAITERS;
    for (;;) {
        cur = 0;
        if (__atomic_compare_exchange_n(w, &cur, mine, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        uint32_t marked = cur | FC_LOCK_WAITERS;
        if (cur != marked &&
            !__atomic_compare_exchange_n(w, &cur, marked, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            continue;
        struct timespec t = {0, WAIT_NS};
        if (futex(w, FUTEX_WAIT, marked, &t) < 0 && errno == ETIMEDOUT &&
            holder_gone(marked & LOCK_ID_MASK)) {
            uint32_t dead = marked; /* killed holding it: the word is taken over */
            __atomic_compare_exchange_n(w, &dead, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        }
    }
}

static void word_unlock(void) {
    if (__atomic_exchange_n(&shm->lock_word, 0, __ATOMIC_RELEASE) & FC_LOCK_WAITERS)
        futex(&shm->lock_word, FUTEX_WAKE, 1, NULL);
}

void fc_lock(void) {
    fc_ident(); /* learnt outside the lock: it may ask FAKECUDA_HOST_PID_SOCK */
    pthread_mutex_lock(&local_mtx);
    word_lock();
    uint64_t now = fc_now();
    if (now - shm->last_reap_ns > REAP_EVERY_NS) {
        shm->last_reap_ns = now;
        fc_reap_locked();
    }
}

void fc_unlock(void) {
    word_unlock();
    pthread_mutex_unlock(&local_mtx);
}

/* 0: no such process (or a zombie); 1: alive; starttime read into *st when alive.
 * pid 0: this process (/proc/self, right even where /proc belongs to another namespace). */
static int proc_stat(pid_t pid, uint64_t *st) {
    char path[64], buf[1024];
    if (pid)
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pid ? (kill(pid, 0) == 0 || errno == EPERM) : 1;
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

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* ---- legacy CUDA IPC (README.md "Legacy CUDA IPC") ---- */
static void ipc_uncharge_slot(int slot, int dev, uint64_t bytes) {
    struct fc_dev *dv = &shm->dev[dev];
    dv->used -= min64(dv->used, bytes);
    uint64_t *u = &shm->procs[slot].used[dev];
    *u -= min64(*u, bytes);
}

static int ipc_openers(const struct fc_ipc *e) {
    int n = 0;
    for (int j = 0; j < FC_IPC_OPENERS; j++) n += e->opener[j] >= 0;
    return n;
}

/* Moves the charge of e from its owner to another opener (the owner goes). */
static void ipc_reattribute(struct fc_ipc *e) {
    for (int j = 0; j < FC_IPC_OPENERS; j++) {
        int o = e->opener[j];
        if (o < 0 || o == e->owner) continue;
        ipc_uncharge_slot(e->owner, e->dev, e->size);
        shm->dev[e->dev].used += e->size;
        shm->procs[o].used[e->dev] += e->size;
        struct fc_acct *a = fc_acct_locked(o, e->dev);
        if (a && a->max_used < shm->procs[o].used[e->dev]) a->max_used = shm->procs[o].used[e->dev];
        e->owner = o;
        return;
    }
}

/* Slot i goes (its process exited): it stops holding what it opened; what it exported
 * stays for its openers, charged to one of them. */
static void ipc_slot_gone(int i) {
    for (int k = 0; k < FC_IPC; k++) {
        struct fc_ipc *e = &shm->ipc[k];
        if (!e->id) continue;
        for (int j = 0; j < FC_IPC_OPENERS; j++)
            if (e->opener[j] == i) e->opener[j] = -1;
        if (e->exporter == i) {
            e->exporter = -1;
            e->freed = 1; /* its allocation goes with it */
        }
        int left = ipc_openers(e);
        if (e->owner == i) {
            if (left) ipc_reattribute(e); /* else clear_slot gives the memory back */
            else e->id = 0;
        } else if (e->freed && !left) {
            ipc_uncharge_slot(e->owner, e->dev, e->size);
            e->id = 0;
        }
    }
}

int fc_ipc_export(int dev, uint64_t size, int *index, uint64_t *id) {
    fc_lock();
    int slot = fc_self_slot_locked(), r = -1;
    for (int k = 0; slot >= 0 && k < FC_IPC; k++) {
        struct fc_ipc *e = &shm->ipc[k];
        if (e->id) continue;
        memset(e, 0, sizeof *e);
        e->id = ++shm->ipc_next_id;
        e->size = size;
        e->dev = dev;
        e->exporter = e->owner = slot;
        for (int j = 0; j < FC_IPC_OPENERS; j++) e->opener[j] = -1;
        *index = k;
        *id = e->id;
        r = 0;
        break;
    }
    fc_unlock();
    return r;
}

static struct fc_ipc *ipc_find_locked(int index, uint64_t id) {
    if (index < 0 || index >= FC_IPC || !id || shm->ipc[index].id != id) return NULL;
    return &shm->ipc[index];
}

int fc_ipc_open(int index, uint64_t id, int *dev, uint64_t *size) {
    fc_lock();
    fc_reap_locked(); /* an exporter that exited with no opener took its exports along */
    int slot = fc_self_slot_locked(), r = 0;
    struct fc_ipc *e = slot >= 0 ? ipc_find_locked(index, id) : NULL;
    if (!e || (e->freed && !ipc_openers(e))) {
        r = -1;
    } else if (e->exporter == slot) {
        r = -2;
    } else {
        int j, free_j = -1;
        for (j = 0; j < FC_IPC_OPENERS && e->opener[j] != slot; j++)
            if (e->opener[j] < 0 && free_j < 0) free_j = j;
        if (j == FC_IPC_OPENERS) {
            if (free_j < 0) r = -3;
            else e->opener[free_j] = slot;
        }
        if (!r) {
            *dev = e->dev;
            *size = e->size;
            fc_acct_locked(slot, e->dev);
        }
    }
    fc_unlock();
    return r;
}

void fc_ipc_close(int index, uint64_t id) {
    fc_lock();
    int slot = fc_self_slot_locked();
    struct fc_ipc *e = slot >= 0 ? ipc_find_locked(index, id) : NULL;
    if (e) {
        for (int j = 0; j < FC_IPC_OPENERS; j++)
            if (e->opener[j] == slot) e->opener[j] = -1;
        if (e->freed && !ipc_openers(e)) {
            ipc_uncharge_slot(e->owner, e->dev, e->size);
            e->id = 0;
        } else if (e->owner == slot && e->freed) {
            ipc_reattribute(e);
        }
    }
    fc_unlock();
}

int fc_ipc_exporter_free(int index, uint64_t id, int to_opener) {
    fc_lock();
    struct fc_ipc *e = ipc_find_locked(index, id);
    int kept = 0;
    if (e) {
        fc_reap_locked(); /* openers that exited hold nothing */
        kept = ipc_openers(e) > 0;
        if (kept) { /* to_opener: NVML counts it for an opener from now on (legacy IPC) */
            e->freed = 1;
            if (to_opener && e->owner == e->exporter) ipc_reattribute(e);
        } else {
            e->id = 0;
        }
    }
    fc_unlock();
    return kept;
}

static void clear_slot(int i) {
    struct fc_proc *pr = &shm->procs[i];
    uint64_t now = fc_now();
    ipc_slot_gone(i);
    for (uint32_t d = 0; d < shm->ndev && d < FC_MAX_DEV; d++) {
        if (!pr->acct[d] || pr->acct[d] > FC_ACCT) continue;
        struct fc_acct *a = &shm->dev[d].acct[pr->acct[d] - 1];
        if (a->running && a->pid == pr->pid && a->host_pid == pr->host_pid) {
            a->running = 0;
            a->end_ns = now > a->start_ns ? now : a->start_ns;
        }
    }
    if ((pr->flags & FC_PROC_MIG) && pr->mig_dev >= 0 && (uint32_t)pr->mig_dev < shm->ndev &&
        pr->mig_gi < FC_MIG_GI) {
        struct fc_gi *g = &shm->dev[pr->mig_dev].mig.gi[pr->mig_gi];
        if (g->live) g->used -= min64(g->used, pr->used[pr->mig_dev]);
    }
    for (uint32_t d = 0; d < shm->ndev; d++) {
        struct fc_dev *dv = &shm->dev[d];
        dv->used = dv->used > pr->used[d] ? dv->used - pr->used[d] : 0;
    }
    memset(pr, 0, sizeof *pr);
}

static int is_self(int i, const struct fc_ident *me) {
    const struct fc_proc *pr = &shm->procs[i];
    return pr->pid == me->pid && pr->ns_ino == me->ns_ino && pr->ns_offset == me->offset;
}

/* Whether this process can tell if slot pr's process lives, and by which pid: processes
 * of its own PID namespace (same /proc/self/ns/pid inode; simulated namespaces that only
 * differ in FAKECUDA_HOST_PID_OFFSET share the real one) by their pid; from the host PID
 * namespace, processes of other namespaces by their host pid when the oracle gave it. */
static int judge_pid(const struct fc_proc *pr, const struct fc_ident *me, pid_t *pid) {
    if (pr->ns_ino == me->ns_ino) {
        *pid = pr->pid;
        return 1;
    }
    if (me->is_host && (pr->flags & FC_PROC_HOSTPID_REAL)) {
        *pid = (pid_t)pr->host_pid;
        return 1;
    }
    return 0; /* another namespace we cannot see into: never reaped from here */
}

void fc_reap_locked(void) {
    const struct fc_ident *me = fc_ident();
    for (int i = 0; i < FC_MAX_PROCS; i++) {
        struct fc_proc *pr = &shm->procs[i];
        pid_t pid;
        /* my own slot; a stale one with my pid (reused) goes by its start time below */
        if (pr->pid == 0 || (i == self_slot && self_slot_pid == me->pid)) continue;
        if (!judge_pid(pr, me, &pid)) continue;
        uint64_t st = 0;
        if (!proc_stat(pid, &st) || (st && pr->starttime && st != pr->starttime)) clear_slot(i);
    }
}

int fc_self_slot_locked(void) {
    const struct fc_ident *me = fc_ident();
    if (self_slot >= 0 && self_slot_pid == me->pid && is_self(self_slot, me)) return self_slot;
    uint64_t st = 0;
    proc_stat(0, &st);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < FC_MAX_PROCS; i++) {
            if (is_self(i, me) && shm->procs[i].starttime == st) {
                self_slot = i;
                self_slot_pid = me->pid;
                return i;
            }
        }
        for (int i = 0; i < FC_MAX_PROCS; i++) {
            struct fc_proc *pr = &shm->procs[i];
            if (pr->pid != 0) continue;
            memset(pr, 0, sizeof *pr);
            pr->pid = me->pid;
            pr->host_pid = me->host_pid;
            pr->starttime = st;
            pr->ns_ino = me->ns_ino;
            pr->ns_offset = me->offset;
            pr->flags = me->host_real ? FC_PROC_HOSTPID_REAL : 0;
            const struct fc_knobs *k = fc_knobs();
            if (k->mps) pr->flags |= FC_PROC_MPS; /* FAKECUDA_MPS=1: an MPS client */
            if (k->mig_ordinal >= 0) { /* CUDA_VISIBLE_DEVICES names a MIG device */
                pr->flags |= FC_PROC_MIG;
                pr->mig_dev = k->mig_phys;
                pr->mig_gi = k->mig_gi;
                pr->mig_ci = k->mig_ci;
            }
            self_slot = i;
            self_slot_pid = me->pid;
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
    if (is_self(self_slot, fc_ident())) clear_slot(self_slot);
    self_slot = -1;
    fc_unlock();
}

struct fc_acct *fc_acct_locked(int slot, int dev) {
    struct fc_proc *pr = &shm->procs[slot];
    struct fc_dev *dv = &shm->dev[dev];
    if (pr->acct[dev] && pr->acct[dev] <= FC_ACCT) {
        struct fc_acct *a = &dv->acct[pr->acct[dev] - 1];
        if (a->running && a->pid == pr->pid && a->host_pid == pr->host_pid) return a;
    }
    /* a new record in the oldest closed one (at most FC_MAX_PROCS are running) */
    for (int tries = 0; tries < FC_ACCT; tries++) {
        uint64_t idx = dv->acct_next++ % FC_ACCT;
        struct fc_acct *a = &dv->acct[idx];
        if (a->running) continue;
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        memset(a, 0, sizeof *a);
        a->host_pid = pr->host_pid;
        a->pid = pr->pid;
        a->ns_ino = pr->ns_ino;
        a->ns_offset = pr->ns_offset;
        a->running = 1;
        a->start_ns = fc_now();
        a->start_us = (uint64_t)rt.tv_sec * 1000000ull + (uint64_t)rt.tv_nsec / 1000ull;
        a->max_used = pr->used[dev];
        pr->acct[dev] = (uint32_t)idx + 1;
        return a;
    }
    return NULL;
}

/* Whether dev is this process's MIG device (CUDA_VISIBLE_DEVICES): 0 no; 1 yes, *g its GPU
 * instance and *gtot that instance's memory; -1 yes but the instance is gone. */
static int mig_of_locked(int dev, struct fc_gi **g, uint64_t *gtot) {
    const struct fc_knobs *k = fc_knobs();
    if (k->mig_ordinal < 0 || k->mig_phys != dev) return 0;
    struct fc_mig *m = &shm->dev[dev].mig;
    struct fc_gi *gi = &m->gi[k->mig_gi];
    if (m->gen != k->mig_gen || !gi->live || !gi->ci[k->mig_ci].live) return -1;
    *g = gi;
    *gtot = fc_mig_mem_mib(dev, gi->size) * FC_MIB;
    return 1;
}

void fc_meminfo_locked(int dev, uint64_t *used, uint64_t *total) {
    struct fc_gi *g = NULL;
    uint64_t gtot = 0;
    int mig = mig_of_locked(dev, &g, &gtot);
    if (mig == 0) {
        *used = shm->dev[dev].used;
        *total = shm->dev[dev].total;
    } else {
        const struct fc_knobs *k = fc_knobs();
        *total = mig > 0 ? gtot : fc_mig_mem_mib(dev, k->mig_mem_slices) * FC_MIB;
        *used = mig > 0 ? g->used : *total; /* an instance destroyed under us: nothing free */
    }
}

/* Charges bytes to dev (and to this process's MIG instance when dev is its MIG device, which
 * must have room too). */
int fc_charge(int dev, uint64_t bytes) {
    fc_lock();
    int slot = fc_self_slot_locked();
    struct fc_dev *dv = &shm->dev[dev];
    struct fc_gi *g = NULL;
    uint64_t gtot = 0;
    int mig = mig_of_locked(dev, &g, &gtot);
    if (slot >= 0 && (dv->used + bytes > dv->total || (g && g->used + bytes > gtot))) {
        fc_reap_locked();
    }
    if (slot < 0 || mig < 0 || dv->used + bytes > dv->total || dv->used + bytes < dv->used ||
        (g && (g->used + bytes > gtot || g->used + bytes < g->used))) {
        fc_unlock();
        return -1;
    }
    dv->used += bytes;
    if (g) g->used += bytes;
    shm->procs[slot].used[dev] += bytes;
    struct fc_acct *a = fc_acct_locked(slot, dev);
    if (a && a->max_used < shm->procs[slot].used[dev]) a->max_used = shm->procs[slot].used[dev];
    fc_unlock();
    return 0;
}

/* Device memory a graphics API (Vulkan, OpenGL) takes: charged as fc_charge does, and the
 * process has a graphics context from then on (NVML's graphics list shows it; without a
 * CUDA context too, the compute list does not).  Held until the process ends. */
int fc_graphics_charge(int dev, uint64_t bytes) {
    if (fc_charge(dev, bytes) < 0) return -1;
    fc_lock();
    int slot = fc_self_slot_locked();
    if (slot >= 0) shm->procs[slot].flags |= FC_PROC_GRAPHICS;
    fc_unlock();
    return 0;
}

void fc_uncharge(int dev, uint64_t bytes) {
    fc_lock();
    int slot = fc_self_slot_locked();
    struct fc_dev *dv = &shm->dev[dev];
    dv->used = dv->used > bytes ? dv->used - bytes : 0;
    struct fc_gi *g = NULL;
    uint64_t gtot = 0;
    if (mig_of_locked(dev, &g, &gtot) > 0) g->used -= min64(g->used, bytes);
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
    if (slot >= 0 && delta > 0) fc_acct_locked(slot, dev);
    fc_unlock();
}

/* Adds [start, end) of host_pid's device time to the sampling windows it overlaps. */
static void account(struct fc_dev *dv, uint32_t host_pid, uint64_t start, uint64_t end) {
    uint64_t W = shm->sample_ns;
    while (start < end) {
        uint64_t w = start / W, we = (w + 1) * W, e = end < we ? end : we;
        struct fc_window_acc *a = &dv->acc[w % FC_SAMPLES];
        if (a->index != w || (a->n == 0 && a->total == 0)) {
            memset(a, 0, sizeof *a);
            a->index = w;
        }
        a->total += e - start;
        uint32_t j = 0;
        while (j < a->n && a->pid[j].host_pid != host_pid) j++;
        if (j == a->n && j < FC_SAMPLE_PIDS) {
            a->pid[j].host_pid = host_pid;
            a->pid[j].ns = 0;
            a->n++;
        }
        if (j < a->n) a->pid[j].ns += e - start;
        start = e;
    }
}

uint64_t fc_enqueue(int dev, uint64_t dur) {
    const struct fc_knobs *k = fc_knobs();
    const struct fc_ident *me = fc_ident();
    uint32_t pid = (uint32_t)me->pid, host_pid = me->host_pid;
    for (;;) {
        fc_lock();
        uint64_t now = fc_now();
        struct fc_dev *dv = &shm->dev[dev];
        /* complete the sampling windows that are over before their segments can be
         * overwritten (cheap: once per window) */
        if (now >= (dv->win_next + 1) * shm->sample_ns) fc_sample_locked(dev, now);
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
            account(dv, host_pid, start, end);
            int slot = fc_self_slot_locked();
            struct fc_acct *a = slot >= 0 ? fc_acct_locked(slot, dev) : NULL;
            if (a) a->busy_ns += dur;
            struct fc_seg *last = dv->seg_next ? &dv->seg[(dv->seg_next - 1) % FC_SEGS] : NULL;
            if (last && last->pid == pid && last->host_pid == host_pid && last->end == start) {
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

/* ---- NVML sampling ----
 * A real driver samples utilisation per fixed period into a buffer that NVML reads.  Here
 * each kernel adds its device time to the windows it overlaps when it is enqueued
 * (account(): exact however many kernels a window holds, where the segment timeline
 * wraps after 65,536 separate kernels), and a window is completed lazily, the first time
 * the state is locked for a launch or an NVML query after it ended.  The result is what
 * a sampler running at the window ends would have recorded. */
static uint32_t percent(uint64_t ns, uint64_t window) {
    uint64_t p = (ns * 100 + window / 2) / window;
    return p > 100 ? 100 : (uint32_t)p;
}

uint64_t fc_sample_ns(void) { return shm->sample_ns; }

void fc_sample_locked(int dev, uint64_t now) {
    struct fc_dev *dv = &shm->dev[dev];
    uint64_t W = shm->sample_ns, cur = now / W; /* cur: the window still running */
    if (dv->win_next >= cur) return;
    uint64_t first = dv->win_next;
    if (cur - first > FC_SAMPLES) first = cur - FC_SAMPLES;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t mono = fc_now();
    uint64_t real = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
    for (uint64_t index = first; index < cur; index++) {
        const struct fc_window_acc *a = &dv->acc[index % FC_SAMPLES];
        int ran = a->index == index;
        struct fc_sample *smp = &dv->samples[index % FC_SAMPLES];
        smp->index = index;
        smp->end_us = ((index + 1) * W + real - mono) / 1000ull;
        smp->gpu_util = ran ? percent(a->total, W) : 0;
        smp->n = 0;
        for (uint32_t j = 0; ran && j < a->n; j++) {
            if (!a->pid[j].ns) continue;
            smp->pid[smp->n].host_pid = a->pid[j].host_pid;
            smp->pid[smp->n].sm_util = percent(a->pid[j].ns, W);
            smp->pid[smp->n].busy_ns = a->pid[j].ns;
            smp->n++;
        }
        /* as the real NVML answered two processes on an H200 (driver 580): the whole
         * window's utilisation to one of those that ran in it, in turn, 0 % to the others
         * (busy_ns stays exact: the tests' measure, not NVML's) */
        if (fc_knobs()->nvml_window_to_one && smp->n > 1)
            for (uint32_t j = 0; j < smp->n; j++)
                smp->pid[j].sm_util = j == index % smp->n ? smp->gpu_util : 0;
    }
    dv->win_next = cur;
}
