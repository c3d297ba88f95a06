// libFuzzer target for the dense quantizer decoder; see decode_fuzz.h for the input format and
// the properties checked. Run: tools/run_fuzzers (or bazel run --config=fuzz
// //codecs:dense_quant_fuzz_fuzzer -- <corpus dirs>).
#include "codecs/decode_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return lbcc::codecs::FuzzDecode(lbcc::codecs::CodecId::kDenseQuant, data, size);
}
