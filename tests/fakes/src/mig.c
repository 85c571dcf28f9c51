/* The MIG model shared by the fake NVML and the fake driver: an A100-like GPU of 7 compute
 * slices and 8 memory slices, whatever FAKECUDA_DEVICES says about its size.
 *
 * A GPU instance occupies the memory slices [start, start + mem) of its placement; two may
 * not overlap.  Its id is the A100's partition ("swizzle") id of the placement: the whole
 * GPU 0, halves 1-2, quarters 3-6, eighths 7-13 (nvidia-smi shows 1g instances as 7..13).
 * Compute instances split a GPU instance's compute slices: a 1-slice profile, and the one
 * covering the whole GPU instance.  The tables live in the shared state (struct fc_mig in
 * struct fc_dev), under the state lock. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fake.h"
#include "nvmltypes.h"

/* The A100's GPU instance profiles (nvidia-smi mig -lgip): constant, id, compute slices,
 * memory slices, instances, placements, copy engines, decoders, JPEG, OFA. */
const struct fc_gi_profile fc_gi_profiles[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, 7, {0, 1, 2, 3, 4, 5, 6}, 1, 0, 0, 0},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, 4, {0, 2, 4, 6}, 1, 1, 0, 0},
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, 3, {0, 2, 4}, 2, 1, 0, 0},
    {NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, 2, {0, 4}, 3, 2, 0, 0},
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, 1, {0}, 4, 2, 0, 0},
    {NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, 1, {0}, 7, 5, 1, 1},
};
const unsigned fc_gi_nprofiles = sizeof fc_gi_profiles / sizeof fc_gi_profiles[0];

const struct fc_gi_profile *fc_gi_profile_by_const(unsigned constant) {
    for (unsigned i = 0; i < fc_gi_nprofiles; i++)
        if (fc_gi_profiles[i].constant == constant) return &fc_gi_profiles[i];
    return NULL;
}

const struct fc_gi_profile *fc_gi_profile_by_id(unsigned id) {
    for (unsigned i = 0; i < fc_gi_nprofiles; i++)
        if (fc_gi_profiles[i].id == id) return &fc_gi_profiles[i];
    return NULL;
}

unsigned fc_gi_id(unsigned start, unsigned size) {
    switch (size) {
    case 8: return 0;
    case 4: return 1 + start / 4;
    case 2: return 3 + start / 2;
    default: return 7 + start;
    }
}

static uint64_t slice_mib(int dev) { return fc_knobs()->total[dev] / FC_MIB / 8; }

uint64_t fc_mig_mem_mib(int dev, unsigned mem_slices) {
    return (uint64_t)mem_slices * slice_mib(dev) * 95 / 100;
}

unsigned fc_mig_name_gb(int dev, unsigned mem_slices) {
    return (unsigned)(((uint64_t)mem_slices * slice_mib(dev) + 1023) / 1024);
}

unsigned fc_mig_sms(unsigned compute_slices) {
    int sms = fc_knobs()->sms;
    return compute_slices * (unsigned)(sms > 0 ? sms / 7 : 0);
}

void fc_mig_profile_name(int dev, unsigned gslices, unsigned cslices, unsigned mem_slices,
                         char *buf, size_t len) {
    unsigned gb = fc_mig_name_gb(dev, mem_slices);
    if (cslices == gslices)
        snprintf(buf, len, "%ug.%ugb", gslices, gb);
    else
        snprintf(buf, len, "%uc.%ug.%ugb", cslices, gslices, gb);
}

unsigned fc_ci_slices(unsigned ci_profile) {
    static const unsigned slices[] = {1, 2, 3, 4, 7}; /* NVML_COMPUTE_INSTANCE_PROFILE_1..7_SLICE */
    return ci_profile < 5 ? slices[ci_profile] : 0;
}

unsigned fc_gi_compute(const struct fc_gi *g) {
    const struct fc_gi_profile *p = fc_gi_profile_by_id(g->profile);
    return p ? p->compute : 0;
}

static int overlaps(const struct fc_mig *m, unsigned start, unsigned size) {
    for (int i = 0; i < FC_MIG_GI; i++) {
        const struct fc_gi *g = &m->gi[i];
        if (g->live && start < g->start + g->size && g->start < start + size) return 1;
    }
    return 0;
}

int fc_mig_create_gi_locked(struct fc_mig *m, const struct fc_gi_profile *p, int start) {
    int known = start < 0;
    for (unsigned k = 0; k < p->count; k++) {
        unsigned s = p->starts[k];
        if (start >= 0 && s != (unsigned)start) continue;
        known = 1;
        if (overlaps(m, s, p->mem)) continue;
        unsigned id = fc_gi_id(s, p->mem);
        struct fc_gi *g = &m->gi[id];
        memset(g, 0, sizeof *g);
        g->live = 1;
        g->profile = p->id;
        g->start = s;
        g->size = p->mem;
        return (int)id;
    }
    return known ? -1 : -2;
}

int fc_mig_create_ci_locked(struct fc_gi *g, unsigned ci_profile, int start) {
    unsigned gs = fc_gi_compute(g), c = fc_ci_slices(ci_profile);
    if (!c || (c != 1 && c != gs)) return -2;
    if (start >= 0 && ((unsigned)start % c || (unsigned)start + c > gs)) return -3;
    int id = -1;
    for (int i = 0; i < FC_MIG_CI && id < 0; i++)
        if (!g->ci[i].live) id = i;
    if (id < 0) return -1;
    for (unsigned s = 0; s + c <= gs; s += c) {
        if (start >= 0 && s != (unsigned)start) continue;
        int busy = 0;
        for (int i = 0; i < FC_MIG_CI; i++) {
            const struct fc_ci *ci = &g->ci[i];
            if (ci->live && s < ci->start + ci->size && ci->start < s + c) busy = 1;
        }
        if (busy) continue;
        struct fc_ci *ci = &g->ci[id];
        ci->live = 1;
        ci->profile = ci_profile;
        ci->start = s;
        ci->size = c;
        return id;
    }
    return -1;
}

void fc_mig_reset_locked(struct fc_mig *m, int dev, uint32_t gen, uint32_t epoch, int keep_mode) {
    uint32_t mode = keep_mode ? m->mode : (fc_knobs()->mig[dev] ? FC_MIG_ENABLE : FC_MIG_DISABLE);
    memset(m, 0, sizeof *m);
    m->mode = mode;
    m->gen = gen;
    m->epoch = epoch;
}

/* A profile of FAKECUDA_MIG_LAYOUT: a name of this device ("1g.10gb", also "MIG 1g.10gb")
 * or a profile id. */
static const struct fc_gi_profile *layout_profile(int dev, const char *name) {
    if (strncasecmp(name, "MIG ", 4) == 0) name += 4;
    for (unsigned i = 0; i < fc_gi_nprofiles; i++) {
        const struct fc_gi_profile *p = &fc_gi_profiles[i];
        char n[64];
        fc_mig_profile_name(dev, p->compute, p->compute, p->mem, n, sizeof n);
        if (strcasecmp(n, name) == 0) return p;
    }
    char *end;
    unsigned long id = strtoul(name, &end, 10);
    if (end != name && *end == 0) return fc_gi_profile_by_id((unsigned)id);
    return NULL;
}

/* FAKECUDA_MIG_LAYOUT="0:1g.10gb,1g.10gb,2g.20gb;1:3g.40gb,3g.40gb": per device (in
 * FAKECUDA_MIG), GPU instances at their lowest free placement, each with one compute
 * instance covering it.  Bad entries: a message, skipped. */
static void apply_layout(struct fc_shared *s, const char *layout) {
    const struct fc_knobs *k = fc_knobs();
    char *copy = strdup(layout), *save = NULL;
    if (!copy) return;
    for (char *part = strtok_r(copy, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(part, ':'), *end;
        long dev = strtol(part, &end, 10);
        while (*end == ' ') end++;
        if (!colon || end != colon || dev < 0 || dev >= k->ndev) {
            fprintf(stderr, "fakecuda: FAKECUDA_MIG_LAYOUT: ignoring '%s' (want DEV:PROFILE,...)\n",
                    part);
            continue;
        }
        if (!k->mig[dev]) {
            fprintf(stderr, "fakecuda: FAKECUDA_MIG_LAYOUT: device %ld is not in FAKECUDA_MIG; "
                            "ignoring '%s'\n", dev, part);
            continue;
        }
        struct fc_mig *m = &s->dev[dev].mig;
        char *save2 = NULL;
        for (char *name = strtok_r(colon + 1, ",", &save2); name; name = strtok_r(NULL, ",", &save2)) {
            while (isspace((unsigned char)*name)) name++;
            size_t n = strlen(name);
            while (n && isspace((unsigned char)name[n - 1])) name[--n] = 0;
            if (!*name) continue;
            const struct fc_gi_profile *p = layout_profile((int)dev, name);
            if (!p) {
                fprintf(stderr, "fakecuda: FAKECUDA_MIG_LAYOUT: device %ld has no profile '%s'\n",
                        dev, name);
                continue;
            }
            int gi = fc_mig_create_gi_locked(m, p, -1);
            if (gi < 0) {
                fprintf(stderr, "fakecuda: FAKECUDA_MIG_LAYOUT: no room for %s on device %ld\n",
                        name, dev);
                continue;
            }
            unsigned full = 0; /* the compute instance profile covering the GPU instance */
            while (fc_ci_slices(full) != p->compute) full++;
            fc_mig_create_ci_locked(&m->gi[gi], full, -1);
        }
    }
    free(copy);
}

void fc_mig_init_region(struct fc_shared *s) {
    const struct fc_knobs *k = fc_knobs();
    for (int d = 0; d < k->ndev; d++) fc_mig_reset_locked(&s->dev[d].mig, d, 0, 0, 0);
    if (k->mig_layout) apply_layout(s, k->mig_layout);
}

void fc_mig_uuid_bytes(int dev, unsigned gen, unsigned gi, unsigned ci, unsigned char out[16]) {
    static const unsigned char base[16] = {0xfa, 0x4e, 0xcd, 0xa1, 0x00, 0x00, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(out, base, 16);
    out[4] = (unsigned char)(gen >> 8);
    out[5] = (unsigned char)gen;
    out[7] = (unsigned char)gi;
    out[9] = (unsigned char)ci;
    out[15] = (unsigned char)dev;
}

void fc_mig_uuid_string(int dev, unsigned gen, unsigned gi, unsigned ci, char *buf, size_t len) {
    unsigned char b[16];
    fc_mig_uuid_bytes(dev, gen, gi, ci, b);
    fc_uuid_format(b, "MIG-", buf, len);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)tolower((unsigned char)c);
    return (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
}

/* 8-4-4-4-12 hex digits -> 16 bytes; 0 on success */
static int uuid_decode(const char *s, size_t len, unsigned char out[16]) {
    if (len != 36) return -1;
    int n = 0;
    for (size_t i = 0; i < len; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-') return -1;
            continue;
        }
        int hi = hexval(s[i]), lo = i + 1 < len ? hexval(s[i + 1]) : -1;
        if (hi < 0 || lo < 0) return -1;
        out[n++] = (unsigned char)(hi * 16 + lo);
        i++;
    }
    return n == 16 ? 0 : -1;
}

int fc_mig_uuid_parse(const char *s, size_t len, int *dev, unsigned *gen, unsigned *gi,
                      unsigned *ci) {
    unsigned char b[16], want[16];
    if (len != 40 || strncasecmp(s, "MIG-", 4) != 0 || uuid_decode(s + 4, 36, b)) return -1;
    fc_mig_uuid_bytes(b[15], (unsigned)(b[4] << 8 | b[5]), b[7], b[9], want);
    if (memcmp(b, want, 16) != 0 || b[7] >= FC_MIG_GI || b[9] >= FC_MIG_CI) return -1;
    *dev = b[15];
    *gen = (unsigned)(b[4] << 8 | b[5]);
    *gi = b[7];
    *ci = b[9];
    return 0;
}

int fc_gpu_uuid_parse(const char *s, size_t len, int *dev, unsigned *gen) {
    unsigned char b[16], want[16];
    if (len != 40 || strncasecmp(s, "GPU-", 4) != 0 || uuid_decode(s + 4, 36, b)) return -1;
    fc_uuid_bytes_gen(b[15], (unsigned)(b[4] << 8 | b[5]), want);
    if (memcmp(b, want, 16) != 0) return -1;
    *dev = b[15];
    *gen = (unsigned)(b[4] << 8 | b[5]);
    return 0;
}
