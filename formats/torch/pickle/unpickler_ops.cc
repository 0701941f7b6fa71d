// The restricted unpickler's container, memo and object opcodes. Objects are built as inert
// PyObjs; REDUCE / NEWOBJ / BUILD only act on allow-listed globals (unpickler_globals.cc).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "formats/torch/pickle/pickle_opcodes.h"
#include "formats/torch/pickle/unpickler_machine.h"

namespace ckpt::torch::unpickler_detail {

Status Machine::make_tuple(std::vector<PyObj*> items) {
  CKPT_ASSIGN_OR_RETURN(PyObj * t, make(PyType::kTuple));
  if (items.size() > limits_.max_items)
    return fail("PickleTooLarge", "a tuple of " + std::to_string(items.size()) + " items exceeds " + std::to_string(limits_.max_items));
  for (PyObj* i : items) {
    CKPT_RETURN_IF_ERROR(nest(t, i));
    t->items.push_back(i);
  }
  return push(t);
}

Status Machine::append_items(PyObj* list, const std::vector<PyObj*>& items) {
  if (!list->is(PyType::kList))
    return fail("PickleBadValue", std::string("APPEND(S) to a ") + py_type_name(list->type) + ", not a list");
  if (list->items.size() + items.size() > limits_.max_items)
    return fail("PickleTooLarge", "a list of more than " + std::to_string(limits_.max_items) + " items");
  for (PyObj* i : items) {
    CKPT_RETURN_IF_ERROR(nest(list, i));
    list->items.push_back(i);
  }
  return Status::Ok();
}

Status Machine::set_items(PyObj* dict, const std::vector<PyObj*>& kv) {
  if (!dict->is(PyType::kDict))
    return fail("PickleBadValue", std::string("SETITEM(S) on a ") + py_type_name(dict->type) + ", not a dict");
  if (kv.size() % 2 != 0) return fail("PickleBadValue", "SETITEMS with an odd number of values");
  if (dict->entries.size() + kv.size() / 2 > limits_.max_items)
    return fail("PickleTooLarge", "a dict of more than " + std::to_string(limits_.max_items) + " entries");
  // Python semantics (docs/TORCH.md "Dicts"): SETITEM(S) is d[k] = v, so a key equal to one
  // already in the dict keeps its first position and key object and takes the LAST value, as
  // torch.load does. A pickle Python wrote never repeats a key; a spliced one must not mean one
  // thing to ckpt and another to torch.
  auto& index = dict_keys_[dict];
  for (size_t i = 0; i < kv.size(); i += 2) {
    CKPT_RETURN_IF_ERROR(nest(dict, kv[i]));
    CKPT_RETURN_IF_ERROR(nest(dict, kv[i + 1]));
    std::optional<std::string> id = py_key_identity(kv[i]);
    if (!id) return fail("PickleBadValue", std::string("a dict key of type ") + py_type_name(kv[i]->type) + ", which Python refuses (unhashable)");
    auto [it, fresh] = index.emplace(std::move(*id), dict->entries.size());
    if (fresh) {
      dict->entries.emplace_back(kv[i], kv[i + 1]);
    } else {
      dict->entries[it->second].second = kv[i + 1];
    }
  }
  return Status::Ok();
}

std::optional<std::string> py_key_identity(const PyObj* k) {
  auto number = [](int64_t v) { return "n" + std::to_string(v); };
  switch (k->type) {
    case PyType::kNone: return std::string("N");
    case PyType::kBool: return number(k->b ? 1 : 0);
    case PyType::kInt: return number(k->i);
    case PyType::kFloat: {
      const double f = k->f;
      if (f == std::trunc(f) && std::fabs(f) < 9.2e18) return number(static_cast<int64_t>(f));  // 2.0 == 2, -0.0 == 0
      if (std::isnan(f)) break;  // NaN equals nothing but itself
      uint64_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      return "f" + std::to_string(bits);
    }
    case PyType::kStr: return "s" + std::to_string(k->s.size()) + ":" + k->s;
    case PyType::kBytes:
      if (k->by_ref) break;  // by reference: equal to itself only
      return "b" + std::to_string(k->s.size()) + ":" + k->s;
    case PyType::kTuple: {
      std::string out = "t" + std::to_string(k->items.size()) + "(";
      for (const PyObj* e : k->items) {
        std::optional<std::string> x = py_key_identity(e);  // depth bounded by the nesting limit
        if (!x) return std::nullopt;
        out += std::to_string(x->size()) + ":" + *x;
      }
      return out + ")";
    }
    case PyType::kList:
    case PyType::kDict: return std::nullopt;
    case PyType::kRecord:
      if (k->args == nullptr && k->state == nullptr) return "g" + k->cls;  // one object per global in Python
      break;
    default: break;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "p%p", static_cast<const void*>(k));
  return std::string(buf);
}

Status Machine::op_container(uint8_t op, bool* handled) {
  using namespace pickle_op;
  *handled = true;
  switch (op) {
    case kMark:
      if (marks_.size() >= limits_.max_depth)
        return fail("PickleTooDeep", "more than " + std::to_string(limits_.max_depth) + " nested MARKs");
      marks_.push_back(stack_.size());
      return Status::Ok();
    case kStop: {
      if (!marks_.empty()) return fail("PickleBadValue", "STOP inside an unfinished MARK");
      CKPT_ASSIGN_OR_RETURN(PyObj * root, pop());
      out_.root = root;
      stopped_ = true;
      return Status::Ok();
    }
    case kPop: {  // above the last MARK: one value; nothing there: the MARK itself
      size_t floor = marks_.empty() ? 0 : marks_.back();
      if (stack_.size() > floor) {
        stack_.pop_back();
        return Status::Ok();
      }
      return pop_mark().status();
    }
    case kPopMark: return pop_mark().status();
    case kDup: {
      CKPT_ASSIGN_OR_RETURN(PyObj * o, top());
      return push(o);
    }
    case kEmptyList:
    case kEmptySet: {  // sets are kept as lists (their order as pickled)
      CKPT_ASSIGN_OR_RETURN(PyObj * l, make(PyType::kList));
      return push(l);
    }
    case kEmptyDict: {
      CKPT_ASSIGN_OR_RETURN(PyObj * d, make(PyType::kDict));
      return push(d);
    }
    case kEmptyTuple: return make_tuple({});
    case kTuple1: case kTuple2: case kTuple3: {
      size_t n = op - kTuple1 + 1u;
      std::vector<PyObj*> items(n);
      for (size_t i = n; i-- > 0;) {
        CKPT_ASSIGN_OR_RETURN(items[i], pop());
      }
      return make_tuple(std::move(items));
    }
    case kTuple: {
      CKPT_ASSIGN_OR_RETURN(auto items, pop_mark());
      return make_tuple(std::move(items));
    }
    case kList: case kFrozenSet: case kDict: {
      CKPT_ASSIGN_OR_RETURN(auto items, pop_mark());
      CKPT_ASSIGN_OR_RETURN(PyObj * c, make(op == kDict ? PyType::kDict : PyType::kList));
      CKPT_RETURN_IF_ERROR(op == kDict ? set_items(c, items) : append_items(c, items));
      return push(c);
    }
    case kAppend: {
      CKPT_ASSIGN_OR_RETURN(PyObj * v, pop());
      CKPT_ASSIGN_OR_RETURN(PyObj * l, top());
      return append_items(l, {v});
    }
    case kAppends: case kAddItems: {
      CKPT_ASSIGN_OR_RETURN(auto items, pop_mark());
      CKPT_ASSIGN_OR_RETURN(PyObj * l, top());
      return append_items(l, items);
    }
    case kSetItem: {
      CKPT_ASSIGN_OR_RETURN(PyObj * v, pop());
      CKPT_ASSIGN_OR_RETURN(PyObj * k, pop());
      CKPT_ASSIGN_OR_RETURN(PyObj * d, top());
      return set_items(d, {k, v});
    }
    case kSetItems: {
      CKPT_ASSIGN_OR_RETURN(auto kv, pop_mark());
      CKPT_ASSIGN_OR_RETURN(PyObj * d, top());
      return set_items(d, kv);
    }
    default: *handled = false; return Status::Ok();
  }
}

Status Machine::op_memo(uint8_t op, bool* handled) {
  using namespace pickle_op;
  *handled = true;
  uint64_t index = 0;
  bool put = false;
  switch (op) {
    case kGet: case kPut: {
      CKPT_ASSIGN_OR_RETURN(std::string_view line, take_line());
      std::string_view d = line;
      index = 0;
      if (d.empty() || d.size() > 19) return fail("PickleBadValue", "a memo index is not a number");
      for (char c : d) {
        if (c < '0' || c > '9') return fail("PickleBadValue", "a memo index is not a number");
        index = index * 10 + static_cast<uint64_t>(c - '0');
      }
      put = op == kPut;
      break;
    }
    case kBinGet: case kBinPut: {
      CKPT_ASSIGN_OR_RETURN(index, take_le(1));
      put = op == kBinPut;
      break;
    }
    case kLongBinGet: case kLongBinPut: {
      CKPT_ASSIGN_OR_RETURN(index, take_le(4));
      put = op == kLongBinPut;
      break;
    }
    case kMemoize:
      index = memo_.size();
      put = true;
      break;
    default: *handled = false; return Status::Ok();
  }
  if (put) return memo_put(index);
  CKPT_ASSIGN_OR_RETURN(PyObj * o, memo_get(index));
  return push(o);
}

}  // namespace ckpt::torch::unpickler_detail
