#include "formats/store/run_dir.h"

#include <cstdio>

#include "formats/base/fs_util.h"
#include "formats/store/manifest.h"

namespace ckpt::store {

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shards/r%05d.h5", rank);
  return buf;
}

bool is_partial_name(const std::string& name) {
  std::string n = name;
  while (n.size() > 1 && n.back() == '/') n.pop_back();
  return n.size() >= 8 && n.compare(n.size() - 8, 8, ".partial") == 0;
}

Status write_latest(const std::string& run_dir, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." || is_partial_name(name))
    return Status::InvalidArgument("'" + name + "' is not a checkpoint directory name");
  if (!path_exists(run_dir + "/" + name + "/" + kManifestFile))
    return Status::InvalidArgument("'" + run_dir + "/" + name + "' is not a complete checkpoint (no manifest)");
  return write_file_atomic(run_dir + "/" + kLatestFile, name + "\n");
}

Result<std::string> resolve_checkpoint(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (is_partial_name(path))
    return Status::Error("NotCheckpoint", "'" + path + "' is an unfinished (.partial) checkpoint").with_file(path);
  if (path_exists(path + "/" + kManifestFile)) return path;
  if (path_exists(path + "/" + kLatestFile)) {
    std::string name;
    CKPT_RETURN_IF_ERROR(read_small_file(path + "/" + kLatestFile, 4096, &name));
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." || is_partial_name(name) ||
        name.find('\0') != std::string::npos)
      return Status::Error("BadLatest", "'latest' names '" + name + "', which is not a checkpoint directory name").with_file(path + "/latest");
    const std::string dir = path + "/" + name;
    if (!path_exists(dir + "/" + kManifestFile))
      return Status::NotFound("'latest' names '" + name + "', which has no manifest.json").with_file(dir);
    return dir;
  }
  if (!path_exists(path)) return Status::NotFound("'" + path + "' does not exist").with_file(path);
  return Status::Error("NotCheckpoint", "'" + path + "' has neither manifest.json nor a 'latest' file").with_file(path);
}

}  // namespace ckpt::store
