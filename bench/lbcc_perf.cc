// lbcc_perf: LBCC's collective performance tool, in the manner of nccl-tests.
//
// Runs one operation over a sweep of sizes and prints, per size: dense bytes and elements, time
// per operation, algorithm bandwidth (dense bytes / time), bus bandwidth, the bytes each rank
// received on the wire, the compression ratio (dense bytes / wire bytes), the error against a
// dense reference computed from every rank's (deterministic) input, and the bytes per link
// class. Launch it:
//   lbcc_perf --local 4 --op sparse_allreduce                 spawns 4 ranks itself
//   mpirun -np 4 -x LBCC_BOOTSTRAP_ADDR=h:p lbcc_perf ...     Open MPI's environment
//   RANK=i WORLD_SIZE=n MASTER_ADDR=h MASTER_PORT=p lbcc_perf ...   torchrun-style
// or inside tools/testbed, one `tools/testbed exec <host>` per rank with LBCC_LISTEN_ADDR set to
// the host's address.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/aligned.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, op, "sparse_allreduce",
          "operation: sparse_allreduce, allreduce, allgather or sendrecv_compressed");
ABSL_FLAG(std::string, min_bytes, "64K", "smallest dense message size (bytes; K, M, G suffixes)");
ABSL_FLAG(std::string, max_bytes, "16M", "largest dense message size");
ABSL_FLAG(int, step_factor, 4, "multiply the size by this between steps");
ABSL_FLAG(int, iters, 5, "timed iterations per size");
ABSL_FLAG(int, warmup, 1, "untimed iterations per size");
ABSL_FLAG(int, local, 0, "spawn this many ranks as processes on this machine (0: launcher env)");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file (rank 0)");
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
ABSL_FLAG(bool, quiet, false, "no progress lines on stderr");

namespace lbcc {
namespace {

using comm::Communicator;

constexpr char kChildRank[] = "LBCCPERF_RANK";  // Set by --local for its children.
constexpr char kChildSize[] = "LBCCPERF_NRANKS";
constexpr char kChildId[] = "LBCCPERF_ID";

// Every rank's input is a function of (rank, size): any rank can compute the reference. Inputs
// and outputs are 64-byte aligned, as a framework's tensors are.
AlignedVector<float> InputOf(int rank, int64_t count) {
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

struct Row {
  int64_t bytes = 0, count = 0;
  double seconds = 0, algbw = 0, busbw = 0;
  double wire_recv = 0, ratio = 0, error = 0;
  double fast_bytes = 0, slow_bytes = 0;    // Received by this rank (rank 0 prints).
  double fast_total = 0, slow_total = 0;    // Received by all ranks together.
};

absl::StatusOr<codecs::ValueCoding> ParseValues(const std::string& name) {
  for (codecs::ValueCoding v :
       {codecs::ValueCoding::kBinMean2, codecs::ValueCoding::kBinMean4,
        codecs::ValueCoding::kBinMean8, codecs::ValueCoding::kBf16, codecs::ValueCoding::kF16,
        codecs::ValueCoding::kF32}) {
    if (name == codecs::ValueCodingName(v)) return v;
  }
  return absl::InvalidArgumentError(absl::StrCat("--values: unknown coding '", name, "'"));
}

absl::StatusOr<codecs::IndexCoding> ParseIndices(const std::string& name) {
  for (codecs::IndexCoding c : {codecs::IndexCoding::kAuto, codecs::IndexCoding::kPacked12,
                                codecs::IndexCoding::kAdaptive}) {
    if (name == codecs::IndexCodingName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("--indices: unknown coding '", name, "'"));
}

// One size of one operation. `iteration` runs the op once; `check` computes the error of the
// last result against the reference.
absl::StatusOr<Row> RunSize(Communicator& comm, const std::string& op, int64_t bytes,
                            comm::Algorithm algorithm) {
  const int n = comm.nranks();
  const int me = comm.rank();
  const int64_t count = bytes / 4;
  Row row;
  row.bytes = count * 4;
  row.count = count;
  AlignedVector<float> input = InputOf(me, count);
  AlignedVector<float> output;
  std::function<absl::Status()> iteration;
  std::function<double()> error;
  double bus_factor = 1;

  std::unique_ptr<codecs::TopKEfCodec> topk;
  std::unique_ptr<codecs::DenseQuantCodec> dense;
  std::vector<std::unique_ptr<codecs::TopKEfState>> states;
  if (op == "sparse_allreduce") {
    codecs::TopKEfOptions options;
    options.top_k = absl::GetFlag(FLAGS_top_k);
    LBCC_ASSIGN_OR_RETURN(options.values, ParseValues(absl::GetFlag(FLAGS_values)));
    LBCC_ASSIGN_OR_RETURN(options.indices, ParseIndices(absl::GetFlag(FLAGS_indices)));
    LBCC_ASSIGN_OR_RETURN(topk, codecs::TopKEfCodec::Create(options));
    output.resize(count);
    // `--tensors` equal parts (the last takes the remainder), each with its own state.
    const int parts = std::max<int64_t>(1, std::min<int64_t>(absl::GetFlag(FLAGS_tensors), count));
    for (int p = 0; p < parts; ++p) states.push_back(std::make_unique<codecs::TopKEfState>());
    std::vector<Communicator::SparseTensor> tensors;
    for (int p = 0; p < parts; ++p) {
      const int64_t begin = count / parts * p;
      const int64_t end = p + 1 == parts ? count : count / parts * (p + 1);
      const Shape shape = ShapeFor(end - begin);
      LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(input.data() + begin, shape));
      LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(output.data() + begin, shape));
      tensors.push_back({in, out, states[p].get()});
    }
    iteration = [&, tensors] {
      comm::OpOptions op = Communicator::BulkOptions();
      op.algorithm = algorithm;
      return comm
          .SparseAllReduce(tensors, topk.get(), {codecs::Aggregation::kSparseLoCoMean, false}, op)
          ->Wait();
    };
    // Relative L2 error of the aggregate against the dense mean (first exchange, fresh state).
    error = [&] {
      std::vector<double> mean(count, 0.0);
      for (int r = 0; r < n; ++r) {
        const AlignedVector<float> x = InputOf(r, count);
        for (int64_t i = 0; i < count; ++i) mean[i] += x[i] / n;
      }
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < count; ++i) {
        diff += (output[i] - mean[i]) * (output[i] - mean[i]);
        norm += mean[i] * mean[i];
      }
      return norm > 0 ? std::sqrt(diff / norm) : 0.0;
    };
  } else if (op == "allreduce") {
    output.resize(count);
    bus_factor = 2.0 * (n - 1) / n;
    LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(input.data(), {count}));
    LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(output.data(), {count}));
    iteration = [&, in, out] { return comm.AllReduce(in, out, comm::ReduceOp::kSum)->Wait(); };
    error = [&] {
      std::vector<double> sum(count, 0.0);
      for (int r = 0; r < n; ++r) {
        const AlignedVector<float> x = InputOf(r, count);
        for (int64_t i = 0; i < count; ++i) sum[i] += x[i];
      }
      double worst = 0;
      for (int64_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(output[i] - sum[i]));
      return worst;
    };
  } else if (op == "allgather") {
    output.resize(count * n);
    bus_factor = static_cast<double>(n - 1) / n;
    LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(input.data(), {count}));
    LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(output.data(), {count * n}));
    iteration = [&, in, out] { return comm.AllGather(in, out)->Wait(); };
    error = [&] {
      double worst = 0;
      for (int r = 0; r < n; ++r) {
        const AlignedVector<float> x = InputOf(r, count);
        for (int64_t i = 0; i < count; ++i) {
          worst = std::max(worst, static_cast<double>(std::fabs(output[r * count + i] - x[i])));
        }
      }
      return worst;
    };
  } else if (op == "sendrecv_compressed") {
    // A ring of pipeline boundaries: rank r sends to r+1 and receives from r-1 (int8 absmax).
    LBCC_ASSIGN_OR_RETURN(dense, codecs::DenseQuantCodec::Create({}));
    output.resize(count);
    LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(input.data(), {count}));
    LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(output.data(), {count}));
    iteration = [&, in, out] {
      comm::RequestPtr recv = comm.RecvCompressed(out, (me + n - 1) % n, 7);
      comm::RequestPtr send = comm.SendCompressed(in, dense.get(), nullptr, (me + 1) % n, 7);
      LBCC_RETURN_IF_ERROR(send->Wait());
      return recv->Wait();
    };
    error = [&] {
      const AlignedVector<float> x = InputOf((me + n - 1) % n, count);
      double worst = 0;
      for (int64_t i = 0; i < count; ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(output[i] - x[i])));
      }
      return worst;
    };
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--op: unknown operation '", op, "'"));
  }

  // First run with a fresh state gives the error; further warm-ups are untimed.
  LBCC_RETURN_IF_ERROR(iteration());
  row.error = error();
  for (int i = 1; i < absl::GetFlag(FLAGS_warmup); ++i) LBCC_RETURN_IF_ERROR(iteration());
  LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
  const comm::Fabric::ClassBytes before = comm.fabric()->BytesByClass();
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  const absl::Time start = absl::Now();
  for (int i = 0; i < iters; ++i) LBCC_RETURN_IF_ERROR(iteration());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start) / iters;
  const comm::Fabric::ClassBytes after = comm.fabric()->BytesByClass();
  row.seconds = seconds;
  row.fast_bytes = static_cast<double>(after.fast_received - before.fast_received) / iters;
  row.slow_bytes = static_cast<double>(after.slow_received - before.slow_received) / iters;
  row.wire_recv = row.fast_bytes + row.slow_bytes;
  // Job-wide link-class bytes: every rank's received bytes, summed (AllGather of int64 pairs).
  int64_t mine[2] = {static_cast<int64_t>(row.fast_bytes), static_cast<int64_t>(row.slow_bytes)};
  std::vector<int64_t> all(2 * n);
  LBCC_ASSIGN_OR_RETURN(TensorView mine_view, TensorView::Create(mine, DType::kI64, {2}));
  LBCC_ASSIGN_OR_RETURN(TensorView all_view, TensorView::Create(all.data(), DType::kI64, {2 * n}));
  LBCC_RETURN_IF_ERROR(comm.AllGather(mine_view, all_view)->Wait());
  for (int r = 0; r < n; ++r) {
    row.fast_total += static_cast<double>(all[2 * r]);
    row.slow_total += static_cast<double>(all[2 * r + 1]);
  }
  row.algbw = row.bytes / seconds / 1e9;
  row.busbw = op == "sparse_allreduce" ? row.wire_recv / seconds / 1e9 : row.algbw * bus_factor;
  // Dense bytes a rank would receive for the same operation, over what it received.
  const double dense_recv = op == "allreduce"   ? row.bytes * 2.0 * (n - 1) / n
                            : op == "sendrecv_compressed" ? row.bytes
                                                          : static_cast<double>(row.bytes) * (n - 1);
  row.ratio = row.wire_recv > 0 ? dense_recv / row.wire_recv : 0;
  return row;
}

absl::StatusOr<std::unique_ptr<Communicator>> Connect() {
  LBCC_ASSIGN_OR_RETURN(comm::FabricOptions options, comm::FabricOptionsFromEnv());
  if (!absl::GetFlag(FLAGS_topology).empty()) {
    LBCC_ASSIGN_OR_RETURN(options.topology, comm::Topology::FromFile(absl::GetFlag(FLAGS_topology)));
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

int Run() {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Connect();
  if (!comm.ok()) {
    std::fprintf(stderr, "lbcc_perf: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const std::string op = absl::GetFlag(FLAGS_op);
  absl::StatusOr<comm::Algorithm> algorithm = comm::ParseAlgorithm(absl::GetFlag(FLAGS_algo));
  absl::StatusOr<int64_t> min_bytes = env::ParseBytes(absl::GetFlag(FLAGS_min_bytes));
  absl::StatusOr<int64_t> max_bytes = env::ParseBytes(absl::GetFlag(FLAGS_max_bytes));
  if (!algorithm.ok() || !min_bytes.ok() || !max_bytes.ok() || *min_bytes < 4 ||
      *max_bytes < *min_bytes || absl::GetFlag(FLAGS_step_factor) < 2) {
    std::fprintf(stderr, "lbcc_perf: bad --algo, --min_bytes, --max_bytes or --step_factor\n");
    return 2;
  }
  const bool leader = (*comm)->rank() == 0;
  const int n = (*comm)->nranks();
  std::vector<int64_t> sizes;
  for (int64_t b = *min_bytes; b <= *max_bytes; b *= absl::GetFlag(FLAGS_step_factor)) {
    sizes.push_back(b);
  }
  if (leader) {
    std::printf("# lbcc_perf: op %s, %d ranks, algorithm %s, iters %d, warmup %d\n", op.c_str(), n,
                absl::GetFlag(FLAGS_algo).c_str(), absl::GetFlag(FLAGS_iters),
                absl::GetFlag(FLAGS_warmup));
    std::printf("# topology %s\n", (*comm)->topology().ToJson().c_str());
    if (op == "sparse_allreduce") {
      std::printf("# top_k %g per 4096, values %s, indices %s; error = relative L2 vs dense mean\n",
                  absl::GetFlag(FLAGS_top_k), absl::GetFlag(FLAGS_values).c_str(),
                  absl::GetFlag(FLAGS_indices).c_str());
    } else {
      std::printf("# error = max abs vs dense reference\n");
    }
    std::printf("# wire/fast/slow: bytes rank 0 received per operation; slow_all: every rank's "
                "slow-link bytes\n");
    std::printf("%12s %12s %12s %10s %10s %14s %9s %10s %14s %14s %14s\n", "size(B)", "count",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wire_recv(B)", "ratio", "error",
                "fast_recv(B)", "slow_recv(B)", "slow_all(B)");
  }
  nlohmann::json rows = nlohmann::json::array();
  int index = 0;
  for (int64_t bytes : sizes) {
    ++index;
    if (leader && !absl::GetFlag(FLAGS_quiet)) {
      std::fprintf(stderr, "# [%d/%zu] %s %lld bytes...\n", index, sizes.size(), op.c_str(),
                   static_cast<long long>(bytes));
    }
    absl::StatusOr<Row> row = RunSize(**comm, op, bytes, *algorithm);
    if (!row.ok()) {
      std::fprintf(stderr, "lbcc_perf: rank %d: %s\n", (*comm)->rank(),
                   row.status().ToString().c_str());
      return 1;
    }
    if (leader) {
      std::printf("%12lld %12lld %12.1f %10.3f %10.3f %14.0f %9.1f %10.3g %14.0f %14.0f %14.0f\n",
                  static_cast<long long>(row->bytes), static_cast<long long>(row->count),
                  row->seconds * 1e6, row->algbw, row->busbw, row->wire_recv, row->ratio,
                  row->error, row->fast_bytes, row->slow_bytes, row->slow_total);
      std::fflush(stdout);
      rows.push_back({{"op", op},
                      {"ranks", n},
                      {"bytes", row->bytes},
                      {"count", row->count},
                      {"seconds", row->seconds},
                      {"algbw_gbps", row->algbw},
                      {"busbw_gbps", row->busbw},
                      {"wire_recv_bytes", row->wire_recv},
                      {"compression_ratio", row->ratio},
                      {"error", row->error},
                      {"fast_recv_bytes", row->fast_bytes},
                      {"slow_recv_bytes", row->slow_bytes},
                      {"fast_recv_bytes_all_ranks", row->fast_total},
                      {"slow_recv_bytes_all_ranks", row->slow_total}});
    }
  }
  if (leader && !absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << rows.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "LBCC collective benchmark (nccl-tests style).\n"
      "  lbcc_perf --local 4 --op sparse_allreduce --min_bytes 1M --max_bytes 16M\n"
      "Launch with --local N, or under mpirun (LBCC_BOOTSTRAP_ADDR) or a torchrun-style "
      "environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).");
  absl::ParseCommandLine(argc, argv);
  const int local = absl::GetFlag(FLAGS_local);
  if (local > 0 && std::getenv("LBCCPERF_ID") == nullptr) return lbcc::Spawn(local, argv);
  return lbcc::Run();
}
