// The restricted unpickler's object opcodes: GLOBAL / STACK_GLOBAL (allow-list lookup), REDUCE,
// NEWOBJ, NEWOBJ_EX, BUILD (records only) and BINPERSID (torch storages). INST, OBJ, EXT1/2/4,
// PERSID and the out-of-band buffers of protocol 5 are refused.
#include "formats/torch/pickle/pickle_opcodes.h"
#include "formats/torch/pickle/unpickler_machine.h"

namespace ckpt::torch::unpickler_detail {

namespace {

std::string pickle_clip_name(std::string_view s) {
  return s.size() > 200 ? std::string(s.substr(0, 200)) + "..." : std::string(s);
}

// A record built from a kPlainClass (its BUILD state must be plain fields).
bool is_plain_class_record(const PyObj* o) {
  const size_t dot = o->cls.rfind('.');
  if (dot == std::string::npos) return false;
  std::optional<AllowedGlobal> g = find_allowed_global(std::string_view(o->cls).substr(0, dot), std::string_view(o->cls).substr(dot + 1));
  return g && g->kind == GlobalKind::kPlainClass;
}

}  // namespace

Status Machine::push_global(std::string_view module, std::string_view name) {
  std::optional<AllowedGlobal> g = find_allowed_global(module, name);
  if (!g)
    return fail("ForbiddenGlobal", "global '" + pickle_clip_name(module) + "." + pickle_clip_name(name) +
                                       "' is not on the allow-list (docs/TORCH.md); ckpt never imports or calls pickle globals");
  CKPT_ASSIGN_OR_RETURN(PyObj * o, make(PyType::kRecord));
  o->cls = g->canonical;
  globals_[o] = *g;
  return push(o);
}

Status Machine::persistent_load(const PyObj* pid) {
  auto bad = [&](const std::string& why) {
    return fail("PickleBadPersistentId", "persistent id " + why + " (expected ('storage', torch.<X>Storage, key, location, numel))");
  };
  if (!pid->is(PyType::kTuple) || pid->items.size() != 5) return bad("is not a 5-tuple");
  const auto& it = pid->items;
  if (!it[0]->is(PyType::kStr) || it[0]->s != "storage") return bad("does not start with 'storage'");
  const AllowedGlobal* g = global_of(it[1]);
  if (g == nullptr || g->kind != GlobalKind::kStorageClass) return bad("does not name a storage class");
  if (!it[2]->is(PyType::kStr) || it[2]->s.empty() || it[2]->s.size() > 256 ||
      it[2]->s.find('/') != std::string::npos || it[2]->s == "." || it[2]->s == "..")
    return bad("has a key that is not a plain name");
  if (!it[3]->is(PyType::kStr)) return bad("has a location that is not a str");
  if (!it[4]->is(PyType::kInt) || it[4]->i < 0) return bad("has a numel that is not a non-negative int");
  CKPT_ASSIGN_OR_RETURN(PyObj * s, make(PyType::kStorage));
  if (!dtype_from_storage_class(g->canonical, &s->storage.dtype)) return bad("names an unknown storage class");
  s->storage.key = it[2]->s;
  s->storage.location = it[3]->s;
  s->storage.numel = it[4]->i;
  return push(s);
}

Status Machine::op_object(uint8_t op, bool* handled) {
  using namespace pickle_op;
  *handled = true;
  switch (op) {
    case kGlobal: case kInst: {
      CKPT_ASSIGN_OR_RETURN(std::string_view module, take_line());
      CKPT_ASSIGN_OR_RETURN(std::string_view name, take_line());
      if (op == kInst) {  // names its class inline and calls it: never accepted
        if (!find_allowed_global(module, name)) return push_global(module, name);
        return fail("PickleUnsupportedOpcode", "INST of '" + pickle_clip_name(module) + "." + pickle_clip_name(name) + "' is not accepted");
      }
      return push_global(module, name);
    }
    case kStackGlobal: {
      CKPT_ASSIGN_OR_RETURN(PyObj * name, pop());
      CKPT_ASSIGN_OR_RETURN(PyObj * module, pop());
      if (!module->is(PyType::kStr) || !name->is(PyType::kStr))
        return fail("PickleBadValue", "STACK_GLOBAL needs two str (module, name)");
      return push_global(module->s, name->s);
    }
    case kReduce: case kNewObj: case kNewObjEx: {
      PyObj* kwargs = nullptr;
      if (op == kNewObjEx) {
        CKPT_ASSIGN_OR_RETURN(kwargs, pop());
      }
      CKPT_ASSIGN_OR_RETURN(PyObj * args, pop());
      CKPT_ASSIGN_OR_RETURN(PyObj * callee, pop());
      const AllowedGlobal* g = global_of(callee);
      if (g == nullptr)
        return fail("PickleBadReduce", std::string("calls a ") + py_type_name(callee->type) + " that is not an allow-listed global");
      if (!args->is(PyType::kTuple)) return fail("PickleBadReduce", "the arguments of '" + g->canonical + "' are not a tuple");
      if (kwargs != nullptr && (!kwargs->is(PyType::kDict) || !kwargs->entries.empty()))
        return fail("PickleBadReduce", "keyword arguments to '" + g->canonical + "' are not accepted");
      if (op != kReduce && g->kind != GlobalKind::kRecordClass && g->kind != GlobalKind::kPlainClass &&
          g->kind != GlobalKind::kOrderedDict)
        return fail("PickleBadReduce", "'" + g->canonical + "' is not a class that NEWOBJ may instantiate");
      CKPT_ASSIGN_OR_RETURN(PyObj * r, reduce(*g, args));
      return push(r);
    }
    case kBuild: {
      CKPT_ASSIGN_OR_RETURN(PyObj * state, pop());
      CKPT_ASSIGN_OR_RETURN(PyObj * obj, top());
      // An OrderedDict's attributes: every nn.Module.state_dict() carries `_metadata` (module
      // versions), pickled as BUILD({'_metadata': ...}) on the OrderedDict. Kept inert as its state.
      // A second BUILD with a dict state is Python's inst.__dict__.update(state): the attributes
      // merge, the last value of a repeated one wins (set_items' rule).
      if (obj->state != nullptr && obj->state->is(PyType::kDict) && state->is(PyType::kDict)) {
        CKPT_ASSIGN_OR_RETURN(PyObj * merged, make(PyType::kDict));
        std::vector<PyObj*> kv;
        for (const auto* d : {obj->state, static_cast<const PyObj*>(state)})
          for (const auto& [k, v] : d->entries) {
            kv.push_back(const_cast<PyObj*>(k));
            kv.push_back(const_cast<PyObj*>(v));
          }
        CKPT_RETURN_IF_ERROR(set_items(merged, kv));
        state = merged;
      }
      if (obj->is(PyType::kDict) && state->is(PyType::kDict)) {
        CKPT_RETURN_IF_ERROR(nest(obj, state));
        obj->state = state;
        return Status::Ok();
      }
      if (!obj->is(PyType::kRecord) || global_of(obj) != nullptr)
        return fail("PickleBadReduce", "BUILD on a " +
                                           std::string(obj->is(PyType::kRecord) ? "bare global '" + obj->cls + "'" : py_type_name(obj->type)) +
                                           "; only records of allow-listed classes take a state");
      if (is_plain_class_record(obj) && !pickle_is_plain_state(state))
        return fail("PickleBadReduce", "BUILD on '" + obj->cls +
                                           "' takes only a dict of plain fields (str -> None, bool, int, float, str)");
      CKPT_RETURN_IF_ERROR(nest(obj, state));
      obj->state = state;
      return Status::Ok();
    }
    case kBinPersId: {
      CKPT_ASSIGN_OR_RETURN(PyObj * pid, pop());
      return persistent_load(pid);
    }
    default: *handled = false; return Status::Ok();
  }
}

}  // namespace ckpt::torch::unpickler_detail
