// parse_pdparams: the pickle of a .pdparams file through the restricted unpickler, then each value
// checked to be a plain numpy array in the form formats/paddle/pdparams.h specifies.
#include <cstring>

#include "formats/base/checked.h"
#include "formats/paddle/pdparams.h"
#include "formats/torch/pickle/unpickler.h"

namespace ckpt::paddle {

namespace {

using torch::PyObj;
using torch::PyType;

Status bad_array(const std::string& key, const std::string& why) {
  return Status::Error("PdparamsBadArray", "value '" + key + "': " + why + " (expected a plain numpy array)").with_tensor(key);
}

std::string what_is(const PyObj* o) {
  if (o->is(PyType::kRecord)) return "a record of class '" + o->cls + "'";
  return std::string("a ") + torch::py_type_name(o->type);
}

bool is_reconstruct(const PyObj* o) {
  return o->is_record("numpy.core.multiarray._reconstruct") || o->is_record("numpy._core.multiarray._reconstruct");
}

// numpy.dtype('u2', False, True) + BUILD (3, '<', None, None, None, -1, -1, 0), or a
// numpy.dtypes.<X>DType record of the same arguments.
Result<DType> array_dtype(const std::string& key, const PyObj* d) {
  if (!d->is(PyType::kRecord) || (d->cls != "numpy.dtype" && d->cls.rfind("numpy.dtypes.", 0) != 0))
    return bad_array(key, "its dtype is " + what_is(d));
  if (d->args == nullptr || !d->args->is(PyType::kTuple) || d->args->items.empty() || !d->args->items[0]->is(PyType::kStr))
    return bad_array(key, "its dtype has no type code");
  const std::string& code = d->args->items[0]->s;
  char order = '|';
  if (d->state != nullptr) {
    if (!d->state->is(PyType::kTuple) || d->state->items.size() < 2 || !d->state->items[1]->is(PyType::kStr) ||
        d->state->items[1]->s.size() != 1)
      return bad_array(key, "its dtype's state is not (version, byte order, ...)");
    order = d->state->items[1]->s[0];
    for (size_t i = 2; i < d->state->items.size() && i < 5; ++i)
      if (!d->state->items[i]->is(PyType::kNone)) return bad_array(key, "its dtype is structured (fields or subarray)");
  }
  if (order != '<' && order != '|' && order != '=')
    return Status::Error("PdparamsBadDtype", "value '" + key + "': byte order '" + std::string(1, order) + "' (only little-endian is read)")
        .with_tensor(key);
  DType dt;
  if (!dtype_from_numpy_code(code, &dt))
    return Status::Error("PdparamsBadDtype", "value '" + key + "': numpy dtype '" + code.substr(0, 16) +
                                                 "' (read: f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1)").with_tensor(key);
  return dt;
}

Result<PdparamsArray> array_of(const std::string& key, const PyObj* v) {
  if (!is_reconstruct(v)) return bad_array(key, "it is " + what_is(v));
  const PyObj* a = v->args;
  if (a == nullptr || !a->is(PyType::kTuple) || a->items.size() != 3 || !a->items[0]->is_record("numpy.ndarray"))
    return bad_array(key, "_reconstruct's arguments are not (numpy.ndarray, (0,), b'b')");
  const PyObj* st = v->state;
  if (st == nullptr || !st->is(PyType::kTuple) || st->items.size() != 5 || !st->items[0]->is(PyType::kInt))
    return bad_array(key, "its state is not (version, shape, dtype, is_fortran, data)");
  const auto& s = st->items;
  PdparamsArray out;
  out.name = key;
  if (!s[1]->is(PyType::kTuple) || s[1]->items.size() > 64) return bad_array(key, "its shape is not a tuple of at most 64 ints");
  for (const PyObj* d : s[1]->items) {
    if (!d->is(PyType::kInt) || d->i < 0) return bad_array(key, "its shape holds something other than a non-negative int");
    out.shape.push_back(d->i);
  }
  CKPT_ASSIGN_OR_RETURN(out.dtype, array_dtype(key, s[2]));
  if (!s[3]->is(PyType::kBool)) return bad_array(key, "is_fortran is not a bool");
  if (s[3]->b) return Status::Error("PdparamsFortranOrder", "value '" + key + "' is stored in Fortran order").with_tensor(key);
  if (!s[4]->is(PyType::kBytes)) return bad_array(key, "its data is " + what_is(s[4]) + ", not bytes");
  auto numel = shape_numel(out.shape);
  if (!numel.ok()) return numel.take_status().with_tensor(key);
  const std::optional<uint64_t> want_bytes = checked_mul(static_cast<uint64_t>(*numel), dtype_size(out.dtype));
  if (!want_bytes) return Status::Error("PdparamsSizeMismatch", "value '" + key + "': the shape overflows").with_tensor(key);
  const uint64_t want = *want_bytes;
  const uint64_t got = s[4]->by_ref ? s[4]->ref_size : s[4]->s.size();
  if (got != want)
    return Status::Error("PdparamsSizeMismatch", "value '" + key + "' " + shape_to_string(out.shape) + " " + std::string(dtype_name(out.dtype)) +
                                                     ": expected " + std::to_string(want) + " data bytes, found " + std::to_string(got))
        .with_tensor(key);
  out.bytes = got;
  out.offset = s[4]->by_ref ? s[4]->ref_offset : 0;
  if (!s[4]->by_ref) out.inline_data = s[4]->s;  // protocol 2's _codecs.encode: a copy
  return out;
}

Status read_name_map(const PyObj* v, std::map<std::string, std::string>* out) {
  if (!v->is(PyType::kDict)) return Status::Error("PdparamsBadNameMap", std::string(kNameMapKey) + " is " + what_is(v) + ", not a dict");
  for (const auto& [k, x] : v->entries) {
    if (!k->is(PyType::kStr) || !x->is(PyType::kStr))
      return Status::Error("PdparamsBadNameMap", std::string(kNameMapKey) + " holds a " + torch::py_type_name(k->type) + " -> " +
                                                     torch::py_type_name(x->type) + " entry, not str -> str");
    (*out)[k->s] = x->s;
  }
  return Status::Ok();
}

}  // namespace

bool dtype_from_numpy_code(std::string_view code, DType* out) {
  static const std::pair<const char*, DType> kCodes[] = {
      {"f2", DType::kF16}, {"f4", DType::kF32}, {"f8", DType::kF64}, {"i1", DType::kI8},  {"i2", DType::kI16},
      {"i4", DType::kI32}, {"i8", DType::kI64}, {"u1", DType::kU8},  {"u2", DType::kU16}, {"u4", DType::kU32},
      {"u8", DType::kU64}, {"b1", DType::kBool}};
  for (const auto& [c, d] : kCodes)
    if (code == c) {
      *out = d;
      return true;
    }
  return false;
}

Result<PdparamsContents> parse_pdparams(std::string_view bytes) {
  torch::UnpickleLimits limits;
  limits.bytes_by_reference_over = 0;  // every array's data stays in the file
  CKPT_ASSIGN_OR_RETURN(torch::Pickle p, torch::unpickle(bytes, limits));
  if (!p.root->is(PyType::kDict))
    return Status::Error("PdparamsNotStateDict", "the pickle's root is " + what_is(p.root) + ", not a dict of arrays");
  PdparamsContents out;
  for (const auto& [k, v] : p.root->entries) {
    if (!k->is(PyType::kStr)) return Status::Error("PdparamsNotStateDict", std::string("a key is a ") + torch::py_type_name(k->type) + ", not a str");
    if (k->s == kNameMapKey) {
      CKPT_RETURN_IF_ERROR(read_name_map(v, &out.name_map));
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(PdparamsArray a, array_of(k->s, v));
    out.arrays.push_back(std::move(a));
  }
  return out;
}

}  // namespace ckpt::paddle
