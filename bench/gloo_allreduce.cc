// The peer for LBCC's dense and sparse all-reduce figures: Gloo's dense ring all-reduce (what
// torch.distributed's Gloo backend runs for CPU tensors) of one fp32 tensor, timed the way
// lbcc_perf times its operations (warm-up, then the mean of --iters back-to-back calls).
//
//   gloo_allreduce --rank R --size N --store DIR --addr IP [--bytes 16M] [--iters 3]
//                  [--algorithm ring|bcube] [--json FILE]
//
// Ranks meet through a Gloo FileStore in DIR (a directory every rank can see: the testbed's
// namespaces share the file system) and connect over TCP from --addr. Rank 0 prints one line and
// writes {"seconds": ..., "bytes": ..., "algorithm": ...} to --json.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "nlohmann/json.hpp"
#include "tools/cli.h"

ABSL_FLAG(int, rank, -1, "this rank (0-based)");
ABSL_FLAG(int, size, 0, "number of ranks");
ABSL_FLAG(std::string, store, "", "rendezvous directory shared by every rank (empty per run)");
ABSL_FLAG(std::string, addr, "127.0.0.1", "address to connect from (this host's)");
ABSL_FLAG(std::string, bytes, "16M", "tensor size in bytes (K, M, G suffixes)");
ABSL_FLAG(int, iters, 3, "timed iterations");
ABSL_FLAG(int, warmup, 1, "untimed iterations");
ABSL_FLAG(std::string, algorithm, "ring", "ring or bcube");
ABSL_FLAG(int, timeout_s, 120, "Gloo timeout per operation");
ABSL_FLAG(std::string, json, "", "rank 0 writes the result here");

namespace {

bool ParseBytes(std::string text, int64_t* out) {
  int64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': scale = int64_t{1} << 10; break;
      case 'M': case 'm': scale = int64_t{1} << 20; break;
      case 'G': case 'g': scale = int64_t{1} << 30; break;
      default: break;
    }
    if (scale != 1) text.pop_back();
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value <= 0) return false;
  *out = value * scale;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const lbcc::cli::Parsed parsed = lbcc::cli::ParseOrExit(
      argc, argv,
      "Gloo dense fp32 all-reduce, the peer of lbcc_perf's figures.\n"
      "  gloo_allreduce --rank R --size N --store DIR --addr IP [--bytes 16M] [--iters 3]",
      "bench/gloo_allreduce.cc");
  if (!parsed.positional.empty()) {
    std::fprintf(stderr, "gloo_allreduce: unexpected argument '%s'\n", parsed.positional[0].c_str());
    return 2;
  }
  const int rank = absl::GetFlag(FLAGS_rank), size = absl::GetFlag(FLAGS_size);
  int64_t bytes = 0;
  if (size < 1 || rank < 0 || rank >= size || absl::GetFlag(FLAGS_store).empty() ||
      !ParseBytes(absl::GetFlag(FLAGS_bytes), &bytes)) {
    std::fprintf(stderr, "gloo_allreduce: need --rank in [0, --size), --store and a valid --bytes "
                         "(see --help)\n");
    return 2;
  }
  const std::string algorithm = absl::GetFlag(FLAGS_algorithm);
  if (algorithm != "ring" && algorithm != "bcube") {
    std::fprintf(stderr, "gloo_allreduce: --algorithm must be ring or bcube\n");
    return 2;
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = absl::GetFlag(FLAGS_addr);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(absl::GetFlag(FLAGS_store));
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    const auto timeout = std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s));
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);

    const size_t count = static_cast<size_t>(bytes / 4);
    std::vector<float> data(count);
    auto run = [&] {
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i + rank) % 97) * 0.01f;
      gloo::AllreduceOptions opts(context);
      opts.setOutput(data.data(), count);
      opts.setAlgorithm(algorithm == "ring" ? gloo::AllreduceOptions::Algorithm::RING
                                            : gloo::AllreduceOptions::Algorithm::BCUBE);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTimeout(timeout);
      gloo::allreduce(opts);
    };
    for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) run();
    // The reset of `data` is part of every call; time it separately and take it out.
    const absl::Time fill_start = absl::Now();
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i + rank) % 97) * 0.01f;
    const double fill = absl::ToDoubleSeconds(absl::Now() - fill_start);
    const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
    const absl::Time start = absl::Now();
    for (int i = 0; i < iters; ++i) run();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start) / iters - fill;
    // Check the last result: the sum over ranks of each rank's fill.
    for (size_t i = 0; i < count; i += 4099) {
      float expect = 0;
      for (int r = 0; r < size; ++r) expect += static_cast<float>((i + r) % 97) * 0.01f;
      if (std::abs(data[i] - expect) > 1e-3f * std::max(1.0f, std::abs(expect))) {
        std::fprintf(stderr, "gloo_allreduce: wrong sum at %zu: %g vs %g\n", i, data[i], expect);
        return 1;
      }
    }
    if (rank == 0) {
      std::printf("gloo %s allreduce: %d ranks, %lld bytes fp32, %.4f s\n", algorithm.c_str(), size,
                  static_cast<long long>(count * 4), seconds);
      if (!absl::GetFlag(FLAGS_json).empty()) {
        nlohmann::json j = {{"seconds", seconds},
                            {"bytes", count * 4},
                            {"ranks", size},
                            {"algorithm", algorithm}};
        std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump() << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
