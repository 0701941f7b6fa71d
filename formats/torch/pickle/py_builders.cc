// The PyArena builders (formats/torch/pickle/py_object.h) that writers use to assemble a tree for the
// pickler. Each call makes one new object; sharing an object between places is done by passing
// the same pointer twice (the pickler then writes it once and refers to it by memo).
#include "formats/torch/pickle/py_object.h"

namespace ckpt::torch {

const PyObj* PyArena::none() { return make(PyType::kNone); }

const PyObj* PyArena::boolean(bool v) {
  PyObj* o = make(PyType::kBool);
  o->b = v;
  return o;
}

const PyObj* PyArena::integer(int64_t v) {
  PyObj* o = make(PyType::kInt);
  o->i = v;
  return o;
}

const PyObj* PyArena::real(double v) {
  PyObj* o = make(PyType::kFloat);
  o->f = v;
  return o;
}

const PyObj* PyArena::str(std::string v) {
  PyObj* o = make(PyType::kStr);
  o->s = std::move(v);
  return o;
}

const PyObj* PyArena::bytes(std::string v) {
  PyObj* o = make(PyType::kBytes);
  o->s = std::move(v);
  return o;
}

const PyObj* PyArena::list(std::vector<const PyObj*> items) {
  PyObj* o = make(PyType::kList);
  o->items = std::move(items);
  return o;
}

const PyObj* PyArena::tuple(std::vector<const PyObj*> items) {
  PyObj* o = make(PyType::kTuple);
  o->items = std::move(items);
  return o;
}

const PyObj* PyArena::dict(std::vector<std::pair<const PyObj*, const PyObj*>> entries) {
  PyObj* o = make(PyType::kDict);
  o->entries = std::move(entries);
  return o;
}

const PyObj* PyArena::ordered_dict(std::vector<std::pair<const PyObj*, const PyObj*>> entries) {
  PyObj* o = make(PyType::kDict);
  o->entries = std::move(entries);
  o->cls = "collections.OrderedDict";
  return o;
}

const PyObj* PyArena::tensor(TensorRef t) {
  PyObj* o = make(PyType::kTensor);
  o->tensor = std::move(t);
  return o;
}

const PyObj* PyArena::record(std::string cls, const PyObj* args, const PyObj* state, bool newobj) {
  PyObj* o = make(PyType::kRecord);
  o->cls = std::move(cls);
  o->args = args;
  o->state = state;
  o->newobj = newobj;
  return o;
}

}  // namespace ckpt::torch
