/* Fake NVML: identity, memory, processes and utilisation, read from the shared state of
 * the fake driver (state.c). */
#include <stdio.h>
#include <string.h>

#include "nvml_int.h"

/* An NVML session: what the first nvmlInit (the reference count going from 0 to 1) found
 * on the bus, fixed until the last nvmlShutdown, as the real NVML fixes its device list at
 * init.  A GPU that joins the bus later is neither counted nor found (by index, UUID or
 * PCI bus id) until the session ends and a new one starts; one that leaves it (removed,
 * lost, its board replaced) still counts and enumerates, and its handle answers
 * GPU_IS_LOST.  GPU handles belong to their session: a handle of an earlier one answers
 * INVALID_ARGUMENT (a real NVML's may silently name another GPU once the list has
 * changed; the fake catches the misuse), as long as it is one of the last FN_SESSIONS
 * sessions' (older ones' slots are reused). */
#define FN_SESSIONS 64
static struct {
    unsigned serial; /* 0: none yet */
    int n;
    int slot_of[FC_MAX_DEV]; /* physical device -> index in the session, -1: not in it */
    uint32_t gen[FC_MAX_DEV], epoch[FC_MAX_DEV]; /* of each enumerated board, at init */
} session;
static struct nvmlDevice_st devices[FN_SESSIONS][FC_MAX_DEV];
static struct nvmlDevice_st mig_devices[FC_MAX_DEV][FC_MIG_GI][FC_MIG_CI];
static struct nvmlGpuInstance_st gpu_instances[FC_MAX_DEV][FC_MIG_GI];
static struct nvmlComputeInstance_st compute_instances[FC_MAX_DEV][FC_MIG_GI][FC_MIG_CI];
static int init_count;
static pthread_mutex_t init_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t handles_once = PTHREAD_ONCE_INIT;

static void handles_init(void) {
    for (int i = 0; i < FC_MAX_DEV; i++) {
        for (int g = 0; g < FC_MIG_GI; g++) {
            gpu_instances[i][g] = (struct nvmlGpuInstance_st){.dev = i, .id = g};
            for (int c = 0; c < FC_MIG_CI; c++) {
                mig_devices[i][g][c] = (struct nvmlDevice_st){.index = i, .mig = 1, .gi = g, .ci = c};
                compute_instances[i][g][c] = (struct nvmlComputeInstance_st){.dev = i, .gi = g, .ci = c};
            }
        }
    }
}

/* A new session: the bus as it is now (under init_mutex). */
static void session_start(void) {
    struct fn_bus bus;
    fn_bus_get(&bus);
    unsigned serial = session.serial + 1;
    if (serial == 0) serial = 1;
    struct nvmlDevice_st *table = devices[serial % FN_SESSIONS];
    int n = 0;
    for (int d = 0; d < FC_MAX_DEV; d++) {
        session.slot_of[d] = -1;
        if (d >= fc_knobs()->ndev || !bus.present[d]) continue;
        session.slot_of[d] = n;
        session.gen[d] = bus.gen[d];
        session.epoch[d] = bus.epoch[d];
        table[n++] = (struct nvmlDevice_st){.index = d, .serial = serial};
    }
    session.n = n;
    fn_events_begin(serial == 1);
    __atomic_store_n(&session.serial, serial, __ATOMIC_RELEASE);
}

nvmlReturn_t fn_check_init(void) {
    return __atomic_load_n(&init_count, __ATOMIC_ACQUIRE) > 0 ? NVML_SUCCESS
                                                              : NVML_ERROR_UNINITIALIZED;
}

int fn_index(nvmlDevice_t d) {
    const struct nvmlDevice_st *first = &devices[0][0];
    if (!d || d < first || d >= first + (size_t)FN_SESSIONS * FC_MAX_DEV) return -1;
    unsigned serial = __atomic_load_n(&session.serial, __ATOMIC_ACQUIRE);
    if (d->serial != serial || d != &devices[serial % FN_SESSIONS][session.slot_of[d->index]])
        return -1; /* an earlier session's */
    return d->index;
}

int fn_live(int dev, const struct fn_bus *bus) {
    return dev >= 0 && dev < fc_knobs()->ndev && session.slot_of[dev] >= 0 &&
           bus->present[dev] && !bus->lost[dev] && bus->epoch[dev] == session.epoch[dev];
}

nvmlDevice_t fn_handle(int index) {
    if (index < 0 || index >= FC_MAX_DEV || session.slot_of[index] < 0) return NULL;
    return &devices[session.serial % FN_SESSIONS][session.slot_of[index]];
}
nvmlDevice_t fn_mig_handle(int dev, int gi, int ci) { return &mig_devices[dev][gi][ci]; }
nvmlGpuInstance_t fn_gi_handle(int dev, int gi) { return &gpu_instances[dev][gi]; }
nvmlComputeInstance_t fn_ci_handle(int dev, int gi, int ci) { return &compute_instances[dev][gi][ci]; }

int fn_gi_of(nvmlGpuInstance_t h, int *dev, int *gi) {
    const struct nvmlGpuInstance_st *first = &gpu_instances[0][0];
    if (!h || h < first || h >= first + (size_t)fc_knobs()->ndev * FC_MIG_GI) return 0;
    *dev = h->dev;
    *gi = h->id;
    return 1;
}

int fn_ci_of(nvmlComputeInstance_t h, int *dev, int *gi, int *ci) {
    const struct nvmlComputeInstance_st *first = &compute_instances[0][0][0];
    if (!h || h < first || h >= first + (size_t)fc_knobs()->ndev * FC_MIG_GI * FC_MIG_CI) return 0;
    *dev = h->dev;
    *gi = h->gi;
    *ci = h->ci;
    return 1;
}

int fn_is_mig(nvmlDevice_t d, int *dev, int *gi, int *ci) {
    const struct nvmlDevice_st *first = &mig_devices[0][0][0];
    if (!d || d < first || d >= first + (size_t)fc_knobs()->ndev * FC_MIG_GI * FC_MIG_CI) return 0;
    *dev = d->index;
    *gi = d->gi;
    *ci = d->ci;
    return 1;
}

struct fc_mig *fn_mig_locked(int dev, const struct fn_bus *bus) {
    struct fc_mig *m = &fc_state()->dev[dev].mig;
    if (m->gen != bus->gen[dev])
        fc_mig_reset_locked(m, dev, bus->gen[dev], bus->epoch[dev], 0); /* a new board */
    else if (m->epoch != bus->epoch[dev])
        fc_mig_reset_locked(m, dev, bus->gen[dev], bus->epoch[dev], 1); /* re-attached */
    return m;
}

int fn_mig_index_locked(const struct fc_mig *m, int gi, int ci) {
    int n = 0;
    for (int g = 0; g < FC_MIG_GI; g++)
        for (int c = 0; c < FC_MIG_CI; c++) {
            if (!m->gi[g].live || !m->gi[g].ci[c].live) continue;
            if (g == gi && c == ci) return n;
            n++;
        }
    return -1;
}

void fn_mig_name(int dev, const struct fc_gi *g, const struct fc_ci *ci, char *buf, size_t len) {
    char parent[96], prof[64];
    fc_device_name(dev, parent, sizeof parent);
    fc_mig_profile_name(dev, fc_gi_compute(g), ci->size, g->size, prof, sizeof prof);
    snprintf(buf, len, "%s MIG %s", parent, prof);
}

nvmlReturn_t fn_mig(nvmlDevice_t d, int *dev, int *gi, int *ci) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!fn_is_mig(d, dev, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
    struct fn_bus bus;
    fn_bus_get(&bus);
    if (!fn_live(*dev, &bus)) return NVML_ERROR_GPU_IS_LOST;
    fc_lock();
    const struct fc_mig *m = fn_mig_locked(*dev, &bus);
    int live = m->mode == FC_MIG_ENABLE && m->gi[*gi].live && m->gi[*gi].ci[*ci].live;
    fc_unlock();
    return live ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t fn_gpu(nvmlDevice_t d, int *phys, struct fn_bus *bus) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    int i = fn_index(d);
    if (i < 0) {
        int dev, gi, ci;
        if (!fn_is_mig(d, &dev, &gi, &ci)) return NVML_ERROR_INVALID_ARGUMENT;
        r = fn_mig(d, &dev, &gi, &ci);
        return r ? r : NVML_ERROR_NOT_SUPPORTED;
    }
    fn_bus_get(bus);
    if (!fn_live(i, bus)) return NVML_ERROR_GPU_IS_LOST;
    *phys = i;
    return NVML_SUCCESS;
}

/* A GPU or a MIG device handle: *mig tells which (gi, ci for a MIG one). */
static nvmlReturn_t any_arg(nvmlDevice_t d, int *dev, int *mig, int *gi, int *ci) {
    int x, y, z;
    if (fn_is_mig(d, &x, &y, &z)) {
        *mig = 1;
        return fn_mig(d, dev, gi, ci);
    }
    *mig = 0;
    struct fn_bus bus;
    return fn_gpu(d, dev, &bus);
}

FC_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (!fc_state()) return NVML_ERROR_DRIVER_NOT_LOADED;
    pthread_once(&handles_once, handles_init);
    pthread_mutex_lock(&init_mutex);
    if (init_count == 0) session_start(); /* a nested init shares the running session */
    __atomic_add_fetch(&init_count, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&init_mutex);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
FC_API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

FC_API nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&init_mutex);
    nvmlReturn_t r = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0 && __atomic_sub_fetch(&init_count, 1, __ATOMIC_RELEASE) == 0)
        fn_events_reset(); /* the last reference: the session ends, its event sets too */
    pthread_mutex_unlock(&init_mutex);
    return r;
}

FC_API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    default: return "Unknown Error";
    }
}

FC_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *v = fc_knobs()->nvml_driver_version; /* FAKECUDA_NVML_DRIVER_VERSION */
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(v) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char v[96];
    snprintf(v, sizeof v, "12.%s", fc_knobs()->nvml_driver_version);
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (length < strlen(v) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, v, strlen(v) + 1);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = fc_knobs()->driver_version;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return nvmlSystemGetCudaDriverVersion(v);
}

/* The devices on the bus at the session's start (one lost or gone since still counts), in
 * physical order. */
FC_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)session.n;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* The index-th device of the session (a lost or gone one too: its handle answers
 * GPU_IS_LOST). */
FC_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)session.n) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[session.serial % FN_SESSIONS][index];
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* A GPU's UUID (of the board the session enumerated) or a MIG device's; a board that
 * joined the bus after nvmlInit is NOT_FOUND, one gone since GPU_IS_LOST. */
FC_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    struct fn_bus bus;
    fn_bus_get(&bus);
    int dev;
    unsigned gen, gi, ci;
    if (fc_mig_uuid_parse(uuid, strlen(uuid), &dev, &gen, &gi, &ci) == 0) {
        if (dev >= fc_knobs()->ndev || session.slot_of[dev] < 0 || session.gen[dev] != gen)
            return NVML_ERROR_NOT_FOUND;
        if (!fn_live(dev, &bus)) return NVML_ERROR_GPU_IS_LOST;
        fc_lock();
        const struct fc_mig *m = fn_mig_locked(dev, &bus);
        int live = m->mode == FC_MIG_ENABLE && m->gi[gi].live && m->gi[gi].ci[ci].live;
        fc_unlock();
        if (!live) return NVML_ERROR_NOT_FOUND;
        *device = &mig_devices[dev][gi][ci];
        return NVML_SUCCESS;
    }
    for (int i = 0; i < fc_knobs()->ndev; i++) {
        char u[96];
        if (session.slot_of[i] < 0) continue;
        fc_uuid_string_gen(i, session.gen[i], u, sizeof u);
        if (strcmp(u, uuid) == 0) {
            if (!fn_live(i, &bus)) return NVML_ERROR_GPU_IS_LOST;
            *device = fn_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static void bus_id(int i, char *buf, size_t len) { snprintf(buf, len, "00000000:%02X:00.0", (unsigned char)i); }

FC_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!pciBusId || !device) return NVML_ERROR_INVALID_ARGUMENT;
    struct fn_bus bus;
    fn_bus_get(&bus);
    for (int i = 0; i < fc_knobs()->ndev; i++) {
        char b[32];
        bus_id(i, b, sizeof b);
        if (session.slot_of[i] >= 0 &&
            (strcasecmp(b, pciBusId) == 0 || strcasecmp(b + 4, pciBusId) == 0)) {
            if (!fn_live(i, &bus)) return NVML_ERROR_GPU_IS_LOST;
            *device = fn_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

FC_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* A GPU handle on the bus, not lost (see fn_gpu for the errors). */
#define DEVICE_ARG(d, i)                                 \
    int i;                                               \
    struct fn_bus bus_;                                  \
    nvmlReturn_t r_ = fn_gpu(d, &i, &bus_);              \
    if (r_) return r_

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int len) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    char u[96];
    if (mig) {
        struct fn_bus bus;
        fn_bus_get(&bus);
        fc_mig_uuid_string(i, bus.gen[i], (unsigned)gi, (unsigned)ci, u, sizeof u);
    } else {
        struct fn_bus bus;
        fn_bus_get(&bus);
        fc_uuid_string_gen(i, bus.gen[i], u, sizeof u);
    }
    return copy_string(u, uuid, length);
}

FC_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    char n[192];
    if (mig) {
        struct fn_bus bus;
        fn_bus_get(&bus);
        fc_lock();
        const struct fc_gi *g = &fn_mig_locked(i, &bus)->gi[gi];
        fn_mig_name(i, g, &g->ci[ci], n, sizeof n);
        fc_unlock();
    } else {
        fc_device_name(i, n, sizeof n);
    }
    return copy_string(n, name, length);
}

/* A GPU: its position in the session's list.  A MIG device: its index under its GPU, the one
 * nvmlDeviceGetMigDeviceHandleByIndex takes (as nvml.h documents). */
FC_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    struct fn_bus bus;
    fn_bus_get(&bus);
    if (mig) {
        fc_lock();
        int n = fn_mig_index_locked(fn_mig_locked(i, &bus), gi, ci);
        fc_unlock();
        if (n < 0) return NVML_ERROR_INVALID_ARGUMENT;
        *index = (unsigned)n;
        return NVML_SUCCESS;
    }
    *index = (unsigned)session.slot_of[i];
    return NVML_SUCCESS;
}

/* /dev/nvidiaN: the physical number, which does not change as devices come and go; a MIG
 * device has none (NOT_SUPPORTED). */
FC_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    DEVICE_ARG(device, i);
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned)i;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_ARG(device, i);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", (unsigned char)i);
    bus_id(i, pci->busId, sizeof pci->busId);
    pci->domain = 0;
    pci->bus = (unsigned)i;
    pci->device = 0;
    pci->pciDeviceId = 0x20b010de; /* device id 0x20b0, vendor NVIDIA */
    pci->pciSubSystemId = 0x134f10de;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

FC_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

FC_API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    DEVICE_ARG(device, i);
    if (!node) return NVML_ERROR_INVALID_ARGUMENT;
    *node = (unsigned)(i % 2);
    return NVML_SUCCESS;
}

/* NVLink: FAKECUDA_NVLINK pairs (a PCIe card, NOT_SUPPORTED, when the device has none);
 * link k of a device leads to its k-th peer, links past them are inactive. */
FC_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                            nvmlEnableState_t *isActive) {
    DEVICE_ARG(device, i);
    if (!isActive || link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    const struct fc_knobs *k = fc_knobs();
    if (k->nlinks[i] == 0) return NVML_ERROR_NOT_SUPPORTED;
    *isActive = link < (unsigned)k->nlinks[i] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                       nvmlPciInfo_t *pci) {
    DEVICE_ARG(device, i);
    if (!pci || link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    const struct fc_knobs *k = fc_knobs();
    if (k->nlinks[i] == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)k->nlinks[i]) return NVML_ERROR_INVALID_ARGUMENT;
    int peer = k->links[i][link];
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", (unsigned char)peer);
    bus_id(peer, pci->busId, sizeof pci->busId);
    pci->bus = (unsigned)peer;
    pci->pciDeviceId = 0x20b010de;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                    nvmlPciInfo_t *pci) {
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

/* Page retirement: FAKECUDA_RETIRE_PENDING names the devices with one pending (the
 * health probe keeps such a GPU unhealthy until a reset). */
FC_API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                          nvmlEnableState_t *isPending) {
    DEVICE_ARG(device, i);
    if (!isPending) return NVML_ERROR_INVALID_ARGUMENT;
    *isPending = fc_knobs()->retire_pending[i] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = 8;
    *minor = 0;
    return NVML_SUCCESS;
}

/* ---- memory ---- */
/* A GPU: physical, every process's memory.  A MIG device: its GPU instance's memory and
 * what CUDA processes hold in it. */
static nvmlReturn_t memory_of(nvmlDevice_t device, unsigned long long *total,
                              unsigned long long *used) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    struct fc_shared *s = fc_state();
    struct fn_bus bus;
    if (mig) fn_bus_get(&bus);
    fc_lock();
    fc_reap_locked();
    if (mig) {
        const struct fc_gi *g = &fn_mig_locked(i, &bus)->gi[gi];
        *total = fc_mig_mem_mib(i, g->size) * FC_MIB;
        *used = g->used;
    } else {
        *total = s->dev[i].total;
        *used = s->dev[i].used;
    }
    fc_unlock();
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!memory) {
        int i, mig, gi, ci;
        nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
        return r ? r : NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t r = memory_of(device, &memory->total, &memory->used);
    if (r) return r;
    memory->free = memory->used < memory->total ? memory->total - memory->used : 0;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    r = memory_of(device, &memory->total, &memory->used);
    if (r) return r;
    memory->reserved = 0;
    memory->free = memory->used < memory->total ? memory->total - memory->used : 0;
    return NVML_SUCCESS;
}

/* ---- processes ---- */
struct proc_row {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci; /* NVML_VALUE_NOT_AVAILABLE_UINT: not on a MIG device */
};

/* Which processes a list shows.  A process with a CUDA context on the device is a compute
 * process; one that took memory through a graphics API (fake_graphics_alloc) has a
 * graphics context, and is a compute process only if it has a CUDA context there too (a
 * Vulkan-only process is listed by the graphics list alone, nvidia-smi's "G"; both: "C+G",
 * each list showing all of its memory).  MPS clients (FAKECUDA_MPS=1 in their
 * environment) are compute processes too, as a real MPS client is listed by both
 * (nvidia-smi's "M+C"). */
enum proc_kind { KIND_COMPUTE, KIND_GRAPHICS, KIND_MPS, KIND_ALL };

/* The pid under which the caller sees a process (host_pid, pid in namespace (ino, off)).
 * Drivers before 560 report host pids whatever the caller's PID namespace; from 560 on,
 * the pid as seen from the caller's namespace, and nothing for processes not visible
 * there.  A namespace here is the pair (inode of /proc/self/ns/pid,
 * FAKECUDA_HOST_PID_OFFSET); the host namespace (host pid == pid, offset 0) sees every
 * process by its host pid. */
static int pid_seen_of(uint32_t host_pid, int32_t pid, uint64_t ino, int64_t off,
                       const struct fc_ident *me, unsigned int *out) {
    if (fc_knobs()->nvml_driver_major < 560) {
        *out = host_pid;
        return 1;
    }
    if (ino == me->ns_ino && off == me->offset) {
        *out = (unsigned int)pid;
        return 1;
    }
    if (me->is_host) {
        *out = host_pid;
        return 1;
    }
    return 0;
}

static int pid_seen(const struct fc_proc *p, const struct fc_ident *me, unsigned int *pid) {
    return pid_seen_of(p->host_pid, p->pid, p->ns_ino, p->ns_offset, me, pid);
}

/* Processes of a kind with a context or memory on device i (mig: only those on its MIG
 * device (gi, ci)). */
static int processes_on(int i, int mig, int gi, int ci, enum proc_kind kind,
                        struct proc_row *rows, int max) {
    struct fc_shared *s = fc_state();
    const struct fc_ident *me = fc_ident();
    int n = 0;
    fc_lock();
    fc_reap_locked();
    for (int k = 0; k < FC_MAX_PROCS && n < max; k++) {
        struct fc_proc *p = &s->procs[k];
        int on_mig = (p->flags & FC_PROC_MIG) && p->mig_dev == i;
        if (mig && !(on_mig && p->mig_gi == (uint32_t)gi && p->mig_ci == (uint32_t)ci)) continue;
        if (kind == KIND_MPS && !(p->flags & FC_PROC_MPS)) continue;
        int graphics = (p->flags & FC_PROC_GRAPHICS) != 0;
        int listed = kind == KIND_GRAPHICS ? graphics && p->used[i]
                     : kind == KIND_ALL    ? p->nctx[i] || p->used[i]
                                           : p->nctx[i] || (p->used[i] && !graphics);
        if (p->pid && listed && pid_seen(p, me, &rows[n].pid)) {
            rows[n].used = p->used[i];
            rows[n].gi = on_mig ? p->mig_gi : NVML_VALUE_NOT_AVAILABLE_UINT;
            rows[n].ci = on_mig ? p->mig_ci : NVML_VALUE_NOT_AVAILABLE_UINT;
            n++;
        }
    }
    fc_unlock();
    return n;
}

/* INSUFFICIENT_SIZE semantics: *count in = room, out = entries (or entries needed). */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count, void *infos,
                                   int version, enum proc_kind kind) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    if (!count || (!infos && *count)) return NVML_ERROR_INVALID_ARGUMENT;
    static __thread struct proc_row rows[FC_MAX_PROCS];
    int n = processes_on(i, mig, gi, ci, kind, rows, FC_MAX_PROCS);
    if ((unsigned)n > *count) {
        *count = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + k;
            o->pid = rows[k].pid;
            o->usedGpuMemory = rows[k].used;
        } else {
            nvmlProcessInfo_t *o = (nvmlProcessInfo_t *)infos + k;
            o->pid = rows[k].pid;
            o->usedGpuMemory = rows[k].used;
            o->gpuInstanceId = rows[k].gi;
            o->computeInstanceId = rows[k].ci;
        }
    }
    *count = (unsigned)n;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                           unsigned int *infoCount,
                                                           nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, 3, KIND_COMPUTE);
}

FC_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                           unsigned int *infoCount,
                                                           nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, 2, KIND_COMPUTE);
}

FC_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, infoCount, infos, 1, KIND_COMPUTE);
}

/* The processes that took memory through a graphics API (fake_graphics_alloc). */
FC_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, 3, KIND_GRAPHICS);
}

FC_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, 2, KIND_GRAPHICS);
}

FC_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, infoCount, infos, 1, KIND_GRAPHICS);
}

/* MPS clients: the compute processes that had FAKECUDA_MPS=1 (there is no MPS daemon to
 * list). */
FC_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, 3, KIND_MPS);
}

FC_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, 2, KIND_MPS);
}

FC_API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device,
                                                           unsigned int *infoCount,
                                                           nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, infoCount, infos, 1, KIND_MPS);
}

/* The version is checked first (the real driver answers a version of 0 with
 * ARGUMENT_VERSION_MISMATCH, whatever nvml.h's comment says); then the mode; then the
 * INSUFFICIENT_SIZE semantics of the lists (numProcArrayEntries in = room, out = entries
 * or entries needed).  MODE_ALL: every process, compute or graphics. */
FC_API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                         nvmlProcessDetailList_t *plist) {
    int i, mig, gi, ci;
    nvmlReturn_t r = any_arg(device, &i, &mig, &gi, &ci);
    if (r) return r;
    if (!plist) return NVML_ERROR_INVALID_ARGUMENT;
    if (plist->version != nvmlProcessDetailList_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    enum proc_kind kind;
    switch (plist->mode) {
    case NVML_PROCESS_MODE_COMPUTE: kind = KIND_COMPUTE; break;
    case NVML_PROCESS_MODE_GRAPHICS: kind = KIND_GRAPHICS; break;
    case NVML_PROCESS_MODE_MPS: kind = KIND_MPS; break;
    case NVML_PROCESS_MODE_ALL: kind = KIND_ALL; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    static __thread struct proc_row rows[FC_MAX_PROCS];
    int n = processes_on(i, mig, gi, ci, kind, rows, FC_MAX_PROCS);
    if ((unsigned)n > plist->numProcArrayEntries) {
        plist->numProcArrayEntries = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !plist->procArray) return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < n; k++) {
        nvmlProcessDetail_v1_t *o = &plist->procArray[k];
        memset(o, 0, sizeof *o);
        o->pid = rows[k].pid;
        o->usedGpuMemory = rows[k].used;
        o->gpuInstanceId = rows[k].gi;
        o->computeInstanceId = rows[k].ci;
        o->usedGpuCcProtectedMemory = 0; /* no confidential computing */
    }
    plist->numProcArrayEntries = (unsigned)n;
    return NVML_SUCCESS;
}

/* ---- utilisation: the sampled windows of state.c (fc_sample_locked) ---- */
FC_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    DEVICE_ARG(device, i);
    if (!util) return NVML_ERROR_INVALID_ARGUMENT;
    struct fc_shared *s = fc_state();
    fc_lock();
    fc_sample_locked(i, fc_now());
    struct fc_dev *dv = &s->dev[i];
    const struct fc_sample *last = dv->win_next ? &dv->samples[(dv->win_next - 1) % FC_SAMPLES] : NULL;
    util->gpu = (last && last->end_us && last->index == dv->win_next - 1) ? last->gpu_util : 0;
    fc_unlock();
    util->memory = 0;
    return NVML_SUCCESS;
}

struct util_row {
    uint32_t host_pid;
    uint64_t sum;      /* of the per-window smUtil */
    uint64_t newest_us; /* end of the newest window it ran in */
};

/* One row per host pid that ran kernels on device i in the completed windows ending after
 * last_seen_us (CLOCK_REALTIME us); *windows: how many such windows (idle ones too). */
static int util_rows(int i, unsigned long long last_seen_us, struct util_row *rows,
                     uint64_t *windows) {
    int n = 0;
    *windows = 0;
    struct fc_shared *s = fc_state();
    fc_lock();
    fc_sample_locked(i, fc_now());
    struct fc_dev *dv = &s->dev[i];
    uint64_t lo = dv->win_next > FC_SAMPLES ? dv->win_next - FC_SAMPLES : 0;
    for (uint64_t w = lo; w < dv->win_next; w++) {
        const struct fc_sample *smp = &dv->samples[w % FC_SAMPLES];
        if (smp->index != w || !smp->end_us || smp->end_us <= last_seen_us) continue;
        (*windows)++;
        for (uint32_t j = 0; j < smp->n; j++) {
            /* a window given to another process (FAKECUDA_NVML_WINDOW_TO_ONE): not listed
             * for this one, as the real NVML did not list it */
            if (fc_knobs()->nvml_window_to_one && smp->n > 1 && !smp->pid[j].sm_util) continue;
            int k = 0;
            while (k < n && rows[k].host_pid != smp->pid[j].host_pid) k++;
            if (k == n) {
                if (n == FC_MAX_PROCS) continue;
                rows[n].host_pid = smp->pid[j].host_pid;
                rows[n].sum = 0;
                n++;
            }
            rows[k].sum += smp->pid[j].sm_util;
            rows[k].newest_us = smp->end_us;
        }
    }
    fc_unlock();
    return n;
}

/* The rounded mean of a row's per-window smUtil over all the windows. */
static unsigned row_mean(const struct util_row *row, uint64_t windows) {
    return (unsigned)((row->sum * 2 + windows) / (2 * windows));
}

/* One entry per host pid that ran kernels in the completed windows ending after
 * lastSeenTimeStamp (CLOCK_REALTIME us): smUtil = the rounded mean of its per-window
 * smUtil over all those windows (0 where it was idle), timeStamp = the end of the newest
 * window it ran in.  The running window is not visible yet. */
FC_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                   nvmlProcessUtilizationSample_t *utilization,
                                                   unsigned int *processSamplesCount,
                                                   unsigned long long lastSeenTimeStamp) {
    DEVICE_ARG(device, i);
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    static __thread struct util_row rows[FC_MAX_PROCS];
    uint64_t windows;
    int n = util_rows(i, lastSeenTimeStamp, rows, &windows);
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < (unsigned)n) {
        *processSamplesCount = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        nvmlProcessUtilizationSample_t *o = &utilization[k];
        memset(o, 0, sizeof *o);
        o->pid = rows[k].host_pid; /* host pids, whatever the driver version */
        o->timeStamp = rows[k].newest_us;
        o->smUtil = row_mean(&rows[k], windows);
    }
    *processSamplesCount = (unsigned)n;
    return NVML_SUCCESS;
}

/* The same samples in the versioned struct (memUtil and the engines: 0, the fake models
 * none of them).  Like the real one: a GPU in MIG mode → NOT_SUPPORTED; NOT_FOUND before
 * INSUFFICIENT_SIZE; a NULL array or too small a count → INSUFFICIENT_SIZE with
 * processSamplesCount = the entries needed. */
FC_API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                         nvmlProcessesUtilizationInfo_t *info) {
    DEVICE_ARG(device, i);
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fc_lock();
    int mig_mode = fn_mig_locked(i, &bus_)->mode == FC_MIG_ENABLE;
    fc_unlock();
    if (mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    static __thread struct util_row rows[FC_MAX_PROCS];
    uint64_t windows;
    int n = util_rows(i, info->lastSeenTimeStamp, rows, &windows);
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!info->procUtilArray || info->processSamplesCount < (unsigned)n) {
        info->processSamplesCount = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        nvmlProcessUtilizationInfo_v1_t *o = &info->procUtilArray[k];
        memset(o, 0, sizeof *o);
        o->pid = rows[k].host_pid; /* host pids, as nvmlDeviceGetProcessUtilization */
        o->timeStamp = rows[k].newest_us;
        o->smUtil = row_mean(&rows[k], windows);
    }
    info->processSamplesCount = (unsigned)n;
    return NVML_SUCCESS;
}

/* ---- accounting: the records state.c keeps per device (fc_acct_locked) ----
 * Enabled unless FAKECUDA_ACCOUNTING=0 (as after `nvidia-smi -am 1`); a GPU in MIG mode
 * has it disabled, as on a real one.  Disabled: every query but the mode → NOT_SUPPORTED. */
static nvmlReturn_t accounting_on(int i, const struct fn_bus *bus, nvmlEnableState_t *mode) {
    fc_lock();
    int mig_mode = fn_mig_locked(i, bus)->mode == FC_MIG_ENABLE;
    fc_unlock();
    *mode = fc_knobs()->accounting && !mig_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return *mode == NVML_FEATURE_ENABLED ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

FC_API nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    DEVICE_ARG(device, i);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    accounting_on(i, &bus_, mode);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t device,
                                                     unsigned int *bufferSize) {
    DEVICE_ARG(device, i);
    if (!bufferSize) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEnableState_t mode;
    nvmlReturn_t r = accounting_on(i, &bus_, &mode);
    if (r) return r;
    *bufferSize = FC_ACCT;
    return NVML_SUCCESS;
}

/* Each pid with a record (running or ended) once, oldest record first; pids as the
 * process lists report them. */
FC_API nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count,
                                               unsigned int *pids) {
    DEVICE_ARG(device, i);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEnableState_t mode;
    nvmlReturn_t r = accounting_on(i, &bus_, &mode);
    if (r) return r;
    static __thread unsigned int seen[FC_ACCT];
    unsigned n = 0;
    const struct fc_ident *me = fc_ident();
    struct fc_dev *dv = &fc_state()->dev[i];
    fc_lock();
    fc_reap_locked();
    uint64_t lo = dv->acct_next > FC_ACCT ? dv->acct_next - FC_ACCT : 0;
    for (uint64_t x = lo; x < dv->acct_next; x++) {
        const struct fc_acct *a = &dv->acct[x % FC_ACCT];
        unsigned pid, k;
        if (!a->host_pid || !pid_seen_of(a->host_pid, a->pid, a->ns_ino, a->ns_offset, me, &pid))
            continue;
        for (k = 0; k < n && seen[k] != pid; k++) {
        }
        if (k == n) seen[n++] = pid;
    }
    fc_unlock();
    if (n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !pids) return NVML_ERROR_INVALID_ARGUMENT;
    if (n > 0) memcpy(pids, seen, n * sizeof *pids);
    *count = n;
    return NVML_SUCCESS;
}

/* The record of pid (as the process lists report it): the running one, else the one that
 * ended last (nvml.h: on a pid collision, the process that terminated last).  gpuUtilization
 * = its kernels' device time over its lifetime on the device, memoryUtilization 0 (the
 * fake models no memory traffic), time = ms from its first use of the device to its end
 * (0 while it runs). */
FC_API nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid,
                                                nvmlAccountingStats_t *stats) {
    DEVICE_ARG(device, i);
    if (!stats) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEnableState_t mode;
    nvmlReturn_t r = accounting_on(i, &bus_, &mode);
    if (r) return r;
    const struct fc_ident *me = fc_ident();
    struct fc_dev *dv = &fc_state()->dev[i];
    struct fc_acct best = {0};
    int found = 0;
    fc_lock();
    fc_reap_locked();
    uint64_t now = fc_now();
    uint64_t lo = dv->acct_next > FC_ACCT ? dv->acct_next - FC_ACCT : 0;
    for (uint64_t x = lo; x < dv->acct_next; x++) {
        const struct fc_acct *a = &dv->acct[x % FC_ACCT];
        unsigned seen;
        if (!a->host_pid || !pid_seen_of(a->host_pid, a->pid, a->ns_ino, a->ns_offset, me, &seen) ||
            seen != pid)
            continue;
        if (!found || a->running || (!best.running && a->end_ns >= best.end_ns)) best = *a;
        found = 1;
    }
    fc_unlock();
    if (!found) return NVML_ERROR_NOT_FOUND;
    uint64_t end = best.running ? now : best.end_ns;
    uint64_t life = end > best.start_ns ? end - best.start_ns : 0;
    uint64_t util = life ? (best.busy_ns * 100 + life / 2) / life : 0;
    memset(stats, 0, sizeof *stats);
    stats->gpuUtilization = util > 100 ? 100 : (unsigned)util;
    stats->memoryUtilization = 0;
    stats->maxMemoryUsage = best.max_used;
    stats->time = best.running ? 0 : life / 1000000ull;
    stats->startTime = best.start_us;
    stats->isRunning = best.running ? 1 : 0;
    return NVML_SUCCESS;
}
