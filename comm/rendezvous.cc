#include "comm/rendezvous.h"

#include <dlfcn.h>

#include <algorithm>
#include <memory>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "transport/netif.h"

namespace lbcc::comm {
namespace {

// A launcher's variable (not LBCC's own): nullopt when unset.
std::optional<std::string> Get(const char* name) { return env::GetForeign(name); }

absl::StatusOr<int> IntVar(const char* name, absl::string_view launcher) {
  const std::optional<std::string> value = Get(name);
  int parsed = 0;
  if (!value.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(launcher, " environment: ", name, " is not set"));
  }
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(absl::StrCat(launcher, " environment: ", name, "='", *value,
                                                   "' is not a non-negative integer"));
  }
  return parsed;
}

absl::Status CheckRank(const LaunchEnvironment& l, absl::string_view rank_var) {
  if (l.nranks < 1 || l.rank >= l.nranks) {
    return absl::InvalidArgumentError(absl::StrCat(LauncherName(l.launcher), " environment: ",
                                                   rank_var, "=", l.rank, " is not below the ",
                                                   "world size ", l.nranks));
  }
  return absl::OkStatus();
}

uint64_t Hash(absl::string_view text) {  // FNV-1a: the same on every rank.
  uint64_t h = 1469598103934665603ull;
  for (char c : text) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Appends to `out` the expansion of one bracket body "01-03,07".
absl::Status ExpandRanges(absl::string_view body, absl::string_view list,
                          std::vector<std::string>* out) {
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", list, "': ", what));
  };
  for (absl::string_view item : absl::StrSplit(body, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    uint64_t low = 0, high = 0;
    const auto digits = [](absl::string_view s) {
      return !s.empty() && s.size() <= 18 &&
             std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
    };
    if (!digits(ends[0]) || (ends.size() == 2 && !digits(ends[1]))) {
      return bad(absl::StrCat("'", item, "' is not a number or a range a-b"));
    }
    absl::SimpleAtoi(ends[0], &low);
    high = low;
    if (ends.size() == 2) absl::SimpleAtoi(ends[1], &high);
    if (high < low) return bad(absl::StrCat("range '", item, "' is reversed"));
    if (high - low >= 100000) return bad(absl::StrCat("range '", item, "' is too long"));
    const size_t width = ends[0].size();
    for (uint64_t v = low; v <= high; ++v) {
      std::string number = absl::StrCat(v);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      out->push_back(std::move(number));
    }
  }
  return absl::OkStatus();
}

// One host expression (no top-level comma): "rack[1-2]-node[01-02]".
absl::Status ExpandOne(absl::string_view expr, absl::string_view list,
                       std::vector<std::string>* out) {
  std::vector<std::string> names = {""};
  size_t i = 0;
  while (i < expr.size()) {
    const size_t open = expr.find('[', i);
    const absl::string_view literal = expr.substr(i, open == absl::string_view::npos ? expr.npos : open - i);
    if (literal.find(']') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("Slurm node list '", list, "': unmatched ']' in '", expr, "'"));
    }
    for (std::string& n : names) absl::StrAppend(&n, literal);
    if (open == absl::string_view::npos) break;
    const size_t close = expr.find(']', open);
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("Slurm node list '", list, "': unclosed '[' in '", expr, "'"));
    }
    std::vector<std::string> suffixes;
    LBCC_RETURN_IF_ERROR(ExpandRanges(expr.substr(open + 1, close - open - 1), list, &suffixes));
    std::vector<std::string> product;
    for (const std::string& n : names) {
      for (const std::string& s : suffixes) product.push_back(absl::StrCat(n, s));
    }
    names = std::move(product);
    i = close + 1;
  }
  for (std::string& n : names) {
    if (n.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", list, "': empty name"));
    }
    out->push_back(std::move(n));
  }
  return absl::OkStatus();
}

// ---- MPI through dlopen: libmpi is loaded only under mpirun. Open MPI's handles are pointers
// to its predefined objects (&ompi_mpi_comm_world, &ompi_mpi_byte); MPICH's and its derivatives'
// (Intel MPI, MVAPICH) are the integer constants of their mpi.h.

constexpr int kMpichCommWorld = 0x44000000;
constexpr int kMpichByte = 0x4c00010d;

struct Mpi {
  void* library = nullptr;
  std::string name;
  bool open_mpi = false;
  void* comm_world = nullptr;  // Open MPI.
  void* byte = nullptr;        // Open MPI.
  int (*initialized)(int*) = nullptr;
  int (*finalized)(int*) = nullptr;
  int (*init)(int*, char***) = nullptr;
  int (*finalize)() = nullptr;
  void* bcast = nullptr;
};

Mutex mpi_mu;
Mpi* loaded_mpi ABSL_GUARDED_BY(mpi_mu) = nullptr;

void FinalizeAtExit() {
  MutexLock lock(&mpi_mu);
  int done = 0;
  if (loaded_mpi != nullptr && loaded_mpi->finalized(&done) == 0 && !done) loaded_mpi->finalize();
}

absl::StatusOr<Mpi*> LoadMpi(bool open_mpi_launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mpi_mu) {
  if (loaded_mpi != nullptr) return loaded_mpi;
  absl::StatusOr<std::string> configured = env::GetString("LBCC_MPI_LIBRARY");
  if (!configured.ok()) return configured.status();
  std::vector<std::string> names;
  if (!configured->empty()) {
    names = {*configured};
  } else if (open_mpi_launch) {
    names = {"libmpi.so.40", "libmpi.so"};
  } else {
    names = {"libmpi.so.12", "libmpich.so.12", "libmpi.so.40", "libmpi.so"};
  }
  std::vector<std::string> errors;
  auto mpi = std::make_unique<Mpi>();
  for (const std::string& name : names) {
    // RTLD_GLOBAL: Open MPI's components (dlopen'ed by libmpi) resolve libmpi's symbols.
    mpi->library = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (mpi->library != nullptr) {
      mpi->name = name;
      break;
    }
    const char* why = dlerror();
    errors.push_back(why != nullptr ? why : name);
  }
  if (mpi->library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "launched by mpirun but no MPI library loads (",
        configured->empty() ? "tried " : "LBCC_MPI_LIBRARY=", absl::StrJoin(names, ", "), ": ",
        absl::StrJoin(errors, "; "),
        "): install the MPI runtime, set LBCC_MPI_LIBRARY to libmpi's path, or set "
        "LBCC_BOOTSTRAP_ADDR=host:port"));
  }
  const auto sym = [&](const char* s) { return dlsym(mpi->library, s); };
  mpi->comm_world = sym("ompi_mpi_comm_world");
  mpi->byte = sym("ompi_mpi_byte");
  mpi->open_mpi = mpi->comm_world != nullptr && mpi->byte != nullptr;
  mpi->initialized = reinterpret_cast<int (*)(int*)>(sym("MPI_Initialized"));
  mpi->finalized = reinterpret_cast<int (*)(int*)>(sym("MPI_Finalized"));
  mpi->init = reinterpret_cast<int (*)(int*, char***)>(sym("MPI_Init"));
  mpi->finalize = reinterpret_cast<int (*)()>(sym("MPI_Finalize"));
  mpi->bcast = sym("MPI_Bcast");
  if (!mpi->initialized || !mpi->finalized || !mpi->init || !mpi->finalize || !mpi->bcast) {
    return absl::FailedPreconditionError(
        absl::StrCat(mpi->name, " lacks MPI_Init/MPI_Bcast: not an MPI library"));
  }
  loaded_mpi = mpi.release();
  return loaded_mpi;
}

absl::Status BroadcastWithMpi(UniqueId* id, bool open_mpi_launch) {
  MutexLock lock(&mpi_mu);
  LBCC_ASSIGN_OR_RETURN(Mpi * mpi, LoadMpi(open_mpi_launch));
  int initialized = 0, finalized = 0;
  mpi->initialized(&initialized);
  mpi->finalized(&finalized);
  if (finalized) {
    return absl::FailedPreconditionError(
        "MPI was finalized in this process: set LBCC_BOOTSTRAP_ADDR=host:port instead");
  }
  if (!initialized) {
    if (mpi->init(nullptr, nullptr) != 0) {
      return absl::UnavailableError(absl::StrCat("MPI_Init from ", mpi->name, " failed"));
    }
    std::atexit(FinalizeAtExit);
  }
  int rc = 0;
  if (mpi->open_mpi) {
    rc = reinterpret_cast<int (*)(void*, int, void*, int, void*)>(mpi->bcast)(
        id->internal, kUniqueIdBytes, mpi->byte, 0, mpi->comm_world);
  } else {
    rc = reinterpret_cast<int (*)(void*, int, int, int, int)>(mpi->bcast)(
        id->internal, kUniqueIdBytes, kMpichByte, 0, kMpichCommWorld);
  }
  if (rc != 0) return absl::UnavailableError(absl::StrCat("MPI_Bcast of the unique id: ", rc));
  return absl::OkStatus();
}

// SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the root on the node list's first host.
absl::Status DetectSlurm(LaunchEnvironment* out) {
  LaunchEnvironment& l = *out;
  l.launcher = Launcher::kSlurm;
  LBCC_ASSIGN_OR_RETURN(l.rank, IntVar("SLURM_PROCID", "Slurm"));
  LBCC_ASSIGN_OR_RETURN(l.nranks, IntVar("SLURM_NTASKS", "Slurm"));
  if (Get("SLURM_LOCALID").has_value()) {
    LBCC_ASSIGN_OR_RETURN(l.local_rank, IntVar("SLURM_LOCALID", "Slurm"));
  }
  const char* list_var = Get("SLURM_STEP_NODELIST").has_value() ? "SLURM_STEP_NODELIST"
                         : Get("SLURM_JOB_NODELIST").has_value() ? "SLURM_JOB_NODELIST"
                                                                : "SLURM_NODELIST";
  if (!Get(list_var).has_value()) {
    return absl::InvalidArgumentError(
        "Slurm environment: SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) is not set");
  }
  LBCC_ASSIGN_OR_RETURN(std::vector<std::string> hosts, ExpandSlurmNodeList(*Get(list_var)),
                        _.Prepend(list_var));
  LBCC_ASSIGN_OR_RETURN(const int64_t port, env::GetInt("LBCC_BOOTSTRAP_PORT"));
  l.root_address = transport::JoinHostPort(hosts.front(), static_cast<int>(port));
  l.session = Hash(absl::StrCat("slurm/", Get("SLURM_JOB_ID").value_or(""), "/",
                                Get("SLURM_STEP_ID").value_or("")));
  return absl::OkStatus();
}

// LBCC_BOOTSTRAP_ADDR over any launcher, torchrun's MASTER_ADDR:MASTER_PORT+1; then the root's
// address must parse and its host resolve (failing now, not at the timeout).
absl::Status SetFixedRoot(LaunchEnvironment* out) {
  LaunchEnvironment& l = *out;
  LBCC_ASSIGN_OR_RETURN(const std::string fixed, env::GetString("LBCC_BOOTSTRAP_ADDR"));
  if (!fixed.empty()) {
    l.launcher = Launcher::kBootstrapAddr;
    l.root_address = fixed;
    l.session = 0;
  } else if (l.launcher == Launcher::kTorchrun) {
    const std::string host = Get("MASTER_ADDR").value_or("");
    if (host.empty()) {
      return absl::InvalidArgumentError(
          "torchrun environment: set LBCC_BOOTSTRAP_ADDR or MASTER_ADDR/MASTER_PORT");
    }
    LBCC_ASSIGN_OR_RETURN(const int port, IntVar("MASTER_PORT", "torchrun"),
                          _.Prepend("set LBCC_BOOTSTRAP_ADDR or MASTER_ADDR/MASTER_PORT"));
    if (port >= 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("torchrun environment: MASTER_PORT=", port, " leaves no port above it"));
    }
    l.root_address = transport::JoinHostPort(host, port + 1);
  }
  if (!l.root_address.empty()) {
    // Fail now, not at the timeout: the address parses and its host resolves.
    LBCC_ASSIGN_OR_RETURN(const transport::HostAndPort hp,
                          transport::ParseHostPort(l.root_address, "bootstrap root"));
    LBCC_RETURN_IF_ERROR(
        transport::ResolveHost(hp.host, absl::StrCat(LauncherName(l.launcher), " bootstrap root"))
            .status());
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kBootstrapAddr:
      return "LBCC_BOOTSTRAP_ADDR";
    case Launcher::kMpi:
      return "mpirun";
    case Launcher::kSlurm:
      return "Slurm";
    case Launcher::kTorchrun:
      return "torchrun";
  }
  return "?";
}

absl::StatusOr<std::vector<std::string>> ExpandSlurmNodeList(absl::string_view list) {
  std::vector<std::string> hosts;
  // Split at commas outside brackets.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", list, "': unmatched ']'"));
    }
    if (c == ',' && depth == 0) {
      const absl::string_view expr = absl::StripAsciiWhitespace(list.substr(start, i - start));
      if (!expr.empty()) LBCC_RETURN_IF_ERROR(ExpandOne(expr, list, &hosts));
      start = i + 1;
    }
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", list, "': unclosed '['"));
  }
  if (hosts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Slurm node list '", list, "' names no host"));
  }
  return hosts;
}

absl::StatusOr<LaunchEnvironment> DetectLaunch() {
  LaunchEnvironment l;
  std::string rank_var;
  if (Get("OMPI_COMM_WORLD_RANK").has_value()) {
    l.launcher = Launcher::kMpi;
    rank_var = "OMPI_COMM_WORLD_RANK";
    LBCC_ASSIGN_OR_RETURN(l.rank, IntVar("OMPI_COMM_WORLD_RANK", "mpirun"));
    LBCC_ASSIGN_OR_RETURN(l.nranks, IntVar("OMPI_COMM_WORLD_SIZE", "mpirun"));
    if (Get("OMPI_COMM_WORLD_LOCAL_RANK").has_value()) {
      LBCC_ASSIGN_OR_RETURN(l.local_rank, IntVar("OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"));
    }
  } else if (Get("PMI_RANK").has_value()) {
    l.launcher = Launcher::kMpi;
    rank_var = "PMI_RANK";
    LBCC_ASSIGN_OR_RETURN(l.rank, IntVar("PMI_RANK", "mpirun"));
    LBCC_ASSIGN_OR_RETURN(l.nranks, IntVar("PMI_SIZE", "mpirun"));
    if (Get("MPI_LOCALRANKID").has_value()) {
      LBCC_ASSIGN_OR_RETURN(l.local_rank, IntVar("MPI_LOCALRANKID", "mpirun"));
    }
  } else if (Get("SLURM_PROCID").has_value() && !Get("RANK").has_value()) {
    // torchrun inside an allocation sets RANK: its own variables win there.
    rank_var = "SLURM_PROCID";
    LBCC_RETURN_IF_ERROR(DetectSlurm(&l));
  } else {
    l.launcher = Launcher::kTorchrun;
    rank_var = "RANK";
    LBCC_ASSIGN_OR_RETURN(l.rank, IntVar("RANK", "torchrun"));
    LBCC_ASSIGN_OR_RETURN(l.nranks, IntVar("WORLD_SIZE", "torchrun"));
    if (Get("LOCAL_RANK").has_value()) {
      LBCC_ASSIGN_OR_RETURN(l.local_rank, IntVar("LOCAL_RANK", "torchrun"));
    }
  }
  LBCC_RETURN_IF_ERROR(CheckRank(l, rank_var));
  LBCC_RETURN_IF_ERROR(SetFixedRoot(&l));
  return l;
}

absl::StatusOr<UniqueId> RendezvousId(const LaunchEnvironment& launch,
                                      absl::string_view listen_host, absl::Duration timeout) {
  LBCC_LOG(INFO) << "rendezvous: " << LauncherName(launch.launcher) << " rank " << launch.rank
                 << " of " << launch.nranks
                 << (launch.root_address.empty() ? std::string(" (MPI_Bcast)")
                                                 : absl::StrCat(" root ", launch.root_address));
  if (launch.launcher == Launcher::kMpi) {
    // Rank 0 broadcasts even when its root failed (an all-zero id, which every other rank
    // rejects at once), so that nobody waits in MPI_Bcast for it.
    UniqueId id{};
    absl::Status created;
    if (launch.rank == 0) {
      absl::StatusOr<UniqueId> made = CreateUniqueId(listen_host, timeout);
      if (made.ok()) id = *made;
      created = made.status();
    }
    LBCC_RETURN_IF_ERROR(BroadcastWithMpi(&id, Get("OMPI_COMM_WORLD_RANK").has_value()));
    LBCC_RETURN_IF_ERROR(created);
    if (id.internal[0] == 0) {
      return absl::UnavailableError("mpirun: rank 0 could not start the bootstrap root (see its log)");
    }
    return id;
  }
  if (launch.rank == 0) {
    LBCC_RETURN_IF_ERROR(StartRoot(launch.root_address, launch.nranks, launch.session, timeout));
  }
  return UniqueIdFromAddress(launch.root_address, launch.session);
}

}  // namespace lbcc::comm
