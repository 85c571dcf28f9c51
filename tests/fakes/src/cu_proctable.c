/* cuGetProcAddress / cuGetProcAddress_v2: one table maps (base name, CUDA version,
 * per-thread-default-stream flag) to the exported implementation, the way the real
 * driver does: the highest version <= the requested one wins; with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM a _ptds/_ptsz variant wins when one
 * exists.  To add an entry point: implement it (FC_API) and add its rows here. */
#include "procaddr.h"

/* X(base, cuda version it appeared in, per-thread variant?, exported symbol) */
#define PROC_TABLE(X)                                                   \
    X(cuInit, 2000, 0, cuInit)                                          \
    X(cuDriverGetVersion, 2020, 0, cuDriverGetVersion)                  \
    X(cuDeviceGet, 2000, 0, cuDeviceGet)                                \
    X(cuDeviceGetCount, 2000, 0, cuDeviceGetCount)                      \
    X(cuDeviceGetName, 2000, 0, cuDeviceGetName)                        \
    X(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid)                        \
    X(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2)                    \
    X(cuDeviceTotalMem, 2000, 0, cuDeviceTotalMem)                      \
    X(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2)                   \
    X(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute)              \
    X(cuCtxCreate, 2000, 0, cuCtxCreate)                                \
    X(cuCtxCreate, 3020, 0, cuCtxCreate_v2)                             \
    X(cuCtxCreate, 11040, 0, cuCtxCreate_v3)                            \
    X(cuCtxCreate, 12050, 0, cuCtxCreate_v4)                            \
    X(cuCtxDestroy, 2000, 0, cuCtxDestroy)                              \
    X(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2)                           \
    X(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent)                        \
    X(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent)                        \
    X(cuCtxPushCurrent, 2000, 0, cuCtxPushCurrent)                      \
    X(cuCtxPushCurrent, 4000, 0, cuCtxPushCurrent_v2)                   \
    X(cuCtxPopCurrent, 2000, 0, cuCtxPopCurrent)                        \
    X(cuCtxPopCurrent, 4000, 0, cuCtxPopCurrent_v2)                     \
    X(cuCtxGetDevice, 2000, 0, cuCtxGetDevice)                          \
    X(cuCtxGetDevice, 13000, 0, cuCtxGetDevice_v2)                      \
    X(cuCtxSynchronize, 2000, 0, cuCtxSynchronize)                      \
    X(cuCtxSynchronize, 13000, 0, cuCtxSynchronize_v2)                  \
    X(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain)      \
    X(cuDevicePrimaryCtxRelease, 7000, 0, cuDevicePrimaryCtxRelease)    \
    X(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2) \
    X(cuDeviceGetDevResource, 12040, 0, cuDeviceGetDevResource)     \
    X(cuDevSmResourceSplitByCount, 12040, 0, cuDevSmResourceSplitByCount) \
    X(cuDevResourceGenerateDesc, 12040, 0, cuDevResourceGenerateDesc) \
    X(cuGreenCtxCreate, 12040, 0, cuGreenCtxCreate)                 \
    X(cuGreenCtxDestroy, 12040, 0, cuGreenCtxDestroy)               \
    X(cuCtxFromGreenCtx, 12040, 0, cuCtxFromGreenCtx)               \
    X(cuGreenCtxGetDevResource, 12040, 0, cuGreenCtxGetDevResource) \
    X(cuDevicePrimaryCtxReset, 7000, 0, cuDevicePrimaryCtxReset)        \
    X(cuDevicePrimaryCtxReset, 11000, 0, cuDevicePrimaryCtxReset_v2)    \
    X(cuDevicePrimaryCtxGetState, 7000, 0, cuDevicePrimaryCtxGetState)  \
    X(cuMemGetInfo, 2000, 0, cuMemGetInfo)                              \
    X(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2)                           \
    X(cuMemAlloc, 2000, 0, cuMemAlloc)                                  \
    X(cuMemAlloc, 3020, 0, cuMemAlloc_v2)                               \
    X(cuMemFree, 2000, 0, cuMemFree)                                    \
    X(cuMemFree, 3020, 0, cuMemFree_v2)                                 \
    X(cuMemAllocPitch, 2000, 0, cuMemAllocPitch)                        \
    X(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2)                     \
    X(cuMemAllocManaged, 6000, 0, cuMemAllocManaged)                    \
    X(cuMemAllocHost, 2000, 0, cuMemAllocHost)                          \
    X(cuMemAllocHost, 3020, 0, cuMemAllocHost_v2)                       \
    X(cuMemFreeHost, 2000, 0, cuMemFreeHost)                            \
    X(cuMemHostAlloc, 2020, 0, cuMemHostAlloc)                          \
    X(cuMemcpyHtoD, 2000, 0, cuMemcpyHtoD)                              \
    X(cuMemcpyHtoD, 3020, 0, cuMemcpyHtoD_v2)                           \
    X(cuMemcpyHtoD, 7000, 1, cuMemcpyHtoD_v2_ptds)                      \
    X(cuMemcpyDtoH, 2000, 0, cuMemcpyDtoH)                              \
    X(cuMemcpyDtoH, 3020, 0, cuMemcpyDtoH_v2)                           \
    X(cuMemcpyDtoH, 7000, 1, cuMemcpyDtoH_v2_ptds)                      \
    X(cuMemsetD8, 2000, 0, cuMemsetD8)                                  \
    X(cuMemsetD8, 3020, 0, cuMemsetD8_v2)                               \
    X(cuMemsetD8, 7000, 1, cuMemsetD8_v2_ptds)                          \
    X(cuArrayCreate, 2000, 0, cuArrayCreate)                            \
    X(cuArrayCreate, 3020, 0, cuArrayCreate_v2)                         \
    X(cuArray3DCreate, 2000, 0, cuArray3DCreate)                        \
    X(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2)                     \
    X(cuArrayDestroy, 2000, 0, cuArrayDestroy)                          \
    X(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate)          \
    X(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy)        \
    X(cuMemAllocAsync, 11020, 0, cuMemAllocAsync)                       \
    X(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz)                  \
    X(cuMemFreeAsync, 11020, 0, cuMemFreeAsync)                         \
    X(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz)                    \
    X(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync)       \
    X(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz)  \
    X(cuMemPoolCreate, 11020, 0, cuMemPoolCreate)                       \
    X(cuMemPoolDestroy, 11020, 0, cuMemPoolDestroy)                     \
    X(cuDeviceGetDefaultMemPool, 11020, 0, cuDeviceGetDefaultMemPool)   \
    X(cuDeviceGetMemPool, 11020, 0, cuDeviceGetMemPool)                 \
    X(cuDeviceSetMemPool, 11020, 0, cuDeviceSetMemPool)                 \
    X(cuMemPoolTrimTo, 11020, 0, cuMemPoolTrimTo)                       \
    X(cuMemPoolExportToShareableHandle, 11020, 0, cuMemPoolExportToShareableHandle) \
    X(cuMemPoolImportFromShareableHandle, 11020, 0, cuMemPoolImportFromShareableHandle) \
    X(cuMemPoolExportPointer, 11020, 0, cuMemPoolExportPointer)         \
    X(cuMemPoolImportPointer, 11020, 0, cuMemPoolImportPointer)         \
    X(cuMemPoolSetAttribute, 11020, 0, cuMemPoolSetAttribute)           \
    X(cuMemPoolGetAttribute, 11020, 0, cuMemPoolGetAttribute)           \
    X(cuMemCreate, 10020, 0, cuMemCreate)                               \
    X(cuMemRelease, 10020, 0, cuMemRelease)                             \
    X(cuMemAddressReserve, 10020, 0, cuMemAddressReserve)               \
    X(cuMemAddressFree, 10020, 0, cuMemAddressFree)                     \
    X(cuMemMap, 10020, 0, cuMemMap)                                     \
    X(cuMemUnmap, 10020, 0, cuMemUnmap)                                 \
    X(cuMemSetAccess, 10020, 0, cuMemSetAccess)                         \
    X(cuMemGetAllocationGranularity, 10020, 0, cuMemGetAllocationGranularity) \
    X(cuMemRetainAllocationHandle, 11000, 0, cuMemRetainAllocationHandle) \
    X(cuMemExportToShareableHandle, 10020, 0, cuMemExportToShareableHandle) \
    X(cuMemImportFromShareableHandle, 10020, 0, cuMemImportFromShareableHandle) \
    X(cuIpcGetMemHandle, 4010, 0, cuIpcGetMemHandle)                    \
    X(cuIpcOpenMemHandle, 4010, 0, cuIpcOpenMemHandle)                  \
    X(cuIpcOpenMemHandle, 11000, 0, cuIpcOpenMemHandle_v2)              \
    X(cuIpcCloseMemHandle, 4010, 0, cuIpcCloseMemHandle)                \
    X(cuMemGetAllocationPropertiesFromHandle, 10020, 0, cuMemGetAllocationPropertiesFromHandle) \
    X(cuStreamCreate, 2000, 0, cuStreamCreate)                          \
    X(cuStreamCreateWithPriority, 5050, 0, cuStreamCreateWithPriority)  \
    X(cuStreamDestroy, 2000, 0, cuStreamDestroy)                        \
    X(cuStreamDestroy, 4000, 0, cuStreamDestroy_v2)                     \
    X(cuStreamGetCtx, 9020, 0, cuStreamGetCtx)                          \
    X(cuStreamGetDevice, 12080, 0, cuStreamGetDevice)                   \
    X(cuStreamSynchronize, 2000, 0, cuStreamSynchronize)                \
    X(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz)           \
    X(cuStreamQuery, 2000, 0, cuStreamQuery)                            \
    X(cuStreamQuery, 7000, 1, cuStreamQuery_ptsz)                       \
    X(cuEventCreate, 2000, 0, cuEventCreate)                            \
    X(cuEventRecord, 2000, 0, cuEventRecord)                            \
    X(cuEventRecord, 7000, 1, cuEventRecord_ptsz)                       \
    X(cuEventSynchronize, 2000, 0, cuEventSynchronize)                  \
    X(cuEventQuery, 2000, 0, cuEventQuery)                              \
    X(cuEventDestroy, 2000, 0, cuEventDestroy)                          \
    X(cuEventDestroy, 4000, 0, cuEventDestroy_v2)                       \
    X(cuModuleLoad, 2000, 0, cuModuleLoad)                              \
    X(cuModuleLoadData, 2000, 0, cuModuleLoadData)                      \
    X(cuModuleLoadDataEx, 2010, 0, cuModuleLoadDataEx)                  \
    X(cuModuleLoadFatBinary, 2000, 0, cuModuleLoadFatBinary)            \
    X(cuModuleUnload, 2000, 0, cuModuleUnload)                          \
    X(cuModuleGetFunction, 2000, 0, cuModuleGetFunction)                \
    X(cuLibraryLoadData, 12000, 0, cuLibraryLoadData)                   \
    X(cuLibraryLoadFromFile, 12000, 0, cuLibraryLoadFromFile)           \
    X(cuLibraryUnload, 12000, 0, cuLibraryUnload)                       \
    X(cuLibraryGetModule, 12000, 0, cuLibraryGetModule)                 \
    X(cuLibraryGetKernel, 12000, 0, cuLibraryGetKernel)                 \
    X(cuKernelGetFunction, 12000, 0, cuKernelGetFunction)               \
    X(cuCtxSetLimit, 3010, 0, cuCtxSetLimit)                            \
    X(cuCtxGetLimit, 3010, 0, cuCtxGetLimit)                            \
    X(cuLaunchKernel, 4000, 0, cuLaunchKernel)                          \
    X(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz)                     \
    X(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx)                     \
    X(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz)                \
    X(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel)    \
    X(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz) \
    X(cuGraphCreate, 10000, 0, cuGraphCreate)                           \
    X(cuGraphAddKernelNode, 10000, 0, cuGraphAddKernelNode)             \
    X(cuGraphAddKernelNode, 12000, 0, cuGraphAddKernelNode_v2)          \
    X(cuGraphInstantiate, 10000, 0, cuGraphInstantiate)                 \
    X(cuGraphInstantiate, 11000, 0, cuGraphInstantiate_v2)              \
    X(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags) \
    X(cuGraphLaunch, 10000, 0, cuGraphLaunch)                           \
    X(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz)                      \
    X(cuGraphUpload, 11010, 0, cuGraphUpload)                           \
    X(cuGraphUpload, 11010, 1, cuGraphUpload_ptsz)                      \
    X(cuGraphInstantiateWithParams, 12000, 0, cuGraphInstantiateWithParams) \
    X(cuGraphInstantiateWithParams, 12000, 1, cuGraphInstantiateWithParams_ptsz) \
    X(cuGraphExecDestroy, 10000, 0, cuGraphExecDestroy)                 \
    X(cuGraphDestroy, 10000, 0, cuGraphDestroy)                         \
    X(cuGraphGetNodes, 10000, 0, cuGraphGetNodes)                       \
    X(cuGraphNodeGetType, 10000, 0, cuGraphNodeGetType)                 \
    X(cuGraphAddChildGraphNode, 10000, 0, cuGraphAddChildGraphNode)     \
    X(cuGraphChildGraphNodeGetGraph, 10000, 0, cuGraphChildGraphNodeGetGraph) \
    X(cuGraphAddMemAllocNode, 11040, 0, cuGraphAddMemAllocNode)         \
    X(cuGraphMemAllocNodeGetParams, 11040, 0, cuGraphMemAllocNodeGetParams) \
    X(cuGraphAddMemFreeNode, 11040, 0, cuGraphAddMemFreeNode)           \
    X(cuGraphMemFreeNodeGetParams, 11040, 0, cuGraphMemFreeNodeGetParams) \
    X(cuDeviceGraphMemTrim, 11040, 0, cuDeviceGraphMemTrim)             \
    X(cuDeviceGetGraphMemAttribute, 11040, 0, cuDeviceGetGraphMemAttribute) \
    X(cuDeviceSetGraphMemAttribute, 11040, 0, cuDeviceSetGraphMemAttribute) \
    X(cuGetErrorString, 6000, 0, cuGetErrorString)                      \
    X(cuGetErrorName, 6000, 0, cuGetErrorName)                          \
    X(cuGetExportTable, 3000, 0, cuGetExportTable)                      \
    X(cuGetProcAddress, 11030, 0, cuGetProcAddress)                     \
    X(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2)

/* The implementations live in the other files; only their addresses are needed here. */
#define DECLARE(base, ver, pt, sym) extern void sym(void);
PROC_TABLE(DECLARE)

#define ROW(base, ver, pt, sym) {#base, ver, pt, (void *)sym},
static const struct proc_entry table[] = {PROC_TABLE(ROW)};

const struct proc_entry *fc_proc_table(size_t *n) {
    *n = sizeof table / sizeof table[0];
    return table;
}
