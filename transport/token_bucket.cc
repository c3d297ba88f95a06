#include "transport/token_bucket.h"

#include <algorithm>
#include <cmath>

namespace lbcc::transport {

TokenBucket::TokenBucket(double rate_bytes_per_second, double capacity_bytes, absl::Time now)
    : rate_(rate_bytes_per_second), capacity_(capacity_bytes), tokens_(capacity_bytes), last_(now) {}

void TokenBucket::Refill(absl::Time now) {
  if (now > last_) {
    tokens_ = std::min(capacity_, tokens_ + absl::ToDoubleSeconds(now - last_) * rate_);
    last_ = now;
  }
}

void TokenBucket::Reconfigure(double rate_bytes_per_second, double capacity_bytes,
                              absl::Time now) {
  Refill(now);
  rate_ = rate_bytes_per_second;
  capacity_ = capacity_bytes;
  tokens_ = std::min(tokens_, capacity_);
}

double TokenBucket::Available(absl::Time now) {
  Refill(now);
  return tokens_;
}

bool TokenBucket::TryTake(double bytes, absl::Time now, absl::Time* ready_at) {
  Refill(now);
  const double need = std::min(bytes, capacity_);
  if (tokens_ + 1e-6 >= need) {  // Tolerates rounding of the refill arithmetic.
    tokens_ -= need;
    return true;
  }
  // Round up to whole microseconds so that waking at *ready_at always finds enough tokens.
  const double wait_us = std::ceil((need - tokens_) / rate_ * 1e6);
  *ready_at = last_ + absl::Microseconds(wait_us);
  return false;
}

}  // namespace lbcc::transport
