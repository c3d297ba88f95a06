#include "codecs/codec_registry.h"

#include <atomic>
#include <string>
#include <utility>

#include "base/check.h"

namespace lbcc::codecs {
namespace {

// Indexed by id; written once (compare and swap), then only read. Zero-initialised before any
// static constructor runs, so codecs may register from theirs in any order.
std::atomic<const Codec*> g_codecs[kMaxCodecId + 1];
std::atomic<const DeviceTwin*> g_twins[kMaxCodecId + 1];

}  // namespace

bool RegisterCodec(std::unique_ptr<const Codec> codec) {
  if (codec == nullptr) return false;
  const uint16_t id = static_cast<uint16_t>(codec->id());
  if (!ClaimCodecId(id, codec->name())) return false;
  const Codec* expected = nullptr;
  // Never destroyed: lookups hand out the pointer for the life of the process.
  const Codec* raw = codec.release();
  if (!g_codecs[id].compare_exchange_strong(expected, raw, std::memory_order_acq_rel)) {
    delete raw;  // an object of this codec (same id, same name) is registered already
  }
  return true;
}

const Codec* FindCodec(CodecId id) {
  const uint16_t raw = static_cast<uint16_t>(id);
  return raw <= kMaxCodecId ? g_codecs[raw].load(std::memory_order_acquire) : nullptr;
}

std::vector<CodecId> RegisteredCodecs() {
  std::vector<CodecId> ids;
  for (uint16_t id = 1; id <= kMaxCodecId; ++id) {
    if (g_codecs[id].load(std::memory_order_acquire) != nullptr) {
      ids.push_back(static_cast<CodecId>(id));
    }
  }
  return ids;
}

bool AttachDeviceTwin(CodecId id, const DeviceTwin* twin) {
  const uint16_t raw = static_cast<uint16_t>(id);
  if (twin == nullptr || raw == 0 || raw > kMaxCodecId) return false;
  const DeviceTwin* expected = nullptr;
  return g_twins[raw].compare_exchange_strong(expected, twin, std::memory_order_acq_rel) ||
         expected == twin;
}

const DeviceTwin* FindDeviceTwin(CodecId id) {
  const uint16_t raw = static_cast<uint16_t>(id);
  return raw <= kMaxCodecId ? g_twins[raw].load(std::memory_order_acquire) : nullptr;
}

namespace internal {

bool RegisterCodecOrDie(std::unique_ptr<const Codec> codec) {
  LBCC_CHECK(codec != nullptr) << "LBCC_REGISTER_CODEC without a codec";
  const uint16_t id = static_cast<uint16_t>(codec->id());
  const std::string name(codec->name());
  const bool ok = RegisterCodec(std::move(codec));
  LBCC_CHECK(ok) << "codec '" << name << "' cannot claim payload id " << id << ": it is "
                 << (id == 0 || id > kMaxCodecId ? std::string("outside [1, 1023]")
                                                 : "taken by '" +
                                                       std::string(CodecName(
                                                           static_cast<CodecId>(id))) +
                                                       "'");
  return ok;
}

}  // namespace internal
}  // namespace lbcc::codecs
