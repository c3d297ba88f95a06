// The transport's wire constants: numbers two ends of a link must agree on, in one place so that
// a file that needs only a number (lane.h's ChunkHeader, the UCX backend) depends on nothing
// else. The layouts they go with live beside their code: ChunkHeader in lane.h, ControlHeader and
// the Ctl message types in link_setup.h. Never renumber; bump kWireVersion on any change of a
// layout or meaning.
//
// Thread-safety: constants.
#ifndef LBCC_TRANSPORT_WIRE_CONSTANTS_H_
#define LBCC_TRANSPORT_WIRE_CONSTANTS_H_

#include <cstdint>

namespace lbcc::transport {

// The wire format's version, in every ControlHeader and ChunkHeader. 2: integrity-only chunks
// carry a ChaCha20-Poly1305 tag (1: GMAC). A peer of another version is refused at its HELLO /
// WELCOME, before any chunk of it is read.
inline constexpr uint16_t kWireVersion = 2;

// The UCX backend's active-message ids (ucx_lanes.cc): data chunks, whose header is a ChunkHeader,
// and control messages, whose header is a ControlHeader.
inline constexpr unsigned kUcxAmControl = 7;
inline constexpr unsigned kUcxAmData = 8;

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_WIRE_CONSTANTS_H_
