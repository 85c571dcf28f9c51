/* Prints the values and layouts the fake relies on.  Built twice by
 * tests/fakes_selftest/test_abi_layout.py: with -DOFFICIAL against the official cuda.h and
 * nvml.h, and without, against the fake's own declarations; both outputs must agree. */
#include <stddef.h>
#include <stdio.h>

#ifdef OFFICIAL
#include <cuda.h>
#include <nvml.h>
#else
#include "../src/cutypes.h"
#include "../src/nvmltypes.h"
#endif

#define V(x) printf("%s %lld\n", #x, (long long)(x));
#define S(t) printf("sizeof(%s) %zu\n", #t, sizeof(t));
#define O(t, f) printf("offsetof(%s,%s) %zu\n", #t, #f, offsetof(t, f));

int main(void) {
    V(CUDA_ERROR_INVALID_VALUE) V(CUDA_ERROR_OUT_OF_MEMORY) V(CUDA_ERROR_NOT_INITIALIZED)
    V(CUDA_ERROR_NO_DEVICE) V(CUDA_ERROR_INVALID_DEVICE) V(CUDA_ERROR_INVALID_CONTEXT)
    V(CUDA_ERROR_FILE_NOT_FOUND) V(CUDA_ERROR_INVALID_HANDLE) V(CUDA_ERROR_NOT_FOUND)
    V(CUDA_ERROR_NOT_READY) V(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    V(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) V(CUDA_ERROR_NOT_SUPPORTED) V(CUDA_ERROR_UNKNOWN)
    V(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) V(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)
    V(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) V(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
    V(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) V(CU_DEVICE_ATTRIBUTE_MAX)
    V(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) V(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
    V(CU_AD_FORMAT_FLOAT) V(CU_AD_FORMAT_HALF) V(CU_MEM_ATTACH_GLOBAL)
    V(CU_MEM_LOCATION_TYPE_DEVICE) V(CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
    V(CU_MEM_ALLOCATION_TYPE_PINNED) V(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    V(CU_MEM_ACCESS_FLAGS_PROT_READWRITE) V(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    V(CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    V((long long)(uintptr_t)CU_STREAM_PER_THREAD)
    S(CUuuid) S(CUDA_ARRAY_DESCRIPTOR) S(CUDA_ARRAY3D_DESCRIPTOR)
    O(CUDA_ARRAY3D_DESCRIPTOR, Format) O(CUDA_ARRAY3D_DESCRIPTOR, Flags)
    S(CUmemLocation) S(CUmemAllocationProp) O(CUmemAllocationProp, location)
    O(CUmemAllocationProp, allocFlags) S(CUmemAccessDesc) S(CUmemPoolProps)
    O(CUmemPoolProps, maxSize) S(CUlaunchConfig) O(CUlaunchConfig, hStream)
    O(CUlaunchConfig, numAttrs) S(CUDA_KERNEL_NODE_PARAMS_v2) O(CUDA_KERNEL_NODE_PARAMS_v2, ctx)
    S(CUctxCreateParams) S(CUexecAffinityParam)
    V(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) V(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
    V(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) V(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
    V(CU_GRAPH_NODE_TYPE_KERNEL) V(CU_GRAPH_NODE_TYPE_EMPTY) V(CU_GRAPH_NODE_TYPE_MEM_ALLOC)
    V(CU_GRAPH_NODE_TYPE_MEM_FREE) V(CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES)
    V(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) V(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    V(CU_MEMPOOL_ATTR_USED_MEM_CURRENT) V(CU_MEM_LOCATION_TYPE_HOST_NUMA)
    S(CUDA_MEM_ALLOC_NODE_PARAMS) O(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs)
    O(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescCount) O(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize)
    O(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) O(CUmemPoolProps, location) O(CUmemPoolProps, usage)
    O(CUmemAccessDesc, flags) S(CUDA_KERNEL_NODE_PARAMS_v1) O(CUDA_KERNEL_NODE_PARAMS_v1, extra)
    V(CUDA_ERROR_NO_DEVICE)
    V(NVML_ERROR_INSUFFICIENT_SIZE) V(NVML_ERROR_TIMEOUT) V(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    V(NVML_ERROR_NOT_FOUND) V(nvmlEventTypeXidCriticalError) V(nvmlEventTypeGpuRecoveryAction)
    V(nvmlEventTypeAll) V(NVML_GPU_RECOVERY_ACTION_NONE) V(nvmlMemory_v2)
    V(nvmlEventTypeDoubleBitEccError) V(NVML_NVLINK_MAX_LINKS) V(NVML_FEATURE_ENABLED)
    S(nvmlMemory_t) S(nvmlMemory_v2_t) S(nvmlProcessInfo_v1_t) S(nvmlProcessInfo_t)
    O(nvmlProcessInfo_t, computeInstanceId) S(nvmlProcessUtilizationSample_t)
    O(nvmlProcessUtilizationSample_t, smUtil) S(nvmlPciInfo_t) O(nvmlPciInfo_t, busId)
    S(nvmlEventData_t) O(nvmlEventData_t, computeInstanceId) S(nvmlUtilization_t)
    O(nvmlProcessUtilizationSample_t, timeStamp) O(nvmlProcessInfo_v1_t, usedGpuMemory)
    /* lost GPUs and MIG */
    V(NVML_ERROR_GPU_IS_LOST) V(NVML_ERROR_IN_USE) V(NVML_ERROR_INSUFFICIENT_RESOURCES)
    V(NVML_ERROR_INVALID_ARGUMENT) V(NVML_ERROR_NOT_SUPPORTED)
    V(NVML_DEVICE_NAME_V2_BUFFER_SIZE) V(NVML_DEVICE_UUID_V2_BUFFER_SIZE)
    V(NVML_DEVICE_MIG_DISABLE) V(NVML_DEVICE_MIG_ENABLE)
    V(NVML_GPU_INSTANCE_PROFILE_1_SLICE) V(NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    V(NVML_GPU_INSTANCE_PROFILE_3_SLICE) V(NVML_GPU_INSTANCE_PROFILE_4_SLICE)
    V(NVML_GPU_INSTANCE_PROFILE_7_SLICE) V(NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    V(NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2) V(NVML_GPU_INSTANCE_PROFILE_COUNT)
    V(NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE) V(NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    V(NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE) V(NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE)
    V(NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE) V(NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
    V(NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    V(nvmlGpuInstanceProfileInfo_v2) V(nvmlGpuInstanceProfileInfo_v3)
    V(nvmlComputeInstanceProfileInfo_v2) V(nvmlComputeInstanceProfileInfo_v3)
    S(nvmlGpuInstancePlacement_t) O(nvmlGpuInstancePlacement_t, size)
    S(nvmlGpuInstanceProfileInfo_t) O(nvmlGpuInstanceProfileInfo_t, ofaCount)
    O(nvmlGpuInstanceProfileInfo_t, memorySizeMB)
    S(nvmlGpuInstanceProfileInfo_v2_t) O(nvmlGpuInstanceProfileInfo_v2_t, id)
    O(nvmlGpuInstanceProfileInfo_v2_t, memorySizeMB) O(nvmlGpuInstanceProfileInfo_v2_t, name)
    S(nvmlGpuInstanceProfileInfo_v3_t) O(nvmlGpuInstanceProfileInfo_v3_t, memorySizeMB)
    O(nvmlGpuInstanceProfileInfo_v3_t, name) O(nvmlGpuInstanceProfileInfo_v3_t, capabilities)
    S(nvmlGpuInstanceInfo_t) O(nvmlGpuInstanceInfo_t, id) O(nvmlGpuInstanceInfo_t, profileId)
    O(nvmlGpuInstanceInfo_t, placement)
    S(nvmlComputeInstancePlacement_t) O(nvmlComputeInstancePlacement_t, size)
    S(nvmlComputeInstanceProfileInfo_t) O(nvmlComputeInstanceProfileInfo_t, sharedOfaCount)
    S(nvmlComputeInstanceProfileInfo_v2_t) O(nvmlComputeInstanceProfileInfo_v2_t, id)
    O(nvmlComputeInstanceProfileInfo_v2_t, name)
    S(nvmlComputeInstanceProfileInfo_v3_t) O(nvmlComputeInstanceProfileInfo_v3_t, name)
    O(nvmlComputeInstanceProfileInfo_v3_t, capabilities)
    S(nvmlComputeInstanceInfo_t) O(nvmlComputeInstanceInfo_t, gpuInstance)
    O(nvmlComputeInstanceInfo_t, id) O(nvmlComputeInstanceInfo_t, profileId)
    O(nvmlComputeInstanceInfo_t, placement)
    S(nvmlDeviceAttributes_t) O(nvmlDeviceAttributes_t, gpuInstanceSliceCount)
    O(nvmlDeviceAttributes_t, computeInstanceSliceCount) O(nvmlDeviceAttributes_t, memorySizeMB)
    /* process detail lists, processes' utilisation info, accounting */
    V(NVML_PROCESS_MODE_COMPUTE) V(NVML_PROCESS_MODE_GRAPHICS) V(NVML_PROCESS_MODE_MPS)
    V(NVML_PROCESS_MODE_ALL) V(NVML_PROCESS_MODE_MAX)
    V(nvmlProcessDetailList_v1) V(nvmlProcessesUtilizationInfo_v1)
    S(nvmlProcessDetail_v1_t) O(nvmlProcessDetail_v1_t, gpuInstanceId)
    O(nvmlProcessDetail_v1_t, computeInstanceId) O(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory)
    S(nvmlProcessDetailList_t) O(nvmlProcessDetailList_t, mode)
    O(nvmlProcessDetailList_t, numProcArrayEntries) O(nvmlProcessDetailList_t, procArray)
    S(nvmlProcessUtilizationInfo_v1_t) O(nvmlProcessUtilizationInfo_v1_t, pid)
    O(nvmlProcessUtilizationInfo_v1_t, smUtil) O(nvmlProcessUtilizationInfo_v1_t, memUtil)
    O(nvmlProcessUtilizationInfo_v1_t, encUtil) O(nvmlProcessUtilizationInfo_v1_t, decUtil)
    O(nvmlProcessUtilizationInfo_v1_t, jpgUtil) O(nvmlProcessUtilizationInfo_v1_t, ofaUtil)
    S(nvmlProcessesUtilizationInfo_t) O(nvmlProcessesUtilizationInfo_t, processSamplesCount)
    O(nvmlProcessesUtilizationInfo_t, lastSeenTimeStamp) O(nvmlProcessesUtilizationInfo_t, procUtilArray)
    S(nvmlAccountingStats_t) O(nvmlAccountingStats_t, maxMemoryUsage) O(nvmlAccountingStats_t, time)
    O(nvmlAccountingStats_t, startTime) O(nvmlAccountingStats_t, isRunning)
    O(nvmlAccountingStats_t, reserved)
    return 0;
}
