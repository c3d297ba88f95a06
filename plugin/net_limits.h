// What the plugin tells NCCL it can do, shared by Net (net.h) and the objects behind it
// (comm_core.h): grouped receives, requests in flight, the largest message, memory types.
#ifndef LBCC_PLUGIN_NET_LIMITS_H_
#define LBCC_PLUGIN_NET_LIMITS_H_

#include <cstddef>

namespace lbcc::plugin {

// Grouped receives per irecv (NCCL's maxRecvs).
inline constexpr int kMaxRecvs = 8;
// Requests in flight per comm (NCCL_NET_MAX_REQUESTS); a send comm takes kMaxRecvs times more,
// since one grouped receive matches that many sends.
inline constexpr int kMaxRequests = 32;
// Largest message (maxP2pBytes / maxCollBytes); test() reports sizes as int.
inline constexpr size_t kMaxMessageBytes = size_t{1} << 30;
// Memory types (NCCL_PTR_*).
inline constexpr int kPtrHost = 0x1;
inline constexpr int kPtrCuda = 0x2;

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_NET_LIMITS_H_
