// Internal: the buffers behind DecodeScratch (codec.h). Only the decoders use this header.
//
// Thread-safety: one scratch per thread.
#ifndef LBCC_CODECS_DECODE_SCRATCH_H_
#define LBCC_CODECS_DECODE_SCRATCH_H_

#include <cstdint>
#include <vector>

#include "base/tensor_view.h"
#include "codecs/chunking.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/index_coding.h"
#include "codecs/payload.h"
#include "codecs/value_coding.h"

namespace lbcc::codecs::internal {

// One validated TopK-EF payload, ready to scatter.
struct TopKParsed {
  int64_t k = 0;
  size_t index_offset = 0;  // into DecodeScratchImpl::indices
  ValueDecoder values;
};

struct DecodeScratchImpl {
  // What PrepareDecode staged for ApplyDecode (codec.h).
  bool prepared = false;
  CodecId prepared_codec = CodecId::kTopKEf;
  DecodeOptions prepared_options;
  TensorView prepared_out;
  size_t prepared_payloads = 0;
  ChunkGeometry topk_geometry;                  // TopK-EF: the payloads' chunking
  std::vector<PayloadInfo> infos;               // per payload: the parsed envelope
  std::vector<uint16_t> indices;                // every payload's decoded local indices
  std::vector<TopKParsed> topk;                 // per payload
  std::vector<float> acc;                       // per-chunk accumulator (4096)
  std::vector<uint16_t> count;                  // per-chunk selection counts (4096)
  std::vector<int64_t> local_offset;            // local position -> offset from the chunk's corner
  std::vector<float> values;                    // one chunk's decoded values (4096)
  std::vector<uint16_t> touched;                // one chunk's distinct selected positions (4096)
  std::vector<float> strip;                     // staged aggregates of a strip of chunks
  std::vector<DenseQuantHeader> dense_headers;  // per payload
  std::vector<float> dense;  // dense decoders: accumulator and one payload's tile
};

}  // namespace lbcc::codecs::internal

#endif  // LBCC_CODECS_DECODE_SCRATCH_H_
