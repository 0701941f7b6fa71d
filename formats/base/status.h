// Status and Result<T>: how every library layer of ckpt reports failure.
// A Status is OK (no allocation) or an error with a kind, a short rule code, a message and
// context (file, tensor, piece). Only cli/ turns an error into text and an exit code.
// Thread safety: values; safe to move between threads, not to share mutably.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ckpt {

enum class ErrorKind : uint8_t {
  kInvalidArgument,  // the caller (user flags, layout) asked for something impossible
  kNotFound,         // a file, dataset or tensor that should exist does not
  kIo,               // the OS failed a read/write/rename/fsync
  kCorruption,       // a file's content breaks its format's rules (bad input data)
  kChecksum,         // content hashes do not match the manifest
  kUnsupported,      // valid but not handled (yet): dtype, version, feature
  kOverflow,         // a numeric cast would overflow or produce NaN
  kMismatch,         // two things compared (diff, verify against a reference) differ
  kInternal,         // a bug in ckpt
};

const char* error_kind_name(ErrorKind k);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  // An error whose kind is the one formats/base/error_codes.cc lists for `code`, the rule that failed
  // (e.g. "HeaderTooLarge", "PieceOverlap"); an unlisted code is a bug, reported as kInternal.
  static Status Error(std::string code, std::string message);
  static Status InvalidArgument(std::string msg) { return Make(ErrorKind::kInvalidArgument, "InvalidArgument", std::move(msg)); }
  static Status NotFound(std::string msg) { return Make(ErrorKind::kNotFound, "NotFound", std::move(msg)); }
  static Status Io(std::string msg) { return Make(ErrorKind::kIo, "Io", std::move(msg)); }
  static Status Unsupported(std::string msg) { return Make(ErrorKind::kUnsupported, "Unsupported", std::move(msg)); }
  static Status Internal(std::string msg) { return Make(ErrorKind::kInternal, "Internal", std::move(msg)); }
  // errno-based I/O error: "<what> '<path>': <strerror>".
  static Status FromErrno(const std::string& what, const std::string& path, int err);

  Status(const Status& o) : rep_(o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr) {}
  Status& operator=(const Status& o) { rep_ = o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr; return *this; }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return rep_ == nullptr; }
  explicit operator bool() const { return ok(); }
  ErrorKind kind() const { return rep_ ? rep_->kind : ErrorKind::kInternal; }
  const std::string& code() const;
  const std::string& message() const;
  const std::string& file() const;
  const std::string& tensor() const;

  // Context, added as the error propagates (kept if already set by a deeper layer).
  Status&& with_file(std::string f) &&;
  Status&& with_tensor(std::string t) &&;
  Status&& with_context(const std::string& prefix) &&;  // message = prefix + ": " + message

  // "corruption [PieceOverlap] file 'x.h5', tensor 'w': message"
  std::string to_string() const;

  // The Status as one JSON object, to cross a pipe or MPI: {"kind":"ok"} or
  // {"kind":"corruption","code":..,"message":..,"file":..,"tensor":..}.
  std::string to_json() const;
  // The inverse of to_json. Text that is not such an object, a kind that is not a kind, or a code
  // whose kind in formats/base/error_codes.cc differs from the one received becomes kInternal, saying so.
  static Status from_json(std::string_view text);

 private:
  static Status Make(ErrorKind kind, std::string code, std::string message);
  struct Rep {
    ErrorKind kind;
    std::string code, message, file, tensor;
  };
  std::unique_ptr<Rep> rep_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                   // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {            // NOLINT
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK status");
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  Status take_status() { return std::move(status_); }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace ckpt

#define CKPT_CONCAT_INNER(a, b) a##b
#define CKPT_CONCAT(a, b) CKPT_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define CKPT_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::ckpt::Status _ckpt_st = (expr);               \
    if (!_ckpt_st.ok()) return _ckpt_st;            \
  } while (0)

// `CKPT_ASSIGN_OR_RETURN(auto x, MakeX());`
#define CKPT_ASSIGN_OR_RETURN(lhs, expr) \
  CKPT_ASSIGN_OR_RETURN_IMPL(CKPT_CONCAT(_ckpt_res_, __LINE__), lhs, expr)
#define CKPT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.take_status();         \
  lhs = std::move(tmp).value()
