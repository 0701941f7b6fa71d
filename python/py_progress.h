// The optional `progress=callable(done_bytes, total_bytes)` of the commands (commands_bind.cc):
// the library calls fn() from its own threads with the GIL released; each call that passes the
// throttle (the first, then at most every `interval_s`, and the last, done >= total) takes the
// GIL and calls the Python callable with non-decreasing `done`. An exception raised by the
// callable (or KeyboardInterrupt, when a call made on the main thread finds Ctrl-C pending) stops
// the calls; the command runs to its end (the library has no cancellation point: what it writes
// is complete or, when the command fails, nothing), and rethrow_if_failed() re-raises it after.
// Thread safety: fn() may be called from any thread; the rest needs the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

namespace ckpt::py {

class PyProgress {
 public:
  // `callback`: None or a callable taking (done_bytes, total_bytes).
  explicit PyProgress(nanobind::object callback, double interval_s = 0.1);
  PyProgress(const PyProgress&) = delete;
  PyProgress& operator=(const PyProgress&) = delete;

  // The function to hand to the library (empty when there is no callback). Refers to this object.
  std::function<void(uint64_t, uint64_t)> fn();
  // With the GIL: raises the callback's exception, if it raised one.
  void rethrow_if_failed();
  uint64_t calls() const { return calls_; }

 private:
  void report(uint64_t done, uint64_t total);

  nanobind::object callback_;
  nanobind::object error_;  // the exception the callback raised (set with the GIL held)
  std::chrono::duration<double> interval_;
  std::mutex mu_;
  bool failed_ = false, started_ = false, finished_ = false;
  uint64_t last_done_ = 0, calls_ = 0;
  std::chrono::steady_clock::time_point last_call_{};
};

}  // namespace ckpt::py
