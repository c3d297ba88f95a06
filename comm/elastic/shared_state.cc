#include "comm/elastic/shared_state.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace lbcc::comm::elastic {
namespace {

constexpr uint32_t kStateTag = 0x5e1a;       // shared-state transfer (Send/Recv)
constexpr uint32_t kForwardTag = 0x5e1b;     // a step's result to members whose exchange failed
constexpr uint32_t kStateMagic = 0x5453424c;  // "LBST"

// Header of a transfer: what follows on the same tag.
struct StateHeader {
  uint32_t magic = kStateMagic;
  uint32_t compressed = 0;  // 1: zstd frame
  uint64_t raw_bytes = 0;
  uint64_t wire_bytes = 0;
  uint64_t hash = 0;
};

// Sends `header` and then `body` to `peer` on `tag`.
absl::Status SendFramed(Communicator& comm, const StateHeader& header, const std::string& body,
                        int peer, uint32_t tag, absl::Duration timeout) {
  RequestPtr h = comm.Send(&header, sizeof(header), peer, tag);
  RequestPtr b = comm.Send(body.data(), body.size(), peer, tag);
  LBCC_RETURN_IF_ERROR(WaitOrAbort(comm, h, timeout));
  return WaitOrAbort(comm, b, timeout);
}

}  // namespace

// One member's view of the shared state, exchanged before a transfer.
struct SharedState::Record {
  uint8_t synced = 0;
  uint64_t hash = 0;
  uint64_t bytes = 0;
};

absl::Status WaitOrAbort(Communicator& comm, const RequestPtr& request, absl::Duration timeout) {
  absl::Status s = request->WaitFor(timeout);
  if (absl::IsDeadlineExceeded(s)) {
    comm.Abort();
    return request->Wait();
  }
  return s;
}

SharedState::SharedState(std::vector<TensorView> views, absl::Duration op_timeout)
    : views_(std::move(views)), op_timeout_(op_timeout) {
  for (const TensorView& t : views_) bytes_ += t.num_bytes();
}

absl::Status SharedState::Check() const {
  for (size_t i = 0; i < views_.size(); ++i) {
    if (!views_[i].is_host() || (views_[i].data() == nullptr && views_[i].num_bytes() > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ElasticGroup: shared state tensor ", i, " is not host memory"));
    }
  }
  return absl::OkStatus();
}

uint64_t SharedState::Hash() const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const TensorView& t : views_) XXH3_64bits_update(st, t.data(), t.num_bytes());
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

absl::StatusOr<std::vector<SharedState::Record>> SharedState::GatherRecords(Communicator& comm,
                                                                            bool synced) {
  Record mine{static_cast<uint8_t>(synced), Hash(), bytes_};
  std::string mine_bytes(reinterpret_cast<const char*>(&mine), sizeof(mine));
  std::vector<std::string> all;
  OpOptions op;
  op.timeout = op_timeout_;
  LBCC_RETURN_IF_ERROR(comm.AllGatherV(&mine_bytes, &all, op)->Wait());
  std::vector<Record> records(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != sizeof(Record)) {
      return absl::DataLossError(
          absl::StrCat("ElasticGroup: rank ", r, " sent a bad state record"));
    }
    std::memcpy(&records[r], all[r].data(), sizeof(Record));
  }
  return records;
}

absl::StatusOr<StateTraffic> SharedState::Sync(Communicator& comm, int rank,
                                               const std::vector<uint32_t>& needs) {
  const bool synced =
      std::find(needs.begin(), needs.end(), static_cast<uint32_t>(rank)) == needs.end();
  LBCC_ASSIGN_OR_RETURN(const std::vector<Record> records, GatherRecords(comm, synced));
  int reference = -1;
  for (size_t r = 0; r < records.size() && reference < 0; ++r) {
    if (records[r].synced) reference = static_cast<int>(r);
  }
  if (reference < 0) {
    return absl::FailedPreconditionError(
        "ElasticGroup: no member of the epoch holds the shared state");
  }
  const Record& ref = records[reference];
  for (size_t r = 0; r < records.size(); ++r) {
    if (records[r].synced && (records[r].hash != ref.hash || records[r].bytes != ref.bytes)) {
      return absl::DataLossError(absl::StrFormat(
          "ElasticGroup: the members' shared states differ: rank %d has %d bytes of XXH3 "
          "%016x, rank %d %d bytes of XXH3 %016x",
          reference, ref.bytes, ref.hash, r, records[r].bytes, records[r].hash));
    }
  }
  if (ref.bytes != bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticGroup: the job's shared state is ", ref.bytes, " bytes, this member's ", bytes_));
  }
  // The topology is the connections', by global rank: a derived epoch's ranks differ.
  auto link = [&](int a, int b) {
    return comm.topology().link(comm.global_ranks()[a], comm.global_ranks()[b]);
  };
  StateTraffic traffic;
  for (uint32_t j : needs) {
    if (records[j].hash == ref.hash && records[j].bytes == ref.bytes) continue;  // up to date
    if (records[j].bytes != ref.bytes) continue;  // j fails by itself (InvalidArgument)
    // The source: a holder on a fast link to j if there is one, then the lowest rank.
    int source = -1;
    for (size_t r = 0; r < records.size(); ++r) {
      if (!records[r].synced) continue;
      if (source < 0 || (link(static_cast<int>(r), j) == LinkClass::kFast &&
                         link(source, j) != LinkClass::kFast)) {
        source = static_cast<int>(r);
      }
    }
    if (rank == source) {
      const bool slow = link(source, j) == LinkClass::kSlow;
      LBCC_ASSIGN_OR_RETURN(uint64_t n, Send(comm, static_cast<int>(j), slow, ref.hash));
      traffic.sent += n;
    } else if (rank == static_cast<int>(j)) {
      LBCC_ASSIGN_OR_RETURN(uint64_t n, Receive(comm, source, ref.hash));
      traffic.received += n;
    }
  }
  return traffic;
}

absl::StatusOr<uint64_t> SharedState::Send(Communicator& comm, int peer, bool slow,
                                           uint64_t hash) {
  std::string raw;
  raw.reserve(bytes_);
  for (const TensorView& t : views_) raw.append(static_cast<const char*>(t.data()), t.num_bytes());
  StateHeader header;
  header.raw_bytes = raw.size();
  header.hash = hash;
  std::string body;
  if (slow && !raw.empty()) {
    body.resize(ZSTD_compressBound(raw.size()));
    const size_t n = ZSTD_compress(body.data(), body.size(), raw.data(), raw.size(), 3);
    if (!ZSTD_isError(n) && n < raw.size()) {
      body.resize(n);
      header.compressed = 1;
    }
  }
  if (!header.compressed) body.swap(raw);
  header.wire_bytes = body.size();
  LBCC_RETURN_IF_ERROR(SendFramed(comm, header, body, peer, kStateTag, op_timeout_));
  return sizeof(header) + body.size();
}

absl::StatusOr<uint64_t> SharedState::Receive(Communicator& comm, int source, uint64_t hash) {
  StateHeader header;
  LBCC_RETURN_IF_ERROR(WaitOrAbort(
      comm, comm.Recv(&header, sizeof(header), source, kStateTag), op_timeout_));
  if (header.magic != kStateMagic || header.raw_bytes != bytes_ ||
      header.wire_bytes > std::max<uint64_t>(ZSTD_compressBound(bytes_), bytes_) ||
      header.hash != hash) {
    return absl::DataLossError(
        absl::StrCat("ElasticGroup: bad shared-state header from rank ", source));
  }
  std::string body(header.wire_bytes, '\0');
  LBCC_RETURN_IF_ERROR(WaitOrAbort(
      comm, comm.Recv(body.data(), body.size(), source, kStateTag), op_timeout_));
  std::string raw;
  if (header.compressed) {
    raw.resize(header.raw_bytes);
    const size_t n = ZSTD_decompress(raw.data(), raw.size(), body.data(), body.size());
    if (ZSTD_isError(n) || n != raw.size()) {
      return absl::DataLossError(absl::StrCat("ElasticGroup: the shared state from rank ",
                                              source, " does not decompress"));
    }
  } else {
    raw.swap(body);
  }
  const uint64_t got = XXH3_64bits(raw.data(), raw.size());
  if (got != hash) {
    return absl::DataLossError(absl::StrFormat(
        "ElasticGroup: the shared state from rank %d hashes to %016x, every member's is %016x",
        source, got, hash));
  }
  size_t at = 0;
  for (const TensorView& t : views_) {
    std::memcpy(t.data(), raw.data() + at, t.num_bytes());
    at += t.num_bytes();
  }
  return sizeof(header) + header.wire_bytes;
}

absl::Status SendResult(Communicator& comm, const std::string& result,
                        const std::vector<uint32_t>& to, absl::Duration op_timeout) {
  StateHeader header;
  header.raw_bytes = header.wire_bytes = result.size();
  header.hash = XXH3_64bits(result.data(), result.size());
  for (uint32_t r : to) {
    LBCC_RETURN_IF_ERROR(
        SendFramed(comm, header, result, static_cast<int>(r), kForwardTag, op_timeout));
  }
  return absl::OkStatus();
}

absl::Status ReceiveResult(Communicator& comm, int source, uint64_t step,
                           const std::vector<TensorView>& outs, absl::Duration op_timeout) {
  uint64_t bytes = 0;
  for (const TensorView& t : outs) bytes += t.num_bytes();
  StateHeader header;
  LBCC_RETURN_IF_ERROR(WaitOrAbort(
      comm, comm.Recv(&header, sizeof(header), source, kForwardTag), op_timeout));
  if (header.magic != kStateMagic || header.raw_bytes != bytes || header.wire_bytes != bytes) {
    return absl::DataLossError(absl::StrCat("ElasticGroup: bad forwarded result of step ", step,
                                            " from rank ", source));
  }
  std::string body(bytes, '\0');
  LBCC_RETURN_IF_ERROR(WaitOrAbort(
      comm, comm.Recv(body.data(), body.size(), source, kForwardTag), op_timeout));
  if (XXH3_64bits(body.data(), body.size()) != header.hash) {
    return absl::DataLossError(absl::StrCat("ElasticGroup: the forwarded result of step ", step,
                                            " does not match its hash"));
  }
  size_t at = 0;
  for (const TensorView& t : outs) {
    std::memcpy(t.data(), body.data() + at, t.num_bytes());
    at += t.num_bytes();
  }
  return absl::OkStatus();
}

}  // namespace lbcc::comm::elastic
