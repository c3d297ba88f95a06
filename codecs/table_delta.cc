// Table deltas (see table_delta.h). Untrusted bytes are validated in one pass that reads no
// table memory, and written in a second pass over the same bytes, so a rejected message
// writes nothing and nothing is allocated on the receive path.
#include "codecs/table_delta.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codecs/byte_io.h"

namespace lbcc::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "table deltas assume little-endian");

constexpr size_t kEncodingOffset = 12;
constexpr size_t kElementsOffset = 16;
constexpr size_t kChangedOffset = 24;
constexpr size_t kMaxLebBytes = 10;  // 64 bits / 7, rounded up

using byte_io::Load;
using byte_io::Store;

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

size_t LebBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutLeb(uint64_t v, uint8_t* p) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

absl::Status Corrupt(absl::string_view why) {
  return absl::DataLossError(absl::StrCat("table delta: ", why));
}

// A message that passed every check: where its sections start.
struct Parsed {
  TableDeltaInfo info;
  const uint8_t* positions = nullptr;
  const uint8_t* values = nullptr;
};

// Reads one minimal LEB128 value from [*p, end); false when it is truncated, overlong or does
// not fit 64 bits.
bool ReadLeb(const uint8_t** p, const uint8_t* end, uint64_t* value) {
  uint64_t v = 0;
  for (size_t i = 0; i < kMaxLebBytes; ++i) {
    if (*p == end) return false;
    const uint8_t b = *(*p)++;
    if (i == kMaxLebBytes - 1 && b > 1) return false;  // beyond bit 63
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      if (i > 0 && b == 0) return false;  // overlong: a trailing zero group
      *value = v;
      return true;
    }
  }
  return false;
}

// Calls f(j, position) for the j-th changed element, in ascending position order. Only for a
// message Parse() accepted.
template <typename F>
void ForEachPosition(const Parsed& parsed, F f) {
  const uint64_t m = parsed.info.changed;
  const uint8_t* p = parsed.positions;
  if (parsed.info.encoding == TableDeltaEncoding::kGaps) {
    uint64_t next = 0;
    for (uint64_t j = 0; j < m; ++j) {
      uint64_t gap = 0;
      ReadLeb(&p, parsed.values, &gap);
      f(j, next + gap);
      next += gap + 1;
    }
    return;
  }
  uint64_t j = 0;
  const size_t bytes = parsed.info.position_bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    for (uint64_t w = Load<uint64_t>(p + i); w != 0; w &= w - 1) {
      f(j++, i * 8 + static_cast<uint64_t>(__builtin_ctzll(w)));
    }
  }
  for (; i < bytes; ++i) {
    for (unsigned w = p[i]; w != 0; w &= w - 1) {
      f(j++, i * 8 + static_cast<uint64_t>(__builtin_ctz(w)));
    }
  }
}

absl::StatusOr<Parsed> Parse(absl::Span<const uint8_t> bytes) {
  const size_t size = bytes.size();
  const uint8_t* data = bytes.data();
  if (size >= sizeof(kTableDeltaMagic) &&
      std::memcmp(data, kTableDeltaMagic, sizeof(kTableDeltaMagic)) != 0) {
    return Corrupt("not a table delta (bad magic)");
  }
  if (size < kTableDeltaHeaderBytes + kTableDeltaChecksumBytes) {
    return Corrupt(absl::StrCat("truncated: ", size, " bytes, a header and checksum take ",
                                kTableDeltaHeaderBytes + kTableDeltaChecksumBytes));
  }
  const uint32_t version = Load<uint32_t>(data + sizeof(kTableDeltaMagic));
  if (version != kTableDeltaVersion) {
    return Corrupt(absl::StrCat("unknown format version ", version, " (this build reads ",
                                kTableDeltaVersion, ")"));
  }
  const size_t body_end = size - kTableDeltaChecksumBytes;
  const uint64_t sum = XXH3_64bits(data, body_end);
  if (Load<uint64_t>(data + body_end) != sum) return Corrupt("checksum mismatch");
  const uint8_t encoding = data[kEncodingOffset];
  if (encoding > static_cast<uint8_t>(TableDeltaEncoding::kGaps)) {
    return Corrupt(absl::StrCat("unknown position encoding ", encoding));
  }
  if (data[kEncodingOffset + 1] != 0 || data[kEncodingOffset + 2] != 0 ||
      data[kEncodingOffset + 3] != 0) {
    return Corrupt("reserved header bytes are not zero");
  }
  Parsed parsed;
  TableDeltaInfo& info = parsed.info;
  info.encoding = static_cast<TableDeltaEncoding>(encoding);
  info.elements = Load<uint64_t>(data + kElementsOffset);
  info.changed = Load<uint64_t>(data + kChangedOffset);
  info.total_bytes = size;
  const uint64_t n = info.elements, m = info.changed;
  if (m > n) return Corrupt(absl::StrCat(m, " changed elements of ", n));
  const size_t body = body_end - kTableDeltaHeaderBytes;
  if (m > body / sizeof(float)) {
    return Corrupt(absl::StrCat("truncated: ", m, " values do not fit in ", body, " bytes"));
  }
  const size_t position_bytes = body - static_cast<size_t>(m) * sizeof(float);
  parsed.positions = data + kTableDeltaHeaderBytes;
  parsed.values = parsed.positions + position_bytes;
  info.position_bytes = position_bytes;
  if (info.encoding == TableDeltaEncoding::kBitmap) {
    const uint64_t want = n / 8 + (n % 8 != 0 ? 1 : 0);
    if (position_bytes != want) {
      return Corrupt(absl::StrCat(position_bytes < want ? "truncated" : "trailing bytes", ": ",
                                  position_bytes, " bytes of positions and values left for a ",
                                  want, "-byte bitmap"));
    }
    uint64_t set = 0;
    const uint8_t* p = parsed.positions;
    size_t i = 0;
    for (; i + 8 <= position_bytes; i += 8) set += __builtin_popcountll(Load<uint64_t>(p + i));
    for (; i < position_bytes; ++i) set += __builtin_popcount(p[i]);
    if (n % 8 != 0 && (p[position_bytes - 1] >> (n % 8)) != 0) {
      return Corrupt(absl::StrCat("bitmap bits set beyond element ", n));
    }
    if (set != m) return Corrupt(absl::StrCat("bitmap holds ", set, " positions, header ", m));
    return parsed;
  }
  const uint8_t* p = parsed.positions;
  const uint8_t* end = parsed.values;
  uint64_t next = 0;  // the smallest position the next one may take
  for (uint64_t j = 0; j < m; ++j) {
    uint64_t gap = 0;
    if (!ReadLeb(&p, end, &gap)) {
      return Corrupt(absl::StrCat("position ", j, " is truncated or not minimal LEB128"));
    }
    if (next >= n || gap > n - 1 - next) {
      return Corrupt(absl::StrCat("position ", j, " lies beyond ", n, " elements"));
    }
    next += gap + 1;
  }
  if (p != end) {
    return Corrupt(absl::StrCat("trailing bytes: ", end - p, " after ", m, " positions"));
  }
  return parsed;
}

}  // namespace

absl::string_view TableDeltaEncodingName(TableDeltaEncoding encoding) {
  switch (encoding) {
    case TableDeltaEncoding::kBitmap:
      return "bitmap";
    case TableDeltaEncoding::kGaps:
      return "gaps";
  }
  return "unknown";
}

absl::StatusOr<std::vector<uint8_t>> EncodeTableDelta(absl::Span<const float> before,
                                                      absl::Span<const float> after) {
  if (before.size() != after.size()) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeTableDelta: before holds ",
                                                   before.size(), " elements, after ",
                                                   after.size()));
  }
  const uint64_t n = after.size();
  uint64_t m = 0;
  size_t gap_bytes = 0;
  uint64_t next = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (Bits(before[i]) == Bits(after[i])) continue;
    gap_bytes += LebBytes(i - next);
    next = i + 1;
    ++m;
  }
  const size_t bitmap_bytes = static_cast<size_t>(n / 8 + (n % 8 != 0 ? 1 : 0));
  const TableDeltaEncoding encoding =
      gap_bytes < bitmap_bytes ? TableDeltaEncoding::kGaps : TableDeltaEncoding::kBitmap;
  const size_t position_bytes = encoding == TableDeltaEncoding::kGaps ? gap_bytes : bitmap_bytes;
  std::vector<uint8_t> out(kTableDeltaHeaderBytes + position_bytes + m * sizeof(float) +
                           kTableDeltaChecksumBytes);
  uint8_t* data = out.data();
  std::memcpy(data, kTableDeltaMagic, sizeof(kTableDeltaMagic));
  Store<uint32_t>(data + sizeof(kTableDeltaMagic), kTableDeltaVersion);
  data[kEncodingOffset] = static_cast<uint8_t>(encoding);
  Store<uint64_t>(data + kElementsOffset, n);
  Store<uint64_t>(data + kChangedOffset, m);
  uint8_t* positions = data + kTableDeltaHeaderBytes;
  uint8_t* value = positions + position_bytes;
  uint8_t* gap = positions;
  next = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t bits = Bits(after[i]);
    if (Bits(before[i]) == bits) continue;
    if (encoding == TableDeltaEncoding::kGaps) {
      gap = PutLeb(i - next, gap);
      next = i + 1;
    } else {
      positions[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
    Store<uint32_t>(value, bits);
    value += sizeof(float);
  }
  const size_t body_end = out.size() - kTableDeltaChecksumBytes;
  Store<uint64_t>(data + body_end, XXH3_64bits(data, body_end));
  return out;
}

absl::Status ApplyTableDelta(absl::Span<const uint8_t> bytes, absl::Span<float> table) {
  absl::StatusOr<Parsed> parsed = Parse(bytes);
  if (!parsed.ok()) return parsed.status();
  if (parsed->info.elements != table.size()) {
    return absl::InvalidArgumentError(absl::StrCat("table delta of ", parsed->info.elements,
                                                   " elements for a table of ", table.size()));
  }
  const uint8_t* values = parsed->values;
  float* out = table.data();
  ForEachPosition(*parsed, [&](uint64_t j, uint64_t position) {
    std::memcpy(out + position, values + j * sizeof(float), sizeof(float));
  });
  return absl::OkStatus();
}

absl::StatusOr<TableDeltaInfo> InspectTableDelta(absl::Span<const uint8_t> bytes) {
  absl::StatusOr<Parsed> parsed = Parse(bytes);
  if (!parsed.ok()) return parsed.status();
  return parsed->info;
}

}  // namespace lbcc::codecs
