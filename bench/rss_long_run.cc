// rss_long_run: the process's resident memory over a long run of collectives (issue 19 item 2).
//
//   rss_long_run --op allreduce --calls 1000000 --every 50000
//   rss_long_run --op sparse_allreduce --calls 100000 --every 5000
//
// Four ranks run as threads of this process over the loopback transport (comm/testing.h), each
// with its own Communicator; every rank posts `--calls` operations: 8-byte (2 x f32)
// all-reduces, or sparse all-reduces of one 64 x 64 tensor with top-k 64 and error feedback.
// Every `--every` calls rank 0 prints "calls rss_kib live_tags" (VmRSS from /proc/self/status,
// and the transport's per-tag entries on rank 0's links); the last line is "# growth_kib N"
// (RSS at the end minus RSS after the first sample, the warm-up); live_tags counts the send
// side of rank 0's links (Fabric::Counters). bench/rss_long_run.sh runs
// both and writes bench/results/rss.md.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/testing.h"

ABSL_FLAG(std::string, op, "allreduce", "allreduce or sparse_allreduce");
ABSL_FLAG(int64_t, calls, 1000000, "operations per rank");
ABSL_FLAG(int64_t, every, 50000, "sample every this many calls");
ABSL_FLAG(int, ranks, 4, "ranks (threads)");

namespace lbcc {
namespace {

int64_t RssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kib = 0;
      std::string number = line.substr(6);
      number.erase(0, number.find_first_not_of(" \t"));
      number = number.substr(0, number.find(' '));
      if (absl::SimpleAtoi(number, &kib)) return kib;
    }
  }
  return -1;
}

uint64_t LiveTags(comm::Communicator& comm) {
  uint64_t tags = 0;
  for (int peer = 0; peer < comm.nranks(); ++peer) {
    if (peer != comm.rank()) tags += comm.fabric()->Counters(peer).live_tags;
  }
  return tags;
}

int Run() {
  const std::string op = absl::GetFlag(FLAGS_op);
  const int64_t calls = absl::GetFlag(FLAGS_calls), every = absl::GetFlag(FLAGS_every);
  if ((op != "allreduce" && op != "sparse_allreduce") || calls <= 0 || every <= 0) {
    std::cerr << "rss_long_run: --op allreduce|sparse_allreduce, --calls and --every > 0\n";
    return 2;
  }
  codecs::TopKEfOptions topk;
  topk.top_k = 64;
  auto codec = codecs::TopKEfCodec::Create(topk);
  if (!codec.ok()) {
    std::cerr << codec.status() << "\n";
    return 1;
  }
  comm::testing::RankOptions options;
  options.timeout = absl::Seconds(120);
  int64_t first_rss = -1, last_rss = -1;
  std::cout << "# op " << op << ", " << absl::GetFlag(FLAGS_ranks) << " ranks (threads, loopback), "
            << calls << " calls\n# calls rss_kib live_tags\n";
  auto results = comm::testing::RunRanks(
      absl::GetFlag(FLAGS_ranks), options,
      [&](int rank, comm::Communicator& comm) -> absl::Status {
        std::vector<float> x(2, 1.0f), delta(4096), out(4096);
        for (size_t i = 0; i < delta.size(); ++i) delta[i] = static_cast<float>((i * 37 + rank) % 101) - 50;
        codecs::TopKEfState state;
        auto v = *TensorView::Host(x.data(), {2});
        std::vector<comm::Communicator::SparseTensor> tensors = {
            {*TensorView::Host(delta.data(), {64, 64}), *TensorView::Host(out.data(), {64, 64}),
             &state}};
        for (int64_t call = 1; call <= calls; ++call) {
          if (op == "allreduce") {
            x[0] = x[1] = 1.0f;
            LBCC_RETURN_IF_ERROR(comm.AllReduce(v, v, comm::ReduceOp::kSum)->Wait());
          } else {
            LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(tensors, codec->get())->Wait());
          }
          if (rank == 0 && call % every == 0) {
            last_rss = RssKib();
            if (first_rss < 0) first_rss = last_rss;
            std::cout << call << " " << last_rss << " " << LiveTags(comm) << std::endl;
          }
        }
        return absl::OkStatus();
      });
  for (const absl::Status& s : results) {
    if (!s.ok()) {
      std::cerr << "rss_long_run: " << s << "\n";
      return 1;
    }
  }
  std::cout << "# growth_kib " << (last_rss - first_rss) << "\n";
  return 0;
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return lbcc::Run();
}
