// Fixed-width little-endian fields of a wire format, read and written through memcpy (no
// alignment assumed). Shared by the parsers and writers of codecs/ (payload.cc, table_delta.cc).
// LBCC runs on little-endian machines only; the including files static_assert it.
#ifndef LBCC_CODECS_BYTE_IO_H_
#define LBCC_CODECS_BYTE_IO_H_

#include <cstdint>
#include <cstring>

namespace lbcc::codecs::byte_io {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace lbcc::codecs::byte_io

#endif  // LBCC_CODECS_BYTE_IO_H_
