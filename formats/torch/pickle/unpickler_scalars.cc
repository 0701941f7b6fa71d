// The restricted unpickler's scalar opcodes: protocol and frame markers, None, booleans, integers
// (int64 range only), floats, str and bytes (bounded by UnpickleLimits::max_string).
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "formats/base/utf8.h"
#include "formats/torch/pickle/pickle_opcodes.h"
#include "formats/torch/pickle/unpickler_machine.h"

namespace ckpt::torch::unpickler_detail {

Status Machine::push_bool(bool v) {
  CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kBool));
  o->b = v;
  return push(o);
}

Status Machine::push_int(int64_t v) {
  CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kInt));
  o->i = v;
  return push(o);
}

// LONG1 / LONG4: little-endian two's complement of any length; only int64 values are accepted.
Status Machine::push_long_bytes(std::string_view le) {
  size_t n = le.size();
  // Python writes the minimal length; a longer sign extension is still a valid int64.
  while (n > 8) {
    uint8_t last = static_cast<uint8_t>(le[n - 1]);
    uint8_t prev_sign = static_cast<uint8_t>(le[n - 2]) & 0x80;
    if (!((last == 0 && prev_sign == 0) || (last == 0xff && prev_sign != 0))) break;
    --n;
  }
  if (n > 8) return fail("IntTooLarge", "an integer of " + std::to_string(le.size()) + " bytes does not fit int64");
  if (n == 0) return push_int(0);
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<uint8_t>(le[i]);
  if (n < 8 && (static_cast<uint8_t>(le[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  return push_int(static_cast<int64_t>(v));
}

Status Machine::push_text_int(std::string_view line, bool is_long) {
  if (is_long && !line.empty() && line.back() == 'L') line.remove_suffix(1);
  if (!is_long && (line == "00" || line == "01")) return push_bool(line == "01");
  std::string_view digits = line;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  int64_t v = 0;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (r.ec == std::errc::result_out_of_range)
    return fail("IntTooLarge", "the integer " + std::string(line.substr(0, 40)) + " does not fit int64");
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || digits.empty())
    return fail("PickleBadValue", "'" + std::string(line.substr(0, 40)) + "' is not an integer");
  return push_int(v);
}

Status Machine::push_text_float(std::string_view line) {
  std::string s(line.substr(0, 64));
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (line.size() > 64 || s.empty() || end != s.c_str() + s.size())
    return fail("PickleBadValue", "'" + s + "' is not a float");
  CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kFloat));
  o->f = v;
  return push(o);
}

Status Machine::op_scalar(uint8_t op, bool* handled) {
  using namespace pickle_op;
  *handled = true;
  switch (op) {
    case kProto: {
      CKPT_ASSIGN_OR_RETURN(uint64_t v, take_le(1));
      if (v > static_cast<uint64_t>(kHighestProtocol))
        return fail("PickleUnsupportedProtocol", "protocol " + std::to_string(v) + " (highest known: 5)");
      return Status::Ok();
    }
    case kFrame: {  // a hint for buffered readers: the whole pickle is in memory already
      CKPT_ASSIGN_OR_RETURN(uint64_t n, take_le(8));
      (void)n;
      return Status::Ok();
    }
    case kNone: {
      CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kNone));
      return push(o);
    }
    case kNewTrue: return push_bool(true);
    case kNewFalse: return push_bool(false);
    case kBinInt: {
      CKPT_ASSIGN_OR_RETURN(uint64_t v, take_le(4));
      return push_int(static_cast<int32_t>(static_cast<uint32_t>(v)));
    }
    case kBinInt1: {
      CKPT_ASSIGN_OR_RETURN(uint64_t v, take_le(1));
      return push_int(static_cast<int64_t>(v));
    }
    case kBinInt2: {
      CKPT_ASSIGN_OR_RETURN(uint64_t v, take_le(2));
      return push_int(static_cast<int64_t>(v));
    }
    case kLong1:
    case kLong4: {
      CKPT_ASSIGN_OR_RETURN(uint64_t n, take_le(op == kLong1 ? 1 : 4));
      if (n > 64) return fail("IntTooLarge", "an integer of " + std::to_string(n) + " bytes does not fit int64");
      CKPT_ASSIGN_OR_RETURN(std::string_view le, take(n, "the integer"));
      return push_long_bytes(le);
    }
    case kInt:
    case kLong: {
      CKPT_ASSIGN_OR_RETURN(std::string_view line, take_line());
      return push_text_int(line, op == kLong);
    }
    case kFloat: {
      CKPT_ASSIGN_OR_RETURN(std::string_view line, take_line());
      return push_text_float(line);
    }
    case kBinFloat: {
      CKPT_ASSIGN_OR_RETURN(std::string_view be, take(8, "the float"));
      uint64_t bits = 0;
      for (char c : be) bits = (bits << 8) | static_cast<uint8_t>(c);  // big-endian
      CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kFloat));
      std::memcpy(&o->f, &bits, sizeof bits);
      return push(o);
    }
    default: *handled = false; return Status::Ok();
  }
}

Status Machine::push_str(std::string_view s, bool unicode) {
  if (unicode && !is_valid_utf8(s)) return fail("PickleBadUtf8", "a str is not valid UTF-8");
  CKPT_ASSIGN_OR_RETURN(PyObj * o, make(unicode ? PyType::kStr : PyType::kBytes));
  o->s.assign(s);
  return push(o);
}

// Protocol 0 text strings: STRING is a quoted repr, UNICODE raw-unicode-escape. Only the forms
// without escapes are accepted (state dicts written by protocol 2+ never use them).
Status Machine::push_text_string(std::string_view line, bool quoted) {
  if (line.find('\\') != std::string_view::npos)
    return fail("PickleUnsupportedOpcode", "text strings with escapes are not accepted");
  if (quoted) {
    if (line.size() < 2 || line.front() != line.back() || (line.front() != '\'' && line.front() != '"'))
      return fail("PickleBadValue", "a STRING argument is not quoted");
    return push_str(line.substr(1, line.size() - 2), true);
  }
  std::string utf8;  // latin-1 -> UTF-8
  for (char c : line) {
    auto u = static_cast<uint8_t>(c);
    if (u < 0x80) {
      utf8 += c;
    } else {
      utf8 += static_cast<char>(0xc0 | (u >> 6));
      utf8 += static_cast<char>(0x80 | (u & 0x3f));
    }
  }
  return push_str(utf8, true);
}

Status Machine::op_string(uint8_t op, bool* handled) {
  using namespace pickle_op;
  *handled = true;
  int len_bytes = 0;
  bool unicode = false;
  switch (op) {
    case kShortBinUnicode: len_bytes = 1; unicode = true; break;
    case kBinUnicode: len_bytes = 4; unicode = true; break;
    case kBinUnicode8: len_bytes = 8; unicode = true; break;
    case kShortBinBytes: case kShortBinString: len_bytes = 1; break;
    case kBinBytes: case kBinString: len_bytes = 4; break;
    case kBinBytes8: case kByteArray8: len_bytes = 8; break;
    case kString:
    case kUnicode: {
      CKPT_ASSIGN_OR_RETURN(std::string_view line, take_line());
      return push_text_string(line, op == kString);
    }
    default: *handled = false; return Status::Ok();
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t n, take_le(len_bytes));
  if (op == kBinString && n > INT32_MAX) return fail("PickleBadValue", "a negative BINSTRING length");
  if ((op == kShortBinBytes || op == kBinBytes || op == kBinBytes8) && n > limits_.bytes_by_reference_over) {
    const uint64_t at = pos_;
    CKPT_RETURN_IF_ERROR(take(n, "the bytes").status());
    CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kBytes));
    o->by_ref = true;
    o->ref_offset = at;
    o->ref_size = n;
    return push(o);
  }
  if (n > limits_.max_string)
    return fail("PickleTooLarge", "a string of " + std::to_string(n) + " bytes exceeds the bound " + std::to_string(limits_.max_string));
  CKPT_ASSIGN_OR_RETURN(std::string_view s, take(n, "the string"));
  // Python 2 str (BINSTRING): Python 3 reads ASCII ones as str; others stay bytes here.
  if (op == kBinString || op == kShortBinString) {
    bool ascii = true;
    for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
    unicode = ascii;
  }
  return push_str(s, unicode);
}

}  // namespace ckpt::torch::unpickler_detail
