// The loopback backend: Transports in one process connected through memory, for tests of
// everything above the transport (comm's collectives run ranks as threads over it).
//
// Addresses are names: Listen("rank0") registers "rank0" process-wide; Connect("rank0") from any
// loopback Transport reaches it. Links are fast unless configured slow (ConnectOptions,
// TransportOptions::link_class or a topology rule for the name); slow links run the real
// scheduler (chunks, priorities, credits, pacing, stripes) over in-memory lanes. Chunks of 64 KiB
// and more are delivered as deferred payloads, like UCX rendezvous, so the receiver fetches their
// bytes from the sender's buffer after matching.
//
// Threading: each Transport owns a callback thread and a delivery thread; see transport.h for the
// contract.
#ifndef LBCC_TRANSPORT_LOOPBACK_H_
#define LBCC_TRANSPORT_LOOPBACK_H_

#include <memory>

#include "transport/options.h"
#include "transport/transport.h"

namespace lbcc::transport {

std::unique_ptr<Transport> NewLoopbackTransport(const TransportOptions& options = {});

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_LOOPBACK_H_
