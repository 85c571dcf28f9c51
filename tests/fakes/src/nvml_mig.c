/* Fake NVML: Multi-Instance GPU management (nvml.h "Multi Instance GPU Management") on the
 * shared tables of mig.c.  Profile *constants* (NVML_GPU_INSTANCE_PROFILE_*) go to the
 * ProfileInfo queries; every other call takes the profile *id* those return (the real
 * A100's: 19, 15, 14, 9, 5, 0), as the real NVML does. */
#include <stdio.h>
#include <string.h>

#include "nvml_int.h"

/* A GPU handle on the bus: its device and (synced) MIG tables, the state locked. */
static nvmlReturn_t gpu_locked(nvmlDevice_t d, int *dev, struct fc_mig **m) {
    struct fn_bus bus;
    nvmlReturn_t r = fn_gpu(d, dev, &bus);
    if (r) return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    fc_lock();
    *m = fn_mig_locked(*dev, &bus);
    return NVML_SUCCESS;
}

/* A live GPU instance handle, the state locked on success. */
static nvmlReturn_t gi_locked(nvmlGpuInstance_t h, int *dev, int *id, struct fc_gi **g) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!fn_gi_of(h, dev, id)) return NVML_ERROR_INVALID_ARGUMENT;
    struct fn_bus bus;
    fn_bus_get(&bus);
    if (!fn_live(*dev, &bus)) return NVML_ERROR_GPU_IS_LOST;
    fc_lock();
    struct fc_mig *m = fn_mig_locked(*dev, &bus);
    *g = &m->gi[*id];
    if (m->mode != FC_MIG_ENABLE || !(*g)->live) {
        fc_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* A live compute instance handle, the state locked on success. */
static nvmlReturn_t ci_locked(nvmlComputeInstance_t h, int *dev, int *gi, int *ci,
                              struct fc_gi **g) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!fn_ci_of(h, dev, gi, ci)) return NVML_ERROR_INVALID_ARGUMENT;
    r = gi_locked(fn_gi_handle(*dev, *gi), dev, gi, g);
    if (r) return r;
    if (!(*g)->ci[*ci].live) {
        fc_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* CUDA processes (a context or memory) on compute instance (gi, ci) of dev, or on any of
 * GPU dev when gi < 0; under the lock. */
static int processes_using_locked(int dev, int gi, int ci) {
    struct fc_shared *s = fc_state();
    fc_reap_locked();
    for (int k = 0; k < FC_MAX_PROCS; k++) {
        const struct fc_proc *p = &s->procs[k];
        if (!p->pid || !(p->nctx[dev] || p->used[dev])) continue;
        if (gi < 0) return 1;
        if ((p->flags & FC_PROC_MIG) && p->mig_dev == dev && p->mig_gi == (uint32_t)gi &&
            p->mig_ci == (uint32_t)ci)
            return 1;
    }
    return 0;
}

/* ---- mode ---- */
FC_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                        unsigned int *pending) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    unsigned mode = m->mode;
    fc_unlock();
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = mode; /* takes effect at once: current = pending */
    return NVML_SUCCESS;
}

/* IN_USE while the GPU has GPU instances or CUDA processes. */
FC_API nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                        nvmlReturn_t *activationStatus) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    if (!activationStatus || mode > NVML_DEVICE_MIG_ENABLE) {
        fc_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (m->mode != mode) {
        int busy = processes_using_locked(dev, -1, -1);
        for (int g = 0; g < FC_MIG_GI; g++) busy |= m->gi[g].live != 0;
        if (busy) {
            fc_unlock();
            *activationStatus = NVML_ERROR_IN_USE;
            return NVML_ERROR_IN_USE;
        }
        m->mode = mode;
    }
    fc_unlock();
    *activationStatus = NVML_SUCCESS;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    unsigned mode = m->mode;
    fc_unlock();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = mode == FC_MIG_ENABLE ? 7 : 0;
    return NVML_SUCCESS;
}

/* ---- MIG device handles ---- */
/* The index-th compute instance in (GPU instance id, compute instance id) order. */
FC_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                       nvmlDevice_t *migDevice) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    r = NVML_ERROR_NOT_FOUND;
    unsigned n = 0;
    for (int g = 0; g < FC_MIG_GI && r && migDevice && m->mode == FC_MIG_ENABLE; g++)
        for (int c = 0; c < FC_MIG_CI && r; c++)
            if (m->gi[g].live && m->gi[g].ci[c].live && n++ == index) {
                *migDevice = fn_mig_handle(dev, g, c);
                r = NVML_SUCCESS;
            }
    fc_unlock();
    return migDevice ? r : NVML_ERROR_INVALID_ARGUMENT;
}

FC_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    int dev, gi, ci;
    nvmlReturn_t r;
    unsigned mig = (unsigned)fn_is_mig(device, &dev, &gi, &ci);
    if (mig) {
        r = fn_mig(device, &dev, &gi, &ci);
    } else {
        struct fn_bus bus;
        r = fn_gpu(device, &dev, &bus);
    }
    if (r) return r;
    if (!isMigDevice) return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = mig;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                nvmlDevice_t *device) {
    int dev, gi, ci;
    nvmlReturn_t r = fn_mig(migDevice, &dev, &gi, &ci);
    if (r) return r;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = fn_handle(dev);
    return NVML_SUCCESS;
}

/* On a GPU handle: INVALID_ARGUMENT (a GPU is no instance). */
static nvmlReturn_t instance_id(nvmlDevice_t device, unsigned int *id, int compute) {
    int dev, gi, ci;
    nvmlReturn_t r;
    if (fn_is_mig(device, &dev, &gi, &ci)) {
        r = fn_mig(device, &dev, &gi, &ci);
    } else {
        struct fn_bus bus;
        r = fn_gpu(device, &dev, &bus);
        if (!r) r = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (r) return r;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned)(compute ? ci : gi);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(device, id, 0);
}

FC_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(device, id, 1);
}

/* MIG device handles only (nvml.h): NOT_SUPPORTED on a GPU. */
FC_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    int dev, gi, ci;
    if (!fn_is_mig(device, &dev, &gi, &ci)) {
        struct fn_bus bus;
        nvmlReturn_t r = fn_gpu(device, &dev, &bus);
        return r ? r : NVML_ERROR_NOT_SUPPORTED;
    }
    nvmlReturn_t r = fn_mig(device, &dev, &gi, &ci);
    if (r) return r;
    if (!attributes) return NVML_ERROR_INVALID_ARGUMENT;
    struct fn_bus bus;
    fn_bus_get(&bus);
    fc_lock();
    const struct fc_gi *g = &fn_mig_locked(dev, &bus)->gi[gi];
    const struct fc_gi_profile *p = fc_gi_profile_by_id(g->profile);
    unsigned cs = g->ci[ci].size;
    uint64_t mem = fc_mig_mem_mib(dev, g->size);
    fc_unlock();
    if (!p) return NVML_ERROR_INVALID_ARGUMENT; /* destroyed meanwhile */
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = fc_mig_sms(cs);
    attributes->sharedCopyEngineCount = p->ce;
    attributes->sharedDecoderCount = p->dec;
    attributes->sharedEncoderCount = 0;
    attributes->sharedJpegCount = p->jpeg;
    attributes->sharedOfaCount = p->ofa;
    attributes->gpuInstanceSliceCount = p->compute;
    attributes->computeInstanceSliceCount = cs;
    attributes->memorySizeMB = mem;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* ---- GPU instance profiles ---- */
struct gi_info {
    unsigned id, slices, count, sms, ce, dec, jpeg, ofa;
    unsigned long long mem;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
};

static void gi_info_of(int dev, const struct fc_gi_profile *p, struct gi_info *o) {
    char n[64];
    o->id = p->id;
    o->slices = p->compute;
    o->count = p->count;
    o->sms = fc_mig_sms(p->compute);
    o->ce = p->ce;
    o->dec = p->dec;
    o->jpeg = p->jpeg;
    o->ofa = p->ofa;
    o->mem = fc_mig_mem_mib(dev, p->mem);
    fc_mig_profile_name(dev, p->compute, p->compute, p->mem, n, sizeof n);
    snprintf(o->name, sizeof o->name, "MIG %s", n);
}

/* by_id: profile is a profile id, else an NVML_GPU_INSTANCE_PROFILE_* constant. */
static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned profile, int by_id, struct gi_info *o) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    unsigned mode = m->mode;
    fc_unlock();
    if (!by_id && profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode != FC_MIG_ENABLE) return NVML_ERROR_NOT_SUPPORTED;
    const struct fc_gi_profile *p = by_id ? fc_gi_profile_by_id(profile) : fc_gi_profile_by_const(profile);
    if (!p) return by_id ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    gi_info_of(dev, p, o);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                       nvmlGpuInstanceProfileInfo_t *info) {
    struct gi_info o;
    nvmlReturn_t r = gi_profile(device, profile, 0, &o);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->id = o.id;
    info->sliceCount = o.slices;
    info->instanceCount = o.count;
    info->multiprocessorCount = o.sms;
    info->copyEngineCount = o.ce;
    info->decoderCount = o.dec;
    info->jpegCount = o.jpeg;
    info->ofaCount = o.ofa;
    info->memorySizeMB = o.mem;
    return NVML_SUCCESS;
}

/* The versioned profile-info structs (v2, v3) share their leading fields' names: one
 * filler each for GPU- and compute-instance profiles. */
#define FILL_GI(dst, ver, o)                                                           \
    do {                                                                               \
        memset((dst), 0, sizeof *(dst));                                               \
        (dst)->version = (ver);                                                        \
        (dst)->id = (o).id;                                                            \
        (dst)->sliceCount = (o).slices;                                                \
        (dst)->instanceCount = (o).count;                                              \
        (dst)->multiprocessorCount = (o).sms;                                          \
        (dst)->copyEngineCount = (o).ce;                                               \
        (dst)->decoderCount = (o).dec;                                                 \
        (dst)->jpegCount = (o).jpeg;                                                   \
        (dst)->ofaCount = (o).ofa;                                                     \
        (dst)->memorySizeMB = (o).mem;                                                 \
        memcpy((dst)->name, (o).name, sizeof (dst)->name);                             \
    } while (0)
#define FILL_CI(dst, ver, o)                                                           \
    do {                                                                               \
        memset((dst), 0, sizeof *(dst));                                               \
        (dst)->version = (ver);                                                        \
        (dst)->id = (o).id;                                                            \
        (dst)->sliceCount = (o).slices;                                                \
        (dst)->instanceCount = (o).count;                                              \
        (dst)->multiprocessorCount = (o).sms;                                          \
        (dst)->sharedCopyEngineCount = (o).ce;                                         \
        (dst)->sharedDecoderCount = (o).dec;                                           \
        (dst)->sharedJpegCount = (o).jpeg;                                             \
        (dst)->sharedOfaCount = (o).ofa;                                               \
        memcpy((dst)->name, (o).name, sizeof (dst)->name);                             \
    } while (0)

static nvmlReturn_t gi_profile_v(nvmlDevice_t device, unsigned profile, int by_id,
                                 nvmlGpuInstanceProfileInfo_v2_t *info) {
    struct gi_info o;
    nvmlReturn_t r = gi_profile(device, profile, by_id, &o);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        FILL_GI(info, nvmlGpuInstanceProfileInfo_v2, o);
    } else if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)(void *)info;
        FILL_GI(v3, nvmlGpuInstanceProfileInfo_v3, o);
    } else {
        return NVML_ERROR_INVALID_ARGUMENT; /* info->version invalid (nvml.h) */
    }
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_v2_t *info) {
    return gi_profile_v(device, profile, 0, info);
}

FC_API nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                            nvmlGpuInstanceProfileInfo_v2_t *info) {
    return gi_profile_v(device, profileId, 1, info);
}

/* Every placement of the profile, whether MIG is enabled or not (nvml.h). */
FC_API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
                                                                 unsigned int profileId,
                                                                 nvmlGpuInstancePlacement_t *placements,
                                                                 unsigned int *count) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    fc_unlock();
    const struct fc_gi_profile *p = fc_gi_profile_by_id(profileId);
    if (!count || !p) return NVML_ERROR_INVALID_ARGUMENT;
    if (placements)
        for (unsigned k = 0; k < p->count; k++) {
            placements[k].start = p->starts[k];
            placements[k].size = p->mem;
        }
    *count = p->count;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device,
                                                              unsigned int profileId,
                                                              nvmlGpuInstancePlacement_t *placements,
                                                              unsigned int *count) {
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

/* A GPU handle in MIG mode and a known profile id: the tables locked on success. */
static nvmlReturn_t mig_profile_locked(nvmlDevice_t device, unsigned profileId, int *dev,
                                       struct fc_mig **m, const struct fc_gi_profile **p) {
    nvmlReturn_t r = gpu_locked(device, dev, m);
    if (r) return r;
    *p = fc_gi_profile_by_id(profileId);
    r = (*m)->mode != FC_MIG_ENABLE ? NVML_ERROR_NOT_SUPPORTED
        : !*p                       ? NVML_ERROR_INVALID_ARGUMENT
                                    : NVML_SUCCESS;
    if (r) fc_unlock();
    return r;
}

/* Placements of the profile free of every existing GPU instance. */
FC_API nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                             unsigned int profileId,
                                                             unsigned int *count) {
    int dev;
    struct fc_mig *m;
    const struct fc_gi_profile *p;
    nvmlReturn_t r = mig_profile_locked(device, profileId, &dev, &m, &p);
    if (r) return r;
    unsigned n = 0;
    for (unsigned k = 0; k < p->count; k++) {
        unsigned s = p->starts[k], busy = 0;
        for (int g = 0; g < FC_MIG_GI; g++)
            if (m->gi[g].live && s < m->gi[g].start + m->gi[g].size && m->gi[g].start < s + p->mem)
                busy = 1;
        n += !busy;
    }
    fc_unlock();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId,
                              const nvmlGpuInstancePlacement_t *placement, nvmlGpuInstance_t *out) {
    int dev;
    struct fc_mig *m;
    const struct fc_gi_profile *p;
    nvmlReturn_t r = mig_profile_locked(device, profileId, &dev, &m, &p);
    if (r) return r;
    int id = -2;
    if (out && !(placement && (placement->size != p->mem || placement->start >= 8)))
        id = fc_mig_create_gi_locked(m, p, placement ? (int)placement->start : -1);
    fc_unlock();
    if (id == -1) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (id < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *out = fn_gi_handle(dev, id);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                               nvmlGpuInstance_t *gpuInstance) {
    return create_gi(device, profileId, NULL, gpuInstance);
}

FC_API nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                            const nvmlGpuInstancePlacement_t *placement,
                                                            nvmlGpuInstance_t *gpuInstance) {
    if (!placement) {
        nvmlReturn_t r = fn_check_init();
        return r ? r : NVML_ERROR_INVALID_ARGUMENT;
    }
    return create_gi(device, profileId, placement, gpuInstance);
}

/* The GPU instances of a profile, by id. */
FC_API nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                             nvmlGpuInstance_t *gpuInstances, unsigned int *count) {
    int dev;
    struct fc_mig *m;
    const struct fc_gi_profile *p;
    nvmlReturn_t r = mig_profile_locked(device, profileId, &dev, &m, &p);
    if (r) return r;
    if (!gpuInstances || !count) {
        fc_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned n = 0;
    for (int g = 0; g < FC_MIG_GI; g++)
        if (m->gi[g].live && m->gi[g].profile == profileId) gpuInstances[n++] = fn_gi_handle(dev, g);
    fc_unlock();
    *count = n;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                nvmlGpuInstance_t *gpuInstance) {
    int dev;
    struct fc_mig *m;
    nvmlReturn_t r = gpu_locked(device, &dev, &m);
    if (r) return r;
    r = m->mode != FC_MIG_ENABLE       ? NVML_ERROR_NOT_SUPPORTED
        : !gpuInstance || id >= FC_MIG_GI ? NVML_ERROR_INVALID_ARGUMENT
        : !m->gi[id].live                 ? NVML_ERROR_NOT_FOUND
                                          : NVML_SUCCESS;
    fc_unlock();
    if (!r) *gpuInstance = fn_gi_handle(dev, (int)id);
    return r;
}

/* ---- GPU instances ---- */
FC_API nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    int dev, id;
    struct fc_gi *g;
    nvmlReturn_t r = gi_locked(gpuInstance, &dev, &id, &g);
    if (r) return r;
    nvmlGpuInstanceInfo_t o = {.device = fn_handle(dev), .id = (unsigned)id, .profileId = g->profile,
                               .placement = {.start = g->start, .size = g->size}};
    fc_unlock();
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    *info = o;
    return NVML_SUCCESS;
}

/* IN_USE while it has compute instances. */
FC_API nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance) {
    int dev, id;
    struct fc_gi *g;
    nvmlReturn_t r = gi_locked(gpuInstance, &dev, &id, &g);
    if (r) return r;
    for (int c = 0; c < FC_MIG_CI; c++)
        if (g->ci[c].live) r = NVML_ERROR_IN_USE;
    if (!r) memset(g, 0, sizeof *g);
    fc_unlock();
    return r;
}

/* ---- compute instance profiles: 1-slice, and the one covering the GPU instance ---- */
struct ci_info {
    unsigned id, slices, count, sms, ce, dec, jpeg, ofa;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
};

static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned profile, unsigned eng,
                               struct ci_info *o) {
    int dev, id;
    struct fc_gi *g;
    nvmlReturn_t r = gi_locked(gpuInstance, &dev, &id, &g);
    if (r) return r;
    const struct fc_gi_profile *p = fc_gi_profile_by_id(g->profile);
    unsigned mem = g->size;
    fc_unlock();
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || eng != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned c = fc_ci_slices(profile);
    if (!p || !c || (c != 1 && c != p->compute)) return NVML_ERROR_NOT_SUPPORTED;
    char n[64];
    o->id = profile; /* the A100's compute instance profile ids are the constants */
    o->slices = c;
    o->count = p->compute / c;
    o->sms = fc_mig_sms(c);
    o->ce = p->ce;
    o->dec = p->dec;
    o->jpeg = p->jpeg;
    o->ofa = p->ofa;
    fc_mig_profile_name(dev, p->compute, c, mem, n, sizeof n);
    snprintf(o->name, sizeof o->name, "MIG %s", n);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance,
                                                                unsigned int profile,
                                                                unsigned int engProfile,
                                                                nvmlComputeInstanceProfileInfo_t *info) {
    struct ci_info o;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &o);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->id = o.id;
    info->sliceCount = o.slices;
    info->instanceCount = o.count;
    info->multiprocessorCount = o.sms;
    info->sharedCopyEngineCount = o.ce;
    info->sharedDecoderCount = o.dec;
    info->sharedJpegCount = o.jpeg;
    info->sharedOfaCount = o.ofa;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                                 unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_v2_t *info) {
    struct ci_info o;
    nvmlReturn_t r = ci_profile(gpuInstance, profile, engProfile, &o);
    if (r) return r;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version == nvmlComputeInstanceProfileInfo_v2) {
        FILL_CI(info, nvmlComputeInstanceProfileInfo_v2, o);
    } else if (info->version == nvmlComputeInstanceProfileInfo_v3) {
        nvmlComputeInstanceProfileInfo_v3_t *v3 = (nvmlComputeInstanceProfileInfo_v3_t *)(void *)info;
        FILL_CI(v3, nvmlComputeInstanceProfileInfo_v3, o);
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* A live GPU instance and a compute instance profile it supports: locked on success. */
static nvmlReturn_t ci_profile_locked(nvmlGpuInstance_t gpuInstance, unsigned profileId, int *dev,
                                      int *id, struct fc_gi **g, unsigned *c) {
    nvmlReturn_t r = gi_locked(gpuInstance, dev, id, g);
    if (r) return r;
    unsigned gs = fc_gi_compute(*g);
    *c = fc_ci_slices(profileId);
    r = profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT ? NVML_ERROR_INVALID_ARGUMENT
        : (!*c || (*c != 1 && *c != gs))                 ? NVML_ERROR_NOT_SUPPORTED
                                                         : NVML_SUCCESS;
    if (r) fc_unlock();
    return r;
}

static int ci_busy(const struct fc_gi *g, unsigned s, unsigned c) {
    for (int i = 0; i < FC_MIG_CI; i++) {
        const struct fc_ci *ci = &g->ci[i];
        if (ci->live && s < ci->start + ci->size && ci->start < s + c) return 1;
    }
    return 0;
}

FC_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                      unsigned int profileId,
                                                                      unsigned int *count) {
    int dev, id;
    struct fc_gi *g;
    unsigned c;
    nvmlReturn_t r = ci_profile_locked(gpuInstance, profileId, &dev, &id, &g, &c);
    if (r) return r;
    unsigned n = 0, gs = fc_gi_compute(g);
    for (unsigned s = 0; s + c <= gs; s += c) n += !ci_busy(g, s, c);
    fc_unlock();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = n;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstancePlacement_t *placements, unsigned int *count) {
    int dev, id;
    struct fc_gi *g;
    unsigned c;
    nvmlReturn_t r = ci_profile_locked(gpuInstance, profileId, &dev, &id, &g, &c);
    if (r) return r;
    unsigned gs = fc_gi_compute(g);
    fc_unlock();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned s = 0; s + c <= gs; s += c, n++)
        if (placements) placements[n] = (nvmlComputeInstancePlacement_t){.start = s, .size = c};
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned profileId,
                              const nvmlComputeInstancePlacement_t *placement,
                              nvmlComputeInstance_t *out) {
    int dev, id;
    struct fc_gi *g;
    unsigned c;
    nvmlReturn_t r = ci_profile_locked(gpuInstance, profileId, &dev, &id, &g, &c);
    if (r) return r;
    int ci = -3;
    if (out && !(placement && (placement->size != c || placement->start >= 8)))
        ci = fc_mig_create_ci_locked(g, profileId, placement ? (int)placement->start : -1);
    fc_unlock();
    if (ci == -1) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (ci == -2) return NVML_ERROR_NOT_SUPPORTED;
    if (ci < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *out = fn_ci_handle(dev, id, ci);
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                        unsigned int profileId,
                                                        nvmlComputeInstance_t *computeInstance) {
    return create_ci(gpuInstance, profileId, NULL, computeInstance);
}

FC_API nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance) {
    if (!placement) {
        nvmlReturn_t r = fn_check_init();
        return r ? r : NVML_ERROR_INVALID_ARGUMENT;
    }
    return create_ci(gpuInstance, profileId, placement, computeInstance);
}

FC_API nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                      unsigned int profileId,
                                                      nvmlComputeInstance_t *computeInstances,
                                                      unsigned int *count) {
    int dev, id;
    struct fc_gi *g;
    unsigned c;
    nvmlReturn_t r = ci_profile_locked(gpuInstance, profileId, &dev, &id, &g, &c);
    if (r) return r;
    if (!computeInstances || !count) {
        fc_unlock();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned n = 0;
    for (int i = 0; i < FC_MIG_CI; i++)
        if (g->ci[i].live && g->ci[i].profile == profileId) computeInstances[n++] = fn_ci_handle(dev, id, i);
    fc_unlock();
    *count = n;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                         unsigned int id,
                                                         nvmlComputeInstance_t *computeInstance) {
    int dev, gid;
    struct fc_gi *g;
    nvmlReturn_t r = gi_locked(gpuInstance, &dev, &gid, &g);
    if (r) return r;
    r = !computeInstance || id >= FC_MIG_CI ? NVML_ERROR_INVALID_ARGUMENT
        : !g->ci[id].live                    ? NVML_ERROR_NOT_FOUND
                                             : NVML_SUCCESS;
    fc_unlock();
    if (!r) *computeInstance = fn_ci_handle(dev, gid, (int)id);
    return r;
}

/* ---- compute instances ---- */
FC_API nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                 nvmlComputeInstanceInfo_t *info) {
    int dev, gi, ci;
    struct fc_gi *g;
    nvmlReturn_t r = ci_locked(computeInstance, &dev, &gi, &ci, &g);
    if (r) return r;
    const struct fc_ci *c = &g->ci[ci];
    nvmlComputeInstanceInfo_t o = {.device = fn_handle(dev), .gpuInstance = fn_gi_handle(dev, gi),
                                   .id = (unsigned)ci, .profileId = c->profile,
                                   .placement = {.start = c->start, .size = c->size}};
    fc_unlock();
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    *info = o;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                              nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* IN_USE while a CUDA process has a context or memory on it. */
FC_API nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance) {
    int dev, gi, ci;
    struct fc_gi *g;
    nvmlReturn_t r = ci_locked(computeInstance, &dev, &gi, &ci, &g);
    if (r) return r;
    if (processes_using_locked(dev, gi, ci))
        r = NVML_ERROR_IN_USE;
    else
        memset(&g->ci[ci], 0, sizeof g->ci[ci]);
    fc_unlock();
    return r;
}
