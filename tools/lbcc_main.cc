// lbcc: LBCC's command-line tool.
//
//   lbcc version            print the version
//   lbcc env [--check]      list every LBCC_* variable with its default and current value;
//                           --check exits 1 when a set variable is unknown or invalid
//   lbcc codec encode|decode|inspect ...
//                           encode a raw fp32 file into a codec payload, decode payloads (one or
//                           several replicas, aggregated) back to raw fp32, print a payload's
//                           header; `lbcc codec --help` for the options
//   lbcc plan ...           predict a job's step time, bytes and utilization (plan/)
//   lbcc help               this text
//
// Options are Abseil flags read through tools/cli.h (the same rules as every LBCC binary: --help
// exits 0, an unknown option exits 2 naming it); each subcommand accepts only its own.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "base/tensor_view.h"
#include "base/version.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"

#include "tools/cli.h"

// Every subcommand's options (see kCodecUsage); a subcommand accepts only its own. Values are
// read as text and checked by the subcommand, so that its errors name the option.
ABSL_FLAG(bool, check, false, "env: exit 1 when a set LBCC_* variable is unknown or invalid");
ABSL_FLAG(std::string, in, "", "codec encode: raw fp32 input file");
ABSL_FLAG(std::string, shape, "", "codec encode: D0,D1,...");
ABSL_FLAG(std::string, out, "", "codec encode: payload file; decode: fp32 output file");
ABSL_FLAG(std::string, codec, "topk_ef", "codec encode: topk_ef or dense_quant");
ABSL_FLAG(std::string, top_k, "64", "codec encode (topk_ef): selected per 4096 elements");
ABSL_FLAG(std::string, density, "", "codec encode (topk_ef): fraction selected");
ABSL_FLAG(std::string, beta, "0.95", "codec encode (topk_ef): error decay");
ABSL_FLAG(std::string, lr, "1", "codec encode (topk_ef): outer learning rate");
ABSL_FLAG(std::string, values, "binmean2", "codec encode (topk_ef): value coding");
ABSL_FLAG(std::string, indices, "auto", "codec encode (topk_ef): auto, packed12 or adaptive");
ABSL_FLAG(std::string, range_sigmas, "6", "codec encode (topk_ef): bin-mean range");
ABSL_FLAG(std::string, value_block, "64", "codec encode (topk_ef): absmax values per scale");
ABSL_FLAG(std::string, state_in, "", "codec encode (topk_ef): error-feedback file to start from");
ABSL_FLAG(std::string, state_out, "", "codec encode (topk_ef): error-feedback file to write");
ABSL_FLAG(std::string, format, "int8", "codec encode (dense_quant): int8, int4, fp16 or bf16");
ABSL_FLAG(std::string, block, "256", "codec encode (dense_quant): elements per absmax scale");
ABSL_FLAG(std::string, stochastic_seed, "", "codec encode (dense_quant): stochastic rounding seed");
ABSL_FLAG(std::string, aggregate, "sparseloco", "codec decode: sparseloco, mean or sum");
ABSL_FLAG(bool, accumulate, false, "codec decode: add into the existing --out file");

#include "plan/cli.h"


namespace {

constexpr char kUsage[] =
    "usage: lbcc <command> [options]\n"
    "\n"
    "commands:\n"
    "  version           print LBCC's version\n"
    "  env [--check]     list LBCC_* environment variables (type, default, current value);\n"
    "                    --check: exit 1 if a set LBCC_* variable is unknown or invalid\n"
    "  codec encode|decode|inspect ...\n"
    "                    compress a raw fp32 tensor file, decode payloads back to fp32,\n"
    "                    describe payloads; see `lbcc codec --help`\n"
    "  plan ...          predict step time, bytes and utilization of a job; `lbcc plan --help`\n"
    "  help              show this text\n";

constexpr char kCodecUsage[] =
    "usage:\n"
    "  lbcc codec encode --in=FILE --shape=D0,D1,... --out=PAYLOAD [options]\n"
    "  lbcc codec decode --out=FILE [--aggregate=sparseloco|mean|sum] [--accumulate]\n"
    "                    PAYLOAD [PAYLOAD ...]\n"
    "  lbcc codec inspect PAYLOAD [PAYLOAD ...]\n"
    "\n"
    "Tensor files are raw little-endian float32, row-major, no header.\n"
    "\n"
    "encode options:\n"
    "  --codec=topk_ef|dense_quant   (default topk_ef)\n"
    "  topk_ef (chunked top-k with error feedback; defaults are SparseLoCo's):\n"
    "    --top_k=N            selected per 4096 elements (default 64), or\n"
    "    --density=F          fraction selected (top_k = F * 4096)\n"
    "    --beta=F             error decay (default 0.95)\n"
    "    --lr=F               outer learning rate applied before compression (default 1)\n"
    "    --values=CODING      binmean2 (= 2bit, default), binmean4, binmean8, absmax8,\n"
    "                         absmax4, bf16, fp16, fp32\n"
    "    --indices=CODING     auto (default: the smaller), packed12, adaptive\n"
    "    --range_sigmas=F     bin-mean range (default 6)\n"
    "    --value_block=N      absmax codings: values per scale (default 64)\n"
    "    --state_in=FILE      error-feedback buffer to start from (raw fp32; default zeros)\n"
    "    --state_out=FILE     write the error-feedback buffer after this round\n"
    "  dense_quant (every element):\n"
    "    --format=int8|int4|fp16|bf16   (default int8)\n"
    "    --block=N            elements per absmax scale, multiple of 16 (default 256)\n"
    "    --stochastic_seed=N  stochastic rounding, reproducible from the seed\n"
    "\n"
    "decode options:\n"
    "  payloads are given in rank order; their aggregate is written to --out:\n"
    "  --aggregate=sparseloco   per coordinate, mean over the replicas that selected it (default)\n"
    "  --aggregate=mean         mean over all replicas;  --aggregate=sum: sum\n"
    "  --accumulate             add the aggregate into the existing --out file instead\n"
    "\n"
    "example:\n"
    "  lbcc codec encode --in=delta.f32 --shape=4096,4096 --top_k=64 --state_out=ef.f32 \\\n"
    "      --out=rank0.lbcc\n"
    "  lbcc codec inspect rank0.lbcc\n"
    "  lbcc codec decode --out=update.f32 rank0.lbcc rank1.lbcc\n";

// A subcommand's flags: Abseil flags, read through tools/cli.h like every LBCC binary's. A
// subcommand accepts only the names in its `known` list; each value is the flag's text.
struct Args {
  std::map<std::string, std::string> flags;
  std::vector<std::string> positional;
  bool help = false;

  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
};

// argv holds the subcommand's arguments only (no program name).
absl::StatusOr<Args> ParseArgs(int argc, char** argv, const std::vector<std::string>& known) {
  std::vector<char*> full = {const_cast<char*>("lbcc")};
  full.insert(full.end(), argv, argv + argc);
  LBCC_ASSIGN_OR_RETURN(lbcc::cli::Parsed parsed,
                        lbcc::cli::Parse(static_cast<int>(full.size()), full.data()));
  Args args;
  args.positional = std::move(parsed.positional);
  args.help = parsed.help;
  for (const std::string& name : parsed.given) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", name));
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const std::string value = flag->CurrentValue();
    // A boolean counts as given only when true (--noaccumulate is the default).
    if (flag->IsOfType<bool>() && value != "true") continue;
    args.flags[name] = value;
  }
  return args;
}

int Env(int argc, char** argv) {
  absl::StatusOr<Args> args = ParseArgs(argc, argv, {"check"});
  if (!args.ok() || !args->positional.empty()) {
    const std::string why = args.ok() ? absl::StrCat("unexpected argument ", args->positional[0])
                                      : std::string(args.status().message());
    std::fprintf(stderr, "lbcc env: %s\n%s", why.c_str(), kUsage);
    return 2;
  }
  if (args->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool check = args->Has("check");
  std::fputs(lbcc::env::DescribeAll().c_str(), stdout);
  absl::Status status = lbcc::env::ValidateEnvironment();
  if (!status.ok()) {
    std::fprintf(stderr, "lbcc env: %s\n", std::string(status.message()).c_str());
    return check ? 1 : 0;
  }
  return 0;
}

absl::StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

absl::Status WriteFile(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ReadFloats(const std::string& path, int64_t expected) {
  LBCC_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  if (bytes.size() != static_cast<size_t>(expected) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has ", bytes.size(), " bytes; ",
                                                   expected, " float32 values need ",
                                                   expected * sizeof(float)));
  }
  std::vector<float> values(static_cast<size_t>(expected));
  if (!bytes.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

absl::StatusOr<lbcc::Shape> ParseShape(const std::string& text) {
  lbcc::Shape shape;
  if (text.empty() || text == "scalar") return shape;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(",x"))) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --shape '", text, "': expected D0,D1,..."));
    }
    shape.push_back(dim);
  }
  LBCC_RETURN_IF_ERROR(lbcc::NumElements(shape).status());
  return shape;
}

template <typename T>
absl::Status ParseNumber(const Args& args, const std::string& name, T* out) {
  if (!args.Has(name)) return absl::OkStatus();
  const std::string text = args.Get(name);
  bool ok;
  if constexpr (std::is_same_v<T, float>) {
    ok = absl::SimpleAtof(text, out);
  } else if constexpr (std::is_same_v<T, double>) {
    ok = absl::SimpleAtod(text, out);
  } else {
    ok = absl::SimpleAtoi(text, out);
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("bad --", name, "='", text, "'"));
  return absl::OkStatus();
}

void PrintSummary(const std::string& name, const lbcc::codecs::PayloadSummary& s) {
  std::printf("%s: %s v%d, %s%s, %lld elements\n", name.c_str(),
              std::string(lbcc::codecs::CodecName(s.codec)).c_str(), s.codec_version,
              std::string(lbcc::DTypeName(s.dtype)).c_str(), lbcc::ShapeToString(s.shape).c_str(),
              static_cast<long long>(s.num_elements));
  if (s.k_per_chunk > 0) {
    std::printf("  k %lld per chunk, %lld selected\n", static_cast<long long>(s.k_per_chunk),
                static_cast<long long>(s.selected));
  }
  std::printf("  %zu bytes, %.4f bits/param\n", s.total_bytes, s.bits_per_param);
  std::printf("  %s\n", s.details.c_str());
}

absl::Status Encode(const Args& args) {
  using namespace lbcc::codecs;
  if (!args.Has("in") || !args.Has("shape") || !args.Has("out")) {
    return absl::InvalidArgumentError("encode needs --in, --shape and --out");
  }
  LBCC_ASSIGN_OR_RETURN(lbcc::Shape shape, ParseShape(args.Get("shape")));
  LBCC_ASSIGN_OR_RETURN(int64_t n, lbcc::NumElements(shape));
  LBCC_ASSIGN_OR_RETURN(std::vector<float> input, ReadFloats(args.Get("in"), n));
  LBCC_ASSIGN_OR_RETURN(lbcc::TensorView view, lbcc::TensorView::Host(input.data(), shape));
  const std::string codec_name = args.Get("codec", "topk_ef");
  std::unique_ptr<Codec> codec;
  std::unique_ptr<TopKEfState> state;
  if (codec_name == "topk_ef") {
    TopKEfOptions options;
    if (args.Has("top_k") && args.Has("density")) {
      return absl::InvalidArgumentError("give --top_k or --density, not both");
    }
    LBCC_RETURN_IF_ERROR(ParseNumber(args, "top_k", &options.top_k));
    if (args.Has("density")) {
      double density = 0;
      LBCC_RETURN_IF_ERROR(ParseNumber(args, "density", &density));
      options.top_k = density * kTopKReferenceChunk;
    }
    LBCC_RETURN_IF_ERROR(ParseNumber(args, "beta", &options.beta));
    LBCC_RETURN_IF_ERROR(ParseNumber(args, "lr", &options.lr));
    LBCC_RETURN_IF_ERROR(ParseNumber(args, "range_sigmas", &options.range_sigmas));
    LBCC_RETURN_IF_ERROR(ParseNumber(args, "value_block", &options.value_block));
    if (args.Has("values")) {
      LBCC_ASSIGN_OR_RETURN(options.values, ParseValueCoding(args.Get("values")));
    }
    const std::string indices = args.Get("indices", "auto");
    if (indices == "auto") {
      options.indices = IndexCoding::kAuto;
    } else if (indices == "packed12" || indices == "12bit") {
      options.indices = IndexCoding::kPacked12;
    } else if (indices == "adaptive") {
      options.indices = IndexCoding::kAdaptive;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --indices '", indices, "': expected auto, packed12 or adaptive"));
    }
    LBCC_ASSIGN_OR_RETURN(codec, TopKEfCodec::Create(options));
    state = std::make_unique<TopKEfState>();
    if (args.Has("state_in")) {
      LBCC_ASSIGN_OR_RETURN(std::vector<float> e, ReadFloats(args.Get("state_in"), n));
      LBCC_RETURN_IF_ERROR(state->Load(shape, e));
    } else {
      LBCC_RETURN_IF_ERROR(state->Reset(shape));
    }
  } else if (codec_name == "dense_quant") {
    if (args.Has("state_in") || args.Has("state_out")) {
      return absl::InvalidArgumentError("dense_quant has no error-feedback state");
    }
    DenseQuantOptions options;
    if (args.Has("format")) {
      LBCC_ASSIGN_OR_RETURN(options.format, ParseDenseFormat(args.Get("format")));
    }
    LBCC_RETURN_IF_ERROR(ParseNumber(args, "block", &options.block));
    if (args.Has("stochastic_seed")) {
      options.stochastic = true;
      LBCC_RETURN_IF_ERROR(ParseNumber(args, "stochastic_seed", &options.seed));
    }
    LBCC_ASSIGN_OR_RETURN(codec, DenseQuantCodec::Create(options));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --codec '", codec_name, "': expected topk_ef or dense_quant"));
  }
  LBCC_ASSIGN_OR_RETURN(size_t max_bytes, codec->MaxEncodedBytes(shape));
  std::vector<uint8_t> payload(max_bytes);
  LBCC_ASSIGN_OR_RETURN(size_t size, codec->Encode(view, state.get(), absl::MakeSpan(payload)));
  LBCC_RETURN_IF_ERROR(WriteFile(args.Get("out"), payload.data(), size));
  if (state != nullptr) {
    // The payload is "delivered" once written: commit the round.
    LBCC_RETURN_IF_ERROR(state->Commit());
    if (args.Has("state_out")) {
      LBCC_RETURN_IF_ERROR(WriteFile(args.Get("state_out"), state->error().data(),
                                     state->error().size() * sizeof(float)));
    }
  }
  LBCC_ASSIGN_OR_RETURN(PayloadSummary summary,
                        InspectPayload(absl::MakeConstSpan(payload).subspan(0, size)));
  std::printf("%s\n", codec->Describe().c_str());
  PrintSummary(args.Get("out"), summary);
  return absl::OkStatus();
}

absl::Status Decode(const Args& args) {
  using namespace lbcc::codecs;
  if (!args.Has("out") || args.positional.empty()) {
    return absl::InvalidArgumentError("decode needs --out and at least one payload");
  }
  DecodeOptions options;
  LBCC_ASSIGN_OR_RETURN(options.aggregation, ParseAggregation(args.Get("aggregate", "sparseloco")));
  options.accumulate = args.Has("accumulate");
  std::vector<std::vector<uint8_t>> files;
  for (const std::string& path : args.positional) {
    LBCC_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
    files.push_back(std::move(bytes));
  }
  LBCC_ASSIGN_OR_RETURN(PayloadInfo first, ParsePayload(files[0]), _.Prepend(args.positional[0]));
  std::vector<float> out(static_cast<size_t>(first.num_elements), 0.0f);
  if (options.accumulate) {
    LBCC_ASSIGN_OR_RETURN(out, ReadFloats(args.Get("out"), first.num_elements),
                          _.Prepend("--accumulate reads the existing --out"));
  }
  LBCC_ASSIGN_OR_RETURN(lbcc::TensorView view, lbcc::TensorView::Host(out.data(), first.shape));
  std::vector<absl::Span<const uint8_t>> spans(files.begin(), files.end());
  LBCC_RETURN_IF_ERROR(DecodeAccumulate(spans, options, view));
  LBCC_RETURN_IF_ERROR(WriteFile(args.Get("out"), out.data(), out.size() * sizeof(float)));
  std::printf("decoded %zu payload(s) of %s%s (%s) into %s\n", files.size(),
              std::string(CodecName(first.codec)).c_str(), lbcc::ShapeToString(first.shape).c_str(),
              std::string(AggregationName(options.aggregation)).c_str(), args.Get("out").c_str());
  return absl::OkStatus();
}

absl::Status Inspect(const Args& args) {
  if (args.positional.empty()) return absl::InvalidArgumentError("inspect needs a payload file");
  for (const std::string& path : args.positional) {
    LBCC_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
    LBCC_ASSIGN_OR_RETURN(lbcc::codecs::PayloadSummary summary, lbcc::codecs::InspectPayload(bytes),
                          _.Prepend(path));
    PrintSummary(path, summary);
  }
  return absl::OkStatus();
}

int Codec(int argc, char** argv) {
  const std::string sub = argc > 0 ? argv[0] : "";
  if (sub.empty() || sub == "--help" || sub == "-h" || sub == "help") {
    std::fputs(kCodecUsage, sub.empty() ? stderr : stdout);
    return sub.empty() ? 2 : 0;
  }
  std::vector<std::string> known;
  absl::Status (*run)(const Args&) = nullptr;
  if (sub == "encode") {
    known = {"in",       "shape",     "out",    "codec",   "top_k",          "density",
             "beta",     "lr",        "values", "indices", "range_sigmas",   "value_block",
             "state_in", "state_out", "format", "block",   "stochastic_seed"};
    run = Encode;
  } else if (sub == "decode") {
    known = {"out", "aggregate", "accumulate"};
    run = Decode;
  } else if (sub == "inspect") {
    run = Inspect;
  } else {
    std::fprintf(stderr, "lbcc codec: unknown subcommand '%s'\n%s", sub.c_str(), kCodecUsage);
    return 2;
  }
  absl::StatusOr<Args> args = ParseArgs(argc - 1, argv + 1, known);
  if (!args.ok()) {
    std::fprintf(stderr, "lbcc codec %s: %s (see lbcc codec --help)\n", sub.c_str(),
                 std::string(args.status().message()).c_str());
    return 2;
  }
  if (args->help) {
    std::fputs(kCodecUsage, stdout);
    return 0;
  }
  const absl::Status status = run(*args);
  if (!status.ok()) {
    std::fprintf(stderr, "lbcc codec %s: %s\n", sub.c_str(), status.ToString().c_str());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "version") {
    absl::StatusOr<Args> args = ParseArgs(argc - 2, argv + 2, {});
    if (!args.ok() || !args->positional.empty()) {
      std::fprintf(stderr, "lbcc version: %s\n",
                   args.ok() ? "takes no arguments" : std::string(args.status().message()).c_str());
      return 2;
    }
    if (args->help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::printf("LBCC %s\n", LBCC_VERSION_STRING);
    return 0;
  }
  if (command == "env") return Env(argc - 2, argv + 2);
  if (command == "codec") return Codec(argc - 2, argv + 2);
  if (command == "plan") return lbcc::plan::PlanMain(argc - 2, argv + 2);
  std::fprintf(stderr, "lbcc: unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
