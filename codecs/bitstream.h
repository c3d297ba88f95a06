// LSB-first bit streams for the variable-length parts of codec bodies (adaptive index coding).
//
// BitWriter fills a buffer whose size the codec computed beforehand (writing past it is an LBCC
// bug and is checked). BitReader reads untrusted bytes: every read reports running out instead
// of reading past the span, and unary runs are bounded by the caller.
// Bit order: the first bit written is bit 0 of byte 0; a value of n bits is written low bit
// first; a unary value q is q one-bits followed by one zero-bit.
//
// Thread-safety: a writer or reader belongs to one thread.
#ifndef LBCC_CODECS_BITSTREAM_H_
#define LBCC_CODECS_BITSTREAM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/types/span.h"
#include "base/check.h"

namespace lbcc::codecs {

class BitWriter {
 public:
  // `out` must outlive the writer.
  explicit BitWriter(absl::Span<uint8_t> out) : out_(out) {}

  // Appends the low `bits` bits of `value` (bits <= 32; higher bits of value must be zero).
  void Put(uint32_t value, int bits) {
    acc_ |= static_cast<uint64_t>(value) << fill_;
    fill_ += bits;
    while (fill_ >= 8) Flush8();
  }
  // q one-bits, then a zero-bit.
  void PutUnary(uint32_t q) {
    while (q >= 24) {
      Put(0xFFFFFFu, 24);
      q -= 24;
    }
    Put((1u << q) - 1u, static_cast<int>(q) + 1);
  }
  // True when `bytes` more bytes fit, plus the up to 4 that PutUnchecked keeps pending and the
  // 4 it stores ahead: then PutUnchecked may write up to 8 * bytes bits.
  bool HasRoom(size_t bytes) const { return out_.size() - pos_ >= bytes + 8; }
  // Put without branches or bounds checks, for hot loops that checked HasRoom: always stores 4
  // bytes and keeps them when 32 bits are full (up to 31 bits stay pending; Put and Finish
  // take them from there).
  void PutUnchecked(uint32_t value, int bits) {
    acc_ |= static_cast<uint64_t>(value) << fill_;
    fill_ += bits;
    const uint32_t word = static_cast<uint32_t>(acc_);  // little-endian, like Flush8's order
    std::memcpy(out_.data() + pos_, &word, 4);
    const int full = fill_ >> 5;  // 0 or 1
    pos_ += 4 * static_cast<size_t>(full);
    acc_ >>= 32 * full;
    fill_ -= 32 * full;
  }
  uint64_t bits_written() const { return static_cast<uint64_t>(pos_) * 8 + fill_; }
  // Bytes that later puts no longer change (PutUnchecked's stores ahead start here).
  size_t bytes_final() const { return pos_; }
  // Writes the bits still pending, the last byte zero-padded; returns the bytes written.
  size_t Finish() {
    while (fill_ > 0) Flush8();
    acc_ = 0;
    fill_ = 0;
    return pos_;
  }

 private:
  void Flush8() {
    LBCC_CHECK_LT(pos_, out_.size()) << "BitWriter overflow";
    out_[pos_++] = static_cast<uint8_t>(acc_);
    acc_ >>= 8;
    fill_ -= 8;
  }
  absl::Span<uint8_t> out_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  // `in` must outlive the reader.
  explicit BitReader(absl::Span<const uint8_t> in) : p_(in.data()), end_(in.data() + in.size()) {}

  // Reads `bits` (<= 32) bits into *value; false when the stream runs out.
  bool Get(int bits, uint32_t* value) {
    if (fill_ < bits) {
      Refill();
      if (fill_ < bits) return false;
    }
    *value = static_cast<uint32_t>(acc_ & ((uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    fill_ -= bits;
    return true;
  }
  // Reads a unary value; false when the stream runs out or the value exceeds `max`.
  bool GetUnary(uint32_t max, uint32_t* q) {
    uint32_t total = 0;
    for (;;) {
      if (fill_ == 0) {
        Refill();
        if (fill_ == 0) return false;
      }
      // Ones at the bottom of the accumulator, counted up to fill_ (bits above fill_ are not
      // part of the stream yet).
      const uint64_t zeros = ~acc_;
      int ones = zeros == 0 ? 64 : __builtin_ctzll(zeros);
      if (ones > fill_) ones = fill_;
      total += static_cast<uint32_t>(ones);
      if (total > max) return false;
      if (ones < fill_) {
        acc_ >>= ones + 1;
        fill_ -= ones + 1;
        *q = total;
        return true;
      }
      acc_ = 0;
      fill_ = 0;
    }
  }
  // True when every byte was consumed and the unread bits of the last byte are zero.
  bool AtCleanEnd() const { return p_ == end_ && fill_ < 8 && (acc_ & Mask(fill_)) == 0; }

 private:
  static uint64_t Mask(int bits) { return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

  // Tops the accumulator up to 56..63 bits. With 8 bytes left it loads a word and advances by
  // the whole bytes that fit; the partial byte it also ORs in above fill_ is the same byte the
  // next refill adds at the same position, so the bits agree.
  void Refill() {
    if (end_ - p_ >= 8) {
      uint64_t word;
      std::memcpy(&word, p_, 8);
      acc_ |= word << fill_;
      p_ += (63 - fill_) >> 3;
      fill_ |= 56;
      return;
    }
    while (fill_ <= 56 && p_ < end_) {
      acc_ |= static_cast<uint64_t>(*p_++) << fill_;
      fill_ += 8;
    }
  }
  const uint8_t* p_;
  const uint8_t* end_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_BITSTREAM_H_
