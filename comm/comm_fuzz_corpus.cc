// Writes the seed corpora of comm/'s network-byte fuzzers with the production encoders and real
// ids:
//   bootstrap_corpus/:  [u8 nranks - 1] + a rank's hello (internal::EncodeHello), the root's
//                       table (EncodeTable) and its error replies (EncodeErrorReply) as
//                       RunRoot sends them;
//   unique_id_corpus/:  ids from CreateUniqueId (a root on 127.0.0.1, with and without
//                       LBCC_SECRET_IN_ID) and UniqueIdFromAddress (IPv4, IPv6);
//   topology_corpus/:   topologies' canonical JSON (Topology::ToJson) and the documented
//                       form with islands, replicas and link overrides.
//
//   bazel run //comm:comm_fuzz_corpus -- $PWD/comm/testdata
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/bootstrap.h"
#include "comm/topology.h"

namespace {

using namespace lbcc::comm;

int written = 0;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++written;
}

std::string IdBytes(const UniqueId& id) { return std::string(id.internal, kUniqueIdBytes); }

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", std::string(v.status().ToString()).c_str());
    std::exit(1);
  }
  return *std::move(v);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: comm_fuzz_corpus <comm/testdata>\n");
    return 2;
  }
  const std::string dir = argv[1];

  // Bootstrap: a rank's blob is its transport address and host name (fabric.cc's); any bytes.
  const std::string blob = std::string("127.0.0.1:41234\0vm\0", 19);
  const std::string b = dir + "/bootstrap_corpus/";
  for (uint32_t nranks : {1u, 4u}) {
    internal::BootstrapHello hello{0x1234567890abcdefull, nranks, nranks - 1, blob};
    Write(absl::StrCat(b, "hello_", nranks), std::string(1, static_cast<char>(nranks - 1)) +
                                                 internal::EncodeHello(hello));
    std::vector<std::string> blobs;
    for (uint32_t r = 0; r < nranks; ++r) blobs.push_back(absl::StrCat("127.0.0.1:4123", r));
    Write(absl::StrCat(b, "table_", nranks),
          std::string(1, static_cast<char>(nranks - 1)) + internal::EncodeTable(blobs));
  }
  Write(b + "error_missing",
        std::string(1, '\x03') +
            internal::EncodeErrorReply(absl::DeadlineExceededError(
                "bootstrap: rank(s) 2,3 of 4 never joined before the timeout")));
  Write(b + "error_no_secret",
        std::string(1, '\x01') + internal::EncodeErrorReply(absl::PermissionDeniedError(
                                     "bootstrap: this job requires a job secret and this rank "
                                     "has none")));
  // The finding fixed with DecodeReply: an error reply whose code is OK (it read as success).
  Write(b + "error_code_ok",
        std::string(1, '\x01') + std::string("\0\0\0\0\0bad", 8));

  // Unique ids: real ones (the roots listen on 127.0.0.1 for a second and are never joined).
  const std::string u = dir + "/unique_id_corpus/";
  Write(u + "created", IdBytes(OrDie(CreateUniqueId("127.0.0.1", absl::Seconds(1)))));
  setenv("LBCC_SECRET_IN_ID", "1", 1);
  Write(u + "created_with_secret", IdBytes(OrDie(CreateUniqueId("127.0.0.1", absl::Seconds(1)))));
  unsetenv("LBCC_SECRET_IN_ID");
  Write(u + "fixed_ipv4", IdBytes(OrDie(UniqueIdFromAddress("10.0.0.1:29500", 42))));
  Write(u + "fixed_ipv6", IdBytes(OrDie(UniqueIdFromAddress("[fd77::1]:29500", 42))));

  // Topologies.
  const std::string t = dir + "/topology_corpus/";
  Write(t + "documented", R"({
  "nranks": 5,
  "islands": [[0, 1]],
  "replicas": [{"kind": "full", "rank": 0}, {"kind": "full", "rank": 1},
               {"kind": "pipeline", "stages": [2, 3, 4]}],
  "links": [{"ranks": [3, 4], "class": "fast"}]
})");
  Write(t + "flat", Topology::Flat(3).ToJson());
  Write(t + "hosts", OrDie(Topology::FromHostnames({"a", "a", "b", "c", "c"})).ToJson());
  Write(t + "nranks_only", R"({"nranks": 2})");
  std::printf("wrote %d seed files\n", written);
  return 0;
}
