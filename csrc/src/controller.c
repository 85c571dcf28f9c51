/* SM limit.
 *
 * Enforcement: a token bucket per device, shared by every process of the container
 * (header.sm_tokens / sm_refill in the usage state), counted in nanoseconds of device
 * time and refilled at the container's rate (permille of the device). Every launch takes
 * its estimated device time before it reaches the driver; a launch that leaves the
 * bucket more than SLEEP_MIN_NS in debt sleeps until the refill has covered it. The debt
 * is bounded (DEBT_DEPTHS bucket depths) and so, therefore, is any one sleep: a wrong
 * estimate can slow a workload, never stall it. The work a container can enqueue is
 * paced at its rate whether it is alone on the device or not.
 *
 * What the container can write decides nothing. The usage state is the container's to
 * write (any of its processes can map it), so the rate is each process's own, derived
 * from the read-only config and the node's read-only arbitration record: header.sm_rate
 * is only a report of it. A forged shared bucket (tokens written full in a loop) is met
 * by a second bucket, private to the process, at the same rate: no process launches
 * faster than its container may, whatever the shared state says; forged tokens are
 * clamped to the bucket's depth.
 *
 * Estimation: a launch costs waves x ns_per_wave, with waves = ceil(blocks / SMs) (at
 * least 1): a grid's blocks run in parallel on the SMs, so its time grows with its waves,
 * not its blocks; a graph costs its kernel nodes x this process's mean waves. The shim
 * cannot know what a kernel does, so ns_per_wave is learnt, per process and device:
 *
 *   - it starts optimistic (INITIAL_PS): too low an estimate lets a new process run
 *     fast for a fraction of a second; too high a one throttles it to nothing;
 *   - a controller thread reads NVML's per-process utilisation. Each sample covers the
 *     interval since the previous one (lastSeenTimeStamp .. the sample's timestamp,
 *     CPU time in microseconds); the device time NVML saw this process use there is
 *     compared with the device time the bucket charged it over the same interval
 *     (kept in 10 ms bins), and ns_per_wave moves by that ratio: in one step when it is
 *     far off, in half steps (the square root) when close, against the noise of
 *     integer-percent samples;
 *   - a sample of 0 % is a measurement too, once the host PID is known (pidmap.c): a
 *     throttled process shows 0 %, and that is the sign its estimate is too high;
 *   - a real NVML gives a sampling window of several processes wholly to one of them
 *     and lists no row for the others: where that is seen, spans are 2 s, so that every
 *     process's turns even out.
 * NVML names processes by host PID; without one no calibration is possible and the
 * shim says so once.
 *
 * Policies (one rate per container and device, each process computing it alike):
 *   fixed    rate = limit, alone or shared.
 *   balance  rate grows into idle capacity (device utilisation < 90 %) and falls back
 *            towards the limit, never below it, when the device saturates.
 *   none     no pacing.
 * Priority across containers (arbiter.c): the plugin publishes, per GPU, the highest
 * priority active there. While it is higher than this container's, each process holds
 * the rate at the record's floor (a few per cent: zero would starve the container's
 * heartbeats and collective timeouts, and it must still make progress); when it
 * drops, the rate returns at once to the policy's value. A container with no SM limit
 * of its own is paced only while it is held. Without a record (standalone, or the
 * plugin stopped publishing) priority has no effect: it is relative to the others,
 * which only the node can see. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

int vg_sm_any_limited;

#define INITIAL_PS 1000000ull       /* 1 us per wave: optimistic until NVML says otherwise */
#define PS_MIN 1000ull              /* 1 ns per wave */
#define PS_MAX 10000000000000ull    /* 10 s per wave */
#define TICK_NS 50000000ull         /* the controller looks for new samples every 50 ms */
#define DEPTH_NS 50000000ull        /* bucket depth: 50 ms of device time at full rate */
#define DEBT_DEPTHS 4               /* the bucket never owes more than 4 depths */
#define SLEEP_MIN_NS 1000000ull     /* debts below 1 ms of device time wait for more */
#define REFILL_NS 20000ull          /* the bucket is refilled at most every 20 us */
#define BIN_NS 10000000ull          /* charged device time is kept in 10 ms bins ... */
#define BINS 512                    /* ... for the last 5 s */
#define LONG_SEEN_NS 5000000ull     /* 5 ms seen on the GPU: a measure, not noise */
#define SPAN_LAUNCHES 4             /* calibrate over at least 4 launches ... */
#define SPAN_MIN_NS 150000000ull    /* ... and 150 ms, */
#define SPAN_MAX_NS 2000000000ull   /* or 2 s whatever was launched */
#define SHARED_FOR_NS 5000000000ull /* NVML gave a window to one process: SPAN_MAX_NS spans */
#define PERIOD_MAX_NS 1000000000ull /* NVML samples at least every second */
#define STEP_MAX 1000.0             /* the largest step up, over a whole span */
#define FIRST_STEP_MAX 1000000.0    /* ... and the first one, from the starting estimate */
#define WHOLE_STEPS 3               /* the first steps are whole, whatever the ratio */
#define OVERWHELMING 16             /* seen > 16 x charged at the start: one launch will do */
#define OWN_COST_MAX_NS 1000000000ull /* one launch's own cost is paid up to 1 s */
#define SHARED_DEBT_NS 4000000000ull  /* the container's bucket owes up to 4 s of waiting */

typedef struct sm_dev {
    uint32_t rate;                  /* this process's rate, permille (0: unpaced) */
    int64_t tokens;                 /* the private bucket (this process alone) */
    uint64_t refill;
    int active;                     /* paced: limited, or following the arbiter */
    int limited;                    /* has an SM limit of its own (fixed / balance) */
    int held;                       /* held at the arbiter's floor */
    int sms;                        /* multiprocessors, for waves; 0 until known */
    uint64_t ps_per_wave;           /* estimate, picoseconds of device time per wave */
    uint64_t waves, launches;       /* for the graph estimate */
    uint64_t bin_index[BINS];       /* which 10 ms bin each slot holds */
    uint64_t bin_ns[BINS];          /* device ns charged in it (this process) */
    uint64_t bin_n[BINS];           /* launches in it */
    uint64_t span_seen, span_charged, span_launches, span_ns; /* calibration's evidence */
    unsigned long long last_seen_us;/* NVML: the end of the interval measured last */
    int misses;                     /* consecutive ticks of NOT_FOUND while charging */
    uint64_t period_ns;             /* NVML's sample period, as the last two samples showed */
    int calibrated;                 /* steps taken from INITIAL_PS, up to WHOLE_STEPS */
    uint64_t shared_at;             /* when NVML last gave a sibling a window this process
                                     * ran in (CLOCK_MONOTONIC ns; 0: never) */
} sm_dev;

static sm_dev devs[VG_MAX_DEVICES];
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;

static vg_state_header *hdr(void) { return vg_state_header_ptr(); }

void vg_sm_setup(void)
{
    int any = 0;
    vg_state_header *h = hdr();
    for (int d = 0; d < VG_MAX_DEVICES; d++) {
        const vg_device_config *c = &vg_cfg.dev[d];
        devs[d].ps_per_wave = INITIAL_PS;
        if (vg_cfg.deny) continue;
        devs[d].limited = c->core_limit && c->core_policy != VG_POLICY_NONE;
        if (!devs[d].limited && !vg_arbiter_present(d)) continue;
        devs[d].active = 1;
        any = 1;
        uint32_t want = devs[d].limited ? c->core_limit * 10 : 1000;
        __atomic_store_n(&devs[d].rate, want, __ATOMIC_RELEASE);
        if (h) __atomic_store_n(&h->sm_rate[d], want, __ATOMIC_RELEASE); /* a report */
    }
    __atomic_store_n(&vg_sm_any_limited, any, __ATOMIC_RELEASE);
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* take cost_ns from the bucket (tokens, refill) at time now, refilled at rate permille,
 * owing at most debt_wall_ns of waiting (or DEBT_DEPTHS depths, if more); returns how
 * long to wait (ns) */
static uint64_t bucket_take(int64_t *tokens, uint64_t *refill, uint32_t rate, uint64_t cost_ns,
                            uint64_t now, uint64_t debt_wall_ns)
{
    int64_t depth = (int64_t)(DEPTH_NS * rate / 1000), floor = -DEBT_DEPTHS * depth;
    /* a launch that costs more than the depth may save up one launch's worth: on a busy
     * device it waits behind the others' work while the bucket refills, and a depth below
     * its cost threw that time away (four processes' 50 ms kernels under 39 % beside
     * unthrottled neighbours got 34.5) */
    int64_t cap = depth;
    if ((int64_t)cost_ns > cap) cap = (int64_t)(cost_ns < OWN_COST_MAX_NS ? cost_ns : OWN_COST_MAX_NS);
    int64_t wall = -(int64_t)(debt_wall_ns * rate / 1000);
    if (wall < floor) floor = wall;
    /* the debt past the floor is forgiven, but never a launch's own cost: a kernel
     * longer than the floor would otherwise run at more than its rate */
    int64_t own = -(int64_t)(cost_ns < OWN_COST_MAX_NS ? cost_ns : OWN_COST_MAX_NS);
    if (own < floor) floor = own;
    uint64_t last = __atomic_load_n(refill, __ATOMIC_ACQUIRE);
    if (now > last + REFILL_NS && /* one shared write per launch, not three */
        __atomic_compare_exchange_n(refill, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        uint64_t el = now - last;
        int64_t add = el > 10000000000ull ? cap : (int64_t)(el * rate / 1000);
        int64_t t = __atomic_load_n(tokens, __ATOMIC_ACQUIRE), nt;
        do { /* a credit past the depth (forged, or left by a higher rate) is cut to it */
            nt = t > cap - add ? cap : t + add;
        } while (!__atomic_compare_exchange_n(tokens, &t, nt, 0, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE));
    }
    int64_t left = __atomic_sub_fetch(tokens, (int64_t)cost_ns, __ATOMIC_ACQ_REL);
    if (left > cap) left = cap; /* written since the refill: never more than the depth */
    if (left < floor) { /* a debt past the floor is forgiven, not waited for */
        int64_t t = left;
        while (t < floor && !__atomic_compare_exchange_n(tokens, &t, floor, 0,
                                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
        left = floor;
    }
    if (left >= -(int64_t)SLEEP_MIN_NS * (int64_t)rate / 1000) return 0;
    return (uint64_t)(-left) * 1000 / rate;
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

/* The launch path's clock: coarse (a few ms resolution, a few ns to read) is enough
 * for 10 ms bins and a bucket refilled every 20 us or more. */
static uint64_t coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t waves_of(int d, uint64_t blocks)
{
    sm_dev *s = &devs[d];
    int sms = __atomic_load_n(&s->sms, __ATOMIC_RELAXED);
    if (!sms) {
        int ordinal = vg_dev_ordinal(d), v = 0;
        if (ordinal >= 0 && vg_real.cuDeviceGetAttribute &&
            vg_real.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                         ordinal) == CUDA_SUCCESS && v > 0)
            sms = v;
        else
            sms = 1; /* unknown: a block is a wave */
        __atomic_store_n(&s->sms, sms, __ATOMIC_RELAXED);
    }
    if (blocks <= (uint64_t)sms) return 1; /* most launches: no division */
    return (blocks + (uint64_t)sms - 1) / (uint64_t)sms;
}

static void charge_waves(int d, uint64_t waves)
{
    sm_dev *s = &devs[d];
    pthread_once(&thread_once, start_thread);
    uint64_t ps = __atomic_load_n(&s->ps_per_wave, __ATOMIC_RELAXED);
    uint64_t cost = waves > UINT64_MAX / ps ? UINT64_MAX / 1000 : waves * ps / 1000;
    uint64_t now = coarse_ns(), bin = now / BIN_NS;
    uint64_t *slot = &s->bin_index[bin % BINS];
    if (__atomic_load_n(slot, __ATOMIC_RELAXED) != bin) { /* a new bin: start it at 0 */
        __atomic_store_n(&s->bin_ns[bin % BINS], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->bin_n[bin % BINS], 0, __ATOMIC_RELAXED);
        __atomic_store_n(slot, bin, __ATOMIC_RELEASE);
    }
    __atomic_add_fetch(&s->bin_ns[bin % BINS], cost, __ATOMIC_RELAXED);
    /* the count only opens calibration (SPAN_LAUNCHES): an increment lost between two
     * launching threads is harmless there, a second locked add on every launch is not */
    __atomic_store_n(&s->bin_n[bin % BINS],
                     __atomic_load_n(&s->bin_n[bin % BINS], __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
    uint32_t rate = __atomic_load_n(&s->rate, __ATOMIC_ACQUIRE);
    if (rate == 0 || rate >= 1000) return;
    vg_state_header *h = hdr();
    /* the shared bucket owes up to SHARED_DEBT_NS of waiting: its debt is every
     * process's, and a floor of a few depths forgave one process what the others owed
     * (four processes launching 50 ms kernels under 21 % ran at 84 %) */
    uint64_t shared = bucket_take(&h->sm_tokens[d], &h->sm_refill[d], rate, cost, now,
                                  SHARED_DEBT_NS);
    uint64_t own = bucket_take(&s->tokens, &s->refill, rate, cost, now, 0);
    uint64_t wait = shared > own ? shared : own;
    if (wait) sleep_ns(wait);
}

void vg_sm_charge(CUdevice dev, uint64_t blocks)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES || !devs[dev].active || !hdr()) return;
    sm_dev *s = &devs[dev];
    uint64_t waves = waves_of(dev, blocks);
    /* only a mean for the graph estimate: a lost update between threads is harmless,
     * a locked add on every launch is not free */
    __atomic_store_n(&s->waves, __atomic_load_n(&s->waves, __ATOMIC_RELAXED) + waves,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&s->launches, __atomic_load_n(&s->launches, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
    charge_waves(dev, waves);
}

void vg_sm_charge_graph(CUdevice dev, uint64_t kernel_nodes)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES || !devs[dev].active || !hdr()) return;
    sm_dev *s = &devs[dev];
    uint64_t l = __atomic_load_n(&s->launches, __ATOMIC_RELAXED);
    uint64_t mean = l ? __atomic_load_n(&s->waves, __ATOMIC_RELAXED) / l : 1;
    charge_waves(dev, kernel_nodes * (mean ? mean : 1));
}

/* device ns this process was charged in [t0, t1) of CLOCK_MONOTONIC (and, if asked, how
 * many launches took it) */
static uint64_t charged_between(const sm_dev *s, uint64_t t0, uint64_t t1, uint64_t *launches)
{
    double sum = 0, n = 0;
    for (uint64_t b = t0 / BIN_NS; b * BIN_NS < t1; b++) {
        if (__atomic_load_n(&s->bin_index[b % BINS], __ATOMIC_ACQUIRE) != b) continue;
        uint64_t lo = b * BIN_NS > t0 ? b * BIN_NS : t0, hi = (b + 1) * BIN_NS < t1 ? (b + 1) * BIN_NS : t1;
        double part = (double)(hi - lo) / (double)BIN_NS;
        sum += (double)__atomic_load_n(&s->bin_ns[b % BINS], __ATOMIC_RELAXED) * part;
        n += (double)__atomic_load_n(&s->bin_n[b % BINS], __ATOMIC_RELAXED) * part;
    }
    if (launches) *launches = (uint64_t)(n + 0.5);
    return (uint64_t)sum;
}

/* the reporter: one process per container writes its rate into the usage state for the
 * node's metrics (a report; no process reads it back) */
static int am_reporter(void)
{
    vg_state_header *h = hdr();
    int me = getpid();
    uint32_t cur = __atomic_load_n(&h->reserved0, __ATOMIC_ACQUIRE);
    if ((int)cur == me) return 1;
    if (cur != 0 && kill((pid_t)cur, 0) == 0) return 0;
    return __atomic_compare_exchange_n(&h->reserved0, &cur, (uint32_t)me, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

/* the policy's rate from this process's own view of the device (every process of the
 * container computes it alike from NVML; none takes it from the shared state) */
static void adjust_rate(int d, unsigned total_util, unsigned container_util)
{
    const vg_device_config *c = &vg_cfg.dev[d];
    double target = c->core_limit * 10.0;
    double rate = __atomic_load_n(&devs[d].rate, __ATOMIC_ACQUIRE);
    int saturated = total_util >= 95;
    if (c->core_policy == VG_POLICY_BALANCE) {
        if (total_util < 90) rate += (90 - total_util) * 10.0 / 2;
        else if (saturated && rate > target) rate = target + (rate - target) * 0.25;
        if (rate < target) rate = target;
    } else { /* fixed: the limit, alone or shared */
        rate = target;
    }
    if (rate > 1000) rate = 1000;
    VG_DEBUG("sm dev %d: device %u%%, container %u%%, rate %.0f permille", d, total_util,
             container_util, rate);
    __atomic_store_n(&devs[d].rate, (uint32_t)rate, __ATOMIC_RELEASE);
}

static void calibrate(sm_dev *s, uint64_t measured, uint64_t charged)
{
    /* too little charged (< 0.1 ms) to tell anything, unless the GPU saw this process
     * busy for far longer: kernels so long that a span of launches charged microseconds
     * at the starting estimate (100 ms kernels ran unlimited). The span covers several
     * launches, so the whole step is taken at once (bounded), not four-fold a tick. */
    int long_kernels = charged > 0 && measured >= LONG_SEEN_NS && measured > 4 * charged;
    if (charged < 100000 && !long_kernels) return;
    double ratio = (double)measured / (double)charged;
    if (ratio < 0.25) ratio = 0.25;
    if (ratio > 4 && !long_kernels) ratio = 4;
    /* the first step from the starting estimate may go as far as 1 us to 1 s a wave; any
     * later one is bounded (a span's edge can cut a launch's charge to a sliver) */
    double most = s->calibrated ? STEP_MAX : FIRST_STEP_MAX;
    if (ratio > most) ratio = most;
    /* far off (a new kernel mix), or the first few steps (the first one's span has the
     * fewest launches, and its edge cut one short): the whole step; close: half steps */
    double step = ratio > 1.5 || ratio < 0.67 || s->calibrated < WHOLE_STEPS ? ratio
                                                                            : sqrt(ratio);
    double ps = (double)__atomic_load_n(&s->ps_per_wave, __ATOMIC_RELAXED) * step;
    if (ps < PS_MIN) ps = PS_MIN;
    if (ps > PS_MAX) ps = PS_MAX;
    __atomic_store_n(&s->ps_per_wave, (uint64_t)ps, __ATOMIC_RELAXED);
    if (s->calibrated < WHOLE_STEPS) s->calibrated++;
}

static void tick(int d, int host_pid)
{
    sm_dev *s = &devs[d];
    nvmlDevice_t h = vg_nvml_device(d);
    if (!h || !vg_real.nvmlDeviceGetProcessUtilization) return;
    /* NVML's timestamps are CPU time (CLOCK_REALTIME us); the bins are monotonic */
    uint64_t mono = vg_now_ns(), real = vg_realtime_ns();
    /* every sample, however many processes share the GPU (a fixed 256 stopped the
     * calibration past them) */
    nvmlProcessUtilizationSample_t *buf = NULL;
    unsigned int n = 0;
    nvmlReturn_t r = vg_nvml_samples(h, s->last_seen_us, &buf, &n);
    if (s->last_seen_us == 0) { /* the first look: everything kept is history */
        unsigned long long newest = real / 1000;
        if (r == NVML_SUCCESS)
            for (unsigned i = 0; i < n; i++)
                if (buf[i].timeStamp > s->last_seen_us) newest = buf[i].timeStamp;
        s->last_seen_us = r == NVML_SUCCESS ? newest : real / 1000;
        free(buf);
        return;
    }
    if (r == NVML_ERROR_NOT_FOUND) { /* nobody ran kernels since: were we charged much? */
        /* only charges older than two of NVML's sample periods count: a sample covers
         * the period before it, so until then NOT_FOUND only means "not yet". With 200 ms
         * samples and a 50 ms tick, two ticks' margin counted the launches of the period
         * being sampled: three such misses cut the estimate four-fold, and a 40 %
         * container of four processes ran at 100 % (with 300 ms samples every period,
         * with 200 ms ones whenever the ticks drifted to a fourth miss) */
        uint64_t settle = 2 * s->period_ns > 2 * TICK_NS ? 2 * s->period_ns : 2 * TICK_NS;
        uint64_t since = (uint64_t)s->last_seen_us * 1000 + mono - real;
        if (host_pid > 0 && mono > settle &&
            charged_between(s, since, mono - settle, NULL) > 2 * TICK_NS / 100 &&
            ++s->misses >= 3) {
            calibrate(s, 0, 1 << 30); /* the GPU saw nothing of it: far too high */
            s->misses = 0;
        }
        return;
    }
    if (r != NVML_SUCCESS || n == 0) {
        free(buf);
        return;
    }
    s->misses = 0;
    unsigned long long newest = s->last_seen_us;
    unsigned own = 0, total = 0, container = 0;
    int cp[VG_MAX_SLOTS], hp[VG_MAX_SLOTS];
    int m = vg_state_processes(d, cp, hp, NULL, VG_MAX_SLOTS);
    for (unsigned i = 0; i < n; i++) {
        total += buf[i].smUtil;
        if (host_pid > 0 && (int)buf[i].pid == host_pid) own = buf[i].smUtil;
        for (int j = 0; j < m; j++)
            if (hp[j] > 0 && (unsigned)hp[j] == buf[i].pid) container += buf[i].smUtil;
        if (buf[i].timeStamp > newest) newest = buf[i].timeStamp;
    }
    free(buf);
    if (newest <= s->last_seen_us) return;
    uint64_t t0 = (uint64_t)s->last_seen_us * 1000 + mono - real;
    uint64_t t1 = (uint64_t)newest * 1000 + mono - real;
    s->last_seen_us = newest;
    s->period_ns = t1 - t0 < PERIOD_MAX_NS ? t1 - t0 : PERIOD_MAX_NS; /* idle gaps too */
    if (total > 100) total = 100;
    if (host_pid > 0) { /* our share of the interval, as the GPU saw it, vs what we charged */
        uint64_t nl = 0, ch = charged_between(s, t0, t1, &nl);
        /* charged over 1 % of the interval, not seen while another process of the
         * container was seen busy: the window went wholly to it (a real NVML does so,
         * below, and lists no row for this process then) */
        if (own == 0 && container > 0 && ch > (t1 - t0) / 100) s->shared_at = mono;
        VG_DEBUG("sm dev %d: interval %.0f ms, NVML %u%%, charged %.1f%%, ps/wave %llu", d,
                 (double)(t1 - t0) / 1e6, own, 100.0 * (double)ch / (double)(t1 - t0),
                 (unsigned long long)__atomic_load_n(&s->ps_per_wave, __ATOMIC_RELAXED));
        /* a span of several launches: a long kernel charged at its launch runs in the
         * next interval, and one interval alone would credit it to the wrong one */
        s->span_seen += (uint64_t)own * (t1 - t0) / 100;
        s->span_charged += ch;
        s->span_launches += nl;
        s->span_ns += t1 - t0;
        /* still at the starting estimate, with kernels so long that it charged
         * microseconds for what the GPU ran for milliseconds: the first launches tell
         * enough once they have run (this interval saw the process idle, so none is
         * half-seen) or over 150 ms of them were seen (a process that never idles: one
         * half-seen launch is then a bounded error, mended by the next span), and the
         * step is taken at once. A 50 ms kernel of one wave took three
         * spans of four launches, most of a four-second run, while four processes of
         * them ran at twice their limit. Only from the starting estimate: later, a span's
         * edge can cut a launch's charge to a sliver and fake such a ratio. */
        int overwhelming = !s->calibrated && (own == 0 || s->span_ns >= SPAN_MIN_NS) &&
                           s->span_launches >= 1 &&
                           s->span_seen >= LONG_SEEN_NS &&
                           s->span_seen > OVERWHELMING * s->span_charged;
        /* where NVML gives windows wholly to one process, once the first whole steps are
         * taken, a span is 2 s: a real NVML (an H200, driver 580) gives each sampling
         * window to one of the processes that ran in it, so each sees 0 % and twice its
         * share in turn, and spans of a window or two swung the estimate three-fold back
         * and forth (two processes of a 30 % container ran 1 ms kernels at 40-44 %); over
         * 2 s the turns even out */
        int lumpy = s->calibrated >= WHOLE_STEPS && s->shared_at &&
                    mono - s->shared_at < SHARED_FOR_NS;
        uint64_t span_min = lumpy ? SPAN_MAX_NS : SPAN_MIN_NS;
        /* ... but a span of two windows that saw three times what it charged cannot be
         * the turns' noise (at most twice): kernels grew longer, and waiting 2 s would let
         * them run past the limit */
        int grew = lumpy && s->span_ns >= 2 * s->period_ns && s->span_launches >= 1 &&
                   s->span_seen >= 3 * s->span_charged && s->span_seen >= LONG_SEEN_NS;
        if ((s->span_launches >= SPAN_LAUNCHES && s->span_ns >= span_min) ||
            s->span_ns >= SPAN_MAX_NS || overwhelming || grew) {
            calibrate(s, s->span_seen, s->span_charged);
            s->span_seen = s->span_charged = s->span_launches = s->span_ns = 0;
        }
    }
    if (s->limited && !s->held) adjust_rate(d, total, container);
}

/* the node's arbitration record (read-only in the container): held at its floor while a
 * higher priority is active on the GPU, back to the policy's rate at once when not */
static void arbitrate(int d)
{
    sm_dev *s = &devs[d];
    const vg_device_config *c = &vg_cfg.dev[d];
    uint32_t floor = 0;
    uint32_t own = s->limited ? c->core_limit * 10 : 1000;
    if (vg_arbiter_throttle(d, &floor)) {
        if (floor > own) floor = own; /* the floor never lifts a lower limit */
        if (floor == 0) floor = 1;    /* 0 would mean "unpaced" to the bucket */
        if (!s->held) VG_DEBUG("sm dev %d: a higher priority is active, held at %u permille",
                               d, floor);
        s->held = 1;
        __atomic_store_n(&s->rate, floor, __ATOMIC_RELEASE);
    } else if (s->held) {
        s->held = 0;
        VG_DEBUG("sm dev %d: released, back to %u permille", d, own);
        __atomic_store_n(&s->rate, own, __ATOMIC_RELEASE);
    }
}

static void *controller_main(void *arg)
{
    (void)arg;
    vg_tls_guard = 1; /* this thread only calls the real driver */
    int warned = 0;
    uint64_t started = vg_now_ns();
    for (;;) {
        int hp = vg_host_pid();
        if (hp <= 0 && !warned && vg_now_ns() - started > 2000000000ull) {
            VG_WARN("host pid unknown (no registration with the plugin, no NSpid): the SM "
                    "limit runs on uncalibrated estimates");
            warned = 1;
        }
        int reporter = am_reporter();
        for (int d = 0; d < VG_MAX_DEVICES; d++) {
            if (!devs[d].active) continue;
            arbitrate(d);
            tick(d, hp);
            if (reporter)
                __atomic_store_n(&hdr()->sm_rate[d], __atomic_load_n(&devs[d].rate,
                                 __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
        }
        sleep_ns(TICK_NS);
    }
    return NULL;
}
