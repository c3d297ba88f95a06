// Security of a job's connections: the job secret, the mutual-authentication handshake and the
// per-link authenticated encryption of chunks (issue 24). All cryptography is OpenSSL 3's
// (HMAC-SHA-256, HKDF-SHA-256, AES-256-GCM, ChaCha20-Poly1305, RAND_bytes); nothing here is
// hand-written crypto.
//
// What lives here:
//   - JobSecret: 32 random bytes every member of a job holds (LBCC_JOB_SECRET, 64 hex digits,
//     or LBCC_JOB_SECRET_FILE: 32 raw bytes or 64 hex digits). It is never printed: it has no
//     operator<<, and no error message quotes it.
//   - SecurityOptions: the secret, the encryption mode (LBCC_ENCRYPT=slow|all|none), the job id
//     and this end's identity, bound into every handshake.
//   - The handshake transcript and its MACs (HandshakeMac): challenge-response, each side
//     contributes a fresh 128-bit nonce, each side proves it holds the secret by an
//     HMAC-SHA-256 (truncated to 128 bits) over the job id, the link id, both identities and
//     both nonces; the server's MAC and the client's differ by a role label, so neither can be
//     reflected. A replayed message meets a new nonce and fails.
//   - SecureChannel: one link's keys, per direction (HKDF from the secret and the transcript),
//     sealing each chunk with AES-256-GCM when encrypting, or with ChaCha20-Poly1305 over the
//     payload as associated data when authenticating only (Poly1305 outruns GHASH; its own
//     key), under a 64-bit per-direction counter (never reused), rejecting replayed counters,
//     and tagging payload-less messages (a link's credits and heartbeats, AES-256-GCM's GMAC)
//     under the same counters. Each
//     direction keeps its cipher contexts keyed once and reuses them (only the IV changes per
//     chunk), so seals and opens run on many threads at once without re-keying.
//   - AuthenticateSocket: the same handshake over a connected stream socket, for connections
//     that are not transport links (the bootstrap root, the membership service).
//   - SecurityCounters: process-wide counts of handshakes passed and refused and of chunks that
//     failed authentication.
//
// The link handshake runs in transport/link_setup.cc (HELLO -> WELCOME -> AUTH), once for every
// backend. Wire layouts are in docs/security.md.
//
// Errors: PermissionDenied (the peer failed authentication or does not authenticate: close the
// connection), DataLoss (a sealed chunk or handshake frame that does not verify or parse; it
// names the peer), InvalidArgument (a bad LBCC_JOB_SECRET / LBCC_ENCRYPT / file), DeadlineExceeded
// and Unavailable (socket handshake), Internal (OpenSSL failed: an LBCC or system bug).
//
// Thread-safety: JobSecret, SecurityOptions and the free functions are values / pure;
// SecureChannel is thread-safe (Seal and Open may run on any threads at once).
#ifndef LBCC_TRANSPORT_SECURE_H_
#define LBCC_TRANSPORT_SECURE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"

struct evp_cipher_ctx_st;  // OpenSSL's EVP_CIPHER_CTX.

namespace lbcc::transport {

inline constexpr size_t kJobSecretBytes = 32;
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMacBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

class JobSecret {
 public:
  // 64 hex digits (either case; surrounding whitespace ignored). InvalidArgument naming the
  // variable and the length, never the text.
  static absl::StatusOr<JobSecret> FromHex(absl::string_view hex);
  // A file holding 32 raw bytes or 64 hex digits.
  static absl::StatusOr<JobSecret> FromFile(const std::string& path);
  // 32 bytes as they are (a unique id that carries the secret). InvalidArgument for another
  // length.
  static absl::StatusOr<JobSecret> FromBytes(absl::Span<const uint8_t> bytes);
  // 32 bytes from OpenSSL's RAND_bytes.
  static JobSecret Random();

  // For `lbcc secret` style generators and for handing to child processes; never log it.
  std::string ToHex() const;
  absl::Span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::array<uint8_t, kJobSecretBytes> bytes_{};
};

enum class EncryptMode { kNone = 0, kSlow = 1, kAll = 2 };
absl::StatusOr<EncryptMode> ParseEncryptMode(absl::string_view text);  // none|slow|all
absl::string_view EncryptModeName(EncryptMode mode);
// Whether a link of this class is encrypted when the two ends ask for `a` and `b` (the
// stronger request wins, like the slow-link rule).
bool EncryptLink(EncryptMode a, EncryptMode b, bool slow_link);

struct SecurityOptions {
  // Unset: links are neither authenticated nor sealed (the trusted-cluster default), and a peer
  // that asks for authentication is refused.
  std::optional<JobSecret> secret;
  EncryptMode encrypt = EncryptMode::kSlow;  // LBCC_ENCRYPT.
  // Bound into every handshake; both ends must use the same (empty: the secret alone names
  // the job).
  std::string job_id;
  // This end's identity (a rank, or a random number per process), bound into every handshake
  // and reported to the peer.
  uint64_t identity = 0;

  bool enabled() const { return secret.has_value(); }
  // LBCC_JOB_SECRET (hex) or LBCC_JOB_SECRET_FILE (setting both is InvalidArgument),
  // LBCC_ENCRYPT; identity: a random number.
  static absl::StatusOr<SecurityOptions> FromEnv();
};

// ---------------------------------------------------------------------------------------------
// Handshake.

// Everything a handshake binds. The client is the side that connected.
struct HandshakeTranscript {
  std::string job_id;
  uint64_t link_id = 0;  // The client's connection id (transport) or 0 (sockets).
  uint64_t client_identity = 0;
  uint64_t server_identity = 0;
  Nonce client_nonce{};
  Nonce server_nonce{};
  uint32_t client_flags = 0;  // Each side's announced flags (encryption mode), so a man in the
  uint32_t server_flags = 0;  // middle cannot downgrade them.
};

enum class HandshakeRole { kClient, kServer };
// HMAC-SHA-256(secret, label(role) || transcript), truncated to 128 bits.
Mac HandshakeMac(const JobSecret& secret, const HandshakeTranscript& transcript,
                 HandshakeRole role);
// MAC over one extra connection of an authenticated link (a slow link's stripe).
Mac StripeMac(const JobSecret& secret, const HandshakeTranscript& transcript, uint32_t lane);
// Constant-time comparison.
bool MacEqual(const Mac& a, const Mac& b);
Nonce NewNonce();

// 16 bytes <-> two 64-bit words (the control header's fields carry them).
void SplitBytes(const uint8_t* bytes16, uint64_t* lo, uint64_t* hi);
void JoinBytes(uint64_t lo, uint64_t hi, uint8_t* bytes16);

// ---------------------------------------------------------------------------------------------
// Per-link authenticated encryption of chunks.
class SecureChannel {
 public:
  // Bytes a sealed chunk adds: the 8-byte counter in front, the 16-byte GCM tag behind.
  static constexpr size_t kOverhead = 8 + 16;

  // Keys for one end of a link: HKDF-SHA-256(secret, salt = both nonces, info = direction ||
  // transcript). `encrypt`: whether this end encrypts what it sends (both ends compute the same
  // value); `peer` names the peer in errors.
  static absl::StatusOr<std::shared_ptr<SecureChannel>> Create(
      const JobSecret& secret, const HandshakeTranscript& transcript, HandshakeRole role,
      bool encrypt, std::string peer);
  ~SecureChannel();
  SecureChannel(const SecureChannel&) = delete;
  SecureChannel& operator=(const SecureChannel&) = delete;

  bool encrypt() const { return encrypt_; }
  // Seals `length` bytes: out gets counter || ciphertext (or the plaintext when not encrypting)
  // || tag, length + kOverhead bytes. `aad` (the wire chunk header) is authenticated too.
  absl::Status Seal(absl::Span<const uint8_t> aad, const uint8_t* data, size_t length,
                    uint8_t* out);
  // Opens what Seal produced (`in_length` >= kOverhead) into `out` (in_length - kOverhead
  // bytes). DataLoss naming the peer when the tag, the counter (replayed) or the mode does not
  // verify; `out` is then garbage and must not be used.
  absl::Status Open(absl::Span<const uint8_t> aad, bool encrypted, const uint8_t* in,
                    size_t in_length, uint8_t* out);

  // A message without payload (a credit, a heartbeat): a GMAC tag over `aad` under the next
  // send counter, which the message carries beside the tag.
  absl::Status TagMessage(absl::Span<const uint8_t> aad, uint64_t* counter, Mac* tag);
  // Checks what TagMessage produced. DataLoss naming the peer and `what` when the tag or the
  // counter (replayed) does not verify.
  absl::Status VerifyMessage(absl::Span<const uint8_t> aad, uint64_t counter, const Mac& tag,
                             absl::string_view what);

 private:
  SecureChannel(bool encrypt, std::string peer) : encrypt_(encrypt), peer_(std::move(peer)) {}
  // Records `counter` as seen; false when it was seen before (a replay).
  bool Fresh(uint64_t counter);
  // What a key and its cipher contexts are for: AES-256-GCM (encrypted chunks, and the tags of
  // control messages) or ChaCha20-Poly1305 (integrity-only chunks), per direction.
  enum Use { kSendGcm = 0, kRecvGcm = 1, kSendMac = 2, kRecvMac = 3, kUses = 4 };
  // A cipher context keyed for one use, reused: taken for one seal or open, then given back.
  // Null when OpenSSL cannot make one.
  evp_cipher_ctx_st* TakeContext(Use use);
  void GiveContext(Use use, evp_cipher_ctx_st* ctx);
  absl::Status Refuse(absl::string_view what, absl::string_view why) const;

  const bool encrypt_;
  const std::string peer_;
  std::array<std::array<uint8_t, 32>, kUses> keys_{};
  std::array<uint8_t, 4> send_salt_{};  // The nonce's first 4 bytes (per direction).
  std::array<uint8_t, 4> recv_salt_{};

  Mutex contexts_mu_;
  std::array<std::vector<evp_cipher_ctx_st*>, kUses> contexts_ ABSL_GUARDED_BY(contexts_mu_);

  Mutex mu_;
  uint64_t next_send_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t recv_floor_ ABSL_GUARDED_BY(mu_) = 0;  // Every counter below has been seen.
  absl::flat_hash_set<uint64_t> recv_seen_ ABSL_GUARDED_BY(mu_);  // Seen, >= recv_floor_.
};

// ---------------------------------------------------------------------------------------------
// Stream sockets.

// The socket handshake's frames (fixed sizes, host byte order like the transport's headers):
//   hello  (client -> server): "LBAU", u16 version, u8 kind 1, u8 flags, u64 identity, nonce
//   answer (server -> client): "LBAU", u16 version, u8 kind 2, u8 flags, u64 identity, nonce, mac
//   proof  (client -> server): "LBAU", u16 version, u8 kind 3, u8 flags, mac
struct AuthFrame {
  uint8_t kind = 0;
  uint8_t flags = 0;
  uint64_t identity = 0;
  Nonce nonce{};
  Mac mac{};
};
inline constexpr size_t kAuthHelloBytes = 32;
inline constexpr size_t kAuthAnswerBytes = 48;
inline constexpr size_t kAuthProofBytes = 24;
std::string EncodeAuthFrame(const AuthFrame& frame);
// DataLoss for anything but one well-formed frame of `kind`.
absl::StatusOr<AuthFrame> ParseAuthFrame(absl::Span<const uint8_t> bytes, uint8_t kind);

// Authenticates a connected stream socket `fd` as a member of the job holding `secret` (client:
// the side that connected). Returns the peer's identity. Reads exactly the handshake's bytes and
// nothing after them. On failure the caller closes `fd`; a refusal is logged at WARN naming
// `peer` and counted. PermissionDenied (wrong secret or a replay), DataLoss (not a handshake),
// DeadlineExceeded, Unavailable (socket failed).
absl::StatusOr<uint64_t> AuthenticateSocket(int fd, HandshakeRole role, const JobSecret& secret,
                                            absl::string_view job_id, uint64_t identity,
                                            absl::Time deadline, absl::string_view peer);

// The job secret from the environment (LBCC_JOB_SECRET or LBCC_JOB_SECRET_FILE; nullopt when
// neither is set). InvalidArgument for a bad one.
absl::StatusOr<std::optional<JobSecret>> JobSecretFromEnv();

// ---------------------------------------------------------------------------------------------
// Counters (process-wide, since a refused connection has no link to count it on).
struct SecurityCounters {
  uint64_t handshakes_passed = 0;
  uint64_t handshakes_refused = 0;   // Peers that failed or skipped authentication.
  uint64_t integrity_failures = 0;   // Sealed chunks that did not verify (or replays).
};
SecurityCounters GetSecurityCounters();
void CountHandshake(bool passed);
void CountIntegrityFailure();
// Logs a refused connection at WARN ("refused connection from <peer>: <why>") and counts it.
void RefuseConnection(absl::string_view peer, absl::string_view why);

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_SECURE_H_
