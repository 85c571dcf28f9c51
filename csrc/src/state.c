/* The usage-state file (vgpu_state_abi.h): one per container, in state_dir.
 *
 * Creation is serialised by an OFD fcntl lock on the file (released by the kernel
 * when the holder dies). Everything after that is serialised by the robust,
 * process-shared mutex in the header, held only for a few loads and stores: it is
 * never held across a driver call. Waiting for it is bounded (5 s); a holder that
 * died is detected by the kernel (EOWNERDEAD) and the next locker rebuilds the
 * totals from the slots. Slots of dead processes (pid gone, zombie, or pid reused:
 * start time differs) are reclaimed when a process attaches, when an allocation
 * would fail, and when a holder died; a process that exits normally frees its
 * slot in an atexit handler. The state directory outlives a container that restarts:
 * its new first process has PID 1 again, so a slot holding our own PID is ours only if
 * its start time is ours too (otherwise it is the dead PID 1 of the last run).
 *
 * The limit of a device covers device bytes and spilled bytes together:
 * used + spilled <= memory_limit, and spilled <= spill_limit. */
#define _GNU_SOURCE
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

#include "shim.h"

_Static_assert(sizeof(pthread_mutex_t) <= VG_LOCK_BYTES, "mutex fits the header");

static vg_state_file *st;      /* the mapping (shared file or process-local) */
static int st_shared;
static int my_slot = -1;
static int my_pid;
static uint64_t my_start; /* our /proc/self/stat starttime */
VG_MUTEX(slot_mu);

#define A_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define A_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define A_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_ACQ_REL)
#define A_SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_ACQ_REL)

uint64_t vg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t vg_realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* a slot's last update: a few ms of resolution serve a reader that counts seconds, and
 * reading it costs a few ns, not a full clock read, on every allocation and free */
static uint64_t seen_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* starttime (field 22) of /proc/<pid>/stat; 0 if unknown. *zombie set for state Z/X */
static uint64_t proc_start_time(int pid, int *zombie)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (zombie) *zombie = 0;
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the comm field may contain spaces */
    if (!p || p[1] != ' ') return 0;
    p += 2;
    if (zombie) *zombie = (*p == 'Z' || *p == 'X');
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

/* This process's own description of the state file, holding its slot's lock byte (-1:
 * none, slots judged by PID alone); a forked child opens its own (lock_fd_pid). */
static int lock_fd = -1;
static int lock_fd_pid;
static char state_path[600];

static int lock_byte(int fd, int slot, short type, int cmd, struct flock *out)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET,
                       .l_start = VG_SLOT_LOCK_BASE + slot, .l_len = 1};
    int r = fcntl(fd, cmd, &fl);
    if (out) *out = fl;
    return r;
}

/* the lock fd of this process (opened again in a forked child: a description shared with
 * the parent would keep the parent's slot alive while the child lives, and the child's
 * lock would be the parent's too) */
static int own_lock_fd(void)
{
    int me = getpid();
    if (lock_fd >= 0 && lock_fd_pid == me) return lock_fd;
    if (!st_shared || !state_path[0]) return -1;
    if (lock_fd >= 0) close(lock_fd); /* the parent's description, inherited: not ours */
    lock_fd = open(state_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    lock_fd_pid = me;
    return lock_fd;
}

static int slot_dead(const vg_state_slot *s, int index)
{
    int pid = A_LOAD(&s->pid);
    if (pid <= 0) return 0;
    if (index == my_slot && pid == my_pid) return 0; /* us */
    if (A_LOAD(&s->flags) & VG_SLOT_LOCKED) {
        /* alive while someone holds its byte; our own description's locks never conflict
         * (F_OFD_GETLK), so a slot we hold reads as free: only ours is that, checked above */
        struct flock fl;
        int fd = own_lock_fd();
        if (fd >= 0 && lock_byte(fd, index, F_WRLCK, F_OFD_GETLK, &fl) == 0)
            return fl.l_type == F_UNLCK;
    }
    if (pid == my_pid) { /* us, or a dead process of an earlier run with our PID */
        uint64_t rec = A_LOAD(&s->start_time);
        return rec && my_start && rec != my_start;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    int zombie = 0;
    uint64_t start = proc_start_time(pid, &zombie);
    if (zombie) return 1;
    uint64_t rec = A_LOAD(&s->start_time);
    return start && rec && start != rec; /* pid reused by another process */
}

/* Drop a slot's usage from the totals and free it. Caller holds the lock. */
static void release_slot_locked(vg_state_slot *s)
{
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        uint64_t u = A_LOAD(&s->used[d]), sp = A_LOAD(&s->spilled[d]);
        uint64_t hu = A_LOAD(&st->header.used[d]), hs = A_LOAD(&st->header.spilled[d]);
        A_STORE(&st->header.used[d], hu >= u ? hu - u : 0);
        A_STORE(&st->header.spilled[d], hs >= sp ? hs - sp : 0);
        A_STORE(&s->used[d], 0);
        A_STORE(&s->context[d], 0);
        A_STORE(&s->spilled[d], 0);
    }
    A_STORE(&s->host_pid, 0);
    A_STORE(&s->start_time, 0);
    A_STORE(&s->flags, 0);
    A_STORE(&s->pid, 0);
    A_ADD(&st->header.generation, 1);
}

static int reclaim_locked(void)
{
    int n = 0;
    for (int i = 0; i < VG_MAX_SLOTS; i++) {
        vg_state_slot *s = &st->slots[i];
        if (A_LOAD(&s->pid) > 0 && slot_dead(s, i)) {
            VG_INFO("reclaiming usage of dead process %d", A_LOAD(&s->pid));
            release_slot_locked(s);
            n++;
        }
    }
    return n;
}

/* After a holder died mid-update: totals := sum of the (live) slots. */
static void repair_locked(void)
{
    reclaim_locked();
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        uint64_t u = 0, sp = 0;
        for (int i = 0; i < VG_MAX_SLOTS; i++) {
            if (A_LOAD(&st->slots[i].pid) <= 0) continue;
            u += A_LOAD(&st->slots[i].used[d]);
            sp += A_LOAD(&st->slots[i].spilled[d]);
        }
        A_STORE(&st->header.used[d], u);
        A_STORE(&st->header.spilled[d], sp);
    }
    A_ADD(&st->header.generation, 1);
}

static int lock_state(void)
{
    pthread_mutex_t *m = (pthread_mutex_t *)st->header.lock;
    /* uncontended (most calls): no deadline to read the clock for */
    int r = pthread_mutex_trylock(m);
    if (r == EBUSY) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 5;
        r = pthread_mutex_timedlock(m, &dl);
    }
    if (r == 0 || r == EOWNERDEAD) vg_tls_locks++;
    if (r == EOWNERDEAD) {
        VG_WARN("a process died holding the usage-state lock: rebuilding totals");
        repair_locked();
        pthread_mutex_consistent(m);
        return 0;
    }
    if (r != 0) {
        VG_ERROR("usage-state lock not acquired (%s)", strerror(r));
        return -1;
    }
    return 0;
}

static void unlock_state(void)
{
    vg_tls_locks--;
    pthread_mutex_unlock((pthread_mutex_t *)st->header.lock);
}

static void init_header(vg_state_file *f, int shared)
{
    memset(&f->header, 0, sizeof f->header);
    f->header.version = VG_STATE_VERSION;
    f->header.header_size = VG_HEADER_SIZE;
    f->header.slot_size = VG_SLOT_SIZE;
    f->header.max_slots = VG_MAX_SLOTS;
    f->header.max_devices = VG_MAX_DEVICES;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    if (shared) pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init((pthread_mutex_t *)f->header.lock, &a);
    pthread_mutexattr_destroy(&a);
    __atomic_store_n(&f->header.magic, VG_STATE_MAGIC, __ATOMIC_RELEASE);
}

static int ofd_lock(int fd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    uint64_t deadline = vg_now_ns() + 5000000000ull;
    for (;;) {
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) return -1;
        if (vg_now_ns() > deadline) return -1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static vg_state_file *map_shared(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, VG_STATE_FILE);
    snprintf(state_path, sizeof state_path, "%s", path);
    /* the container can write here: a link (to anywhere, or to a file of its own per
     * process), a FIFO or a directory in the file's place is refused, not followed */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0) {
        VG_ERROR("cannot open usage state %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat first;
    if (fstat(fd, &first) != 0 || !S_ISREG(first.st_mode)) {
        VG_ERROR("usage state %s is not a regular file", path);
        close(fd);
        return NULL;
    }
    if (ofd_lock(fd, F_WRLCK) != 0) {
        VG_ERROR("cannot lock usage state %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    struct stat sb;
    vg_state_file *f = NULL;
    if (fstat(fd, &sb) != 0) goto out;
    if ((size_t)sb.st_size < sizeof(vg_state_file)) {
        if (ftruncate(fd, sizeof(vg_state_file)) != 0) goto out;
        (void)fchmod(fd, 0666); /* every user of the container shares it */
    }
    void *m = mmap(NULL, sizeof(vg_state_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) goto out;
    f = m;
    uint64_t magic = __atomic_load_n(&f->header.magic, __ATOMIC_ACQUIRE);
    if (magic == 0) {
        init_header(f, 1);
    } else if (magic != VG_STATE_MAGIC || f->header.version != VG_STATE_VERSION ||
               f->header.header_size != VG_HEADER_SIZE || f->header.slot_size != VG_SLOT_SIZE ||
               f->header.max_slots != VG_MAX_SLOTS) {
        VG_ERROR("usage state %s has an unknown layout; not shared with it", path);
        munmap(m, sizeof(vg_state_file));
        f = NULL;
    }
out:
    if (!f) VG_ERROR("usage state %s unusable: %s", path, strerror(errno));
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    fcntl(fd, F_OFD_SETLK, &fl);
    close(fd); /* the mapping stays */
    return f;
}

static void on_exit_release(void)
{
    if (!st || my_slot < 0 || my_pid != getpid()) return;
    if (lock_state() == 0) {
        release_slot_locked(&st->slots[my_slot]);
        unlock_state();
    }
    if (lock_fd >= 0 && lock_fd_pid == my_pid) lock_byte(lock_fd, my_slot, F_UNLCK, F_OFD_SETLK, NULL);
    my_slot = -1;
}

static void after_fork_child(void)
{
    /* the child is a new process: it must not charge its parent's slot */
    my_slot = -1;
    my_pid = getpid();
    my_start = proc_start_time(my_pid, NULL);
}

static void take_slot(void)
{
    if (my_slot >= 0 || !st) return;
    vg_lock(&slot_mu);
    if (my_slot < 0 && lock_state() == 0) {
        reclaim_locked();
        int fd = own_lock_fd();
        for (int i = 0; i < VG_MAX_SLOTS; i++) {
            vg_state_slot *s = &st->slots[i];
            if (A_LOAD(&s->pid) != 0) continue;
            /* its byte: held by someone alive means a slot freed under a live process
             * (written by hand): not ours to take */
            int locked = fd >= 0 && lock_byte(fd, i, F_WRLCK, F_OFD_SETLK, NULL) == 0;
            if (fd >= 0 && !locked) continue;
            memset(s->used, 0, sizeof s->used);
            memset(s->context, 0, sizeof s->context);
            memset(s->spilled, 0, sizeof s->spilled);
            A_STORE(&s->start_time, my_start);
            A_STORE(&s->last_seen, seen_ns());
            A_STORE(&s->host_pid, 0);
            A_STORE(&s->flags, locked ? VG_SLOT_LOCKED : 0u);
            A_STORE(&s->pid, my_pid);
            A_ADD(&st->header.generation, 1);
            my_slot = i;
            break;
        }
        unlock_state();
        if (my_slot < 0)
            VG_ERROR("usage state full (%d processes): allocations are refused", VG_MAX_SLOTS);
    }
    vg_unlock(&slot_mu);
}

int vg_state_attach(const vg_config *cfg)
{
    my_pid = getpid();
    my_start = proc_start_time(my_pid, NULL);
    if (cfg->state_dir[0]) {
        st = map_shared(cfg->state_dir);
        st_shared = st != NULL;
    }
    if (!st) {
        void *m = mmap(NULL, sizeof(vg_state_file), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return -1;
        st = m;
        init_header(st, 0);
        if (cfg->source == VG_SRC_FILE && !cfg->deny && !cfg->state_dir[0])
            VG_WARN("no shared usage state: limits apply to this process alone");
    }
    /* the limits are informational in the file (each process enforces its own
     * config, which is the same file for the whole container) */
    if (lock_state() == 0) {
        st->header.device_count = (uint32_t)(cfg->device_count > VG_MAX_DEVICES
                                                 ? VG_MAX_DEVICES : cfg->device_count);
        for (int d = 0; d < VG_MAX_DEVICES; d++) {
            A_STORE(&st->header.limit[d], cfg->dev[d].memory_limit);
            A_STORE(&st->header.core_limit[d], cfg->dev[d].core_limit);
        }
        reclaim_locked();
        unlock_state();
    }
    take_slot();
    pthread_atfork(NULL, NULL, after_fork_child);
    atexit(on_exit_release);
    return st_shared ? 0 : 1;
}

static uint64_t limit_of(int dev) { return vg_cfg.dev[dev].memory_limit; }

int vg_state_over_limit(int dev, uint64_t more)
{
    uint64_t limit = dev < 0 || dev >= VG_MAX_DEVICES ? 0 : limit_of(dev);
    return limit && vg_state_used(dev) + vg_state_spilled(dev) + more > limit;
}

int vg_state_charge(int dev, uint64_t bytes, int kind, int flags)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES || !st) return (flags & VG_CHARGE_FORCE) ? 0 : -1;
    if (vg_cfg.deny && !(flags & VG_CHARGE_FORCE)) return -1;
    if (my_slot < 0) take_slot();
    if (my_slot < 0) return -1;
    vg_state_slot *s = &st->slots[my_slot];
    if (lock_state() != 0) return -1;
    uint64_t limit = limit_of(dev);
    int ok = 1;
    if (!(flags & VG_CHARGE_FORCE)) {
        for (int pass = 0; pass < 2; pass++) {
            uint64_t total = A_LOAD(&st->header.used[dev]) + A_LOAD(&st->header.spilled[dev]);
            ok = vg_budget_fits(total, bytes, limit);
            if (ok && kind == VG_KIND_SPILL) { /* spill_limit 0: no spilling at all */
                uint64_t cap = vg_cfg.dev[dev].spill_limit;
                ok = cap && vg_budget_fits(A_LOAD(&st->header.spilled[dev]), bytes, cap);
            }
            if (ok || pass || reclaim_locked() == 0) break;
        }
    }
    if (ok) {
        if (kind == VG_KIND_SPILL) {
            A_ADD(&st->header.spilled[dev], bytes);
            A_ADD(&s->spilled[dev], bytes);
        } else {
            A_ADD(&st->header.used[dev], bytes);
            A_ADD(&s->used[dev], bytes);
            if (flags & VG_CHARGE_CONTEXT) A_ADD(&s->context[dev], bytes);
        }
        A_STORE(&s->last_seen, seen_ns());
        A_ADD(&st->header.generation, 1);
    }
    unlock_state();
    return ok ? 0 : -1;
}

void vg_state_uncharge(int dev, uint64_t bytes, int kind)
{
    if (!st || my_slot < 0 || dev < 0 || dev >= VG_MAX_DEVICES || bytes == 0) return;
    vg_state_slot *s = &st->slots[my_slot];
    uint64_t *slot_ctr = kind == VG_KIND_SPILL ? &s->spilled[dev] : &s->used[dev];
    uint64_t *hdr_ctr = kind == VG_KIND_SPILL ? &st->header.spilled[dev] : &st->header.used[dev];
    int locked = lock_state() == 0; /* a free is never lost, lock or not */
    uint64_t have = A_LOAD(slot_ctr);
    if (bytes > have) bytes = have;
    A_SUB(slot_ctr, bytes);
    A_SUB(hdr_ctr, bytes);
    if (kind != VG_KIND_SPILL) {
        uint64_t ctx = A_LOAD(&s->context[dev]), used = A_LOAD(&s->used[dev]);
        if (ctx > used) A_STORE(&s->context[dev], used); /* context <= used */
    }
    A_STORE(&s->last_seen, seen_ns());
    A_ADD(&st->header.generation, 1);
    if (locked) unlock_state();
}

void vg_state_uncharge_context(int dev, uint64_t bytes)
{
    if (!st || my_slot < 0 || dev < 0 || dev >= VG_MAX_DEVICES) return;
    uint64_t *c = &st->slots[my_slot].context[dev];
    uint64_t have = A_LOAD(c);
    A_STORE(c, bytes > have ? 0 : have - bytes);
    vg_state_uncharge(dev, bytes, VG_KIND_DEVICE);
}

uint64_t vg_state_used(int dev)
{
    if (!st || dev < 0 || dev >= VG_MAX_DEVICES) return 0;
    return A_LOAD(&st->header.used[dev]);
}

uint64_t vg_state_spilled(int dev)
{
    if (!st || dev < 0 || dev >= VG_MAX_DEVICES) return 0;
    return A_LOAD(&st->header.spilled[dev]);
}

uint64_t vg_state_own_used(int dev)
{
    if (!st || my_slot < 0 || dev < 0 || dev >= VG_MAX_DEVICES) return 0;
    return A_LOAD(&st->slots[my_slot].used[dev]);
}

int vg_state_own_slot(void) { return my_slot; }
uint64_t vg_state_own_start(void) { return my_start; }

vg_state_header *vg_state_header_ptr(void) { return st ? &st->header : NULL; }

void vg_state_set_host_pid(int host_pid)
{
    if (my_slot < 0) take_slot();
    if (st && my_slot >= 0) A_STORE(&st->slots[my_slot].host_pid, host_pid);
}

int vg_state_own_host_pid(void)
{
    if (!st || my_slot < 0) return 0;
    return A_LOAD(&st->slots[my_slot].host_pid);
}

/* Memory NVML counts for another process of the container beyond what its slot is
 * charged (pids[i], bytes[i]: NVML's list, by host PID or, by_ns_pid, by the PIDs of our
 * namespace) is charged to that slot now, forced, and noted in its adopted[] (see
 * vgpu_state_abi.h). Called where memory is known to move between processes at once. */
void vg_state_adopt(int dev, const int *pids, const uint64_t *bytes, int n, int by_ns_pid)
{
    if (!st || dev < 0 || dev >= VG_MAX_DEVICES || lock_state() != 0) return;
    for (int i = 0; i < VG_MAX_SLOTS; i++) {
        vg_state_slot *s = &st->slots[i];
        int key = by_ns_pid ? A_LOAD(&s->pid) : A_LOAD(&s->host_pid);
        if (i == my_slot || A_LOAD(&s->pid) <= 0 || key <= 0) continue;
        for (int j = 0; j < n; j++) {
            uint64_t used = A_LOAD(&s->used[dev]);
            if (pids[j] != key || bytes[j] <= used) continue;
            uint64_t units = (bytes[j] - used) >> 16;
            if (!units) break;
            A_ADD(&st->header.used[dev], units << 16);
            A_ADD(&s->used[dev], units << 16);
            A_ADD(&s->adopted[dev], (uint32_t)units);
            A_ADD(&st->header.generation, 1);
            break;
        }
    }
    unlock_state();
}

/* What other processes charged to this one (vg_state_adopt), taken: bytes. */
uint64_t vg_state_take_adopted(int dev)
{
    if (!st || my_slot < 0 || dev < 0 || dev >= VG_MAX_DEVICES) return 0;
    uint32_t units = __atomic_exchange_n(&st->slots[my_slot].adopted[dev], 0, __ATOMIC_ACQ_REL);
    return (uint64_t)units << 16;
}

/* Copies (container pid, host pid, used on dev) of live slots. */
int vg_state_processes(int dev, int *cpids, int *hpids, uint64_t *used, int max)
{
    int n = 0;
    if (!st) return 0;
    for (int i = 0; i < VG_MAX_SLOTS && n < max; i++) {
        vg_state_slot *s = &st->slots[i];
        int pid = A_LOAD(&s->pid);
        if (pid <= 0) continue;
        if (cpids) cpids[n] = pid;
        if (hpids) hpids[n] = A_LOAD(&s->host_pid);
        if (used) used[n] = dev >= 0 && dev < VG_MAX_DEVICES ? A_LOAD(&s->used[dev]) : 0;
        n++;
    }
    return n;
}

void vg_state_reclaim(void)
{
    if (st && lock_state() == 0) {
        reclaim_locked();
        unlock_state();
    }
}
