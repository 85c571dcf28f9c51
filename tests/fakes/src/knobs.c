/* Environment knobs (read once) and device identity shared by the driver and NVML. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fake.h"

static struct fc_knobs knobs;
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v) {
        fprintf(stderr, "fakecuda: ignoring %s=%s (not a number)\n", name, v);
        return dflt;
    }
    return x;
}

/* nvmlSystemGetDriverVersion by default: a branch before 560, whose process lists report
 * host PIDs whatever the caller's PID namespace. */
#define NVML_DRIVER_VERSION_DEFAULT "550.144.03"

/* Physical device of one CUDA_VISIBLE_DEVICES entry (an ordinal, or a unique prefix of a
 * GPU-... UUID), or -1 when the entry is invalid. */
static int visible_entry(const char *e, size_t len) {
    while (len && isspace((unsigned char)*e)) e++, len--;
    while (len && isspace((unsigned char)e[len - 1])) len--;
    if (len == 0) return -1;
    if (len >= 4 && strncasecmp(e, "GPU-", 4) == 0) {
        int found = -1;
        for (int d = 0; d < knobs.ndev; d++) {
            char u[64];
            fc_uuid_string(d, u, sizeof u);
            if (len <= strlen(u) && strncasecmp(u, e, len) == 0) {
                if (found >= 0) return -1; /* ambiguous prefix */
                found = d;
            }
        }
        return found;
    }
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)e[i]) || v > FC_MAX_DEV) return -1;
        v = v * 10 + (e[i] - '0');
    }
    return v < knobs.ndev ? v : -1;
}

/* A MIG entry of CUDA_VISIBLE_DEVICES: a full MIG-<uuid> of the fake's format, or the
 * legacy MIG-GPU-<full gpu uuid>/<gi>/<ci>.  0 when it is one. */
static int visible_mig(const char *e, size_t len, int *dev, unsigned *gen, unsigned *gi,
                       unsigned *ci) {
    if (fc_mig_uuid_parse(e, len, dev, gen, gi, ci) == 0) return *dev < knobs.ndev ? 0 : -1;
    /* MIG-GPU-fa4ecda0-0000-4000-8000-000000000000/7/0 */
    if (len < 4 + 40 + 4 || len > 64 || strncasecmp(e, "MIG-GPU-", 8) != 0 || e[44] != '/')
        return -1;
    char buf[72];
    memcpy(buf, e + 45, len - 45);
    buf[len - 45] = 0;
    char *end;
    unsigned long g = strtoul(buf, &end, 10), c;
    if (end == buf || *end != '/') return -1;
    char *cs = end + 1;
    c = strtoul(cs, &end, 10);
    if (end == cs || *end || g >= FC_MIG_GI || c >= FC_MIG_CI) return -1;
    if (fc_gpu_uuid_parse(e + 4, 40, dev, gen) != 0 || *dev >= knobs.ndev) return -1;
    *gi = (unsigned)g;
    *ci = (unsigned)c;
    return 0;
}

/* CUDA_VISIBLE_DEVICES as the real driver reads it: parsing stops at the first invalid or
 * duplicate entry; unset = every device; set but empty = none.  A MIG device (its full
 * MIG-... UUID) is enumerated only if it is the first MIG device listed (later ones are
 * skipped, as the real driver enumerates one MIG device per process); its parent listed
 * as a GPU, or a GPU listed before it as its parent, is a duplicate. */
static void visible_read(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    knobs.nvis = 0;
    knobs.mig_ordinal = -1;
    knobs.mig_phys = -1;
    if (!v) {
        for (int d = 0; d < knobs.ndev; d++) knobs.vis[knobs.nvis++] = d;
        return;
    }
    const char *p = v;
    while (*p && knobs.nvis < knobs.ndev) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *e = p;
        size_t elen = len;
        while (elen && isspace((unsigned char)*e)) e++, elen--;
        while (elen && isspace((unsigned char)e[elen - 1])) elen--;
        int d, mig = 0;
        unsigned gen = 0, gi = 0, ci = 0;
        if (elen >= 4 && strncasecmp(e, "MIG-", 4) == 0) {
            if (visible_mig(e, elen, &d, &gen, &gi, &ci) != 0) break;
            mig = 1;
        } else {
            d = visible_entry(p, len);
        }
        if (d < 0) break;
        if (!(mig && knobs.mig_ordinal >= 0)) {
            for (int i = 0; i < knobs.nvis; i++)
                if (knobs.vis[i] == d) d = -1;
            if (d < 0) break;
            if (mig) {
                knobs.mig_ordinal = knobs.nvis;
                knobs.mig_phys = d;
                knobs.mig_gen = gen;
                knobs.mig_gi = gi;
                knobs.mig_ci = ci;
            }
            knobs.vis[knobs.nvis++] = d;
        }
        if (!comma) break;
        p = comma + 1;
    }
}

void fc_visible_resolve(const struct fc_shared *s) {
    static int done;
    if (done || knobs.mig_ordinal < 0) return;
    done = 1;
    const struct fc_mig *m = &s->dev[knobs.mig_phys].mig;
    const struct fc_gi *g = &m->gi[knobs.mig_gi];
    const struct fc_gi_profile *p = g->live ? fc_gi_profile_by_id(g->profile) : NULL;
    if (m->gen != knobs.mig_gen || m->mode != FC_MIG_ENABLE || !p || !g->ci[knobs.mig_ci].live) {
        /* no such MIG device: the list stops there */
        knobs.nvis = knobs.mig_ordinal;
        knobs.mig_ordinal = -1;
        knobs.mig_phys = -1;
        return;
    }
    knobs.mig_gslices = p->compute;
    knobs.mig_mem_slices = p->mem;
    knobs.mig_cslices = g->ci[knobs.mig_ci].size;
}

/* "1,3" -> flags[1] = flags[3] = 1 */
static void device_list(const char *name, int flags[FC_MAX_DEV]) {
    const char *v = getenv(name);
    for (const char *p = v; p && *p;) {
        char *end;
        long d = strtol(p, &end, 10);
        if (end == p) {
            fprintf(stderr, "fakecuda: ignoring the rest of %s=%s (want devices like 1,3)\n", name, v);
            break;
        }
        if (d >= 0 && d < FC_MAX_DEV) flags[d] = 1;
        p = *end == ',' ? end + 1 : end;
    }
}

static void knobs_read(void) {
    const char *devs = getenv("FAKECUDA_DEVICES");
    if (!devs || !*devs) devs = "24576,24576";
    knobs.ndev = 0;
    const char *p = devs;
    while (*p && knobs.ndev < FC_MAX_DEV) {
        char *end = NULL;
        unsigned long long mib = strtoull(p, &end, 10);
        if (end == p) break;
        knobs.total[knobs.ndev++] = mib * FC_MIB;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    knobs.ctx_bytes = env_u64("FAKECUDA_CTX_MIB", 300) * FC_MIB;
    knobs.module_bytes = env_u64("FAKECUDA_MODULE_MIB", 0) * FC_MIB;
    knobs.ctx_grow_bytes = env_u64("FAKECUDA_CTX_GROW_MIB", 0) * FC_MIB;
    knobs.green_bytes = env_u64("FAKECUDA_GREEN_CTX_MIB", 0) * FC_MIB;
    knobs.sms = (int)env_u64("FAKECUDA_SMS", 108);
    knobs.ns_per_block = env_u64("FAKECUDA_NS_PER_BLOCK", 1000);
    knobs.launch_ns = env_u64("FAKECUDA_LAUNCH_NS", 1500);
    knobs.max_queue_ns = env_u64("FAKECUDA_MAX_QUEUE_NS", 20000000);
    knobs.sample_ns = env_u64("FAKECUDA_NVML_SAMPLE_MS", 100) * 1000000ull;
    if (knobs.sample_ns == 0) knobs.sample_ns = 1000000ull;
    const char *dv = getenv("FAKECUDA_NVML_DRIVER_VERSION");
    if (!dv || !*dv || strlen(dv) >= sizeof knobs.nvml_driver_version) {
        if (dv && *dv) fprintf(stderr, "fakecuda: ignoring FAKECUDA_NVML_DRIVER_VERSION=%s\n", dv);
        dv = NVML_DRIVER_VERSION_DEFAULT;
    }
    snprintf(knobs.nvml_driver_version, sizeof knobs.nvml_driver_version, "%s", dv);
    knobs.nvml_driver_major = atoi(knobs.nvml_driver_version);
    const char *hs = getenv("FAKECUDA_HOST_PID_SOCK");
    knobs.host_pid_sock = (hs && *hs) ? strdup(hs) : NULL;
    const char *off = getenv("FAKECUDA_HOST_PID_OFFSET");
    knobs.host_pid_offset = off ? strtol(off, NULL, 10) : 0;
    knobs.driver_version = (int)env_u64("FAKECUDA_DRIVER_VERSION", 12080);
    knobs.pool_fragments = env_u64("FAKECUDA_POOL_FRAGMENTS", 0) != 0;
    knobs.nvml_window_to_one = env_u64("FAKECUDA_NVML_WINDOW_TO_ONE", 0) != 0;
    knobs.reuse_addresses = env_u64("FAKECUDA_REUSE_ADDRESSES", 0) != 0;
    knobs.free_pause_ms = env_u64("FAKECUDA_FREE_PAUSE_MS", 0);
    knobs.graphmem_lazy = env_u64("FAKECUDA_GRAPHMEM_LAZY", 0) != 0;
    knobs.mps = env_u64("FAKECUDA_MPS", 0) != 0;
    knobs.accounting = env_u64("FAKECUDA_ACCOUNTING", 1) != 0;
    const char *sp = getenv("FAKECUDA_STATE");
    knobs.state_path = (sp && *sp) ? strdup(sp) : NULL;
    const char *nl = getenv("FAKECUDA_NVLINK");
    for (const char *p = nl; p && *p;) {
        int a, b, used = 0;
        if (sscanf(p, "%d-%d%n", &a, &b, &used) == 2 && a >= 0 && b >= 0 && a < FC_MAX_DEV &&
            b < FC_MAX_DEV && a != b && knobs.nlinks[a] < FC_MAX_DEV &&
            knobs.nlinks[b] < FC_MAX_DEV) {
            knobs.links[a][knobs.nlinks[a]++] = b;
            knobs.links[b][knobs.nlinks[b]++] = a;
        } else {
            fprintf(stderr, "fakecuda: ignoring FAKECUDA_NVLINK=%s (want pairs like 0-1,2-3)\n", nl);
            memset(knobs.nlinks, 0, sizeof knobs.nlinks);
            break;
        }
        p += used;
        if (*p == ',') p++;
    }
    device_list("FAKECUDA_RETIRE_PENDING", knobs.retire_pending);
    device_list("FAKECUDA_ABSENT", knobs.absent);
    device_list("FAKECUDA_MIG", knobs.mig);
    const char *ml = getenv("FAKECUDA_MIG_LAYOUT");
    knobs.mig_layout = (ml && *ml) ? strdup(ml) : NULL;
    const char *ep = getenv("FAKECUDA_EVENTS");
    knobs.events_path = (ep && *ep) ? strdup(ep) : NULL;
    visible_read();
}

const struct fc_knobs *fc_knobs(void) {
    pthread_once(&knobs_once, knobs_read);
    return &knobs;
}

void fc_uuid_bytes_gen(int dev, unsigned gen, unsigned char out[16]) {
    /* GPU-fa4ecda0-GGGG-4000-8000-00000000000N */
    static const unsigned char base[16] = {0xfa, 0x4e, 0xcd, 0xa0, 0x00, 0x00, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(out, base, 16);
    out[4] = (unsigned char)(gen >> 8);
    out[5] = (unsigned char)gen;
    out[15] = (unsigned char)dev;
}

void fc_uuid_bytes(int dev, unsigned char out[16]) { fc_uuid_bytes_gen(dev, 0, out); }

void fc_uuid_format(const unsigned char b[16], const char *prefix, char *buf, size_t len) {
    snprintf(buf, len,
             "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix,
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

void fc_uuid_string_gen(int dev, unsigned gen, char *buf, size_t len) {
    unsigned char b[16];
    fc_uuid_bytes_gen(dev, gen, b);
    fc_uuid_format(b, "GPU-", buf, len);
}

void fc_uuid_string(int dev, char *buf, size_t len) { fc_uuid_string_gen(dev, 0, buf, len); }

void fc_device_name(int dev, char *buf, size_t len) {
    const struct fc_knobs *k = fc_knobs();
    unsigned long long gb = (k->total[dev] + 512 * FC_MIB) / (1024 * FC_MIB);
    snprintf(buf, len, "NVIDIA Fake GPU %lluGB", gb);
}
