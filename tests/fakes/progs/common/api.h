/* The driver entry points the test programs use, resolved three ways (direct link, dlsym,
 * cuGetProcAddress_v2).  X(field/symbol, base name for cuGetProcAddress, version asked,
 * parameter list).  Version 0 means "the program's default" (12080). */
#ifndef PROGS_API_H
#define PROGS_API_H

#include "../../src/cutypes.h"

#define API_LIST(X)                                                                          \
    X(cuInit, cuInit, 0, (unsigned int))                                                     \
    X(cuDriverGetVersion, cuDriverGetVersion, 0, (int *))                                    \
    X(cuDeviceGet, cuDeviceGet, 0, (CUdevice *, int))                                        \
    X(cuDeviceGetCount, cuDeviceGetCount, 0, (int *))                                        \
    X(cuDeviceGetName, cuDeviceGetName, 0, (char *, int, CUdevice))                          \
    X(cuDeviceGetUuid_v2, cuDeviceGetUuid, 0, (CUuuid *, CUdevice))                          \
    X(cuDeviceGetUuid, cuDeviceGetUuid, 9020, (CUuuid *, CUdevice))                          \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 0, (size_t *, CUdevice))                        \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, 0, (int *, CUdevice_attribute, CUdevice))  \
    X(cuCtxCreate_v2, cuCtxCreate, 11000, (CUcontext *, unsigned int, CUdevice))             \
    X(cuCtxCreate_v4, cuCtxCreate, 0, (CUcontext *, CUctxCreateParams *, unsigned int, CUdevice)) \
    X(cuCtxCreate, cuCtxCreate, 3010, (CUcontext *, unsigned int, CUdevice))                 \
    X(cuCtxDestroy_v2, cuCtxDestroy, 0, (CUcontext))                                         \
    X(cuCtxGetCurrent, cuCtxGetCurrent, 0, (CUcontext *))                                    \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 0, (CUcontext))                                      \
    X(cuCtxPushCurrent_v2, cuCtxPushCurrent, 0, (CUcontext))                                 \
    X(cuCtxPopCurrent_v2, cuCtxPopCurrent, 0, (CUcontext *))                                 \
    X(cuCtxGetDevice, cuCtxGetDevice, 0, (CUdevice *))                                       \
    X(cuCtxSynchronize, cuCtxSynchronize, 0, (void))                                         \
    X(cuCtxSynchronize_v2, cuCtxSynchronize, 13000, (CUcontext))                             \
    X(cuDeviceGetDevResource, cuDeviceGetDevResource, 0, (CUdevice, CUdevResource *, CUdevResourceType)) \
    X(cuDevSmResourceSplitByCount, cuDevSmResourceSplitByCount, 0,                            \
      (CUdevResource *, unsigned int *, const CUdevResource *, CUdevResource *, unsigned int, unsigned int)) \
    X(cuDevResourceGenerateDesc, cuDevResourceGenerateDesc, 0, (CUdevResourceDesc *, CUdevResource *, unsigned int)) \
    X(cuGreenCtxCreate, cuGreenCtxCreate, 0, (CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int)) \
    X(cuGreenCtxDestroy, cuGreenCtxDestroy, 0, (CUgreenCtx))                                 \
    X(cuCtxFromGreenCtx, cuCtxFromGreenCtx, 0, (CUcontext *, CUgreenCtx))                    \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 0, (CUcontext *, CUdevice))        \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 0, (CUdevice))                \
    X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 0, (CUdevice))                    \
    X(cuMemGetInfo_v2, cuMemGetInfo, 0, (size_t *, size_t *))                                \
    X(cuMemAlloc_v2, cuMemAlloc, 0, (CUdeviceptr *, size_t))                                 \
    X(cuMemFree_v2, cuMemFree, 0, (CUdeviceptr))                                             \
    X(cuMemAlloc, cuMemAlloc, 3010, (CUdeviceptr_v1 *, unsigned int))                        \
    X(cuMemFree, cuMemFree, 3010, (CUdeviceptr_v1))                                          \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 0, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int)) \
    X(cuMemAllocPitch, cuMemAllocPitch, 3010,                                                \
      (CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int))          \
    X(cuMemAllocManaged, cuMemAllocManaged, 0, (CUdeviceptr *, size_t, unsigned int))        \
    X(cuMemAllocHost_v2, cuMemAllocHost, 0, (void **, size_t))                               \
    X(cuMemHostAlloc, cuMemHostAlloc, 0, (void **, size_t, unsigned int))                    \
    X(cuMemFreeHost, cuMemFreeHost, 0, (void *))                                             \
    X(cuMemcpyHtoD_v2, cuMemcpyHtoD, 0, (CUdeviceptr, const void *, size_t))                 \
    X(cuMemcpyDtoH_v2, cuMemcpyDtoH, 0, (void *, CUdeviceptr, size_t))                       \
    X(cuMemsetD8_v2, cuMemsetD8, 0, (CUdeviceptr, unsigned char, size_t))                    \
    X(cuArrayCreate_v2, cuArrayCreate, 0, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))        \
    X(cuArray3DCreate_v2, cuArray3DCreate, 0, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))  \
    X(cuArrayCreate, cuArrayCreate, 3010, (CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *))     \
    X(cuArray3DCreate, cuArray3DCreate, 3010, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *)) \
    X(cuArrayDestroy, cuArrayDestroy, 0, (CUarray))                                          \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 0,                                     \
      (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))                   \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 0, (CUmipmappedArray))               \
    X(cuMemAllocAsync, cuMemAllocAsync, 0, (CUdeviceptr *, size_t, CUstream))                \
    X(cuMemFreeAsync, cuMemFreeAsync, 0, (CUdeviceptr, CUstream))                            \
    X(cuMemPoolCreate, cuMemPoolCreate, 0, (CUmemoryPool *, const CUmemPoolProps *))         \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 0, (CUmemoryPool))                                 \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 0,                                   \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                       \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 0, (CUmemoryPool *, CUdevice))   \
    X(cuDeviceGetMemPool, cuDeviceGetMemPool, 0, (CUmemoryPool *, CUdevice))                 \
    X(cuDeviceSetMemPool, cuDeviceSetMemPool, 0, (CUdevice, CUmemoryPool))                   \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, 0, (CUmemoryPool, size_t))                           \
    X(cuMemPoolExportToShareableHandle, cuMemPoolExportToShareableHandle, 0,                    \
      (void *, CUmemoryPool, CUmemAllocationHandleType, unsigned long long))                   \
    X(cuMemPoolImportFromShareableHandle, cuMemPoolImportFromShareableHandle, 0,                \
      (CUmemoryPool *, void *, CUmemAllocationHandleType, unsigned long long))                 \
    X(cuMemPoolExportPointer, cuMemPoolExportPointer, 0, (CUmemPoolPtrExportData *, CUdeviceptr)) \
    X(cuMemPoolImportPointer, cuMemPoolImportPointer, 0,                                        \
      (CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *))                                  \
    X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 0, (CUmemoryPool, CUmemPool_attribute, void *)) \
    X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 0, (CUmemoryPool, CUmemPool_attribute, void *)) \
    X(cuMemCreate, cuMemCreate, 0,                                                           \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, cuMemRelease, 0, (CUmemGenericAllocationHandle))                         \
    X(cuMemAddressReserve, cuMemAddressReserve, 0,                                           \
      (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                      \
    X(cuMemAddressFree, cuMemAddressFree, 0, (CUdeviceptr, size_t))                          \
    X(cuMemMap, cuMemMap, 0,                                                                 \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))       \
    X(cuMemUnmap, cuMemUnmap, 0, (CUdeviceptr, size_t))                                      \
    X(cuMemSetAccess, cuMemSetAccess, 0, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 0,                       \
      (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))             \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 0,                           \
      (CUmemGenericAllocationHandle *, void *))                                              \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 0,                         \
      (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 0,                     \
      (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))                   \
    X(cuIpcGetMemHandle, cuIpcGetMemHandle, 0, (CUipcMemHandle *, CUdeviceptr))              \
    X(cuIpcOpenMemHandle_v2, cuIpcOpenMemHandle, 0, (CUdeviceptr *, CUipcMemHandle, unsigned int)) \
    X(cuIpcOpenMemHandle, cuIpcOpenMemHandle, 10000, (CUdeviceptr *, CUipcMemHandle, unsigned int)) \
    X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 0, (CUdeviceptr))                            \
    X(cuStreamCreate, cuStreamCreate, 0, (CUstream *, unsigned int))                         \
    X(cuStreamDestroy_v2, cuStreamDestroy, 0, (CUstream))                                    \
    X(cuStreamSynchronize, cuStreamSynchronize, 0, (CUstream))                               \
    X(cuEventCreate, cuEventCreate, 0, (CUevent *, unsigned int))                            \
    X(cuEventRecord, cuEventRecord, 0, (CUevent, CUstream))                                  \
    X(cuEventSynchronize, cuEventSynchronize, 0, (CUevent))                                  \
    X(cuEventDestroy_v2, cuEventDestroy, 0, (CUevent))                                       \
    X(cuModuleLoadData, cuModuleLoadData, 0, (CUmodule *, const void *))                     \
    X(cuModuleLoad, cuModuleLoad, 0, (CUmodule *, const char *))                             \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx, 0,                                             \
      (CUmodule *, const void *, unsigned int, CUjit_option *, void **))                     \
    X(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 0, (CUmodule *, const void *))           \
    X(cuModuleUnload, cuModuleUnload, 0, (CUmodule))                                         \
    X(cuModuleGetFunction, cuModuleGetFunction, 0, (CUfunction *, CUmodule, const char *))   \
    X(cuLibraryLoadData, cuLibraryLoadData, 0,                                               \
      (CUlibrary *, const void *, CUjit_option *, void **, unsigned int, CUlibraryOption *,  \
       void **, unsigned int))                                                               \
    X(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 0,                                       \
      (CUlibrary *, const char *, CUjit_option *, void **, unsigned int, CUlibraryOption *,  \
       void **, unsigned int))                                                               \
    X(cuLibraryUnload, cuLibraryUnload, 0, (CUlibrary))                                      \
    X(cuLibraryGetModule, cuLibraryGetModule, 0, (CUmodule *, CUlibrary))                    \
    X(cuLibraryGetKernel, cuLibraryGetKernel, 0, (CUkernel *, CUlibrary, const char *))      \
    X(cuKernelGetFunction, cuKernelGetFunction, 0, (CUfunction *, CUkernel))                 \
    X(cuCtxSetLimit, cuCtxSetLimit, 0, (CUlimit, size_t))                                    \
    X(cuCtxGetLimit, cuCtxGetLimit, 0, (size_t *, CUlimit))                                  \
    X(cuLaunchKernel, cuLaunchKernel, 0,                                                     \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,     \
       unsigned int, unsigned int, CUstream, void **, void **))                              \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 0, (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 0,                               \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,     \
       unsigned int, unsigned int, CUstream, void **))                                       \
    X(cuGraphCreate, cuGraphCreate, 0, (CUgraph *, unsigned int))                            \
    X(cuGraphAddKernelNode_v2, cuGraphAddKernelNode, 0,                                      \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS_v2 *)) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 0,                           \
      (CUgraphExec *, CUgraph, unsigned long long))                                          \
    X(cuGraphInstantiate, cuGraphInstantiate, 10020,                                         \
      (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t))                               \
    X(cuGraphInstantiate_v2, cuGraphInstantiate, 11000,                                      \
      (CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t))                               \
    X(cuGraphLaunch, cuGraphLaunch, 0, (CUgraphExec, CUstream))                              \
    X(cuGraphUpload, cuGraphUpload, 0, (CUgraphExec, CUstream))                              \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 0,                         \
      (CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *))                             \
    X(cuGraphExecDestroy, cuGraphExecDestroy, 0, (CUgraphExec))                              \
    X(cuGraphDestroy, cuGraphDestroy, 0, (CUgraph))                                          \
    X(cuGraphGetNodes, cuGraphGetNodes, 0, (CUgraph, CUgraphNode *, size_t *))               \
    X(cuGraphNodeGetType, cuGraphNodeGetType, 0, (CUgraphNode, CUgraphNodeType *))           \
    X(cuGraphAddChildGraphNode, cuGraphAddChildGraphNode, 0,                                \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph))                        \
    X(cuGraphChildGraphNodeGetGraph, cuGraphChildGraphNodeGetGraph, 0, (CUgraphNode, CUgraph *)) \
    X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 0,                                     \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *))   \
    X(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 0,                                       \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr))                    \
    X(cuGraphMemAllocNodeGetParams, cuGraphMemAllocNodeGetParams, 0,                         \
      (CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *))                                           \
    X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 0,                         \
      (CUdevice, CUgraphMem_attribute, void *))                                              \
    X(cuDeviceSetGraphMemAttribute, cuDeviceSetGraphMemAttribute, 0,                         \
      (CUdevice, CUgraphMem_attribute, void *))                                              \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 0, (CUdevice))                             \
    X(cuGetErrorName, cuGetErrorName, 0, (CUresult, const char **))                          \
    X(cuGetErrorString, cuGetErrorString, 0, (CUresult, const char **))                      \
    X(cuGetExportTable, cuGetExportTable, 0, (const void **, const CUuuid *))                \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000,                                          \
      (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))

#define API_FIELD(sym, base, ver, params) CUresult(*sym) params;
struct api {
    API_LIST(API_FIELD)
};

/* Runs the script of argv (';'-separated) or stdin; how names the resolution path. */
int interp_main(int argc, char **argv, const char *how, struct api *api);

#endif
