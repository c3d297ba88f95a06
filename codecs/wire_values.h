// The codecs' wire values that their CUDA twins (kernels/) use too, one definition for both:
// value and index codings (TopK-EF params), dense formats (dense quantizer params) and the
// aggregation rules. Never renumber one. nvcc-clean (standard headers only): kernels/ hands this
// file to nvcc.
//
// Thread-safety: constants.
#ifndef LBCC_CODECS_WIRE_VALUES_H_
#define LBCC_CODECS_WIRE_VALUES_H_

#include <cstdint>

namespace lbcc::codecs {

// TopK-EF's value coding (value_coding.h).
enum class ValueCoding : uint8_t {
  kF32 = 1,
  kBf16 = 2,
  kF16 = 3,
  kBinMean2 = 4,
  kBinMean4 = 5,
  kBinMean8 = 6,
  kAbsmax8 = 7,
  kAbsmax4 = 8,
};

// TopK-EF's index coding (index_coding.h).
enum class IndexCoding : uint8_t {
  kAuto = 0,  // encoder option only; never on the wire
  kPacked12 = 1,
  kAdaptive = 2,
};

// The dense quantizer's format (dense_quant.h).
enum class DenseFormat : uint8_t { kInt8 = 1, kInt4 = 2, kF16 = 3, kBf16 = 4 };

// How decode-accumulate combines payloads (codec.h).
enum class Aggregation : uint8_t { kSparseLoCoMean = 0, kMean = 1, kSum = 2 };

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_WIRE_VALUES_H_
