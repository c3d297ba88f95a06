#include "base/env.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace lbcc::env {
namespace {

std::atomic<uint64_t> g_reads{0};

const char* Read(const std::string& name) {
  g_reads.fetch_add(1, std::memory_order_relaxed);
  return std::getenv(name.c_str());
}

// The declarations. Keep sorted by name; add a variable here and nowhere else.
constexpr Spec kSpecs[] = {
    {"LBCC_ALGO", Type::kString, "",
     "Override the algorithm table per collective (allgatherv, allreduce, broadcast, allgather, "
     "barrier), e.g. allgatherv=ring,allreduce=ring (algorithms: direct, ring, hierarchical); "
     "read when a communicator is created."},
    {"LBCC_BOOTSTRAP_ADDR", Type::kString, "",
     "host:port (a name or an address; [v6]:port) of the bootstrap root for launches from the "
     "environment; unset: MPI_Bcast under mpirun, the first host of SLURM_STEP_NODELIST under "
     "srun, MASTER_ADDR:MASTER_PORT+1 under torchrun (C/C++; Python uses torch's store)."},
    {"LBCC_BOOTSTRAP_PORT", Type::kInt, "29499",
     "Port of the bootstrap root on the first host of SLURM_STEP_NODELIST (Slurm launches).", {},
     1, 65535},
    {"LBCC_DEBUG", Type::kEnum, "WARN",
     "Log level: NONE, VERSION, WARN, INFO or TRACE (like NCCL_DEBUG).",
     "NONE|VERSION|WARN|INFO|TRACE"},
    {"LBCC_DEBUG_FILE", Type::kString, "",
     "Write logs to this file instead of stderr; %h expands to the host name, %p to the pid."},
    {"LBCC_ENCRYPT", Type::kEnum, "slow",
     "Transport, with a job secret: which authenticated links are also encrypted "
     "(AES-256-GCM): slow ones, all or none (every chunk is authenticated either way).",
     "none|slow|all"},
    {"LBCC_FAST_CHUNK_BYTES", Type::kBytes, "64M",
     "Transport: fast links carry messages in chunks of this size.", {}, 4096, 1 << 30},
    {"LBCC_JOB_SECRET", Type::kString, "",
     "The job secret, 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`): every "
     "connection authenticates with it and every chunk is sealed; empty: no authentication. "
     "Never printed."},
    {"LBCC_JOB_SECRET_FILE", Type::kString, "",
     "File holding the job secret (32 raw bytes or 64 hex digits); instead of LBCC_JOB_SECRET."},
    {"LBCC_LINK_CLASS", Type::kEnum, "auto",
     "Transport: class of every link: auto (the link rules file or the communicator's topology, "
     "else a timed probe at connect), fast or slow.",
     "auto|fast|slow"},
    {"LBCC_LINK_PROBE_BYTES", Type::kBytes, "64M",
     "Transport: largest transfer per direction of the connect-time link probe (it grows from "
     "64K until a transfer takes 20 ms).",
     {}, 65536, 1 << 30},
    {"LBCC_LINK_RULES_FILE", Type::kString, "",
     "Transport: file of '<host[:port]|*> <fast|slow>' lines giving the link class per peer "
     "(hosts: IPv4, IPv6 bare or [in brackets], or names)."},
    {"LBCC_LISTEN_ADDR", Type::kString, "",
     "Address (IPv4 or IPv6) or interface name this rank listens on for other ranks; unset: "
     "chosen as LBCC_SOCKET_IFNAME describes."},
    {"LBCC_MASTER_ADDR", Type::kString, "",
     "host:port of the elastic membership service (lbcc-master) an ElasticGroup joins."},
    {"LBCC_MPI_LIBRARY", Type::kString, "",
     "MPI library LBCC loads under mpirun to broadcast the unique id (dlopen name or path); "
     "unset: libmpi.so.40 (Open MPI) or libmpi.so.12 (MPICH)."},
    {"LBCC_PEER_TIMEOUT_MS", Type::kInt, "10000",
     "Transport: a peer that stops answering fails pending work with Unavailable after about "
     "this many milliseconds.",
     {}, 100, 3600000},
    {"LBCC_PLUGIN_DEVICES", Type::kString, "",
     "NCCL net plugin: devices offered to NCCL, comma-separated interface names, addresses "
     "(IPv4 or IPv6) or host names, each optionally =fast or =slow (e.g. eth0,eth1=slow); "
     "empty: every up interface except lo and docker*."},
    {"LBCC_PLUGIN_LATENCY_US", Type::kDouble, "0",
     "NCCL net plugin: device latency reported to NCCL's tuner, in microseconds; 0: half the "
     "shortest probed round trip, else 0.",
     {}, 0, 1e7},
    {"LBCC_PLUGIN_SPEED_MBITS", Type::kDouble, "0",
     "NCCL net plugin: device speed reported to NCCL's tuner, in Mbit/s; 0: the pacing rate of "
     "a device configured slow, else the slowest probed slow link, else the interface speed, "
     "else 10000.",
     {}, 0, 1e9},
    {"LBCC_PLUGIN_STAGING_BYTES", Type::kBytes, "256M",
     "NCCL net plugin built with CUDA: pinned host memory for staging NCCL_PTR_CUDA messages, "
     "at most (a comm holding none may exceed it by one request).",
     {}, 1 << 20, int64_t{1} << 40},
    {"LBCC_REACHABLE", Type::kEnum, "auto",
     "Whether peers can dial this rank: no (behind NAT or a firewall that refuses inbound "
     "connections: it dials every connection of its links and its peers use them; needs "
     "LBCC_TRANSPORT=socket), yes, or auto (no when the address it listens on is not the one "
     "the bootstrap root saw its connection come from: NAT; over the socket backend also when "
     "the root cannot connect to its listening port: a firewall).",
     "auto|yes|no"},
    {"LBCC_SECRET_IN_ID", Type::kBool, "0",
     "Where a unique id is created (lbccGetUniqueId, CreateUniqueId) and no LBCC_JOB_SECRET is "
     "set: put a fresh random job secret in the id, so every rank launched from it "
     "authenticates (and seals) its links with no secret of its own; whoever has the id is a "
     "member."},
    {"LBCC_SIMD", Type::kEnum, "auto",
     "SIMD level for CPU codecs: auto (best the CPU supports), avx2 or scalar.",
     "auto|avx2|scalar"},
    {"LBCC_SLOW_BULK_YIELD", Type::kBool, "1",
     "Transport: while a slow link also carries latency-critical (non-bulk) messages, its "
     "bulk-priority sends pace themselves below the probed rate, leaving twice the recent "
     "non-bulk rate free, in chunks of about 2 ms, so those messages find the bottleneck's "
     "queue empty; 0: bulk is paced only by LBCC_SLOW_PACE_MBITS."},
    {"LBCC_SLOW_CHUNK_BYTES", Type::kBytes, "256K",
     "Transport: slow links send messages in chunks of this size; a higher-priority message "
     "waits for at most the chunks in flight.",
     {}, 4096, 64 << 20},
    {"LBCC_SLOW_EAGER_BYTES", Type::kBytes, "4M",
     "UCX transport: slow-link chunks, and fast-link chunks to another machine, up to this size "
     "use UCX's eager protocol instead of a rendezvous whose reply would queue behind data on "
     "the sender's own down-link; 0: let UCX choose.",
     {}, 0, int64_t{1} << 30},
    {"LBCC_SLOW_LINK_GBITS", Type::kDouble, "10",
     "Transport: a link probed below this rate (Gbit/s, either direction) is slow.", {}, 1e-6,
     1e6},
    {"LBCC_SLOW_PACE_MBITS", Type::kDouble, "0",
     "Transport: pace each slow link's normal- and bulk-priority sends to this rate in Mbit/s "
     "(token bucket; high priority is never held); 0: no pacing.",
     {}, 0, 1e7},
    {"LBCC_SLOW_RANKS", Type::kString, "",
     "Comma-separated ranks whose every link is slow (e.g. 2,3), on top of the topology."},
    {"LBCC_SLOW_STRIPES", Type::kInt, "1",
     "Transport: connections each slow link stripes its chunks over.", {}, 1, 16},
    {"LBCC_SLOW_WINDOW_BYTES", Type::kBytes, "0",
     "Transport: unacknowledged bytes a slow link keeps in flight; 0: max(max(stripes, 4) x "
     "chunk, 2 x probed rate x RTT).",
     {}, 0, 1 << 30},
    {"LBCC_SOCKET_IFNAME", Type::kString, "",
     "Interfaces to listen on, NCCL_SOCKET_IFNAME's syntax: prefixes (eth,ib), =exact names, "
     "^ to exclude (^docker,lo); unset: the interface that routes to the bootstrap root, else "
     "the first up one but lo and docker*, else lo."},
    {"LBCC_SPARSE_GROUP_ELEMENTS", Type::kInt, "1048576",
     "SparseAllReduce: tensors are encoded and exchanged in groups of at least this many "
     "elements (at most 8 groups; one tensor is never split), so encoding overlaps the wire. "
     "Must be the same on every rank.",
     {}, 1, int64_t{1} << 40},
    {"LBCC_STRICT_ENV", Type::kBool, "0",
     "Communicators fail Init with InvalidArgument on an unknown LBCC_* variable or an invalid "
     "value, instead of logging a warning."},
    {"LBCC_TIMEOUT_S", Type::kDouble, "300",
     "Seconds a communicator waits for set-up or for one operation before failing it.", {},
     0.001, 86400},
    {"LBCC_TOPO_FILE", Type::kString, "",
     "Topology JSON file (islands, replicas, link overrides); default: same host = fast island."},
    {"LBCC_TRANSPORT", Type::kEnum, "ucx",
     "Transport backend of communicators: ucx; socket (plain TCP connections that the dialing "
     "end carries both ways, for peers UCX's tcp lanes cannot reach: NAT, firewalls); or "
     "loopback (in-process, for tests).",
     "ucx|socket|loopback"},
    {"LBCC_UCX_LIBRARY", Type::kString, "",
     "UCX transport: the libucp.so.0 to load (a path, or a soname the dynamic linker finds); "
     "default: the UCX 1.13.1 that tools/setup builds with LBCC's patches (tools/ucx/), else "
     "the system's libucp.so.0 with a warning."},
    {"LBCC_UCX_SPIN_US", Type::kInt, "50",
     "UCX transport: microseconds the progress thread keeps polling after the last event before "
     "it sleeps on the worker's event fd.",
     {}, 0, 1000000},
    {"LBCC_VERIFY_COLLECTIVES", Type::kBool, "0",
     "torch.distributed backend: every collective first exchanges its signature (op, shapes, "
     "dtypes) and fails on every rank when they differ (as TORCH_DISTRIBUTED_DEBUG=DETAIL)."},
};

constexpr absl::string_view kPrefix = "LBCC_";

// LBCC_* variables of the build and the tools (tools/setup, python/install, the examples'
// launchers), not of the library: neither unknown nor checked.
constexpr absl::string_view kToolVariables[] = {"LBCC_PYTHON", "LBCC_PYTHONPATH",
                                                "LBCC_SETUP_SKIP", "LBCC_PLAN_PLOT_SCRIPT"};

// Levenshtein distance, case-insensitive (names are short: quadratic is fine).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same = absl::ascii_toupper(a[i - 1]) == absl::ascii_toupper(b[j - 1]);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

absl::string_view TypeName(Type type) {
  switch (type) {
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kDouble:
      return "double";
    case Type::kString:
      return "string";
    case Type::kEnum:
      return "enum";
    case Type::kBytes:
      return "bytes";
  }
  return "?";
}

bool Bounded(const Spec& spec) { return spec.min != spec.max; }

std::string RangeText(const Spec& spec) {
  if (!Bounded(spec)) return "";
  // Integer types' bounds in full (1099511627776, not 1.09951e+12).
  auto bound = [&spec](double value) {
    return spec.type == Type::kDouble ? absl::StrCat(value)
                                      : absl::StrCat(static_cast<int64_t>(value));
  };
  return absl::StrCat(" in [", bound(spec.min), ", ", bound(spec.max), "]");
}

absl::StatusOr<const Spec*> Lookup(absl::string_view name, std::initializer_list<Type> types) {
  const Spec* spec = FindSpec(name);
  if (spec == nullptr) {
    return absl::InternalError(absl::StrCat(name, " is not declared in base/env.cc"));
  }
  if (std::find(types.begin(), types.end(), spec->type) == types.end()) {
    return absl::InternalError(
        absl::StrCat(name, " is declared as ", TypeName(spec->type), " but read as another type"));
  }
  return spec;
}

// The user's value, or the declared default when unset. `from_user` says which.
std::string RawValue(const Spec& spec, bool* from_user) {
  const char* value = Read(std::string(spec.name));
  *from_user = value != nullptr;
  return value != nullptr ? std::string(value) : std::string(spec.default_value);
}

absl::Status BadValue(const Spec& spec, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(spec.name, "='", value, "' is invalid: expected ", expected));
}

absl::StatusOr<int64_t> CheckIntRange(const Spec& spec, absl::string_view value, int64_t parsed,
                                      absl::string_view what) {
  if (Bounded(spec) && (parsed < spec.min || parsed > spec.max)) {
    return BadValue(spec, value, absl::StrCat(what, RangeText(spec)));
  }
  return parsed;
}

absl::StatusOr<bool> ParseBoolSpec(const Spec& spec, const std::string& value) {
  absl::StatusOr<bool> parsed = ParseBool(value);
  if (!parsed.ok()) return BadValue(spec, value, "1/0, true/false, yes/no or on/off");
  return parsed;
}

absl::StatusOr<int64_t> ParseIntSpec(const Spec& spec, const std::string& value) {
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return BadValue(spec, value, absl::StrCat("an integer", RangeText(spec)));
  }
  return CheckIntRange(spec, value, parsed, "an integer");
}

absl::StatusOr<double> ParseDoubleSpec(const Spec& spec, const std::string& value) {
  double parsed = 0;
  if (!absl::SimpleAtod(value, &parsed) || !std::isfinite(parsed) ||
      (Bounded(spec) && (parsed < spec.min || parsed > spec.max))) {
    return BadValue(spec, value, absl::StrCat("a number", RangeText(spec)));
  }
  return parsed;
}

absl::StatusOr<std::string> ParseEnumSpec(const Spec& spec, const std::string& value) {
  for (absl::string_view choice : absl::StrSplit(spec.choices, '|')) {
    if (absl::EqualsIgnoreCase(choice, absl::StripAsciiWhitespace(value))) {
      return std::string(choice);
    }
  }
  return BadValue(spec, value, absl::StrCat("one of ", spec.choices));
}

absl::StatusOr<int64_t> ParseBytesSpec(const Spec& spec, const std::string& value) {
  absl::StatusOr<int64_t> parsed = ParseBytes(value);
  if (!parsed.ok()) {
    return BadValue(spec, value, absl::StrCat("a byte count like 4096, 256K or 1G", RangeText(spec)));
  }
  return CheckIntRange(spec, value, *parsed, "a byte count");
}

// Validates the current value of `spec` whatever its type.
absl::Status ValidateOne(const Spec& spec) {
  bool from_user = false;
  const std::string value = RawValue(spec, &from_user);
  switch (spec.type) {
    case Type::kBool:
      return ParseBoolSpec(spec, value).status();
    case Type::kInt:
      return ParseIntSpec(spec, value).status();
    case Type::kDouble:
      return ParseDoubleSpec(spec, value).status();
    case Type::kString:
      return absl::OkStatus();
    case Type::kEnum:
      return ParseEnumSpec(spec, value).status();
    case Type::kBytes:
      return ParseBytesSpec(spec, value).status();
  }
  return absl::InternalError("unreachable");
}

}  // namespace

absl::Span<const Spec> AllSpecs() { return kSpecs; }

const Spec* FindSpec(absl::string_view name) {
  for (const Spec& spec : kSpecs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

absl::StatusOr<bool> ParseBool(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a boolean"));
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
  int64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(rest.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a byte count"));
  }
  std::string suffix = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(rest.substr(digits)));
  if (absl::EndsWith(suffix, "IB")) {
    suffix.erase(suffix.size() - 2);
  } else if (suffix.size() == 2 && suffix[1] == 'B') {
    suffix.erase(1);
  } else if (suffix == "B") {
    suffix.clear();
  }
  int shift = 0;
  if (suffix.empty()) {
    shift = 0;
  } else if (suffix == "K") {
    shift = 10;
  } else if (suffix == "M") {
    shift = 20;
  } else if (suffix == "G") {
    shift = 30;
  } else if (suffix == "T") {
    shift = 40;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' has an unknown size suffix"));
  }
  if (number > (INT64_MAX >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' overflows"));
  }
  return number << shift;
}

absl::StatusOr<bool> GetBool(absl::string_view name) {
  auto spec = Lookup(name, {Type::kBool});
  if (!spec.ok()) return spec.status();
  bool from_user = false;
  return ParseBoolSpec(**spec, RawValue(**spec, &from_user));
}

absl::StatusOr<int64_t> GetInt(absl::string_view name) {
  auto spec = Lookup(name, {Type::kInt});
  if (!spec.ok()) return spec.status();
  bool from_user = false;
  return ParseIntSpec(**spec, RawValue(**spec, &from_user));
}

absl::StatusOr<double> GetDouble(absl::string_view name) {
  auto spec = Lookup(name, {Type::kDouble});
  if (!spec.ok()) return spec.status();
  bool from_user = false;
  return ParseDoubleSpec(**spec, RawValue(**spec, &from_user));
}

absl::StatusOr<std::string> GetString(absl::string_view name) {
  auto spec = Lookup(name, {Type::kString, Type::kEnum});
  if (!spec.ok()) return spec.status();
  bool from_user = false;
  std::string value = RawValue(**spec, &from_user);
  if ((*spec)->type == Type::kEnum) return ParseEnumSpec(**spec, value);
  return value;
}

absl::StatusOr<int64_t> GetBytes(absl::string_view name) {
  auto spec = Lookup(name, {Type::kBytes});
  if (!spec.ok()) return spec.status();
  bool from_user = false;
  return ParseBytesSpec(**spec, RawValue(**spec, &from_user));
}

std::string ClosestName(absl::string_view name) {
  // A third of the name may be wrong (LBCC_TIMOUT_S: 1 edit; LBCC_SPARSE_GROUP: 9 of 26).
  size_t best = name.size() / 3 + 1;
  absl::string_view closest;
  for (const Spec& spec : kSpecs) {
    const size_t distance = EditDistance(name, spec.name);
    if (distance < best) {
      best = distance;
      closest = spec.name;
    }
  }
  return std::string(closest);
}

std::optional<std::string> GetForeign(absl::string_view name) {
  const char* value = Read(std::string(name));
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

uint64_t ReadCount() { return g_reads.load(std::memory_order_relaxed); }

std::vector<std::string> EnvironmentProblems() {
  g_reads.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> problems;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    absl::string_view assignment(*entry);
    if (!absl::StartsWith(assignment, kPrefix)) continue;
    absl::string_view name = assignment.substr(0, assignment.find('='));
    if (FindSpec(name) != nullptr ||
        std::find(std::begin(kToolVariables), std::end(kToolVariables), name) !=
            std::end(kToolVariables)) {
      continue;
    }
    const std::string closest = ClosestName(name);
    problems.push_back(absl::StrCat(
        name, " is not an LBCC variable (",
        closest.empty() ? "misspelt? `lbcc env` lists them"
                        : absl::StrCat("did you mean ", closest, "?"),
        ")"));
  }
  for (const Spec& spec : kSpecs) {
    absl::Status status = ValidateOne(spec);
    if (!status.ok()) problems.push_back(std::string(status.message()));
  }
  return problems;
}

absl::Status ValidateEnvironment() {
  const std::vector<std::string> problems = EnvironmentProblems();
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

std::string DescribeAll() {
  std::string out = "| variable | type | default | current | meaning |\n|---|---|---|---|---|\n";
  for (const Spec& spec : kSpecs) {
    bool from_user = false;
    std::string value = RawValue(spec, &from_user);
    std::string type(TypeName(spec.type));
    if (spec.type == Type::kEnum) type = std::string(spec.choices);
    if (Bounded(spec)) absl::StrAppend(&type, RangeText(spec));
    absl::Status status = ValidateOne(spec);
    std::string current = from_user ? absl::StrCat("`", value, "`") : "(default)";
    if (from_user && spec.name == "LBCC_JOB_SECRET") current = "(set, not shown)";
    if (!status.ok()) absl::StrAppend(&current, " INVALID");
    absl::StrAppend(&out, "| ", spec.name, " | ", type, " | `", spec.default_value, "` | ",
                    current, " | ", spec.help, " |\n");
  }
  return out;
}

}  // namespace lbcc::env
