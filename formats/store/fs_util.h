// Small POSIX file-system helpers for the store's commit protocol (fsync of files and
// directories, recursive removal, atomic small-file replace). Errors are ckpt::Status.
// Thread safety: stateless functions.
#pragma once

#include <string>

#include "formats/status.h"

namespace ckpt::store {

Status fsync_path(const std::string& path);          // file or directory
Status make_dir(const std::string& path);             // mkdir, fails if it exists
Status remove_tree(const std::string& path);          // rm -rf; OK if missing
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string parent_dir(const std::string& path);      // "." for a bare name
// Writes `content` to `path` via `<path>.tmp.<pid>`, fsync, rename, fsync of the directory.
Status write_file_atomic(const std::string& path, const std::string& content);
// Reads a small file (at most `max_bytes`).
Status read_small_file(const std::string& path, size_t max_bytes, std::string* out);

}  // namespace ckpt::store
