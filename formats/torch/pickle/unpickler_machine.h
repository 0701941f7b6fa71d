// Internal to the restricted unpickler: the pickle virtual machine's state (stack, marks, memo,
// input cursor, bounds) shared by its opcode handlers (unpickler.cc, unpickler_ops.cc) and the
// allow-list (unpickler_globals.cc). Not part of the public interface: use unpickler.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/base/status.h"
#include "formats/torch/pickle/py_object.h"
#include "formats/torch/pickle/unpickler.h"

namespace ckpt::torch::unpickler_detail {

// What an allow-listed global may do (unpickler_globals.cc).
enum class GlobalKind : uint8_t {
  kOrderedDict,       // REDUCE () -> an empty kDict
  kSetLike,           // builtins.set / frozenset: REDUCE ([items],) -> kList
  kCodecsEncode,      // _codecs.encode(str, 'latin1') -> kBytes (protocol 2's bytes)
  kTorchSize,         // torch.Size((ints,)) -> kTuple
  kRebuildV2,         // torch._utils._rebuild_tensor_v2 -> kTensor
  kRebuildV3,         // torch._utils._rebuild_tensor_v3 (dtype argument, untyped storage)
  kRebuildParam,      // torch._utils._rebuild_parameter -> kTensor (is_parameter)
  kRebuildParamState, // torch._utils._rebuild_parameter_with_state
  kRebuildFromType,   // torch._tensor._rebuild_from_type_v2 (Tensor / Parameter only)
  kTensorType,        // torch.Tensor, torch.nn.parameter.Parameter: only as that type argument
  kStorageClass,      // torch.FloatStorage, ...: only inside a persistent id
  kBare,              // torch dtypes, layouts, memory formats: a bare record, never called
  kRecordClass,       // REDUCE / NEWOBJ / BUILD build an inert kRecord holding args and state
  kPlainClass,        // as kRecordClass, but args and BUILD state only plain scalars (None, bool,
                      // int, float, str; the state a dict of str -> scalar): DeepSpeed's objects
  kGetattr,           // builtins.getattr(<kPlainClass>, 'member'): an enum member by name (Python
                      // 3.11+'s Enum pickling) -> a kRecord of that class with args ('member',)
};

struct AllowedGlobal {
  GlobalKind kind;
  std::string canonical;  // "module.name" with protocol-2 aliases resolved (__builtin__ -> builtins)
};

// A plain value of a kPlainClass: None, bool, int, float or str; a plain state: a dict of
// str -> plain value (unpickler_reduce.cc).
bool pickle_is_plain_scalar(const PyObj* o);
bool pickle_is_plain_state(const PyObj* o);

// The allow-list: the entry for module.name, or nullptr.
std::optional<AllowedGlobal> find_allowed_global(std::string_view module, std::string_view name);

class Machine {
 public:
  Machine(std::string_view bytes, const UnpickleLimits& limits);
  Result<Pickle> run();

  // "pickle: at byte N (OPNAME): msg" with the rule code.
  Status fail(const char* code, const std::string& msg) const;
  Result<PyObj*> make(PyType t);
  // Records that `child` now sits inside `parent` (depth bound).
  Status nest(PyObj* parent, const PyObj* child);
  // The kind of a global pushed by GLOBAL / STACK_GLOBAL, or nullptr when `o` is not one.
  const AllowedGlobal* global_of(const PyObj* o) const;
  // REDUCE of allow-listed `g` with the tuple `args` (unpickler_globals.cc).
  Result<PyObj*> reduce(const AllowedGlobal& g, const PyObj* args);

 private:
  friend struct OpHandlers;
  // Input.
  bool have(uint64_t n) const { return n <= bytes_.size() - pos_; }
  Result<std::string_view> take(uint64_t n, const char* what);
  Result<uint64_t> take_le(int nbytes);
  Result<std::string_view> take_line();
  // Stack.
  Status push(PyObj* o);
  Result<PyObj*> pop();
  Result<PyObj*> top();
  Result<std::vector<PyObj*>> pop_mark();
  // Memo.
  Status memo_put(uint64_t index);
  Result<PyObj*> memo_get(uint64_t index);

  Status step(uint8_t op);
  Status op_scalar(uint8_t op, bool* handled);
  Status op_string(uint8_t op, bool* handled);
  Status op_container(uint8_t op, bool* handled);
  Status op_memo(uint8_t op, bool* handled);
  Status op_object(uint8_t op, bool* handled);
  Status push_str(std::string_view s, bool unicode);
  Status push_int(int64_t v);
  Status push_long_bytes(std::string_view le);
  Status push_text_int(std::string_view line, bool is_long);
  Status push_text_float(std::string_view line);
  Status push_text_string(std::string_view line, bool quoted);
  Status push_bool(bool v);
  Status push_global(std::string_view module, std::string_view name);
  Status persistent_load(const PyObj* pid);
  Status append_items(PyObj* list, const std::vector<PyObj*>& items);
  Status set_items(PyObj* dict, const std::vector<PyObj*>& kv);
  Status make_tuple(std::vector<PyObj*> items);

  // Tensor rebuilds (unpickler_tensor.cc).
  Result<PyObj*> rebuild_tensor(const PyObj* args, bool v3);
  Result<PyObj*> rebuild_parameter(const PyObj* args, bool with_state);
  Result<PyObj*> rebuild_from_type(const PyObj* args);

  std::string_view bytes_;
  UnpickleLimits limits_;
  uint64_t pos_ = 0;
  uint64_t op_pos_ = 0;
  uint8_t op_ = 0;
  bool stopped_ = false;
  Pickle out_;
  std::vector<PyObj*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyObj*> memo_;
  std::unordered_map<const PyObj*, uint32_t> depth_;
  std::unordered_map<const PyObj*, AllowedGlobal> globals_;
  // Per dict built by SETITEM(S): its keys' Python identities (py_key_identity) -> entry index, so
  // a repeated key replaces the value as Python's d[k] = v does.
  std::unordered_map<const PyObj*, std::unordered_map<std::string, size_t>> dict_keys_;
};

// A dict key's identity under Python's equality (==, hash): equal keys give equal strings
// (1 == 1.0 == True, -0.0 == 0.0, equal str / bytes / tuples of such, one bare global such as
// torch.float32); other objects are equal only to themselves. nullopt: unhashable (list, dict).
std::optional<std::string> py_key_identity(const PyObj* k);

}  // namespace ckpt::torch::unpickler_detail
