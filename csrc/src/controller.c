/* SM limit.
 *
 * Enforcement: a token bucket per device, shared by all processes of the container
 * (header.sm_tokens / sm_refill in the usage state), denominated in nanoseconds of
 * device time. It refills at rate = the container's share of the device
 * (header.sm_rate, permille) and each launch takes its estimated device time
 * before it reaches the driver; a launch that leaves the bucket in debt sleeps
 * until the refill has covered the debt. The work a container can enqueue is
 * therefore paced at its rate, whether it is alone on the device or not.
 *
 * Estimation: a launch costs blocks x ps_per_block (per process; graphs cost
 * kernel nodes x the mean blocks of this process's launches). A controller thread
 * per process reads NVML's per-process utilisation every 100 ms and corrects
 * ps_per_block by the ratio of the device time NVML saw this process use to the
 * time the bucket charged it (geometric gain 1/2). The estimate therefore converges
 * to what the kernels really take, which a grid-size count alone never does.
 * NVML reports host PIDs: pidmap.c maps ours; without a mapping no correction is
 * possible and the shim logs it once.
 *
 * Policies (one rate per container and device, written by one leader process):
 *   fixed    rate = limit.
 *   balance  rate grows into idle capacity (device utilisation < 90 %) and falls
 *            back towards the limit, never below it, when the device saturates.
 *   none     no pacing.
 *   priority: under contention (device saturated while the container gets less
 *            than its rate) a fixed container with priority <= 0 yields, down to
 *            half its limit; priority > 0 holds its limit and, in balance mode,
 *            gives back its burst more slowly. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

int vg_sm_any_limited;

typedef struct sm_dev {
    int active;
    uint64_t ps_per_block;      /* estimate, picoseconds of device time per block */
    uint64_t charged_ns;        /* since the last controller tick (this process) */
    uint64_t blocks;            /* kernel launches' blocks, for the graph estimate */
    uint64_t launches;
    unsigned long long last_seen_us;
    uint64_t last_tick_ns;
    int zero_ticks;
} sm_dev;

static sm_dev devs[VG_MAX_DEVICES];
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;
static int host_pid_cache;
static uint64_t host_pid_next_try;
static pthread_mutex_t host_pid_mu = PTHREAD_MUTEX_INITIALIZER;

#define PS_INITIAL 20000000ull  /* 20 us per block: pessimistic until calibrated */
#define PS_MIN 1000ull
#define PS_MAX 100000000000ull
#define TICK_NS 100000000ull
#define BURST_NS 10000000ull    /* bucket depth: 10 ms of device time at full rate */

static vg_state_header *hdr(void) { return vg_state_header_ptr(); }

void vg_sm_setup(void)
{
    int any = 0;
    vg_state_header *h = hdr();
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        const vg_device_config *c = &vg_cfg.dev[d];
        devs[d].ps_per_block = PS_INITIAL;
        if (vg_cfg.deny || !c->core_limit || c->core_policy == VG_POLICY_NONE) continue;
        devs[d].active = 1;
        any = 1;
        if (h) {
            uint32_t want = c->core_limit * 10;
            uint32_t cur = __atomic_load_n(&h->sm_rate[d], __ATOMIC_ACQUIRE);
            /* first process, or a leftover rate outside what the policy allows */
            if (cur == 0 || (c->core_policy == VG_POLICY_FIXED && cur > want))
                __atomic_store_n(&h->sm_rate[d], want, __ATOMIC_RELEASE);
        }
    }
    __atomic_store_n(&vg_sm_any_limited, any, __ATOMIC_RELEASE);
}

int vg_controller_host_pid(void)
{
    int hp = __atomic_load_n(&host_pid_cache, __ATOMIC_ACQUIRE);
    if (hp > 0) return hp;
    hp = vg_state_own_host_pid(); /* filled in by the plugin? */
    if (hp > 0) {
        __atomic_store_n(&host_pid_cache, hp, __ATOMIC_RELEASE);
        return hp;
    }
    uint64_t now = vg_now_ns();
    if (now < __atomic_load_n(&host_pid_next_try, __ATOMIC_ACQUIRE)) return 0;
    pthread_mutex_lock(&host_pid_mu);
    if (host_pid_cache <= 0 && now >= host_pid_next_try) {
        host_pid_next_try = now + 200000000ull;
        hp = vg_pidmap_host_pid(vg_cfg.host_proc, getpid());
        if (hp > 0) {
            vg_state_set_host_pid(hp);
            __atomic_store_n(&host_pid_cache, hp, __ATOMIC_RELEASE);
            VG_INFO("host pid %d", hp);
        }
    }
    pthread_mutex_unlock(&host_pid_mu);
    return __atomic_load_n(&host_pid_cache, __ATOMIC_ACQUIRE);
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* take cost_ns from the shared bucket; returns how long to wait (ns) */
static uint64_t bucket_take(int d, uint64_t cost_ns)
{
    vg_state_header *h = hdr();
    uint32_t rate = __atomic_load_n(&h->sm_rate[d], __ATOMIC_ACQUIRE);
    if (rate == 0 || rate >= 1000) return 0;
    uint64_t now = vg_now_ns();
    uint64_t last = __atomic_load_n(&h->sm_refill[d], __ATOMIC_ACQUIRE);
    int64_t cap = (int64_t)(BURST_NS * rate / 1000);
    if (now > last &&
        __atomic_compare_exchange_n(&h->sm_refill[d], &last, now, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        uint64_t el = now - last;
        int64_t add = el > 10000000000ull ? cap : (int64_t)(el * rate / 1000);
        int64_t t = __atomic_load_n(&h->sm_tokens[d], __ATOMIC_ACQUIRE), nt;
        do {
            nt = t + add > cap ? cap : t + add;
        } while (!__atomic_compare_exchange_n(&h->sm_tokens[d], &t, nt, 0, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE));
    }
    int64_t left = __atomic_sub_fetch(&h->sm_tokens[d], (int64_t)cost_ns, __ATOMIC_ACQ_REL);
    if (left >= 0) return 0;
    uint64_t wait = (uint64_t)(-left) * 1000 / rate;
    return wait > 1000000000ull ? 1000000000ull : wait;
}

static void *controller_main(void *arg);

static void start_thread(void)
{
    pthread_t t;
    pthread_attr_t a;
    sigset_t all, old;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the workload's signals are not ours */
    if (pthread_create(&t, &a, controller_main, NULL) != 0)
        VG_ERROR("SM controller thread not started: utilisation is not fed back");
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
}

static void charge_ns(CUdevice dev, uint64_t cost)
{
    sm_dev *s = &devs[dev];
    __atomic_add_fetch(&s->charged_ns, cost, __ATOMIC_RELAXED);
    pthread_once(&thread_once, start_thread);
    uint64_t wait = bucket_take(dev, cost);
    if (wait) sleep_ns(wait);
}

void vg_sm_charge(CUdevice dev, uint64_t blocks)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES || !devs[dev].active || !hdr()) return;
    sm_dev *s = &devs[dev];
    __atomic_add_fetch(&s->blocks, blocks, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->launches, 1, __ATOMIC_RELAXED);
    uint64_t ps = __atomic_load_n(&s->ps_per_block, __ATOMIC_RELAXED);
    charge_ns(dev, blocks * ps / 1000);
}

void vg_sm_charge_graph(CUdevice dev, uint64_t kernel_nodes)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES || !devs[dev].active || !hdr()) return;
    sm_dev *s = &devs[dev];
    uint64_t l = __atomic_load_n(&s->launches, __ATOMIC_RELAXED);
    uint64_t mean = l ? __atomic_load_n(&s->blocks, __ATOMIC_RELAXED) / l : 1;
    uint64_t blocks = kernel_nodes * (mean ? mean : 1);
    __atomic_add_fetch(&s->blocks, blocks, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->launches, kernel_nodes, __ATOMIC_RELAXED);
    uint64_t ps = __atomic_load_n(&s->ps_per_block, __ATOMIC_RELAXED);
    charge_ns(dev, blocks * ps / 1000);
}

/* the rate leader: one process per container adjusts sm_rate */
static int am_leader(void)
{
    vg_state_header *h = hdr();
    int me = getpid();
    uint32_t cur = __atomic_load_n(&h->reserved0, __ATOMIC_ACQUIRE);
    if ((int)cur == me) return 1;
    if (cur != 0 && kill((pid_t)cur, 0) == 0) return 0;
    return __atomic_compare_exchange_n(&h->reserved0, &cur, (uint32_t)me, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

static void adjust_rate(int d, unsigned total_util, unsigned container_util)
{
    const vg_device_config *c = &vg_cfg.dev[d];
    vg_state_header *h = hdr();
    double target = c->core_limit * 10.0;
    double rate = __atomic_load_n(&h->sm_rate[d], __ATOMIC_ACQUIRE);
    int saturated = total_util >= 95;
    int starved = saturated && container_util * 10.0 + 20.0 < rate;
    if (c->core_policy == VG_POLICY_BALANCE) {
        if (total_util < 90) rate += (90 - total_util) * 10.0 / 2;
        else if (saturated && rate > target)
            rate = target + (rate - target) * (vg_cfg.priority > 0 ? 0.9 : 0.5);
        if (rate < target) rate = target;
    } else { /* fixed */
        if (starved && vg_cfg.priority <= 0) rate = rate * 0.8;
        else if (!saturated && rate < target) rate += target * 0.2;
        if (rate > target) rate = target;
        if (rate < target / 2) rate = target / 2;
    }
    if (rate > 1000) rate = 1000;
    __atomic_store_n(&h->sm_rate[d], (uint32_t)rate, __ATOMIC_RELEASE);
}

static void tick(int d, int host_pid, int leader)
{
    sm_dev *s = &devs[d];
    nvmlDevice_t h = vg_nvml_device(d);
    uint64_t now = vg_now_ns();
    uint64_t window = s->last_tick_ns ? now - s->last_tick_ns : 0;
    uint64_t charged = __atomic_exchange_n(&s->charged_ns, 0, __ATOMIC_ACQ_REL);
    s->last_tick_ns = now;
    if (!h || !vg_real.nvmlDeviceGetProcessUtilization) return;
    nvmlProcessUtilizationSample_t buf[256];
    unsigned int n = 256;
    nvmlReturn_t r = vg_real.nvmlDeviceGetProcessUtilization(h, buf, &n, s->last_seen_us);
    if (r != NVML_SUCCESS) n = 0;
    unsigned own = 0, total = 0, container = 0;
    int cp[VG_MAX_SLOTS], hp[VG_MAX_SLOTS];
    int m = vg_state_processes(d, cp, hp, NULL, VG_MAX_SLOTS);
    unsigned long long newest = s->last_seen_us;
    for (unsigned i = 0; i < n && i < 256; i++) {
        total += buf[i].smUtil;
        if (host_pid > 0 && (int)buf[i].pid == host_pid) own += buf[i].smUtil;
        for (int j = 0; j < m; j++)
            if (hp[j] > 0 && (unsigned)hp[j] == buf[i].pid) container += buf[i].smUtil;
        if (buf[i].timeStamp > newest) newest = buf[i].timeStamp;
    }
    s->last_seen_us = newest ? newest : now / 1000;
    if (total > 100) total = 100;
    if (window == 0 || window > 4 * TICK_NS) return; /* first tick, or we were stalled */
    if (host_pid > 0 && charged > window / 200 && own == 0) {
        /* NVML sees nothing of a process that launched work: a wrong mapping or a
         * lagging sample. Never calibrate on it (that would unthrottle). */
        if (++s->zero_ticks == 30)
            VG_WARN("NVML shows no utilisation for host pid %d on device %d: is the PID "
                    "mapping right? The SM limit runs on uncalibrated estimates", host_pid, d);
    } else if (host_pid > 0 && charged > window / 200) {
        s->zero_ticks = 0;
        /* calibrate: device time NVML saw vs device time we charged */
        double actual = own / 100.0 * (double)window;
        double ratio = actual / (double)charged;
        if (ratio < 0.25) ratio = 0.25;
        if (ratio > 4) ratio = 4;
        /* far off (start-up, a new kernel mix): jump; close: half steps against noise */
        double step = ratio > 1.5 || ratio < 0.67 ? ratio : sqrt(ratio);
        double ps = (double)__atomic_load_n(&s->ps_per_block, __ATOMIC_RELAXED) * step;
        if (ps < PS_MIN) ps = PS_MIN;
        if (ps > PS_MAX) ps = PS_MAX;
        __atomic_store_n(&s->ps_per_block, (uint64_t)ps, __ATOMIC_RELAXED);
    }
    if (leader) adjust_rate(d, total, container);
}

static void *controller_main(void *arg)
{
    (void)arg;
    vg_tls_guard = 1; /* this thread only calls the real driver */
    int warned = 0;
    uint64_t started = vg_now_ns();
    for (;;) {
        int hp = vg_controller_host_pid();
        if (hp <= 0 && !warned && vg_now_ns() - started > 2000000000ull) {
            VG_WARN("host pid not found (no NSpid mapping, no host_proc match): the SM "
                    "limit runs on uncalibrated estimates");
            warned = 1;
        }
        int leader = am_leader();
        for (int d = 0; d < VG_MAX_DEVICES; d++)
            if (devs[d].active) tick(d, hp, leader);
        sleep_ns(TICK_NS);
    }
    return NULL;
}
