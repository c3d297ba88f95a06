#include "base/cpu.h"

#include <atomic>
#include <string>

#include "base/env.h"
#include "base/logging.h"

namespace lbcc {
namespace {

constexpr int kUnresolved = -1;
std::atomic<int> g_active{kUnresolved};

}  // namespace

absl::string_view SimdLevelName(SimdLevel level) {
  return level == SimdLevel::kAvx2 ? "avx2" : "scalar";
}

bool CpuHasAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool CpuHasF16c() {
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  return (ecx >> 29) & 1u;
}

absl::StatusOr<SimdLevel> ResolveSimdLevel() {
  absl::StatusOr<std::string> value = env::GetString("LBCC_SIMD");
  if (!value.ok()) return value.status();
  if (*value == "scalar") return SimdLevel::kScalar;
  const bool has_avx2 = CpuHasAvx2Fma();
  if (*value == "avx2" && !has_avx2) {
    return absl::InvalidArgumentError("LBCC_SIMD=avx2 but this CPU lacks AVX2 or FMA");
  }
  return has_avx2 ? SimdLevel::kAvx2 : SimdLevel::kScalar;
}

SimdLevel ActiveSimdLevel() {
  int level = g_active.load(std::memory_order_relaxed);
  if (level != kUnresolved) return static_cast<SimdLevel>(level);
  absl::StatusOr<SimdLevel> resolved = ResolveSimdLevel();
  SimdLevel chosen = SimdLevel::kScalar;
  if (resolved.ok()) {
    chosen = *resolved;
  } else {
    LBCC_LOG(WARN) << resolved.status().message() << "; using scalar code";
  }
  LBCC_LOG(INFO) << "CPU codecs use " << SimdLevelName(chosen);
  g_active.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

void SetSimdLevelForTesting(SimdLevel level) {
  g_active.store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // namespace lbcc
