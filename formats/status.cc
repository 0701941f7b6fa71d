#include "formats/status.h"

#include <cstring>

namespace ckpt {

namespace {
const std::string kEmpty;
}

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kCorruption: return "corrupt input";
    case ErrorKind::kChecksum: return "checksum mismatch";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kOverflow: return "overflow";
    case ErrorKind::kMismatch: return "mismatch";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

Status Status::Error(ErrorKind kind, std::string code, std::string message) {
  Status s;
  s.rep_ = std::make_unique<Rep>(Rep{kind, std::move(code), std::move(message), {}, {}});
  return s;
}

Status Status::FromErrno(const std::string& what, const std::string& path, int err) {
  ErrorKind k = (err == ENOENT) ? ErrorKind::kNotFound : ErrorKind::kIo;
  return Error(k, k == ErrorKind::kNotFound ? "NotFound" : "Io",
               what + " '" + path + "': " + std::strerror(err))
      .with_file(path);
}

const std::string& Status::code() const { return rep_ ? rep_->code : kEmpty; }
const std::string& Status::message() const { return rep_ ? rep_->message : kEmpty; }
const std::string& Status::file() const { return rep_ ? rep_->file : kEmpty; }
const std::string& Status::tensor() const { return rep_ ? rep_->tensor : kEmpty; }

Status&& Status::with_file(std::string f) && {
  if (rep_ && rep_->file.empty()) rep_->file = std::move(f);
  return std::move(*this);
}
Status&& Status::with_tensor(std::string t) && {
  if (rep_ && rep_->tensor.empty()) rep_->tensor = std::move(t);
  return std::move(*this);
}
Status&& Status::with_context(const std::string& prefix) && {
  if (rep_) rep_->message = prefix + ": " + rep_->message;
  return std::move(*this);
}

std::string Status::to_string() const {
  if (!rep_) return "OK";
  std::string s = error_kind_name(rep_->kind);
  if (!rep_->code.empty()) s += " [" + rep_->code + "]";
  bool ctx = false;
  if (!rep_->file.empty()) { s += " file '" + rep_->file + "'"; ctx = true; }
  if (!rep_->tensor.empty()) { s += std::string(ctx ? "," : "") + " tensor '" + rep_->tensor + "'"; ctx = true; }
  s += ": " + rep_->message;
  return s;
}

}  // namespace ckpt
