// Codecs: TopK-EF (SparseLoCo) and dense quantizers, their states, decoding and inspection.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "python/bindings.h"

namespace lbcc::python {
namespace {

using codecs::Codec;
using codecs::CodecState;
using codecs::DenseQuantCodec;
using codecs::TopKEfCodec;
using codecs::TopKEfState;

codecs::IndexCoding ParseIndexCoding(const std::string& name) {
  for (codecs::IndexCoding c : {codecs::IndexCoding::kAuto, codecs::IndexCoding::kPacked12,
                                codecs::IndexCoding::kAdaptive}) {
    if (name == codecs::IndexCodingName(c)) return c;
  }
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("unknown index coding '", name, "' (auto, packed12, adaptive)")));
}

py::bytes Encode(const Codec& codec, py::handle input, std::shared_ptr<CodecState> state,
                 bool commit) {
  TensorView view = ToF32View(input, "input");
  const size_t max = ValueOrThrow(codec.MaxEncodedBytes(view.shape()));
  std::vector<uint8_t> out(max);
  absl::StatusOr<size_t> size;
  {
    py::gil_scoped_release release;
    size = codec.Encode(view, state.get(), absl::MakeSpan(out));
    if (size.ok() && commit && state != nullptr) {
      absl::Status s = state->Commit();
      if (!s.ok()) size = s;
    }
  }
  out.resize(ValueOrThrow(std::move(size)));
  return ToBytes(out);
}

py::dict Summary(const codecs::PayloadSummary& s) {
  py::dict d;
  d["codec"] = std::string(codecs::CodecName(s.codec));
  d["codec_version"] = s.codec_version;
  d["dtype"] = std::string(DTypeName(s.dtype));
  d["shape"] = ShapeTuple(s.shape);
  d["num_elements"] = s.num_elements;
  d["total_bytes"] = s.total_bytes;
  d["bits_per_param"] = s.bits_per_param;
  d["k_per_chunk"] = s.k_per_chunk;
  d["selected"] = s.selected;
  d["details"] = s.details;
  return d;
}

std::shared_ptr<TopKEfCodec> NewTopKEfCodec(double top_k, float beta, float lr,
                                            const std::string& values, const std::string& indices,
                                            float range_sigmas, int64_t value_block,
                                            const std::string& k_rule,
                                            const std::string& chunk_1d) {
  codecs::TopKEfOptions o;
  o.top_k = top_k;
  o.beta = beta;
  o.lr = lr;
  o.values = ValueOrThrow(codecs::ParseValueCoding(values));
  o.indices = ParseIndexCoding(indices);
  o.range_sigmas = range_sigmas;
  o.value_block = value_block;
  o.k_rule = ValueOrThrow(codecs::ParseKRule(k_rule));
  o.chunk_1d = ValueOrThrow(codecs::ParseChunk1D(chunk_1d));
  std::unique_ptr<TopKEfCodec> c = ValueOrThrow(TopKEfCodec::Create(o));
  return std::shared_ptr<TopKEfCodec>(std::move(c));
}

std::shared_ptr<DenseQuantCodec> NewDenseQuantCodec(const std::string& format, int64_t block,
                                                    bool stochastic, uint64_t seed) {
  codecs::DenseQuantOptions o;
  o.format = ValueOrThrow(codecs::ParseDenseFormat(format));
  o.block = block;
  o.stochastic = stochastic;
  o.seed = seed;
  std::unique_ptr<DenseQuantCodec> c = ValueOrThrow(DenseQuantCodec::Create(o));
  return std::shared_ptr<DenseQuantCodec>(std::move(c));
}

// lbcc.decode: one payload (bytes) or a list of them into `out`.
void Decode(py::object payloads, py::handle out, const std::string& aggregation, bool accumulate,
            bool clip_to_median_norm) {
  std::vector<py::bytes> keep;
  if (py::isinstance<py::bytes>(payloads)) {
    keep.push_back(payloads.cast<py::bytes>());
  } else {
    for (py::handle p : payloads) keep.push_back(p.cast<py::bytes>());
  }
  std::vector<absl::Span<const uint8_t>> spans;
  for (const py::bytes& b : keep) spans.push_back(BytesSpan(b));
  TensorView view = ToF32View(out, "out", Access::kWrite);
  codecs::DecodeOptions options;
  options.aggregation = ParseAggregationOrThrow(aggregation);
  options.accumulate = accumulate;
  options.clip_to_median_norm = clip_to_median_norm;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = codecs::DecodeAccumulate(spans, options, view);
  }
  ThrowIfError(status);
}

void BindCodecState(py::module_& m) {
  py::class_<CodecState, std::shared_ptr<CodecState>>(m, "CodecState",
                                                      "Per-tensor memory of a stateful codec.")
      .def_property_readonly("has_pending", &CodecState::has_pending,
                             "True between an encode without commit and commit()/abort().")
      .def(
          "commit", [](CodecState& s) { ThrowIfError(s.Commit()); },
          "Applies the pending update (the payload was delivered).")
      .def(
          "abort", [](CodecState& s) { ThrowIfError(s.Abort()); }, "Drops the pending update.");
}

void BindTopKEfState(py::module_& m) {
  py::class_<TopKEfState, CodecState, std::shared_ptr<TopKEfState>>(
      m, "TopKEfState", "Error-feedback buffer e of one tensor (TopK-EF).")
      .def(py::init([] { return std::make_shared<TopKEfState>(); }))
      .def_property_readonly("initialized", &TopKEfState::initialized)
      .def_property_readonly("shape", [](const TopKEfState& s) { return ShapeTuple(s.shape()); })
      .def_property_readonly(
          "error", [](const TopKEfState& s) { return FloatArray(s.error(), s.shape()); },
          "A copy of the committed error-feedback buffer (numpy float32).")
      .def_property_readonly(
          "pending_error",
          [](const TopKEfState& s) {
            return s.has_pending() ? py::object(FloatArray(s.pending_error(), s.shape()))
                                   : py::object(py::none());
          },
          "A copy of the pending buffer, or None.")
      .def(
          "reset", [](TopKEfState& s, py::handle shape) { ThrowIfError(s.Reset(ToShape(shape))); },
          py::arg("shape"), "Fixes the shape and zeroes the buffer.")
      .def(
          "load",
          [](TopKEfState& s, py::handle error) {
            TensorView v = ToF32View(error, "error");
            ThrowIfError(s.Load(
                v.shape(), absl::Span<const float>(v.data_as<const float>(), v.num_elements())));
          },
          py::arg("error"), "Sets the buffer (shape and values) from a float32 tensor.");
}

void BindCodec(py::module_& m) {
  py::class_<Codec, std::shared_ptr<Codec>>(m, "Codec", "A tensor codec (see codecs/codec.h).")
      .def_property_readonly("name",
                             [](const Codec& c) { return std::string(codecs::CodecName(c.id())); })
      .def("describe", &Codec::Describe)
      .def("__repr__", &Codec::Describe)
      .def(
          "max_encoded_bytes",
          [](const Codec& c, py::handle shape) {
            return ValueOrThrow(c.MaxEncodedBytes(ToShape(shape)));
          },
          py::arg("shape"))
      .def(
          "new_state", [](const Codec& c) -> std::shared_ptr<CodecState> { return c.NewState(); },
          "A fresh state for one tensor, or None for stateless codecs.")
      .def("encode", &Encode, py::arg("input"), py::arg("state") = nullptr,
           py::arg("commit") = true,
           "Encodes a float32 CPU tensor into a self-describing payload (bytes). With a state "
           "and commit=False the state's update stays pending (commit()/abort()).");
}

void BindTopKEfCodec(py::module_& m) {
  py::class_<TopKEfCodec, Codec, std::shared_ptr<TopKEfCodec>>(
      m, "TopKEfCodec", "Chunked top-k with error feedback (SparseLoCo).")
      .def(py::init(&NewTopKEfCodec), py::arg("top_k") = 64.0, py::arg("beta") = 0.95f,
           py::arg("lr") = 1.0f, py::arg("values") = "binmean2", py::arg("indices") = "auto",
           py::arg("range_sigmas") = 6.0f, py::arg("value_block") = 64,
           py::arg("k_rule") = "proportional", py::arg("chunk_1d") = "lbcc",
           "k_rule: proportional (top_k per 4096 elements, k scaled to the chunk) or per_chunk "
           "(templar: top_k in every chunk, min(top_k, len), >= 2, even). chunk_1d: lbcc or "
           "templar (1-D rows of edge(N) <= 64 elements; the same rule) or flat4096 (4096-element "
           "chunks). See codecs/topk_ef.h.")
      .def_property_readonly("top_k", [](const TopKEfCodec& c) { return c.options().top_k; })
      .def_property_readonly("beta", [](const TopKEfCodec& c) { return c.options().beta; })
      .def_property_readonly("lr", [](const TopKEfCodec& c) { return c.options().lr; })
      .def_property_readonly("values",
                             [](const TopKEfCodec& c) {
                               return std::string(codecs::ValueCodingName(c.options().values));
                             })
      .def_property_readonly("k_rule",
                             [](const TopKEfCodec& c) {
                               return std::string(codecs::KRuleName(c.options().k_rule));
                             })
      .def_property_readonly("chunk_1d", [](const TopKEfCodec& c) {
        return std::string(codecs::Chunk1DName(c.options().chunk_1d));
      });
}

void BindDenseQuantCodec(py::module_& m) {
  py::class_<DenseQuantCodec, Codec, std::shared_ptr<DenseQuantCodec>>(
      m, "DenseQuantCodec", "Dense quantizer: int8 / int4 blockwise absmax, fp16, bf16.")
      .def(py::init(&NewDenseQuantCodec), py::arg("format") = "int8", py::arg("block") = 256,
           py::arg("stochastic") = false, py::arg("seed") = 0)
      .def_property_readonly("format", [](const DenseQuantCodec& c) {
        return std::string(codecs::DenseFormatName(c.options().format));
      });
}

// lbcc.decode and lbcc.inspect: payloads of every codec above.
void BindPayloadFunctions(py::module_& m) {
  m.def("decode", &Decode, py::arg("payloads"), py::arg("out"), py::arg("aggregation") = "sum",
        py::arg("accumulate") = false, py::arg("clip_to_median_norm") = false,
        "Decodes one payload or a list (rank order) into `out` (float32 CPU, the payloads' "
        "shape), combined by `aggregation` (sparseloco, mean, sum); nothing is written on error. "
        "clip_to_median_norm: templar's outer step, each payload scaled by "
        "min(1, median(norms) / (norm + 1e-8)) first (TopK-EF payloads).");
  m.def(
      "inspect",
      [](const py::bytes& payload) {
        return Summary(ValueOrThrow(codecs::InspectPayload(BytesSpan(payload))));
      },
      py::arg("payload"), "Validates a TopK-EF or dense payload and summarises it (a dict).");
}

}  // namespace

codecs::Aggregation ParseAggregationOrThrow(const std::string& name) {
  return ValueOrThrow(codecs::ParseAggregation(name));
}

void BindCodecs(py::module_& m) {
  BindCodecState(m);
  BindTopKEfState(m);
  BindCodec(m);
  BindTopKEfCodec(m);
  BindDenseQuantCodec(m);
  BindPayloadFunctions(m);
}

}  // namespace lbcc::python
