// Shared pieces of the `_lbcc` pybind11 extension: Status to Python exceptions, tensor
// arguments (torch tensors and numpy arrays) to TensorViews, and the registration functions of
// each binding file.
//
// Errors: C++ code throws StatusError (never for ok statuses); the translator registered by
// RegisterErrors() raises the lbcc.errors class of the status code with (code name, message).
// Argument checks on Python objects raise TypeError (wrong kind of object or dtype) or
// ValueError (non-contiguous, not on the CPU), naming the argument and the requirement.
//
// Threading: every function here needs the GIL. Blocking C++ calls release it themselves.
#ifndef LBCC_PYTHON_BINDINGS_H_
#define LBCC_PYTHON_BINDINGS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/dtype.h"
#include "base/mutex.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"

namespace lbcc::python {

namespace py = pybind11;

// A non-ok Status on its way to Python.
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError(value.status());
  return *std::move(value);
}

// Registers the StatusError translator (lbcc.errors must be importable).
void RegisterErrors(py::module_& m);

// Memory of a tensor argument: how it may be used.
enum class Access { kRead, kWrite };

// A TensorView over the memory of `obj` (a torch.Tensor or a numpy.ndarray), which must be a
// CPU, dense, C-contiguous tensor of one of `dtypes`. `what` names the argument in errors.
// The caller keeps `obj` alive as long as the view is used.
TensorView ToView(py::handle obj, const char* what, std::initializer_list<DType> dtypes,
                  Access access = Access::kRead);
inline TensorView ToF32View(py::handle obj, const char* what, Access access = Access::kRead) {
  return ToView(obj, what, {DType::kF32}, access);
}
// Token ids: an int32 tensor (any shape), as a span.
absl::Span<const int32_t> ToIds(py::handle obj, const char* what);

// A Python shape (sequence of ints) as a Shape.
Shape ToShape(py::handle obj);
py::tuple ShapeTuple(absl::Span<const int64_t> shape);

// Copies of float data as a new numpy array of `shape`.
py::array_t<float> FloatArray(absl::Span<const float> data, absl::Span<const int64_t> shape);

// bytes <-> spans (the span of a py::bytes is valid while the object lives).
absl::Span<const uint8_t> BytesSpan(const py::bytes& b);
py::bytes ToBytes(absl::Span<const uint8_t> data);

// "sparseloco", "mean" or "sum"; InvalidArgument otherwise.
codecs::Aggregation ParseAggregationOrThrow(const std::string& name);

// lbcc.SubspaceBasis: an immutable basis shared with every codec made from it.
struct PyBasis {
  std::shared_ptr<const codecs::SubspaceBasis> basis;
};

// lbcc.SubspaceCodec: a SubspaceCodec is thread-compatible, so calls from Python threads take
// `mu`. Receives decode on transport threads with codecs of their own (see comm_bindings.cc).
struct PySubspaceCodec {
  explicit PySubspaceCodec(codecs::SubspaceCodec c)
      : basis(c.shared_basis()), options(c.options()), codec(std::move(c)) {}
  const std::shared_ptr<const codecs::SubspaceBasis> basis;
  const codecs::SubspaceCodecOptions options;
  Mutex mu;
  codecs::SubspaceCodec codec ABSL_GUARDED_BY(mu);  // Scratch buffers: one call at a time.
};

// Mixture selectors to and from Python: None for a single basis, else (mixture_block, bytes).
codecs::SubspaceSelectors ToSelectors(py::handle obj);
py::object SelectorsObject(const codecs::SubspaceSelectors& selectors);

// Binding files.
void BindComm(py::module_& m);
void BindCodecs(py::module_& m);
void BindSubspace(py::module_& m);
void BindPlan(py::module_& m);  // plan_bindings.cc
void BindElastic(py::module_& m);  // elastic_bindings.cc

}  // namespace lbcc::python

#endif  // LBCC_PYTHON_BINDINGS_H_
