// TokenBucket: pacing of a slow link to a configured rate.
//
// Tokens are bytes. The bucket refills at `rate` bytes per second up to `capacity` and starts
// full, so over any interval of length T at most capacity + rate * T bytes are taken. Time is a
// parameter, which makes the arithmetic testable with a fake clock.
//
// Thread-safety: none; the owner (a Link) guards it with its mutex.
#ifndef LBCC_TRANSPORT_TOKEN_BUCKET_H_
#define LBCC_TRANSPORT_TOKEN_BUCKET_H_

#include "absl/time/time.h"

namespace lbcc::transport {

class TokenBucket {
 public:
  // `rate_bytes_per_second` > 0; `capacity_bytes` >= the largest single Take.
  TokenBucket(double rate_bytes_per_second, double capacity_bytes, absl::Time now);

  // Takes `bytes` tokens and returns true when the bucket holds that many at `now`. Otherwise takes
  // nothing, sets `*ready_at` to the earliest time at which it will, and returns false. A request
  // larger than the capacity is treated as a request for the full capacity.
  bool TryTake(double bytes, absl::Time now, absl::Time* ready_at);

  // Changes the rate and capacity from `now` on; tokens earned so far stay (up to the new
  // capacity).
  void Reconfigure(double rate_bytes_per_second, double capacity_bytes, absl::Time now);

  double rate() const { return rate_; }
  double capacity() const { return capacity_; }
  // Tokens at `now` (refills first).
  double Available(absl::Time now);

 private:
  void Refill(absl::Time now);

  double rate_;
  double capacity_;
  double tokens_;
  absl::Time last_;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_TOKEN_BUCKET_H_
