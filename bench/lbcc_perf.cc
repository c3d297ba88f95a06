// lbcc_perf: LBCC's collective performance tool, speaking nccl-tests' command line and output.
//
// nccl-tests' flags mean what they mean there (-b -e -i -f -n -w -c -o -d -r -z -a -T, their
// long spellings, and -g/-t, see Settings), its table has the same columns (size, count, type,
// redop, root, then time, algbw, busbw, #wrong out-of-place and in-place) with the same bus
// bandwidth factors, and it ends with "# Out of bounds values : N OK|FAILED" and
// "# Avg bus bandwidth : X"; the exit status is 1 when any value was wrong. LBCC's own columns
// follow nccl-tests' on each row: bytes this rank received on the wire, the compression ratio
// (dense bytes / wire bytes), the error against the dense result, and the bytes per link class.
// bench/README.md compares the two tools flag by flag.
//
// One binary for every operation (nccl-tests has one per operation): --op allreduce (default),
// allgather, broadcast, sparse_allreduce, sendrecv_compressed. Ranks are processes, never
// threads or GPUs of one process:
//   lbcc_perf --local 4 -b 8 -e 128M -f 2                    spawns 4 ranks itself
//   mpirun -np 4 -x LBCC_BOOTSTRAP_ADDR=h:p lbcc_perf ...     Open MPI's environment
//   RANK=i WORLD_SIZE=n MASTER_ADDR=h MASTER_PORT=p lbcc_perf ...   torchrun-style
// or inside tools/testbed, one `tools/testbed exec <host>` per rank with LBCC_LISTEN_ADDR set to
// the host's address.
//
// #wrong: every rank checks its own output against a reference it computes from every rank's
// deterministic input. Dense operations use small integers, so that sums are exact: the bound
// is 0 (sum) or two units in the last place of the type (avg). Lossy operations must reproduce
// the codec's own host round trip of the same inputs bit for bit (bound 0; the exchange adds no
// error of its own); their error against the dense result is the `error` column.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/aligned.h"
#include "base/dtype.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "nlohmann/json.hpp"
#include "tools/cli.h"

// The operation (nccl-tests: the binary's name). NOTE: nccl-tests' --op is the reduction; here
// that is -o / --redop, and --op keeps its LBCC meaning.
ABSL_FLAG(std::string, op, "allreduce",
          "operation: allreduce, allgather, broadcast, sparse_allreduce or sendrecv_compressed");
// nccl-tests' flags, each with its nccl-tests long spelling and, where LBCC had one first, its
// LBCC spelling. Only one spelling of a setting may be given.
ABSL_FLAG(std::string, b, "64K", "smallest size in bytes, K/M/G suffixes (--minbytes, --min_bytes)");
ABSL_FLAG(std::string, minbytes, "64K", "same as -b");
ABSL_FLAG(std::string, min_bytes, "64K", "same as -b");
ABSL_FLAG(std::string, e, "16M", "largest size in bytes (--maxbytes, --max_bytes)");
ABSL_FLAG(std::string, maxbytes, "16M", "same as -e");
ABSL_FLAG(std::string, max_bytes, "16M", "same as -e");
ABSL_FLAG(std::string, i, "1M", "fixed increment between sizes, used when no -f is given (--stepbytes)");
ABSL_FLAG(std::string, stepbytes, "1M", "same as -i");
ABSL_FLAG(int, f, 4, "multiply the size by this between steps; 1: add -i instead (--stepfactor, --step_factor)");
ABSL_FLAG(int, stepfactor, 4, "same as -f");
ABSL_FLAG(int, step_factor, 4, "same as -f");
ABSL_FLAG(int, n, 5, "timed iterations per size (--iters)");
ABSL_FLAG(int, iters, 5, "same as -n");
ABSL_FLAG(int, w, 1, "untimed iterations before each size is timed (--warmup_iters, --warmup)");
ABSL_FLAG(int, warmup_iters, 1, "same as -w");
ABSL_FLAG(int, warmup, 1, "same as -w");
ABSL_FLAG(int, c, 1, "checked runs per size and variant; 0: no check, #wrong is N/A (--check)");
ABSL_FLAG(int, check, 1, "same as -c");
ABSL_FLAG(std::string, o, "sum", "reduction: sum, avg or all; prod/min/max are not LBCC's (--redop)");
ABSL_FLAG(std::string, redop, "sum", "same as -o (nccl-tests spells it --op)");
ABSL_FLAG(std::string, d, "float", "data type: float, half, bfloat16, int8, uint8, int32, int64 or all (--datatype)");
ABSL_FLAG(std::string, datatype, "float", "same as -d");
ABSL_FLAG(int, r, 0, "root rank of broadcast (--root)");
ABSL_FLAG(int, root, 0, "same as -r");
ABSL_FLAG(int, z, 0, "1: a barrier after every operation, as nccl-tests' blocking mode (--blocking)");
ABSL_FLAG(int, blocking, 0, "same as -z");
ABSL_FLAG(int, a, 1, "time reported across ranks: 0 rank 0, 1 mean, 2 min, 3 max (--average)");
ABSL_FLAG(int, average, 1, "same as -a");
ABSL_FLAG(int, T, 0, "seconds an operation may take before it fails; 0: LBCC_TIMEOUT_S (--timeout)");
ABSL_FLAG(int, timeout, 0, "same as -T");
ABSL_FLAG(int, g, 1, "nccl-tests' GPUs per thread: LBCC runs one rank per process, so N > 1 starts N local processes (as --local N) (--ngpus)");
ABSL_FLAG(int, ngpus, 1, "same as -g");
ABSL_FLAG(int, t, 1, "nccl-tests' threads per process: as -g; ranks are processes (--nthreads)");
ABSL_FLAG(int, nthreads, 1, "same as -t");
// LBCC's own.
ABSL_FLAG(int, local, 0, "spawn this many ranks as processes on this machine (0: launcher env)");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file (rank 0)");
ABSL_FLAG(std::string, job_secret_file, "",
          "file holding the job secret (sets LBCC_JOB_SECRET_FILE for every rank; transport/secure.h)");
ABSL_FLAG(double, top_k, 64, "sparse_allreduce: values kept per 4096");
ABSL_FLAG(int, tensors, 1,
          "sparse_allreduce: split each size into this many equal tensors, as a model's "
          "parameters come (SparseAllReduce pipelines encode and exchange across tensors)");
ABSL_FLAG(std::string, values, "binmean2",
          "sparse_allreduce value coding: binmean2, binmean4, binmean8, bf16, fp16, fp32");
ABSL_FLAG(std::string, indices, "auto",
          "sparse_allreduce index coding: auto (the smaller), packed12 or adaptive");
ABSL_FLAG(std::string, algo, "auto", "payload exchange algorithm: auto, direct, ring, hierarchical");
ABSL_FLAG(std::string, topology, "", "topology JSON file (default: LBCC_TOPO_FILE or derived)");
ABSL_FLAG(bool, lbcc_columns, true,
          "print LBCC's columns after nccl-tests' on each row (--nolbcc_columns: nccl-tests' "
          "13 columns only, for parsers that index rows from the end; JSON keeps them)");
ABSL_FLAG(bool, quiet, false, "no progress lines on stderr");
ABSL_FLAG(bool, profile, false,
          "sparse_allreduce: also print where each rank's time went per call (header round, "
          "encode, wait for the wire, agreement, decode; validation overlaps them) for the "
          "out-of-place runs, and add it to --json as \"profile\"");

namespace lbcc {
namespace {

using comm::Communicator;

constexpr char kUsage[] =
    "lbcc_perf: LBCC's collectives timed and checked, with nccl-tests' flags and output.\n"
    "  lbcc_perf --local 4 -b 8 -e 128M -f 2 -o sum -d float         (all_reduce_perf's run)\n"
    "  lbcc_perf --local 4 --op sparse_allreduce -b 1M -e 16M\n"
    "Ranks are processes: --local N, mpirun (LBCC_BOOTSTRAP_ADDR) or a torchrun-style\n"
    "environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Exit status 1 when a value was\n"
    "wrong (or NCCL_TESTS_MIN_BW was not met), 2 for a bad flag.";

constexpr char kChildRank[] = "LBCCPERF_RANK";  // Set by --local for its children.
constexpr char kChildSize[] = "LBCCPERF_NRANKS";
constexpr char kChildId[] = "LBCCPERF_ID";

enum class Op { kAllReduce, kAllGather, kBroadcast, kSparseAllReduce, kSendRecvCompressed };

struct RedOp {
  std::string name;  // nccl-tests' name in the redop column.
  comm::ReduceOp op;
};

struct TypeName {
  DType dtype;
  const char* name;  // nccl-tests' name in the type column.
};
constexpr TypeName kTypes[] = {{DType::kF32, "float"},  {DType::kF16, "half"},
                               {DType::kBF16, "bfloat16"}, {DType::kI8, "int8"},
                               {DType::kU8, "uint8"},   {DType::kI32, "int32"},
                               {DType::kI64, "int64"}};

const char* TypeNameOf(DType dtype) {
  for (const TypeName& t : kTypes) {
    if (t.dtype == dtype) return t.name;
  }
  return "?";
}

// Every setting, resolved and checked once, before any output.
struct Settings {
  std::string op_name;
  Op op = Op::kAllReduce;
  std::vector<DType> dtypes;
  std::vector<RedOp> redops;  // One entry named "none" for operations that do not reduce.
  int64_t min_bytes = 0, max_bytes = 0, step_bytes = 0;
  int step_factor = 1;  // > 1: multiply; else add step_bytes.
  int iters = 0, warmup = 0, check = 0, root = 0, blocking = 0, average = 1, timeout_s = 0;
  int local = 0;
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  std::string algo_name;
  codecs::TopKEfOptions topk;
  int tensors = 1;
  std::string json, topology;
  bool lbcc_columns = true, quiet = false;
};

std::string Spelled(absl::string_view name) {
  return name.size() == 1 ? absl::StrCat("-", name) : absl::StrCat("--", name);
}

template <typename T>
struct Spelling {
  absl::Flag<T>* flag;
  const char* name;
};

// The value of a setting that has several spellings: the one given, else the first's default.
template <typename T>
absl::StatusOr<std::pair<T, std::string>> Pick(const cli::Parsed& parsed,
                                               std::initializer_list<Spelling<T>> spellings) {
  const Spelling<T>* chosen = nullptr;
  for (const Spelling<T>& s : spellings) {
    if (!parsed.Given(s.name)) continue;
    if (chosen != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(Spelled(chosen->name), " and ",
                                                     Spelled(s.name),
                                                     " set the same thing: give one"));
    }
    chosen = &s;
  }
  if (chosen == nullptr) chosen = spellings.begin();
  return std::make_pair(absl::GetFlag(*chosen->flag), Spelled(chosen->name));
}

absl::StatusOr<int64_t> Bytes(const std::pair<std::string, std::string>& value) {
  absl::StatusOr<int64_t> bytes = env::ParseBytes(value.first);
  if (!bytes.ok() || *bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(value.second, " ", value.first, ": not a size (bytes, K, M or G suffix)"));
  }
  return *bytes;
}

absl::Status AtLeast(const std::pair<int, std::string>& value, int low) {
  if (value.first >= low) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(value.second, " ", value.first, ": must be at least ", low));
}

absl::StatusOr<codecs::ValueCoding> ParseValues(const std::string& name) {
  for (codecs::ValueCoding v :
       {codecs::ValueCoding::kBinMean2, codecs::ValueCoding::kBinMean4,
        codecs::ValueCoding::kBinMean8, codecs::ValueCoding::kBf16, codecs::ValueCoding::kF16,
        codecs::ValueCoding::kF32}) {
    if (name == codecs::ValueCodingName(v)) return v;
  }
  return absl::InvalidArgumentError(absl::StrCat("--values ", name, ": unknown coding"));
}

absl::StatusOr<codecs::IndexCoding> ParseIndices(const std::string& name) {
  for (codecs::IndexCoding c : {codecs::IndexCoding::kAuto, codecs::IndexCoding::kPacked12,
                                codecs::IndexCoding::kAdaptive}) {
    if (name == codecs::IndexCodingName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("--indices ", name, ": unknown coding"));
}

absl::StatusOr<Settings> Resolve(const cli::Parsed& parsed) {
  Settings s;
  if (!parsed.positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed.positional[0], "'"));
  }
  s.op_name = absl::GetFlag(FLAGS_op);
  if (s.op_name == "allreduce") {
    s.op = Op::kAllReduce;
  } else if (s.op_name == "allgather") {
    s.op = Op::kAllGather;
  } else if (s.op_name == "broadcast") {
    s.op = Op::kBroadcast;
  } else if (s.op_name == "sparse_allreduce") {
    s.op = Op::kSparseAllReduce;
  } else if (s.op_name == "sendrecv_compressed") {
    s.op = Op::kSendRecvCompressed;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--op ", s.op_name,
        ": unknown operation (allreduce, allgather, broadcast, sparse_allreduce, "
        "sendrecv_compressed)"));
  }

  // Sizes.
  LBCC_ASSIGN_OR_RETURN(auto b, (Pick<std::string>(parsed, {{&FLAGS_b, "b"},
                                                            {&FLAGS_minbytes, "minbytes"},
                                                            {&FLAGS_min_bytes, "min_bytes"}})));
  LBCC_ASSIGN_OR_RETURN(auto e, (Pick<std::string>(parsed, {{&FLAGS_e, "e"},
                                                            {&FLAGS_maxbytes, "maxbytes"},
                                                            {&FLAGS_max_bytes, "max_bytes"}})));
  LBCC_ASSIGN_OR_RETURN(auto i, (Pick<std::string>(parsed, {{&FLAGS_i, "i"},
                                                            {&FLAGS_stepbytes, "stepbytes"}})));
  LBCC_ASSIGN_OR_RETURN(auto f, (Pick<int>(parsed, {{&FLAGS_f, "f"},
                                                    {&FLAGS_stepfactor, "stepfactor"},
                                                    {&FLAGS_step_factor, "step_factor"}})));
  LBCC_ASSIGN_OR_RETURN(s.min_bytes, Bytes(b));
  LBCC_ASSIGN_OR_RETURN(s.max_bytes, Bytes(e));
  LBCC_ASSIGN_OR_RETURN(s.step_bytes, Bytes(i));
  if (s.max_bytes < s.min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(e.second, " ", e.first, " is below ", b.second,
                                                   " ", b.first));
  }
  if (s.max_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(e.second, " ", e.first, ": must be positive"));
  }
  const bool factor_given =
      parsed.Given("f") || parsed.Given("stepfactor") || parsed.Given("step_factor");
  // nccl-tests: -f > 1 multiplies, otherwise -i adds. LBCC's default is a factor of 4 unless
  // only -i was given.
  const bool increment_given = parsed.Given("i") || parsed.Given("stepbytes");
  s.step_factor = factor_given || !increment_given ? f.first : 1;
  LBCC_RETURN_IF_ERROR(AtLeast(f, 1));
  if (s.step_factor <= 1 && s.step_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(i.second, " ", i.first,
                                                   ": the increment must be positive"));
  }

  // Iterations and checks.
  LBCC_ASSIGN_OR_RETURN(auto n, (Pick<int>(parsed, {{&FLAGS_n, "n"}, {&FLAGS_iters, "iters"}})));
  LBCC_ASSIGN_OR_RETURN(auto w, (Pick<int>(parsed, {{&FLAGS_w, "w"},
                                                    {&FLAGS_warmup_iters, "warmup_iters"},
                                                    {&FLAGS_warmup, "warmup"}})));
  LBCC_ASSIGN_OR_RETURN(auto c, (Pick<int>(parsed, {{&FLAGS_c, "c"}, {&FLAGS_check, "check"}})));
  LBCC_ASSIGN_OR_RETURN(auto z, (Pick<int>(parsed, {{&FLAGS_z, "z"}, {&FLAGS_blocking, "blocking"}})));
  LBCC_ASSIGN_OR_RETURN(auto a, (Pick<int>(parsed, {{&FLAGS_a, "a"}, {&FLAGS_average, "average"}})));
  LBCC_ASSIGN_OR_RETURN(auto t_out, (Pick<int>(parsed, {{&FLAGS_T, "T"}, {&FLAGS_timeout, "timeout"}})));
  LBCC_ASSIGN_OR_RETURN(auto r, (Pick<int>(parsed, {{&FLAGS_r, "r"}, {&FLAGS_root, "root"}})));
  LBCC_RETURN_IF_ERROR(AtLeast(n, 1));
  LBCC_RETURN_IF_ERROR(AtLeast(w, 0));
  LBCC_RETURN_IF_ERROR(AtLeast(c, 0));
  LBCC_RETURN_IF_ERROR(AtLeast(t_out, 0));
  LBCC_RETURN_IF_ERROR(AtLeast(r, 0));
  if (z.first != 0 && z.first != 1) {
    return absl::InvalidArgumentError(absl::StrCat(z.second, " ", z.first, ": must be 0 or 1"));
  }
  if (a.first < 0 || a.first > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(a.second, " ", a.first, ": must be 0 (rank 0), 1 (mean), 2 (min) or 3 (max)"));
  }
  s.iters = n.first;
  s.warmup = w.first;
  s.check = c.first;
  s.blocking = z.first;
  s.average = a.first;
  s.timeout_s = t_out.first;
  s.root = r.first;

  // Ranks: processes. -g and -t (GPUs and threads of one nccl-tests process) become processes.
  LBCC_ASSIGN_OR_RETURN(auto g, (Pick<int>(parsed, {{&FLAGS_g, "g"}, {&FLAGS_ngpus, "ngpus"}})));
  LBCC_ASSIGN_OR_RETURN(auto t, (Pick<int>(parsed, {{&FLAGS_t, "t"}, {&FLAGS_nthreads, "nthreads"}})));
  LBCC_RETURN_IF_ERROR(AtLeast(g, 1));
  LBCC_RETURN_IF_ERROR(AtLeast(t, 1));
  s.local = absl::GetFlag(FLAGS_local);
  if (s.local < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--local ", s.local, ": must be at least 0"));
  }
  const int per_process = g.first * t.first;
  // A --local child (kChildId set) was started for exactly this by its parent.
  if (per_process > 1 && std::getenv(kChildId) == nullptr) {
    const bool launched =
        std::getenv("RANK") != nullptr || std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
    if (s.local > 0 || launched) {
      return absl::InvalidArgumentError(absl::StrCat(
          g.first > 1 ? g.second : t.second, " ", g.first > 1 ? g.first : t.first,
          ": LBCC runs one rank per process; with --local or a launcher, give -g 1 -t 1 and "
          "start one process per rank"));
    }
    s.local = per_process;
  }

  // Type and reduction, per operation.
  LBCC_ASSIGN_OR_RETURN(auto d, (Pick<std::string>(parsed, {{&FLAGS_d, "d"},
                                                            {&FLAGS_datatype, "datatype"}})));
  std::vector<DType> supported;
  switch (s.op) {
    case Op::kAllReduce:
      supported = {DType::kF32, DType::kF16, DType::kBF16};
      break;
    case Op::kAllGather:
    case Op::kBroadcast:
      for (const TypeName& tn : kTypes) supported.push_back(tn.dtype);
      break;
    case Op::kSparseAllReduce:
    case Op::kSendRecvCompressed:
      supported = {DType::kF32};
      break;
  }
  if (d.first == "all") {
    s.dtypes = supported;
  } else {
    std::string name = d.first;
    if (name == "float32" || name == "f32") name = "float";
    if (name == "float16" || name == "f16") name = "half";
    if (name == "bf16") name = "bfloat16";
    for (const TypeName& tn : kTypes) {
      if (name == tn.name) s.dtypes = {tn.dtype};
    }
    if (s.dtypes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.second, " ", d.first,
          ": unknown type (float, half, bfloat16, int8, uint8, int32, int64 or all; LBCC has no "
          "uint32, uint64 or double)"));
    }
    if (std::find(supported.begin(), supported.end(), s.dtypes[0]) == supported.end()) {
      return absl::InvalidArgumentError(absl::StrCat(d.second, " ", d.first, ": --op ",
                                                     s.op_name, " does not take this type"));
    }
  }
  LBCC_ASSIGN_OR_RETURN(auto o, (Pick<std::string>(parsed, {{&FLAGS_o, "o"},
                                                            {&FLAGS_redop, "redop"}})));
  const bool o_given = parsed.Given("o") || parsed.Given("redop");
  if (s.op == Op::kAllReduce) {
    if (o.first == "sum" || o.first == "all") s.redops.push_back({"sum", comm::ReduceOp::kSum});
    if (o.first == "avg" || o.first == "all") s.redops.push_back({"avg", comm::ReduceOp::kAvg});
    if (s.redops.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.second, " ", o.first, ": LBCC reduces with sum or avg (or all of them)"));
    }
  } else if (s.op == Op::kSparseAllReduce) {
    // SparseLoCo's mean over the replicas that selected a coordinate.
    if (o_given && o.first != "avg") {
      return absl::InvalidArgumentError(absl::StrCat(
          o.second, " ", o.first, ": sparse_allreduce reduces with SparseLoCo's mean (-o avg)"));
    }
    s.redops.push_back({"avg", comm::ReduceOp::kAvg});
  } else {
    s.redops.push_back({"none", comm::ReduceOp::kSum});
  }

  // LBCC's own.
  absl::StatusOr<comm::Algorithm> algorithm = comm::ParseAlgorithm(absl::GetFlag(FLAGS_algo));
  if (!algorithm.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--algo ", absl::GetFlag(FLAGS_algo),
                                                   ": unknown (auto, direct, ring, hierarchical)"));
  }
  s.algorithm = *algorithm;
  s.algo_name = absl::GetFlag(FLAGS_algo);
  s.topk.top_k = absl::GetFlag(FLAGS_top_k);
  LBCC_ASSIGN_OR_RETURN(s.topk.values, ParseValues(absl::GetFlag(FLAGS_values)));
  LBCC_ASSIGN_OR_RETURN(s.topk.indices, ParseIndices(absl::GetFlag(FLAGS_indices)));
  if (s.op == Op::kSparseAllReduce) {
    absl::StatusOr<std::unique_ptr<codecs::TopKEfCodec>> codec =
        codecs::TopKEfCodec::Create(s.topk);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--top_k/--values/--indices: ", codec.status().message()));
    }
  }
  s.tensors = absl::GetFlag(FLAGS_tensors);
  if (s.tensors < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tensors ", s.tensors, ": must be at least 1"));
  }
  s.json = absl::GetFlag(FLAGS_json);
  s.topology = absl::GetFlag(FLAGS_topology);
  s.lbcc_columns = absl::GetFlag(FLAGS_lbcc_columns);
  s.quiet = absl::GetFlag(FLAGS_quiet);
  return s;
}

// ---- Inputs and references -------------------------------------------------------------------

// Element i of rank r's input for the dense operations: an integer in [-8, 8] ([0, 16] for
// unsigned types), exact in every type and in the sum of up to 256 ranks' values.
int SmallInt(int rank, int64_t i, DType dtype) {
  uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(rank) + 1) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  const int v = static_cast<int>(h % 17);
  return dtype == DType::kU8 ? v : v - 8;
}

void Store(DType dtype, double v, void* data, int64_t i) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = F32ToF16(static_cast<float>(v)); break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = F32ToBf16(static_cast<float>(v)); break;
    case DType::kI8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); break;
    case DType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
    case DType::kI64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); break;
    case DType::kF64: static_cast<double*>(data)[i] = v; break;
    case DType::kI16: static_cast<int16_t*>(data)[i] = static_cast<int16_t>(v); break;
    case DType::kBool: static_cast<uint8_t*>(data)[i] = v != 0; break;
  }
}

double Load(DType dtype, const void* data, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kI8: return static_cast<const int8_t*>(data)[i];
    case DType::kU8: return static_cast<const uint8_t*>(data)[i];
    case DType::kI32: return static_cast<const int32_t*>(data)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kF64: return static_cast<const double*>(data)[i];
    case DType::kI16: return static_cast<const int16_t*>(data)[i];
    case DType::kBool: return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

void FillSmallInts(DType dtype, int rank, int64_t count, void* data) {
  for (int64_t i = 0; i < count; ++i) Store(dtype, SmallInt(rank, i, dtype), data, i);
}

// Two units in the last place, relative: the bound of an average (one rounding of the sum's
// division, plus the type's rounding of the reference).
double AvgTolerance(DType dtype) {
  switch (dtype) {
    case DType::kF16: return std::ldexp(1.0, -9);
    case DType::kBF16: return std::ldexp(1.0, -6);
    default: return std::ldexp(1.0, -22);
  }
}

// The lossy operations' inputs: normal values, as gradients are (and as the codecs expect).
AlignedVector<float> NormalInput(int rank, int64_t count) {
  AlignedVector<float> out(count);
  std::mt19937_64 rng(static_cast<uint64_t>(rank) * 1000003ull + count);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : out) x = normal(rng);
  return out;
}

Shape ShapeFor(int64_t count) {
  if (count % 4096 == 0 && count >= 4096) return {count / 4096, 4096};
  return {count};
}

// [begin, end) of `--tensors` equal parts of `count` (the last takes the remainder).
std::vector<std::pair<int64_t, int64_t>> Parts(int64_t count, int tensors) {
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tensors, count)));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int p = 0; p < parts; ++p) {
    out.emplace_back(count / parts * p, p + 1 == parts ? count : count / parts * (p + 1));
  }
  return out;
}

// ---- One size ---------------------------------------------------------------------------------

// nccl-tests' sizes: `bytes` is what the size column shows (for all-gather the gathered
// output), `count` the elements each rank passes to the call.
struct Case {
  Op op;
  DType dtype;
  RedOp redop;
  int64_t bytes = 0, count = 0;
  int root = -1;
};

// One variant (out-of-place or in-place) of one case, on this rank.
struct Measure {
  bool run = false;        // false: this operation has no such variant (printed N/A).
  double seconds = 0;      // Per operation, combined across ranks by -a.
  double algbw = 0, busbw = 0;
  int64_t wrong = -1;      // Over all ranks; -1: not checked.
  double error = -1;       // vs the dense result (rank 0's); -1: not checked.
  double fast_bytes = 0, slow_bytes = 0;  // Received by this rank per operation.
  double fast_total = 0, slow_total = 0;  // Received by all ranks together.
  // Per rank, SparseAllReduce's phases per call in seconds (kProfileFields order); empty when
  // not a SparseAllReduce.
  std::vector<std::vector<double>> profile;
};

constexpr const char* kProfileFields[] = {"header", "encode", "wire_wait", "agreement",
                                          "decode", "total",  "validate"};
constexpr int kProfileCount = 7;

std::vector<double> ProfileSeconds(const comm::SparseAllReduceProfile& p) {
  const double calls = std::max<int64_t>(p.calls, 1);
  std::vector<double> out;
  for (absl::Duration d : {p.header, p.encode, p.wire_wait, p.agreement, p.decode, p.total,
                           p.validate}) {
    out.push_back(absl::ToDoubleSeconds(d) / calls);
  }
  return out;
}

// The buffers and callbacks of one variant.
struct Variant {
  std::function<absl::Status()> prepare;   // Fresh inputs (and state) before a checked run.
  std::function<absl::Status()> iteration;  // The operation, once.
  std::function<std::pair<int64_t, double>()> check;  // (#wrong, error vs dense) of the last run.
};

class Bench {
 public:
  Bench(Communicator& comm, const Settings& settings) : comm_(comm), s_(settings) {}

  absl::StatusOr<Measure> Run(const Case& c, bool in_place) {
    Measure m;
    Variant v;
    LBCC_ASSIGN_OR_RETURN(bool supported, Build(c, in_place, &v));
    if (!supported) return m;
    m.run = true;
    LBCC_RETURN_IF_ERROR(v.prepare());
    for (int i = 0; i < s_.warmup; ++i) LBCC_RETURN_IF_ERROR(Once(v));
    LBCC_RETURN_IF_ERROR(comm_.Barrier()->Wait());
    const comm::Fabric::ClassBytes before = comm_.fabric()->BytesByClass();
    const comm::SparseAllReduceProfile profile_before = comm_.sparse_profile();
    const absl::Time start = absl::Now();
    for (int i = 0; i < s_.iters; ++i) LBCC_RETURN_IF_ERROR(Once(v));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start) / s_.iters;
    const comm::Fabric::ClassBytes after = comm_.fabric()->BytesByClass();
    const std::vector<double> profile =
        ProfileSeconds(comm_.sparse_profile() - profile_before);
    m.fast_bytes = static_cast<double>(after.fast_received - before.fast_received) / s_.iters;
    m.slow_bytes = static_cast<double>(after.slow_received - before.slow_received) / s_.iters;

    int64_t wrong = 0;
    double error = -1;
    for (int k = 0; k < s_.check; ++k) {
      LBCC_RETURN_IF_ERROR(v.prepare());
      LBCC_RETURN_IF_ERROR(Once(v));
      // LBCCPERF_CORRUPT=1 (tests only): rank 0 spoils its first output value before the check,
      // so that the failure path (#wrong, FAILED, exit status 1) can be tested.
      if (std::getenv("LBCCPERF_CORRUPT") != nullptr && comm_.rank() == 0) Corrupt(c);
      auto [w, e] = v.check();
      wrong += w;
      if (k == 0) error = e;
      if (wrong > 0) break;
    }
    // Every rank's time, wire bytes and #wrong (AllGather of int64s).
    // ... and, for SparseAllReduce, its phases' nanoseconds per call.
    constexpr int kFields = 4 + kProfileCount;
    int64_t mine[kFields] = {static_cast<int64_t>(m.fast_bytes),
                             static_cast<int64_t>(m.slow_bytes),
                             static_cast<int64_t>(seconds * 1e9), wrong};
    for (int f = 0; f < kProfileCount; ++f) mine[4 + f] = static_cast<int64_t>(profile[f] * 1e9);
    std::vector<int64_t> all_fields(kFields * comm_.nranks());
    LBCC_ASSIGN_OR_RETURN(TensorView mine_view, TensorView::Create(mine, DType::kI64, {kFields}));
    LBCC_ASSIGN_OR_RETURN(TensorView all_view, TensorView::Create(all_fields.data(), DType::kI64,
                                                                  {kFields * comm_.nranks()}));
    LBCC_RETURN_IF_ERROR(comm_.AllGather(mine_view, all_view)->Wait());
    std::vector<int64_t> all(4 * comm_.nranks());
    for (int r = 0; r < comm_.nranks(); ++r) {
      std::copy_n(&all_fields[kFields * r], 4, &all[4 * r]);
      if (c.op == Op::kSparseAllReduce) {
        m.profile.emplace_back();
        for (int f = 0; f < kProfileCount; ++f) {
          m.profile.back().push_back(static_cast<double>(all_fields[kFields * r + 4 + f]) / 1e9);
        }
      }
    }
    double combined = s_.average == 2 ? 1e300 : 0;
    int64_t wrong_all = 0;
    for (int r = 0; r < comm_.nranks(); ++r) {
      m.fast_total += static_cast<double>(all[4 * r]);
      m.slow_total += static_cast<double>(all[4 * r + 1]);
      const double sec = static_cast<double>(all[4 * r + 2]) / 1e9;
      if (s_.average == 0 && r == 0) combined = sec;
      if (s_.average == 1) combined += sec / comm_.nranks();
      if (s_.average == 2) combined = std::min(combined, sec);
      if (s_.average == 3) combined = std::max(combined, sec);
      wrong_all += all[4 * r + 3];
    }
    m.seconds = std::max(combined, 1e-9);
    m.wrong = s_.check > 0 ? wrong_all : -1;
    m.error = s_.check > 0 ? error : -1;
    // nccl-tests' bandwidths: algbw = S / t with S the size column; busbw = algbw times the
    // operation's factor (doc/PERFORMANCE.md). sparse_allreduce is timed as an all-reduce of
    // its dense bytes (dense-equivalent bandwidths: what moved is the wire column).
    const int n = comm_.nranks();
    m.algbw = static_cast<double>(c.bytes) / m.seconds / 1e9;
    double factor = 1;
    if (c.op == Op::kAllReduce || c.op == Op::kSparseAllReduce) factor = 2.0 * (n - 1) / n;
    if (c.op == Op::kAllGather) factor = static_cast<double>(n - 1) / n;
    m.busbw = m.algbw * factor;
    return m;
  }

  // Dense bytes a rank receives in `c` over the wire, for the compression ratio.
  double DenseReceived(const Case& c) const {
    const int n = comm_.nranks();
    switch (c.op) {
      case Op::kAllReduce:
      case Op::kSparseAllReduce:
        return static_cast<double>(c.bytes) * 2.0 * (n - 1) / n;
      case Op::kAllGather:
        return static_cast<double>(c.bytes) * (n - 1) / n;
      case Op::kBroadcast:
      case Op::kSendRecvCompressed:
        return static_cast<double>(c.bytes);
    }
    return 0;
  }

 private:
  absl::Status Once(Variant& v) {
    LBCC_RETURN_IF_ERROR(v.iteration());
    if (s_.blocking) LBCC_RETURN_IF_ERROR(comm_.Barrier()->Wait());
    return absl::OkStatus();
  }

  void Corrupt(const Case& c) {
    if (c.op == Op::kSparseAllReduce || c.op == Op::kSendRecvCompressed) {
      if (!output_.empty()) output_[0] += 1.0f;
    } else if (!b_.empty()) {
      b_[0] ^= 0x5a;
    }
  }

  // Fills `v` for `c`; false when the operation has no such variant.
  absl::StatusOr<bool> Build(const Case& c, bool in_place, Variant* v) {
    const int n = comm_.nranks();
    const int me = comm_.rank();
    const int64_t count = c.count;
    const size_t elem = DTypeSize(c.dtype);
    switch (c.op) {
      case Op::kAllReduce: {
        a_.assign(count * elem, 0);
        b_.assign(count * elem, 0);
        void* in = in_place ? b_.data() : a_.data();
        LBCC_ASSIGN_OR_RETURN(TensorView in_view, TensorView::Create(in, c.dtype, {count}));
        LBCC_ASSIGN_OR_RETURN(TensorView out_view, TensorView::Create(b_.data(), c.dtype, {count}));
        v->prepare = [this, c, in, me, count] {
          FillSmallInts(c.dtype, me, count, in);
          return absl::OkStatus();
        };
        v->iteration = [this, c, in_view, out_view] {
          return comm_.AllReduce(in_view, out_view, c.redop.op)->Wait();
        };
        v->check = [this, c, n, count] {
          int64_t wrong = 0;
          double worst = 0;
          const bool avg = c.redop.op == comm::ReduceOp::kAvg;
          for (int64_t i = 0; i < count; ++i) {
            double want = 0;
            for (int r = 0; r < n; ++r) want += SmallInt(r, i, c.dtype);
            if (avg) want /= n;
            const double got = Load(c.dtype, b_.data(), i);
            const double diff = std::fabs(got - want);
            worst = std::max(worst, diff);
            const double bound = avg ? AvgTolerance(c.dtype) * std::max(1.0, std::fabs(want)) : 0;
            if (!(diff <= bound)) ++wrong;
          }
          return std::make_pair(wrong, worst);
        };
        return true;
      }
      case Op::kAllGather: {
        a_.assign(count * elem, 0);
        b_.assign(count * elem * n, 0);
        void* in = in_place ? b_.data() + me * count * elem : a_.data();
        LBCC_ASSIGN_OR_RETURN(TensorView in_view, TensorView::Create(in, c.dtype, {count}));
        LBCC_ASSIGN_OR_RETURN(TensorView out_view,
                              TensorView::Create(b_.data(), c.dtype, {count * n}));
        v->prepare = [this, c, in, me, count] {
          std::fill(b_.begin(), b_.end(), 0);
          FillSmallInts(c.dtype, me, count, in);
          return absl::OkStatus();
        };
        v->iteration = [this, in_view, out_view] { return comm_.AllGather(in_view, out_view)->Wait(); };
        v->check = [this, c, n, count] {
          int64_t wrong = 0;
          double worst = 0;
          for (int r = 0; r < n; ++r) {
            for (int64_t i = 0; i < count; ++i) {
              const double diff = std::fabs(Load(c.dtype, b_.data(), r * count + i) -
                                            SmallInt(r, i, c.dtype));
              worst = std::max(worst, diff);
              if (diff != 0) ++wrong;
            }
          }
          return std::make_pair(wrong, worst);
        };
        return true;
      }
      case Op::kBroadcast: {
        // LBCC's broadcast works in place; out-of-place is the root's copy into the output
        // buffer, then the broadcast of that buffer (the copy is timed).
        a_.assign(count * elem, 0);
        b_.assign(count * elem, 0);
        LBCC_ASSIGN_OR_RETURN(TensorView out_view, TensorView::Create(b_.data(), c.dtype, {count}));
        const int root = c.root;
        v->prepare = [this, c, in_place, me, root, count] {
          std::fill(b_.begin(), b_.end(), 0);
          if (me == root) FillSmallInts(c.dtype, me, count, in_place ? b_.data() : a_.data());
          return absl::OkStatus();
        };
        v->iteration = [this, in_place, me, root, out_view] {
          if (!in_place && me == root) std::memcpy(b_.data(), a_.data(), a_.size());
          return comm_.Broadcast(out_view, root)->Wait();
        };
        v->check = [this, c, root, count] {
          int64_t wrong = 0;
          double worst = 0;
          for (int64_t i = 0; i < count; ++i) {
            const double diff = std::fabs(Load(c.dtype, b_.data(), i) - SmallInt(root, i, c.dtype));
            worst = std::max(worst, diff);
            if (diff != 0) ++wrong;
          }
          return std::make_pair(wrong, worst);
        };
        return true;
      }
      case Op::kSparseAllReduce:
        return BuildSparse(c, in_place, v);
      case Op::kSendRecvCompressed: {
        // Rank r sends to r+1 and receives from r-1 (int8 absmax), as nccl-tests' sendrecv. The
        // receive decodes while the send may still read its input: no in-place variant.
        if (in_place) return false;
        LBCC_ASSIGN_OR_RETURN(dense_, codecs::DenseQuantCodec::Create({}));
        input_ = NormalInput(me, count);
        output_.assign(count, 0.0f);
        LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(input_.data(), {count}));
        LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(output_.data(), {count}));
        v->prepare = [this] {
          std::fill(output_.begin(), output_.end(), 0.0f);
          return absl::OkStatus();
        };
        v->iteration = [this, in, out, me, n] {
          comm::RequestPtr recv = comm_.RecvCompressed(out, (me + n - 1) % n, 7);
          comm::RequestPtr send = comm_.SendCompressed(in, dense_.get(), nullptr, (me + 1) % n, 7);
          LBCC_RETURN_IF_ERROR(send->Wait());
          return recv->Wait();
        };
        // The reference: the codec's own round trip of the sender's input, on this host.
        const AlignedVector<float> sent = NormalInput((me + n - 1) % n, count);
        LBCC_ASSIGN_OR_RETURN(TensorView sent_view,
                              TensorView::Host(const_cast<float*>(sent.data()), {count}));
        LBCC_ASSIGN_OR_RETURN(size_t max_bytes, dense_->MaxEncodedBytes({count}));
        std::vector<uint8_t> payload(max_bytes);
        LBCC_ASSIGN_OR_RETURN(size_t size,
                              dense_->Encode(sent_view, nullptr, absl::MakeSpan(payload)));
        expected_.assign(count, 0.0f);
        LBCC_ASSIGN_OR_RETURN(TensorView expected_view, TensorView::Host(expected_.data(), {count}));
        const absl::Span<const uint8_t> one = absl::MakeConstSpan(payload).subspan(0, size);
        LBCC_RETURN_IF_ERROR(codecs::DecodeAccumulate({one}, codecs::DecodeOptions{}, expected_view));
        v->check = [this, sent, count] {
          int64_t wrong = 0;
          double worst = 0;
          for (int64_t i = 0; i < count; ++i) {
            if (FloatBits(output_[i]) != FloatBits(expected_[i])) ++wrong;
            worst = std::max(worst, static_cast<double>(std::fabs(output_[i] - sent[i])));
          }
          return std::make_pair(wrong, worst);
        };
        return true;
      }
    }
    return false;
  }

  absl::StatusOr<bool> BuildSparse(const Case& c, bool in_place, Variant* v) {
    const int n = comm_.nranks();
    const int me = comm_.rank();
    const int64_t count = c.count;
    LBCC_ASSIGN_OR_RETURN(topk_, codecs::TopKEfCodec::Create(s_.topk));
    input_ = NormalInput(me, count);
    output_.assign(count, 0.0f);
    float* delta = in_place ? output_.data() : input_.data();
    const auto parts = Parts(count, s_.tensors);
    states_.clear();
    tensors_.clear();
    for (size_t p = 0; p < parts.size(); ++p) {
      states_.push_back(std::make_unique<codecs::TopKEfState>());
      const Shape shape = ShapeFor(parts[p].second - parts[p].first);
      LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(delta + parts[p].first, shape));
      LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(output_.data() + parts[p].first, shape));
      tensors_.push_back({in, out, states_[p].get()});
    }
    v->prepare = [this, in_place, parts] {
      // A fresh error-feedback state and input: the checked run is a first exchange.
      for (size_t p = 0; p < parts.size(); ++p) states_[p] = std::make_unique<codecs::TopKEfState>();
      for (size_t p = 0; p < parts.size(); ++p) tensors_[p].state = states_[p].get();
      if (in_place) std::copy(input_.begin(), input_.end(), output_.begin());
      return absl::OkStatus();
    };
    v->iteration = [this] {
      comm::OpOptions op = Communicator::BulkOptions();
      op.algorithm = s_.algorithm;
      return comm_
          .SparseAllReduce(tensors_, topk_.get(), {codecs::Aggregation::kSparseLoCoMean, false}, op)
          ->Wait();
    };
    // The reference: every rank's input encoded on this host with a fresh state, then decoded
    // in rank order with SparseLoCo's mean, per tensor; and the dense mean for the error.
    expected_.assign(count, 0.0f);
    dense_mean_.assign(count, 0.0);
    if (s_.check > 0) {
      std::vector<std::vector<uint8_t>> payloads(static_cast<size_t>(n) * parts.size());
      for (int r = 0; r < n; ++r) {
        AlignedVector<float> x = NormalInput(r, count);
        for (int64_t i = 0; i < count; ++i) dense_mean_[i] += x[i] / n;
        for (size_t p = 0; p < parts.size(); ++p) {
          const Shape shape = ShapeFor(parts[p].second - parts[p].first);
          LBCC_ASSIGN_OR_RETURN(TensorView view, TensorView::Host(x.data() + parts[p].first, shape));
          codecs::TopKEfState state;
          LBCC_RETURN_IF_ERROR(state.Reset(shape));
          LBCC_ASSIGN_OR_RETURN(size_t max_bytes, topk_->MaxEncodedBytes(shape));
          std::vector<uint8_t>& payload = payloads[p * n + r];
          payload.resize(max_bytes);
          LBCC_ASSIGN_OR_RETURN(size_t size, topk_->Encode(view, &state, absl::MakeSpan(payload)));
          payload.resize(size);
        }
      }
      for (size_t p = 0; p < parts.size(); ++p) {
        const Shape shape = ShapeFor(parts[p].second - parts[p].first);
        std::vector<absl::Span<const uint8_t>> spans;
        for (int r = 0; r < n; ++r) spans.push_back(payloads[p * n + r]);
        LBCC_ASSIGN_OR_RETURN(TensorView out,
                              TensorView::Host(expected_.data() + parts[p].first, shape));
        LBCC_RETURN_IF_ERROR(codecs::DecodeAccumulate(
            spans, {codecs::Aggregation::kSparseLoCoMean, false}, out));
      }
    }
    // #wrong: values that differ from the reference; error: relative L2 vs the dense mean.
    v->check = [this, count] {
      int64_t wrong = 0;
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (FloatBits(output_[i]) != FloatBits(expected_[i])) ++wrong;
        diff += (output_[i] - dense_mean_[i]) * (output_[i] - dense_mean_[i]);
        norm += dense_mean_[i] * dense_mean_[i];
      }
      return std::make_pair(wrong, norm > 0 ? std::sqrt(diff / norm) : 0.0);
    };
    return true;
  }

  Communicator& comm_;
  const Settings& s_;
  std::vector<uint8_t> a_, b_;  // Dense operations: input and output bytes.
  AlignedVector<float> input_, output_, expected_;
  std::vector<double> dense_mean_;
  std::unique_ptr<codecs::TopKEfCodec> topk_;
  std::unique_ptr<codecs::DenseQuantCodec> dense_;
  std::vector<std::unique_ptr<codecs::TopKEfState>> states_;
  std::vector<Communicator::SparseTensor> tensors_;
};

// ---- Launch and report ------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Communicator>> Connect(const Settings& s) {
  LBCC_ASSIGN_OR_RETURN(comm::FabricOptions options, comm::FabricOptionsFromEnv());
  if (s.timeout_s > 0) options.timeout = absl::Seconds(s.timeout_s);
  if (!s.topology.empty()) {
    LBCC_ASSIGN_OR_RETURN(options.topology, comm::Topology::FromFile(s.topology));
  }
  const char* id_hex = std::getenv(kChildId);
  if (id_hex == nullptr) return Communicator::InitFromEnvironment(std::move(options));
  const std::string bytes = absl::HexStringToBytes(id_hex);
  if (bytes.size() != sizeof(comm::UniqueId)) return absl::InvalidArgumentError("bad LBCCPERF_ID");
  comm::UniqueId id;
  std::memcpy(&id, bytes.data(), sizeof(id));
  return Communicator::Init(id, std::atoi(std::getenv(kChildSize)), std::atoi(std::getenv(kChildRank)),
                            std::move(options));
}

int Spawn(int nranks, char** argv) {
  absl::StatusOr<comm::FabricOptions> options = comm::FabricOptionsFromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "lbcc_perf: %s\n", options.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<comm::UniqueId> id = comm::CreateUniqueId(options->listen_host, options->timeout);
  if (!id.ok()) {
    std::fprintf(stderr, "lbcc_perf: %s\n", id.status().ToString().c_str());
    return 1;
  }
  const std::string hex = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(&*id), sizeof(*id)));
  std::fflush(stdout);
  std::vector<pid_t> children;
  for (int rank = 0; rank < nranks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("lbcc_perf: fork");
      return 1;
    }
    if (pid == 0) {
      setenv(kChildRank, absl::StrCat(rank).c_str(), 1);
      setenv(kChildSize, absl::StrCat(nranks).c_str(), 1);
      setenv(kChildId, hex.c_str(), 1);
      execv("/proc/self/exe", argv);
      std::perror("lbcc_perf: exec");
      _exit(127);
    }
    children.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, code);
  }
  return worst;
}

// nccl-tests' time column: 7 characters, fewer decimals as it grows.
std::string TimeText(double seconds) {
  const double us = seconds * 1e6;
  if (us >= 10000.0) return absl::StrFormat("%7.0f", us);
  if (us >= 100.0) return absl::StrFormat("%7.1f", us);
  return absl::StrFormat("%7.2f", us);
}

std::string ResultText(const Measure& m) {
  if (!m.run) return absl::StrFormat("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
  if (m.wrong < 0) {
    return absl::StrFormat("  %7s  %6.2f  %6.2f  %5s", TimeText(m.seconds), m.algbw, m.busbw, "N/A");
  }
  return absl::StrFormat("  %7s  %6.2f  %6.2f  %5g", TimeText(m.seconds), m.algbw, m.busbw,
                         static_cast<double>(m.wrong));
}

nlohmann::json MeasureJson(const Measure& m) {
  if (!m.run) return nullptr;
  return {{"seconds", m.seconds}, {"algbw_gbps", m.algbw}, {"busbw_gbps", m.busbw},
          {"wrong", m.wrong}};
}

int Run(const Settings& s) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Connect(s);
  if (!comm.ok()) {
    std::fprintf(stderr, "lbcc_perf: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const bool leader = (*comm)->rank() == 0;
  const int n = (*comm)->nranks();
  if (s.op == Op::kBroadcast && s.root >= n) {
    if (leader) std::fprintf(stderr, "lbcc_perf: -r %d: the job has %d ranks\n", s.root, n);
    return 2;
  }
  // nccl-tests' "Using devices" lines: one per rank (ranks are processes on host memory).
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string mine = absl::StrFormat("%d %s", static_cast<int>(getpid()), host);
  std::vector<std::string> everyone;
  if (absl::Status st = (*comm)->AllGatherV(&mine, &everyone)->Wait(); !st.ok()) {
    std::fprintf(stderr, "lbcc_perf: %s\n", st.ToString().c_str());
    return 1;
  }
  std::vector<int64_t> sizes;
  for (int64_t b = std::max<int64_t>(s.min_bytes, 1); b <= s.max_bytes;
       b = s.step_factor > 1 ? b * s.step_factor : b + s.step_bytes) {
    sizes.push_back(b);
  }
  if (leader) {
    std::printf("# nThread 1 nGpus 1 minBytes %lld maxBytes %lld step: %lld(%s) warmup iters: %d "
                "iters: %d agg iters: 1 validation: %d graph: 0\n",
                static_cast<long long>(s.min_bytes), static_cast<long long>(s.max_bytes),
                static_cast<long long>(s.step_factor > 1 ? s.step_factor : s.step_bytes),
                s.step_factor > 1 ? "factor" : "bytes", s.warmup, s.iters, s.check);
    if (s.blocking) std::printf("# Blocking Enabled: a barrier after each collective\n");
    std::printf("#\n# LBCC lbcc_perf: op %s, %d ranks (one per process), algorithm %s\n",
                s.op_name.c_str(), n, s.algo_name.c_str());
    std::printf("# topology %s\n", (*comm)->topology().ToJson().c_str());
    if (s.op == Op::kSparseAllReduce) {
      std::printf("# top_k %g per 4096, values %s, indices %s, %d tensor(s); algbw/busbw are "
                  "dense-equivalent (all-reduce formula over the dense bytes)\n",
                  s.topk.top_k, absl::GetFlag(FLAGS_values).c_str(),
                  absl::GetFlag(FLAGS_indices).c_str(), s.tensors);
      std::printf("# #wrong: values unlike the codec's host round trip (bound 0); error: relative "
                  "L2 vs the dense mean\n");
    } else if (s.op == Op::kSendRecvCompressed) {
      std::printf("# dense_quant int8 absmax, rank r -> r+1; #wrong: values unlike the codec's "
                  "host round trip (bound 0); error: max abs vs the sent values; no in-place\n");
    } else {
      std::printf("# inputs are small integers: #wrong counts values off the exact result (sum, "
                  "copies) or by more than 2 ulp (avg); error: max abs\n");
    }
    if (s.lbcc_columns) {
      std::printf("# LBCC columns (out-of-place): wire = bytes rank 0 received per operation, "
                  "ratio = dense/wire, fast/slow = rank 0's bytes per link class, slow_all = "
                  "every rank's slow-link bytes\n");
    }
    std::printf("#\n# Using devices\n");
    for (int r = 0; r < n; ++r) {
      int pid = 0;
      char name[256] = {0};
      std::sscanf(everyone[r].c_str(), "%d %255s", &pid, name);
      std::printf("#  Rank %2d Group  0 Pid %6d on %10s device  - [host] CPU memory\n", r, pid,
                  name);
    }
    std::printf("#\n");
    std::string meta = absl::StrFormat(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ",
        "", "", "", "", "");
    std::string names = absl::StrFormat(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s", "size", "count",
        "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
        "#wrong");
    std::string units = absl::StrFormat(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s", "(B)",
        "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    if (s.lbcc_columns) {
      absl::StrAppendFormat(&names, "  %12s %8s %10s %12s %12s %12s", "wire", "ratio", "error",
                            "fast", "slow", "slow_all");
      absl::StrAppendFormat(&units, "  %12s %8s %10s %12s %12s %12s", "(B)", "", "", "(B)", "(B)",
                            "(B)");
    }
    std::printf("%s\n%s\n%s\n", meta.c_str(), names.c_str(), units.c_str());
    std::fflush(stdout);
  }

  Bench bench(**comm, s);
  nlohmann::json rows = nlohmann::json::array();
  int failed_tests = 0;
  double bw_sum = 0;
  int bw_count = 0;
  int index = 0;
  for (DType dtype : s.dtypes) {
    for (const RedOp& redop : s.redops) {
      for (int64_t size : sizes) {
        ++index;
        Case c{s.op, dtype, redop};
        const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
        c.count = s.op == Op::kAllGather ? size / (elem * n) : size / elem;
        c.bytes = s.op == Op::kAllGather ? c.count * elem * n : c.count * elem;
        c.root = s.op == Op::kBroadcast ? s.root : -1;
        if (c.count == 0) continue;  // Below one element per rank.
        if (leader && !s.quiet) {
          std::fprintf(stderr, "# [%d] %s %s %lld bytes...\n", index, s.op_name.c_str(),
                       TypeNameOf(dtype), static_cast<long long>(c.bytes));
        }
        absl::StatusOr<Measure> out_of_place = bench.Run(c, false);
        absl::StatusOr<Measure> in_place =
            out_of_place.ok() ? bench.Run(c, true) : absl::StatusOr<Measure>(out_of_place.status());
        if (!in_place.ok()) {
          std::fprintf(stderr, "lbcc_perf: rank %d: %s\n", (*comm)->rank(),
                       in_place.status().ToString().c_str());
          return 1;
        }
        for (const Measure* m : {&*out_of_place, &*in_place}) {
          if (!m->run) continue;
          if (m->wrong > 0) ++failed_tests;
          bw_sum += m->busbw;
          ++bw_count;
        }
        if (!leader) continue;
        const Measure& o = *out_of_place;
        const double wire = o.fast_bytes + o.slow_bytes;
        const double ratio = wire > 0 ? bench.DenseReceived(c) / wire : 0;
        std::string line = absl::StrFormat("%12lld  %12lld  %8s  %6s  %6d", static_cast<long long>(c.bytes),
                                           static_cast<long long>(c.count), TypeNameOf(dtype),
                                           redop.name, c.root);
        line += ResultText(o) + ResultText(*in_place);
        if (s.lbcc_columns) {
          absl::StrAppendFormat(&line, "  %12.0f %8.2f %10s %12.0f %12.0f %12.0f", wire, ratio,
                                o.error < 0 ? "N/A" : absl::StrFormat("%.3g", o.error), o.fast_bytes,
                                o.slow_bytes, o.slow_total);
        }
        std::printf("%s\n", line.c_str());
        nlohmann::json profile = nullptr;
        if (absl::GetFlag(FLAGS_profile) && !o.profile.empty()) {
          profile = nlohmann::json::array();
          std::printf("#  profile per call (ms):  rank");
          for (const char* f : kProfileFields) std::printf(" %9s", f);
          std::printf("\n");
          for (size_t r = 0; r < o.profile.size(); ++r) {
            std::printf("#                          %4zu", r);
            nlohmann::json row = {{"rank", r}};
            for (int f = 0; f < kProfileCount; ++f) {
              std::printf(" %9.3f", o.profile[r][f] * 1e3);
              row[kProfileFields[f]] = o.profile[r][f];
            }
            std::printf("\n");
            profile.push_back(row);
          }
        }
        std::fflush(stdout);
        rows.push_back({{"op", s.op_name},
                        {"ranks", n},
                        {"type", TypeNameOf(dtype)},
                        {"redop", redop.name},
                        {"root", c.root},
                        {"bytes", c.bytes},
                        {"count", c.count},
                        {"seconds", o.seconds},
                        {"algbw_gbps", o.algbw},
                        {"busbw_gbps", o.busbw},
                        {"wrong", o.wrong},
                        {"in_place", MeasureJson(*in_place)},
                        {"wire_recv_bytes", wire},
                        {"compression_ratio", ratio},
                        {"error", o.error},
                        {"fast_recv_bytes", o.fast_bytes},
                        {"slow_recv_bytes", o.slow_bytes},
                        {"fast_recv_bytes_all_ranks", o.fast_total},
                        {"slow_recv_bytes_all_ranks", o.slow_total},
                        {"profile", profile}});
      }
    }
  }
  const double avg_bw = bw_count > 0 ? bw_sum / bw_count : 0;
  const char* min_bw_env = std::getenv("NCCL_TESTS_MIN_BW");
  const double min_bw = min_bw_env != nullptr ? std::atof(min_bw_env) : -1;
  const bool bw_failed = min_bw >= 0 && avg_bw < min_bw * 0.9;
  if (leader) {
    std::printf("# Out of bounds values : %d %s\n", failed_tests, failed_tests ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g %s\n", avg_bw,
                min_bw < 0 ? "" : (bw_failed ? "FAILED" : "OK"));
    std::printf("#\n");
    std::fflush(stdout);
    if (!s.json.empty()) std::ofstream(s.json) << rows.dump(2) << "\n";
  }
  return failed_tests > 0 || bw_failed ? 1 : 0;
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  setlinebuf(stdout);
  const lbcc::cli::Parsed parsed =
      lbcc::cli::ParseOrExit(argc, argv, lbcc::kUsage, "bench/lbcc_perf.cc");
  if (const std::string secret_file = absl::GetFlag(FLAGS_job_secret_file); !secret_file.empty()) {
    setenv("LBCC_JOB_SECRET_FILE", secret_file.c_str(), 1);  // Spawned ranks inherit it.
  }
  absl::StatusOr<lbcc::Settings> settings = lbcc::Resolve(parsed);
  if (!settings.ok()) {
    std::fprintf(stderr, "lbcc_perf: %s (see --help)\n",
                 std::string(settings.status().message()).c_str());
    return 2;
  }
  if (settings->local > 0 && std::getenv(lbcc::kChildId) == nullptr) {
    return lbcc::Spawn(settings->local, argv);
  }
  return lbcc::Run(*settings);
}
