// octet/interpret/tensor_map.hpp: interpret mode's CUtensorMap. A tensor map is opaque to kernels; in
// interpret mode the runtime's cuTensorMapEncodeTiled (tensor_map_encode_tiled below, reached through
// cudaGetDriverEntryPoint[ByVersion], runtime.hpp) validates its arguments as the driver documents them
// and stores the description below in the map's 128 bytes, which the TMA model (ptx_models.hpp) reads.
// Its own header so that the runtime does not depend on the instruction models.
#pragma once

#include <cuda.h>  // CUtensorMap, cuTensorMapEncodeTiled's enums (the toolkit's header; nothing is linked)

#include <cstdint>
#include <cstring>

namespace octet {
namespace interpret {
namespace model {

struct tensor_map_desc {
    std::uint32_t magic;                                                              // kTensorMapMagic: encoded here
    std::uint8_t rank, element_bytes, swizzle_bytes, interleave, oob_nan, data_type;  // swizzle 0/32/64/128
    std::uint16_t box[5];
    std::uint8_t element_strides[5];
    std::uint64_t base, dims[5], strides[4];  // strides: globalStrides (bytes) of dimensions 1..4
};
static_assert(sizeof(tensor_map_desc) <= sizeof(CUtensorMap), "the description fits in a CUtensorMap");
inline constexpr std::uint32_t kTensorMapMagic = 0x0C7E7A3Bu;

/// The element size of a tensor map data type, 0 for the packed sub-byte types (not modelled).
inline std::uint32_t tensor_map_element_bytes(CUtensorMapDataType t) {
    switch (t) {
        case CU_TENSOR_MAP_DATA_TYPE_UINT8:
            return 1;
        case CU_TENSOR_MAP_DATA_TYPE_UINT16:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
        case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
            return 2;
        case CU_TENSOR_MAP_DATA_TYPE_UINT32:
        case CU_TENSOR_MAP_DATA_TYPE_INT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
        case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
        case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
            return 4;
        case CU_TENSOR_MAP_DATA_TYPE_UINT64:
        case CU_TENSOR_MAP_DATA_TYPE_INT64:
        case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
            return 8;
        default:
            return 0;
    }
}

/// cuTensorMapEncodeTiled with the driver's documented argument rules (CUDA driver API, "Tensor Map
/// Object Management"): rank 1..5 (3..5 when interleaved); globalAddress 16-byte aligned (32 with
/// 32-byte interleave); globalDim[i] in 1..2^32; globalStrides[i] multiples of 16 below 2^40 (and
/// each at least the previous dimension's extent in bytes); boxDim[i] in 1..256, boxDim[0] *
/// element size a multiple of 16 bytes when not interleaved; elementStrides[i] in 1..8; with
/// interleave NONE and a swizzle, the inner box extent in bytes at most the swizzle span; 32-byte
/// interleave only with the 32-byte swizzle; NaN out-of-bounds fill only for floating-point types.
/// CUDA_ERROR_INVALID_VALUE otherwise.
inline CUresult tensor_map_encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion /*l2: a hint*/,
                                        CUtensorMapFloatOOBfill oob) {
    const std::uint32_t eb = tensor_map_element_bytes(type);
    if (!map || !address || !dims || !box || !element_strides || eb == 0) return CUDA_ERROR_INVALID_VALUE;
    if (rank < 1 || rank > 5 || (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3))
        return CUDA_ERROR_INVALID_VALUE;
    if (rank > 1 && !strides) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t align = interleave == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16;
    if (reinterpret_cast<std::uintptr_t>(address) % align != 0) return CUDA_ERROR_INVALID_VALUE;
    for (cuuint32_t i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
        if (box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
        if (element_strides[i] == 0 || element_strides[i] > 8) return CUDA_ERROR_INVALID_VALUE;
    }
    std::uint64_t extent = dims[0] * eb;  // bytes spanned by dimensions 0..i
    for (cuuint32_t i = 0; i + 1 < rank; ++i) {
        if (strides[i] % align != 0 || strides[i] >= (1ull << 40) || strides[i] < extent)
            return CUDA_ERROR_INVALID_VALUE;
        extent = strides[i] * dims[i + 1];
    }
    std::uint32_t span = 0;
    switch (swizzle) {
        case CU_TENSOR_MAP_SWIZZLE_NONE:
            break;
        case CU_TENSOR_MAP_SWIZZLE_32B:
            span = 32;
            break;
        case CU_TENSOR_MAP_SWIZZLE_64B:
            span = 64;
            break;
        case CU_TENSOR_MAP_SWIZZLE_128B:
            span = 128;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;  // the 128B atom variants are not modelled
    }
    if (interleave == CU_TENSOR_MAP_INTERLEAVE_NONE) {
        if (box[0] * eb % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
        if (span && box[0] * eb > span) return CUDA_ERROR_INVALID_VALUE;
    } else if (interleave == CU_TENSOR_MAP_INTERLEAVE_32B && span != 32) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const bool is_float = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ||
                          type == CU_TENSOR_MAP_DATA_TYPE_FLOAT64 || type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 ||
                          type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ || type == CU_TENSOR_MAP_DATA_TYPE_TFLOAT32 ||
                          type == CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ;
    if (oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && !is_float) return CUDA_ERROR_INVALID_VALUE;
    tensor_map_desc d{};
    d.magic = kTensorMapMagic;
    d.rank = static_cast<std::uint8_t>(rank);
    d.element_bytes = static_cast<std::uint8_t>(eb);
    d.swizzle_bytes = static_cast<std::uint8_t>(span);
    d.interleave = static_cast<std::uint8_t>(interleave);
    d.oob_nan = oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
    d.data_type = static_cast<std::uint8_t>(type);
    d.base = reinterpret_cast<std::uintptr_t>(address);
    for (cuuint32_t i = 0; i < rank; ++i) {
        d.dims[i] = dims[i];
        d.box[i] = static_cast<std::uint16_t>(box[i]);
        d.element_strides[i] = static_cast<std::uint8_t>(element_strides[i]);
        if (i > 0) d.strides[i - 1] = strides[i - 1];
    }
    std::memset(map, 0, sizeof(CUtensorMap));
    std::memcpy(map, &d, sizeof d);
    return CUDA_SUCCESS;
}

}  // namespace model
}  // namespace interpret
}  // namespace octet
