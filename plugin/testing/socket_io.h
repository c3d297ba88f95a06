// Blocking whole-buffer reads and writes on a socket, for the harness, the GPU test and the
// benchmark, which exchange listen handles and barrier bytes between their two processes.
#ifndef LBCC_PLUGIN_TESTING_SOCKET_IO_H_
#define LBCC_PLUGIN_TESTING_SOCKET_IO_H_

#include <cstddef>

namespace lbcc::plugin::testing {

// Writes / reads exactly `size` bytes, retrying short transfers and EINTR. False when the peer
// is gone or the socket failed (errno tells which).
bool WriteFully(int fd, const void* data, size_t size);
bool ReadFully(int fd, void* data, size_t size);

}  // namespace lbcc::plugin::testing

#endif  // LBCC_PLUGIN_TESTING_SOCKET_IO_H_
