#include "comm/signature.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "base/status_macros.h"

namespace lbcc::comm {
namespace {

using transport::Tag;

constexpr uint32_t kMagic = 0x4753424c;  // "LBSG" little-endian
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = kOperationHeaderBytes;
// Bounds a peer's first message (a header with data) and its error text or full signature.
constexpr size_t kMaxHeaderMessage = kHeaderBytes + kMaxHeaderData;

enum class Kind : uint8_t { kHash = 0, kRejected = 1, kFull = 2, kHashWithData = 3 };

struct Header {
  Kind kind = Kind::kHash;
  uint64_t sequence = 0;
  uint64_t hash = 0;
  std::string text;  // kRejected: the error; kFull: Signature::Serialize(); kHashWithData: empty
  size_t data_bytes = 0;  // kHashWithData: the bytes after the header
};

void PutHeader(char* out, Kind kind, uint64_t sequence, uint64_t hash) {
  const uint8_t version = kVersion, k = static_cast<uint8_t>(kind);
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, &kMagic, 4);
  std::memcpy(out + 4, &version, 1);
  std::memcpy(out + 5, &k, 1);
  std::memcpy(out + 8, &sequence, 8);
  std::memcpy(out + 16, &hash, 8);
}

std::string EncodeHeader(Kind kind, uint64_t sequence, uint64_t hash, absl::string_view text) {
  std::string out(kHeaderBytes, '\0');
  PutHeader(out.data(), kind, sequence, hash);
  out.append(text.data(), std::min(text.size(), kMaxHeaderMessage - kHeaderBytes));
  return out;
}

absl::StatusOr<Header> DecodeHeader(const std::string& bytes, int rank) {
  uint32_t magic = 0;
  uint8_t version = 0, kind = 0;
  if (bytes.size() >= kHeaderBytes) {
    std::memcpy(&magic, bytes.data(), 4);
    std::memcpy(&version, bytes.data() + 4, 1);
    std::memcpy(&kind, bytes.data() + 5, 1);
  }
  if (bytes.size() < kHeaderBytes || magic != kMagic || version != kVersion || kind > 3) {
    return absl::DataLossError(absl::StrCat("rank ", rank, " sent a malformed operation header (",
                                            bytes.size(), " bytes, version ", version, ")"));
  }
  Header h;
  h.kind = static_cast<Kind>(kind);
  std::memcpy(&h.sequence, bytes.data() + 8, 8);
  std::memcpy(&h.hash, bytes.data() + 16, 8);
  if (h.kind == Kind::kHashWithData) {
    h.data_bytes = bytes.size() - kHeaderBytes;  // the data stays where it is
  } else {
    h.text = bytes.substr(kHeaderBytes);
  }
  return h;
}

uint64_t Fnv(uint64_t h, absl::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

// One round: `message` to every peer of the group, every peer's message into in[i], at `tag`.
// Posted by PostRound, waited for by WaitRound: a peer that does not answer by `deadline` is
// named in the DeadlineExceeded (the Fabric is then aborted, so every rank fails fast); a
// transport failure aborts the Fabric too.
struct SignatureCheck::Round {
  Mutex mu;
  CondVar cv;
  int pending ABSL_GUARDED_BY(mu) = 0;
  std::vector<bool> received ABSL_GUARDED_BY(mu);
  absl::Status first_error ABSL_GUARDED_BY(mu);
  std::string message;          // this rank's, alive until every send completed
  std::vector<std::string> in;  // every peer's, written by the receives
};

namespace {

using Round = SignatureCheck::Round;

std::shared_ptr<Round> PostRound(const Group& group, Tag tag, std::string message) {
  auto state = std::make_shared<Round>();
  const int n = group.size();
  state->message = std::move(message);
  state->in.assign(n, std::string());
  {
    MutexLock lock(&state->mu);
    state->pending = 2 * (n - 1);
    state->received.assign(n, false);
    state->received[group.me] = true;
  }
  auto done = [state](absl::Status status) {
    MutexLock lock(&state->mu);
    if (!status.ok() && state->first_error.ok()) state->first_error = std::move(status);
    --state->pending;
    state->cv.SignalAll();
  };
  const absl::Span<const uint8_t> bytes(
      reinterpret_cast<const uint8_t*>(state->message.data()), state->message.size());
  for (int i = 0; i < n; ++i) {
    if (i == group.me) continue;
    const int peer = group.ranks[i];  // ranks are named by their number in the communicator
    std::string* into = &state->in[i];
    group.fabric->in(peer)->Recv(
        tag,
        [into](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
          if (size > kMaxHeaderMessage) {
            return absl::DataLossError(absl::StrCat("operation header of ", size, " bytes"));
          }
          into->resize(size);
          return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(into->data()), size);
        },
        [state, done, i](absl::StatusOr<size_t> size) {
          if (size.ok()) {
            MutexLock lock(&state->mu);
            state->received[i] = true;
          }
          done(Annotate(size.status(), absl::StrCat("receive from rank ", i)));
        });
    group.fabric->out(peer)->Send(tag, bytes, {transport::Priority::kHigh, /*control=*/true},
                                  [done, i](absl::Status status) {
                                    done(Annotate(status, absl::StrCat("send to rank ", i)));
                                  });
  }
  return state;
}

absl::Status WaitRound(const Group& group, Round& state, absl::Time deadline,
                       absl::string_view what) {
  const int n = group.size();
  absl::Status status;
  {
    MutexLock lock(&state.mu);
    while (state.pending > 0 && state.first_error.ok()) {
      if (state.cv.WaitWithDeadline(&state.mu, deadline) && state.pending > 0 &&
          state.first_error.ok()) {
        std::vector<int> silent;
        for (int i = 0; i < n; ++i) {
          if (!state.received[i]) silent.push_back(i);
        }
        status = absl::DeadlineExceededError(absl::StrCat(
            what, ": no answer from rank", silent.size() == 1 ? " " : "s ",
            absl::StrJoin(silent, ", "), " before the timeout (did it post this operation?)"));
        break;
      }
    }
    if (status.ok()) status = state.first_error;
  }
  if (!status.ok()) {
    // Fail fast everywhere; closing the endpoints completes what is pending here.
    group.fabric->Abort(status);
    MutexLock lock(&state.mu);
    while (state.pending > 0) state.cv.Wait(&state.mu);
  }
  return status;
}

// PostRound then WaitRound; every peer's message into (*in)[i].
absl::Status Exchange(const Group& group, Tag tag, const std::string& message,
                      std::vector<std::string>* in, absl::Time deadline, absl::string_view what) {
  std::shared_ptr<Round> round = PostRound(group, tag, message);
  absl::Status status = WaitRound(group, *round, deadline, what);
  *in = std::move(round->in);
  return status;
}

}  // namespace

Signature::Signature(absl::string_view op, std::shared_ptr<const Fields> settings,
                     uint64_t settings_hash)
    : settings_(std::move(settings)), settings_hash_(settings_hash) {
  op_fields_.reserve(8);
  op_fields_.emplace_back("op", std::string(op));
}

Signature& Signature::Add(absl::string_view name, absl::string_view value) {
  op_fields_.emplace_back(std::string(name), std::string(value));
  return *this;
}

Signature& Signature::Add(absl::string_view name, int64_t value) {
  return Add(name, absl::StrCat(value));
}

uint64_t Signature::HashFields(const Fields& fields, uint64_t seed) {
  uint64_t h = seed;
  for (const Field& f : fields) {
    h = Fnv(h, f.first);
    h = Fnv(h, absl::string_view("\0", 1));
    h = Fnv(h, f.second);
    h = Fnv(h, absl::string_view("\1", 1));
  }
  return h;
}

uint64_t Signature::Hash() const { return HashFields(op_fields_, settings_hash_); }

Signature::Fields Signature::AllFields() const {
  Fields all;
  if (settings_ != nullptr) all = *settings_;
  all.insert(all.end(), op_fields_.begin(), op_fields_.end());
  return all;
}

std::string Signature::Serialize() const {
  std::string out;
  for (const Field& f : AllFields()) {
    for (const std::string* s : {&f.first, &f.second}) {
      const uint32_t size = static_cast<uint32_t>(s->size());
      out.append(reinterpret_cast<const char*>(&size), 4);
      out += *s;
    }
  }
  return out;
}

absl::StatusOr<Signature::Fields> Signature::Parse(absl::string_view bytes) {
  Fields fields;
  size_t offset = 0;
  auto take = [&](std::string* into) {
    uint32_t size = 0;
    if (bytes.size() - offset < 4) return false;
    std::memcpy(&size, bytes.data() + offset, 4);
    offset += 4;
    if (bytes.size() - offset < size) return false;
    into->assign(bytes.data() + offset, size);
    offset += size;
    return true;
  };
  while (offset < bytes.size()) {
    Field f;
    if (!take(&f.first) || !take(&f.second)) {
      return absl::DataLossError("malformed operation signature");
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

void AddSparseAllReduceFields(Signature& signature, const codecs::Codec& codec,
                              const codecs::DecodeOptions& decode, int64_t group_elements,
                              Algorithm requested, const std::vector<const Shape*>& shapes) {
  std::string all;
  for (const Shape* shape : shapes) {
    absl::StrAppend(&all, all.empty() ? "[" : ", [", absl::StrJoin(*shape, "x"), "]");
  }
  signature.Add("codec", absl::StrCat(codec.name(), " ", codec.Describe()))
      .Add("aggregation", codecs::AggregationName(decode.aggregation))
      .Add("accumulate", decode.accumulate ? "true" : "false")
      .Add("sparse_group_elements", group_elements)
      .Add("algorithm", AlgorithmName(requested))
      .Add("tensors", static_cast<int64_t>(shapes.size()))
      .Add("shapes", all);
}

std::string DescribeMismatch(int rank_a, const Signature::Fields& a, int rank_b,
                             const Signature::Fields& b, uint64_t sequence) {
  auto find = [](const Signature::Fields& fields, const std::string& name) -> std::string {
    for (const auto& f : fields) {
      if (f.first == name) return f.second;
    }
    return "(none)";
  };
  auto op_of = [&](const Signature::Fields& fields) { return find(fields, "op"); };
  const std::string prefix =
      absl::StrCat("rank ", rank_a, " and rank ", rank_b, " disagree on op ", sequence, "'s ");
  // The operation itself first: its other fields mean nothing if it differs.
  if (op_of(a) != op_of(b)) {
    return absl::StrCat(prefix, "operation: ", op_of(a), " vs ", op_of(b));
  }
  std::vector<std::string> names;
  for (const auto& f : a) names.push_back(f.first);
  for (const auto& f : b) {
    if (find(a, f.first) == "(none)") names.push_back(f.first);
  }
  for (const std::string& name : names) {
    const std::string va = find(a, name), vb = find(b, name);
    if (va != vb) return absl::StrCat(prefix, name, ": ", va, " vs ", vb);
  }
  return absl::StrCat(prefix, "sequence number");
}

namespace {

// The verdict on every rank's first message of the operation (in[i]; in[me] unused, this rank's
// own header is `my_kind` with mine.Hash(), or an error contribution when `rejection` is not
// OK). It is a function of all ranks' headers, which every rank holds, so every rank reaches the
// same one. `data_bytes`: with kHashWithData, the size every matching peer's data must have.
absl::Status Verdict(const Group& group, Tag tag, uint64_t sequence, const Signature& mine,
                     uint64_t hash, const absl::Status& rejection, Kind my_kind,
                     size_t data_bytes, const std::vector<std::string>& in, absl::Time deadline,
                     const std::string& what) {
  const int n = group.size();
  std::vector<Header> headers(n);
  headers[group.me] = Header{rejection.ok() ? my_kind : Kind::kRejected, sequence, hash,
                             std::string(rejection.message()), data_bytes};
  for (int i = 0; i < n; ++i) {
    if (i == group.me) continue;
    absl::StatusOr<Header> h = DecodeHeader(in[i], i);
    if (!h.ok() || h->kind == Kind::kFull) {
      // A foreign or corrupt peer: its other messages cannot be trusted either.
      const absl::Status status =
          h.ok() ? absl::DataLossError(absl::StrCat("rank ", i,
                                                    " sent a full signature out of turn"))
                 : h.status();
      group.fabric->Abort(status);
      return Annotate(status, what);
    }
    headers[i] = *std::move(h);
  }
  if (!rejection.ok()) {
    return absl::Status(rejection.code(),
                        absl::StrCat(rejection.message(), " (", what,
                                     " fails on every rank; the communicator stays usable)"));
  }
  for (int i = 0; i < n; ++i) {
    if (headers[i].kind == Kind::kRejected) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank ", i, " rejected its arguments: ",
                       headers[i].text));
    }
  }
  // A bare header and a header with data never match: the ranks run different operations.
  bool same = true;
  for (int i = 0; i < n && same; ++i) {
    same = headers[i].sequence == sequence && headers[i].hash == hash &&
           headers[i].kind == my_kind;
  }
  if (same) {
    for (int i = 0; i < n; ++i) {
      if (my_kind == Kind::kHashWithData && headers[i].data_bytes != data_bytes) {
        const absl::Status status = absl::DataLossError(
            absl::StrCat("rank ", i, " sent ", headers[i].data_bytes, " bytes of data under a "
                         "matching header, this rank expects ", data_bytes));
        group.fabric->Abort(status);
        return Annotate(status, what);
      }
    }
    return absl::OkStatus();
  }
  // Every rank saw the same headers, so every rank is here: name the field.
  std::vector<std::string> full;
  LBCC_RETURN_IF_ERROR(Exchange(group, tag + kSignatureStep + 1,
                                EncodeHeader(Kind::kFull, sequence, hash, mine.Serialize()),
                                &full, deadline, what));
  std::vector<Signature::Fields> fields(n);
  std::vector<uint64_t> sequences(n, sequence);
  fields[group.me] = mine.AllFields();
  for (int i = 0; i < n; ++i) {
    if (i == group.me) continue;
    absl::StatusOr<Header> h = DecodeHeader(full[i], i);
    absl::StatusOr<Signature::Fields> parsed =
        h.ok() ? Signature::Parse(h->text) : absl::StatusOr<Signature::Fields>(h.status());
    if (!parsed.ok()) {
      group.fabric->Abort(parsed.status());
      return Annotate(parsed.status(), what);
    }
    fields[i] = *std::move(parsed);
    sequences[i] = h->sequence;
  }
  for (int i = 1; i < n; ++i) {
    if (headers[i].hash != headers[0].hash || sequences[i] != sequences[0]) {
      if (sequences[i] != sequences[0]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank 0 and rank ", i, " disagree on op ", sequence,
            "'s sequence number: ", sequences[0], " vs ", sequences[i]));
      }
      return absl::FailedPreconditionError(
          DescribeMismatch(0, fields[0], i, fields[i], sequence));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(what, ": signatures differ"));
}

}  // namespace

absl::Status CheckSignatures(const Group& group, Tag tag, uint64_t sequence,
                             const Signature& mine, const absl::Status& rejection,
                             absl::Time deadline) {
  const int n = group.size();
  if (n == 1) return rejection;
#ifdef LBCC_MEASURE_WITHOUT_HEADER
  (void)tag;
  (void)sequence;
  (void)mine;
  (void)deadline;
  return rejection;
#else
  const std::string what = absl::StrCat(mine.op(), " (op ", sequence, ")");
  const uint64_t hash = mine.Hash();
  std::vector<std::string> in;
  LBCC_RETURN_IF_ERROR(Exchange(
      group, tag + kSignatureStep,
      rejection.ok() ? EncodeHeader(Kind::kHash, sequence, hash, "")
                     : EncodeHeader(Kind::kRejected, sequence, 0, rejection.ToString()),
      &in, deadline, what));
  return Verdict(group, tag, sequence, mine, hash, rejection, Kind::kHash, 0, in, deadline,
                 what);
#endif
}

SignatureCheck::SignatureCheck(const Group& group, Tag tag, uint64_t sequence,
                               const Signature& mine, absl::Time deadline)
    : group_(group), tag_(tag), sequence_(sequence), mine_(mine), deadline_(deadline) {}

std::unique_ptr<SignatureCheck> SignatureCheck::Start(const Group& group, Tag tag,
                                                      uint64_t sequence, const Signature& mine,
                                                      absl::Time deadline) {
  std::unique_ptr<SignatureCheck> check(new SignatureCheck(group, tag, sequence, mine, deadline));
#ifndef LBCC_MEASURE_WITHOUT_HEADER
  if (group.size() > 1) {
    check->round_ = PostRound(group, tag + kSignatureStep,
                              EncodeHeader(Kind::kHash, sequence, mine.Hash(), ""));
  }
#endif
  return check;
}

SignatureCheck::~SignatureCheck() { (void)Finish(); }

absl::Status SignatureCheck::Finish() {
  if (round_ == nullptr) return verdict_;
  std::shared_ptr<Round> round = std::move(round_);
  const std::string what = absl::StrCat(mine_.op(), " (op ", sequence_, ")");
  verdict_ = WaitRound(group_, *round, deadline_, what);
  if (verdict_.ok()) {
    verdict_ = Verdict(group_, tag_, sequence_, mine_, mine_.Hash(), absl::OkStatus(), Kind::kHash,
                       0, round->in, deadline_, what);
  }
  return verdict_;
}

absl::Status ExchangeWithHeader(const Group& group, Tag tag, uint64_t sequence,
                                const Signature& mine, absl::Span<const uint8_t> data,
                                std::vector<std::string>* storage,
                                std::vector<absl::Span<const uint8_t>>* rows,
                                absl::Time deadline) {
  const int n = group.size();
  const std::string what = absl::StrCat(mine.op(), " (op ", sequence, ")");
  if (data.size() > kMaxHeaderData) {
    return absl::InternalError(absl::StrCat(what, ": ", data.size(),
                                            " bytes are too many to carry with the header"));
  }
#ifdef LBCC_MEASURE_WITHOUT_HEADER
  constexpr size_t offset = 0;
  std::string message(reinterpret_cast<const char*>(data.data()), data.size());
#else
  constexpr size_t offset = kHeaderBytes;
  const uint64_t hash = mine.Hash();
  std::string message(kHeaderBytes + data.size(), '\0');
  PutHeader(message.data(), Kind::kHashWithData, sequence, hash);
  if (!data.empty()) std::memcpy(message.data() + kHeaderBytes, data.data(), data.size());
#endif
  if (n > 1) {
    LBCC_RETURN_IF_ERROR(Exchange(group, tag + kSignatureStep, message, storage, deadline, what));
#ifdef LBCC_MEASURE_WITHOUT_HEADER
    for (int i = 0; i < n; ++i) {
      if (i != group.me && (*storage)[i].size() != data.size()) {
        return absl::DataLossError(absl::StrCat(what, ": rank ", i, " sent another size"));
      }
    }
#else
    LBCC_RETURN_IF_ERROR(Verdict(group, tag, sequence, mine, hash, absl::OkStatus(),
                                 Kind::kHashWithData, data.size(), *storage, deadline, what));
#endif
  } else {
    storage->assign(1, std::string());
  }
  (*storage)[group.me] = std::move(message);
  rows->resize(n);
  for (int i = 0; i < n; ++i) {
    (*rows)[i] = absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>((*storage)[i].data()) + offset, data.size());
  }
  return absl::OkStatus();
}

}  // namespace lbcc::comm
