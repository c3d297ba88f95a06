// UCX's entry points, called through a table filled from LBCC's own copy of UCX, loaded into a
// link-map namespace of its own (dlmopen(LM_ID_NEWLM)). A process that already has another UCX
// (HPC-X's, an MPI's) keeps it: neither copy's symbols can interpose on the other's, and each
// has its own libucs/libuct/libucm state. The UCX backend's files include this header (through
// transport/ucx_engine.h); the macros at the end route their ucp_*()/ucs_status_string() calls
// through the table, so those files are written against UCX's ordinary API.
//
// Without a loadable libucp.so.0 every entry fails (UCS_ERR_UNSUPPORTED, a null request, a
// ucs_status_string() that names the loader's error), so creating a UCX transport returns an
// error status instead of the process failing to start. Once exit() has run the atexit handlers
// registered after this library was loaded, every entry is such a stand-in too: the dynamic
// linker finalizes UCX's namespace before the objects that use it.
#ifndef LBCC_TRANSPORT_UCX_API_H_
#define LBCC_TRANSPORT_UCX_API_H_

#include <ucp/api/ucp.h>

#include <string>

namespace lbcc::transport::ucx_api {

// Every UCX function LBCC calls (ucp_init is UCX's inline wrapper of ucp_init_version).
#define LBCC_UCX_FUNCTIONS(X)      \
  X(ucp_am_data_release)           \
  X(ucp_am_recv_data_nbx)          \
  X(ucp_am_send_nbx)               \
  X(ucp_cleanup)                   \
  X(ucp_config_modify)             \
  X(ucp_config_read)               \
  X(ucp_config_release)            \
  X(ucp_conn_request_query)        \
  X(ucp_ep_close_nbx)              \
  X(ucp_ep_create)                 \
  X(ucp_init_version)              \
  X(ucp_listener_create)           \
  X(ucp_listener_destroy)          \
  X(ucp_listener_query)            \
  X(ucp_listener_reject)           \
  X(ucp_request_check_status)      \
  X(ucp_request_free)              \
  X(ucp_worker_arm)                \
  X(ucp_worker_create)             \
  X(ucp_worker_destroy)            \
  X(ucp_worker_get_efd)            \
  X(ucp_worker_progress)           \
  X(ucp_worker_query)              \
  X(ucp_worker_set_am_recv_handler) \
  X(ucs_status_string)

struct Api {
#define LBCC_UCX_MEMBER(name) decltype(&::name) name = nullptr;
  LBCC_UCX_FUNCTIONS(LBCC_UCX_MEMBER)
#undef LBCC_UCX_MEMBER
};

// How the table was filled.
struct LoadInfo {
  bool loaded = false;            // The table holds UCX's functions (else the failing stand-ins).
  bool own_namespace = false;     // UCX lives in a link-map namespace other than the program's.
  std::string library;            // The libucp that was loaded (its path).
  std::string error;              // Why not, when !loaded.
};

// The process's table (of this shared object), loaded on first use; thread-safe.
const Api& Get();
const LoadInfo& Info();

}  // namespace lbcc::transport::ucx_api

// Route UCX calls through the table. Function-like macros: UCX's types and constants are
// untouched, and the table's members (named like the functions) are not re-expanded.
#define LBCC_UCX_CALL(name) (::lbcc::transport::ucx_api::Get().name)
#define ucp_am_data_release(...) LBCC_UCX_CALL(ucp_am_data_release)(__VA_ARGS__)
#define ucp_am_recv_data_nbx(...) LBCC_UCX_CALL(ucp_am_recv_data_nbx)(__VA_ARGS__)
#define ucp_am_send_nbx(...) LBCC_UCX_CALL(ucp_am_send_nbx)(__VA_ARGS__)
#define ucp_cleanup(...) LBCC_UCX_CALL(ucp_cleanup)(__VA_ARGS__)
#define ucp_config_modify(...) LBCC_UCX_CALL(ucp_config_modify)(__VA_ARGS__)
#define ucp_config_read(...) LBCC_UCX_CALL(ucp_config_read)(__VA_ARGS__)
#define ucp_config_release(...) LBCC_UCX_CALL(ucp_config_release)(__VA_ARGS__)
#define ucp_conn_request_query(...) LBCC_UCX_CALL(ucp_conn_request_query)(__VA_ARGS__)
#define ucp_ep_close_nbx(...) LBCC_UCX_CALL(ucp_ep_close_nbx)(__VA_ARGS__)
#define ucp_ep_create(...) LBCC_UCX_CALL(ucp_ep_create)(__VA_ARGS__)
#define ucp_init(...) LBCC_UCX_CALL(ucp_init_version)(UCP_API_MAJOR, UCP_API_MINOR, __VA_ARGS__)
#define ucp_listener_create(...) LBCC_UCX_CALL(ucp_listener_create)(__VA_ARGS__)
#define ucp_listener_destroy(...) LBCC_UCX_CALL(ucp_listener_destroy)(__VA_ARGS__)
#define ucp_listener_query(...) LBCC_UCX_CALL(ucp_listener_query)(__VA_ARGS__)
#define ucp_listener_reject(...) LBCC_UCX_CALL(ucp_listener_reject)(__VA_ARGS__)
#define ucp_request_check_status(...) LBCC_UCX_CALL(ucp_request_check_status)(__VA_ARGS__)
#define ucp_request_free(...) LBCC_UCX_CALL(ucp_request_free)(__VA_ARGS__)
#define ucp_worker_arm(...) LBCC_UCX_CALL(ucp_worker_arm)(__VA_ARGS__)
#define ucp_worker_create(...) LBCC_UCX_CALL(ucp_worker_create)(__VA_ARGS__)
#define ucp_worker_destroy(...) LBCC_UCX_CALL(ucp_worker_destroy)(__VA_ARGS__)
#define ucp_worker_get_efd(...) LBCC_UCX_CALL(ucp_worker_get_efd)(__VA_ARGS__)
#define ucp_worker_progress(...) LBCC_UCX_CALL(ucp_worker_progress)(__VA_ARGS__)
#define ucp_worker_query(...) LBCC_UCX_CALL(ucp_worker_query)(__VA_ARGS__)
#define ucp_worker_set_am_recv_handler(...) LBCC_UCX_CALL(ucp_worker_set_am_recv_handler)(__VA_ARGS__)
#define ucs_status_string(...) LBCC_UCX_CALL(ucs_status_string)(__VA_ARGS__)

#endif  // LBCC_TRANSPORT_UCX_API_H_
