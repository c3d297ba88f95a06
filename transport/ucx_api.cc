#include "transport/ucx_api.h"

#include <dlfcn.h>
#include <link.h>
#include <locale.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/logging.h"
#include "lbcc_ucx/ucx_library.h"

// Sanitizer builds load UCX into the program's namespace (see Load()).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define LBCC_UCX_IN_PROGRAM_NAMESPACE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define LBCC_UCX_IN_PROGRAM_NAMESPACE 1
#endif
#endif

namespace lbcc::transport::ucx_api {
namespace {

// The soname LBCC was built against (UCX 1.x keeps it): the system's UCX.
constexpr char kSystemLibrary[] = "libucp.so.0";

// Which libucp to load: LBCC_UCX_LIBRARY; else the UCX that tools/setup builds with LBCC's
// patches (third_party/ucx.bzl), when it is where the build found it; else the system's, whose
// 1.13.1 aborts under churn (tools/ucx/async-stale-missed-event.patch), with a warning.
std::string ChooseLibrary(std::string* why) {
  absl::StatusOr<std::string> chosen = env::GetString("LBCC_UCX_LIBRARY");
  if (!chosen.ok()) {
    *why = absl::StrCat(chosen.status().message(), "; ");
  } else if (!chosen->empty()) {
    return *chosen;
  }
  if (access(LBCC_UCX_PATCHED_LIBRARY, R_OK) == 0) return LBCC_UCX_PATCHED_LIBRARY;
  absl::StrAppend(why, LBCC_UCX_PATCHED_LIBRARY,
                  " (UCX with LBCC's patches, from tools/setup) is missing; the system's UCX "
                  "1.13 can abort a process that opens and closes transports under churn");
  return kSystemLibrary;
}

// Set by an exit handler that this library registers while it is being loaded, before any
// atexit handler of the program or of LBCC's other libraries (an elastic group's wait for its
// threads, MPI_Finalize): exit() runs them last-registered first, so this one runs after all of
// those, which still reach UCX itself. Registered on UCX's first use instead, it ran before a
// handler registered earlier (the elastic group's wait for the threads that destroy its
// communicators): the transports those threads destroyed then met the stand-ins, their UCX
// workers stayed registered with UCX's async thread, and that thread, still running while
// libucs's destructor freed its handler table, aborted the process (async.c: Assertion
// `handler->id == id'). From exit() the flag is never cleared.
std::atomic<bool> g_exit_handlers_done{false};
[[maybe_unused]] const bool g_exit_handler_registered = [] {
  std::atexit(+[] { g_exit_handlers_done.store(true, std::memory_order_release); });
  return true;
}();

struct State {
  Api api;
  Api after_exit;  // The stand-ins, from exit() on (see Load()).
  bool stand_ins_at_exit = false;  // after_exit replaces api once g_exit_handlers_done is set.
  // The namespace's own C library's uselocale(), called with LC_GLOBAL_LOCALE once per thread
  // (Get()): a thread the program created has that library's per-thread locale and ctype tables
  // unset (UCX's parsers would crash on them); null outside a namespace. A thread created while
  // the namespace was being loaded can even find that library's whole thread-local block never
  // initialized (glibc initializes the blocks of the threads that exist when a library lands
  // and of those created after; one created meanwhile can miss both): its locale pointer is
  // null, which __ctype_init read (SIGSEGV in ucx_api::Get, seen in an elastic member whose
  // two groups set up their first epochs at once). uselocale() sets the pointer itself and the
  // ctype tables from it, so such a thread gets both.
  locale_t (*uselocale)(locale_t) = nullptr;
  LoadInfo info;
  std::string unavailable;  // What the stand-in ucs_status_string() returns.
};

State& Loaded();

// The stand-in for a function when UCX could not be loaded: an error of the function's kind.
template <typename F>
struct StandIn;
template <typename R, typename... A>
struct StandIn<R (*)(A...)> {
  static R Call(A...) {
    if constexpr (std::is_void_v<R>) {
      return;
    } else if constexpr (std::is_same_v<R, ucs_status_t>) {
      return UCS_ERR_UNSUPPORTED;
    } else if constexpr (std::is_same_v<R, ucs_status_ptr_t>) {
      return UCS_STATUS_PTR(UCS_ERR_UNSUPPORTED);
    } else if constexpr (std::is_same_v<R, const char*>) {
      return Loaded().unavailable.c_str();
    } else {
      return R{};
    }
  }
};

void FillStandIns(Api& api) {
#define LBCC_UCX_STAND_IN(name) api.name = &StandIn<decltype(&::name)>::Call;
  LBCC_UCX_FUNCTIONS(LBCC_UCX_STAND_IN)
#undef LBCC_UCX_STAND_IN
}

// Once exit()'s handlers are done, arming succeeds, so a progress thread still running sleeps on its event
// fd instead of spinning until its transport's destructor stops it.
ucs_status_t ArmWhileExiting(ucp_worker_h) { return UCS_OK; }

State* Load() {
  auto* state = new State;  // Lives as long as the process (UCX may call back at exit).
  LoadInfo& info = state->info;
  // RTLD_LOCAL in a fresh namespace: UCX and its dependencies (libucs, libuct, libucm, and the
  // transports it dlopens from there) bind only to each other. The sanitizers' runtimes cannot
  // run the second C library a fresh namespace loads (ThreadSanitizer crashes; under
  // AddressSanitizer the two heaps meet: "free(): invalid pointer"), so a TSan or ASan build
  // loads UCX into the program's namespace, RTLD_LOCAL (ucx_isolation_test is notsan, noasan).
  std::string warning;
  const std::string library = ChooseLibrary(&warning);
  if (!warning.empty()) LBCC_LOG(WARN) << "UCX: " << warning;
#if defined(LBCC_UCX_IN_PROGRAM_NAMESPACE)
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  const char* how = "dlopen(";
#else
  void* handle = dlmopen(LM_ID_NEWLM, library.c_str(), RTLD_NOW | RTLD_LOCAL);
  const char* how = "dlmopen(LM_ID_NEWLM, ";
#endif
  if (handle == nullptr) {
    const char* why = dlerror();
    info.error = absl::StrCat(how, library, "): ", why ? why : "failed");
  } else {
#define LBCC_UCX_RESOLVE(name)                                                   \
  if (info.error.empty()) {                                                      \
    void* symbol = dlsym(handle, #name);                                         \
    if (symbol == nullptr) {                                                     \
      info.error = absl::StrCat(library, " has no ", #name);                    \
    } else {                                                                     \
      state->api.name = reinterpret_cast<decltype(&::name)>(symbol);             \
    }                                                                            \
  }
    LBCC_UCX_FUNCTIONS(LBCC_UCX_RESOLVE)
#undef LBCC_UCX_RESOLVE
    Lmid_t namespace_id = LM_ID_BASE;
    if (dlinfo(handle, RTLD_DI_LMID, &namespace_id) == 0) {
      info.own_namespace = namespace_id != LM_ID_BASE;
    }
    if (info.own_namespace && info.error.empty()) {
      void* libc = dlmopen(namespace_id, "libc.so.6", RTLD_NOW | RTLD_NOLOAD);
      void* uselocale = libc != nullptr ? dlsym(libc, "uselocale") : nullptr;
      if (uselocale == nullptr) {
        info.error = "the C library of UCX's namespace has no uselocale";
      } else {
        state->uselocale = reinterpret_cast<locale_t (*)(locale_t)>(uselocale);
      }
    }
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
      info.library = map->l_name;
    }
  }
  info.loaded = info.error.empty();
  if (info.loaded && info.own_namespace) {
    // At exit the dynamic linker finalizes namespaces from the last to the first: UCX's libraries
    // run their destructors before those of the objects that use them (liblbcc.so, the plugin),
    // whose teardown would then call into a finalized UCX. exit() runs atexit handlers before
    // any destructor, so once they are done (g_exit_handlers_done) every call gets a stand-in:
    // the process is ending, and UCX's own destructors release what it holds. A worker still
    // alive then stays registered with UCX's async thread: transports should be gone by then.
    state->unavailable = "UCX is finalized (the process is exiting)";
    FillStandIns(state->after_exit);
    state->after_exit.ucp_worker_arm = &ArmWhileExiting;
    state->stand_ins_at_exit = true;
  }
  if (!info.loaded) {
    state->unavailable = absl::StrCat("UCX could not be loaded (", info.error, ")");
    state->api = Api{};
    FillStandIns(state->api);
    LBCC_LOG(WARN) << state->unavailable;
  } else {
    LBCC_LOG(INFO) << "UCX " << info.library << " loaded"
                   << (info.own_namespace ? " into its own link-map namespace" : "");
  }
  return state;
}

State& Loaded() {
  static State* const state = Load();
  return *state;
}

}  // namespace

const Api& Get() {
  const State& state = Loaded();
  thread_local bool thread_ready = false;
  if (!thread_ready) {
    if (state.uselocale != nullptr) state.uselocale(LC_GLOBAL_LOCALE);
    thread_ready = true;
  }
  return state.stand_ins_at_exit && g_exit_handlers_done.load(std::memory_order_acquire)
             ? state.after_exit
             : state.api;
}
const LoadInfo& Info() { return Loaded().info; }

}  // namespace lbcc::transport::ucx_api
