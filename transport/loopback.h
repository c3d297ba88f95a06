// The loopback backend: Transports in one process connected through memory, for tests of
// everything above the transport (comm's collectives run ranks as threads over it).
//
// Addresses are names: Listen("rank0") registers "rank0" process-wide; Connect("rank0") from any
// loopback Transport reaches it. Links are set up by the set-up every backend runs
// (transport/link_setup.h), its messages handed over in memory: ConnectOptions, else either
// end's link rule or TransportOptions::link_class (slow wins), else fast (memory has nothing to
// probe). Rules see a name as host[:port] ("10.0.0.3:5000" -> host 10.0.0.3, port 5000); the
// server sees the client by the host of the client's own listen name, port unknown, like a UCX
// server sees a connecting host (a client that does not listen matches only "*"). Slow links run
// the real scheduler (chunks, priorities, credits, pacing, stripes) over in-memory lanes. Chunks
// of 64 KiB and more are delivered as deferred payloads, like UCX rendezvous, so the receiver
// fetches their bytes from the sender's buffer after matching.
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
