#include "comm/dense_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/mutex.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "comm/communicator.h"

namespace lbcc::comm {
namespace {

using transport::Priority;
using transport::Tag;

// Dense point-to-point messages use their own step, next to compressed.cc's 0xffff.
constexpr uint32_t kDenseP2pStep = 0xfffe;

// One element of `kOp` (avg adds; DenseFinish divides). Integers wrap instead of overflowing
// (undefined for int); for floats NaN wins in min and max, as torch's minimum/maximum do, and
// otherwise the first operand wins ties (b < a ? b : a).
template <DenseOp kOp, typename T>
inline T CombineOne(T a, T b) {
  if constexpr (kOp == DenseOp::kSum || kOp == DenseOp::kAvg) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  } else if constexpr (kOp == DenseOp::kProduct) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  } else if constexpr (kOp == DenseOp::kMin || kOp == DenseOp::kMax) {
    const T better = kOp == DenseOp::kMin ? (b < a ? b : a) : (b > a ? b : a);
    if constexpr (std::is_floating_point_v<T>) {
      // a != a: a is NaN (written as a comparison so that the loop below stays vectorizable).
      return a != a ? a : (b != b ? b : better);
    } else {
      return better;
    }
  } else {
    static_assert(std::is_integral_v<T>, "bitwise reductions are for integers (CheckDenseOp)");
    if constexpr (kOp == DenseOp::kBand) return a & b;
    if constexpr (kOp == DenseOp::kBor) return a | b;
    return a ^ b;
  }
}

// d[i] = d[i] kOp s[i]. The loop runs in blocks of a constant 64 bytes, which GCC vectorizes at
// -O2 (its cheap cost model takes only loops of a known trip count), then a scalar tail; the
// result is element by element the same as the scalar loop's. d and s never overlap (a receive
// buffer is never the data it is combined into).
template <DenseOp kOp, typename T>
void CombineLoop(T* __restrict d, const T* __restrict s, size_t count) {
  constexpr size_t kBlock = 64 / sizeof(T);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (size_t k = 0; k < kBlock; ++k) d[i + k] = CombineOne<kOp>(d[i + k], s[i + k]);
  }
  for (; i < count; ++i) d[i] = CombineOne<kOp>(d[i], s[i]);
}

template <typename T>
void CombineAll(void* dst, const void* src, size_t count, DenseOp op) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  switch (op) {
    case DenseOp::kSum:
    case DenseOp::kAvg:
      return CombineLoop<DenseOp::kSum>(d, s, count);
    case DenseOp::kProduct:
      return CombineLoop<DenseOp::kProduct>(d, s, count);
    case DenseOp::kMin:
      return CombineLoop<DenseOp::kMin>(d, s, count);
    case DenseOp::kMax:
      return CombineLoop<DenseOp::kMax>(d, s, count);
    case DenseOp::kBand:
    case DenseOp::kBor:
    case DenseOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == DenseOp::kBand) return CombineLoop<DenseOp::kBand>(d, s, count);
        if (op == DenseOp::kBor) return CombineLoop<DenseOp::kBor>(d, s, count);
        return CombineLoop<DenseOp::kBxor>(d, s, count);
      }
      break;
  }
  LBCC_CHECK(false) << "DenseCombine: op not checked";
}

// 16-bit floats: combined in f32, rounded once.
template <DenseOp kOp, float (*ToF32)(uint16_t), uint16_t (*FromF32)(float)>
void CombineHalfLoop(uint16_t* __restrict d, const uint16_t* __restrict s, size_t count) {
  for (size_t i = 0; i < count; ++i) d[i] = FromF32(CombineOne<kOp>(ToF32(d[i]), ToF32(s[i])));
}

template <float (*ToF32)(uint16_t), uint16_t (*FromF32)(float)>
void CombineHalf(void* dst, const void* src, size_t count, DenseOp op) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  switch (op) {
    case DenseOp::kSum:
    case DenseOp::kAvg:
      return CombineHalfLoop<DenseOp::kSum, ToF32, FromF32>(d, s, count);
    case DenseOp::kProduct:
      return CombineHalfLoop<DenseOp::kProduct, ToF32, FromF32>(d, s, count);
    case DenseOp::kMin:
      return CombineHalfLoop<DenseOp::kMin, ToF32, FromF32>(d, s, count);
    case DenseOp::kMax:
      return CombineHalfLoop<DenseOp::kMax, ToF32, FromF32>(d, s, count);
    default:
      LBCC_CHECK(false) << "DenseCombine: op not checked";
  }
}

void CombineBool(void* dst, const void* src, size_t count, DenseOp op) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < count; ++i) {
    const bool a = d[i] != 0, b = s[i] != 0;
    switch (op) {
      case DenseOp::kProduct:
      case DenseOp::kMin:
      case DenseOp::kBand:
        d[i] = a && b;
        break;
      case DenseOp::kBxor:
        d[i] = a != b;
        break;
      default:  // sum, max, bor
        d[i] = a || b;
    }
  }
}

absl::Span<uint8_t> Span(void* data, size_t bytes) {
  return absl::Span<uint8_t>(static_cast<uint8_t*>(data), bytes);
}
absl::Span<const uint8_t> ConstSpan(const void* data, size_t bytes) {
  return absl::Span<const uint8_t>(static_cast<const uint8_t*>(data), bytes);
}

// The ring's schedule: the reduce-scatter (steps 0 .. n-2, tags tag + s, chunk c combined
// starting at rank c + 1, so that rank r ends owning chunk r), then with `all_gather` the
// all-gather of the owned chunks (tags tag + n + s) in the same pipelined pass, `op`'s last
// step (avg's division) applied to each owned segment as it completes.
RingSchedule DenseRing(const Group& g, Tag tag, DenseType type, DenseOp op, bool all_gather) {
  const int n = g.size();
  const int me = g.me;
  RingSchedule ring;
  ring.combine_steps = n - 1;
  ring.steps = all_gather ? 2 * (n - 1) : n - 1;
  ring.send_chunk = [me, n](int s) { return ((me - s - 1) % n + n) % n; };
  ring.recv_chunk = [me, n](int s) { return ((me - s - 2) % n + n) % n; };
  ring.step_tag = [tag, n](int s) { return s < n - 1 ? tag + s : tag + n + (s - (n - 1)); };
  ring.combine = [type, op](uint8_t* dst, const uint8_t* src, size_t elements) {
    DenseCombine(dst, src, elements, type, op);
  };
  if (all_gather) {
    ring.finish = [type, op, n](uint8_t* segment, size_t elements) {
      DenseFinish(segment, elements, type, op, n);
    };
  }
  return ring;
}

// Ring reduce-scatter in place over `data` split at begin(c): after n-1 steps this rank's chunk
// (group.me) holds the reduction over the group. Chunk c is combined starting at rank c + 1.
template <typename Begin>
absl::Status RingReduceScatterInPlace(const Group& g, Tag tag, uint8_t* data, Begin begin,
                                      DenseType type, DenseOp op, Priority priority,
                                      absl::Time deadline) {
  const int n = g.size();
  const size_t element = DenseTypeSize(type);
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = begin(c) * element;
  return RingPass(g, data, offsets, element, DenseRing(g, tag, type, op, /*all_gather=*/false),
                  priority, deadline);
}

absl::Status CheckRoot(int root, int n, absl::string_view what) {
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " out of range [0, ", n, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

size_t DenseTypeSize(DenseType type) {
  switch (type) {
    case DenseType::kF64:
    case DenseType::kI64:
      return 8;
    case DenseType::kF32:
    case DenseType::kI32:
      return 4;
    case DenseType::kF16:
    case DenseType::kBF16:
    case DenseType::kI16:
      return 2;
    case DenseType::kI8:
    case DenseType::kU8:
    case DenseType::kBool:
      return 1;
  }
  return 0;
}

absl::string_view DenseTypeName(DenseType type) {
  switch (type) {
    case DenseType::kF32: return "float32";
    case DenseType::kF16: return "float16";
    case DenseType::kBF16: return "bfloat16";
    case DenseType::kF64: return "float64";
    case DenseType::kI8: return "int8";
    case DenseType::kU8: return "uint8";
    case DenseType::kI16: return "int16";
    case DenseType::kI32: return "int32";
    case DenseType::kI64: return "int64";
    case DenseType::kBool: return "bool";
  }
  return "invalid";
}

absl::string_view DenseOpName(DenseOp op) {
  switch (op) {
    case DenseOp::kSum: return "sum";
    case DenseOp::kAvg: return "avg";
    case DenseOp::kProduct: return "product";
    case DenseOp::kMin: return "min";
    case DenseOp::kMax: return "max";
    case DenseOp::kBand: return "band";
    case DenseOp::kBor: return "bor";
    case DenseOp::kBxor: return "bxor";
  }
  return "invalid";
}

bool IsFloatingDense(DenseType type) {
  return type == DenseType::kF32 || type == DenseType::kF16 || type == DenseType::kBF16 ||
         type == DenseType::kF64;
}

absl::Status CheckDenseOp(DenseType type, DenseOp op) {
  if (DenseTypeSize(type) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dense type ", static_cast<int>(type)));
  }
  if (DenseOpName(op) == "invalid") {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduction ", static_cast<int>(op)));
  }
  const bool bitwise = op == DenseOp::kBand || op == DenseOp::kBor || op == DenseOp::kBxor;
  if (bitwise && IsFloatingDense(type)) {
    return absl::InvalidArgumentError(absl::StrCat("reduction ", DenseOpName(op),
                                                   " does not apply to ", DenseTypeName(type)));
  }
  if (op == DenseOp::kAvg && !IsFloatingDense(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduction avg needs a floating type, not ", DenseTypeName(type)));
  }
  return absl::OkStatus();
}

void DenseCombine(void* dst, const void* src, size_t count, DenseType type, DenseOp op) {
  switch (type) {
    case DenseType::kF32: return CombineAll<float>(dst, src, count, op);
    case DenseType::kF64: return CombineAll<double>(dst, src, count, op);
    case DenseType::kF16: return CombineHalf<F16ToF32, F32ToF16>(dst, src, count, op);
    case DenseType::kBF16: return CombineHalf<Bf16ToF32, F32ToBf16>(dst, src, count, op);
    case DenseType::kI8: return CombineAll<int8_t>(dst, src, count, op);
    case DenseType::kU8: return CombineAll<uint8_t>(dst, src, count, op);
    case DenseType::kI16: return CombineAll<int16_t>(dst, src, count, op);
    case DenseType::kI32: return CombineAll<int32_t>(dst, src, count, op);
    case DenseType::kI64: return CombineAll<int64_t>(dst, src, count, op);
    case DenseType::kBool: return CombineBool(dst, src, count, op);
  }
}

void DenseFinish(void* data, size_t count, DenseType type, DenseOp op, int n) {
  if (op != DenseOp::kAvg || n == 1) return;
  switch (type) {
    case DenseType::kF32: {
      float* d = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) d[i] /= static_cast<float>(n);
      return;
    }
    case DenseType::kF64: {
      double* d = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) d[i] /= n;
      return;
    }
    case DenseType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) / n);
      return;
    }
    case DenseType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) / n);
      return;
    }
    default:
      LBCC_CHECK(false) << "DenseFinish: avg on a non-floating type";
  }
}

namespace {
// An all-gather as an all-to-all: this rank's `bytes` to every rank, rank i's into row i.
AllToAllLayout AllGatherLayout(int n, size_t bytes) {
  AllToAllLayout layout;
  for (int i = 0; i < n; ++i) {
    layout.send_offsets.push_back(0);
    layout.send_bytes.push_back(bytes);
    layout.recv_offsets.push_back(static_cast<size_t>(i) * bytes);
    layout.recv_bytes.push_back(bytes);
  }
  return layout;
}
}  // namespace

absl::Status DenseAllReduceDirect(const Group& group, Tag tag, const void* in, void* out,
                                  size_t count, DenseType type, DenseOp op, Priority priority,
                                  absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckDenseOp(type, op));
  const size_t bytes = count * DenseTypeSize(type);
  const int n = group.size();
  if (n == 1) {
    if (in != out) std::memmove(out, in, bytes);
    return absl::OkStatus();
  }
  std::vector<uint8_t> rows(static_cast<size_t>(n) * bytes);
  LBCC_RETURN_IF_ERROR(DenseAllToAllDirect(group, tag, in, rows.data(), AllGatherLayout(n, bytes),
                                           priority, deadline));
  std::memcpy(out, rows.data(), bytes);
  for (int i = 1; i < n; ++i) {
    DenseCombine(out, rows.data() + static_cast<size_t>(i) * bytes, count, type, op);
  }
  DenseFinish(out, count, type, op, n);
  return absl::OkStatus();
}

static_assert(kDenseDirectAllReduceBytes <= kMaxHeaderData,
              "the direct all-reduce carries its data with the operation header");

absl::Status DenseAllReduceDirectWithHeader(const Group& group, Tag tag, uint64_t sequence,
                                            const Signature& signature, const void* in,
                                            void* out, size_t count, DenseType type, DenseOp op,
                                            absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckDenseOp(type, op));
  const size_t bytes = count * DenseTypeSize(type);
  std::vector<std::string> storage;
  std::vector<absl::Span<const uint8_t>> rows;
  LBCC_RETURN_IF_ERROR(ExchangeWithHeader(group, tag, sequence, signature, ConstSpan(in, bytes),
                                          &storage, &rows, deadline));
  // Every row is a copy (this rank's own too), so `in` may alias `out`.
  if (bytes > 0) std::memcpy(out, rows[0].data(), bytes);
  for (size_t i = 1; i < rows.size(); ++i) DenseCombine(out, rows[i].data(), count, type, op);
  DenseFinish(out, count, type, op, group.size());
  return absl::OkStatus();
}

absl::Status DenseAllReduceRing(const Group& group, Tag tag, const void* in, void* out,
                                size_t count, DenseType type, DenseOp op, Priority priority,
                                absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckDenseOp(type, op));
  const size_t element = DenseTypeSize(type);
  if (in != out) std::memmove(out, in, count * element);
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = count * static_cast<size_t>(c) / n * element;
  return RingPass(group, static_cast<uint8_t*>(out), offsets, element,
                  DenseRing(group, tag, type, op, /*all_gather=*/true), priority, deadline);
}

absl::Status DenseReduceScatterRing(const Group& group, Tag tag, const void* in, void* out,
                                    size_t count, DenseType type, DenseOp op, Priority priority,
                                    absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckDenseOp(type, op));
  const size_t element = DenseTypeSize(type);
  const int n = group.size();
  std::vector<uint8_t> work(static_cast<const uint8_t*>(in),
                            static_cast<const uint8_t*>(in) + n * count * element);
  auto begin = [&](int c) { return count * static_cast<size_t>(c); };
  LBCC_RETURN_IF_ERROR(
      RingReduceScatterInPlace(group, tag, work.data(), begin, type, op, priority, deadline));
  uint8_t* mine = work.data() + begin(group.me) * element;
  DenseFinish(mine, count, type, op, n);
  std::memcpy(out, mine, count * element);
  return absl::OkStatus();
}

absl::Status DenseReduceRing(const Group& group, Tag tag, const void* in, void* out,
                             size_t count, DenseType type, DenseOp op, int root,
                             Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckDenseOp(type, op));
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Reduce"));
  const size_t element = DenseTypeSize(type);
  const int n = group.size();
  std::vector<uint8_t> work(static_cast<const uint8_t*>(in),
                            static_cast<const uint8_t*>(in) + count * element);
  auto begin = [&](int c) { return count * static_cast<size_t>(c) / n; };
  if (n > 1) {
    LBCC_RETURN_IF_ERROR(
        RingReduceScatterInPlace(group, tag, work.data(), begin, type, op, priority, deadline));
  }
  DenseFinish(work.data() + begin(group.me) * element, begin(group.me + 1) - begin(group.me),
              type, op, n);
  // Every rank's reduced chunk goes to the root.
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    for (int c = 0; c < n; ++c) {
      if (c == root) continue;
      batch.Recv(group.ranks[c], tag + n,
                 Span(work.data() + begin(c) * element, (begin(c + 1) - begin(c)) * element));
    }
  } else {
    batch.Send(group.ranks[root], tag + n,
               ConstSpan(work.data() + begin(group.me) * element,
                         (begin(group.me + 1) - begin(group.me)) * element),
               priority);
  }
  LBCC_RETURN_IF_ERROR(batch.Wait());
  if (group.me == root) std::memcpy(out, work.data(), count * element);
  return absl::OkStatus();
}

absl::Status DenseAllToAllDirect(const Group& group, Tag tag, const void* in, void* out,
                                 const AllToAllLayout& layout, Priority priority,
                                 absl::Time deadline) {
  const size_t n = group.size();
  if (layout.send_offsets.size() != n || layout.send_bytes.size() != n ||
      layout.recv_offsets.size() != n || layout.recv_bytes.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAll: the layout must have ", n, " entries per list"));
  }
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* dst = static_cast<uint8_t*>(out);
  const int me = group.me;
  if (layout.send_bytes[me] != layout.recv_bytes[me]) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAll: sends ", layout.send_bytes[me], " bytes to itself but expects ",
                     layout.recv_bytes[me]));
  }
  std::memmove(dst + layout.recv_offsets[me], src + layout.send_offsets[me],
               layout.send_bytes[me]);
  Batch batch(group.fabric, deadline);
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) == me) continue;
    batch.Send(group.ranks[i], tag, ConstSpan(src + layout.send_offsets[i], layout.send_bytes[i]),
               priority);
    batch.Recv(group.ranks[i], tag, Span(dst + layout.recv_offsets[i], layout.recv_bytes[i]));
  }
  return batch.Wait();
}

absl::Status DenseGatherDirect(const Group& group, Tag tag, const void* in, void* out,
                               size_t bytes, int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Gather"));
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    uint8_t* dst = static_cast<uint8_t*>(out);
    std::memmove(dst + root * bytes, in, bytes);
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Recv(group.ranks[i], tag, Span(dst + i * bytes, bytes));
    }
  } else {
    batch.Send(group.ranks[root], tag, ConstSpan(in, bytes), priority);
  }
  return batch.Wait();
}

absl::Status DenseScatterDirect(const Group& group, Tag tag, const void* in, void* out,
                                size_t bytes, int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Scatter"));
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    const uint8_t* src = static_cast<const uint8_t*>(in);
    std::memmove(out, src + root * bytes, bytes);
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Send(group.ranks[i], tag, ConstSpan(src + i * bytes, bytes), priority);
    }
  } else {
    batch.Recv(group.ranks[root], tag, Span(out, bytes));
  }
  return batch.Wait();
}

absl::Status VerifyFingerprints(const Group& group, Tag tag, const std::string& fingerprint,
                                absl::Time deadline) {
  std::vector<std::string> all;
  LBCC_RETURN_IF_ERROR(AllGatherV(group, tag, fingerprint, &all, Algorithm::kDirect,
                                  Priority::kHigh, deadline, 4096));
  for (int i = 1; i < group.size(); ++i) {
    if (all[i] != all[0]) {
      return absl::InvalidArgumentError(absl::StrCat("ranks disagree on the collective: rank 0 posted ",
                                                     all[0], ", rank ", i, " posted ", all[i]));
    }
  }
  return absl::OkStatus();
}

// DenseRecvAny's matching. A transport receive names its peer and cannot be withdrawn, so an
// any-source receive posts one receive ("slot", into a buffer of its own) on every peer that has
// no unclaimed slot for the tag yet, and takes the first slot to complete. Slots it did not take
// stay: each peer's slots are in that peer's message order, later DenseRecvAny calls take the
// first unclaimed completed one (earliest completion first), and a DenseRecv from that peer
// claims the peer's first unclaimed slot instead of posting its own receive (so messages are
// never taken out of order). Completions run on the transport's callback thread; the Link never
// calls back into this class with its own lock held except through the allocator, which touches
// only its slot.
class AnySourceReceives : public std::enable_shared_from_this<AnySourceReceives> {
 public:
  struct Receiver {
    void* data = nullptr;
    size_t bytes = 0;
    int* source = nullptr;  // DenseRecvAny's; null for DenseRecv
    RequestPtr request;
    std::shared_ptr<const AbortRecord> abort;  // a failure reads as the caller's abort, if first
  };

  // DenseRecvAny: completes `receiver` from a completed slot, or queues it and posts the slots.
  void Any(Fabric* fabric, const std::vector<int>& ranks, int me, Tag wire_tag, uint32_t tag,
           Receiver receiver) {
    MutexLock lock(&mu_);
    TagState& state = tags_[tag];
    state.waiting.push_back(std::move(receiver));
    DrainLocked(state);
    if (state.waiting.empty()) return;
    for (int peer = 0; peer < static_cast<int>(ranks.size()); ++peer) {
      if (peer == me) continue;
      std::deque<std::shared_ptr<Slot>>& slots = state.by_peer[peer];
      const bool unclaimed = std::any_of(slots.begin(), slots.end(), [](const auto& slot) {
        return !slot->claimed.has_value();
      });
      if (unclaimed) continue;
      auto slot = std::make_shared<Slot>();
      slot->peer = peer;
      slots.push_back(slot);
      // Posted under mu_ so that slots are posted in each peer's deque order; the transport
      // never completes a receive inside Recv (transport.h).
      fabric->in(ranks[peer])->Recv(
          wire_tag,
          [slot](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
            slot->bytes.resize(size);
            return absl::Span<uint8_t>(slot->bytes.data(), size);
          },
          [self = shared_from_this(), slot, tag](absl::StatusOr<size_t> n) {
            self->Completed(slot, tag, n.status());
          });
    }
  }

  // DenseRecv: true when `peer` has a slot for `tag` not yet claimed; the first such slot then
  // delivers to this receive (now, or when it completes).
  bool TakeFromPeer(void* data, size_t bytes, int peer, uint32_t tag, RequestPtr request,
                    std::shared_ptr<const AbortRecord> abort) {
    MutexLock lock(&mu_);
    auto t = tags_.find(tag);
    if (t == tags_.end()) return false;
    auto p = t->second.by_peer.find(peer);
    if (p == t->second.by_peer.end()) return false;
    for (const std::shared_ptr<Slot>& slot : p->second) {
      if (slot->claimed.has_value()) continue;
      slot->claimed = Receiver{data, bytes, nullptr, std::move(request), std::move(abort)};
      DrainLocked(t->second);
      return true;
    }
    return false;
  }

 private:
  struct Slot {
    int peer = 0;
    std::vector<uint8_t> bytes;         // written by the allocator and the transport only
    bool done = false;
    absl::Status status;
    uint64_t order = 0;                 // completion order, for any-source fairness
    std::optional<Receiver> claimed;    // a DenseRecv that takes this slot
  };
  struct TagState {
    std::map<int, std::deque<std::shared_ptr<Slot>>> by_peer;  // in each peer's message order
    std::deque<Receiver> waiting;                               // DenseRecvAny, in call order
  };

  void Completed(const std::shared_ptr<Slot>& slot, uint32_t tag, absl::Status status) {
    MutexLock lock(&mu_);
    slot->done = true;
    slot->status = std::move(status);
    slot->order = ++completions_;
    DrainLocked(tags_[tag]);
  }

  static void Deliver(Slot& slot, Receiver& receiver) {
    absl::Status status = slot.status;
    if (status.ok() && slot.bytes.size() != receiver.bytes) {
      status = absl::DataLossError(absl::StrCat("DenseRecv: rank ", slot.peer, " sent ",
                                                slot.bytes.size(), " bytes, the buffer holds ",
                                                receiver.bytes));
    } else if (status.ok()) {
      if (receiver.bytes > 0) std::memcpy(receiver.data, slot.bytes.data(), receiver.bytes);
      if (receiver.source != nullptr) *receiver.source = slot.peer;
    } else {
      if (receiver.abort != nullptr) status = receiver.abort->Explain(std::move(status));
      status = Annotate(status, receiver.source != nullptr ? "DenseRecvAny" : "DenseRecv");
    }
    receiver.request->Complete(std::move(status));
  }

  void DrainLocked(TagState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Claimed slots deliver to their DenseRecv once complete.
    for (auto& [peer, slots] : state.by_peer) {
      for (auto it = slots.begin(); it != slots.end();) {
        if ((*it)->done && (*it)->claimed.has_value()) {
          Deliver(**it, *(*it)->claimed);
          it = slots.erase(it);
        } else {
          ++it;
        }
      }
    }
    // Waiting any-source receives take each peer's first unclaimed slot, earliest completion
    // first (claimed slots always precede unclaimed ones in a peer's deque).
    while (!state.waiting.empty()) {
      std::deque<std::shared_ptr<Slot>>* best = nullptr;
      std::deque<std::shared_ptr<Slot>>::iterator best_it;
      for (auto& [peer, slots] : state.by_peer) {
        auto it = std::find_if(slots.begin(), slots.end(),
                               [](const auto& slot) { return !slot->claimed.has_value(); });
        if (it == slots.end() || !(*it)->done) continue;
        if (best == nullptr || (*it)->order < (*best_it)->order) {
          best = &slots;
          best_it = it;
        }
      }
      if (best == nullptr) return;
      Deliver(**best_it, state.waiting.front());
      state.waiting.pop_front();
      best->erase(best_it);
    }
  }

  Mutex mu_;
  std::map<uint32_t, TagState> tags_ ABSL_GUARDED_BY(mu_);
  uint64_t completions_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<AnySourceReceives> NewAnySourceReceives() {
  return std::make_shared<AnySourceReceives>();
}

// Communicator methods (declared in communicator.h's dense block). Each checks what it can
// before posting, then runs the group-level function above on the worker thread; with
// options.verify, a fingerprint exchange comes first (tag steps 0..1; the op uses 0x100 up).
namespace {

constexpr uint32_t kVerifiedStepBase = 0x100;

// The signature checked on every rank before the operation runs (comm/signature.h).
Signature DenseSignature(const Communicator& comm, absl::string_view name, size_t count,
                         DenseType type, DenseOp op, int root) {
  Signature signature = comm.NewSignature(name);
  signature.Add("dtype", DenseTypeName(type))
      .Add("count", static_cast<int64_t>(count))
      .Add("reduce op", DenseOpName(op))
      .Add("root", root);
  return signature;
}

Signature BytesSignature(const Communicator& comm, absl::string_view name, size_t bytes,
                         int root) {
  Signature signature = comm.NewSignature(name);
  signature.Add("bytes", static_cast<int64_t>(bytes)).Add("root", root);
  return signature;
}

std::string Fingerprint(absl::string_view name, size_t count, DenseType type, DenseOp op,
                        int root) {
  return absl::StrCat(name, "(count=", count, ", dtype=", DenseTypeName(type),
                      ", op=", DenseOpName(op), ", root=", root, ")");
}

}  // namespace

namespace {
// Wraps a group-level function with the optional fingerprint check.
Communicator::Op Verified(bool verify, std::string fingerprint,
                          std::function<absl::Status(const Group&, Tag, absl::Time)> run) {
  return [verify, fingerprint = std::move(fingerprint), run = std::move(run)](
             const Group& group, Tag tag, absl::Time deadline) -> absl::Status {
    if (!verify || group.size() == 1) return run(group, tag, deadline);
    LBCC_RETURN_IF_ERROR(VerifyFingerprints(group, tag, fingerprint, deadline));
    return run(group, tag + kVerifiedStepBase, deadline);
  };
}

absl::Status CheckPointers(absl::string_view name, const void* in, const void* out,
                           size_t bytes) {
  if (bytes > 0 && (in == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": null buffer for ", bytes, " bytes"));
  }
  return absl::OkStatus();
}
}  // namespace

RequestPtr Communicator::DenseAllReduce(const void* in, void* out, size_t count, DenseType type,
                                        DenseOp op, DenseOptions options) {
  absl::Status check = CheckDenseOp(type, op);
  if (check.ok()) check = CheckPointers("DenseAllReduce", in, out, count);
  if (!check.ok()) return PostRejected("DenseAllReduce", check);
  // The selection table (or the configured or requested algorithm) chooses, as for AllReduce.
  const size_t bytes = count * DenseTypeSize(type);
  absl::StatusOr<Algorithm> chosen =
      ChooseAlgorithm(Collective::kAllReduce, group_, bytes, options.algorithm);
  if (!chosen.ok()) return PostRejected("DenseAllReduce", chosen.status());
  const bool direct = *chosen == Algorithm::kDirect;
  Signature signature = DenseSignature(*this, "DenseAllReduce", count, type, op, -1);
  signature.Add("algorithm", AlgorithmName(*chosen));
  if (direct && !options.verify && bytes <= kMaxHeaderData) {
    // One round, the operation header in it.
    return PostWithHeader(std::move(signature),
                          [=](const Group& g, Tag tag, uint64_t sequence,
                              const Signature& signature, absl::Time deadline) {
                            return DenseAllReduceDirectWithHeader(g, tag, sequence, signature, in,
                                                                  out, count, type, op,
                                                                  deadline);
                          },
                          options.timeout);
  }
  return Post(std::move(signature),
              Verified(options.verify, Fingerprint("allreduce", count, type, op, -1),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         if (direct) {
                           return DenseAllReduceDirect(g, tag, in, out, count, type, op,
                                                       options.priority, deadline);
                         }
                         return DenseAllReduceRing(g, tag, in, out, count, type, op,
                                                   options.priority, deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseReduce(const void* in, void* out, size_t count, DenseType type,
                                     DenseOp op, int root, DenseOptions options) {
  absl::Status check = CheckDenseOp(type, op);
  if (check.ok()) check = CheckRoot(root, nranks(), "DenseReduce");
  if (check.ok()) check = CheckPointers("DenseReduce", in, rank() == root ? out : in, count);
  if (!check.ok()) return PostRejected("DenseReduce", check);
  return Post(DenseSignature(*this, "DenseReduce", count, type, op, root),
              Verified(options.verify, Fingerprint("reduce", count, type, op, root),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return DenseReduceRing(g, tag, in, out, count, type, op, root,
                                                options.priority, deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseReduceScatter(const void* in, void* out, size_t count,
                                            DenseType type, DenseOp op, DenseOptions options) {
  absl::Status check = CheckDenseOp(type, op);
  if (check.ok()) check = CheckPointers("DenseReduceScatter", in, out, count);
  if (!check.ok()) return PostRejected("DenseReduceScatter", check);
  return Post(DenseSignature(*this, "DenseReduceScatter", count, type, op, -1),
              Verified(options.verify, Fingerprint("reduce_scatter", count, type, op, -1),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return DenseReduceScatterRing(g, tag, in, out, count, type, op,
                                                       options.priority, deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseAllToAll(const void* in, void* out, AllToAllLayout layout,
                                       DenseOptions options) {
  auto shared = std::make_shared<AllToAllLayout>(std::move(layout));
  // Ranks may send different sizes to different peers, so the fingerprint holds only the name.
  return Post(NewSignature("DenseAllToAll"),
              Verified(options.verify, "alltoall",
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return DenseAllToAllDirect(g, tag, in, out, *shared, options.priority,
                                                    deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseAllGather(const void* in, void* out, size_t bytes,
                                        DenseOptions options) {
  absl::Status check = CheckPointers("DenseAllGather", in, out, bytes);
  if (!check.ok()) return PostRejected("DenseAllGather", check);
  auto shared = std::make_shared<AllToAllLayout>(AllGatherLayout(nranks(), bytes));
  return Post(BytesSignature(*this, "DenseAllGather", bytes, -1),
              Verified(options.verify, absl::StrCat("allgather(bytes=", bytes, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return DenseAllToAllDirect(g, tag, in, out, *shared, options.priority,
                                                    deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseGather(const void* in, void* out, size_t bytes, int root,
                                     DenseOptions options) {
  absl::Status check = CheckRoot(root, nranks(), "DenseGather");
  if (check.ok()) check = CheckPointers("DenseGather", in, rank() == root ? out : in, bytes);
  if (!check.ok()) return PostRejected("DenseGather", check);
  return Post(BytesSignature(*this, "DenseGather", bytes, root),
              Verified(options.verify, absl::StrCat("gather(bytes=", bytes, ", root=", root, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return DenseGatherDirect(g, tag, in, out, bytes, root, options.priority,
                                                  deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseScatter(const void* in, void* out, size_t bytes, int root,
                                      DenseOptions options) {
  absl::Status check = CheckRoot(root, nranks(), "DenseScatter");
  if (check.ok()) check = CheckPointers("DenseScatter", rank() == root ? in : out, out, bytes);
  if (!check.ok()) return PostRejected("DenseScatter", check);
  return Post(BytesSignature(*this, "DenseScatter", bytes, root),
              Verified(options.verify, absl::StrCat("scatter(bytes=", bytes, ", root=", root, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return DenseScatterDirect(g, tag, in, out, bytes, root,
                                                   options.priority, deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseBroadcast(void* buffer, size_t bytes, int root,
                                        DenseOptions options) {
  absl::Status check = CheckRoot(root, nranks(), "DenseBroadcast");
  if (check.ok()) check = CheckPointers("DenseBroadcast", buffer, buffer, bytes);
  if (!check.ok()) return PostRejected("DenseBroadcast", check);
  return Post(BytesSignature(*this, "DenseBroadcast", bytes, root),
              Verified(options.verify,
                       absl::StrCat("broadcast(bytes=", bytes, ", root=", root, ")"),
                       [=](const Group& g, Tag tag, absl::Time deadline) {
                         return comm::Broadcast(g, tag, buffer, bytes, root, options.priority,
                                                deadline);
                       }),
              options.timeout);
}

RequestPtr Communicator::DenseSend(const void* data, size_t bytes, int peer, uint32_t tag) {
  if (peer < 0 || peer >= nranks() || peer == rank() || (bytes > 0 && data == nullptr)) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("DenseSend: bad peer ", peer, " or null buffer (rank ", rank(), " of ",
                     nranks(), ")")));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("DenseSend: the communicator failed earlier: ", status.ToString())));
  }
  auto request = std::make_shared<Request>();
  fabric_->out(group_.ranks[peer])
      ->Send(MakeTag(comm_id_, tag, kDenseP2pStep), ConstSpan(data, bytes),
             {transport::Priority::kNormal},
             [request, abort = fabric_->abort_record()](absl::Status status) {
               status = abort->Explain(std::move(status));
               if (!status.ok()) status = Annotate(status, "DenseSend");
               request->Complete(std::move(status));
             });
  return request;
}

RequestPtr Communicator::DenseRecv(void* data, size_t bytes, int peer, uint32_t tag) {
  if (peer < 0 || peer >= nranks() || peer == rank() || (bytes > 0 && data == nullptr)) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("DenseRecv: bad peer ", peer, " or null buffer (rank ", rank(), " of ",
                     nranks(), ")")));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("DenseRecv: the communicator failed earlier: ", status.ToString())));
  }
  auto request = std::make_shared<Request>();
  // A DenseRecvAny may have posted receives on this peer for this tag first: they come first.
  if (any_source_->TakeFromPeer(data, bytes, peer, tag, request, fabric_->abort_record())) {
    return request;
  }
  fabric_->in(group_.ranks[peer])
      ->Recv(
          MakeTag(comm_id_, tag, kDenseP2pStep),
          [data, bytes](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
            if (size != bytes) {
              return absl::DataLossError(absl::StrCat("DenseRecv: the peer sent ", size,
                                                      " bytes, the buffer holds ", bytes));
            }
            return Span(data, bytes);
          },
          [request, abort = fabric_->abort_record()](absl::StatusOr<size_t> n) {
            absl::Status status = abort->Explain(n.status());
            if (!status.ok()) status = Annotate(status, "DenseRecv");
            request->Complete(std::move(status));
          });
  return request;
}

RequestPtr Communicator::DenseRecvAny(void* data, size_t bytes, uint32_t tag, int* source) {
  if ((bytes > 0 && data == nullptr) || source == nullptr) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("DenseRecvAny: null buffer or source (rank ", rank(), " of ", nranks(), ")")));
  }
  if (nranks() == 1) {
    return CompletedRequest(absl::InvalidArgumentError(
        "DenseRecvAny: a communicator of one rank has no peer to receive from"));
  }
  absl::Status status = fabric_->aborted();
  if (!status.ok()) {
    return CompletedRequest(absl::FailedPreconditionError(
        absl::StrCat("DenseRecvAny: the communicator failed earlier: ", status.ToString())));
  }
  auto request = std::make_shared<Request>();
  any_source_->Any(fabric_.get(), group_.ranks, group_.me, MakeTag(comm_id_, tag, kDenseP2pStep),
                   tag,
                   AnySourceReceives::Receiver{data, bytes, source, request,
                                               fabric_->abort_record()});
  return request;
}

}  // namespace lbcc::comm
