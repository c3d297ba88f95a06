// The `_lbcc` extension module: error translation, tensor arguments, and module init.
#include <Python.h>

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/version.h"
#include "python/bindings.h"

namespace lbcc::python {
namespace {

// torch dtype names (str(torch.float32) == "torch.float32") and numpy kinds.
struct DTypeNames {
  DType dtype;
  const char* torch;
  const char* numpy;  // numpy dtype.name; nullptr when numpy has no such type
};
constexpr DTypeNames kDTypes[] = {
    {DType::kF32, "torch.float32", "float32"}, {DType::kF16, "torch.float16", "float16"},
    {DType::kBF16, "torch.bfloat16", nullptr}, {DType::kI8, "torch.int8", "int8"},
    {DType::kU8, "torch.uint8", "uint8"},      {DType::kI32, "torch.int32", "int32"},
    {DType::kI64, "torch.int64", "int64"},
};

std::string Expected(std::initializer_list<DType> dtypes) {
  std::vector<std::string> names;
  for (DType d : dtypes) {
    for (const DTypeNames& n : kDTypes) {
      if (n.dtype == d) names.push_back(std::string(n.torch).substr(6));
    }
  }
  return absl::StrJoin(names, " or ");
}

bool Allowed(DType d, std::initializer_list<DType> dtypes) {
  for (DType a : dtypes) {
    if (a == d) return true;
  }
  return false;
}

bool IsTorchTensor(py::handle obj) {
  // Only look torch up when it is loaded: an object cannot be a tensor otherwise.
  PyObject* modules = PyImport_GetModuleDict();
  PyObject* torch = PyDict_GetItemString(modules, "torch");
  if (torch == nullptr) return false;
  py::object tensor_type = py::reinterpret_borrow<py::object>(torch).attr("Tensor");
  return py::isinstance(obj, tensor_type);
}

TensorView MakeView(void* data, DType dtype, Shape shape, const char* what) {
  absl::StatusOr<TensorView> view = TensorView::Create(data, dtype, std::move(shape));
  if (!view.ok()) {
    throw py::value_error(absl::StrCat(what, ": ", view.status().message()));
  }
  return *view;
}

TensorView TorchView(py::handle t, const char* what, std::initializer_list<DType> dtypes,
                     Access access) {
  const std::string device = py::str(t.attr("device").attr("type"));
  if (device != "cpu") {
    throw py::value_error(
        absl::StrCat(what, ": LBCC needs a CPU tensor, got one on ", device, " (use .cpu())"));
  }
  const std::string layout = py::str(t.attr("layout"));
  if (layout != "torch.strided") {
    throw py::value_error(
        absl::StrCat(what, ": LBCC needs a dense (strided) tensor, got ", layout));
  }
  const std::string dtype_name = py::str(t.attr("dtype"));
  DType dtype = DType::kF32;
  bool known = false;
  for (const DTypeNames& n : kDTypes) {
    if (dtype_name == n.torch) {
      dtype = n.dtype;
      known = true;
    }
  }
  if (!known || !Allowed(dtype, dtypes)) {
    throw py::type_error(
        absl::StrCat(what, ": LBCC needs a ", Expected(dtypes), " tensor, got ", dtype_name));
  }
  if (!t.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(absl::StrCat(
        what, ": LBCC needs a contiguous tensor (row-major, no gaps); call .contiguous()"));
  }
  if (access == Access::kWrite && t.attr("requires_grad").cast<bool>() &&
      !t.attr("is_leaf").cast<bool>()) {
    throw py::value_error(
        absl::StrCat(what,
                     ": LBCC writes into this tensor, which is part of an autograd graph; pass a "
                     "detached tensor"));
  }
  Shape shape = ToShape(t.attr("shape"));
  const uintptr_t ptr = t.attr("data_ptr")().cast<uintptr_t>();
  return MakeView(reinterpret_cast<void*>(ptr), dtype, std::move(shape), what);
}

TensorView NumpyView(const py::array& a, const char* what, std::initializer_list<DType> dtypes,
                     Access access) {
  const std::string name = py::str(a.dtype().attr("name"));
  DType dtype = DType::kF32;
  bool known = false;
  for (const DTypeNames& n : kDTypes) {
    if (n.numpy != nullptr && name == n.numpy) {
      dtype = n.dtype;
      known = true;
    }
  }
  if (!known || !Allowed(dtype, dtypes)) {
    throw py::type_error(
        absl::StrCat(what, ": LBCC needs a ", Expected(dtypes), " array, got ", name));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(
        absl::StrCat(what, ": LBCC needs a C-contiguous array; use numpy.ascontiguousarray"));
  }
  if (access == Access::kWrite && !a.writeable()) {
    throw py::value_error(absl::StrCat(what, ": LBCC writes into this array, which is read-only"));
  }
  Shape shape;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) shape.push_back(a.shape(i));
  return MakeView(const_cast<void*>(a.data()), dtype, std::move(shape), what);
}

}  // namespace

namespace {

// Raises lbcc.errors' class for `code` (or the class named `class_name`). Status messages may
// hold any bytes (a path from the environment, a peer's text): they are decoded as UTF-8 with
// errors="replace", so the caller always gets an lbcc.Error, never a UnicodeDecodeError.
void RaiseLbccError(const std::string& code, absl::string_view message,
                    const char* class_name = nullptr) {
  py::object errors = py::module_::import("lbcc.errors");
  py::object cls = class_name != nullptr ? errors.attr(class_name)
                                         : errors.attr("error_class")(code);
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()),
                                        "replace");
  if (text == nullptr) throw py::error_already_set();
  py::object exc = cls(code, py::reinterpret_steal<py::str>(text));
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

}  // namespace

void RegisterErrors(py::module_& m) {
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const absl::Status& s = e.status();
      RaiseLbccError(absl::StatusCodeToString(s.code()), s.message());
    } catch (const py::cast_error& e) {
      // A Python argument of the wrong kind that pybind11 could not convert (e.g. states=[5]):
      // lbcc.ArgumentTypeError (an lbcc.Error and a TypeError), not pybind11's RuntimeError.
      RaiseLbccError("INVALID_ARGUMENT", e.what(), "ArgumentTypeError");
    }
  });
}

TensorView ToView(py::handle obj, const char* what, std::initializer_list<DType> dtypes,
                  Access access) {
  if (IsTorchTensor(obj)) return TorchView(obj, what, dtypes, access);
  if (py::isinstance<py::array>(obj)) {
    return NumpyView(py::reinterpret_borrow<py::array>(obj), what, dtypes, access);
  }
  throw py::type_error(absl::StrCat(what, ": expected a torch.Tensor or numpy.ndarray, got ",
                                    std::string(py::str(py::type::of(obj).attr("__name__")))));
}

absl::Span<const int32_t> ToIds(py::handle obj, const char* what) {
  TensorView v = ToView(obj, what, {DType::kI32});
  return absl::Span<const int32_t>(v.data_as<const int32_t>(), v.num_elements());
}

Shape ToShape(py::handle obj) {
  Shape shape;
  for (py::handle d : obj) shape.push_back(d.cast<int64_t>());
  return shape;
}

py::tuple ShapeTuple(absl::Span<const int64_t> shape) {
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = py::int_(shape[i]);
  return t;
}

py::array_t<float> FloatArray(absl::Span<const float> data, absl::Span<const int64_t> shape) {
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  py::array_t<float> a(dims);
  if (!data.empty()) std::memcpy(a.mutable_data(), data.data(), data.size() * sizeof(float));
  return a;
}

absl::Span<const uint8_t> BytesSpan(const py::bytes& b) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) != 0) throw py::error_already_set();
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data), size);
}

py::bytes ToBytes(absl::Span<const uint8_t> data) {
  return py::bytes(reinterpret_cast<const char*>(data.data()), data.size());
}

// context_ring_bindings.cc: lbcc.ContextRing.
void BindContextRing(py::module_& m);

}  // namespace lbcc::python

PYBIND11_MODULE(_lbcc, m) {
  namespace lp = lbcc::python;
  m.doc() = "LBCC's C++ core (communicator, codecs, subspace codec); use the `lbcc` package.";
  m.attr("__version__") = LBCC_VERSION_STRING;
  lp::RegisterErrors(m);
  lp::BindCodecs(m);
  lp::BindSubspace(m);
  lp::BindComm(m);
  lp::BindPlan(m);
  lp::BindElastic(m);
  lp::BindContextRing(m);
}
