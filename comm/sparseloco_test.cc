#include "comm/sparseloco.h"

#include <cmath>
#include <cstring>
#include <deque>
#include <ostream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::lbcc::comm::testing::RunRanks;
using ::testing::Each;

constexpr int kRanks = 3;
constexpr int kSteps = 40;
const std::vector<Shape> kShapes = {{64, 128}, {4096}, {96, 64}};

// A replica's model: one buffer per shape, filled the same on every rank (rank 0's values are
// broadcast anyway), and an inner step whose update depends on the rank, the step and the
// parameters themselves (so a merge changes the rest of the trajectory).
struct Model {
  std::vector<std::vector<float>> data;
  std::vector<TensorView> views;

  Model() {
    for (const Shape& shape : kShapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float>& v = data.emplace_back(n);
      for (int64_t j = 0; j < n; ++j) v[j] = std::sin(0.01f * static_cast<float>(j));
    }
    for (size_t i = 0; i < kShapes.size(); ++i) {
      views.push_back(*TensorView::Host(data[i].data(), kShapes[i]));
    }
  }
  void InnerStep(int rank, int step) {
    for (size_t i = 0; i < data.size(); ++i) {
      for (size_t j = 0; j < data[i].size(); ++j) {
        const float noise =
            static_cast<float>(static_cast<int>((j * 7919 + rank * 104729 + step * 1299709 + i) %
                                                2001) - 1000) * 1e-5f;
        data[i][j] -= 0.05f * (0.1f * data[i][j] + noise);
      }
    }
  }
};

// The overlap rule replayed by hand with blocking exchanges: each post's exchange runs at once
// and its aggregate is kept until the due step. SparseAllReduce's result does not depend on
// when it runs, so the replay must match the overlapped run bit for bit.
absl::Status Replay(Communicator& comm, int rank, const SparseLoCoOptions& o,
                    const std::vector<std::pair<size_t, size_t>>& fragments, int delay,
                    Model* model, std::vector<std::vector<float>>* outer,
                    std::vector<std::unique_ptr<codecs::CodecState>>* states) {
  LBCC_ASSIGN_OR_RETURN(auto codec, codecs::TopKEfCodec::Create(o.codec));
  const size_t n = kShapes.size();
  outer->assign(model->data.begin(), model->data.end());
  std::vector<std::vector<float>> start = *outer;
  states->clear();
  for (size_t i = 0; i < n; ++i) states->push_back(codec->NewState());
  struct Held {
    size_t fragment;
    int due;
    std::vector<std::vector<float>> g;
  };
  std::deque<Held> held;
  const int h = o.inner_steps, nfrag = static_cast<int>(fragments.size());
  auto merge = [&](Held& x) {
    for (size_t k = 0; k < x.g.size(); ++k) {
      const size_t i = fragments[x.fragment].first + k;
      for (size_t j = 0; j < x.g[k].size(); ++j) {
        (*outer)[i][j] -= x.g[k][j];
        model->data[i][j] = (*outer)[i][j] + (model->data[i][j] - start[i][j]);
      }
      start[i] = (*outer)[i];
    }
  };
  for (int s = 1; s <= kSteps; ++s) {
    model->InnerStep(rank, s - 1);
    std::vector<std::pair<size_t, std::vector<std::vector<float>>>> posts;
    for (int f = 0; f < nfrag; ++f) {
      const int offset = f * h / nfrag;
      if (s < offset || (s - offset) % h != 0) continue;
      std::vector<std::vector<float>> deltas;
      for (size_t i = fragments[f].first; i < fragments[f].second; ++i) {
        std::vector<float>& d = deltas.emplace_back(start[i].size());
        for (size_t j = 0; j < d.size(); ++j) d[j] = start[i][j] - model->data[i][j];
      }
      posts.emplace_back(f, std::move(deltas));
    }
    while (!held.empty() && held.front().due <= s) {
      merge(held.front());
      held.pop_front();
    }
    for (auto& [f, deltas] : posts) {
      Held x{f, s + delay, {}};
      std::vector<Communicator::SparseTensor> tensors;
      for (size_t k = 0; k < deltas.size(); ++k) x.g.emplace_back(deltas[k].size());
      for (size_t k = 0; k < deltas.size(); ++k) {
        const size_t i = fragments[f].first + k;
        tensors.push_back({*TensorView::Host(deltas[k].data(), kShapes[i]),
                           *TensorView::Host(x.g[k].data(), kShapes[i]), (*states)[i].get()});
        start[i] = model->data[i];
      }
      LBCC_RETURN_IF_ERROR(comm.SparseAllReduce(std::move(tensors), codec.get())->Wait());
      held.push_back(std::move(x));
    }
  }
  while (!held.empty()) {
    merge(held.front());
    held.pop_front();
  }
  return absl::OkStatus();
}

bool SameBits(const std::vector<float>& a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  const char* name;
  OuterOverlap overlap;
  int fragments;
  int delay;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SparseLoCoOverlapTest : public ::testing::TestWithParam<Case> {};

// Every replica's overlapped run equals the replay of the rule (parameters, outer parameters and
// error feedback, bit for bit), and the outer parameters are the same bits on every replica.
TEST_P(SparseLoCoOverlapTest, MatchesTheReplayAndKeepsReplicasIdentical) {
  const Case& c = GetParam();
  SparseLoCoOptions o;
  o.inner_steps = 8;
  o.overlap = c.overlap;
  o.fragments = c.fragments;
  o.delay = c.delay;
  Mutex mu;
  std::vector<std::vector<std::vector<float>>> outers(kRanks);
  auto results = RunRanks(kRanks, {}, [&](int rank, Communicator& comm) -> absl::Status {
    Model model;
    LBCC_ASSIGN_OR_RETURN(auto outer, SparseLoCo::Create(&comm, model.views, o));
    for (int s = 0; s < kSteps; ++s) {
      model.InnerStep(rank, s);
      LBCC_RETURN_IF_ERROR(outer->Step());
    }
    LBCC_RETURN_IF_ERROR(outer->Flush());
    if (outer->exchanges_posted() != outer->exchanges_merged() || outer->exchanges_posted() == 0) {
      return absl::InternalError(absl::StrCat("posted ", outer->exchanges_posted(), ", merged ",
                                              outer->exchanges_merged()));
    }
    Model replay;
    std::vector<std::vector<float>> replay_outer;
    std::vector<std::unique_ptr<codecs::CodecState>> replay_states;
    const int delay = c.delay != 0 ? c.delay
                                   : (c.overlap == OuterOverlap::kStreaming
                                          ? std::max(1, o.inner_steps / c.fragments)
                                          : o.inner_steps);
    LBCC_RETURN_IF_ERROR(Replay(comm, rank, o, outer->fragments(), delay, &replay, &replay_outer,
                                &replay_states));
    for (size_t i = 0; i < kShapes.size(); ++i) {
      const auto& ef = static_cast<const codecs::TopKEfState&>(*replay_states[i]);
      if (!SameBits(replay.data[i], model.data[i]) || !SameBits(replay_outer[i], outer->outer(i)) ||
          !SameBits(std::vector<float>(ef.error().begin(), ef.error().end()),
                    outer->error_feedback(i).error())) {
        return absl::InternalError(absl::StrCat("rank ", rank, " tensor ", i, " unlike the replay"));
      }
    }
    MutexLock lock(&mu);
    for (size_t i = 0; i < kShapes.size(); ++i) {
      outers[rank].emplace_back(outer->outer(i).begin(), outer->outer(i).end());
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  for (int r = 1; r < kRanks; ++r) {
    for (size_t i = 0; i < kShapes.size(); ++i) {
      EXPECT_TRUE(SameBits(outers[0][i], outers[r][i])) << "rank " << r << " tensor " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, SparseLoCoOverlapTest,
    ::testing::Values(Case{"delayed", OuterOverlap::kDelayed, 1, 0},
                      Case{"delayed_by_3", OuterOverlap::kDelayed, 1, 3},
                      Case{"streaming_2", OuterOverlap::kStreaming, 2, 0},
                      Case{"streaming_3", OuterOverlap::kStreaming, 3, 0}),
    [](const auto& info) { return std::string(info.param.name); });

// Without overlap: every H-th step is the blocking outer step, after which every replica's
// parameters are the outer parameters, the same bits everywhere.
TEST(SparseLoCoTest, BlockingStepsLeaveEveryReplicaOnTheOuterParameters) {
  SparseLoCoOptions o;
  o.inner_steps = 5;
  Mutex mu;
  std::vector<std::vector<float>> first(kRanks);
  auto results = RunRanks(kRanks, {}, [&](int rank, Communicator& comm) -> absl::Status {
    Model model;
    LBCC_ASSIGN_OR_RETURN(auto outer, SparseLoCo::Create(&comm, model.views, o));
    for (int s = 0; s < 15; ++s) {
      model.InnerStep(rank, s);
      LBCC_RETURN_IF_ERROR(outer->Step());
    }
    if (outer->exchanges_merged() != 3) return absl::InternalError("not 3 outer steps");
    for (size_t i = 0; i < kShapes.size(); ++i) {
      if (!SameBits(model.data[i], outer->outer(i))) {
        return absl::InternalError(absl::StrCat("rank ", rank, ": tensor ", i, " off the outer"));
      }
    }
    MutexLock lock(&mu);
    first[rank] = model.data[0];
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  EXPECT_EQ(first[0], first[1]);
  EXPECT_EQ(first[0], first[2]);
}

TEST(SparseLoCoTest, BadOptionsAreNamed) {
  auto results = RunRanks(1, {}, [&](int, Communicator& comm) -> absl::Status {
    Model model;
    SparseLoCoOptions o;
    o.fragments = 2;
    EXPECT_THAT(SparseLoCo::Create(&comm, model.views, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("kStreaming")));
    o.overlap = OuterOverlap::kStreaming;
    o.fragments = 4;
    EXPECT_THAT(SparseLoCo::Create(&comm, model.views, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("fragments 4")));
    o.fragments = 1;
    o.delay = 99;
    EXPECT_THAT(SparseLoCo::Create(&comm, model.views, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("delay 99")));
    EXPECT_THAT(SparseLoCo::Create(&comm, {}, {}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("no parameters")));
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(FragmentRangesTest, BalancesByElementsWithOneTensorEachAtLeast) {
  EXPECT_EQ(FragmentRanges({10, 10, 10, 10}, 2),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}}));
  EXPECT_EQ(FragmentRanges({100, 1, 1}, 3),
            (std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(FragmentRanges({5}, 1), (std::vector<std::pair<size_t, size_t>>{{0, 1}}));
}

}  // namespace
}  // namespace lbcc::comm
