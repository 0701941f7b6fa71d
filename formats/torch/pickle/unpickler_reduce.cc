// What REDUCE / NEWOBJ of an allow-listed global builds (formats/torch/pickle/unpickler_globals.cc lists
// them): containers, bytes, torch tensors over persistent-id storages, or inert records. The
// arguments are checked for the exact shapes torch.save writes; nothing is ever called.
#include "formats/torch/pickle/unpickler_machine.h"

namespace ckpt::torch::unpickler_detail {

namespace {

constexpr size_t kPickleMaxTensorDims = 64;

// UTF-8 -> latin-1 bytes (_codecs.encode(s, 'latin1')); false on a code point above 0xff.
bool pickle_utf8_to_latin1(const std::string& s, std::string* out) {
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else if ((c & 0xe0) == 0xc0 && c <= 0xc3 && i + 1 < s.size()) {
      out->push_back(static_cast<char>(((c & 0x1f) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3f)));
      ++i;
    } else {
      return false;
    }
  }
  return true;
}

bool pickle_int_tuple(const PyObj* o, std::vector<int64_t>* out) {
  if (!o->is(PyType::kTuple) && !o->is(PyType::kList)) return false;
  for (const PyObj* i : o->items) {
    if (!i->is(PyType::kInt)) return false;
    out->push_back(i->i);
  }
  return true;
}

}  // namespace

bool pickle_is_plain_scalar(const PyObj* o) {
  return o->is(PyType::kNone) || o->is(PyType::kBool) || o->is(PyType::kInt) || o->is(PyType::kFloat) || o->is(PyType::kStr);
}

bool pickle_is_plain_state(const PyObj* o) {
  if (!o->is(PyType::kDict)) return false;
  for (const auto& [k, v] : o->entries)
    if (!k->is(PyType::kStr) || !pickle_is_plain_scalar(v)) return false;
  return true;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
// _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
Result<PyObj*> Machine::rebuild_tensor(const PyObj* args, bool v3) {
  const char* fn = v3 ? "torch._utils._rebuild_tensor_v3" : "torch._utils._rebuild_tensor_v2";
  auto bad = [&](const std::string& why) { return fail("PickleBadTensor", std::string(fn) + ": " + why); };
  const auto& a = args->items;
  size_t min_args = v3 ? 7 : 6;
  if (a.size() < min_args || a.size() > min_args + 1)
    return bad("takes " + std::to_string(min_args) + " or " + std::to_string(min_args + 1) + " arguments, got " + std::to_string(a.size()));
  if (!a[0]->is(PyType::kStorage)) return bad(std::string("the storage is a ") + py_type_name(a[0]->type));
  if (!a[1]->is(PyType::kInt) || a[1]->i < 0) return bad("the storage offset is not a non-negative int");
  CKPT_ASSIGN_OR_RETURN(PyObj * t, make(PyType::kTensor));
  TensorRef& r = t->tensor;
  r.storage = a[0]->storage;
  r.storage_offset = a[1]->i;
  if (!pickle_int_tuple(a[2], &r.size) || !pickle_int_tuple(a[3], &r.stride)) return bad("size and stride must be tuples of ints");
  if (r.size.size() != r.stride.size()) return bad("size and stride have different lengths");
  if (r.size.size() > kPickleMaxTensorDims) return bad("more than 64 dimensions");
  for (size_t i = 0; i < r.size.size(); ++i)
    if (r.size[i] < 0 || r.stride[i] < 0) return bad("a negative size or stride");
  if (!a[4]->is(PyType::kBool)) return bad("requires_grad is not a bool");
  r.requires_grad = a[4]->b;
  if (!a[5]->is(PyType::kDict) || !a[5]->entries.empty()) return bad("backward hooks must be an empty OrderedDict");
  if (v3) {
    const AllowedGlobal* g = global_of(a[6]);
    DType dt;
    if (g == nullptr || g->kind != GlobalKind::kBare || !dtype_from_torch_name(g->canonical, &dt))
      return bad("the dtype argument is not a supported torch dtype");
    // The storage is untyped (numel counts bytes) or typed; the tensor's elements are `dt`.
    auto bytes = static_cast<uint64_t>(r.storage.numel) * dtype_size(r.storage.dtype);
    if (bytes / dtype_size(r.storage.dtype) != static_cast<uint64_t>(r.storage.numel) || bytes % dtype_size(dt) != 0)
      return bad("the storage's " + std::to_string(r.storage.numel) + " elements are not a whole number of " + torch_dtype_name(dt));
    r.storage.dtype = dt;
    r.storage.numel = static_cast<int64_t>(bytes / dtype_size(dt));
  }
  for (const PyObj* x : a) CKPT_RETURN_IF_ERROR(nest(t, x));
  return t;
}

// _rebuild_parameter(data, requires_grad, backward_hooks)
// _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state): the state (Python
// attributes of the parameter) is not kept.
Result<PyObj*> Machine::rebuild_parameter(const PyObj* args, bool with_state) {
  const char* fn = with_state ? "torch._utils._rebuild_parameter_with_state" : "torch._utils._rebuild_parameter";
  const auto& a = args->items;
  if (a.size() != (with_state ? 4u : 3u)) return fail("PickleBadTensor", std::string(fn) + ": wrong number of arguments");
  if (!a[0]->is(PyType::kTensor)) return fail("PickleBadTensor", std::string(fn) + ": the data is a " + py_type_name(a[0]->type) + ", not a tensor");
  if (!a[1]->is(PyType::kBool)) return fail("PickleBadTensor", std::string(fn) + ": requires_grad is not a bool");
  if (!a[2]->is(PyType::kDict) || !a[2]->entries.empty())
    return fail("PickleBadTensor", std::string(fn) + ": backward hooks must be an empty OrderedDict");
  CKPT_ASSIGN_OR_RETURN(PyObj * t, make(PyType::kTensor));
  t->tensor = a[0]->tensor;
  t->tensor.requires_grad = a[1]->b;
  t->tensor.is_parameter = true;
  for (const PyObj* x : a) CKPT_RETURN_IF_ERROR(nest(t, x));
  return t;
}

// _rebuild_from_type_v2(func, new_type, args, state): only func = _rebuild_tensor_v2/v3 and
// new_type = torch.Tensor / torch.nn.parameter.Parameter; the state is not kept.
Result<PyObj*> Machine::rebuild_from_type(const PyObj* args) {
  const auto& a = args->items;
  auto bad = [&](const std::string& why) { return fail("PickleBadTensor", "torch._tensor._rebuild_from_type_v2: " + why); };
  if (a.size() != 4) return bad("takes 4 arguments");
  const AllowedGlobal* fn = global_of(a[0]);
  const AllowedGlobal* ty = global_of(a[1]);
  if (fn == nullptr || (fn->kind != GlobalKind::kRebuildV2 && fn->kind != GlobalKind::kRebuildV3))
    return bad("the function is not torch._utils._rebuild_tensor_v2/v3");
  if (ty == nullptr || ty->kind != GlobalKind::kTensorType) return bad("the type is not torch.Tensor or torch.nn.parameter.Parameter");
  if (!a[2]->is(PyType::kTuple)) return bad("the arguments are not a tuple");
  CKPT_ASSIGN_OR_RETURN(PyObj * t, rebuild_tensor(a[2], fn->kind == GlobalKind::kRebuildV3));
  if (ty->canonical == "torch.nn.parameter.Parameter") t->tensor.is_parameter = true;
  return t;
}

Result<PyObj*> Machine::reduce(const AllowedGlobal& g, const PyObj* args) {
  const auto& a = args->items;
  auto bad = [&](const std::string& why) { return fail("PickleBadReduce", "'" + g.canonical + "': " + why); };
  switch (g.kind) {
    case GlobalKind::kOrderedDict:
      if (!a.empty()) return bad("takes no arguments here (items follow with SETITEMS)");
      return make(PyType::kDict);
    case GlobalKind::kSetLike: {
      if (a.size() > 1 || (a.size() == 1 && !a[0]->is(PyType::kList))) return bad("takes one list");
      CKPT_ASSIGN_OR_RETURN(PyObj * l, make(PyType::kList));
      if (!a.empty()) l->items = a[0]->items;
      for (const PyObj* x : l->items) CKPT_RETURN_IF_ERROR(nest(l, x));
      return l;
    }
    case GlobalKind::kCodecsEncode: {
      if (a.size() != 2 || !a[0]->is(PyType::kStr) || !a[1]->is(PyType::kStr) || (a[1]->s != "latin1" && a[1]->s != "latin-1"))
        return bad("takes (str, 'latin1')");
      CKPT_ASSIGN_OR_RETURN(PyObj * b, make(PyType::kBytes));
      if (!pickle_utf8_to_latin1(a[0]->s, &b->s)) return bad("the str has characters beyond latin-1");
      return b;
    }
    case GlobalKind::kTorchSize: {
      std::vector<int64_t> dims;
      if (a.size() != 1 || !pickle_int_tuple(a[0], &dims)) return bad("takes one tuple of ints");
      CKPT_ASSIGN_OR_RETURN(PyObj * t, make(PyType::kTuple));
      t->items = a[0]->items;
      return t;
    }
    case GlobalKind::kRebuildV2: return rebuild_tensor(args, false);
    case GlobalKind::kRebuildV3: return rebuild_tensor(args, true);
    case GlobalKind::kRebuildParam: return rebuild_parameter(args, false);
    case GlobalKind::kRebuildParamState: return rebuild_parameter(args, true);
    case GlobalKind::kRebuildFromType: return rebuild_from_type(args);
    case GlobalKind::kRecordClass: {
      CKPT_ASSIGN_OR_RETURN(PyObj * r, make(PyType::kRecord));
      r->cls = g.canonical;
      r->args = args;
      CKPT_RETURN_IF_ERROR(nest(r, args));
      return r;
    }
    case GlobalKind::kPlainClass: {
      for (const PyObj* x : a)
        if (!pickle_is_plain_scalar(x))
          return bad("takes only plain values (None, bool, int, float, str), got a " + std::string(py_type_name(x->type)));
      CKPT_ASSIGN_OR_RETURN(PyObj * r, make(PyType::kRecord));
      r->cls = g.canonical;
      r->args = args;
      CKPT_RETURN_IF_ERROR(nest(r, args));
      return r;
    }
    case GlobalKind::kGetattr: {
      const AllowedGlobal* cls = a.size() == 2 ? global_of(a[0]) : nullptr;
      if (cls == nullptr || cls->kind != GlobalKind::kPlainClass)
        return bad("takes (an allow-listed plain class, 'member') only (an enum member by name)");
      if (!a[1]->is(PyType::kStr) || a[1]->s.empty() || a[1]->s.size() > 64 || a[1]->s[0] == '_')
        return bad("the member of '" + cls->canonical + "' must be a public name of at most 64 characters");
      CKPT_ASSIGN_OR_RETURN(PyObj * t, make(PyType::kTuple));
      t->items.push_back(a[1]);
      CKPT_RETURN_IF_ERROR(nest(t, a[1]));
      CKPT_ASSIGN_OR_RETURN(PyObj * r, make(PyType::kRecord));
      r->cls = cls->canonical;
      r->args = t;
      CKPT_RETURN_IF_ERROR(nest(r, t));
      return r;
    }
    case GlobalKind::kTensorType:
    case GlobalKind::kStorageClass:
    case GlobalKind::kBare: break;
  }
  return bad("is a name ckpt keeps, not something a pickle may call");
}

}  // namespace ckpt::torch::unpickler_detail
