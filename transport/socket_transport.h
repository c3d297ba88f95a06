// The socket backend: LBCC's links over plain TCP connections, one reactor thread per Transport.
//
// It exists beside UCX for links that UCX cannot make: UCX 1.13's tcp transport connects its
// data lanes to a port the peer's worker listens on, from both ends, so a peer behind NAT or a
// firewall that refuses inbound connections cannot be reached even when it dials out itself
// (docs/nat.md). Here the connection a client dials carries the link in both directions:
// whichever end can dial, dials, and the link is used exactly as a UCX link (the same Link:
// matching, chunking, the slow-link scheduler, credits; the same LinkSetup: HELLO / WELCOME /
// AUTH, the class rule and the probe; PeerWatch heartbeats).
//
// Addresses are "host:port" (IPv4, or IPv6 in brackets); Listen("10.77.0.2:0") picks a port.
// Wire: each connection carries frames of one kind byte and a header, in host byte order like
// ChunkHeader (transport/socket_frame.h): kFrameControl + ControlHeader (64 bytes) + u32 payload length + payload (probe
// bytes), kFrameChunk + ChunkHeader (48 bytes) + the chunk's bytes. A frame that announces more
// than kMaxSocketFrameBytes, or an unknown kind, fails the connection's link with DataLoss (the
// reader: socket_frame.h, fuzzed by socket_frame_fuzz). An
// accepted connection is a stranger until its HELLO is admitted: frames of more than 4 KiB, bad
// bytes or 10 s without a HELLO close it, and nothing else of the transport notices.
//
// Threading: the reactor thread does every socket call after Connect's own dial, runs the lanes'
// `done` callbacks and hands arriving chunks to the Link (whose user callbacks run on the
// Transport's callback executor); see transport.h for the contract.
#ifndef LBCC_TRANSPORT_SOCKET_TRANSPORT_H_
#define LBCC_TRANSPORT_SOCKET_TRANSPORT_H_

#include <cstdint>
#include <memory>

#include "transport/options.h"
#include "transport/transport.h"

namespace lbcc::transport {

std::unique_ptr<Transport> NewSocketTransport(const TransportOptions& options);

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_SOCKET_TRANSPORT_H_
