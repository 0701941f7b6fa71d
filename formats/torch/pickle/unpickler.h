// The restricted unpickler: reads pickle protocols 2-5 into inert PyObjs (formats/torch/pickle/py_object.h),
// never importing or calling anything. Globals are looked up in an allow-list (docs/TORCH.md says
// why each entry is safe); any other global is refused with its module and name (ForbiddenGlobal).
// REDUCE / NEWOBJ / NEWOBJ_EX / BUILD apply only to allow-listed classes and only build records;
// INST / OBJ and BUILD on anything else are refused. Persistent ids are accepted only in torch's
// ('storage', <storage class>, key, location, numel) form. Every rule has a named error code
// (formats/base/error_codes.cc) and a test (tests/formats/torch/unpickler_test.cc).
// Pure function; thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "formats/base/status.h"
#include "formats/torch/pickle/py_object.h"

namespace ckpt::torch {

struct UnpickleLimits {
  uint64_t max_depth = 256;             // nesting of containers being built (stack of marks)
  uint64_t max_memo = 1u << 22;         // memo entries (and the largest memo index accepted)
  uint64_t max_objects = 1u << 22;      // PyObjs created (each a few hundred bytes: ~1.5 GB at most)
  uint64_t max_string = 1ull << 30;     // bytes of one str/bytes
  uint64_t max_items = 1u << 24;        // elements of one list/tuple/dict
  uint64_t max_stack = 1u << 20;        // values on the stack
  // SHORT_BINBYTES / BINBYTES / BINBYTES8 payloads longer than this are kept by reference (PyObj::by_ref: their
  // offset and size in the input, not copied and not bound by max_string; the input is bounded):
  // for pickles of numpy arrays (PaddleNLP's .pdparams) whose data stays in the file.
  uint64_t bytes_by_reference_over = UINT64_MAX;
};

struct Pickle {
  std::unique_ptr<PyArena> arena;  // owns every object
  const PyObj* root = nullptr;
};

// Parses a whole pickle (the bytes of data.pkl or a DCP .metadata file). Errors are kCorruption
// with a rule code (e.g. ForbiddenGlobal, PickleTruncated, PickleBadOpcode, PickleMemoIndex,
// PickleTooDeep, PickleTooLarge, PickleBadPersistentId, PickleBadReduce) and the byte offset.
Result<Pickle> unpickle(std::string_view bytes, const UnpickleLimits& limits = {});

}  // namespace ckpt::torch
