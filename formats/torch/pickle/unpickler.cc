// The restricted unpickler's machine: input cursor, stack, marks, memo and bounds, and the run
// loop. The opcode handlers are in unpickler_ops.cc, the allow-list in unpickler_globals.cc, the
// tensor rebuilds in unpickler_tensor.cc; docs/TORCH.md describes the whole.
#include "formats/torch/pickle/unpickler.h"

#include <algorithm>
#include <cstdio>

#include "formats/torch/pickle/pickle_opcodes.h"
#include "formats/torch/pickle/unpickler_machine.h"

namespace ckpt::torch {

namespace unpickler_detail {

namespace {

const char* pickle_op_name(uint8_t op) {
  using namespace pickle_op;
  switch (op) {
    case kMark: return "MARK"; case kStop: return "STOP"; case kPop: return "POP";
    case kPopMark: return "POP_MARK"; case kDup: return "DUP"; case kFloat: return "FLOAT";
    case kInt: return "INT"; case kBinInt: return "BININT"; case kBinInt1: return "BININT1";
    case kLong: return "LONG"; case kBinInt2: return "BININT2"; case kNone: return "NONE";
    case kPersId: return "PERSID"; case kBinPersId: return "BINPERSID"; case kReduce: return "REDUCE";
    case kString: return "STRING"; case kBinString: return "BINSTRING";
    case kShortBinString: return "SHORT_BINSTRING"; case kUnicode: return "UNICODE";
    case kBinUnicode: return "BINUNICODE"; case kAppend: return "APPEND"; case kBuild: return "BUILD";
    case kGlobal: return "GLOBAL"; case kDict: return "DICT"; case kEmptyDict: return "EMPTY_DICT";
    case kAppends: return "APPENDS"; case kGet: return "GET"; case kBinGet: return "BINGET";
    case kInst: return "INST"; case kLongBinGet: return "LONG_BINGET"; case kList: return "LIST";
    case kEmptyList: return "EMPTY_LIST"; case kObj: return "OBJ"; case kPut: return "PUT";
    case kBinPut: return "BINPUT"; case kLongBinPut: return "LONG_BINPUT"; case kSetItem: return "SETITEM";
    case kTuple: return "TUPLE"; case kEmptyTuple: return "EMPTY_TUPLE"; case kSetItems: return "SETITEMS";
    case kBinFloat: return "BINFLOAT"; case kProto: return "PROTO"; case kNewObj: return "NEWOBJ";
    case kExt1: return "EXT1"; case kExt2: return "EXT2"; case kExt4: return "EXT4";
    case kTuple1: return "TUPLE1"; case kTuple2: return "TUPLE2"; case kTuple3: return "TUPLE3";
    case kNewTrue: return "NEWTRUE"; case kNewFalse: return "NEWFALSE"; case kLong1: return "LONG1";
    case kLong4: return "LONG4"; case kBinBytes: return "BINBYTES"; case kShortBinBytes: return "SHORT_BINBYTES";
    case kShortBinUnicode: return "SHORT_BINUNICODE"; case kBinUnicode8: return "BINUNICODE8";
    case kBinBytes8: return "BINBYTES8"; case kEmptySet: return "EMPTY_SET"; case kAddItems: return "ADDITEMS";
    case kFrozenSet: return "FROZENSET"; case kNewObjEx: return "NEWOBJ_EX"; case kStackGlobal: return "STACK_GLOBAL";
    case kMemoize: return "MEMOIZE"; case kFrame: return "FRAME"; case kByteArray8: return "BYTEARRAY8";
    case kNextBuffer: return "NEXT_BUFFER"; case kReadonlyBuffer: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

}  // namespace

Machine::Machine(std::string_view bytes, const UnpickleLimits& limits) : bytes_(bytes), limits_(limits) {
  out_.arena = std::make_unique<PyArena>();
}

Status Machine::fail(const char* code, const std::string& msg) const {
  const char* name = pickle_op_name(op_);
  std::string where = "pickle: at byte " + std::to_string(op_pos_);
  if (name != nullptr) where += std::string(" (") + name + ")";
  return Status::Error(code, where + ": " + msg);
}

Result<PyObj*> Machine::make(PyType t) {
  if (out_.arena->size() >= limits_.max_objects)
    return fail("PickleTooLarge", "more than " + std::to_string(limits_.max_objects) + " objects");
  return out_.arena->make(t);
}

Status Machine::nest(PyObj* parent, const PyObj* child) {
  uint32_t d = 1;
  if (auto it = depth_.find(child); it != depth_.end()) d = it->second + 1;
  if (d > limits_.max_depth)
    return fail("PickleTooDeep", "objects nest deeper than " + std::to_string(limits_.max_depth) + " levels");
  uint32_t& pd = depth_[parent];
  pd = std::max(pd, d);
  return Status::Ok();
}

const AllowedGlobal* Machine::global_of(const PyObj* o) const {
  auto it = globals_.find(o);
  return it == globals_.end() ? nullptr : &it->second;
}

Result<std::string_view> Machine::take(uint64_t n, const char* what) {
  if (!have(n))
    return fail("PickleTruncated", std::string(what) + " needs " + std::to_string(n) + " bytes, " +
                                       std::to_string(bytes_.size() - pos_) + " left");
  std::string_view s = bytes_.substr(pos_, n);
  pos_ += n;
  return s;
}

Result<uint64_t> Machine::take_le(int nbytes) {
  CKPT_ASSIGN_OR_RETURN(std::string_view s, take(static_cast<uint64_t>(nbytes), "the argument"));
  uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[i]);
  return v;
}

Result<std::string_view> Machine::take_line() {
  std::string_view rest = bytes_.substr(pos_);
  size_t nl = rest.find('\n');
  if (nl == std::string_view::npos) return fail("PickleTruncated", "a text argument has no end of line");
  if (nl > limits_.max_string)
    return fail("PickleTooLarge", "a text argument of " + std::to_string(nl) + " bytes exceeds " + std::to_string(limits_.max_string));
  pos_ += nl + 1;
  return rest.substr(0, nl);
}

Status Machine::push(PyObj* o) {
  if (stack_.size() >= limits_.max_stack)
    return fail("PickleTooLarge", "more than " + std::to_string(limits_.max_stack) + " values on the stack");
  stack_.push_back(o);
  return Status::Ok();
}

Result<PyObj*> Machine::pop() {
  size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) return fail("PickleStackUnderflow", "the stack (above the last MARK) is empty");
  PyObj* o = stack_.back();
  stack_.pop_back();
  return o;
}

Result<PyObj*> Machine::top() {
  size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) return fail("PickleStackUnderflow", "the stack (above the last MARK) is empty");
  return stack_.back();
}

Result<std::vector<PyObj*>> Machine::pop_mark() {
  if (marks_.empty()) return fail("PickleStackUnderflow", "no MARK to pop to");
  size_t m = marks_.back();
  marks_.pop_back();
  std::vector<PyObj*> items(stack_.begin() + static_cast<ptrdiff_t>(m), stack_.end());
  stack_.resize(m);
  return items;
}

Status Machine::memo_put(uint64_t index) {
  if (index >= limits_.max_memo)
    return fail("PickleMemoIndex", "memo index " + std::to_string(index) + " exceeds the bound " + std::to_string(limits_.max_memo));
  CKPT_ASSIGN_OR_RETURN(PyObj * o, top());
  memo_[index] = o;
  return Status::Ok();
}

Result<PyObj*> Machine::memo_get(uint64_t index) {
  auto it = memo_.find(index);
  if (it == memo_.end()) return fail("PickleMemoIndex", "memo index " + std::to_string(index) + " was never stored");
  return it->second;
}

Result<Pickle> Machine::run() {
  while (!stopped_) {
    op_pos_ = pos_;
    op_ = 0;
    if (pos_ >= bytes_.size()) return fail("PickleTruncated", "the pickle ends before STOP");
    op_ = static_cast<uint8_t>(bytes_[pos_++]);
    CKPT_RETURN_IF_ERROR(step(op_));
  }
  return std::move(out_);
}

Status Machine::step(uint8_t op) {
  bool handled = false;
  CKPT_RETURN_IF_ERROR(op_scalar(op, &handled));
  if (!handled) CKPT_RETURN_IF_ERROR(op_string(op, &handled));
  if (!handled) CKPT_RETURN_IF_ERROR(op_container(op, &handled));
  if (!handled) CKPT_RETURN_IF_ERROR(op_memo(op, &handled));
  if (!handled) CKPT_RETURN_IF_ERROR(op_object(op, &handled));
  if (handled) return Status::Ok();
  const char* name = pickle_op_name(op);
  if (name != nullptr)
    return fail("PickleUnsupportedOpcode", std::string("opcode ") + name + " is not accepted (it runs code or is not used by state dicts)");
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", op);
  return fail("PickleBadOpcode", std::string("unknown opcode ") + hex);
}

}  // namespace unpickler_detail

Result<Pickle> unpickle(std::string_view bytes, const UnpickleLimits& limits) {
  unpickler_detail::Machine m(bytes, limits);
  return m.run();
}

}  // namespace ckpt::torch
