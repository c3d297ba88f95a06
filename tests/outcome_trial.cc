// One rank of the outcome trials (tests/outcome_trials.sh): runs SparseAllReduce steps over UCX
// until one fails or --steps are done, and prints one line per step on stdout, flushed:
//
//   STEP <k> COMMIT <xxh3 of the output>      the step succeeded: state committed, output written
//   STEP <k> ABORT <code> <message>           it failed: state kept, output untouched
//   STEP <k> BROKEN <what>                     it failed but left the state or output half done
//
// The driver kills, stops or cuts one rank at a random moment and compares the survivors' last
// lines. Uses only the public Communicator API, so the same file builds on any branch.
//
// Environment: RANK, WORLD_SIZE, LBCC_BOOTSTRAP_ADDR (rank 0 starts the root), LBCC_* as usual.
// Flags: --steps N (default 1000000).
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "base/status_macros.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"

namespace lbcc {
namespace {

const std::vector<Shape> kShapes = {{128, 512}, {4096}};

absl::Status Run(int64_t steps) {
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> comm,
                        comm::Communicator::InitFromEnvironment(comm::CommConfig()));
  const int rank = comm->rank();
  std::printf("READY %d\n", rank);
  std::fflush(stdout);
  codecs::TopKEfOptions options;
  options.top_k = 256;
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::TopKEfCodec> codec,
                        codecs::TopKEfCodec::Create(options));
  const size_t n = kShapes.size();
  std::vector<std::vector<float>> deltas(n), outs(n);
  std::vector<codecs::TopKEfState> states(n);
  std::mt19937 rng(rank + 1);
  std::normal_distribution<float> normal(0, 1);
  for (int64_t step = 1; step <= steps; ++step) {
    std::vector<comm::Communicator::SparseTensor> tensors;
    std::vector<std::vector<float>> memory(n), before(n);
    for (size_t t = 0; t < n; ++t) {
      deltas[t].resize(*NumElements(kShapes[t]));
      for (float& x : deltas[t]) x = normal(rng);
      outs[t].assign(deltas[t].size(), -1.0f);
      before[t] = outs[t];
      memory[t].assign(states[t].error().begin(), states[t].error().end());
      LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(deltas[t].data(), kShapes[t]));
      LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Host(outs[t].data(), kShapes[t]));
      tensors.push_back({in, out, &states[t]});
    }
    const absl::Status status = comm->SparseAllReduce(tensors, codec.get())->Wait();
    int written = 0, changed = 0, pending = 0;
    uint64_t hash = 0;
    for (size_t t = 0; t < n; ++t) {
      written += outs[t] != before[t];
      // A state's first encode sizes its memory (zeros) even when the step then aborts.
      const auto error = states[t].error();
      if (memory[t].empty()) {
        changed += std::any_of(error.begin(), error.end(), [](float x) { return x != 0; });
      } else {
        changed += memory[t].size() != error.size() ||
                   std::memcmp(memory[t].data(), error.data(), memory[t].size() * 4) != 0;
      }
      pending += states[t].has_pending();
      hash ^= XXH3_64bits(outs[t].data(), outs[t].size() * 4) + t;
    }
    if (status.ok() && written == static_cast<int>(n) && changed == static_cast<int>(n) &&
        pending == 0) {
      std::printf("STEP %lld COMMIT %016llx\n", static_cast<long long>(step),
                  static_cast<unsigned long long>(hash));
    } else if (!status.ok() && written == 0 && changed == 0 && pending == 0) {
      std::string message(status.message().substr(0, 300));
      for (char& c : message) {
        if (c == '\n') c = ' ';
      }
      std::printf("STEP %lld ABORT %d %s\n", static_cast<long long>(step),
                  static_cast<int>(status.code()), message.c_str());
    } else {
      std::printf("STEP %lld BROKEN status=%d written=%d changed=%d pending=%d\n",
                  static_cast<long long>(step), static_cast<int>(status.code()), written, changed,
                  pending);
    }
    std::fflush(stdout);
    if (!status.ok()) break;
  }
  return absl::OkStatus();  // The communicator says goodbye as it is destroyed.
}

}  // namespace
}  // namespace lbcc

int main(int argc, char** argv) {
  int64_t steps = 1000000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && !absl::SimpleAtoi(argv[i + 1], &steps)) {
      std::fprintf(stderr, "--steps wants a number, got '%s'\n", argv[i + 1]);
      return 2;
    }
  }
  const absl::Status status = lbcc::Run(steps);
  if (!status.ok()) {
    std::printf("INIT_FAILED %d %s\n", static_cast<int>(status.code()),
                std::string(status.message()).c_str());
    std::fflush(stdout);
    return 1;
  }
  std::printf("DONE\n");
  std::fflush(stdout);
  return 0;
}
