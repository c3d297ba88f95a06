// The subspace activation codec: basis, forward/backward codec, training-side helpers.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "codecs/subspace_training.h"
#include "codecs/table_delta.h"
#include "python/bindings.h"

namespace lbcc::python {
namespace {

using codecs::SubspaceBasis;
using codecs::SubspaceCodec;

std::vector<float> FloatVector(py::handle obj, const char* what) {
  if (obj.is_none()) return {};
  TensorView v = ToF32View(obj, what);
  const float* p = v.data_as<const float>();
  return std::vector<float>(p, p + v.num_elements());
}

codecs::SubspaceArithmetic ParseArithmetic(const std::string& name) {
  if (name == "portable") return codecs::SubspaceArithmetic::kPortable;
  if (name == "blas") return codecs::SubspaceArithmetic::kBlas;
  throw StatusError(
      absl::InvalidArgumentError(absl::StrCat("unknown arithmetic '", name, "' (portable, blas)")));
}

codecs::ModelDimSide ParseSide(const std::string& name) {
  if (name == "rows") return codecs::ModelDimSide::kRows;
  if (name == "columns") return codecs::ModelDimSide::kColumns;
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("unknown side '", name, "' (rows: W is [d, n]; columns: W is [n, d])")));
}

py::dict EnergyDict(const codecs::SubspaceEnergy& e) {
  py::dict d;
  d["total"] = e.total;
  d["captured"] = e.captured;
  d["residual"] = e.residual;
  d["residual_fraction"] = e.residual_fraction();
  return d;
}

py::dict HeaderDict(const codecs::SubspacePayloadHeader& h) {
  py::dict d;
  d["direction"] = h.direction == codecs::SubspaceDirection::kForward ? "forward" : "backward";
  d["basis_hash"] = h.basis.hash;
  d["basis_version"] = h.basis.version;
  d["tokens"] = h.tokens;
  d["model_dim"] = h.model_dim;
  d["rank"] = h.rank;
  d["components"] = h.components;
  d["vocab_size"] = h.vocab_size;
  d["id_width"] = h.id_width;
  d["mixture_block"] = h.mixture_block;
  d["coefficient_dtype"] = std::string(DTypeName(h.coefficient_dtype));
  d["total_bytes"] = h.total_bytes;
  return d;
}

codecs::TableRefreshMode ParseRefreshMode(const std::string& name) {
  if (name == "lossy") return codecs::TableRefreshMode::kLossy;
  if (name == "constrained") return codecs::TableRefreshMode::kConstrained;
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", name, "' (lossy, constrained)")));
}

py::dict TableDeltaDict(const codecs::TableDeltaInfo& info) {
  py::dict d;
  d["n"] = info.elements;
  d["m"] = info.changed;
  d["encoding"] = std::string(codecs::TableDeltaEncodingName(info.encoding));
  d["position_bytes"] = info.position_bytes;
  d["bytes"] = info.total_bytes;
  return d;
}

absl::Span<const float> FloatSpan(const TensorView& v) {
  return absl::MakeConstSpan(v.data_as<const float>(), static_cast<size_t>(v.num_elements()));
}

PyBasis Wrap(absl::StatusOr<std::shared_ptr<const SubspaceBasis>> b) {
  return PyBasis{ValueOrThrow(std::move(b))};
}

}  // namespace

codecs::SubspaceSelectors ToSelectors(py::handle obj) {
  codecs::SubspaceSelectors s;
  if (obj.is_none()) return s;
  py::tuple t = obj.cast<py::tuple>();
  if (t.size() != 2) throw py::value_error("selectors: expected (mixture_block, bytes) or None");
  s.mixture_block = t[0].cast<int64_t>();
  absl::Span<const uint8_t> values = BytesSpan(t[1].cast<py::bytes>());
  s.values.assign(values.begin(), values.end());
  return s;
}

py::object SelectorsObject(const codecs::SubspaceSelectors& s) {
  if (s.mixture_block == 0) return py::none();
  return py::make_tuple(s.mixture_block, ToBytes(s.values));
}

namespace {

// --- lbcc.SubspaceBasis ---------------------------------------------------------------------

PyBasis BasisFromSeed(int64_t model_dim, int64_t rank, int64_t components, int64_t vocab_size,
                      bool with_table, double table_stddev, uint64_t seed, uint32_t version) {
  codecs::SubspaceSeedSpec spec;
  spec.model_dim = model_dim;
  spec.rank = rank;
  spec.components = components;
  spec.vocab_size = vocab_size;
  spec.with_table = with_table;
  spec.table_stddev = table_stddev;
  spec.seed = seed;
  spec.version = version;
  py::gil_scoped_release release;
  return Wrap(SubspaceBasis::FromSeed(spec));
}

PyBasis BasisFromMatrices(py::handle u, py::handle table, int64_t components, int64_t vocab_size,
                          uint32_t version, double tolerance) {
  TensorView uv = ToF32View(u, "u");
  if (uv.rank() != 2 || uv.dim(1) % components != 0) {
    throw py::value_error("u: expected [d, components * k]");
  }
  std::vector<float> uvec = FloatVector(u, "u");
  std::vector<float> tvec = FloatVector(table, "table");
  if (!table.is_none() && vocab_size == 0) {
    vocab_size = static_cast<int64_t>(tvec.size()) / std::max<int64_t>(uv.dim(0), 1);
  }
  return Wrap(SubspaceBasis::FromMatrices(uv.dim(0), uv.dim(1) / components, components,
                                          vocab_size, std::move(uvec), std::move(tvec), version,
                                          tolerance));
}

py::array_t<float> BasisU(const PyBasis& b) {
  const int64_t shape[] = {b.basis->model_dim(), b.basis->ld()};
  return FloatArray(b.basis->u(), shape);
}

py::object BasisTable(const PyBasis& b) {
  if (!b.basis->has_table()) return py::none();
  const int64_t shape[] = {b.basis->vocab_size(), b.basis->model_dim()};
  return FloatArray(b.basis->table(), shape);
}

std::string BasisRepr(const PyBasis& b) {
  return absl::StrCat("SubspaceBasis(d=", b.basis->model_dim(), ", k=", b.basis->rank(),
                      ", M=", b.basis->components(), ", V=", b.basis->vocab_size(),
                      ", id=", b.basis->id().ToString(), ")");
}

void BindSubspaceBasis(py::module_& m) {
  py::class_<PyBasis>(m, "SubspaceBasis",
                      "U (d x k orthonormal; M components for a mixture) and an optional token "
                      "table T (V x d), identified by content hash and version.")
      .def_static("from_seed", &BasisFromSeed, py::arg("model_dim"), py::arg("rank"),
                  py::arg("components") = 1, py::arg("vocab_size") = 0,
                  py::arg("with_table") = false, py::arg("table_stddev") = 1.0,
                  py::arg("seed") = 0, py::arg("version") = 0,
                  "A portable seeded basis: bit-identical on every x86-64 machine.")
      .def_static("from_matrices", &BasisFromMatrices, py::arg("u"),
                  py::arg("table") = py::none(), py::arg("components") = 1,
                  py::arg("vocab_size") = 0, py::arg("version") = 0,
                  py::arg("orthonormality_tolerance") = 1e-4)
      .def_static(
          "parse",
          [](const py::bytes& bytes) { return Wrap(SubspaceBasis::Parse(BytesSpan(bytes))); },
          py::arg("data"))
      .def_static(
          "load", [](const std::string& path) { return Wrap(SubspaceBasis::Load(path)); },
          py::arg("path"))
      .def("serialize", [](const PyBasis& b) { return ToBytes(b.basis->Serialize()); })
      .def(
          "save",
          [](const PyBasis& b, const std::string& path) { ThrowIfError(b.basis->Save(path)); },
          py::arg("path"))
      .def(
          "with_table",
          [](const PyBasis& b, py::handle table, uint32_t version) {
            return Wrap(b.basis->WithTable(FloatVector(table, "table"), version));
          },
          py::arg("table"), py::arg("version"))
      .def_property_readonly("model_dim", [](const PyBasis& b) { return b.basis->model_dim(); })
      .def_property_readonly("rank", [](const PyBasis& b) { return b.basis->rank(); })
      .def_property_readonly("components", [](const PyBasis& b) { return b.basis->components(); })
      .def_property_readonly("vocab_size", [](const PyBasis& b) { return b.basis->vocab_size(); })
      .def_property_readonly("has_table", [](const PyBasis& b) { return b.basis->has_table(); })
      .def_property_readonly("hash", [](const PyBasis& b) { return b.basis->id().hash; })
      .def_property_readonly("version", [](const PyBasis& b) { return b.basis->id().version; })
      .def_property_readonly(
          "id",
          [](const PyBasis& b) {
            return py::make_tuple(b.basis->id().hash, b.basis->id().version);
          },
          "(content hash, version): equal ids mean identical bytes.")
      .def_property_readonly(
          "u", &BasisU, "A copy of U as numpy [d, M * k] (component m: columns m*k .. m*k + k).")
      .def_property_readonly("table", &BasisTable, "A copy of T as numpy [V, d], or None.")
      .def("orthonormality_error", [](const PyBasis& b) { return b.basis->OrthonormalityError(); })
      .def("__eq__",
           [](const PyBasis& a, const PyBasis& b) { return a.basis->id() == b.basis->id(); })
      // Immutable: copies share the basis; pickles carry the file image (checked on load).
      .def("__copy__", [](const PyBasis& b) { return b; })
      .def(
          "__deepcopy__", [](const PyBasis& b, py::handle) { return b; }, py::arg("memo"))
      .def(
          py::pickle([](const PyBasis& b) { return py::make_tuple(ToBytes(b.basis->Serialize())); },
                     [](const py::tuple& t) {
                       if (t.size() != 1) throw py::value_error("SubspaceBasis: bad pickle");
                       return Wrap(SubspaceBasis::Parse(BytesSpan(t[0].cast<py::bytes>())));
                     }))
      .def("__hash__",
           [](const PyBasis& b) {
             return static_cast<size_t>(b.basis->id().hash ^ b.basis->id().version);
           })
      .def("__repr__", &BasisRepr);
}

// --- lbcc.SubspaceCodec ---------------------------------------------------------------------

std::shared_ptr<PySubspaceCodec> NewSubspaceCodec(const PyBasis& basis,
                                                  const std::string& coefficient_dtype,
                                                  int64_t int8_block, int64_t mixture_block) {
  codecs::SubspaceCodecOptions o;
  o.coefficient_dtype = ValueOrThrow(ParseDType(coefficient_dtype));
  o.int8_block = int8_block;
  o.mixture_block = mixture_block;
  return std::make_shared<PySubspaceCodec>(ValueOrThrow(SubspaceCodec::Create(basis.basis, o)));
}

py::tuple EncodeForward(PySubspaceCodec& c, py::handle h, py::handle ids) {
  TensorView hv = ToF32View(h, "h");
  absl::Span<const int32_t> idv;
  if (!ids.is_none()) idv = ToIds(ids, "ids");
  codecs::SubspaceSelectors selectors;
  absl::StatusOr<std::vector<uint8_t>> payload;
  {
    py::gil_scoped_release release;
    MutexLock lock(&c.mu);
    payload = c.codec.EncodeForward(hv, idv, &selectors);
  }
  return py::make_tuple(ToBytes(ValueOrThrow(std::move(payload))), SelectorsObject(selectors));
}

py::object DecodeForward(PySubspaceCodec& c, const py::bytes& payload, py::handle h_out,
                         py::handle ids_out) {
  TensorView hv = ToF32View(h_out, "h_out", Access::kWrite);
  absl::Span<int32_t> idv;
  if (!ids_out.is_none()) {
    TensorView iv = ToView(ids_out, "ids_out", {DType::kI32}, Access::kWrite);
    idv = absl::Span<int32_t>(iv.data_as<int32_t>(), iv.num_elements());
  }
  codecs::SubspaceSelectors selectors;
  absl::Status status;
  {
    py::gil_scoped_release release;
    MutexLock lock(&c.mu);
    status = c.codec.DecodeForward(BytesSpan(payload), hv, idv, &selectors);
  }
  ThrowIfError(status);
  return SelectorsObject(selectors);
}

py::bytes EncodeBackward(PySubspaceCodec& c, py::handle g, py::handle selectors) {
  TensorView gv = ToF32View(g, "g");
  codecs::SubspaceSelectors sel = ToSelectors(selectors);
  absl::StatusOr<std::vector<uint8_t>> payload;
  {
    py::gil_scoped_release release;
    MutexLock lock(&c.mu);
    payload = c.codec.EncodeBackward(gv, sel);
  }
  return ToBytes(ValueOrThrow(std::move(payload)));
}

void DecodeBackward(PySubspaceCodec& c, const py::bytes& payload, py::handle g_out) {
  TensorView gv = ToF32View(g_out, "g_out", Access::kWrite);
  absl::Status status;
  {
    py::gil_scoped_release release;
    MutexLock lock(&c.mu);
    status = c.codec.DecodeBackward(BytesSpan(payload), gv);
  }
  ThrowIfError(status);
}

py::dict MeasureEnergy(PySubspaceCodec& c, py::handle h, py::handle ids) {
  TensorView hv = ToF32View(h, "h");
  absl::Span<const int32_t> idv;
  if (!ids.is_none()) idv = ToIds(ids, "ids");
  absl::StatusOr<codecs::SubspaceEnergy> e;
  {
    py::gil_scoped_release release;
    MutexLock lock(&c.mu);
    e = c.codec.MeasureEnergy(hv, idv);
  }
  return EnergyDict(ValueOrThrow(std::move(e)));
}

// lbcc.SubspaceCodec, and inspect_subspace for its payloads.
void BindSubspaceCodec(py::module_& m) {
  py::class_<PySubspaceCodec, std::shared_ptr<PySubspaceCodec>>(
      m, "SubspaceCodec",
      "Encodes activations (forward: U^T (h - T[y]) + ids) and activation gradients (backward: "
      "U^T g) against a basis.")
      .def(py::init(&NewSubspaceCodec), py::arg("basis"), py::arg("coefficient_dtype") = "bf16",
           py::arg("int8_block") = 32, py::arg("mixture_block") = 64)
      .def_property_readonly("basis", [](const PySubspaceCodec& c) { return PyBasis{c.basis}; })
      .def_property_readonly("coefficient_dtype",
                             [](const PySubspaceCodec& c) {
                               return std::string(DTypeName(c.options.coefficient_dtype));
                             })
      .def(
          "forward_payload_bytes",
          [](PySubspaceCodec& c, int64_t tokens) {
            MutexLock lock(&c.mu);
            return c.codec.ForwardPayloadBytes(tokens);
          },
          py::arg("tokens"))
      .def(
          "backward_payload_bytes",
          [](PySubspaceCodec& c, int64_t tokens) {
            MutexLock lock(&c.mu);
            return c.codec.BackwardPayloadBytes(tokens);
          },
          py::arg("tokens"))
      .def("encode_forward", &EncodeForward, py::arg("h"), py::arg("ids") = py::none(),
           "Returns (payload, selectors); selectors is None for a single basis.")
      .def("decode_forward", &DecodeForward, py::arg("payload"), py::arg("h_out"),
           py::arg("ids_out") = py::none(),
           "Rebuilds h = U c + T[y] into h_out (and the ids into ids_out); returns the selectors.")
      .def("encode_backward", &EncodeBackward, py::arg("g"), py::arg("selectors") = py::none())
      .def("decode_backward", &DecodeBackward, py::arg("payload"), py::arg("g_out"),
           "Rebuilds U g_c into g_out.")
      .def("measure_energy", &MeasureEnergy, py::arg("h"), py::arg("ids") = py::none());

  m.def(
      "inspect_subspace",
      [](const py::bytes& payload) {
        return HeaderDict(ValueOrThrow(codecs::InspectSubspacePayload(BytesSpan(payload))));
      },
      py::arg("payload"), "Validates a subspace payload's envelope and params (a dict).");
}

// --- Training-side helpers (codecs/subspace_training.h) -------------------------------------

void ProjectWeight(const PyBasis& basis, py::handle weight, const std::string& side,
                   const std::string& arithmetic) {
  TensorView w = ToF32View(weight, "weight", Access::kWrite);
  const codecs::ModelDimSide s = ParseSide(side);
  const codecs::SubspaceArithmetic a = ParseArithmetic(arithmetic);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = codecs::ProjectWeight(*basis.basis, w, s, a);
  }
  ThrowIfError(status);
}

void ProjectPseudoGradient(const PyBasis& basis, py::handle outer, py::handle local,
                           const std::string& side, const std::string& arithmetic) {
  TensorView o = ToF32View(outer, "outer");
  TensorView w = ToF32View(local, "local", Access::kWrite);
  const codecs::ModelDimSide s = ParseSide(side);
  const codecs::SubspaceArithmetic a = ParseArithmetic(arithmetic);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = codecs::ProjectPseudoGradient(*basis.basis, o, w, s, a);
  }
  ThrowIfError(status);
}

PyBasis ShiftEmbedding(const PyBasis& basis, py::handle embedding, const std::string& arithmetic) {
  TensorView e = ToF32View(embedding, "embedding", Access::kWrite);
  const codecs::SubspaceArithmetic a = ParseArithmetic(arithmetic);
  absl::StatusOr<std::shared_ptr<const SubspaceBasis>> next;
  {
    py::gil_scoped_release release;
    next = codecs::ShiftEmbedding(*basis.basis, e, a);
  }
  return Wrap(std::move(next));
}

PyBasis RefreshTable(const PyBasis& basis, py::handle embedding, const std::string& mode,
                     const std::string& arithmetic) {
  const codecs::TableRefreshMode r = ParseRefreshMode(mode);
  // The lossy refresh only reads the embedding (a read-only tensor is fine).
  TensorView e = ToF32View(embedding, "embedding",
                           r == codecs::TableRefreshMode::kLossy ? Access::kRead : Access::kWrite);
  const codecs::SubspaceArithmetic a = ParseArithmetic(arithmetic);
  absl::StatusOr<std::shared_ptr<const SubspaceBasis>> next;
  {
    py::gil_scoped_release release;
    next = codecs::RefreshTable(*basis.basis, e, r, a);
  }
  return Wrap(std::move(next));
}

PyBasis FitBasis(py::handle samples, int64_t rank, int64_t components, int64_t mixture_block,
                 int iterations, uint64_t seed, uint32_t version, int64_t vocab_size,
                 py::handle table) {
  TensorView s = ToF32View(samples, "samples");
  codecs::SubspaceFitOptions o;
  o.rank = rank;
  o.components = components;
  o.mixture_block = mixture_block;
  o.iterations = iterations;
  o.seed = seed;
  o.version = version;
  o.vocab_size = vocab_size;
  o.table = FloatVector(table, "table");
  absl::StatusOr<std::shared_ptr<const SubspaceBasis>> fitted;
  {
    py::gil_scoped_release release;
    fitted = codecs::FitSubspaceBasis(s, o);
  }
  return Wrap(std::move(fitted));
}

void BindSubspaceTraining(py::module_& m) {
  m.def("project_weight", &ProjectWeight, py::arg("basis"), py::arg("weight"), py::arg("side"),
        py::arg("arithmetic") = "portable",
        "W <- U U^T W in place on the model-dim side (rows: W is [d, n]; columns: W is [n, d]).");
  m.def("project_pseudo_gradient", &ProjectPseudoGradient, py::arg("basis"), py::arg("outer"),
        py::arg("local"), py::arg("side"), py::arg("arithmetic") = "portable",
        "local <- outer - U U^T (outer - local) in place: the pseudo-gradient projected onto "
        "span(U) on the model-dim side.");
  m.def("shift_embedding", &ShiftEmbedding, py::arg("basis"), py::arg("embedding"),
        py::arg("arithmetic") = "portable",
        "T <- T + (E - E U U^T), E <- E U U^T in place; returns the basis with the new table "
        "and version + 1.");
  m.def("refresh_table", &RefreshTable, py::arg("basis"), py::arg("embedding"),
        py::arg("mode") = "lossy", py::arg("arithmetic") = "portable",
        "The basis after a SparseLoCo outer step (version + 1), from the synced embedding [V, d]. "
        "mode 'lossy': T := the embedding bit for bit, embedding untouched (the seed paper's "
        "boundary); 'constrained': shift_embedding (embedding modified in place). Equal inputs "
        "give equal ids on every rank ('portable' arithmetic for the constrained shift).");
  m.def("fit_basis", &FitBasis, py::arg("samples"), py::arg("rank"), py::arg("components") = 1,
        py::arg("mixture_block") = 64, py::arg("iterations") = 10, py::arg("seed") = 0,
        py::arg("version") = 0, py::arg("vocab_size") = 0, py::arg("table") = py::none(),
        "Fits a basis to samples [n, d] of h - T[y] (PCA, or K-subspaces for a mixture).");
}

// --- Table deltas (codecs/table_delta.h) ----------------------------------------------------

py::bytes EncodeTableDelta(py::handle before, py::handle after) {
  TensorView b = ToF32View(before, "before");
  TensorView a = ToF32View(after, "after");
  absl::StatusOr<std::vector<uint8_t>> bytes;
  {
    py::gil_scoped_release release;
    bytes = codecs::EncodeTableDelta(FloatSpan(b), FloatSpan(a));
  }
  return ToBytes(ValueOrThrow(std::move(bytes)));
}

void ApplyTableDelta(py::handle tensor, const py::bytes& data) {
  TensorView t = ToF32View(tensor, "tensor", Access::kWrite);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = codecs::ApplyTableDelta(
        BytesSpan(data), absl::MakeSpan(t.data_as<float>(), static_cast<size_t>(t.num_elements())));
  }
  ThrowIfError(status);
}

void BindTableDelta(py::module_& m) {
  m.def("encode_table_delta", &EncodeTableDelta, py::arg("before"), py::arg("after"),
        "The elements of `after` whose bits differ from `before` (contiguous float32 tensors of "
        "one size, any shape) as a table delta (bytes: positions as a bitmap or LEB128 gaps, "
        "values bit-exact, XXH3 checksum).");
  m.def("apply_table_delta", &ApplyTableDelta, py::arg("tensor"), py::arg("data"),
        "Applies encode_table_delta() bytes to `tensor` in place. DataLossError for corrupt or "
        "foreign bytes, InvalidArgumentError (a ValueError) for a delta of another size; the "
        "tensor is untouched on error.");
  m.def(
      "inspect_table_delta",
      [](const py::bytes& data) {
        return TableDeltaDict(ValueOrThrow(codecs::InspectTableDelta(BytesSpan(data))));
      },
      py::arg("data"),
      "Validates a table delta and describes it: {n, m, encoding ('bitmap' or 'gaps'), "
      "position_bytes, bytes}.");
}

}  // namespace

void BindSubspace(py::module_& m) {
  BindSubspaceBasis(m);
  BindSubspaceCodec(m);
  BindSubspaceTraining(m);
  BindTableDelta(m);
}

}  // namespace lbcc::python
