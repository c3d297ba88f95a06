#include "transport/secure.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/check.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace lbcc::transport {
namespace {

// OpenSSL frees its locks, random generators and fetched algorithms from an exit handler that
// its first use registers, while threads may still be inside it: an elastic epoch's set-up that
// outlives the group's exit wait, a link's crypto pool. Those then crashed in RAND_bytes
// (SIGSEGV in CRYPTO_THREAD_write_lock). Initialized here while the library loads, before any
// other use in the process, OpenSSL keeps its state until the process is gone. A program that
// used OpenSSL before loading LBCC keeps its own choice.
[[maybe_unused]] const bool g_openssl_kept_at_exit =
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;

constexpr char kFrameMagic[4] = {'L', 'B', 'A', 'U'};
constexpr uint16_t kFrameVersion = 1;

std::atomic<uint64_t> g_passed{0};
std::atomic<uint64_t> g_refused{0};
std::atomic<uint64_t> g_integrity{0};

void AppendU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<char*>(&v), 8); }
void AppendU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<char*>(&v), 4); }

// The transcript as bytes: the MACs and the key derivation read the same serialisation.
std::string TranscriptBytes(const HandshakeTranscript& t) {
  std::string out;
  AppendU64(&out, t.job_id.size());
  out += t.job_id;
  AppendU64(&out, t.link_id);
  AppendU64(&out, t.client_identity);
  AppendU64(&out, t.server_identity);
  out.append(reinterpret_cast<const char*>(t.client_nonce.data()), kNonceBytes);
  out.append(reinterpret_cast<const char*>(t.server_nonce.data()), kNonceBytes);
  AppendU32(&out, t.client_flags);
  AppendU32(&out, t.server_flags);
  return out;
}

Mac Hmac(const JobSecret& secret, absl::string_view label, absl::string_view message) {
  std::string input(label);
  input.push_back('\0');
  input.append(message.data(), message.size());
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const uint8_t* ok = HMAC(EVP_sha256(), secret.bytes().data(),
                           static_cast<int>(secret.bytes().size()),
                           reinterpret_cast<const uint8_t*>(input.data()), input.size(), digest,
                           &length);
  LBCC_CHECK(ok != nullptr && length >= kMacBytes) << "HMAC-SHA-256 failed";
  Mac mac;
  std::memcpy(mac.data(), digest, kMacBytes);
  OPENSSL_cleanse(digest, sizeof(digest));
  return mac;
}

absl::Status Hkdf(const JobSecret& secret, absl::Span<const uint8_t> salt, absl::string_view info,
                  uint8_t* out, size_t out_length) {
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  if (ctx == nullptr) return absl::InternalError("HKDF: no context");
  size_t length = out_length;
  const bool ok =
      EVP_PKEY_derive_init(ctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_salt(ctx, salt.data(), static_cast<int>(salt.size())) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_key(ctx, secret.bytes().data(),
                                 static_cast<int>(secret.bytes().size())) > 0 &&
      EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const uint8_t*>(info.data()),
                                  static_cast<int>(info.size())) > 0 &&
      EVP_PKEY_derive(ctx, out, &length) > 0 && length == out_length;
  EVP_PKEY_CTX_free(ctx);
  if (!ok) return absl::InternalError("HKDF-SHA-256 failed");
  return absl::OkStatus();
}

// AES-256-GCM and ChaCha20-Poly1305, fetched from the provider once: OpenSSL 3 looks a cipher
// up on every use otherwise, which costs more than sealing a small chunk.
const EVP_CIPHER* Aes256Gcm() {
  static const EVP_CIPHER* const cipher = [] {
    const EVP_CIPHER* fetched = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
    return fetched != nullptr ? fetched : EVP_aes_256_gcm();
  }();
  return cipher;
}

const EVP_CIPHER* ChaCha20Poly1305() {
  static const EVP_CIPHER* const cipher = [] {
    const EVP_CIPHER* fetched = EVP_CIPHER_fetch(nullptr, "ChaCha20-Poly1305", nullptr);
    return fetched != nullptr ? fetched : EVP_chacha20_poly1305();
  }();
  return cipher;
}

// An AEAD (AES-256-GCM or ChaCha20-Poly1305) with `ctx` (keyed for this direction; only the IV
// is set here) over `aad` and, encrypting, `in` -> `out`; authenticating only, `in` is more AAD
// and `out` gets a copy (none when `out` is null or `in`). Returns false when OpenSSL fails (or,
// opening, the tag is wrong).
bool Aead(EVP_CIPHER_CTX* ctx, bool seal, const uint8_t iv[12], absl::Span<const uint8_t> aad,
         bool encrypt, const uint8_t* in, size_t length, uint8_t* out, uint8_t tag[16]) {
  if (ctx == nullptr) return false;
  int n = 0;
  auto init = seal ? EVP_EncryptInit_ex : EVP_DecryptInit_ex;
  auto update = seal ? EVP_EncryptUpdate : EVP_DecryptUpdate;
  if (init(ctx, nullptr, nullptr, nullptr, iv) <= 0) return false;
  if (!seal && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag) <= 0) return false;
  if (!aad.empty() &&
      update(ctx, nullptr, &n, aad.data(), static_cast<int>(aad.size())) <= 0) {
    return false;
  }
  // OpenSSL takes int lengths: encrypting, go in pieces of at most 1 GiB. Authenticating only,
  // each piece of kCopyPiece bytes is copied right after the MAC read it, while it is still in
  // the core's cache (one trip through memory for the MAC and the copy).
  constexpr size_t kPiece = size_t{1} << 30;
  constexpr size_t kCopyPiece = size_t{64} << 10;
  const bool copy = !encrypt && out != nullptr && out != in;
  const size_t step = encrypt ? kPiece : kCopyPiece;
  for (size_t done = 0; done < length; done += step) {
    const int piece = static_cast<int>(std::min(step, length - done));
    if (encrypt) {
      if (update(ctx, out + done, &n, in + done, piece) <= 0) return false;
    } else {
      if (update(ctx, nullptr, &n, in + done, piece) <= 0) return false;
      if (copy) std::memcpy(out + done, in + done, piece);
    }
  }
  uint8_t scratch[16];
  if (seal) {
    if (EVP_EncryptFinal_ex(ctx, scratch, &n) <= 0) return false;
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) > 0;
  }
  return EVP_DecryptFinal_ex(ctx, scratch, &n) > 0;
}

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("secure handshake: ", what, ": ",
                                             std::strerror(errno)));
}

absl::Status WaitFd(int fd, short events, absl::Time deadline, absl::string_view peer) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("handshake with ", peer, " timed out"));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (n < 0 && errno != EINTR) return Errno("poll");
    if (n > 0) return absl::OkStatus();
  }
}

absl::Status WriteFrame(int fd, const std::string& bytes, absl::Time deadline,
                        absl::string_view peer) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    LBCC_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, peer));
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("send");
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<AuthFrame> ReadFrame(int fd, size_t size, uint8_t kind, absl::Time deadline,
                                    absl::string_view peer) {
  std::vector<uint8_t> bytes(size);
  size_t got = 0;
  while (got < size) {
    LBCC_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, peer));
    const ssize_t n = recv(fd, bytes.data() + got, size - got, 0);
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("handshake with ", peer, ": connection closed by the other side"));
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("recv");
    }
    got += static_cast<size_t>(n);
  }
  return ParseAuthFrame(bytes, kind);
}

size_t FrameBytes(uint8_t kind) {
  switch (kind) {
    case 1:
      return kAuthHelloBytes;
    case 2:
      return kAuthAnswerBytes;
    case 3:
      return kAuthProofBytes;
  }
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Secret and options.

absl::StatusOr<JobSecret> JobSecret::FromHex(absl::string_view hex) {
  hex = absl::StripAsciiWhitespace(hex);
  if (hex.size() != 2 * kJobSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job secret: expected ", 2 * kJobSecretBytes, " hex digits, got ", hex.size(),
        " characters"));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("job secret: not hex digits");
    }
  }
  const std::string raw = absl::HexStringToBytes(hex);
  JobSecret secret;
  std::memcpy(secret.bytes_.data(), raw.data(), kJobSecretBytes);
  return secret;
}

absl::StatusOr<JobSecret> JobSecret::FromFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read job secret file ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[256];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0 && text.size() < 4096) {
    text.append(buffer, n);
  }
  std::fclose(file);
  OPENSSL_cleanse(buffer, sizeof(buffer));
  if (text.size() == kJobSecretBytes) {
    JobSecret secret;
    std::memcpy(secret.bytes_.data(), text.data(), kJobSecretBytes);
    return secret;
  }
  absl::StatusOr<JobSecret> secret = FromHex(text);
  if (!secret.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job secret file ", path, ": expected 32 raw bytes or 64 hex digits, got ", text.size(),
        " bytes"));
  }
  return secret;
}

absl::StatusOr<JobSecret> JobSecret::FromBytes(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kJobSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job secret: expected ", kJobSecretBytes,
                                                   " bytes, got ", bytes.size()));
  }
  JobSecret secret;
  std::memcpy(secret.bytes_.data(), bytes.data(), kJobSecretBytes);
  return secret;
}

JobSecret JobSecret::Random() {
  JobSecret secret;
  LBCC_CHECK(RAND_bytes(secret.bytes_.data(), kJobSecretBytes) == 1) << "RAND_bytes failed";
  return secret;
}

std::string JobSecret::ToHex() const {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes_.data()), bytes_.size()));
}

absl::StatusOr<EncryptMode> ParseEncryptMode(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "none") return EncryptMode::kNone;
  if (lower == "slow") return EncryptMode::kSlow;
  if (lower == "all") return EncryptMode::kAll;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not an encryption mode (none, slow, all)"));
}

absl::string_view EncryptModeName(EncryptMode mode) {
  switch (mode) {
    case EncryptMode::kNone:
      return "none";
    case EncryptMode::kSlow:
      return "slow";
    case EncryptMode::kAll:
      return "all";
  }
  return "?";
}

bool EncryptLink(EncryptMode a, EncryptMode b, bool slow_link) {
  const EncryptMode mode = std::max(a, b);
  return mode == EncryptMode::kAll || (mode == EncryptMode::kSlow && slow_link);
}

absl::StatusOr<std::optional<JobSecret>> JobSecretFromEnv() {
  LBCC_ASSIGN_OR_RETURN(const std::string hex, env::GetString("LBCC_JOB_SECRET"));
  LBCC_ASSIGN_OR_RETURN(const std::string file, env::GetString("LBCC_JOB_SECRET_FILE"));
  if (!hex.empty() && !file.empty()) {
    return absl::InvalidArgumentError("set LBCC_JOB_SECRET or LBCC_JOB_SECRET_FILE, not both");
  }
  if (!hex.empty()) {
    absl::StatusOr<JobSecret> secret = JobSecret::FromHex(hex);
    if (!secret.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LBCC_JOB_SECRET: ", secret.status().message()));
    }
    return *secret;
  }
  if (!file.empty()) return JobSecret::FromFile(file);
  return std::nullopt;
}

absl::StatusOr<SecurityOptions> SecurityOptions::FromEnv() {
  SecurityOptions options;
  LBCC_ASSIGN_OR_RETURN(options.secret, JobSecretFromEnv());
  LBCC_ASSIGN_OR_RETURN(const std::string mode, env::GetString("LBCC_ENCRYPT"));
  LBCC_ASSIGN_OR_RETURN(options.encrypt, ParseEncryptMode(mode));
  uint64_t identity = 0;
  LBCC_CHECK(RAND_bytes(reinterpret_cast<uint8_t*>(&identity), sizeof(identity)) == 1);
  options.identity = identity;
  return options;
}

// ---------------------------------------------------------------------------------------------
// Handshake.

Mac HandshakeMac(const JobSecret& secret, const HandshakeTranscript& transcript,
                 HandshakeRole role) {
  return Hmac(secret, role == HandshakeRole::kServer ? "lbcc auth v1 server" : "lbcc auth v1 client",
              TranscriptBytes(transcript));
}

Mac StripeMac(const JobSecret& secret, const HandshakeTranscript& transcript, uint32_t lane) {
  std::string message = TranscriptBytes(transcript);
  AppendU32(&message, lane);
  return Hmac(secret, "lbcc auth v1 stripe", message);
}

bool MacEqual(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), kMacBytes) == 0;
}

Nonce NewNonce() {
  Nonce nonce;
  LBCC_CHECK(RAND_bytes(nonce.data(), kNonceBytes) == 1) << "RAND_bytes failed";
  return nonce;
}

void SplitBytes(const uint8_t* bytes16, uint64_t* lo, uint64_t* hi) {
  std::memcpy(lo, bytes16, 8);
  std::memcpy(hi, bytes16 + 8, 8);
}

void JoinBytes(uint64_t lo, uint64_t hi, uint8_t* bytes16) {
  std::memcpy(bytes16, &lo, 8);
  std::memcpy(bytes16 + 8, &hi, 8);
}

// ---------------------------------------------------------------------------------------------
// Channel.

absl::StatusOr<std::shared_ptr<SecureChannel>> SecureChannel::Create(
    const JobSecret& secret, const HandshakeTranscript& transcript, HandshakeRole role,
    bool encrypt, std::string peer) {
  std::shared_ptr<SecureChannel> channel(new SecureChannel(encrypt, std::move(peer)));
  uint8_t salt[2 * kNonceBytes];
  std::memcpy(salt, transcript.client_nonce.data(), kNonceBytes);
  std::memcpy(salt + kNonceBytes, transcript.server_nonce.data(), kNonceBytes);
  const std::string info = TranscriptBytes(transcript);
  // Per direction: the AES-256-GCM key, the IV salt, and the ChaCha20-Poly1305 key of
  // integrity-only chunks (one key per algorithm).
  uint8_t c2s[68], s2c[68];
  LBCC_RETURN_IF_ERROR(Hkdf(secret, salt, absl::StrCat("lbcc link v1 c2s", info), c2s, 68));
  LBCC_RETURN_IF_ERROR(Hkdf(secret, salt, absl::StrCat("lbcc link v1 s2c", info), s2c, 68));
  const bool client = role == HandshakeRole::kClient;
  const uint8_t* send = client ? c2s : s2c;
  const uint8_t* recv = client ? s2c : c2s;
  std::memcpy(channel->keys_[kSendGcm].data(), send, 32);
  std::memcpy(channel->send_salt_.data(), send + 32, 4);
  std::memcpy(channel->keys_[kSendMac].data(), send + 36, 32);
  std::memcpy(channel->keys_[kRecvGcm].data(), recv, 32);
  std::memcpy(channel->recv_salt_.data(), recv + 32, 4);
  std::memcpy(channel->keys_[kRecvMac].data(), recv + 36, 32);
  OPENSSL_cleanse(c2s, sizeof(c2s));
  OPENSSL_cleanse(s2c, sizeof(s2c));
  return channel;
}

SecureChannel::~SecureChannel() {
  MutexLock lock(&contexts_mu_);
  for (int use = 0; use < kUses; ++use) {
    for (EVP_CIPHER_CTX* ctx : contexts_[use]) EVP_CIPHER_CTX_free(ctx);
    contexts_[use].clear();
    OPENSSL_cleanse(keys_[use].data(), keys_[use].size());
  }
}

EVP_CIPHER_CTX* SecureChannel::TakeContext(Use use) {
  {
    MutexLock lock(&contexts_mu_);
    std::vector<EVP_CIPHER_CTX*>& free = contexts_[use];
    if (!free.empty()) {
      EVP_CIPHER_CTX* ctx = free.back();
      free.pop_back();
      return ctx;
    }
  }
  // One more thread works on this direction at once: key a new context (kept from now on).
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) return nullptr;
  const bool send = use == kSendGcm || use == kSendMac;
  const bool gcm = use == kSendGcm || use == kRecvGcm;
  auto init = send ? EVP_EncryptInit_ex : EVP_DecryptInit_ex;
  if (init(ctx, gcm ? Aes256Gcm() : ChaCha20Poly1305(), nullptr, keys_[use].data(), nullptr) <=
      0) {
    EVP_CIPHER_CTX_free(ctx);
    return nullptr;
  }
  return ctx;
}

void SecureChannel::GiveContext(Use use, EVP_CIPHER_CTX* ctx) {
  if (ctx == nullptr) return;
  MutexLock lock(&contexts_mu_);
  contexts_[use].push_back(ctx);
}

absl::Status SecureChannel::Refuse(absl::string_view what, absl::string_view why) const {
  CountIntegrityFailure();
  return absl::DataLossError(absl::StrCat(what, " from ", peer_, " failed authentication (", why,
                                          "): tampered with on the way or not from the job "
                                          "member the link was set up with"));
}

absl::Status SecureChannel::Seal(absl::Span<const uint8_t> aad, const uint8_t* data,
                                 size_t length, uint8_t* out) {
  uint64_t counter;
  {
    MutexLock lock(&mu_);
    counter = next_send_++;
  }
  uint8_t iv[12];
  std::memcpy(iv, send_salt_.data(), 4);
  std::memcpy(iv + 4, &counter, 8);
  std::memcpy(out, &counter, 8);
  const Use use = encrypt_ ? kSendGcm : kSendMac;
  EVP_CIPHER_CTX* ctx = TakeContext(use);
  const bool ok = Aead(ctx, /*seal=*/true, iv, aad, encrypt_, data, length, out + 8,
                       out + 8 + length);
  GiveContext(use, ctx);
  if (!ok) return absl::InternalError("AES-256-GCM seal failed");
  return absl::OkStatus();
}

bool SecureChannel::Fresh(uint64_t counter) {
  MutexLock lock(&mu_);
  if (counter < recv_floor_ || !recv_seen_.insert(counter).second) return false;
  while (recv_seen_.erase(recv_floor_) > 0) ++recv_floor_;
  return true;
}

absl::Status SecureChannel::Open(absl::Span<const uint8_t> aad, bool encrypted,
                                 const uint8_t* in, size_t in_length, uint8_t* out) {
  if (in_length < kOverhead) return Refuse("chunk", "too short");
  if (encrypted != encrypt_) return Refuse("chunk", "encryption mode differs");
  const size_t length = in_length - kOverhead;
  uint64_t counter;
  std::memcpy(&counter, in, 8);
  uint8_t iv[12];
  std::memcpy(iv, recv_salt_.data(), 4);
  std::memcpy(iv + 4, &counter, 8);
  uint8_t tag[16];
  std::memcpy(tag, in + 8 + length, 16);
  const Use use = encrypt_ ? kRecvGcm : kRecvMac;
  EVP_CIPHER_CTX* ctx = TakeContext(use);
  const bool ok = Aead(ctx, /*seal=*/false, iv, aad, encrypt_, in + 8, length, out, tag);
  GiveContext(use, ctx);
  // What failed leaves nothing unverified in `out` (it may be the caller's receive buffer).
  if (!ok) {
    if (length > 0) std::memset(out, 0, length);
    return Refuse("chunk", "bad tag");
  }
  if (!Fresh(counter)) {
    if (length > 0) std::memset(out, 0, length);
    return Refuse("chunk", absl::StrCat("counter ", counter, " replayed"));
  }
  return absl::OkStatus();
}

absl::Status SecureChannel::TagMessage(absl::Span<const uint8_t> aad, uint64_t* counter,
                                       Mac* tag) {
  {
    MutexLock lock(&mu_);
    *counter = next_send_++;
  }
  uint8_t iv[12];
  std::memcpy(iv, send_salt_.data(), 4);
  std::memcpy(iv + 4, counter, 8);
  EVP_CIPHER_CTX* ctx = TakeContext(kSendGcm);
  const bool ok = Aead(ctx, /*seal=*/true, iv, aad, /*encrypt=*/false, nullptr, 0, nullptr,
                       tag->data());
  GiveContext(kSendGcm, ctx);
  if (!ok) return absl::InternalError("AES-256-GCM (GMAC) tag failed");
  return absl::OkStatus();
}

absl::Status SecureChannel::VerifyMessage(absl::Span<const uint8_t> aad, uint64_t counter,
                                          const Mac& tag, absl::string_view what) {
  uint8_t iv[12];
  std::memcpy(iv, recv_salt_.data(), 4);
  std::memcpy(iv + 4, &counter, 8);
  uint8_t expected[16];
  std::memcpy(expected, tag.data(), 16);
  EVP_CIPHER_CTX* ctx = TakeContext(kRecvGcm);
  const bool ok = Aead(ctx, /*seal=*/false, iv, aad, /*encrypt=*/false, nullptr, 0, nullptr,
                       expected);
  GiveContext(kRecvGcm, ctx);
  if (!ok) return Refuse(what, "bad tag");
  if (!Fresh(counter)) return Refuse(what, absl::StrCat("counter ", counter, " replayed"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Sockets.

std::string EncodeAuthFrame(const AuthFrame& frame) {
  std::string out(kFrameMagic, 4);
  out.append(reinterpret_cast<const char*>(&kFrameVersion), 2);
  out.push_back(static_cast<char>(frame.kind));
  out.push_back(static_cast<char>(frame.flags));
  if (frame.kind == 1 || frame.kind == 2) {
    AppendU64(&out, frame.identity);
    out.append(reinterpret_cast<const char*>(frame.nonce.data()), kNonceBytes);
  }
  if (frame.kind == 2 || frame.kind == 3) {
    out.append(reinterpret_cast<const char*>(frame.mac.data()), kMacBytes);
  }
  return out;
}

absl::StatusOr<AuthFrame> ParseAuthFrame(absl::Span<const uint8_t> bytes, uint8_t kind) {
  const size_t want = FrameBytes(kind);
  if (want == 0) return absl::InvalidArgumentError(absl::StrCat("no handshake frame kind ", kind));
  if (bytes.size() != want) {
    return absl::DataLossError(absl::StrCat("handshake frame of ", bytes.size(),
                                            " bytes, expected ", want));
  }
  if (std::memcmp(bytes.data(), kFrameMagic, 4) != 0) {
    return absl::DataLossError("not an LBCC handshake (no LBAU magic)");
  }
  uint16_t version;
  std::memcpy(&version, bytes.data() + 4, 2);
  if (version != kFrameVersion) {
    return absl::DataLossError(absl::StrCat("handshake version ", version, ", expected ",
                                            kFrameVersion));
  }
  AuthFrame frame;
  frame.kind = bytes[6];
  frame.flags = bytes[7];
  if (frame.kind != kind) {
    return absl::DataLossError(absl::StrCat("handshake frame kind ", frame.kind, ", expected ",
                                            kind));
  }
  size_t at = 8;
  if (kind == 1 || kind == 2) {
    std::memcpy(&frame.identity, bytes.data() + at, 8);
    std::memcpy(frame.nonce.data(), bytes.data() + at + 8, kNonceBytes);
    at += 8 + kNonceBytes;
  }
  if (kind == 2 || kind == 3) std::memcpy(frame.mac.data(), bytes.data() + at, kMacBytes);
  return frame;
}

absl::StatusOr<uint64_t> AuthenticateSocket(int fd, HandshakeRole role, const JobSecret& secret,
                                            absl::string_view job_id, uint64_t identity,
                                            absl::Time deadline, absl::string_view peer) {
  HandshakeTranscript t;
  t.job_id = std::string(job_id);
  auto refused = [&](absl::Status status) {
    if (status.code() == absl::StatusCode::kPermissionDenied ||
        status.code() == absl::StatusCode::kDataLoss) {
      RefuseConnection(peer, status.message());
    }
    return status;
  };
  if (role == HandshakeRole::kClient) {
    AuthFrame hello;
    hello.kind = 1;
    hello.identity = identity;
    hello.nonce = NewNonce();
    t.client_identity = identity;
    t.client_nonce = hello.nonce;
    LBCC_RETURN_IF_ERROR(WriteFrame(fd, EncodeAuthFrame(hello), deadline, peer));
    absl::StatusOr<AuthFrame> answer = ReadFrame(fd, kAuthAnswerBytes, 2, deadline, peer);
    if (!answer.ok()) return refused(answer.status());
    t.server_identity = answer->identity;
    t.server_nonce = answer->nonce;
    if (!MacEqual(answer->mac, HandshakeMac(secret, t, HandshakeRole::kServer))) {
      return refused(absl::PermissionDeniedError(absl::StrCat(
          peer, " does not hold this job's secret (its handshake proof is wrong)")));
    }
    AuthFrame proof;
    proof.kind = 3;
    proof.mac = HandshakeMac(secret, t, HandshakeRole::kClient);
    LBCC_RETURN_IF_ERROR(WriteFrame(fd, EncodeAuthFrame(proof), deadline, peer));
    CountHandshake(true);
    return t.server_identity;
  }
  absl::StatusOr<AuthFrame> hello = ReadFrame(fd, kAuthHelloBytes, 1, deadline, peer);
  if (!hello.ok()) return refused(hello.status());
  t.client_identity = hello->identity;
  t.client_nonce = hello->nonce;
  t.server_identity = identity;
  t.server_nonce = NewNonce();
  AuthFrame answer;
  answer.kind = 2;
  answer.identity = identity;
  answer.nonce = t.server_nonce;
  answer.mac = HandshakeMac(secret, t, HandshakeRole::kServer);
  LBCC_RETURN_IF_ERROR(WriteFrame(fd, EncodeAuthFrame(answer), deadline, peer));
  absl::StatusOr<AuthFrame> proof = ReadFrame(fd, kAuthProofBytes, 3, deadline, peer);
  if (!proof.ok()) return refused(proof.status());
  if (!MacEqual(proof->mac, HandshakeMac(secret, t, HandshakeRole::kClient))) {
    return refused(absl::PermissionDeniedError(absl::StrCat(
        peer, " does not hold this job's secret (its handshake proof is wrong)")));
  }
  CountHandshake(true);
  return t.client_identity;
}

// ---------------------------------------------------------------------------------------------
// Counters.

SecurityCounters GetSecurityCounters() {
  SecurityCounters c;
  c.handshakes_passed = g_passed.load(std::memory_order_relaxed);
  c.handshakes_refused = g_refused.load(std::memory_order_relaxed);
  c.integrity_failures = g_integrity.load(std::memory_order_relaxed);
  return c;
}

void CountHandshake(bool passed) {
  (passed ? g_passed : g_refused).fetch_add(1, std::memory_order_relaxed);
}

void CountIntegrityFailure() { g_integrity.fetch_add(1, std::memory_order_relaxed); }

void RefuseConnection(absl::string_view peer, absl::string_view why) {
  CountHandshake(false);
  LBCC_LOG(WARN) << "refused connection from " << peer << ": " << why;
}

}  // namespace lbcc::transport
