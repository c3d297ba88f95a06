// What the operation header costs a small all-reduce on the CPU (issue 19 item 1), besides its
// 24 bytes on the wire: building the all-reduce's signature (as Communicator::AllReduce does,
// on the posting thread) and hashing it (once per operation, on the worker). The wire and check
// part is measured end to end by bench/signature_overhead.sh; this is the part both of its
// binaries share.
#include <memory>

#include "benchmark/benchmark.h"
#include "comm/signature.h"

namespace lbcc::comm {
namespace {

std::shared_ptr<const Signature::Fields> Settings() {
  auto fields = std::make_shared<Signature::Fields>(Signature::Fields{
      {"nranks", "4"},
      {"communicator", "1"},
      {"topology (LBCC_TOPO_FILE, LBCC_SLOW_RANKS, host names)", "0123456789abcdef"},
      {"LBCC_ALGO", "auto"},
      {"LBCC_SPARSE_GROUP_ELEMENTS", "0"}});
  return fields;
}

void BM_AllReduceSignatureAndHash(benchmark::State& state) {
  const auto settings = Settings();
  const uint64_t settings_hash = Signature::HashFields(*settings);
  int64_t count = 2;
  for (auto _ : state) {
    Signature signature("AllReduce", settings, settings_hash);
    signature.Add("dtype", "f32").Add("count", count).Add("reduce op", "sum").Add("algorithm",
                                                                                 "direct");
    benchmark::DoNotOptimize(signature.Hash());
  }
}
BENCHMARK(BM_AllReduceSignatureAndHash);

}  // namespace
}  // namespace lbcc::comm

BENCHMARK_MAIN();
