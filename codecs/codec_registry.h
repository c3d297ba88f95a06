// The codec registry: per payload id, the Codec object that decodes and inspects its payloads,
// and the device twin kernels/ attaches to it.
//
// A codec registers one object from its own .cc with one line (decoding never reads options,
// so the object is built with its defaults):
//
//   LBCC_REGISTER_CODEC(*TopKEfCodec::Create(TopKEfOptions()));
//
// which claims the object's id() under its name() (payload.h ClaimCodecId: ParsePayload then
// accepts the id) and makes it the codec codec.h's free functions dispatch to. A device twin
// (kernels/device_internal.h) attaches to the id with one line of its own. Registration runs
// in static initialisers: a library holding codecs is built with alwayslink, so its objects
// are linked even when nothing references them.
//
// Errors: registering an id that another codec claimed, or one outside [1, kMaxCodecId], is an
// LBCC bug and stops the process at start-up with a message naming both codecs. Registering a
// second object of the same codec (two copies of one library in a process) keeps the first.
//
// Thread-safety: registration and lookups are thread-safe; lookups take no lock. Registered
// objects and twins live until the process ends.
#ifndef LBCC_CODECS_CODEC_REGISTRY_H_
#define LBCC_CODECS_CODEC_REGISTRY_H_

#include <memory>
#include <vector>

#include "codecs/codec.h"
#include "codecs/payload.h"

namespace lbcc::codecs {

// The device side of a codec. codecs/ only stores it; kernels/ defines what it does
// (kernels::DeviceCodec) and is the only package that attaches or reads twins.
class DeviceTwin {
 public:
  virtual ~DeviceTwin() = default;
};

// Registers `codec` for payloads of codec->id(). True when it is (or an object of the same
// codec already was) registered; false, registering nothing, when the id cannot be claimed.
bool RegisterCodec(std::unique_ptr<const Codec> codec);
// The registered codec of `id`; nullptr when no codec of that id is linked in.
const Codec* FindCodec(CodecId id);
// The ids with a registered codec, ascending (for tools and tests).
std::vector<CodecId> RegisteredCodecs();

// Attaches `twin` (never destroyed) to `id`. True when it is attached (or `twin` already was);
// false when another twin is. Independent of the order in which codecs register.
bool AttachDeviceTwin(CodecId id, const DeviceTwin* twin);
// The twin attached to `id`; nullptr when none.
const DeviceTwin* FindDeviceTwin(CodecId id);

namespace internal {
// RegisterCodec, stopping the process when it fails (LBCC_REGISTER_CODEC).
bool RegisterCodecOrDie(std::unique_ptr<const Codec> codec);
}  // namespace internal

}  // namespace lbcc::codecs

#define LBCC_REGISTER_CODEC(codec) LBCC_REGISTER_CODEC_N_(__COUNTER__, codec)
#define LBCC_REGISTER_CODEC_N_(n, codec) LBCC_REGISTER_CODEC_CAT_(n, codec)
#define LBCC_REGISTER_CODEC_CAT_(n, codec)                        \
  [[maybe_unused]] static const bool lbcc_codec_registered_##n = \
      ::lbcc::codecs::internal::RegisterCodecOrDie(codec)

#endif  // LBCC_CODECS_CODEC_REGISTRY_H_
