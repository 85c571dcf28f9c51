/* Built twice by tests/shim/test_abi.py: once against our declarations
 * (include/vgpu_cuda.h, vgpu_nvml.h) and once, with -DVG_PROBE_OFFICIAL, against the
 * official cuda.h / nvml.h. Both print the same list of sizes, offsets and
 * constants; the test requires the two outputs to be identical. The official
 * build also checks every hooks.def prototype against the official declaration. */
#include <stddef.h>
#include <stdio.h>

#ifdef VG_PROBE_OFFICIAL
#define __CUDA_API_VERSION_INTERNAL 1
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <cuda.h>
#include <nvml.h>
#define HOOK(lib, name, ret, params, args) \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) params), #name);
#define REAL(lib, name, ret, params) \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) params), #name);
#include "hooks.def"
#else
#include "vgpu_cuda.h"
#include "vgpu_nvml.h"
#endif

#define SIZE(T) printf("sizeof %s %zu\n", #T, sizeof(T))
#define OFF(T, f) printf("offsetof %s.%s %zu\n", #T, #f, offsetof(T, f))
#define VAL(C) printf("value %s %lld\n", #C, (long long)(C))

int main(void)
{
    SIZE(CUresult); SIZE(CUdevice); SIZE(CUdeviceptr); SIZE(cuuint64_t);
    SIZE(CUmemGenericAllocationHandle); SIZE(CUarray_format); SIZE(CUmemLocationType);
    VAL(CUDA_SUCCESS); VAL(CUDA_ERROR_INVALID_VALUE); VAL(CUDA_ERROR_OUT_OF_MEMORY);
    VAL(CUDA_ERROR_NOT_INITIALIZED); VAL(CUDA_ERROR_INVALID_DEVICE);
    VAL(CUDA_ERROR_INVALID_CONTEXT); VAL(CUDA_ERROR_NOT_FOUND); VAL(CUDA_ERROR_NOT_SUPPORTED);
    VAL(CUDA_ERROR_UNKNOWN); VAL(CUDA_ERROR_NOT_PERMITTED);
    VAL(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT); VAL(CU_MEM_ATTACH_GLOBAL);
    VAL(CU_GET_PROC_ADDRESS_DEFAULT); VAL(CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    VAL(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    VAL(CU_GET_PROC_ADDRESS_SUCCESS); VAL(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    VAL(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    VAL(CU_AD_FORMAT_UNSIGNED_INT8); VAL(CU_AD_FORMAT_UNSIGNED_INT16);
    VAL(CU_AD_FORMAT_UNSIGNED_INT32); VAL(CU_AD_FORMAT_SIGNED_INT8);
    VAL(CU_AD_FORMAT_SIGNED_INT16); VAL(CU_AD_FORMAT_SIGNED_INT32); VAL(CU_AD_FORMAT_HALF);
    VAL(CU_AD_FORMAT_FLOAT);
    VAL(CU_MEM_LOCATION_TYPE_INVALID); VAL(CU_MEM_LOCATION_TYPE_DEVICE);
    VAL(CU_MEM_ALLOCATION_TYPE_PINNED); VAL(CU_MEM_HANDLE_TYPE_NONE);
    VAL(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    SIZE(CUDA_ARRAY_DESCRIPTOR); OFF(CUDA_ARRAY_DESCRIPTOR, Width);
    OFF(CUDA_ARRAY_DESCRIPTOR, Height); OFF(CUDA_ARRAY_DESCRIPTOR, Format);
    OFF(CUDA_ARRAY_DESCRIPTOR, NumChannels);
    SIZE(CUDA_ARRAY3D_DESCRIPTOR); OFF(CUDA_ARRAY3D_DESCRIPTOR, Depth);
    OFF(CUDA_ARRAY3D_DESCRIPTOR, Format); OFF(CUDA_ARRAY3D_DESCRIPTOR, NumChannels);
    OFF(CUDA_ARRAY3D_DESCRIPTOR, Flags);
    SIZE(CUDA_ARRAY_DESCRIPTOR_v1); OFF(CUDA_ARRAY_DESCRIPTOR_v1, Height);
    OFF(CUDA_ARRAY_DESCRIPTOR_v1, Format); OFF(CUDA_ARRAY_DESCRIPTOR_v1, NumChannels);
    SIZE(CUDA_ARRAY3D_DESCRIPTOR_v1); OFF(CUDA_ARRAY3D_DESCRIPTOR_v1, Depth);
    OFF(CUDA_ARRAY3D_DESCRIPTOR_v1, Format); OFF(CUDA_ARRAY3D_DESCRIPTOR_v1, Flags);
    SIZE(CUmemLocation); OFF(CUmemLocation, type); OFF(CUmemLocation, id);
    SIZE(CUmemAllocationProp); OFF(CUmemAllocationProp, type);
    OFF(CUmemAllocationProp, requestedHandleTypes); OFF(CUmemAllocationProp, location);
    OFF(CUmemAllocationProp, win32HandleMetaData); OFF(CUmemAllocationProp, allocFlags);
    SIZE(CUlaunchConfig); OFF(CUlaunchConfig, gridDimX); OFF(CUlaunchConfig, gridDimY);
    OFF(CUlaunchConfig, gridDimZ); OFF(CUlaunchConfig, hStream); OFF(CUlaunchConfig, attrs);
    OFF(CUlaunchConfig, numAttrs);
    SIZE(CUDA_LAUNCH_PARAMS); OFF(CUDA_LAUNCH_PARAMS, gridDimX); OFF(CUDA_LAUNCH_PARAMS, hStream);
    OFF(CUDA_LAUNCH_PARAMS, kernelParams);
    SIZE(CUuuid);
    VAL(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD); VAL(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    VAL(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH); VAL(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    VAL(CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    SIZE(CUmemPoolProps); OFF(CUmemPoolProps, location); OFF(CUmemPoolProps, maxSize);
    OFF(CUmemPoolProps, usage);
    SIZE(CUDA_MEM_ALLOC_NODE_PARAMS); OFF(CUDA_MEM_ALLOC_NODE_PARAMS, poolProps);
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs); OFF(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize);
    OFF(CUDA_MEM_ALLOC_NODE_PARAMS, dptr);
    VAL(CU_GRAPH_NODE_TYPE_KERNEL); VAL(CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    VAL(CU_GRAPH_NODE_TYPE_MEM_FREE); VAL(CU_GRAPH_NODE_TYPE_GRAPH);
    VAL(CU_GRAPH_NODE_TYPE_CONDITIONAL);
    VAL(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT); VAL(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH);
    VAL(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT); VAL(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH);
    SIZE(nvmlReturn_t);
    VAL(NVML_SUCCESS); VAL(NVML_ERROR_UNINITIALIZED); VAL(NVML_ERROR_INVALID_ARGUMENT);
    VAL(NVML_ERROR_NOT_SUPPORTED); VAL(NVML_ERROR_NOT_FOUND); VAL(NVML_ERROR_INSUFFICIENT_SIZE);
    VAL(NVML_ERROR_MEMORY);
    VAL(NVML_ERROR_FUNCTION_NOT_FOUND); VAL(NVML_ERROR_UNKNOWN);
    VAL(NVML_DEVICE_UUID_V2_BUFFER_SIZE);
    SIZE(nvmlMemory_t); OFF(nvmlMemory_t, total); OFF(nvmlMemory_t, free); OFF(nvmlMemory_t, used);
    SIZE(nvmlMemory_v2_t); OFF(nvmlMemory_v2_t, version); OFF(nvmlMemory_v2_t, total);
    OFF(nvmlMemory_v2_t, reserved); OFF(nvmlMemory_v2_t, free); OFF(nvmlMemory_v2_t, used);
    SIZE(nvmlProcessInfo_v1_t); OFF(nvmlProcessInfo_v1_t, pid);
    OFF(nvmlProcessInfo_v1_t, usedGpuMemory);
    SIZE(nvmlProcessInfo_v2_t); OFF(nvmlProcessInfo_v2_t, usedGpuMemory);
    OFF(nvmlProcessInfo_v2_t, gpuInstanceId); OFF(nvmlProcessInfo_v2_t, computeInstanceId);
    SIZE(nvmlProcessInfo_t);
    SIZE(nvmlProcessUtilizationSample_t); OFF(nvmlProcessUtilizationSample_t, pid);
    OFF(nvmlProcessUtilizationSample_t, timeStamp); OFF(nvmlProcessUtilizationSample_t, smUtil);
    OFF(nvmlProcessUtilizationSample_t, memUtil); OFF(nvmlProcessUtilizationSample_t, decUtil);
    SIZE(nvmlUtilization_t);
    VAL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH); VAL(NVML_ERROR_NO_PERMISSION);
    SIZE(nvmlProcessDetail_v1_t); OFF(nvmlProcessDetail_v1_t, usedGpuMemory);
    OFF(nvmlProcessDetail_v1_t, gpuInstanceId); OFF(nvmlProcessDetail_v1_t, computeInstanceId);
    OFF(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory);
    SIZE(nvmlProcessDetailList_t); OFF(nvmlProcessDetailList_t, mode);
    OFF(nvmlProcessDetailList_t, numProcArrayEntries); OFF(nvmlProcessDetailList_t, procArray);
    VAL(nvmlProcessDetailList_v1);
    SIZE(nvmlProcessUtilizationInfo_v1_t); OFF(nvmlProcessUtilizationInfo_v1_t, pid);
    OFF(nvmlProcessUtilizationInfo_v1_t, smUtil); OFF(nvmlProcessUtilizationInfo_v1_t, ofaUtil);
    SIZE(nvmlProcessesUtilizationInfo_t); OFF(nvmlProcessesUtilizationInfo_t, processSamplesCount);
    OFF(nvmlProcessesUtilizationInfo_t, lastSeenTimeStamp);
    OFF(nvmlProcessesUtilizationInfo_t, procUtilArray);
    VAL(nvmlProcessesUtilizationInfo_v1);
    SIZE(nvmlAccountingStats_t); OFF(nvmlAccountingStats_t, maxMemoryUsage);
    OFF(nvmlAccountingStats_t, isRunning);
    SIZE(nvmlAccountingStats_v2_t); OFF(nvmlAccountingStats_v2_t, sampleCount);
    OFF(nvmlAccountingStats_v2_t, startTime);
    return 0;
}
