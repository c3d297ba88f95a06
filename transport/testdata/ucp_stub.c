/* A stand-in for another UCX in the process (HPC-X's, an MPI's): a library with UCX's soname
   (libucp.so.0) that exports the entry points LBCC calls, every one failing, and counts the calls
   it received. transport:ucx_isolation_test loads it into the program's namespace first. */
#include <stddef.h>

#define STUB_ERROR (-22) /* UCS_ERR_UNSUPPORTED */

static int calls;

__attribute__((visibility("default"))) int ucp_stub_calls(void) { return calls; }

#define STATUS_FN(name) \
  __attribute__((visibility("default"))) int name() { ++calls; return STUB_ERROR; }
#define PTR_FN(name) \
  __attribute__((visibility("default"))) void* name() { ++calls; return (void*)(long)STUB_ERROR; }
#define VOID_FN(name) \
  __attribute__((visibility("default"))) void name() { ++calls; }

VOID_FN(ucp_am_data_release)
PTR_FN(ucp_am_recv_data_nbx)
PTR_FN(ucp_am_send_nbx)
VOID_FN(ucp_cleanup)
STATUS_FN(ucp_config_modify)
STATUS_FN(ucp_config_read)
VOID_FN(ucp_config_release)
STATUS_FN(ucp_conn_request_query)
PTR_FN(ucp_ep_close_nbx)
STATUS_FN(ucp_ep_create)
STATUS_FN(ucp_init_version)
STATUS_FN(ucp_listener_create)
VOID_FN(ucp_listener_destroy)
STATUS_FN(ucp_listener_query)
STATUS_FN(ucp_listener_reject)
STATUS_FN(ucp_request_check_status)
VOID_FN(ucp_request_free)
STATUS_FN(ucp_worker_arm)
STATUS_FN(ucp_worker_create)
VOID_FN(ucp_worker_destroy)
STATUS_FN(ucp_worker_get_efd)
__attribute__((visibility("default"))) unsigned ucp_worker_progress() { ++calls; return 0; }
STATUS_FN(ucp_worker_query)
STATUS_FN(ucp_worker_set_am_recv_handler)
__attribute__((visibility("default"))) const char* ucs_status_string(int status) {
  (void)status;
  ++calls;
  return "status from the stub UCX";
}
