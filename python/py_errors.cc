// The exception classes of py_errors.h and the Status -> exception translation.
#include "python/py_errors.h"

#include <Python.h>

#include <array>
#include <string>

namespace ckpt::py {
namespace {

struct ErrorClass {
  ErrorKind kind;
  const char* name;     // Python class name under the module
  PyObject* also;       // a builtin base besides ckpt.Error (nullptr: none)
  PyObject* type = nullptr;
};

PyObject* g_base_error = nullptr;
std::array<ErrorClass, 9>& error_classes() {
  static std::array<ErrorClass, 9> classes = {{
      {ErrorKind::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {ErrorKind::kNotFound, "NotFoundError", PyExc_LookupError},
      {ErrorKind::kIo, "IoError", PyExc_OSError},
      {ErrorKind::kCorruption, "CorruptionError", nullptr},
      {ErrorKind::kChecksum, "ChecksumError", nullptr},
      {ErrorKind::kUnsupported, "UnsupportedError", PyExc_NotImplementedError},
      {ErrorKind::kOverflow, "CastOverflowError", PyExc_ArithmeticError},
      {ErrorKind::kMismatch, "MismatchError", nullptr},
      {ErrorKind::kInternal, "InternalError", PyExc_RuntimeError},
  }};
  return classes;
}

PyObject* new_class(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string full = std::string("ckpt.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::handle(t);  // the module keeps a reference; so does the class table
  return t;
}

}  // namespace

void bind_errors(nb::module_& m) {
  g_base_error = new_class(m, "Error", PyExc_Exception,
                           "Base of every ckpt error. Attributes: kind, code, file, tensor, message.");
  for (auto& c : error_classes()) {
    PyObject* bases = c.also ? PyTuple_Pack(2, g_base_error, c.also) : PyTuple_Pack(1, g_base_error);
    if (!bases) throw nb::python_error();
    c.type = new_class(m, c.name, bases, nullptr);
    Py_DECREF(bases);
  }
}

void raise_status(const Status& st) {
  PyObject* type = g_base_error;
  for (const auto& c : error_classes())
    if (c.kind == st.kind()) type = c.type;
  nb::object exc = nb::steal(PyObject_CallFunction(type, "s", st.to_string().c_str()));
  if (!exc.is_valid()) throw nb::python_error();
  exc.attr("kind") = nb::str(error_kind_name(st.kind()));
  exc.attr("code") = nb::str(st.code().c_str());
  exc.attr("file") = nb::str(st.file().c_str());
  exc.attr("tensor") = nb::str(st.tensor().c_str());
  exc.attr("message") = nb::str(st.message().c_str());
  PyErr_SetObject(type, exc.ptr());
  throw nb::python_error();
}

}  // namespace ckpt::py
