// libFuzzer target for the TopK-EF decoder; see decode_fuzz.h for the input format and the
// properties checked. Run: tools/run_fuzzers (or bazel run --config=fuzz
// //codecs:topk_ef_fuzz_fuzzer -- <corpus dirs>).
#include "codecs/decode_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return lbcc::codecs::FuzzDecode(lbcc::codecs::CodecId::kTopKEf, data, size);
}
