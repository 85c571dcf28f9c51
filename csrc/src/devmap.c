/* CUDA ordinals -> the config's devices, by UUID.
 *
 * The plugin lists a container's GPUs by UUID (device.N.uuid). Inside the container a
 * framework may reorder or hide them with its own CUDA_VISIBLE_DEVICES, so CUDA
 * ordinal i is not the config's device i. Each ordinal is resolved once, with
 * cuDeviceGetUuid_v2 (or cuDeviceGetUuid on old drivers), and matched against the
 * config's UUIDs; the usage state, the limits and the SM controller are all indexed by
 * the config's device index, so every process of the container agrees whatever its
 * own ordinal order.
 *
 * Without UUIDs in the config (the VGPUD_* environment, or a hand-written file), the
 * ordinal is the index. With UUIDs, an ordinal whose GPU the file does not list gets
 * no device memory (-1): a GPU nobody granted must not be usable unaccounted. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "shim.h"

#define ORDINALS 64
static int resolved[ORDINALS];  /* 0 not yet, 1 resolved */
static int index_of[ORDINALS];
static int ordinal_of[VG_MAX_DEVICES];
VG_MUTEX(mu);

static int has_uuids(void)
{
    for (int i = 0; i < vg_cfg.device_count && i < VG_MAX_DEVICES; i++)
        if (vg_cfg.dev[i].uuid[0]) return 1;
    return 0;
}

static int resolve(CUdevice ordinal)
{
    if (vg_cfg.deny) return -1;
    if (!has_uuids()) return ordinal < VG_MAX_DEVICES ? ordinal : -1;
    CUuuid u, gpu;
    CUresult r = vg_real.cuDeviceGetUuid_v2 ? vg_real.cuDeviceGetUuid_v2(&u, ordinal)
                 : vg_real.cuDeviceGetUuid ? vg_real.cuDeviceGetUuid(&u, ordinal)
                                           : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS) {
        VG_ERROR("cannot read the UUID of CUDA device %d (%d): no device memory there",
                 ordinal, (int)r);
        return -1;
    }
    /* On a MIG device _v2 gives the instance's UUID and the old call its GPU's: when the
     * two differ the device is a MIG instance, named MIG-<uuid> (as NVML names it). */
    int mig = vg_real.cuDeviceGetUuid_v2 && vg_real.cuDeviceGetUuid &&
              vg_real.cuDeviceGetUuid(&gpu, ordinal) == CUDA_SUCCESS &&
              memcmp(gpu.bytes, u.bytes, sizeof u.bytes) != 0;
    const unsigned char *b = (const unsigned char *)u.bytes;
    char text[48];
    snprintf(text, sizeof text,
             "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             mig ? "MIG" : "GPU", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
             b[10], b[11], b[12], b[13], b[14], b[15]);
    for (int i = 0; i < vg_cfg.device_count && i < VG_MAX_DEVICES; i++)
        if (!strcasecmp(vg_cfg.dev[i].uuid, text)) return i;
    VG_WARN("CUDA device %d (%s) is not one of this container's GPUs: no device memory "
            "there", ordinal, text);
    return -1;
}

int vg_dev_index(CUdevice ordinal)
{
    if (ordinal < 0 || ordinal >= ORDINALS) return -1;
    if (__atomic_load_n(&resolved[ordinal], __ATOMIC_ACQUIRE)) return index_of[ordinal];
    vg_lock(&mu);
    if (!resolved[ordinal]) {
        int idx = resolve(ordinal);
        index_of[ordinal] = idx;
        if (idx >= 0) ordinal_of[idx] = ordinal + 1;
        __atomic_store_n(&resolved[ordinal], 1, __ATOMIC_RELEASE);
    }
    vg_unlock(&mu);
    return index_of[ordinal];
}

int vg_dev_ordinal(int index)
{
    if (index < 0 || index >= VG_MAX_DEVICES) return -1;
    vg_lock(&mu);
    int o = ordinal_of[index] - 1;
    vg_unlock(&mu);
    return o;
}

int vg_current(CUdevice *ordinal, int *index)
{
    CUdevice d;
    if (!vg_real.cuCtxGetDevice || vg_real.cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0) return 0;
    if (ordinal) *ordinal = d;
    if (index) *index = vg_dev_index(d);
    return 1;
}

/* The special streams: the NULL stream and its two named forms run in the current context. */
#define STREAM_LEGACY ((CUstream)0x1)
#define STREAM_PER_THREAD ((CUstream)0x2)

int vg_stream_device(CUstream s, CUdevice *ordinal, int *index)
{
    if (s == NULL || s == STREAM_LEGACY || s == STREAM_PER_THREAD) return vg_current(ordinal, index);
    CUdevice d = -1;
    CUcontext c = NULL, popped = NULL;
    if (vg_real.cuStreamGetDevice && vg_real.cuStreamGetDevice(s, &d) == CUDA_SUCCESS) {
        /* CUDA 12.8+: asked directly */
    } else if (vg_real.cuStreamGetCtx && vg_real.cuStreamGetCtx(s, &c) == CUDA_SUCCESS && c &&
               vg_real.cuCtxPushCurrent_v2 && vg_real.cuCtxPopCurrent_v2 &&
               vg_real.cuCtxPushCurrent_v2(c) == CUDA_SUCCESS) {
        /* older drivers: the stream's context, made current for a moment */
        if (vg_real.cuCtxGetDevice(&d) != CUDA_SUCCESS) d = -1;
        vg_real.cuCtxPopCurrent_v2(&popped);
    } else {
        return vg_current(ordinal, index); /* the driver will refuse the stream itself */
    }
    if (d < 0) return 0;
    if (ordinal) *ordinal = d;
    if (index) *index = vg_dev_index(d);
    return 1;
}
