// CPU feature detection and the SIMD level CPU codecs dispatch on.
//
// LBCC_SIMD=auto|avx2|scalar picks the level (default auto: AVX2+FMA when the CPU has both).
// Asking for avx2 on a CPU without it is a configuration error (ResolveSimdLevel says so;
// ActiveSimdLevel logs a warning and uses scalar).
//
// Thread-safety: all functions are thread-safe; ActiveSimdLevel caches its first answer.
#ifndef LBCC_BASE_CPU_H_
#define LBCC_BASE_CPU_H_

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace lbcc {

enum class SimdLevel { kScalar, kAvx2 };

absl::string_view SimdLevelName(SimdLevel level);

bool CpuHasAvx2Fma();
bool CpuHasF16c();

// Reads LBCC_SIMD now. InvalidArgument for a bad value or avx2 on a CPU without AVX2+FMA.
absl::StatusOr<SimdLevel> ResolveSimdLevel();

// The level hot paths use: ResolveSimdLevel() on first call, kScalar (with a warning) if that
// fails, cached afterwards. SetSimdLevelForTesting() replaces the cached value.
SimdLevel ActiveSimdLevel();
void SetSimdLevelForTesting(SimdLevel level);

}  // namespace lbcc

#endif  // LBCC_BASE_CPU_H_
