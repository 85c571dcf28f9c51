/* cuGetErrorName / cuGetErrorString: every CUresult of the CUDA 13.0 cuda.h. */
#include <stddef.h>

#include "cu.h"

static const struct {
    int code;
    const char *name;
    const char *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {5, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled"},
    {6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "stub library"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", "call requires newer driver"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device unavailable"},
    {47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL", "multicast resource full"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device not licensed"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {205, "CUDA_ERROR_MAP_FAILED", "map failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmap failed"},
    {207, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "already mapped"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no binary for gpu"},
    {210, "CUDA_ERROR_ALREADY_ACQUIRED", "already acquired"},
    {211, "CUDA_ERROR_NOT_MAPPED", "not mapped"},
    {212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "not mapped as array"},
    {213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "not mapped as pointer"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "ecc uncorrectable"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "unsupported limit"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access unsupported"},
    {218, "CUDA_ERROR_INVALID_PTX", "invalid ptx"},
    {219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid graphics context"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "nvlink uncorrectable"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "jit compiler not found"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "unsupported ptx version"},
    {223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "jit compilation disabled"},
    {224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "unsupported exec affinity"},
    {225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "unsupported devside sync"},
    {226, "CUDA_ERROR_CONTAINED", "contained"},
    {227, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION", "insufficient loader version"},
    {300, "CUDA_ERROR_INVALID_SOURCE", "invalid source"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object init failed"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "operating system"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "illegal state"},
    {402, "CUDA_ERROR_LOSSY_QUERY", "lossy query"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "illegal address"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "launch out of resources"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "launch timeout"},
    {703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch incompatible texturing"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access not enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {710, "CUDA_ERROR_ASSERT", "assert"},
    {711, "CUDA_ERROR_TOO_MANY_PEERS", "too many peers"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory already registered"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory not registered"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal instruction"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "invalid address space"},
    {718, "CUDA_ERROR_INVALID_PC", "invalid pc"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "launch failed"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "cooperative launch too large"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory leak"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not ready"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system driver mismatch"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "compat not supported on device"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED", "mps connection failed"},
    {806, "CUDA_ERROR_MPS_RPC_FAILURE", "mps rpc failure"},
    {807, "CUDA_ERROR_MPS_SERVER_NOT_READY", "mps server not ready"},
    {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "mps max clients reached"},
    {809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "mps max connections reached"},
    {810, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "mps client terminated"},
    {811, "CUDA_ERROR_CDP_NOT_SUPPORTED", "cdp not supported"},
    {812, "CUDA_ERROR_CDP_VERSION_MISMATCH", "cdp version mismatch"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "stream capture unsupported"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "stream capture invalidated"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "stream capture merge"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "stream capture unmatched"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "stream capture unjoined"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "stream capture isolation"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "stream capture implicit"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "captured event"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "stream capture wrong thread"},
    {909, "CUDA_ERROR_TIMEOUT", "timeout"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "graph exec update failure"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE", "external device"},
    {912, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {913, "CUDA_ERROR_FUNCTION_NOT_LOADED", "function not loaded"},
    {914, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "invalid resource configuration"},
    {916, "CUDA_ERROR_KEY_ROTATION", "key rotation"},
    {917, "CUDA_ERROR_STREAM_DETACHED", "stream detached"},
    {918, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE", "graph recapture failure"},
    {919, "CUDA_ERROR_FABRIC_NOT_READY", "fabric not ready"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int find(CUresult e) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == (int)e) return (int)i;
    return -1;
}

FC_API CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    int i = find(error);
    *pStr = i < 0 ? NULL : errors[i].name;
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

FC_API CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    int i = find(error);
    *pStr = i < 0 ? NULL : errors[i].text;
    return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
