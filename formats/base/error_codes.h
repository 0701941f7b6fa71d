// The one table from a Status rule code (e.g. "PieceOverlap") to its ErrorKind, hence to the exit
// code the CLI gives. Status::Error(code, msg) takes the kind from here, so one rule exits the same
// way wherever it is found. How a kind is chosen:
//   a file's content breaks its format's rules (manifest, header, index, config, layout file)
//                                                   -> kCorruption (exit 3)
//   the user asks for something impossible (flags, a layout the model cannot take)
//                                                   -> kInvalidArgument (exit 2)
//   stored digests or two checkpoints differ        -> kChecksum / kMismatch (exit 1)
// A code missing from the table is a bug in ckpt: Status::Error makes it kInternal and says so.
// Thread safety: a constant table; the lookups are reentrant.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "formats/base/status.h"

namespace ckpt {

// The kind of `code`, or nullopt when the table does not list it.
std::optional<ErrorKind> kind_of_code(std::string_view code);

// Every code of the table, in table order (for tests and docs).
struct ErrorCodeEntry {
  const char* code;
  ErrorKind kind;
};
const ErrorCodeEntry* error_code_table(size_t* n);

}  // namespace ckpt
