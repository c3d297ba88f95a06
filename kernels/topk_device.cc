// DeviceTopKEfState and the TopK-EF encode on a Backend: the CPU codec's steps (topk_ef.h) as a
// sequence of kernels, then the envelope on the host.
#include <algorithm>
#include <climits>
#include <memory>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/index_coding.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"
#include "codecs/value_coding.h"
#include "kernels/backend.h"
#include "kernels/device_codec.h"
#include "kernels/device_internal.h"

namespace lbcc::kernels {

namespace {

Geometry ToKernelGeometry(const codecs::ChunkGeometry& g) {
  Geometry k;
  k.rows = g.rows;
  k.cols = g.cols;
  k.h = g.h;
  k.w = g.w;
  k.chunk_len = g.chunk_len;
  k.chunks_x = g.chunks_x;
  k.num_chunks = g.num_chunks;
  return k;
}

}  // namespace

// The per-encode device buffers of a state, sized for one (count, coding) and regrown when a
// later encode needs more.
struct DeviceTopKEfState::Buffers {
  Backend* backend = nullptr;
  uint8_t* arena = nullptr;
  size_t arena_bytes = 0;
  uint16_t* sel_local = nullptr;
  float* sel_value = nullptr;
  float* centered = nullptr;
  uint8_t* codes = nullptr;
  uint32_t* bits6 = nullptr;
  uint32_t* bits7 = nullptr;
  uint64_t* offsets6 = nullptr;
  uint64_t* offsets7 = nullptr;
  uint8_t* index = nullptr;
  size_t index_bytes = 0;
  uint8_t* values = nullptr;
  SumStats* partials = nullptr;
  BinStats* bin_partials = nullptr;
  EncodeSummary* summary = nullptr;
  void* scan_temp = nullptr;
  size_t scan_temp_bytes = 0;

  ~Buffers() {
    if (arena != nullptr) backend->Free(arena);
  }
};

DeviceTopKEfState::DeviceTopKEfState(Backend& backend, int device)
    : backend_(&backend), device_(device) {}

absl::StatusOr<std::unique_ptr<DeviceTopKEfState>> DeviceTopKEfState::Create(Backend& backend,
                                                                              int device) {
  if (device < 0) return absl::InvalidArgumentError(absl::StrCat("device ", device));
  return std::unique_ptr<DeviceTopKEfState>(new DeviceTopKEfState(backend, device));
}

absl::StatusOr<std::unique_ptr<DeviceTopKEfState>> DeviceTopKEfState::Create(int device) {
  Backend* backend = CudaBackend();
  if (backend == nullptr) return NoCuda("DeviceTopKEfState");
  return Create(*backend, device);
}

DeviceTopKEfState::~DeviceTopKEfState() {
  for (void* e : events_) {
    if (e != nullptr) backend_->DestroyEvent(e);
  }
  Release();
  if (host_ != nullptr) backend_->FreeHost(host_);
}

void DeviceTopKEfState::Release() {
  buffers_.reset();
  if (arena_ != nullptr) backend_->Free(arena_);
  arena_ = nullptr;
  error_ = nullptr;
  next_ = nullptr;
}

absl::Status DeviceTopKEfState::Reset(absl::Span<const int64_t> shape) {
  LBCC_ASSIGN_OR_RETURN(codecs::ChunkGeometry g, codecs::MakeChunkGeometry(shape));
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  Release();
  initialized_ = false;
  pending_ = false;
  const size_t bytes = static_cast<size_t>(g.num_elements) * sizeof(float);
  const size_t half = AlignUp(bytes);
  LBCC_ASSIGN_OR_RETURN(void* arena, backend_->Malloc(std::max<size_t>(2 * half, 256)));
  arena_ = static_cast<uint8_t*>(arena);
  error_ = reinterpret_cast<float*>(arena_);
  next_ = reinterpret_cast<float*>(arena_ + half);
  LBCC_RETURN_IF_ERROR(backend_->Memset(arena_, 0, 2 * half, nullptr));
  LBCC_RETURN_IF_ERROR(backend_->Synchronize(nullptr));
  geometry_ = g;
  shape_.assign(shape.begin(), shape.end());
  initialized_ = true;
  return absl::OkStatus();
}

absl::Status DeviceTopKEfState::Load(absl::Span<const int64_t> shape,
                                     absl::Span<const float> error) {
  LBCC_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  if (static_cast<int64_t>(error.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("topk_ef state: ", error.size(),
                                                   " values for shape ", ShapeToString(shape)));
  }
  for (size_t i = 0; i < error.size(); ++i) {
    if (hd::AbsBits(error[i]) > hd::kMaxFiniteAbsBits) {
      return absl::InvalidArgumentError(absl::StrCat("topk_ef state: entry ", i, " is not finite"));
    }
  }
  LBCC_RETURN_IF_ERROR(Reset(shape));
  LBCC_RETURN_IF_ERROR(
      backend_->CopyToDevice(error_, error.data(), error.size() * sizeof(float), nullptr));
  return backend_->Synchronize(nullptr);
}

absl::Status DeviceTopKEfState::CopyErrorToHost(absl::Span<float> out) const {
  if (static_cast<int64_t>(out.size()) != geometry_.num_elements || !initialized_) {
    return absl::InvalidArgumentError(absl::StrCat("topk_ef state holds ", geometry_.num_elements,
                                                   " values, the buffer ", out.size()));
  }
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  LBCC_RETURN_IF_ERROR(backend_->CopyToHost(out.data(), error_, out.size() * sizeof(float), nullptr));
  return backend_->Synchronize(nullptr);
}

absl::Status DeviceTopKEfState::CopyPendingErrorToHost(absl::Span<float> out) const {
  if (!pending_) return absl::FailedPreconditionError("topk_ef state: nothing pending");
  if (static_cast<int64_t>(out.size()) != geometry_.num_elements) {
    return absl::InvalidArgumentError(absl::StrCat("topk_ef state holds ", geometry_.num_elements,
                                                   " values, the buffer ", out.size()));
  }
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  LBCC_RETURN_IF_ERROR(backend_->CopyToHost(out.data(), next_, out.size() * sizeof(float), nullptr));
  return backend_->Synchronize(nullptr);
}

absl::Status DeviceTopKEfState::Commit() {
  return codecs::CommitPendingError(pending_, error_, next_);
}

absl::Status DeviceTopKEfState::Abort() { return codecs::AbortPendingError(pending_); }

struct TopKEncoder {
  // Grows the state's per-encode buffers for `count` values of `coding` and the staging.
  static absl::Status Prepare(DeviceTopKEfState& st, const codecs::TopKEfOptions& o, int64_t k) {
    Backend& be = *st.backend_;
    const codecs::ChunkGeometry& g = st.geometry_;
    const int64_t count = g.num_chunks * k;
    const codecs::IndexLayout layout{g.num_chunks, k, g.chunk_len};
    const size_t index_bytes =
        AlignUp(std::max(codecs::Packed12Bytes(count), codecs::AdaptiveMaxBytes(layout)) + 8);
    const size_t value_bytes = codecs::ValueSectionBytes(o.values, count, o.value_block);
    const size_t scan_bytes = be.ScanTempBytes(g.num_chunks);
    const size_t n = static_cast<size_t>(count), chunks = static_cast<size_t>(g.num_chunks);
    const size_t sizes[] = {
        n * sizeof(uint16_t),  n * sizeof(float),    n * sizeof(float),
        n,                     chunks * 4,           chunks * 4,
        chunks * 8,            chunks * 8,           index_bytes,
        value_bytes + 8,       kMaxPartials * sizeof(SumStats),
        kMaxPartials * 256 * sizeof(BinStats),       sizeof(EncodeSummary),
        scan_bytes,
    };
    size_t total = 0;
    for (size_t s : sizes) total += AlignUp(s);
    if (st.buffers_ == nullptr || st.buffers_->arena_bytes < total ||
        st.buffers_->index_bytes < index_bytes) {
      st.buffers_.reset();
      auto b = std::make_unique<DeviceTopKEfState::Buffers>();
      b->backend = &be;
      LBCC_ASSIGN_OR_RETURN(void* arena, be.Malloc(total));
      b->arena = static_cast<uint8_t*>(arena);
      b->arena_bytes = total;
      st.buffers_ = std::move(b);
    }
    DeviceTopKEfState::Buffers& b = *st.buffers_;
    uint8_t* p = b.arena;
    auto carve = [&p](size_t bytes) {
      uint8_t* r = p;
      p += AlignUp(bytes);
      return r;
    };
    b.sel_local = reinterpret_cast<uint16_t*>(carve(sizes[0]));
    b.sel_value = reinterpret_cast<float*>(carve(sizes[1]));
    b.centered = reinterpret_cast<float*>(carve(sizes[2]));
    b.codes = carve(sizes[3]);
    b.bits6 = reinterpret_cast<uint32_t*>(carve(sizes[4]));
    b.bits7 = reinterpret_cast<uint32_t*>(carve(sizes[5]));
    b.offsets6 = reinterpret_cast<uint64_t*>(carve(sizes[6]));
    b.offsets7 = reinterpret_cast<uint64_t*>(carve(sizes[7]));
    b.index = carve(sizes[8]);
    b.index_bytes = index_bytes;
    b.values = carve(sizes[9]);
    b.partials = reinterpret_cast<SumStats*>(carve(sizes[10]));
    b.bin_partials = reinterpret_cast<BinStats*>(carve(sizes[11]));
    b.summary = reinterpret_cast<EncodeSummary*>(carve(sizes[12]));
    b.scan_temp = carve(sizes[13]);
    b.scan_temp_bytes = scan_bytes;
    return absl::OkStatus();
  }

  static absl::Status GrowHost(DeviceTopKEfState& st, size_t bytes) {
    if (st.host_bytes_ >= bytes) return absl::OkStatus();
    if (st.host_ != nullptr) st.backend_->FreeHost(st.host_);
    st.host_ = nullptr;
    st.host_bytes_ = 0;
    LBCC_ASSIGN_OR_RETURN(void* host, st.backend_->MallocHost(bytes));
    st.host_ = static_cast<uint8_t*>(host);
    st.host_bytes_ = bytes;
    return absl::OkStatus();
  }

  // Steps 1-2: the EF update into st.next_ and the selection.
  static absl::Status Select(DeviceTopKEfState& st, const codecs::TopKEfOptions& o, int64_t k,
                             const IndexPlanArgs& plan, const float* delta, Stream stream) {
    DeviceTopKEfState::Buffers& b = *st.buffers_;
    SelectArgs sa;
    sa.g = ToKernelGeometry(st.geometry_);
    sa.k = k;
    sa.beta = o.beta;
    sa.lr = o.lr;
    sa.rice6 = plan.rice6;
    sa.rice7 = plan.rice7;
    sa.e = st.error_;
    sa.delta = delta;
    sa.next = st.next_;
    sa.vec4 = CanLoadVec4(sa.g, sa.e, sa.delta, sa.next);
    sa.sel_local = b.sel_local;
    sa.sel_value = b.sel_value;
    sa.bits6 = b.bits6;
    sa.bits7 = b.bits7;
    sa.bad_chunk = &b.summary->bad_chunk;
    return st.backend_->Select(sa, stream);
  }

  // Step 3a: the index coding's choice and the index section.
  static absl::Status CodeIndices(DeviceTopKEfState& st, const codecs::TopKEfOptions& o,
                                  int64_t k, const IndexPlanArgs& plan, Stream stream) {
    Backend& be = *st.backend_;
    DeviceTopKEfState::Buffers& b = *st.buffers_;
    const codecs::ChunkGeometry& g = st.geometry_;
    PlanArgs pa;
    pa.plan = plan;
    pa.num_chunks = g.num_chunks;
    pa.summary = b.summary;
    if (o.indices != codecs::IndexCoding::kPacked12) {
      LBCC_RETURN_IF_ERROR(be.ExclusiveScan(b.bits6, b.offsets6, g.num_chunks, b.scan_temp,
                                            b.scan_temp_bytes, stream));
      LBCC_RETURN_IF_ERROR(be.ExclusiveScan(b.bits7, b.offsets7, g.num_chunks, b.scan_temp,
                                            b.scan_temp_bytes, stream));
      pa.bits6 = b.bits6;
      pa.bits7 = b.bits7;
      pa.offsets6 = b.offsets6;
      pa.offsets7 = b.offsets7;
    }
    LBCC_RETURN_IF_ERROR(be.PlanIndex(pa, stream));
    LBCC_RETURN_IF_ERROR(be.Memset(b.index, 0, b.index_bytes, stream));
    IndexWriteArgs ia;
    ia.num_chunks = g.num_chunks;
    ia.k = k;
    ia.chunk_len = g.chunk_len;
    ia.sel_local = b.sel_local;
    ia.offsets6 = b.offsets6;
    ia.offsets7 = b.offsets7;
    ia.summary = b.summary;
    ia.out = b.index;
    return be.WriteIndices(ia, stream);
  }

  // Step 3b: the value section; sel_value then holds the reconstructions.
  static absl::Status CodeValues(DeviceTopKEfState& st, const codecs::TopKEfOptions& o,
                                 int64_t count, Stream stream) {
    Backend& be = *st.backend_;
    DeviceTopKEfState::Buffers& b = *st.buffers_;
    const int coding = static_cast<int>(o.values);
    const int bits = BinMeanBits(coding);
    if (bits > 0) {
      BinMeanArgs ba;
      ba.n = count;
      ba.bits = bits;
      ba.range_sigmas = o.range_sigmas;
      ba.values = b.sel_value;
      ba.centered = b.centered;
      ba.codes = b.codes;
      ba.section = b.values;
      ba.summary = b.summary;
      ba.partials = b.partials;
      ba.bin_partials = b.bin_partials;
      return be.EncodeBinMean(ba, stream);
    }
    if (coding == kValueAbsmax8 || coding == kValueAbsmax4) {
      AbsmaxArgs aa;
      aa.coding = coding;
      aa.n = count;
      aa.block = o.value_block;
      aa.values = b.sel_value;
      aa.section = b.values;
      return be.EncodeAbsmax(aa, stream);
    }
    return be.EncodeFloatValues(coding, b.sel_value, count, b.values, stream);
  }

  // Step 4: e_new = e' - v_hat at the selected positions.
  static absl::Status Subtract(DeviceTopKEfState& st, int64_t k, int64_t count, Stream stream) {
    SubtractArgs xa;
    xa.g = ToKernelGeometry(st.geometry_);
    xa.k = k;
    xa.count = count;
    xa.sel_local = st.buffers_->sel_local;
    xa.v_hat = st.buffers_->sel_value;
    xa.next = st.next_;
    return st.backend_->SubtractReconstruction(xa, stream);
  }

  // Where the host staging holds the summary, the index section (index_room bytes) and the
  // value section.
  struct Staging {
    size_t index_at = AlignUp(sizeof(EncodeSummary));
    size_t index_room = 0;
    size_t value_bytes = 0;
    size_t bytes() const { return index_at + AlignUp(index_room) + AlignUp(value_bytes); }
    EncodeSummary* summary(const DeviceTopKEfState& st) const {
      return reinterpret_cast<EncodeSummary*>(st.host_);
    }
    uint8_t* index(const DeviceTopKEfState& st) const { return st.host_ + index_at; }
    uint8_t* values(const DeviceTopKEfState& st) const {
      return st.host_ + index_at + AlignUp(index_room);
    }
  };

  // Brings the summary and the payload's sections back into the staging (only they cross) and
  // reports a bad chunk as the CPU codec does; an adaptive index section's length is known
  // only then, so the staging may grow (keeping the values).
  static absl::Status Fetch(DeviceTopKEfState& st, const codecs::TopKEfOptions& o,
                            size_t packed_bytes, Staging& at, Stream stream) {
    Backend& be = *st.backend_;
    DeviceTopKEfState::Buffers& b = *st.buffers_;
    const codecs::ChunkGeometry& g = st.geometry_;
    LBCC_RETURN_IF_ERROR(
        be.CopyToHost(at.summary(st), b.summary, sizeof(EncodeSummary), stream));
    if (o.indices != codecs::IndexCoding::kAdaptive) {
      LBCC_RETURN_IF_ERROR(be.CopyToHost(at.index(st), b.index, packed_bytes, stream));
    }
    LBCC_RETURN_IF_ERROR(be.CopyToHost(at.values(st), b.values, at.value_bytes, stream));
    LBCC_RETURN_IF_ERROR(be.Synchronize(stream));
    if (at.summary(st)->bad_chunk != INT32_MAX) {
      const int64_t y = at.summary(st)->bad_chunk / g.chunks_x;
      return absl::InvalidArgumentError(absl::StrCat(
          "topk_ef: delta has a NaN or infinite entry, or |beta * e + lr * delta| exceeds 2^100, "
          "in rows ",
          y * g.h, "..", y * g.h + g.h - 1, "; the state is unchanged"));
    }
    if (o.indices != codecs::IndexCoding::kAdaptive) return absl::OkStatus();
    const size_t index_bytes = static_cast<size_t>(at.summary(st)->index_bytes);
    if (index_bytes > at.index_room) {
      const EncodeSummary saved = *at.summary(st);
      std::vector<uint8_t> values(at.values(st), at.values(st) + at.value_bytes);
      at.index_room = index_bytes;
      LBCC_RETURN_IF_ERROR(GrowHost(st, at.bytes()));
      *at.summary(st) = saved;
      if (at.value_bytes > 0) std::memcpy(at.values(st), values.data(), at.value_bytes);
    }
    LBCC_RETURN_IF_ERROR(be.CopyToHost(at.index(st), b.index, index_bytes, stream));
    return be.Synchronize(stream);
  }

  static absl::StatusOr<size_t> Encode(const codecs::TopKEfCodec& codec, const float* delta,
                                       absl::Span<const int64_t> shape, DeviceTopKEfState& st,
                                       absl::Span<uint8_t> out, Stream stream) {
    const codecs::TopKEfOptions& o = codec.options();
    if (o.ChunkingFor(shape) != codecs::Chunking::kShapeAware) {
      return absl::UnimplementedError(
          "topk_ef: the device encoder chunks 1-D tensors as chunk_1d lbcc/templar only "
          "(flat4096: encode on the host)");
    }
    LBCC_RETURN_IF_ERROR(codecs::PrepareTopKEfState(codec, st, shape, out.size()));
    Backend& be = *st.backend_;
    LBCC_RETURN_IF_ERROR(be.SetDevice(st.device_));
    const codecs::ChunkGeometry& g = st.geometry_;
    const int64_t k = o.KFor(g);
    const codecs::IndexLayout layout{g.num_chunks, k, g.chunk_len};
    const int64_t count = layout.count();
    const size_t packed_bytes = codecs::Packed12Bytes(count);
    IndexPlanArgs plan;
    plan.requested = static_cast<int>(o.indices);
    plan.count = count;
    plan.rice6 = codecs::AdaptiveRice(layout, 6);
    plan.rice7 = codecs::AdaptiveRice(layout, 7);

    Staging at;
    at.index_room = packed_bytes;
    at.value_bytes = codecs::ValueSectionBytes(o.values, count, o.value_block);
    LBCC_RETURN_IF_ERROR(GrowHost(st, at.bytes()));
    std::memset(at.summary(st), 0, sizeof(EncodeSummary));
    at.summary(st)->bad_chunk = INT32_MAX;

    if (count == 0) {
      // An empty tensor: nothing to select; the CPU codec's parameters for no values.
      PlanIndexCoding(plan, 0, 0, at.summary(st));
      st.pending_ = true;
      return Assemble(codec, shape, k, *at.summary(st), at.index(st), at.values(st), out, &st);
    }

    LBCC_RETURN_IF_ERROR(Prepare(st, o, k));
    LBCC_RETURN_IF_ERROR(
        be.CopyToDevice(st.buffers_->summary, at.summary(st), sizeof(EncodeSummary), stream));
    if (st.timing_ && st.events_[0] == nullptr) {
      for (void*& e : st.events_) {
        LBCC_ASSIGN_OR_RETURN(e, be.CreateEvent());
      }
    }
    if (st.timing_) LBCC_RETURN_IF_ERROR(be.RecordEvent(st.events_[0], stream));
    LBCC_RETURN_IF_ERROR(Select(st, o, k, plan, delta, stream));
    LBCC_RETURN_IF_ERROR(CodeIndices(st, o, k, plan, stream));
    LBCC_RETURN_IF_ERROR(CodeValues(st, o, count, stream));
    LBCC_RETURN_IF_ERROR(Subtract(st, k, count, stream));
    if (st.timing_) LBCC_RETURN_IF_ERROR(be.RecordEvent(st.events_[1], stream));
    LBCC_RETURN_IF_ERROR(Fetch(st, o, packed_bytes, at, stream));
    if (st.timing_) {
      LBCC_ASSIGN_OR_RETURN(st.stats_.last_device_seconds,
                            be.ElapsedSeconds(st.events_[0], st.events_[1]));
    }
    const EncodeSummary& summary = *at.summary(st);
    ++st.stats_.encodes;
    if (summary.fallbacks & kFallbackShift) ++st.stats_.shift_fallbacks;
    if (summary.fallbacks & kFallbackNorm) ++st.stats_.norm_fallbacks;
    if (summary.fallbacks & kFallbackBins) ++st.stats_.bin_fallbacks;
    st.pending_ = true;
    return Assemble(codec, shape, k, summary, at.index(st), at.values(st), out, &st);
  }

  // Writes the payload from the staged sections, exactly as codecs/topk_ef.cc does.
  static absl::StatusOr<size_t> Assemble(const codecs::TopKEfCodec& codec,
                                         absl::Span<const int64_t> shape, int64_t k,
                                         const EncodeSummary& s, const uint8_t* index,
                                         const uint8_t* values, absl::Span<uint8_t> out,
                                         DeviceTopKEfState* st) {
    const codecs::TopKEfOptions& o = codec.options();
    const codecs::ChunkGeometry& g = st->geometry_;
    const int64_t count = g.num_chunks * k;
    const size_t value_param_bytes = codecs::ValueParamBytes(o.values);
    const size_t value_bytes = codecs::ValueSectionBytes(o.values, count, o.value_block);
    const size_t index_bytes = static_cast<size_t>(s.index_bytes);
    codecs::TopKEfFixedParams fixed;
    fixed.k = k;
    fixed.values = o.values;
    fixed.indices = static_cast<codecs::IndexCoding>(s.index_coding);
    fixed.adaptive.sub_block_log2 = static_cast<int>(s.sub_block_log2);
    fixed.adaptive.rice = static_cast<int>(s.rice);
    fixed.index_bytes = index_bytes;
    codecs::PayloadWriter writer;
    absl::Status begun =
        codecs::BeginTopKEfPayload(fixed, shape, value_param_bytes, value_bytes, out, &writer);
    if (!begun.ok()) {
      st->pending_ = false;
      return begun;
    }
    codecs::ByteWriter params(
        writer.params().subspan(codecs::TopKEfFixedParamBytes(fixed.chunking)));
    if (codecs::IsBinMean(o.values)) {
      const int bins = 1 << BinMeanBits(static_cast<int>(o.values));
      params.F32(s.shift);
      for (int b = 0; b < bins; ++b) params.F32(count > 0 ? s.lookup[b] : 0.0f);
    } else if (codecs::IsAbsmax(o.values)) {
      params.U32(static_cast<uint32_t>(o.value_block));
    }
    uint8_t* body = writer.body().data();
    if (index_bytes > 0) std::memcpy(body, index, index_bytes);
    if (value_bytes > 0) std::memcpy(body + index_bytes, values, value_bytes);
    return writer.Finish();
  }
};

namespace {

constexpr int64_t kMaxPayloads = 65535;  // codecs/topk_ef.cc: selection counts are 16-bit

// templar's median-norm clip: factors from the payloads on the host (codecs/topk_ef.h), applied
// to the bin-mean tables, so the device adds exactly the CPU decoder's v_hat * factor.
absl::Status MedianNormClip(absl::Span<const codecs::TopKEfHeader> headers,
                            absl::Span<float> clip) {
  std::vector<float> norms(headers.size()), buffer(codecs::kTopKReferenceChunk);
  for (size_t r = 0; r < headers.size(); ++r) {
    const codecs::TopKEfHeader& h = headers[r];
    if (!codecs::IsBinMean(h.values)) {
      return absl::UnimplementedError(absl::StrCat(
          "topk_ef: the device decoder clips bin-mean payloads only (payload ", r, " is ",
          codecs::ValueCodingName(h.values), "): decode on the host"));
    }
    codecs::ValueDecoder values;
    LBCC_RETURN_IF_ERROR(
        Annotate(values.Init(h.values, h.value_params, h.value_section, h.layout.count()),
                 absl::StrCat("payload ", r)));
    norms[r] = codecs::DecodedNorm(values, h.layout.count(), buffer.data());
  }
  codecs::MedianNormClipFactors(norms, clip);
  return absl::OkStatus();
}

absl::Status DecodeTopK(Backend& be, absl::Span<const codecs::PayloadInfo> infos,
                        const codecs::DecodeOptions& options, float* out, Stream stream,
                        DeviceScratch& scratch) {
  if (static_cast<int64_t>(infos.size()) > kMaxPayloads) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: at most ", kMaxPayloads, " payloads per call"));
  }
  // Phase 1 (host): validate everything, as the CPU decoder does, before touching `out`.
  std::vector<codecs::TopKEfHeader> headers(infos.size());
  std::vector<size_t> index_first(infos.size());
  size_t total = 0;
  for (size_t r = 0; r < infos.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(headers[r], codecs::ParseTopKEfHeader(infos[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
    index_first[r] = total;
    total += static_cast<size_t>(headers[r].layout.count());
  }
  const codecs::ChunkGeometry& g = headers[0].geometry;
  Image image;
  const size_t descs_at = image.Add(infos.size() * sizeof(TopKPayloadDesc));
  const size_t indices_at = image.Add(total * sizeof(uint16_t));
  std::vector<size_t> table_at(infos.size(), 0), values_at(infos.size(), 0);
  for (size_t r = 0; r < infos.size(); ++r) {
    if (codecs::IsBinMean(headers[r].values)) table_at[r] = image.Add(256 * sizeof(float));
    values_at[r] = image.Add(headers[r].value_section.size());
  }
  std::vector<float> clip(infos.size(), 1.0f);
  if (options.clip_to_median_norm) {
    LBCC_RETURN_IF_ERROR(MedianNormClip(headers, absl::MakeSpan(clip)));
  }
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, scratch.Host(image.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, scratch.Device(image.size()));
  auto* indices = reinterpret_cast<uint16_t*>(host + indices_at);
  auto* descs = reinterpret_cast<TopKPayloadDesc*>(host + descs_at);
  for (size_t r = 0; r < infos.size(); ++r) {
    const codecs::TopKEfHeader& h = headers[r];
    const absl::Span<uint16_t> list(indices + index_first[r], static_cast<size_t>(h.layout.count()));
    absl::Status status =
        h.indices == codecs::IndexCoding::kAdaptive
            ? codecs::DecodeAdaptive(h.index_section, h.layout, h.adaptive, list)
            : codecs::DecodePacked12(h.index_section, h.layout, list);
    codecs::ValueDecoder values;
    if (status.ok()) status = values.Init(h.values, h.value_params, h.value_section, h.layout.count());
    if (!status.ok()) return Annotate(status, absl::StrCat("payload ", r));
    TopKPayloadDesc d;
    d.k = h.layout.k;
    d.index_offset = static_cast<int64_t>(index_first[r]);
    d.coding = static_cast<int32_t>(h.values);
    d.block = values.block();
    d.values = device + values_at[r];
    if (!h.value_section.empty()) {
      std::memcpy(host + values_at[r], h.value_section.data(), h.value_section.size());
    }
    if (codecs::IsBinMean(h.values)) {
      // codecs::ValueDecoder's table: lookup[b] + shift in fp32.
      auto* table = reinterpret_cast<float*>(host + table_at[r]);
      const int bins = 1 << BinMeanBits(d.coding);
      const float shift = hd::LoadF32(h.value_params.data());
      for (int b = 0; b < 256; ++b) {
        table[b] = b < bins ? hd::Add(hd::LoadF32(h.value_params.data() + 4 + 4 * b), shift) : 0.0f;
        if (clip[r] != 1.0f) table[b] = hd::Mul(table[b], clip[r]);
      }
      d.table = reinterpret_cast<const float*>(device + table_at[r]);
    }
    descs[r] = d;
  }
  if (g.num_chunks == 0) return absl::OkStatus();  // no elements
  // Phase 2 (device): upload, aggregate chunk by chunk.
  LBCC_RETURN_IF_ERROR(be.CopyToDevice(device, host, image.size(), stream));
  AggregateArgs a;
  a.g = ToKernelGeometry(g);
  a.payloads = reinterpret_cast<const TopKPayloadDesc*>(device + descs_at);
  a.num_payloads = static_cast<int32_t>(infos.size());
  a.indices = reinterpret_cast<const uint16_t*>(device + indices_at);
  a.rule = static_cast<int32_t>(options.aggregation);
  a.accumulate = options.accumulate;
  a.out = out;
  LBCC_RETURN_IF_ERROR(be.AggregateTopK(a, stream));
  return be.Synchronize(stream);
}

class TopKEfDevice final : public DeviceCodec {
 public:
  absl::StatusOr<std::unique_ptr<codecs::CodecState>> NewState(int device) const override {
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceTopKEfState> state,
                          DeviceTopKEfState::Create(device));
    return std::unique_ptr<codecs::CodecState>(std::move(state));
  }

  absl::StatusOr<size_t> Encode(Backend& backend, const codecs::Codec& codec, const float* data,
                                absl::Span<const int64_t> shape, codecs::CodecState* state,
                                absl::Span<uint8_t> out, Stream stream,
                                DeviceScratch& /*scratch*/) const override {
    const auto* topk = dynamic_cast<const codecs::TopKEfCodec*>(&codec);
    if (topk == nullptr) return absl::InvalidArgumentError("topk_ef: not a TopKEfCodec");
    // A device state of codec kTopKEf is a DeviceTopKEfState: only this twin makes them.
    auto* st = state != nullptr && state->is_device() && state->codec() == codecs::CodecId::kTopKEf
                   ? static_cast<DeviceTopKEfState*>(state)
                   : nullptr;
    if (st == nullptr || &st->backend() != &backend) {
      return absl::InvalidArgumentError(
          "topk_ef: encoding device memory needs the tensor's DeviceTopKEfState "
          "(kernels::NewDeviceState)");
    }
    return TopKEncoder::Encode(*topk, data, shape, *st, out, stream);
  }

  absl::Status DecodeAccumulate(Backend& backend, absl::Span<const codecs::PayloadInfo> infos,
                                const codecs::DecodeOptions& options, float* out,
                                int64_t /*num_elements*/, Stream stream,
                                DeviceScratch& scratch) const override {
    return DecodeTopK(backend, infos, options, out, stream, scratch);
  }
};

}  // namespace

LBCC_REGISTER_DEVICE_CODEC(codecs::CodecId::kTopKEf, TopKEfDevice);

}  // namespace lbcc::kernels
