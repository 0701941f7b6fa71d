#include "formats/base/json_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace ckpt {

namespace {

using json = nlohmann::json;

std::string clip(std::string_view s, size_t n = 80) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

// Byte offset of the first array/object opened deeper than `max_depth` (strings skipped).
size_t offset_too_deep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return i;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return text.size();
}

// Builds the value as nlohmann's DOM parser does, refusing depth and duplicate keys as they come.
class BoundedBuilder {
 public:
  BoundedBuilder(int max_depth, json* root) : max_depth_(max_depth), root_(root) {}

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t&) { return fail("InvalidJson", "binary values are not JSON"); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    if (f.node->contains(k)) {
      std::string path;
      for (const Frame& g : stack_)
        path += "/" + (&g == &f                ? clip(k)
                       : g.node->is_array() ? std::to_string(g.node->size() - 1)
                                            : clip(g.key));
      return fail("DuplicateKey", "key '" + clip(k) + "' appears twice in one object (at " + path +
                                      "); refused, a reader keeping either value could be fooled");
    }
    f.key = std::move(k);
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    const size_t cut = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && cut != std::string::npos) what = what.substr(cut + 2);
    pos_ = pos;
    return fail("InvalidJson", clip(what, 200));
  }

  const char* code() const { return code_; }
  const std::string& message() const { return msg_; }
  size_t position() const { return pos_; }

 private:
  struct Frame {
    json* node;
    std::string key;  // in an object: the key of the value that comes next
  };
  json* slot() {
    if (stack_.empty()) return root_;
    Frame& f = stack_.back();
    if (f.node->is_array()) {
      f.node->push_back(nullptr);
      return &f.node->back();
    }
    return &(*f.node)[f.key];
  }
  bool put(json v) {
    *slot() = std::move(v);
    return true;
  }
  bool open(json v) {
    if (static_cast<int>(stack_.size()) >= max_depth_)
      return fail("JsonTooDeep", "arrays and objects nest deeper than " + std::to_string(max_depth_));
    json* s = slot();
    *s = std::move(v);
    stack_.push_back({s, {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  bool fail(const char* code, std::string msg) {
    if (!code_) {
      code_ = code;
      msg_ = std::move(msg);
    }
    return false;
  }

  int max_depth_;
  json* root_;
  std::vector<Frame> stack_;
  const char* code_ = nullptr;
  std::string msg_;
  size_t pos_ = std::string::npos;
};

// The first pass: counts values and the elements of the bounded top-level arrays, builds nothing,
// stops at the first count past its limit.
class CountingPass {
 public:
  explicit CountingPass(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return false; }  // the builder pass names it
  bool start_object(std::size_t) {
    if (!value()) return false;
    if (depth_ == 0) root_object_ = true;
    ++depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (!value()) return false;
    ++depth_;
    if (depth_ == 2 && root_object_ && bound_depth_ < 0)
      for (const JsonArrayBound& b : limits_.arrays)
        if (key_ == b.key) {
          bound_ = &b;
          bound_depth_ = depth_;
          bound_count_ = 0;
        }
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (depth_ == 1) key_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  // Empty when the counts are within the limits (or the text is no JSON: the builder says why).
  const std::string& refusal() const { return refusal_; }

 private:
  bool value() {
    if (++values_ > limits_.max_values) {
      refusal_ = "more than " + std::to_string(limits_.max_values) + " JSON values (ckpt's limit for this kind of file)";
      return false;
    }
    if (bound_ && depth_ == bound_depth_ && ++bound_count_ > bound_->max_elements) {
      refusal_ = "'" + std::string(bound_->key) + "' lists more than " + std::to_string(bound_->max_elements) +
                 " entries (ckpt's limit: far more than any real checkpoint has)";
      return false;
    }
    return true;
  }
  bool close() {
    if (depth_ == bound_depth_) {
      bound_ = nullptr;
      bound_depth_ = -1;
    }
    --depth_;
    return true;
  }

  const JsonLimits& limits_;
  uint64_t values_ = 0;
  int depth_ = 0;
  bool root_object_ = false;
  std::string key_;  // the last key of the top-level object
  const JsonArrayBound* bound_ = nullptr;
  int bound_depth_ = -1;
  uint64_t bound_count_ = 0;
  std::string refusal_;
};

std::string too_large(const std::string& what, uint64_t size, uint64_t max) {
  return what + " is " + std::to_string(size) + " bytes, more than the " + std::to_string(max) + " allowed";
}

}  // namespace

Result<json> parse_json(std::string_view text, const JsonLimits& limits, const std::string& what) {
  if (text.size() > limits.max_bytes) return Status::Error("JsonTooLarge", too_large(what, text.size(), limits.max_bytes));
  if (const void* nul = std::memchr(text.data(), '\0', text.size()))
    return Status::Error("InvalidJson", what + ": a NUL byte at byte " +
                                            std::to_string(static_cast<const char*>(nul) - text.data()));
  {
    CountingPass counter(limits);
    try {
      (void)json::sax_parse(text.begin(), text.end(), &counter, json::input_format_t::json, /*strict=*/true,
                            /*ignore_comments=*/false);
    } catch (const json::exception&) {
      // the builder pass below reports it
    }
    if (!counter.refusal().empty()) return Status::Error("JsonTooManyValues", what + ": " + counter.refusal());
  }
  json root;
  BoundedBuilder b(limits.max_depth, &root);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &b, json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return Status::Error("InvalidJson", what + ": " + clip(e.what(), 200));
  }
  if (ok) return root;
  if (!b.code()) return Status::Error("InvalidJson", what + ": not valid JSON");
  std::string msg = what + ": " + b.message();
  size_t pos = b.position();
  if (std::strcmp(b.code(), "JsonTooDeep") == 0) pos = offset_too_deep(text, limits.max_depth);
  if (pos != std::string::npos) msg += " (byte " + std::to_string(pos) + ")";
  return Status::Error(b.code(), std::move(msg));
}

Result<json> read_json_file(const std::string& path, const JsonLimits& limits, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("cannot open " + what, path, errno);
  std::string text;
  Status st;
  struct stat sb {};
  if (fstat(fd, &sb) != 0) st = Status::FromErrno("cannot stat " + what, path, errno);
  else if (!S_ISREG(sb.st_mode)) st = Status::Error("InvalidJson", what + " is not a regular file");
  else if (static_cast<uint64_t>(sb.st_size) > limits.max_bytes)
    st = Status::Error("JsonTooLarge", too_large(what, static_cast<uint64_t>(sb.st_size), limits.max_bytes));
  char buf[1 << 16];
  while (st.ok()) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) st = Status::FromErrno("cannot read " + what, path, errno);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > limits.max_bytes)  // grew since fstat
      st = Status::Error("JsonTooLarge", too_large(what, text.size(), limits.max_bytes));
  }
  ::close(fd);
  if (!st.ok()) return std::move(st).with_file(path);
  auto j = parse_json(text, limits, what);
  if (!j.ok()) return j.take_status().with_file(path);
  return j;
}

}  // namespace ckpt
