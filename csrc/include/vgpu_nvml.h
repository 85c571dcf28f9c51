/* The subset of the NVML ABI the shim uses (official names, values and layouts;
 * checked against nvml.h of the nvidia-nvml-dev wheel by tests/shim/test_build.py). */
#ifndef VGPU_NVML_H
#define VGPU_NVML_H

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* a process's details (nvmlDeviceGetRunningProcessDetailList) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct {
    unsigned int version;
    unsigned int mode; /* compute, graphics, MPS */
    unsigned int numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_v1_t;
typedef nvmlProcessDetailList_v1_t nvmlProcessDetailList_t;
#define nvmlProcessDetailList_v1 ((unsigned int)(sizeof(nvmlProcessDetailList_v1_t) | (1U << 24U)))

/* per-process utilisation, the newer form (nvmlDeviceGetProcessesUtilizationInfo) */
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
    unsigned int jpgUtil;
    unsigned int ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
typedef nvmlProcessesUtilizationInfo_v1_t nvmlProcessesUtilizationInfo_t;
#define nvmlProcessesUtilizationInfo_v1 \
    ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (1U << 24U)))

typedef struct nvmlAccountingStats_st {
    unsigned int gpuUtilization;
    unsigned int memoryUtilization;
    unsigned long long maxMemoryUsage;
    unsigned long long time;
    unsigned long long startTime;
    unsigned int isRunning;
    unsigned int reserved[5];
} nvmlAccountingStats_t;

typedef struct {
    unsigned int pid;
    unsigned int isRunning;
    unsigned int gpuUtilization;
    unsigned int memoryUtilization;
    unsigned long long maxMemoryUsage;
    unsigned int sampleCount;
    unsigned long long sumGpuUtil;
    unsigned long long sumFbUtil;
    unsigned long long time;
    unsigned long long startTime;
} nvmlAccountingStats_v2_t;

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

#endif
