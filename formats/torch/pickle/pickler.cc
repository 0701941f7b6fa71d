// The pickler (formats/torch/pickle/pickler.h): protocol 2 as torch.save writes it (DEFAULT_PROTOCOL 2),
// opcode by opcode what CPython's pickle.Pickler emits for the same objects:
//  - int: BININT1 / BININT2 / BININT, else LONG1; float: BINFLOAT; str: BINUNICODE (valid UTF-8
//    is required); bytes: _codecs.encode(latin-1 text, 'latin1') (protocol 2 has no BINBYTES, and
//    torch's weights_only unpickler knows no BINBYTES either: this is what CPython writes);
//  - list / dict: EMPTY_LIST / EMPTY_DICT, memoized, then MARK ... APPENDS / SETITEMS in batches
//    of 1000; an OrderedDict is collections.OrderedDict() + SETITEMS;
//  - records: GLOBAL module name (split at the last '.'), then args + REDUCE or NEWOBJ, memoized,
//    then state + BUILD;
//  - tensors: torch._utils._rebuild_tensor_v2(pid, storage_offset, size, stride, requires_grad,
//    OrderedDict()) with pid = BINPERSID ('storage', torch.<X>Storage, key, location, numel), as
//    torch.Tensor.__reduce_ex__ + torch.serialization._save's persistent_id write it; dtypes with
//    no legacy storage class (uint16/32/64, float8) use _rebuild_tensor_v3 over
//    torch.storage.UntypedStorage (numel in bytes) with the dtype as the 7th argument; parameters
//    are torch._utils._rebuild_parameter(tensor, requires_grad, OrderedDict()).
// Every object reached twice through the same pointer is written once and then fetched from the
// memo (BINGET); a cycle is allowed only through a list or dict (as in Python).
#include "formats/torch/pickle/pickler.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace ckpt::torch {

namespace pickler_detail {

constexpr int kMaxPickleDepth = 1000;  // CPython's own recursion limit is of this order
constexpr size_t kBatch = 1000;        // CPython's APPENDS / SETITEMS batch size

// torch saves uint16/32/64 and float8 tensors over an UntypedStorage (numel in bytes) through
// _rebuild_tensor_v3, the others over their legacy typed storage class (py_object.h's map).
constexpr const char* kUntypedStorage = "torch.storage.UntypedStorage";

bool valid_utf8(std::string_view s) {
  static const uint32_t kMinCodePoint[] = {0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 6) {
      n = 1, cp = c & 0x1Fu;
    } else if ((c >> 4) == 14) {
      n = 2, cp = c & 0x0Fu;
    } else if ((c >> 3) == 30) {
      n = 3, cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 2) return false;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    if (cp < kMinCodePoint[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

class Pickler {
 public:
  Result<std::string> run(const PyObj* root) {
    out_ = "\x80\x02";
    CKPT_RETURN_IF_ERROR(dump(root, 0));
    out_ += '.';
    return std::move(out_);
  }

 private:
  std::string out_;
  std::unordered_map<const PyObj*, uint32_t> memo_;
  std::unordered_map<std::string, uint32_t> global_memo_;
  std::unordered_map<std::string, uint32_t> const_memo_;
  std::unordered_set<const PyObj*> open_;  // tuples / records / tensors being written (cycle check)
  uint32_t next_ = 0;

  static Status bad(const std::string& what) { return Status::Error("PickleWriteInvalid", "cannot pickle: " + what); }

  void u32(uint32_t v) {
    for (int b = 0; b < 4; ++b) out_ += static_cast<char>((v >> (8 * b)) & 0xFF);
  }
  uint32_t put() {
    uint32_t id = next_++;
    if (id < 256) {
      out_ += 'q';
      out_ += static_cast<char>(id);
    } else {
      out_ += 'r';
      u32(id);
    }
    return id;
  }
  void get(uint32_t id) {
    if (id < 256) {
      out_ += 'h';
      out_ += static_cast<char>(id);
    } else {
      out_ += 'j';
      u32(id);
    }
  }
  void memoize(const PyObj* o) { memo_[o] = put(); }

  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      out_ += 'M';
      out_ += static_cast<char>(v & 0xFF);
      out_ += static_cast<char>(v >> 8);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {  // LONG1: minimal little-endian two's complement
      std::string b;
      auto u = static_cast<uint64_t>(v);
      for (int k = 0; k < 8; ++k) b += static_cast<char>((u >> (8 * k)) & 0xFF);
      while (b.size() > 1) {
        auto last = static_cast<unsigned char>(b.back());
        auto prev = static_cast<unsigned char>(b[b.size() - 2]);
        if ((last == 0 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80))) b.pop_back();
        else break;
      }
      out_ += '\x8a';
      out_ += static_cast<char>(b.size());
      out_ += b;
    }
  }
  void real(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    out_ += 'G';
    for (int k = 7; k >= 0; --k) out_ += static_cast<char>((bits >> (8 * k)) & 0xFF);
  }
  Status str(std::string_view s) {
    if (!valid_utf8(s)) return bad("a str that is not valid UTF-8");
    if (s.size() > UINT32_MAX) return bad("a str of " + std::to_string(s.size()) + " bytes (protocol 2 holds < 4 GiB)");
    out_ += 'X';
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
    return Status::Ok();
  }
  // A string CPython would write once and then fetch (a literal of torch's code: 'storage', 'cpu').
  Status constant_str(const std::string& v) {
    auto it = const_memo_.find(v);
    if (it != const_memo_.end()) {
      get(it->second);
      return Status::Ok();
    }
    CKPT_RETURN_IF_ERROR(str(v));
    const_memo_[v] = put();
    return Status::Ok();
  }
  Status global(std::string_view cls) {
    auto it = global_memo_.find(std::string(cls));
    if (it != global_memo_.end()) {
      get(it->second);
      return Status::Ok();
    }
    size_t dot = cls.rfind('.');
    if (dot == std::string_view::npos || dot == 0 || dot + 1 == cls.size() || cls.find('\n') != std::string_view::npos)
      return bad("the global '" + std::string(cls) + "' (expected module.name)");
    out_ += 'c';
    out_.append(cls.substr(0, dot));
    out_ += '\n';
    out_.append(cls.substr(dot + 1));
    out_ += '\n';
    global_memo_[std::string(cls)] = put();
    return Status::Ok();
  }
  void tuple_op(size_t n) {  // after MARK (n > 3) or the n items (n <= 3)
    static const char kOps[] = {')', '\x85', '\x86', '\x87'};
    out_ += n <= 3 ? kOps[n] : 't';
  }
  Status ordered_dict_empty() {
    CKPT_RETURN_IF_ERROR(global("collections.OrderedDict"));
    out_ += ")R";
    return Status::Ok();
  }
  Status bytes(const PyObj* o) {
    std::string latin;  // each byte as the code point of that value, in UTF-8
    for (char ch : o->s) {
      auto b = static_cast<unsigned char>(ch);
      if (b < 0x80) {
        latin += ch;
      } else {
        latin += static_cast<char>(0xC0 | (b >> 6));
        latin += static_cast<char>(0x80 | (b & 0x3F));
      }
    }
    CKPT_RETURN_IF_ERROR(global("_codecs.encode"));
    CKPT_RETURN_IF_ERROR(str(latin));
    put();
    CKPT_RETURN_IF_ERROR(constant_str("latin1"));
    out_ += '\x86';
    put();
    out_ += 'R';
    memoize(o);
    return Status::Ok();
  }
  Status persistent_id(const StorageRef& s);
  Status tensor(const PyObj* o);
  Status sequence(const PyObj* o, int depth);
  Status mapping(const PyObj* o, int depth);
  Status record(const PyObj* o, int depth);
  Status dump(const PyObj* o, int depth);
};

Status Pickler::persistent_id(const StorageRef& s) {
  if (s.key.empty()) return bad("a storage with an empty key");
  if (s.numel < 0) return bad("storage '" + s.key + "' with " + std::to_string(s.numel) + " elements");
  const std::string cls = storage_class_name(s.dtype);
  int64_t numel = s.numel;
  if (cls == kUntypedStorage) numel = s.numel * static_cast<int64_t>(dtype_size(s.dtype));
  out_ += '(';
  CKPT_RETURN_IF_ERROR(constant_str("storage"));
  CKPT_RETURN_IF_ERROR(global(cls));
  CKPT_RETURN_IF_ERROR(constant_str(s.key));  // torch's key string is one object per storage
  CKPT_RETURN_IF_ERROR(constant_str(s.location.empty() ? "cpu" : s.location));
  integer(numel);
  out_ += 't';
  put();
  out_ += 'Q';
  return Status::Ok();
}

Status Pickler::tensor(const PyObj* o) {
  const TensorRef& t = o->tensor;
  if (t.size.size() != t.stride.size())
    return bad("tensor over storage '" + t.storage.key + "' with " + std::to_string(t.size.size()) + " sizes and " +
               std::to_string(t.stride.size()) + " strides");
  const bool v3 = storage_class_name(t.storage.dtype) == kUntypedStorage;
  if (t.is_parameter) {
    CKPT_RETURN_IF_ERROR(global("torch._utils._rebuild_parameter"));
  }
  CKPT_RETURN_IF_ERROR(global(v3 ? "torch._utils._rebuild_tensor_v3" : "torch._utils._rebuild_tensor_v2"));
  out_ += '(';
  CKPT_RETURN_IF_ERROR(persistent_id(t.storage));
  integer(t.storage_offset);
  for (const auto* dims : {&t.size, &t.stride}) {
    if (dims->size() > 3) out_ += '(';
    for (int64_t d : *dims) integer(d);
    tuple_op(dims->size());
    if (!dims->empty()) put();
  }
  out_ += (t.requires_grad && !t.is_parameter) ? '\x88' : '\x89';
  CKPT_RETURN_IF_ERROR(ordered_dict_empty());
  put();
  if (v3) CKPT_RETURN_IF_ERROR(global(torch_dtype_name(t.storage.dtype)));
  out_ += 't';
  put();
  out_ += 'R';
  if (t.is_parameter) {
    put();
    out_ += t.requires_grad ? '\x88' : '\x89';
    CKPT_RETURN_IF_ERROR(ordered_dict_empty());
    put();
    out_ += '\x87';  // (tensor, requires_grad, OrderedDict()): TUPLE3
    put();
    out_ += 'R';
  }
  memoize(o);
  return Status::Ok();
}

Status Pickler::sequence(const PyObj* o, int depth) {
  if (o->is(PyType::kList)) {
    out_ += ']';
    memoize(o);
    for (size_t i = 0; i < o->items.size(); i += kBatch) {
      size_t n = std::min(kBatch, o->items.size() - i);
      if (n > 1) out_ += '(';
      for (size_t k = i; k < i + n; ++k) CKPT_RETURN_IF_ERROR(dump(o->items[k], depth + 1));
      out_ += n > 1 ? 'e' : 'a';
    }
    return Status::Ok();
  }
  size_t n = o->items.size();
  if (n > 3) out_ += '(';
  for (const PyObj* it : o->items) CKPT_RETURN_IF_ERROR(dump(it, depth + 1));
  tuple_op(n);
  if (n > 0) memoize(o);  // CPython does not memoize the empty tuple
  return Status::Ok();
}

Status Pickler::mapping(const PyObj* o, int depth) {
  if (o->cls == "collections.OrderedDict") {
      CKPT_RETURN_IF_ERROR(ordered_dict_empty());
  } else if (o->cls.empty()) {
    out_ += '}';
  } else {
    return bad("a dict of class '" + o->cls + "'");
  }
  memoize(o);
  for (size_t i = 0; i < o->entries.size(); i += kBatch) {
    size_t n = std::min(kBatch, o->entries.size() - i);
    if (n > 1) out_ += '(';
    for (size_t k = i; k < i + n; ++k) {
      CKPT_RETURN_IF_ERROR(dump(o->entries[k].first, depth + 1));
      CKPT_RETURN_IF_ERROR(dump(o->entries[k].second, depth + 1));
    }
    out_ += n > 1 ? 'u' : 's';
  }
  return Status::Ok();
}

Status Pickler::record(const PyObj* o, int depth) {
  CKPT_RETURN_IF_ERROR(global(o->cls));
  if (o->args == nullptr) {
    if (o->newobj || o->state) return bad("record '" + o->cls + "': NEWOBJ or BUILD without arguments");
    return Status::Ok();  // a bare global (a dtype): memoized by name
  }
  if (!o->args->is(PyType::kTuple)) return bad("record '" + o->cls + "' with arguments that are not a tuple");
  CKPT_RETURN_IF_ERROR(dump(o->args, depth + 1));
  out_ += o->newobj ? '\x81' : 'R';
  memoize(o);
  if (o->state) {
    CKPT_RETURN_IF_ERROR(dump(o->state, depth + 1));
    out_ += 'b';
  }
  return Status::Ok();
}

Status Pickler::dump(const PyObj* o, int depth) {
  if (o == nullptr) return bad("a null object");
  if (depth > kMaxPickleDepth) return bad("nesting deeper than " + std::to_string(kMaxPickleDepth));
  auto m = memo_.find(o);
  if (m != memo_.end()) {
    get(m->second);
    return Status::Ok();
  }
  switch (o->type) {
    case PyType::kNone: out_ += 'N'; return Status::Ok();
    case PyType::kBool: out_ += o->b ? '\x88' : '\x89'; return Status::Ok();
    case PyType::kInt: integer(o->i); return Status::Ok();
    case PyType::kFloat: real(o->f); return Status::Ok();
    case PyType::kStr:
      CKPT_RETURN_IF_ERROR(str(o->s));
      memoize(o);  // as CPython does: a str met again through the same object is fetched
      return Status::Ok();
    case PyType::kBytes: return bytes(o);
    case PyType::kList: return sequence(o, depth);
    case PyType::kDict: return mapping(o, depth);
    default: break;
  }
  if (!open_.insert(o).second) return bad("a cycle through a tuple, record, storage or tensor (only lists and dicts may contain themselves)");
  Status st;
  switch (o->type) {
    case PyType::kTuple: st = sequence(o, depth); break;
    case PyType::kStorage:
      st = persistent_id(o->storage);
      if (st.ok()) memoize(o);
      break;
    case PyType::kTensor: st = tensor(o); break;
    case PyType::kRecord: st = record(o, depth); break;
    default: st = bad("an object of unknown type"); break;
  }
  open_.erase(o);
  return st;
}

}  // namespace pickler_detail

Result<std::string> pickle_dumps(const PyObj* root) { return pickler_detail::Pickler().run(root); }

}  // namespace ckpt::torch
