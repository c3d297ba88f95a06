#include "comm/sparseloco.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lbcc::comm {

// One posted exchange: its deltas and aggregates belong to the operation until it finished.
struct SparseLoCo::Exchange {
  size_t fragment = 0;
  int64_t due = 0;  // the inner step whose Step() merges it
  std::vector<std::vector<float>> deltas, aggregates;
  RequestPtr request;
  absl::Status status;

  absl::Status Wait() {
    if (request != nullptr) {
      status = request->Wait();
      request.reset();
    }
    return status;
  }
};

std::vector<std::pair<size_t, size_t>> FragmentRanges(const std::vector<size_t>& sizes,
                                                      int fragments) {
  double total = 0;
  for (size_t n : sizes) total += static_cast<double>(n);
  std::vector<std::pair<size_t, size_t>> ranges;
  size_t begin = 0;
  double acc = 0;
  for (int f = 0; f < fragments; ++f) {
    size_t end = begin + 1;
    acc += static_cast<double>(sizes[begin]);
    const double target = total * (f + 1) / fragments;
    const size_t left = sizes.size() - static_cast<size_t>(fragments - f - 1);  // one each later
    while (end < left && acc + static_cast<double>(sizes[end]) / 2 <= target) {
      acc += static_cast<double>(sizes[end]);
      ++end;
    }
    if (f == fragments - 1) end = sizes.size();
    ranges.emplace_back(begin, end);
    begin = end;
  }
  return ranges;
}

absl::StatusOr<std::unique_ptr<SparseLoCo>> SparseLoCo::Create(Communicator* comm,
                                                               std::vector<TensorView> params,
                                                               const SparseLoCoOptions& options) {
  auto invalid = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("SparseLoCo: ", why));
  };
  if (comm == nullptr) return invalid("null communicator");
  if (params.empty()) return invalid("no parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].is_host() || params[i].dtype() != DType::kF32) {
      return invalid(absl::StrCat("parameter ", i, " (", params[i].DebugString(),
                                  ") must be a host f32 tensor"));
    }
  }
  const int h = options.inner_steps;
  if (h < 1) return invalid(absl::StrCat("inner_steps ", h, " must be >= 1"));
  const bool streaming = options.overlap == OuterOverlap::kStreaming;
  if (options.fragments < 1 || options.fragments > static_cast<int>(params.size())) {
    return invalid(absl::StrCat("fragments ", options.fragments, " must be in [1, ",
                                params.size(), "] (the number of tensors)"));
  }
  if (options.fragments > 1 && !streaming) {
    return invalid("fragments > 1 needs overlap kStreaming");
  }
  int delay = options.delay;
  if (options.overlap == OuterOverlap::kNone) {
    if (delay != 0) return invalid("delay needs an overlap (kDelayed or kStreaming)");
  } else {
    if (delay == 0) delay = streaming ? std::max(1, h / options.fragments) : h;
    if (delay < 1 || delay > h) {
      return invalid(absl::StrCat("delay ", delay, " must be in [1, inner_steps ", h, "]"));
    }
  }
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::TopKEfCodec> codec,
                        codecs::TopKEfCodec::Create(options.codec));
  if (options.sync_initial) {
    for (const TensorView& p : params) LBCC_RETURN_IF_ERROR(comm->Broadcast(p, 0)->Wait());
  }
  std::unique_ptr<SparseLoCo> outer(
      new SparseLoCo(comm, std::move(params), options, std::move(codec)));
  outer->delay_ = delay;
  return outer;
}

SparseLoCo::SparseLoCo(Communicator* comm, std::vector<TensorView> params,
                       const SparseLoCoOptions& options,
                       std::unique_ptr<codecs::TopKEfCodec> codec)
    : comm_(comm), params_(std::move(params)), options_(options), codec_(std::move(codec)) {
  std::vector<size_t> sizes;
  for (const TensorView& p : params_) {
    const float* data = p.data_as<float>();
    const size_t n = static_cast<size_t>(p.num_elements());
    outer_.emplace_back(data, data + n);
    start_.emplace_back(data, data + n);
    states_.push_back(codec_->NewState());
    sizes.push_back(n);
  }
  fragments_ = FragmentRanges(sizes, options_.fragments);
}

SparseLoCo::~SparseLoCo() { Drain(); }

void SparseLoCo::Drain() {
  for (std::unique_ptr<Exchange>& e : pending_) (void)e->Wait();
}

const codecs::TopKEfState& SparseLoCo::error_feedback(size_t i) {
  Drain();
  return static_cast<const codecs::TopKEfState&>(*states_[i]);
}

absl::Status SparseLoCo::Step() {
  ++step_;
  const int64_t h = options_.inner_steps;
  if (options_.overlap == OuterOverlap::kNone) {
    return step_ % h == 0 ? BlockingOuterStep() : absl::OkStatus();
  }
  // The deltas of the rounds ending here first, then the merges due here, then the posts.
  const int64_t nfrag = static_cast<int64_t>(fragments_.size());
  std::vector<std::unique_ptr<Exchange>> posts;
  for (int64_t f = 0; f < nfrag; ++f) {
    const int64_t offset = f * h / nfrag;
    if (step_ >= offset && (step_ - offset) % h == 0) posts.push_back(TakeDeltas(f));
  }
  while (!pending_.empty() && pending_.front()->due <= step_) {
    std::unique_ptr<Exchange> e = std::move(pending_.front());
    pending_.pop_front();
    // A failed exchange is dropped by every replica; this step's posts do not go out (their
    // progress stays in the next deltas: `start` did not move).
    LBCC_RETURN_IF_ERROR(Merge(std::move(e)));
  }
  for (std::unique_ptr<Exchange>& e : posts) {
    Post(*e);
    pending_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status SparseLoCo::Flush() {
  while (!pending_.empty()) {
    std::unique_ptr<Exchange> e = std::move(pending_.front());
    pending_.pop_front();
    LBCC_RETURN_IF_ERROR(Merge(std::move(e)));
  }
  return absl::OkStatus();
}

absl::Status SparseLoCo::BlockingOuterStep() {
  Exchange e;
  std::vector<Communicator::SparseTensor> tensors;
  for (size_t i = 0; i < params_.size(); ++i) {
    const float* p = params_[i].data_as<float>();
    std::vector<float>& delta = e.deltas.emplace_back(outer_[i].size());
    for (size_t j = 0; j < delta.size(); ++j) delta[j] = outer_[i][j] - p[j];
    e.aggregates.emplace_back(delta.size());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    tensors.push_back({*TensorView::Host(e.deltas[i].data(), params_[i].shape()),
                       *TensorView::Host(e.aggregates[i].data(), params_[i].shape()),
                       states_[i].get()});
  }
  codecs::DecodeOptions decode;
  decode.aggregation = options_.aggregation;
  LBCC_RETURN_IF_ERROR(comm_->SparseAllReduce(std::move(tensors), codec_.get(), decode)->Wait());
  for (size_t i = 0; i < params_.size(); ++i) {
    ApplyAggregate(i, e.aggregates[i]);
    std::memcpy(params_[i].data_as<float>(), outer_[i].data(), outer_[i].size() * sizeof(float));
  }
  ++posted_;
  ++merged_;
  return absl::OkStatus();
}

std::unique_ptr<SparseLoCo::Exchange> SparseLoCo::TakeDeltas(size_t fragment) {
  auto e = std::make_unique<Exchange>();
  e->fragment = fragment;
  for (size_t i = fragments_[fragment].first; i < fragments_[fragment].second; ++i) {
    const float* p = params_[i].data_as<float>();
    std::vector<float>& delta = e->deltas.emplace_back(start_[i].size());
    for (size_t j = 0; j < delta.size(); ++j) delta[j] = start_[i][j] - p[j];
    e->aggregates.emplace_back(delta.size());
  }
  return e;
}

void SparseLoCo::Post(Exchange& e) {
  std::vector<Communicator::SparseTensor> tensors;
  const size_t begin = fragments_[e.fragment].first;
  for (size_t k = 0; k < e.deltas.size(); ++k) {
    const size_t i = begin + k;
    tensors.push_back({*TensorView::Host(e.deltas[k].data(), params_[i].shape()),
                       *TensorView::Host(e.aggregates[k].data(), params_[i].shape()),
                       states_[i].get()});
    const float* p = params_[i].data_as<float>();
    std::copy(p, p + start_[i].size(), start_[i].begin());  // start = theta_local
  }
  codecs::DecodeOptions decode;
  decode.aggregation = options_.aggregation;
  e.due = step_ + delay_;
  e.request = comm_->SparseAllReduce(std::move(tensors), codec_.get(), decode);
  ++posted_;
}

absl::Status SparseLoCo::Merge(std::unique_ptr<Exchange> e) {
  LBCC_RETURN_IF_ERROR(e->Wait());
  const size_t begin = fragments_[e->fragment].first;
  for (size_t k = 0; k < e->aggregates.size(); ++k) {
    const size_t i = begin + k;
    ApplyAggregate(i, e->aggregates[k]);
    float* p = params_[i].data_as<float>();
    for (size_t j = 0; j < outer_[i].size(); ++j) {
      p[j] = outer_[i][j] + (p[j] - start_[i][j]);  // theta_global + progress since the post
    }
    start_[i] = outer_[i];
  }
  ++merged_;
  return absl::OkStatus();
}

void SparseLoCo::ApplyAggregate(size_t i, const std::vector<float>& g) {
  const float lr = options_.codec.lr;
  std::vector<float>& o = outer_[i];
  if (options_.weight_decay != 0) {
    const float keep = 1.0f - lr * options_.weight_decay;
    for (float& x : o) x *= keep;
  }
  for (size_t j = 0; j < o.size(); ++j) {
    if (options_.sign) {
      o[j] -= (g[j] > 0 ? lr : (g[j] < 0 ? -lr : 0.0f));
    } else {
      o[j] -= g[j];
    }
  }
}

}  // namespace lbcc::comm
