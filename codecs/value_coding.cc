#include "codecs/value_coding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/dtype.h"
#include "codecs/cpu_kernels.h"
#include "codecs/rounding.h"

namespace lbcc::codecs {
namespace {

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt topk_ef payload: value section: ", what));
}

template <typename T>
T LoadLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void StoreLe(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

int BinMeanBits(ValueCoding coding) {
  switch (coding) {
    case ValueCoding::kBinMean2:
      return 2;
    case ValueCoding::kBinMean4:
      return 4;
    case ValueCoding::kBinMean8:
      return 8;
    default:
      return 0;
  }
}

int AbsmaxBits(ValueCoding coding) { return coding == ValueCoding::kAbsmax8 ? 8 : 4; }

size_t PackedBytes(int64_t count, int bits) { return static_cast<size_t>((count * bits + 7) / 8); }

// Sum in double over 4 lanes (lane i % 4), combined as (l0 + l1) + (l2 + l3).
template <typename F>
double LaneSum(int64_t n, F term) {
  double lanes[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    lanes[0] += term(i);
    lanes[1] += term(i + 1);
    lanes[2] += term(i + 2);
    lanes[3] += term(i + 3);
  }
  for (int lane = 0; i < n; ++i, ++lane) lanes[lane] += term(i);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// Packs codes of `bits` (2, 4 or 8) low bits first.
void PackCodes(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  if (n == 0) return;
  if (bits == 8) {
    std::memcpy(out, codes, static_cast<size_t>(n));
    return;
  }
  const int per_byte = 8 / bits;
  const int64_t full = n / per_byte;
  if (bits == 2) {
    for (int64_t i = 0; i < full; ++i) {
      const uint8_t* c = codes + 4 * i;
      out[i] = static_cast<uint8_t>(c[0] | (c[1] << 2) | (c[2] << 4) | (c[3] << 6));
    }
  } else {
    for (int64_t i = 0; i < full; ++i) {
      out[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
    }
  }
  if (full * per_byte < n) {
    uint8_t last = 0;
    for (int64_t i = full * per_byte, s = 0; i < n; ++i, s += bits) last |= codes[i] << s;
    out[full] = last;
  }
}

void EncodeBinMean(ValueCoding coding, const ValueEncodeOptions& options, absl::Span<float> values,
                   absl::Span<uint8_t> params, absl::Span<uint8_t> section,
                   absl::Span<float> centered, absl::Span<uint8_t> codes) {
  const int bits = BinMeanBits(coding);
  BinMeanResult q = BinMeanQuantize(values, bits, options.range_sigmas, centered, codes);
  StoreLe<float>(params.data(), q.shift);
  for (int b = 0; b < q.bins; ++b) StoreLe<float>(params.data() + 4 + 4 * b, q.lookup[b]);
  PackCodes(codes.data(), static_cast<int64_t>(values.size()), bits, section.data());
  float table[256];
  for (int b = 0; b < q.bins; ++b) table[b] = q.lookup[b] + q.shift;
  for (size_t i = 0; i < values.size(); ++i) values[i] = table[codes[i]];
}

void EncodeAbsmax(ValueCoding coding, const ValueEncodeOptions& options, absl::Span<float> values,
                  absl::Span<uint8_t> params, absl::Span<uint8_t> section) {
  const int bits = AbsmaxBits(coding);
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  const int64_t n = static_cast<int64_t>(values.size());
  const int64_t block = options.block;
  const int64_t blocks = (n + block - 1) / block;
  StoreLe<uint32_t>(params.data(), static_cast<uint32_t>(block));
  uint8_t* scales = section.data();
  uint8_t* codes = section.data() + 4 * blocks;
  if (n == 0) return;
  std::memset(codes, 0, PackedBytes(n, bits));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float absmax = 0;
    for (int64_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(values[i]));
    const float scale = std::min(absmax / qmax, bits == 8 ? kMaxScale8 : kMaxScale4);
    StoreLe<float>(scales + 4 * b, scale);
    for (int64_t i = begin; i < end; ++i) {
      float q = 0;
      if (scale != 0.0f) q = std::min(std::max(RoundHalfEvenF(values[i] / scale), -qmax), qmax);
      const int qi = static_cast<int>(q);
      if (bits == 8) {
        codes[i] = static_cast<uint8_t>(static_cast<int8_t>(qi));
      } else {
        codes[i >> 1] |= static_cast<uint8_t>((qi & 0xF) << ((i & 1) * 4));
      }
      values[i] = q * scale;
    }
  }
}

}  // namespace

absl::string_view ValueCodingName(ValueCoding coding) {
  switch (coding) {
    case ValueCoding::kF32:
      return "fp32";
    case ValueCoding::kBf16:
      return "bf16";
    case ValueCoding::kF16:
      return "fp16";
    case ValueCoding::kBinMean2:
      return "binmean2";
    case ValueCoding::kBinMean4:
      return "binmean4";
    case ValueCoding::kBinMean8:
      return "binmean8";
    case ValueCoding::kAbsmax8:
      return "absmax8";
    case ValueCoding::kAbsmax4:
      return "absmax4";
  }
  return "unknown";
}

absl::StatusOr<ValueCoding> ParseValueCoding(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (uint8_t v = 1; v <= 8; ++v) {
    const ValueCoding coding = static_cast<ValueCoding>(v);
    if (lower == ValueCodingName(coding)) return coding;
  }
  if (lower == "2bit") return ValueCoding::kBinMean2;
  if (lower == "f32" || lower == "float32") return ValueCoding::kF32;
  if (lower == "f16" || lower == "float16") return ValueCoding::kF16;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown value coding '", name,
      "' (expected fp32, bf16, fp16, binmean2 (= 2bit), binmean4, binmean8, absmax8, absmax4)"));
}

bool IsValidValueCoding(uint8_t value) { return value >= 1 && value <= 8; }

bool IsBinMean(ValueCoding coding) { return BinMeanBits(coding) != 0; }

bool IsAbsmax(ValueCoding coding) {
  return coding == ValueCoding::kAbsmax8 || coding == ValueCoding::kAbsmax4;
}

int ValueCodeBits(ValueCoding coding) {
  switch (coding) {
    case ValueCoding::kF32:
      return 32;
    case ValueCoding::kBf16:
    case ValueCoding::kF16:
      return 16;
    case ValueCoding::kAbsmax8:
      return 8;
    case ValueCoding::kAbsmax4:
      return 4;
    default:
      return BinMeanBits(coding);
  }
}

size_t ValueParamBytes(ValueCoding coding) {
  if (IsBinMean(coding)) return 4 + 4 * (size_t{1} << BinMeanBits(coding));
  if (IsAbsmax(coding)) return 4;
  return 0;
}

size_t ValueSectionBytes(ValueCoding coding, int64_t count, int64_t block) {
  if (IsAbsmax(coding)) {
    const int64_t blocks = block > 0 ? (count + block - 1) / block : 0;
    return static_cast<size_t>(4 * blocks) + PackedBytes(count, AbsmaxBits(coding));
  }
  return PackedBytes(count, ValueCodeBits(coding));
}

BinMeanResult BinMeanQuantize(absl::Span<const float> values, int bits, float range_sigmas,
                              absl::Span<float> centered, absl::Span<uint8_t> codes) {
  LBCC_CHECK(bits == 2 || bits == 4 || bits == 8);
  LBCC_CHECK_GE(codes.size(), values.size());
  BinMeanResult r;
  r.bins = 1 << bits;
  const int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return r;
  const float* v = values.data();
  r.shift = static_cast<float>(LaneSum(n, [v](int64_t i) { return double{v[i]}; }) /
                               static_cast<double>(n));
  const float offset = static_cast<float>(r.bins / 2);
  const float max_code = static_cast<float>(r.bins - 1);
  LBCC_CHECK_GE(centered.size(), values.size());
  float* c = centered.data();
  for (int64_t i = 0; i < n; ++i) c[i] = v[i] - r.shift;
  const double sq = LaneSum(n, [c](int64_t i) { return double{c[i]} * double{c[i]}; });
  const float norm = static_cast<float>(std::sqrt(sq));
  const float sigma =
      n > 1 ? norm / static_cast<float>(std::sqrt(static_cast<double>(n - 1))) : 0.0f;
  float scale = (range_sigmas * sigma) / static_cast<float>(r.bins);
  if (!(scale != 0.0f) || !std::isfinite(scale)) scale = 1.0f;
  r.scale = scale;
  ActiveKernels().binmean_codes(c, n, scale, offset, max_code, codes.data());
  double sums[256] = {};
  int64_t counts[256] = {};
  for (int64_t i = 0; i < n; ++i) {
    sums[codes[i]] += c[i];
    ++counts[codes[i]];
  }
  for (int b = 0; b < r.bins; ++b) {
    r.lookup[b] =
        counts[b] > 0 ? static_cast<float>(sums[b] / static_cast<double>(counts[b])) : 0.0f;
  }
  return r;
}

void EncodeValues(ValueCoding coding, const ValueEncodeOptions& options, absl::Span<float> values,
                  absl::Span<uint8_t> params, absl::Span<uint8_t> section,
                  absl::Span<float> centered, absl::Span<uint8_t> codes) {
  const int64_t n = static_cast<int64_t>(values.size());
  LBCC_CHECK_EQ(params.size(), ValueParamBytes(coding));
  LBCC_CHECK_EQ(section.size(), ValueSectionBytes(coding, n, options.block));
  switch (coding) {
    case ValueCoding::kF32:
      if (n > 0) std::memcpy(section.data(), values.data(), 4 * static_cast<size_t>(n));
      return;
    case ValueCoding::kBf16:
    case ValueCoding::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t code;
        values[i] = coding == ValueCoding::kBf16 ? SaturateBf16(values[i], &code)
                                                 : SaturateF16(values[i], &code);
        StoreLe<uint16_t>(section.data() + 2 * i, code);
      }
      return;
    case ValueCoding::kBinMean2:
    case ValueCoding::kBinMean4:
    case ValueCoding::kBinMean8:
      EncodeBinMean(coding, options, values, params, section, centered, codes);
      return;
    case ValueCoding::kAbsmax8:
    case ValueCoding::kAbsmax4:
      EncodeAbsmax(coding, options, values, params, section);
      return;
  }
  LBCC_CHECK(false) << "unknown value coding";
}

absl::Status ValueDecoder::Init(ValueCoding coding, absl::Span<const uint8_t> params,
                                absl::Span<const uint8_t> section, int64_t count) {
  coding_ = coding;
  count_ = count;
  block_ = 0;
  if (params.size() != ValueParamBytes(coding)) {
    return Corrupt(absl::StrCat(ValueCodingName(coding), " parameters have ", params.size(),
                                " bytes, expected ", ValueParamBytes(coding)));
  }
  if (IsAbsmax(coding)) {
    block_ = LoadLe<uint32_t>(params.data());
    if (block_ < 1) return Corrupt("absmax block of 0 values");
  }
  const size_t expected = ValueSectionBytes(coding, count, block_);
  if (section.size() != expected) {
    return Corrupt(absl::StrCat(ValueCodingName(coding), " section has ", section.size(),
                                " bytes, ", count, " values need ", expected));
  }
  codes_ = section.data();
  switch (coding) {
    case ValueCoding::kF32:
      for (int64_t i = 0; i < count; ++i) {
        if ((LoadLe<uint32_t>(codes_ + 4 * i) & kAbsMask) > kMaxFiniteAbsBits) {
          return Corrupt(absl::StrCat("value ", i, " is not finite"));
        }
      }
      return absl::OkStatus();
    case ValueCoding::kBf16:
    case ValueCoding::kF16: {
      const uint16_t exp_mask = coding == ValueCoding::kBf16 ? 0x7F80 : 0x7C00;
      for (int64_t i = 0; i < count; ++i) {
        if ((LoadLe<uint16_t>(codes_ + 2 * i) & exp_mask) == exp_mask) {
          return Corrupt(absl::StrCat("value ", i, " is not finite"));
        }
      }
      return absl::OkStatus();
    }
    case ValueCoding::kBinMean2:
    case ValueCoding::kBinMean4:
    case ValueCoding::kBinMean8: {
      const int bits = BinMeanBits(coding);
      const float shift = LoadLe<float>(params.data());
      if (!std::isfinite(shift)) return Corrupt("bin-mean shift is not finite");
      for (int b = 0; b < (1 << bits); ++b) {
        const float lookup = LoadLe<float>(params.data() + 4 + 4 * b);
        table_[b] = lookup + shift;
        if (!std::isfinite(lookup) || !std::isfinite(table_[b])) {
          return Corrupt(absl::StrCat("bin-mean lookup[", b, "] is not finite"));
        }
      }
      if (bits == 2) {
        // quad_[byte] = the values of its four codes, as two halves of two codes each.
        float pair[16][2];
        for (int x = 0; x < 16; ++x) {
          pair[x][0] = table_[x & 3];
          pair[x][1] = table_[x >> 2];
        }
        for (int byte = 0; byte < 256; ++byte) {
          std::memcpy(&quad_[byte][0], pair[byte & 15], sizeof(pair[0]));
          std::memcpy(&quad_[byte][2], pair[byte >> 4], sizeof(pair[0]));
        }
      }
      const int64_t used_bits = (count * bits) % 8;
      if (used_bits != 0 && (section[section.size() - 1] >> used_bits) != 0) {
        return Corrupt("non-zero padding after the last code");
      }
      return absl::OkStatus();
    }
    case ValueCoding::kAbsmax8:
    case ValueCoding::kAbsmax4: {
      const int64_t blocks = (count + block_ - 1) / block_;
      scales_ = section.data();
      codes_ = section.data() + 4 * blocks;
      for (int64_t b = 0; b < blocks; ++b) {
        const float scale = LoadLe<float>(scales_ + 4 * b);
        const float cap = coding == ValueCoding::kAbsmax8 ? kMaxScale8 : kMaxScale4;
        if (!(scale >= 0.0f && scale <= cap)) {
          return Corrupt(absl::StrCat("absmax scale ", b, " is negative, too large or not finite"));
        }
      }
      if (coding == ValueCoding::kAbsmax4 && count % 2 == 1 &&
          (section[section.size() - 1] & 0xF0) != 0) {
        return Corrupt("non-zero padding after the last code");
      }
      return absl::OkStatus();
    }
  }
  return Corrupt("unknown value coding");
}

void ValueDecoder::Decode(int64_t first, int64_t n, float* out) const {
  LBCC_DCHECK(first >= 0 && first + n <= count_);
  switch (coding_) {
    case ValueCoding::kF32:
      if (n > 0) std::memcpy(out, codes_ + 4 * first, 4 * static_cast<size_t>(n));
      return;
    case ValueCoding::kBf16:
      for (int64_t i = 0; i < n; ++i)
        out[i] = Bf16ToF32(LoadLe<uint16_t>(codes_ + 2 * (first + i)));
      return;
    case ValueCoding::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(LoadLe<uint16_t>(codes_ + 2 * (first + i)));
      return;
    case ValueCoding::kBinMean2: {
      int64_t i = 0, t = first;
      for (; i < n && (t & 3) != 0; ++i, ++t)
        out[i] = table_[(codes_[t >> 2] >> ((t & 3) * 2)) & 3];
      for (; i + 4 <= n; i += 4, t += 4) std::memcpy(out + i, quad_[codes_[t >> 2]].data(), 16);
      for (; i < n; ++i, ++t) out[i] = table_[(codes_[t >> 2] >> ((t & 3) * 2)) & 3];
      return;
    }
    case ValueCoding::kBinMean4:
      for (int64_t i = 0, t = first; i < n; ++i, ++t) {
        out[i] = table_[(codes_[t >> 1] >> ((t & 1) * 4)) & 15];
      }
      return;
    case ValueCoding::kBinMean8:
      for (int64_t i = 0; i < n; ++i) out[i] = table_[codes_[first + i]];
      return;
    case ValueCoding::kAbsmax8:
      for (int64_t i = 0, t = first; i < n; ++i, ++t) {
        const float scale = LoadLe<float>(scales_ + 4 * (t / block_));
        const int q = std::max<int>(static_cast<int8_t>(codes_[t]), -127);
        out[i] = static_cast<float>(q) * scale;
      }
      return;
    case ValueCoding::kAbsmax4:
      for (int64_t i = 0, t = first; i < n; ++i, ++t) {
        const float scale = LoadLe<float>(scales_ + 4 * (t / block_));
        int q = (codes_[t >> 1] >> ((t & 1) * 4)) & 0xF;
        q = std::max(q >= 8 ? q - 16 : q, -7);
        out[i] = static_cast<float>(q) * scale;
      }
      return;
  }
}

}  // namespace lbcc::codecs
