// octet/cuda/tensor_map.cuh: TMA tensor maps over byte matrices (FP8 codes) and float matrices
// (scales), encoded on the host with the driver's cuTensorMapEncodeTiled, found through the runtime
// (octet links no libcuda).
#pragma once

#include <cuda.h>          // CUtensorMap and its enums (header only: nothing is linked)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "octet/core/check.hpp"
#include "octet/cuda/check.cuh"

namespace octet {
namespace cuda {

using tensor_map_encode_fn = PFN_cuTensorMapEncodeTiled_v12000;

/// cuTensorMapEncodeTiled from the driver, found through the runtime once (no -lcuda needed).
inline tensor_map_encode_fn tensor_map_encoder() {
    static const tensor_map_encode_fn fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        OCTET_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || p == nullptr)
            throw error("octet: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a CUDA 12 driver)");
        return reinterpret_cast<tensor_map_encode_fn>(p);
    }();
    return fn;
}

/// A 2-d TMA map over a rows x cols matrix of `type` elements (`element_bytes` each) whose rows are
/// `row_bytes` apart (a multiple of 16; the data 16-byte aligned), loading boxes of box_rows x box_cols
/// elements with `swizzle` (the box's rows must fit the swizzle span), zero fill outside the matrix.
/// `fn` names the caller in the error a rejected map throws.
inline CUtensorMap matrix_map(const void* data, CUtensorMapDataType type, std::uint32_t element_bytes, std::size_t rows,
                              std::size_t cols, std::size_t row_bytes, std::uint32_t box_cols, std::uint32_t box_rows,
                              CUtensorMapSwizzle swizzle, const char* fn) {
    CUtensorMap map{};
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t elem[2] = {1u, 1u};
    const CUresult r = tensor_map_encoder()(&map, type, 2, const_cast<void*>(data), dims, strides, box, elem,
                                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw error(detail::message(fn, ": cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a ",
                                    rows, " x ", cols, " matrix of ", element_bytes, "-byte elements with row_bytes ",
                                    row_bytes, " and a ", box_rows, " x ", box_cols, " box"));
    return map;
}

/// matrix_map over bytes (FP8 codes).
inline CUtensorMap byte_matrix_map(const std::uint8_t* data, std::size_t rows, std::size_t cols, std::size_t row_bytes,
                                   std::uint32_t box_cols, std::uint32_t box_rows, CUtensorMapSwizzle swizzle,
                                   const char* fn) {
    return matrix_map(data, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1u, rows, cols, row_bytes, box_cols, box_rows, swizzle, fn);
}

/// matrix_map over floats (scales), unswizzled.
inline CUtensorMap float_matrix_map(const float* data, std::size_t rows, std::size_t cols, std::size_t row_bytes,
                                    std::uint32_t box_cols, std::uint32_t box_rows, const char* fn) {
    return matrix_map(data, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4u, rows, cols, row_bytes, box_cols, box_rows,
                      CU_TENSOR_MAP_SWIZZLE_NONE, fn);
}

}  // namespace cuda
}  // namespace octet
