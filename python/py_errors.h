// ckpt's Status as Python exceptions: one class per ErrorKind under ckpt.Error, each instance
// carrying .kind, .code, .file, .tensor and .message (the Status's fields), so a script can catch
// ckpt.NotFoundError or read err.tensor instead of parsing text.
//   ckpt.Error                      base of all
//   ckpt.InvalidArgumentError       also ValueError
//   ckpt.NotFoundError              also LookupError
//   ckpt.IoError                    also OSError
//   ckpt.CorruptionError, ckpt.ChecksumError, ckpt.MismatchError
//   ckpt.UnsupportedError           also NotImplementedError
//   ckpt.CastOverflowError          also ArithmeticError (ErrorKind::kOverflow)
//   ckpt.InternalError              also RuntimeError
#pragma once

#include <nanobind/nanobind.h>

#include <utility>

#include "formats/base/status.h"

namespace ckpt::py {

namespace nb = nanobind;

// Creates the exception classes in module m (called once from the module's init).
void bind_errors(nb::module_& m);

// Raises the Python exception for an error Status (throws nb::python_error). Needs the GIL.
[[noreturn]] void raise_status(const Status& st);

inline void check(const Status& st) {
  if (!st.ok()) raise_status(st);
}
template <class T>
T unwrap(Result<T>&& r) {
  if (!r.ok()) raise_status(r.status());
  return std::move(r).value();
}

}  // namespace ckpt::py
