// Drives UCX through the sequences that tools/ucx/'s patches fix, on whichever UCX the dynamic
// linker gives it (transport/ucx_async_test sets LD_LIBRARY_PATH); prints that libucs's path.
//
// ucx_async_probe missed-event (tools/ucx/async-stale-missed-event.patch): UCX 1.13.1 aborts a
// process that opens and closes UCX workers under churn:
//   1. context A's handler of an fd gets an event while A is blocked: A queues a missed event
//      under the handler's id, the fd number;
//   2. that handler is removed and its fd closed; a new fd gets the same number and a handler
//      in context B;
//   3. A polls its missed events: the queued id now names B's handler.
// 1.13.1 aborts in step 3 (async.c: Assertion `handler->async == async' failed); with the patch
// the stale event is dropped and neither handler runs. `missed-event-same`: the new handler is
// A's own; 1.13.1 hands it the old fd's event, the patch drops it.
//
// ucx_async_probe listener (tools/ucx/tcp-listener-closes-pending-connections.patch): a client
// connects to a UCP listener and sends nothing; once UCX has accepted the connection, the
// listener is destroyed. 1.13.1 keeps the accepted connection open, and would call the destroyed
// listener back when the client's request arrives; with the patch it is closed with the
// listener.
//
// Exit status: 0 when the patched behaviour is seen, 1 when the unpatched one is, 2 when the
// sequence could not be set up.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ucp/api/ucp.h"
#include "ucs/async/async.h"

namespace {

std::atomic<int> g_calls_old{0};  // The removed handler's.
std::atomic<int> g_calls_new{0};  // The handler registered on the reused fd number.

void OnEvent(int /*id*/, ucs_event_set_types_t /*events*/, void* arg) {
  static_cast<std::atomic<int>*>(arg)->fetch_add(1);
}

int Fail(const char* what, ucs_status_t status) {
  std::fprintf(stderr, "ucx_async_probe: %s: %s\n", what, ucs_status_string(status));
  return 2;
}

int MissedEvent(bool same_context) {
  constexpr ucs_async_mode_t kMode = UCS_ASYNC_MODE_THREAD_SPINLOCK;
  ucs_async_context_t* a = nullptr;
  ucs_async_context_t* b = nullptr;
  ucs_status_t status = ucs_async_context_create(kMode, &a);
  if (status != UCS_OK) return Fail("context A", status);
  status = ucs_async_context_create(kMode, &b);
  if (status != UCS_OK) return Fail("context B", status);

  // Step 1.
  int first[2];
  if (pipe(first) != 0) return Fail("pipe", UCS_ERR_IO_ERROR);
  status = ucs_async_set_event_handler(kMode, first[0], UCS_EVENT_SET_EVREAD, &OnEvent,
                                       &g_calls_old, a);
  if (status != UCS_OK) return Fail("A's handler", status);
  UCS_ASYNC_BLOCK(a);
  if (write(first[1], "x", 1) != 1) return Fail("write", UCS_ERR_IO_ERROR);
  // The async thread finds A blocked and queues the event on A.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ucs_mpmc_queue_is_empty(&a->missed)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "ucx_async_probe: no missed event was queued on A within 10 s (A's "
                   "handler ran %d times)\n",
                   g_calls_old.load());
      return 2;
    }
    sched_yield();
  }

  // Step 2.
  status = ucs_async_remove_handler(first[0], /*sync=*/1);
  if (status != UCS_OK) return Fail("removing A's handler", status);
  close(first[0]);
  close(first[1]);
  int second[2];
  if (pipe(second) != 0) return Fail("pipe", UCS_ERR_IO_ERROR);
  if (second[0] != first[0]) {
    std::fprintf(stderr, "ucx_async_probe: the new fd is %d, not the closed %d\n", second[0],
                 first[0]);
    return 2;
  }
  status = ucs_async_set_event_handler(kMode, second[0], UCS_EVENT_SET_EVREAD, &OnEvent,
                                       &g_calls_new, same_context ? a : b);
  if (status != UCS_OK) return Fail("the new handler", status);

  // Step 3 (what a worker's progress does after unblocking).
  UCS_ASYNC_UNBLOCK(a);
  ucs_async_check_miss(a);
  std::printf("from A's missed events the removed handler ran %d times, the new one (%s) %d\n",
              g_calls_old.load(), same_context ? "A's" : "B's", g_calls_new.load());

  ucs_async_remove_handler(second[0], /*sync=*/1);
  close(second[0]);
  close(second[1]);
  ucs_async_context_destroy(b);
  ucs_async_context_destroy(a);
  return g_calls_old.load() == 0 && g_calls_new.load() == 0 ? 0 : 1;
}

uint16_t PortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  return 0;
}

// The fd of this process's TCP socket from local port `local` to peer port `peer`, or -1.
int FindSocket(uint16_t local, uint16_t peer) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    if (entry->d_name[0] == '.' || fd == dirfd(dir)) continue;
    sockaddr_storage mine{}, theirs{};
    socklen_t mine_len = sizeof(mine), theirs_len = sizeof(theirs);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_len) != 0) continue;
    if (PortOf(mine) == local && PortOf(theirs) == peer) found = fd;
  }
  closedir(dir);
  return found;
}

void OnConnRequest(ucp_conn_request_h, void*) {}  // Never reached: the client sends nothing.

int Listener() {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  ucs_status_t status = ucp_init(&params, nullptr, &context);
  if (status != UCS_OK) return Fail("ucp_init", status);
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  status = ucp_worker_create(context, &worker_params, &worker);
  if (status != UCS_OK) return Fail("ucp_worker_create", status);

  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ucp_listener_params_t listener_params{};
  listener_params.field_mask =
      UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  listener_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
  listener_params.sockaddr.addrlen = sizeof(address);
  listener_params.conn_handler.cb = &OnConnRequest;
  ucp_listener_h listener = nullptr;
  status = ucp_listener_create(worker, &listener_params, &listener);
  if (status != UCS_OK) return Fail("ucp_listener_create", status);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  status = ucp_listener_query(listener, &attr);
  if (status != UCS_OK) return Fail("ucp_listener_query", status);
  const uint16_t port = PortOf(attr.sockaddr);
  address.sin_port = htons(port);

  // The client: connected, silent.
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0 ||
      connect(client, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return Fail("connect", UCS_ERR_IO_ERROR);
  }
  sockaddr_storage client_address{};
  socklen_t client_length = sizeof(client_address);
  getsockname(client, reinterpret_cast<sockaddr*>(&client_address), &client_length);
  const uint16_t client_port = PortOf(client_address);
  // UCX's async thread accepts it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int accepted;
  while ((accepted = FindSocket(port, client_port)) < 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "ucx_async_probe: UCX did not accept the connection within 10 s\n");
      return 2;
    }
    sched_yield();
  }

  ucp_listener_destroy(listener);
  const bool still_open = FindSocket(port, client_port) >= 0;
  std::printf("the accepted connection is %s after the listener's destruction\n",
              still_open ? "open" : "closed");
  if (!still_open) {
    // Its client sees the end of the connection.
    pollfd p{client, POLLIN, 0};
    char byte;
    if (poll(&p, 1, 10000) != 1 || recv(client, &byte, 1, 0) > 0) {
      std::fprintf(stderr, "ucx_async_probe: the client did not see the connection end\n");
      return 2;
    }
  }
  close(client);
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  return still_open ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);  // Every line out before an abort.
  std::printf("ucx version: %s\n", ucp_get_version_string());
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ucs_async_context_create), &info) != 0 &&
      info.dli_fname != nullptr) {
    std::printf("libucs: %s\n", info.dli_fname);
  }
  const char* mode = argc == 2 ? argv[1] : "";
  if (std::strcmp(mode, "missed-event") == 0) return MissedEvent(/*same_context=*/false);
  if (std::strcmp(mode, "missed-event-same") == 0) return MissedEvent(/*same_context=*/true);
  if (std::strcmp(mode, "listener") == 0) return Listener();
  std::fprintf(stderr, "usage: ucx_async_probe missed-event|missed-event-same|listener\n");
  return 2;
}
