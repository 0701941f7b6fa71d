#include "formats/safetensors/st_header.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/base/checked.h"
#include "formats/base/utf8.h"

namespace ckpt::safetensors {

namespace {

using json = nlohmann::json;

Status err(const char* code, const std::string& msg) { return Status::Error(code, "safetensors: " + msg); }

// Names the reference knows that ckpt does not handle (yet): valid files, refused as unsupported.
bool reference_only_dtype(std::string_view n) {
  static const char* kNames[] = {"C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

// SAX handler that builds the header while enforcing its shape; the first error wins and stops
// the parse. The grammar is fixed (root object -> tensor objects -> shape/offset arrays), so no
// value nests deeper than 3 and nothing unbounded is allocated besides the entries themselves.
class HeaderSax {
 public:
  Status status;
  std::vector<TensorEntry> tensors;
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));
    return scalar("a negative number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (state_ == State::kShape) {
      if (cur_.shape.size() >= kMaxDims)
        return fail(err("TooManyDimensions", "tensor '" + cur_.name + "': shape has more than " + std::to_string(kMaxDims) + " dimensions"));
      if (v > static_cast<uint64_t>(INT64_MAX))
        return fail(err("ValidationOverflow", "tensor '" + cur_.name + "': dimension " + std::to_string(v) + " exceeds 2^63-1"));
      cur_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (noffsets_ >= 2) return fail(err("InvalidHeaderDeserialization", "tensor '" + cur_.name + "': data_offsets has more than 2 entries"));
      (noffsets_++ == 0 ? cur_.begin : cur_.end) = v;
      return true;
    }
    return scalar("a number");
  }
  bool number_float(json::number_float_t, const json::string_t& s) { return scalar("the non-integer number " + s.substr(0, 32)); }
  bool binary(json::binary_t&) { return scalar("binary data"); }
  bool string(json::string_t& v) {
    if (state_ == State::kMeta) {
      metadata[pending_key_] = v;
      return true;
    }
    if (state_ == State::kTensor && pending_key_ == "dtype") {
      auto dt = dtype_from_name(v);
      if (!dt.ok()) {
        if (reference_only_dtype(v))
          return fail(Status::Error("UnsupportedDType",
                                    "safetensors: tensor '" + cur_.name + "' has dtype " + v + ", which ckpt does not handle"));
        return fail(err("InvalidHeaderDeserialization", "tensor '" + cur_.name + "': unknown dtype \"" + v.substr(0, 64) + "\""));
      }
      cur_.dtype = *dt;
      return true;
    }
    return scalar("a string");
  }
  bool start_object(std::size_t) {
    switch (state_) {
      case State::kStart: state_ = State::kRoot; return true;
      case State::kRoot:
        if (pending_key_ == "__metadata__") {
          has_metadata = true;
          state_ = State::kMeta;
          keys_.clear();
          return true;
        }
        cur_ = TensorEntry{};
        cur_.name = pending_key_;
        fields_.clear();
        noffsets_ = 0;
        state_ = State::kTensor;
        return true;
      default: return scalar("an object");
    }
  }
  bool key(json::string_t& k) {
    switch (state_) {
      case State::kRoot:
        if (!root_keys_.insert(k).second)
          return fail(err("DuplicateKey", "header lists '" + k + "' twice (the reference keeps the last silently)"));
        if (k.empty()) return fail(err("InvalidTensorName", "a tensor has an empty name"));
        pending_key_ = k;
        return true;
      case State::kMeta:
        if (!keys_.insert(k).second) return fail(err("DuplicateKey", "__metadata__ lists key '" + k + "' twice"));
        pending_key_ = k;
        return true;
      case State::kTensor:
        if (k != "dtype" && k != "shape" && k != "data_offsets")
          return fail(err("UnknownTensorField", "tensor '" + cur_.name + "' has unknown field '" + k.substr(0, 64) +
                                                    "' (expected dtype, shape, data_offsets)"));
        if (!fields_.insert(k).second) return fail(err("DuplicateKey", "tensor '" + cur_.name + "' lists field '" + k + "' twice"));
        pending_key_ = k;
        return true;
      default: return fail(err("InvalidHeaderDeserialization", "unexpected key"));
    }
  }
  bool end_object() {
    switch (state_) {
      case State::kRoot: state_ = State::kDone; return true;
      case State::kMeta: state_ = State::kRoot; return true;
      case State::kTensor:
        for (const char* f : {"dtype", "shape", "data_offsets"})
          if (!fields_.count(f)) return fail(err("InvalidHeaderDeserialization", "tensor '" + cur_.name + "': missing field '" + f + "'"));
        tensors.push_back(std::move(cur_));
        state_ = State::kRoot;
        return true;
      default: return fail(err("InvalidHeaderDeserialization", "unexpected end of object"));
    }
  }
  bool start_array(std::size_t) {
    if (state_ == State::kTensor && pending_key_ == "shape") { state_ = State::kShape; return true; }
    if (state_ == State::kTensor && pending_key_ == "data_offsets") { state_ = State::kOffsets; return true; }
    return scalar("an array");
  }
  bool end_array() {
    if (state_ == State::kShape) { state_ = State::kTensor; return true; }
    if (state_ == State::kOffsets) {
      if (noffsets_ != 2)
        return fail(err("InvalidHeaderDeserialization",
                        "tensor '" + cur_.name + "': data_offsets has " + std::to_string(noffsets_) + " entries, expected 2"));
      state_ = State::kTensor;
      return true;
    }
    return fail(err("InvalidHeaderDeserialization", "unexpected end of array"));
  }
  bool parse_error(std::size_t pos, const std::string& tok, const json::exception& ex) {
    if (!status.ok()) return false;
    std::string what = ex.what();
    status = err("InvalidHeaderDeserialization", "header is not valid JSON at byte " + std::to_string(pos) + " near '" +
                                                     tok.substr(0, 32) + "': " + what.substr(0, 200));
    return false;
  }

 private:
  enum class State { kStart, kRoot, kMeta, kTensor, kShape, kOffsets, kDone };
  bool fail(Status s) {
    if (status.ok()) status = std::move(s);
    return false;
  }
  // A scalar (or unexpected container) where the grammar does not allow it.
  bool scalar(const std::string& what) {
    switch (state_) {
      case State::kStart: return fail(err("InvalidHeaderDeserialization", "header is " + what + ", expected a JSON object"));
      case State::kRoot:
        if (pending_key_ == "__metadata__" && what == "null") return true;  // null metadata is accepted
        if (pending_key_ == "__metadata__")
          return fail(err("InvalidHeaderDeserialization", "__metadata__ is " + what + ", expected an object of strings or null"));
        return fail(err("InvalidHeaderDeserialization", "tensor '" + pending_key_ + "' is " + what + ", expected an object"));
      case State::kMeta:
        return fail(err("InvalidHeaderDeserialization", "__metadata__ value of '" + pending_key_ + "' is " + what + ", expected a string"));
      case State::kTensor:
        return fail(err("InvalidHeaderDeserialization",
                        "tensor '" + cur_.name + "': field '" + pending_key_ + "' is " + what +
                            (pending_key_ == "dtype" ? ", expected a string" : ", expected an array of unsigned integers")));
      case State::kShape:
      case State::kOffsets:
        return fail(err("InvalidHeaderDeserialization", "tensor '" + cur_.name + "': " +
                                                            (state_ == State::kShape ? "shape" : "data_offsets") +
                                                            " holds " + what + ", expected unsigned integers"));
      case State::kDone: return fail(err("InvalidHeaderDeserialization", "trailing data after the header object"));
    }
    return false;
  }

  State state_ = State::kStart;
  std::string pending_key_;
  std::set<std::string> root_keys_, keys_, fields_;
  TensorEntry cur_;
  int noffsets_ = 0;
};

}  // namespace

Result<uint64_t> parse_header_size(const uint8_t* first8, uint64_t file_size) {
  if (file_size < 8)
    return err("HeaderTooSmall", "file is " + std::to_string(file_size) + " bytes, expected at least 8 (header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  if (n > kMaxHeaderSize)
    return err("HeaderTooLarge", "header length " + std::to_string(n) + " exceeds the limit " + std::to_string(kMaxHeaderSize));
  if (8 + n > file_size)
    return err("InvalidHeaderLength", "header length " + std::to_string(n) + " runs past the end of the file (" +
                                          std::to_string(file_size) + " bytes, expected at least " + std::to_string(8 + n) + ")");
  return n;
}

Result<Header> parse_header(std::string_view js, uint64_t file_size) {
  if (!is_valid_utf8(js)) return err("InvalidHeader", "header is not valid UTF-8");
  if (js.size() >= 3 && static_cast<unsigned char>(js[0]) == 0xEF && static_cast<unsigned char>(js[1]) == 0xBB &&
      static_cast<unsigned char>(js[2]) == 0xBF)
    return err("InvalidHeaderDeserialization", "header starts with a UTF-8 byte order mark");
  // nlohmann's lexer takes a NUL byte as the end of input; JSON text never holds a raw NUL.
  if (auto z = js.find('\0'); z != std::string_view::npos)
    return err("InvalidHeaderDeserialization", "header holds a NUL byte at offset " + std::to_string(z) + " (padding must be spaces)");
  HeaderSax sax;
  bool ok = json::sax_parse(js.begin(), js.end(), &sax, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false);
  if (!sax.status.ok()) return std::move(sax.status);
  if (!ok) return err("InvalidHeaderDeserialization", "header is not valid JSON");
  Header h;
  h.header_size = js.size();
  h.has_metadata = sax.has_metadata;
  h.metadata = std::move(sax.metadata);
  h.tensors = std::move(sax.tensors);
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t start = 0;
  for (auto& t : h.tensors) {
    if (t.begin != start || t.end < t.begin) {
      std::string why = t.end < t.begin ? "end is before begin"
                        : t.begin > start ? "gap: expected begin " + std::to_string(start)
                                          : "overlaps the previous tensor: expected begin " + std::to_string(start);
      return err("InvalidOffset", "tensor '" + t.name + "' data_offsets [" + std::to_string(t.begin) + ", " +
                                      std::to_string(t.end) + "]: " + why).with_tensor(t.name);
    }
    start = t.end;
    if (t.dtype == DType::kF4) {  // the header counts values; ckpt counts packed pairs (formats/dtype/dtype.h)
      if (t.shape.empty() || t.shape.back() % 2 != 0)
        return Status::Error("F4OddLastDim", "safetensors: tensor '" + t.name + "' (F4 " + shape_to_string(t.shape) +
                                                 "): ckpt holds F4 as packed pairs along the last dimension, which must be even")
            .with_tensor(t.name);
      t.shape.back() /= 2;
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      auto m = checked_mul(numel, static_cast<uint64_t>(d));
      if (!m) return err("ValidationOverflow", "tensor '" + t.name + "' shape " + shape_to_string(t.shape) + " overflows").with_tensor(t.name);
      numel = *m;
    }
    auto bytes = checked_mul(numel, static_cast<uint64_t>(dtype_size(t.dtype)));
    if (!bytes || numel > static_cast<uint64_t>(INT64_MAX))
      return err("ValidationOverflow", "tensor '" + t.name + "' byte size of shape " + shape_to_string(t.shape) + " overflows").with_tensor(t.name);
    if (t.end - t.begin != *bytes)
      return err("TensorInvalidInfo", "tensor '" + t.name + "' (" + std::string(dtype_name(t.dtype)) + " " +
                                          shape_to_string(t.shape) + "): expected " + std::to_string(*bytes) +
                                          " bytes, data_offsets give " + std::to_string(t.end - t.begin)).with_tensor(t.name);
  }
  h.data_size = start;
  if (file_size != UINT64_MAX) {
    auto total = checked_add(checked_add(uint64_t{8}, h.header_size).value_or(UINT64_MAX), start);
    if (!total || *total != file_size) {
      std::string exp = total ? std::to_string(*total) : "more than 2^64";
      return err("MetadataIncompleteBuffer", "file is " + std::to_string(file_size) + " bytes, header and data_offsets say " + exp +
                                                 (total && *total > file_size ? " (data missing)" : " (trailing bytes)"));
    }
  }
  return h;
}

Result<Header> parse_file_bytes(const uint8_t* data, size_t size) {
  CKPT_ASSIGN_OR_RETURN(uint64_t n, parse_header_size(data, size));
  return parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, n), size);
}

int dtype_write_rank(DType t) {
  switch (t) {
    case DType::kBool: return 0;
    case DType::kF4: return 1;
    case DType::kU8: return 2;
    case DType::kI8: return 3;
    case DType::kF8E5M2: return 4;
    case DType::kF8E4M3: return 5;
    case DType::kF8E8M0: return 6;
    case DType::kI16: return 7;
    case DType::kU16: return 8;
    case DType::kF16: return 9;
    case DType::kBF16: return 10;
    case DType::kI32: return 11;
    case DType::kU32: return 12;
    case DType::kF32: return 13;
    case DType::kF64: return 14;
    case DType::kI64: return 15;
    case DType::kU64: return 16;
  }
  return 0;
}

std::string json_quote(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string r;
  r.reserve(s.size() + 2);
  r += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': r += "\\\""; break;
      case '\\': r += "\\\\"; break;
      case '\b': r += "\\b"; break;
      case '\f': r += "\\f"; break;
      case '\n': r += "\\n"; break;
      case '\r': r += "\\r"; break;
      case '\t': r += "\\t"; break;
      default:
        if (c < 0x20) {
          r += "\\u00";
          r += kHex[c >> 4];
          r += kHex[c & 15];
        } else {
          r += ch;
        }
    }
  }
  r += '"';
  return r;
}

Result<std::string> build_header(std::vector<TensorEntry>& tensors, const std::map<std::string, std::string>* metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    int ra = dtype_write_rank(a.dtype), rb = dtype_write_rank(b.dtype);
    if (ra != rb) return ra > rb;
    return a.name < b.name;
  });
  std::string j = "{";
  bool first = true;
  if (metadata) {
    j += "\"__metadata__\":{";
    bool f2 = true;
    for (const auto& [k, v] : *metadata) {
      if (!is_valid_utf8(k) || !is_valid_utf8(v)) return Status::InvalidArgument("safetensors: __metadata__ entry '" + k + "' is not valid UTF-8");
      j += (f2 ? "" : ",") + json_quote(k) + ":" + json_quote(v);
      f2 = false;
    }
    j += "}";
    first = false;
  }
  uint64_t off = 0;
  for (auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !is_valid_utf8(t.name))
      return Status::InvalidArgument("safetensors: cannot write a tensor named '" + t.name + "'");
    auto n = checked_numel(t.shape);
    auto bytes = n ? checked_mul(static_cast<uint64_t>(*n), static_cast<uint64_t>(dtype_size(t.dtype))) : std::nullopt;
    auto end = bytes ? checked_add(off, *bytes) : std::nullopt;
    if (!end) return Status::InvalidArgument("safetensors: tensor '" + t.name + "' shape " + shape_to_string(t.shape) + " overflows");
    t.begin = off;
    t.end = *end;
    off = *end;
    j += (first ? "" : ",") + json_quote(t.name) + ":{\"dtype\":\"" + std::string(dtype_name(t.dtype)) + "\",\"shape\":[";
    if (t.dtype == DType::kF4 && t.shape.empty())
      return Status::Error("F4OddLastDim", "safetensors: F4 tensor '" + t.name + "' has no dimension to pack pairs along");
    for (size_t d = 0; d < t.shape.size(); ++d) {  // F4: values, twice the packed pairs of the last dimension
      const int64_t v = (t.dtype == DType::kF4 && d + 1 == t.shape.size()) ? 2 * t.shape[d] : t.shape[d];
      j += (d ? "," : "") + std::to_string(v);
    }
    j += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
    first = false;
  }
  j += "}";
  j.append((8 - j.size() % 8) % 8, ' ');
  if (j.size() > kMaxHeaderSize)
    return Status::InvalidArgument("safetensors: header of " + std::to_string(j.size()) + " bytes exceeds the limit of " +
                                   std::to_string(kMaxHeaderSize) + " (too many tensors for one file)");
  // The reader's validator on what is about to be written.
  auto check = parse_header(j, UINT64_MAX);
  if (!check.ok()) return Status::Internal("safetensors writer built an invalid header: " + check.status().to_string());
  if (check->tensors.size() != tensors.size()) return Status::Internal("safetensors writer: header round trip lost tensors");
  return j;
}

}  // namespace ckpt::safetensors
