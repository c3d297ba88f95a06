// Drives UCX's async services (libucs) through the sequence that aborts UCX 1.13.1 when a
// process opens and closes UCX workers under churn (tools/ucx/async-stale-missed-event.patch):
//   1. context A's handler of an fd gets an event while A is blocked: A queues a missed event
//      under the handler's id, the fd number;
//   2. that handler is removed and its fd closed; a new fd gets the same number and a handler
//      in context B;
//   3. A polls its missed events: the queued id now names B's handler.
// 1.13.1 aborts in step 3 (async.c: Assertion `handler->async == async' failed); with LBCC's
// patch the stale event is dropped and neither handler runs. Which libucs runs is the dynamic
// linker's choice (transport/ucx_async_test sets LD_LIBRARY_PATH); the probe prints its path.
//
// Exit status: 0 when the stale event was dropped, 1 when a handler ran, 2 when the sequence
// could not be set up.
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "ucs/async/async.h"

namespace {

std::atomic<int> g_calls_a{0};
std::atomic<int> g_calls_b{0};

void OnEvent(int /*id*/, ucs_event_set_types_t /*events*/, void* arg) {
  static_cast<std::atomic<int>*>(arg)->fetch_add(1);
}

int Fail(const char* what, ucs_status_t status) {
  std::fprintf(stderr, "ucx_async_probe: %s: %s\n", what, ucs_status_string(status));
  return 2;
}

}  // namespace

int main() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ucs_async_context_create), &info) != 0 &&
      info.dli_fname != nullptr) {
    std::printf("libucs: %s\n", info.dli_fname);
  }
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
                                       &g_calls_a, a);
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
                   g_calls_a.load());
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
                                       &g_calls_b, b);
  if (status != UCS_OK) return Fail("B's handler", status);

  // Step 3 (what a worker's progress does after unblocking).
  UCS_ASYNC_UNBLOCK(a);
  ucs_async_check_miss(a);
  std::printf("A's handler ran %d times, B's %d times, from A's missed events\n",
              g_calls_a.load(), g_calls_b.load());

  ucs_async_remove_handler(second[0], /*sync=*/1);
  close(second[0]);
  close(second[1]);
  ucs_async_context_destroy(b);
  ucs_async_context_destroy(a);
  return g_calls_a.load() == 0 && g_calls_b.load() == 0 ? 0 : 1;
}
