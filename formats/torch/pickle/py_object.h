// Python objects as inert data: what the restricted unpickler (formats/torch/pickle/unpickler.h) builds
// and the pickler (formats/torch/pickle/pickler.h) writes. Nothing here is ever imported or called: an
// allow-listed class becomes a kRecord naming it, holding the arguments and state the pickle gave.
// Objects live in a PyArena and are referred to by const pointers valid while the arena lives
// (the memo can share an object between places; a hostile pickle can even make a list contain
// itself, so walkers must bound their depth).
// Thread safety: an arena is built by one thread; once built it is read-only and shareable.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/dtype/dtype.h"

namespace ckpt::torch {

enum class PyType : uint8_t {
  kNone, kBool, kInt, kFloat, kStr, kBytes,
  kList, kTuple, kDict,  // OrderedDict is a kDict with cls "collections.OrderedDict" (a plain dict
                         // may leave cls empty); torch.Size is a kTuple
  kStorage,              // a persistent id ('storage', <torch.XStorage>, key, location, numel)
  kTensor,               // torch._utils._rebuild_tensor_v2 / _rebuild_parameter over a storage
  kRecord,               // any other allow-listed global: torch dtypes, argparse.Namespace, DCP
                         // metadata dataclasses, io.BytesIO, numpy arrays and scalars, ...
};

const char* py_type_name(PyType t);

struct StorageRef {
  std::string key;       // data/<key> in the zip
  DType dtype = DType::kF32;
  int64_t numel = 0;     // elements, as the persistent id says (checked against the bytes)
  std::string location;  // "cpu", "cuda:0", ... (kept, not used)
};

struct TensorRef {
  StorageRef storage;
  int64_t storage_offset = 0;   // elements
  std::vector<int64_t> size;
  std::vector<int64_t> stride;  // elements
  bool requires_grad = false;
  bool is_parameter = false;    // rebuilt through _rebuild_parameter
};

struct PyObj {
  PyType type = PyType::kNone;
  bool b = false;         // kBool
  int64_t i = 0;          // kInt (an integer that does not fit int64 is refused: IntTooLarge)
  double f = 0;           // kFloat
  std::string s;          // kStr (UTF-8) / kBytes
  std::vector<const PyObj*> items;                            // kList, kTuple
  std::vector<std::pair<const PyObj*, const PyObj*>> entries;  // kDict, insertion order
  StorageRef storage;     // kStorage
  TensorRef tensor;       // kTensor
  // kRecord: `cls` is "module.name" of the global (e.g. "argparse.Namespace", "torch.bfloat16",
  // "torch.distributed.checkpoint.metadata.ChunkStorageMetadata"); `args` the tuple it was called
  // or NEWOBJ'd with (nullptr for a bare global such as a dtype); `state` what BUILD gave
  // (usually a kDict of attributes; nullptr when none).
  // kDict: "collections.OrderedDict" for an OrderedDict, "" for a plain dict.
  std::string cls;
  const PyObj* args = nullptr;
  const PyObj* state = nullptr;
  bool newobj = false;    // kRecord: built by NEWOBJ (cls.__new__(cls, *args)) rather than REDUCE
  // kBytes longer than UnpickleLimits::bytes_by_reference_over: not copied (`s` empty), kept as
  // the range [ref_offset, ref_offset + ref_size) of the unpickled input (a numpy array's data).
  bool by_ref = false;
  uint64_t ref_offset = 0, ref_size = 0;

  bool is(PyType t) const { return type == t; }
  bool is_record(std::string_view c) const { return type == PyType::kRecord && cls == c; }
  // kDict: the value of the kStr key `key`. kRecord: the attribute `key` of its state (a dict, or
  // the first dict of a (dict, slots) tuple). nullptr when absent or not applicable.
  const PyObj* get(std::string_view key) const;
};

// Owns objects; addresses stay valid (a deque never moves its elements).
class PyArena {
 public:
  PyObj* make(PyType t) {
    objs_.emplace_back();
    objs_.back().type = t;
    return &objs_.back();
  }
  size_t size() const { return objs_.size(); }

  // Builders for writers (pickler users).
  const PyObj* none();
  const PyObj* boolean(bool v);
  const PyObj* integer(int64_t v);
  const PyObj* real(double v);
  const PyObj* str(std::string v);
  const PyObj* bytes(std::string v);
  const PyObj* list(std::vector<const PyObj*> items);
  const PyObj* tuple(std::vector<const PyObj*> items);
  const PyObj* dict(std::vector<std::pair<const PyObj*, const PyObj*>> entries);  // plain dict
  const PyObj* ordered_dict(std::vector<std::pair<const PyObj*, const PyObj*>> entries);  // collections.OrderedDict
  const PyObj* tensor(TensorRef t);
  // A record: written as GLOBAL cls, then (args == nullptr: the bare global) args + REDUCE, or
  // with `newobj` args + NEWOBJ; then state + BUILD when state != nullptr.
  const PyObj* record(std::string cls, const PyObj* args, const PyObj* state, bool newobj = false);

 private:
  std::deque<PyObj> objs_;
};

// The torch dtype record name ("torch.float32", "torch.bfloat16", ...) of a DType and back; the
// storage class ("torch.FloatStorage", "torch.BFloat16Storage", ...) of a DType and back.
// Unsupported names: nullopt-like Result errors are the caller's (these return false).
bool dtype_from_torch_name(std::string_view torch_name, DType* out);
std::string torch_dtype_name(DType t);
bool dtype_from_storage_class(std::string_view storage_class, DType* out);
std::string storage_class_name(DType t);

}  // namespace ckpt::torch
