#include "python/py_progress.h"

#include <Python.h>

#include <algorithm>
#include <utility>

namespace ckpt::py {

namespace nb = nanobind;

PyProgress::PyProgress(nb::object callback, double interval_s)
    : callback_(std::move(callback)), interval_(interval_s) {
  if (callback_.is_valid() && !callback_.is_none() && !PyCallable_Check(callback_.ptr()))
    throw nb::type_error("progress: expected a callable (done_bytes, total_bytes) or None");
}

std::function<void(uint64_t, uint64_t)> PyProgress::fn() {
  if (!callback_.is_valid() || callback_.is_none()) return {};
  return [this](uint64_t done, uint64_t total) { report(done, total); };
}

void PyProgress::report(uint64_t done, uint64_t total) {
  std::lock_guard<std::mutex> lock(mu_);  // one call at a time, in order
  if (failed_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total;
  if (started_ && !last && (now - last_call_ < interval_ || done <= last_done_)) return;
  done = std::max(done, last_done_);  // never report going backwards (several threads count)
  started_ = true;
  finished_ = last;
  last_done_ = done;
  last_call_ = now;
  nb::gil_scoped_acquire gil;
  try {
    if (PyErr_CheckSignals() != 0) throw nb::python_error();  // Ctrl-C while the command runs
    ++calls_;
    callback_(done, total);
  } catch (nb::python_error& e) {
    failed_ = true;
    error_ = nb::borrow(e.value());
  }
}

void PyProgress::rethrow_if_failed() {
  if (!failed_ || !error_.is_valid()) return;
  nb::object err = std::move(error_);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw nb::python_error();
}

}  // namespace ckpt::py
