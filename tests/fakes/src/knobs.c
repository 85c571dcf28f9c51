/* Environment knobs (read once) and device identity shared by the driver and NVML. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    knobs.sms = (int)env_u64("FAKECUDA_SMS", 108);
    knobs.ns_per_block = env_u64("FAKECUDA_NS_PER_BLOCK", 1000);
    knobs.max_queue_ns = env_u64("FAKECUDA_MAX_QUEUE_NS", 20000000);
    const char *off = getenv("FAKECUDA_HOST_PID_OFFSET");
    knobs.host_pid_offset = off ? strtol(off, NULL, 10) : 0;
    knobs.driver_version = (int)env_u64("FAKECUDA_DRIVER_VERSION", 12080);
    const char *sp = getenv("FAKECUDA_STATE");
    knobs.state_path = (sp && *sp) ? strdup(sp) : NULL;
    const char *ep = getenv("FAKECUDA_EVENTS");
    knobs.events_path = (ep && *ep) ? strdup(ep) : NULL;
}

const struct fc_knobs *fc_knobs(void) {
    pthread_once(&knobs_once, knobs_read);
    return &knobs;
}

void fc_uuid_bytes(int dev, unsigned char out[16]) {
    /* GPU-fa4ecda0-0000-4000-8000-00000000000N */
    static const unsigned char base[16] = {0xfa, 0x4e, 0xcd, 0xa0, 0x00, 0x00, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(out, base, 16);
    out[15] = (unsigned char)dev;
}

void fc_uuid_string(int dev, char *buf, size_t len) {
    unsigned char b[16];
    fc_uuid_bytes(dev, b);
    snprintf(buf, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

void fc_device_name(int dev, char *buf, size_t len) {
    const struct fc_knobs *k = fc_knobs();
    unsigned long long gb = (k->total[dev] + 512 * FC_MIB) / (1024 * FC_MIB);
    snprintf(buf, len, "NVIDIA Fake GPU %lluGB", gb);
}
