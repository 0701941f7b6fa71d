#include "formats/base/status.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "formats/base/error_codes.h"
#include "formats/base/json_read.h"

namespace ckpt {

namespace {
const std::string kEmpty;

// The kinds' names on the wire (Status::to_json); stable, unlike the enum's values.
constexpr std::pair<ErrorKind, const char*> kKindTokens[] = {
    {ErrorKind::kInvalidArgument, "invalid_argument"}, {ErrorKind::kNotFound, "not_found"},
    {ErrorKind::kIo, "io"},                            {ErrorKind::kCorruption, "corruption"},
    {ErrorKind::kChecksum, "checksum"},                {ErrorKind::kUnsupported, "unsupported"},
    {ErrorKind::kOverflow, "overflow"},                {ErrorKind::kMismatch, "mismatch"},
    {ErrorKind::kInternal, "internal"},
};
}  // namespace

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

Status Status::Error(std::string code, std::string message) {
  const std::optional<ErrorKind> kind = kind_of_code(code);
  if (!kind) message += " (error code '" + code + "' has no entry in formats/base/error_codes.cc)";
  return Make(kind.value_or(ErrorKind::kInternal), std::move(code), std::move(message));
}

Status Status::Make(ErrorKind kind, std::string code, std::string message) {
  Status s;
  s.rep_ = std::make_unique<Rep>(Rep{kind, std::move(code), std::move(message), {}, {}});
  return s;
}

Status Status::FromErrno(const std::string& what, const std::string& path, int err) {
  ErrorKind k = (err == ENOENT) ? ErrorKind::kNotFound : ErrorKind::kIo;
  return Make(k, k == ErrorKind::kNotFound ? "NotFound" : "Io",
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

std::string Status::to_json() const {
  if (!rep_) return R"({"kind":"ok"})";
  const char* kind = "internal";
  for (const auto& [k, token] : kKindTokens)
    if (k == rep_->kind) kind = token;
  nlohmann::json j = {{"kind", kind},
                      {"code", rep_->code},
                      {"message", rep_->message},
                      {"file", rep_->file},
                      {"tensor", rep_->tensor}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status Status::from_json(std::string_view text) {
  auto parsed = parse_json(text, kStatusJsonLimits, "status from another process");
  if (!parsed.ok()) return Internal("unreadable status from another process: " + parsed.status().to_string());
  const nlohmann::json& j = *parsed;
  auto str = [&j](const char* key) -> std::string {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!j.is_object() || !j.contains("kind")) return Internal("status from another process is not a status object");
  const std::string token = str("kind");
  if (token == "ok") return Ok();
  std::optional<ErrorKind> kind;
  for (const auto& [k, t] : kKindTokens)
    if (token == t) kind = k;
  const std::string code = str("code"), message = str("message");
  if (!kind) return Internal("status from another process has unknown kind '" + token.substr(0, 40) + "': [" + code + "] " + message);
  const std::optional<ErrorKind> listed = kind_of_code(code);
  if (!listed || *listed != *kind)
    return Internal("status from another process has code '" + code.substr(0, 60) + "' with kind '" + token +
                    "', which formats/base/error_codes.cc does not list: " + message);
  Status s = Make(*kind, code, message);
  if (!str("file").empty()) s = std::move(s).with_file(str("file"));
  if (!str("tensor").empty()) s = std::move(s).with_tensor(str("tensor"));
  return s;
}

}  // namespace ckpt
