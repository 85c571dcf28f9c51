/* NVML as the workload sees it: the memory of a limited device reads total =
 * limit, used = the container's usage (the same numbers cuMemGetInfo gives; vLLM
 * compares the two), and the compute process list shows the container's own
 * processes only, with their container PIDs and charged memory.
 *
 * Which row is whose: drivers before 560 list host PIDs, matched against the host
 * PIDs of the container's processes (registration, pidmap.c); drivers from 560 on
 * list PIDs as seen from the caller's PID namespace (processes it cannot see are left
 * out), matched against the container PIDs themselves. In Kubernetes mode a row that
 * matches no process of the container is never shown, even before any mapping is
 * known: another container's processes are not this container's business. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static nvmlDevice_t handles[VG_MAX_DEVICES];
static unsigned char resolved[VG_MAX_DEVICES];
VG_MUTEX(mu);
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_ok;

static void init_nvml(void)
{
    if (!vg_real.nvmlInit_v2) {
        VG_INFO("NVML unavailable: SM limits and context measurement degrade");
        return;
    }
    nvmlReturn_t r = vg_real.nvmlInit_v2();
    nvml_ok = r == NVML_SUCCESS;
    if (!nvml_ok) VG_WARN("nvmlInit_v2 failed (%d)", (int)r);
}

/* NVML is initialised at its first use, never before the shim is (its entry points are
 * resolved by then): every caller runs after a hook has initialised the shim */
int vg_nvml_ready(void)
{
    if (!vg_init_done()) return 0;
    pthread_once(&nvml_once, init_nvml);
    return nvml_ok;
}

nvmlDevice_t vg_nvml_device(int dev)
{
    if (dev < 0 || dev >= VG_MAX_DEVICES) return NULL;
    if (__atomic_load_n(&resolved[dev], __ATOMIC_ACQUIRE)) return handles[dev];
    if (!vg_nvml_ready()) return NULL;
    vg_lock(&mu);
    if (!resolved[dev]) {
        nvmlDevice_t h = NULL;
        const char *uuid = vg_cfg.dev[dev].uuid;
        if (uuid[0] && vg_real.nvmlDeviceGetHandleByUUID) {
            if (vg_real.nvmlDeviceGetHandleByUUID(uuid, &h) != NVML_SUCCESS) h = NULL;
        } else if (vg_real.nvmlDeviceGetHandleByIndex_v2) {
            /* no UUID in the config: NVML index = CUDA ordinal (standalone use) */
            if (vg_real.nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &h) != NVML_SUCCESS) h = NULL;
        }
        handles[dev] = h;
        __atomic_store_n(&resolved[dev], 1, __ATOMIC_RELEASE);
    }
    vg_unlock(&mu);
    return handles[dev];
}

int vg_nvml_namespace_pids(void)
{
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (v >= 0) return v;
    char version[96] = {0};
    v = 0;
    if (!vg_init_done()) return 0; /* not known yet: asked again later */
    if (vg_nvml_ready() && vg_real.nvmlSystemGetDriverVersion &&
        vg_real.nvmlSystemGetDriverVersion(version, sizeof version) == NVML_SUCCESS)
        v = atoi(version) >= 560;
    __atomic_store_n(&cached, v, __ATOMIC_RELEASE);
    return v;
}

static int ordinal_of(nvmlDevice_t h)
{
    if (!h) return -1;
    int n = vg_cfg.device_count > VG_MAX_DEVICES ? VG_MAX_DEVICES : vg_cfg.device_count;
    for (int d = 0; d < n; d++)
        if (vg_nvml_device(d) == h) return d;
    return -1;
}

static int limited(int dev)
{
    return dev >= 0 && (vg_cfg.deny || vg_cfg.dev[dev].memory_limit);
}

static void slice(int dev, unsigned long long *total, unsigned long long *used,
                  unsigned long long *free_b)
{
    uint64_t limit = vg_cfg.deny ? 0 : vg_cfg.dev[dev].memory_limit;
    uint64_t u = vg_state_used(dev) + vg_state_spilled(dev);
    *total = limit;
    *used = u;
    *free_b = u < limit ? limit - u : 0;
}

nvmlReturn_t vg_impl_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t r = vg_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (r != NVML_SUCCESS || !memory) return r;
    int dev = ordinal_of(device);
    if (limited(dev)) slice(dev, &memory->total, &memory->used, &memory->free);
    return r;
}

nvmlReturn_t vg_impl_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t r = vg_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (r != NVML_SUCCESS || !memory) return r;
    int dev = ordinal_of(device);
    if (limited(dev)) {
        slice(dev, &memory->total, &memory->used, &memory->free);
        memory->reserved = 0;
    }
    return r;
}

/* The container's view of a device's process list, in a common form. */
typedef struct { unsigned pid; unsigned long long mem; unsigned gi, ci; } proc_row;

/* Which of a device's processes are the container's: its processes' host PIDs (or, with
 * drivers that list namespace PIDs, their own PIDs) from the usage state. */
typedef struct {
    int all;   /* pass everything through (not a device of ours, outside Kubernetes) */
    int by_ns; /* NVML lists PIDs of our namespace */
    int m;
    int cp[VG_MAX_SLOTS], hp[VG_MAX_SLOTS];
    uint64_t used[VG_MAX_SLOTS];
} view;

static void container_view(nvmlDevice_t device, view *v)
{
    int dev = ordinal_of(device);
    v->all = 0;
    v->m = 0;
    v->by_ns = vg_nvml_namespace_pids();
    if (dev < 0 && !vg_cfg.kube) {
        v->all = 1;
        return;
    }
    v->m = dev < 0 ? 0 : vg_state_processes(dev, v->cp, v->hp, v->used, VG_MAX_SLOTS);
    int known = 0;
    for (int i = 0; i < v->m; i++) known += v->by_ns || v->hp[i] > 0;
    v->all = known == 0 && !vg_cfg.kube; /* standalone, nothing mapped: the driver's list */
}

/* the slot of the container's process NVML names pid, or -1 */
static int view_slot(const view *v, unsigned pid)
{
    for (int j = 0; j < v->m; j++)
        if (v->by_ns ? (unsigned)v->cp[j] == pid : v->hp[j] > 0 && (unsigned)v->hp[j] == pid)
            return j;
    return -1;
}

/* Keeps, in place and in order, the rows (size bytes each, the PID an unsigned at pid_at)
 * of the container's own processes, each under its own PID; returns how many. slots (if
 * given, VG_MAX_SLOTS long) gets the first kept rows' slots in the view. Every NVML view of the GPU's processes
 * is filtered through here. */
static unsigned own_rows(const view *v, void *rows, size_t size, size_t pid_at, unsigned n,
                         int *slots)
{
    unsigned char *r = rows;
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned pid;
        memcpy(&pid, r + i * size + pid_at, sizeof pid);
        int j = view_slot(v, pid);
        if (j < 0) continue;
        if (k != i) memmove(r + k * size, r + i * size, size);
        pid = (unsigned)v->cp[j];
        memcpy(r + k * size + pid_at, &pid, sizeof pid);
        if (slots && k < VG_MAX_SLOTS) slots[k] = j;
        k++;
    }
    return k;
}

static int container_rows(nvmlDevice_t device, const proc_row *all, int n, proc_row *out)
{
    view v;
    container_view(device, &v);
    if (v.all) {
        memcpy(out, all, sizeof *out * (size_t)n);
        return n;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        int j = view_slot(&v, all[i].pid);
        if (j < 0) continue;
        out[k] = all[i];
        out[k].pid = (unsigned)v.cp[j];
        out[k].mem = v.used[j];
        k++;
    }
    return k;
}

/* Every row of a list NVML fills (room in, rows out), however many there are: the buffer
 * grows until they fit (a few tries: processes come and go). *out is malloc'd, to free. */
typedef nvmlReturn_t (*fill_fn)(nvmlDevice_t device, const void *arg, void *buf, unsigned *n);

static nvmlReturn_t read_whole(fill_fn fill, nvmlDevice_t device, const void *arg, size_t size,
                               void **out, unsigned *count)
{
    void *buf = NULL;
    unsigned n = 0;
    nvmlReturn_t r = NVML_ERROR_INSUFFICIENT_SIZE;
    for (int tries = 0; tries < 4 && r == NVML_ERROR_INSUFFICIENT_SIZE; tries++) {
        unsigned room = n + 64; /* NVML says how many it has when they do not fit */
        void *grown = realloc(buf, size * room);
        if (!grown) {
            r = NVML_ERROR_MEMORY;
            break;
        }
        buf = grown;
        n = room;
        r = fill(device, arg, buf, &n);
    }
    if (r != NVML_SUCCESS) {
        free(buf);
        return r == NVML_ERROR_INSUFFICIENT_SIZE ? NVML_ERROR_UNKNOWN : r;
    }
    *out = buf;
    *count = n;
    return r;
}

static nvmlReturn_t fill_samples(nvmlDevice_t device, const void *since, void *buf, unsigned *n)
{
    return vg_real.nvmlDeviceGetProcessUtilization(device, buf, n,
                                                   *(const unsigned long long *)since);
}

nvmlReturn_t vg_nvml_samples(nvmlDevice_t device, unsigned long long since,
                             nvmlProcessUtilizationSample_t **out, unsigned *count)
{
    return read_whole(fill_samples, device, &since, sizeof **out, (void **)out, count);
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v2_t *);

static nvmlReturn_t fill_list(nvmlDevice_t device, const void *fn, void *buf, unsigned *n)
{
    return (*(const list_fn *)fn)(device, n, buf);
}

static nvmlReturn_t all_rows(list_fn fn, nvmlDevice_t device, nvmlProcessInfo_v2_t **out,
                             unsigned *count)
{
    return read_whole(fill_list, device, &fn, sizeof **out, (void **)out, count);
}

nvmlReturn_t vg_nvml_compute_processes(nvmlDevice_t device, nvmlProcessInfo_t **out,
                                       unsigned *count)
{
    return all_rows(vg_real.nvmlDeviceGetComputeRunningProcesses_v3, device, out, count);
}

/* Per-process SM samples: the container's own only, under their own PIDs (another
 * container's host PIDs and SM use are none of its business). */
nvmlReturn_t vg_impl_nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                     nvmlProcessUtilizationSample_t *utilization,
                                                     unsigned int *count,
                                                     unsigned long long lastSeen)
{
    if (!count) return vg_real.nvmlDeviceGetProcessUtilization(device, utilization, count, lastSeen);
    view v;
    container_view(device, &v);
    if (v.all) return vg_real.nvmlDeviceGetProcessUtilization(device, utilization, count, lastSeen);
    /* every sample the driver has, however many processes there are (never the driver's
     * unfiltered list for want of room) */
    nvmlProcessUtilizationSample_t *buf = NULL;
    unsigned n = 0;
    nvmlReturn_t r = vg_nvml_samples(device, lastSeen, &buf, &n);
    if (r != NVML_SUCCESS) return r;
    unsigned k = own_rows(&v, buf, sizeof *buf, offsetof(nvmlProcessUtilizationSample_t, pid), n,
                          NULL);
    nvmlReturn_t out = NVML_SUCCESS;
    if (k == 0) {
        out = NVML_ERROR_NOT_FOUND; /* as the driver answers when it has no sample */
    } else if (!utilization || *count < k) {
        out = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        memcpy(utilization, buf, sizeof *buf * k);
    }
    if (out != NVML_ERROR_NOT_FOUND) *count = k;
    free(buf);
    return out;
}

static nvmlReturn_t finish(unsigned int *count, int k, void *infos, const proc_row *rows,
                           int version)
{
    if (*count < (unsigned)k || (!infos && k > 0)) {
        *count = (unsigned)k;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < k; i++) {
        if (version == 1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + i;
            o->pid = rows[i].pid;
            o->usedGpuMemory = rows[i].mem;
        } else {
            nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + i;
            o->pid = rows[i].pid;
            o->usedGpuMemory = rows[i].mem;
            o->gpuInstanceId = rows[i].gi;
            o->computeInstanceId = rows[i].ci;
        }
    }
    *count = (unsigned)k;
    return NVML_SUCCESS;
}

/* The container's rows of a process list, in the caller's form (version 1 or 2/3); fn
 * reads the driver's rows in the v2 form. Never the driver's own, unfiltered, list. */
static nvmlReturn_t list_rows(list_fn fn, nvmlDevice_t device, unsigned int *count, void *infos,
                              int version)
{
    nvmlProcessInfo_v2_t *buf;
    unsigned n;
    nvmlReturn_t r = all_rows(fn, device, &buf, &n);
    if (r != NVML_SUCCESS) return r;
    proc_row *all = malloc(sizeof *all * (n ? n : 1) * 2), *rows = all ? all + (n ? n : 1) : NULL;
    if (!all) {
        free(buf);
        return NVML_ERROR_MEMORY;
    }
    for (unsigned i = 0; i < n; i++)
        all[i] = (proc_row){buf[i].pid, buf[i].usedGpuMemory, buf[i].gpuInstanceId,
                            buf[i].computeInstanceId};
    int k = container_rows(device, all, (int)n, rows);
    r = finish(count, k, infos, rows, version);
    free(all);
    free(buf);
    return r;
}

/* the v1 rows of fn, read through a v1 buffer, in the v2 form all_rows grows */
typedef nvmlReturn_t (*v1_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);

static nvmlReturn_t rows_from_v1(v1_fn fn, nvmlDevice_t device, unsigned int *n,
                                 nvmlProcessInfo_v2_t *out)
{
    nvmlProcessInfo_v1_t *v1 = malloc(sizeof *v1 * (*n ? *n : 1));
    if (!v1) return NVML_ERROR_MEMORY;
    nvmlReturn_t r = fn(device, n, v1);
    if (r == NVML_SUCCESS)
        for (unsigned i = 0; i < *n; i++)
            out[i] = (nvmlProcessInfo_v2_t){.pid = v1[i].pid,
                                            .usedGpuMemory = v1[i].usedGpuMemory};
    free(v1);
    return r;
}

/* The three forms (v1, v2, v3) of one process list (compute, graphics, MPS clients): the
 * container's own rows, however the caller asks. */
#define PROCESS_LIST(list)                                                                 \
    static nvmlReturn_t list##_v1_rows(nvmlDevice_t device, unsigned int *n,              \
                                       nvmlProcessInfo_v2_t *out)                         \
    {                                                                                      \
        return rows_from_v1(vg_real.nvmlDeviceGet##list, device, n, out);                 \
    }                                                                                      \
    nvmlReturn_t vg_impl_nvmlDeviceGet##list##_v3(nvmlDevice_t device,                    \
                                                  unsigned int *infoCount,                \
                                                  nvmlProcessInfo_t *infos)               \
    {                                                                                      \
        list_fn fn = vg_real.nvmlDeviceGet##list##_v3;                                    \
        return infoCount ? list_rows(fn, device, infoCount, infos, 2)                      \
                         : fn(device, infoCount, infos);                                   \
    }                                                                                      \
    nvmlReturn_t vg_impl_nvmlDeviceGet##list##_v2(nvmlDevice_t device,                    \
                                                  unsigned int *infoCount,                \
                                                  nvmlProcessInfo_v2_t *infos)            \
    {                                                                                      \
        list_fn fn = vg_real.nvmlDeviceGet##list##_v2;                                    \
        return infoCount ? list_rows(fn, device, infoCount, infos, 2)                      \
                         : fn(device, infoCount, infos);                                   \
    }                                                                                      \
    nvmlReturn_t vg_impl_nvmlDeviceGet##list(nvmlDevice_t device, unsigned int *infoCount, \
                                             nvmlProcessInfo_v1_t *infos)                 \
    {                                                                                      \
        if (!infoCount) return vg_real.nvmlDeviceGet##list(device, infoCount, infos);     \
        return list_rows(list##_v1_rows, device, infoCount, infos, 1);                    \
    }

PROCESS_LIST(ComputeRunningProcesses)
PROCESS_LIST(GraphicsRunningProcesses)
PROCESS_LIST(MPSComputeRunningProcesses)

/* ---- the newer views of the same processes ---- */

static nvmlReturn_t fill_detail(nvmlDevice_t device, const void *mode, void *buf, unsigned *n)
{
    nvmlProcessDetailList_t l = {nvmlProcessDetailList_v1, *(const unsigned *)mode, *n, buf};
    nvmlReturn_t r = vg_real.nvmlDeviceGetRunningProcessDetailList(device, &l);
    *n = l.numProcArrayEntries;
    return r;
}

/* A struct version the shim does not know could carry rows it cannot filter: refused. */
nvmlReturn_t vg_impl_nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                           nvmlProcessDetailList_t *plist)
{
    view v;
    container_view(device, &v);
    if (!plist || v.all) return vg_real.nvmlDeviceGetRunningProcessDetailList(device, plist);
    if (plist->version != nvmlProcessDetailList_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlProcessDetail_v1_t *buf = NULL;
    unsigned n = 0;
    nvmlReturn_t r = read_whole(fill_detail, device, &plist->mode, sizeof *buf, (void **)&buf, &n);
    if (r != NVML_SUCCESS) return r;
    int slots[VG_MAX_SLOTS];
    unsigned k = own_rows(&v, buf, sizeof *buf, offsetof(nvmlProcessDetail_v1_t, pid), n, slots);
    for (unsigned i = 0; i < k && i < VG_MAX_SLOTS; i++)
        buf[i].usedGpuMemory = v.used[slots[i]]; /* as charged */
    if (!plist->procArray || plist->numProcArrayEntries < k) {
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (k) {
        memcpy(plist->procArray, buf, sizeof *buf * k);
    }
    plist->numProcArrayEntries = k;
    free(buf);
    return r;
}

static nvmlReturn_t fill_util_info(nvmlDevice_t device, const void *since, void *buf, unsigned *n)
{
    nvmlProcessesUtilizationInfo_t l = {nvmlProcessesUtilizationInfo_v1, *n,
                                        *(const unsigned long long *)since, buf};
    nvmlReturn_t r = vg_real.nvmlDeviceGetProcessesUtilizationInfo(device, &l);
    *n = l.processSamplesCount;
    return r;
}

nvmlReturn_t vg_impl_nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                           nvmlProcessesUtilizationInfo_t *info)
{
    view v;
    container_view(device, &v);
    if (!info || v.all) return vg_real.nvmlDeviceGetProcessesUtilizationInfo(device, info);
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlProcessUtilizationInfo_v1_t *buf = NULL;
    unsigned n = 0;
    nvmlReturn_t r = read_whole(fill_util_info, device, &info->lastSeenTimeStamp, sizeof *buf,
                                (void **)&buf, &n);
    if (r != NVML_SUCCESS) return r;
    unsigned k = own_rows(&v, buf, sizeof *buf, offsetof(nvmlProcessUtilizationInfo_v1_t, pid),
                          n, NULL);
    if (k == 0) {
        r = NVML_ERROR_NOT_FOUND; /* as the driver answers when it has no sample */
    } else {
        if (!info->procUtilArray || info->processSamplesCount < k)
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            memcpy(info->procUtilArray, buf, sizeof *buf * k);
        info->processSamplesCount = k;
    }
    free(buf);
    return r;
}

static nvmlReturn_t fill_pids(nvmlDevice_t device, const void *unused, void *buf, unsigned *n)
{
    (void)unused;
    return vg_real.nvmlDeviceGetAccountingPids(device, n, buf);
}

/* Accounting keeps every process that used the GPU: the container's own only, by their
 * own PIDs. */
nvmlReturn_t vg_impl_nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count,
                                                 unsigned int *pids)
{
    view v;
    container_view(device, &v);
    if (!count || v.all) return vg_real.nvmlDeviceGetAccountingPids(device, count, pids);
    unsigned *buf = NULL, n = 0;
    nvmlReturn_t r = read_whole(fill_pids, device, NULL, sizeof *buf, (void **)&buf, &n);
    if (r != NVML_SUCCESS) return r;
    unsigned k = own_rows(&v, buf, sizeof *buf, 0, n, NULL);
    if (!pids || *count < k) r = NVML_ERROR_INSUFFICIENT_SIZE;
    else if (k) memcpy(pids, buf, sizeof *buf * k);
    *count = k;
    free(buf);
    return r;
}

/* the PID NVML knows for the container's process pid (its own PID as the caller sees
 * it), or 0 when pid is none of the container's */
static unsigned nvml_pid_of(const view *v, unsigned pid)
{
    for (int j = 0; j < v->m; j++)
        if ((unsigned)v->cp[j] == pid)
            return v->by_ns ? pid : v->hp[j] > 0 ? (unsigned)v->hp[j] : 0;
    return 0;
}

nvmlReturn_t vg_impl_nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid,
                                                  nvmlAccountingStats_t *stats)
{
    view v;
    container_view(device, &v);
    if (v.all) return vg_real.nvmlDeviceGetAccountingStats(device, pid, stats);
    unsigned theirs = nvml_pid_of(&v, pid);
    if (!theirs) return NVML_ERROR_NOT_FOUND; /* as for a PID accounting never saw */
    return vg_real.nvmlDeviceGetAccountingStats(device, theirs, stats);
}

nvmlReturn_t vg_impl_nvmlDeviceGetAccountingStats_v2(nvmlDevice_t device,
                                                     nvmlAccountingStats_v2_t *stats)
{
    view v;
    container_view(device, &v);
    if (!stats || v.all) return vg_real.nvmlDeviceGetAccountingStats_v2(device, stats);
    unsigned mine = stats->pid, theirs = nvml_pid_of(&v, mine);
    if (!theirs) return NVML_ERROR_NOT_FOUND;
    stats->pid = theirs;
    nvmlReturn_t r = vg_real.nvmlDeviceGetAccountingStats_v2(device, stats);
    stats->pid = mine;
    return r;
}

/* The device's utilisation is every tenant's: the container reads its own, its
 * processes' latest samples of the last second summed (0 when NVML has none). */
nvmlReturn_t vg_impl_nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u)
{
    nvmlReturn_t r = vg_real.nvmlDeviceGetUtilizationRates(device, u);
    if (r != NVML_SUCCESS || !u) return r;
    view v;
    container_view(device, &v);
    if (v.all) return r;
    unsigned long long since = vg_realtime_ns() / 1000 - 1000000ull, newest[VG_MAX_SLOTS] = {0};
    unsigned sm[VG_MAX_SLOTS] = {0}, mem[VG_MAX_SLOTS] = {0};
    nvmlProcessUtilizationSample_t *buf = NULL;
    unsigned n = 0;
    if (vg_nvml_samples(device, since, &buf, &n) == NVML_SUCCESS) {
        for (unsigned i = 0; i < n; i++) {
            int j = view_slot(&v, buf[i].pid);
            if (j < 0 || buf[i].timeStamp < newest[j]) continue;
            newest[j] = buf[i].timeStamp;
            sm[j] = buf[i].smUtil;
            mem[j] = buf[i].memUtil;
        }
        free(buf);
    }
    unsigned gpu = 0, memory = 0;
    for (int j = 0; j < v.m; j++) {
        gpu += sm[j];
        memory += mem[j];
    }
    u->gpu = gpu > 100 ? 100 : gpu;
    u->memory = memory > 100 ? 100 : memory;
    return r;
}
