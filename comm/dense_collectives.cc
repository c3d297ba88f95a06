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
#include "comm/signature.h"

namespace lbcc::comm {
namespace {

using dense_internal::AllGatherLayout;
using dense_internal::CheckRoot;
using dense_internal::ConstSpan;
using dense_internal::Span;
using transport::Priority;
using transport::Tag;

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

}  // namespace

namespace dense_internal {
absl::Status CheckRoot(int root, int n, absl::string_view what) {
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " out of range [0, ", n, ")"));
  }
  return absl::OkStatus();
}
}  // namespace dense_internal

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

namespace dense_internal {
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
}  // namespace dense_internal

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

}  // namespace lbcc::comm
