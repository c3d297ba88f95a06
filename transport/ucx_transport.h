// The UCX backend: Endpoints over UCP active messages (Debian's UCX 1.13.1).
//
// One Transport is one UCP context and worker, pinned to the devices and transports in
// TransportOptions (ucx_tls, ucx_net_devices; UCX's own UCX_* variables otherwise) with one
// rendezvous rail, so a fast and a slow device are never striped in one UCP endpoint. Listen()
// opens a sockaddr listener (port 0 picks a free one; the returned address names the real port);
// Connect() opens UCP endpoints to it in peer error-handling mode, so a lost peer fails pending
// work with Unavailable instead of hanging.
//
// Set-up of a link is the set-up every backend runs (transport/link_setup.h); this backend carries
// its messages as control active messages on connection 0: HELLO/WELCOME (refused connections
// are retried until the timeout), the class (ConnectOptions, then either side's link rules or
// LBCC_LINK_CLASS, slow wins, else the timed probe over this connection), LBCC_SLOW_STRIPES - 1
// more connections for a slow link, then READY. Running links exchange heartbeats (PeerWatch).
//
// Data chunks travel as active messages whose header is a ChunkHeader; UCX picks eager or
// rendezvous per size. A rendezvous chunk's bytes stay at the sender until the receiver has
// matched the message to a Recv and knows where they go.
//
// Threading: every UCP call happens under one worker mutex, taken by the Transport's progress
// thread (which sleeps on the worker's event fd when idle) or, opportunistically, by a calling
// thread after it queued work (progress in calling paths). Completion callbacks run on the
// Transport's callback thread.
#ifndef LBCC_TRANSPORT_UCX_TRANSPORT_H_
#define LBCC_TRANSPORT_UCX_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace lbcc::transport {

// Errors: FailedPrecondition when UCX could not be loaded (UcxAvailable), Unavailable when UCX
// cannot start (no usable transport or device), InvalidArgument for a UCX setting it rejects.
absl::StatusOr<std::unique_ptr<Transport>> NewUcxTransport(const TransportOptions& options);

// OK when this process could load UCX (transport/ucx_api.h), else FailedPrecondition naming the
// loader's error: a property of the machine, the same for every transport the process creates.
absl::Status UcxAvailable();

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_UCX_TRANSPORT_H_
