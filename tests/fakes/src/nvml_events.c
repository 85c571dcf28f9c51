/* NVML events from FAKECUDA_EVENTS: a text file tests append lines to.
 *   xid DEV CODE   -> nvmlEventTypeXidCriticalError, eventData = CODE
 *   ecc DEV        -> nvmlEventTypeDoubleBitEccError
 *   healthy DEV    -> nvmlEventTypeGpuRecoveryAction, eventData = NVML_GPU_RECOVERY_ACTION_NONE
 *   lost DEV       -> nvmlEventTypeXidCriticalError, eventData = 79 (fallen off the bus; the
 *                     bus state itself is nvml_bus.c's, as are remove/add/replace)
 * In the process's first NVML session each event set reads the file from its beginning (no
 * event is lost to a race with registration); in a later session from where the file ended
 * when that session started (what happened before is history, as for the real NVML, whose
 * sets only see events after they exist), in order; a line is delivered to a set when that
 * set registered its device for its type.  Other lines are skipped.  A set lives until
 * nvmlEventSetFree or the end of its NVML session (the last nvmlShutdown). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvml_int.h"

struct nvmlEventSet_st {
    unsigned long long mask[FC_MAX_DEV];
    off_t offset;
    int live;
};

#define MAX_SETS 64
static struct nvmlEventSet_st sets[MAX_SETS];
static pthread_mutex_t sets_mutex = PTHREAD_MUTEX_INITIALIZER;
static off_t sets_from; /* where a new set starts reading */

static int valid_set(nvmlEventSet_t s) {
    return s >= &sets[0] && s < &sets[MAX_SETS] && s->live;
}

void fn_events_begin(int first) {
    off_t at = 0;
    const char *path = fc_knobs()->events_path;
    int fd = !first && path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0) { /* just after the last complete line */
        char buf[4096];
        off_t pos = 0;
        ssize_t n;
        while ((n = pread(fd, buf, sizeof buf, pos)) > 0) {
            for (ssize_t i = 0; i < n; i++)
                if (buf[i] == '\n') at = pos + i + 1;
            pos += n;
        }
        close(fd);
    }
    pthread_mutex_lock(&sets_mutex);
    sets_from = at;
    pthread_mutex_unlock(&sets_mutex);
}

void fn_events_reset(void) {
    pthread_mutex_lock(&sets_mutex);
    for (int i = 0; i < MAX_SETS; i++) sets[i].live = 0;
    pthread_mutex_unlock(&sets_mutex);
}

FC_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sets_mutex);
    static int next; /* slots in turn: a freed set's handle is not handed out again at once */
    for (int k = 0; k < MAX_SETS; k++) {
        int i = (next + k) % MAX_SETS;
        if (!sets[i].live) {
            next = i + 1;
            memset(&sets[i], 0, sizeof sets[i]);
            sets[i].live = 1;
            sets[i].offset = sets_from;
            *set = &sets[i];
            pthread_mutex_unlock(&sets_mutex);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&sets_mutex);
    return NVML_ERROR_MEMORY;
}

FC_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    pthread_mutex_lock(&sets_mutex);
    if (valid_set(set)) {
        set->live = 0;
        r = NVML_SUCCESS;
    } else {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_unlock(&sets_mutex);
    return r;
}

#define SUPPORTED (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError | \
                   nvmlEventTypeGpuRecoveryAction)

FC_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                    unsigned long long *eventTypes) {
    int i;
    struct fn_bus bus;
    nvmlReturn_t r = fn_gpu(device, &i, &bus);
    if (r) return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    if (!eventTypes) return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = SUPPORTED;
    return NVML_SUCCESS;
}

FC_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                            nvmlEventSet_t set) {
    int i;
    struct fn_bus bus;
    /* per-instance events through MIG handles are not supported (nvml.h): INVALID_ARGUMENT */
    nvmlReturn_t r = fn_gpu(device, &i, &bus);
    if (r) return r == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : r;
    if (eventTypes & ~(unsigned long long)nvmlEventTypeAll) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&sets_mutex);
    if (valid_set(set)) {
        set->mask[i] |= eventTypes;
        r = NVML_SUCCESS;
    } else {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_unlock(&sets_mutex);
    return r;
}

/* Parses one line; 1 (and dev, type, data filled) when it is an event line. */
static int parse(const char *line, int *dev, unsigned long long *type, unsigned long long *data) {
    char word[16];
    int d;
    unsigned long long code;
    if (sscanf(line, "%15s %d %llu", word, &d, &code) == 3 && strcmp(word, "xid") == 0) {
        *type = nvmlEventTypeXidCriticalError;
        *data = code;
    } else if (sscanf(line, "%15s %d", word, &d) == 2 && strcmp(word, "ecc") == 0) {
        *type = nvmlEventTypeDoubleBitEccError;
        *data = 0;
    } else if (sscanf(line, "%15s %d", word, &d) == 2 && strcmp(word, "healthy") == 0) {
        *type = nvmlEventTypeGpuRecoveryAction;
        *data = NVML_GPU_RECOVERY_ACTION_NONE;
    } else if (sscanf(line, "%15s %d", word, &d) == 2 && strcmp(word, "lost") == 0) {
        *type = nvmlEventTypeXidCriticalError;
        *data = 79; /* GPU has fallen off the bus */
    } else {
        return 0;
    }
    if (d < 0 || d >= fc_knobs()->ndev) return 0;
    *dev = d;
    return 1;
}

/* Delivers the next matching line after set->offset; 1 when one was found. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *out, int legacy) {
    const char *path = fc_knobs()->events_path;
    if (!path) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[4096];
    int found = 0;
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf - 1, set->offset);
        if (n <= 0) break;
        buf[n] = 0;
        char *nl = memchr(buf, '\n', (size_t)n);
        if (!nl) {
            if (n == sizeof buf - 1) set->offset += n; /* an absurd line: skip it */
            if (n == sizeof buf - 1) continue;
            break; /* a line still being written */
        }
        *nl = 0;
        set->offset += (nl - buf) + 1;
        int dev;
        unsigned long long type, data;
        if (parse(buf, &dev, &type, &data) && (set->mask[dev] & type) && fn_handle(dev)) {
            memset(out, 0, legacy ? offsetof(nvmlEventData_t, gpuInstanceId) : sizeof *out);
            out->device = fn_handle(dev);
            out->eventType = type;
            out->eventData = data;
            if (!legacy) out->gpuInstanceId = out->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
            found = 1;
            break;
        }
    }
    close(fd);
    return found;
}

static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms,
                               int legacy) {
    nvmlReturn_t r = fn_check_init();
    if (r) return r;
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t deadline = fc_now() + (uint64_t)timeoutms * 1000000ull;
    for (;;) {
        pthread_mutex_lock(&sets_mutex);
        if (!valid_set(set)) {
            pthread_mutex_unlock(&sets_mutex);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        int got = next_event(set, data, legacy);
        pthread_mutex_unlock(&sets_mutex);
        if (got) return NVML_SUCCESS;
        uint64_t now = fc_now();
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        uint64_t step = 10000000ull; /* poll the file every 10 ms */
        fc_sleep_until(now + (deadline - now < step ? deadline - now : step));
    }
}

FC_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                       unsigned int timeoutms) {
    return wait_event(set, data, timeoutms, 0);
}

FC_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                    unsigned int timeoutms) {
    return wait_event(set, data, timeoutms, 1);
}
