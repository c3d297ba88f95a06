// lbcc.ContextRing: the context-parallel ring of ring attention (comm/context_ring.h).
//
// Codecs per tensor: "raw" (f32 bytes, bit-exact), "bf16" / "fp16" (dense), or an
// lbcc.SubspaceBasis (V = 0; its coefficients as `coefficient_dtype`, one component per
// `mixture_block` tokens). Blocking calls release the GIL, so the ring's worker thread and other
// Python threads run meanwhile.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/context_ring.h"
#include "python/bindings.h"
#include "python/comm_bindings.h"

namespace lbcc::python {
namespace {

using comm::ContextRing;
using comm::RingCodec;

// The ring and the communicator it runs on (kept alive while the ring lives).
struct PyContextRing {
  std::shared_ptr<comm::Communicator> comm;
  std::unique_ptr<ContextRing> ring;
  ~PyContextRing() {
    py::gil_scoped_release release;  // A pass still running is cancelled and waited for.
    ring.reset();
  }
};

RingCodec ParseRingCodec(py::handle spec, const std::string& coefficient_dtype,
                         int64_t int8_block, int64_t mixture_block) {
  if (py::isinstance<py::str>(spec)) {
    const std::string name = spec.cast<std::string>();
    if (name == "raw") return RingCodec::Raw();
    if (name == "bf16") return RingCodec::Dense(codecs::DenseFormat::kBf16);
    if (name == "fp16") return RingCodec::Dense(codecs::DenseFormat::kF16);
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "unknown ring codec '", name, "' (raw, bf16, fp16, or an lbcc.SubspaceBasis)")));
  }
  if (py::isinstance<PyBasis>(spec)) {
    codecs::SubspaceCodecOptions o;
    o.coefficient_dtype = ValueOrThrow(ParseDType(coefficient_dtype));
    o.int8_block = int8_block;
    o.mixture_block = mixture_block;
    return RingCodec::Subspace(spec.cast<const PyBasis&>().basis, o);
  }
  throw py::type_error("a ring codec is 'raw', 'bf16', 'fp16' or an lbcc.SubspaceBasis");
}

std::vector<TensorView> Views(py::handle list, const char* what, Access access) {
  std::vector<TensorView> views;
  if (list.is_none()) return views;
  for (py::handle t : list) views.push_back(ToF32View(t, what, access));
  return views;
}

std::unique_ptr<PyContextRing> NewRing(py::handle comm, py::list codecs, int64_t tokens,
                                       int64_t dim, const std::string& coefficient_dtype,
                                       int64_t int8_block, int64_t mixture_block,
                                       py::object timeout) {
  auto out = std::make_unique<PyContextRing>();
  out->comm = SharedCommunicator(comm);
  comm::ContextRingOptions options;
  for (py::handle c : codecs) {
    options.tensors.push_back(ParseRingCodec(c, coefficient_dtype, int8_block, mixture_block));
  }
  options.tokens = tokens;
  options.dim = dim;
  if (!timeout.is_none()) options.timeout = absl::Seconds(timeout.cast<double>());
  out->ring = ValueOrThrow(ContextRing::Create(out->comm.get(), std::move(options)));
  return out;
}

}  // namespace

void BindContextRing(py::module_& m) {
  py::class_<PyContextRing>(
      m, "ContextRing",
      "The context-parallel ring of ring attention (comm/context_ring.h): K/V blocks forward to "
      "the successor, their gradients' partial sums backward to the predecessor, each tensor "
      "through its codec.")
      .def(py::init(&NewRing), py::arg("comm"), py::arg("codecs"), py::arg("tokens"),
           py::arg("dim"), py::arg("coefficient_dtype") = "bf16", py::arg("int8_block") = 32,
           py::arg("mixture_block") = 64, py::arg("timeout") = py::none())
      .def_property_readonly("rank", [](const PyContextRing& r) { return r.ring->rank(); })
      .def_property_readonly("nranks", [](const PyContextRing& r) { return r.ring->nranks(); })
      .def_property_readonly("rounds", [](const PyContextRing& r) { return r.ring->rounds(); })
      .def(
          "payload_bytes",
          [](const PyContextRing& r, int t) {
            if (t < 0 || t >= static_cast<int>(r.ring->options().tensors.size())) {
              throw py::index_error("no such tensor");
            }
            const comm::RingPayloadBytes b = r.ring->payload_bytes(t);
            return py::make_tuple(b.forward, b.backward);
          },
          py::arg("tensor"), "(forward, backward) bytes of tensor t's payload per link crossing.")
      .def(
          "begin_forward",
          [](PyContextRing& r, py::list mine, py::object mine_out) {
            std::vector<TensorView> in = Views(mine, "mine", Access::kRead);
            std::vector<TensorView> out = Views(mine_out, "mine_out", Access::kWrite);
            py::gil_scoped_release release;
            ThrowIfError(r.ring->BeginForward(in, out));
          },
          py::arg("mine"), py::arg("mine_out") = py::none(),
          "Posts the forward pass with this rank's block; mine_out gets it as the others decode "
          "it.")
      .def(
          "next_forward",
          [](PyContextRing& r, py::list out) {
            std::vector<TensorView> views = Views(out, "out", Access::kWrite);
            py::gil_scoped_release release;
            return ValueOrThrow(r.ring->NextForward(views));
          },
          py::arg("out"), "The next round's block into `out`; returns its owner's rank.")
      .def(
          "end_forward",
          [](PyContextRing& r) {
            py::gil_scoped_release release;
            ThrowIfError(r.ring->EndForward());
          })
      .def(
          "begin_backward",
          [](PyContextRing& r) {
            py::gil_scoped_release release;
            ThrowIfError(r.ring->BeginBackward());
          })
      .def(
          "pass_gradient",
          [](PyContextRing& r, py::list contribution) {
            std::vector<TensorView> views = Views(contribution, "contribution", Access::kRead);
            py::gil_scoped_release release;
            return ValueOrThrow(r.ring->PassGradient(views));
          },
          py::arg("contribution"),
          "This rank's gradient for block (rank + r) mod n, added to the partial sum and sent on; "
          "returns that block's owner.")
      .def(
          "end_backward",
          [](PyContextRing& r, py::list out) {
            std::vector<TensorView> views = Views(out, "out", Access::kWrite);
            py::gil_scoped_release release;
            ThrowIfError(r.ring->EndBackward(views));
          },
          py::arg("out"), "Every other rank's gradient for this rank's block, summed, into out.");
}

}  // namespace lbcc::python
