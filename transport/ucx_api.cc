#include "transport/ucx_api.h"

#include <dlfcn.h>
#include <link.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

#if defined(__SANITIZE_THREAD__)
#define LBCC_UCX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LBCC_UCX_TSAN 1
#endif
#endif

namespace lbcc::transport::ucx_api {
namespace {

// The soname LBCC was built against (UCX 1.x keeps it).
constexpr char kLibrary[] = "libucp.so.0";

struct State {
  Api api;
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

State* Load() {
  auto* state = new State;  // Lives as long as the process (UCX may call back at exit).
  LoadInfo& info = state->info;
  // RTLD_LOCAL in a fresh namespace: UCX and its dependencies (libucs, libuct, libucm, and the
  // transports it dlopens from there) bind only to each other. ThreadSanitizer's runtime cannot
  // run the second C library a fresh namespace loads (the process crashes), so a TSan build loads
  // UCX into the program's namespace, RTLD_LOCAL (ucx_isolation_test is notsan).
#if defined(LBCC_UCX_TSAN)
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  const char* how = "dlopen(";
#else
  void* handle = dlmopen(LM_ID_NEWLM, kLibrary, RTLD_NOW | RTLD_LOCAL);
  const char* how = "dlmopen(LM_ID_NEWLM, ";
#endif
  if (handle == nullptr) {
    const char* why = dlerror();
    info.error = absl::StrCat(how, kLibrary, "): ", why ? why : "failed");
  } else {
#define LBCC_UCX_RESOLVE(name)                                                   \
  if (info.error.empty()) {                                                      \
    void* symbol = dlsym(handle, #name);                                         \
    if (symbol == nullptr) {                                                     \
      info.error = absl::StrCat(kLibrary, " has no ", #name);                    \
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
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
      info.library = map->l_name;
    }
  }
  info.loaded = info.error.empty();
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

const Api& Get() { return Loaded().api; }
const LoadInfo& Info() { return Loaded().info; }

}  // namespace lbcc::transport::ucx_api
