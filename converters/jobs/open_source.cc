#include "converters/jobs/open_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "formats/safetensors/st_dir.h"
#include "formats/store/store_reader.h"

namespace ckpt {

namespace fs = std::filesystem;

SourceKind detect_source(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    // A checkpoint dir (manifest.json) or a run dir (`latest` names the newest checkpoint).
    if (fs::exists(fs::path(path) / "manifest.json", ec) || fs::exists(fs::path(path) / "latest", ec)) return SourceKind::kNativeStore;
    if (fs::exists(fs::path(path) / safetensors::kIndexFileName, ec) || fs::exists(fs::path(path) / safetensors::kSingleFileName, ec))
      return SourceKind::kHfDir;
    return SourceKind::kUnknown;
  }
  if (fs::is_regular_file(path, ec)) {
    if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) return SourceKind::kSafetensorsFile;
    return SourceKind::kUnknown;
  }
  return SourceKind::kUnknown;
}

Result<std::unique_ptr<TensorSource>> open_source(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::NotFound("no such file or directory '" + path + "'");
  switch (detect_source(path)) {
    case SourceKind::kSafetensorsFile: {
      CKPT_ASSIGN_OR_RETURN(auto s, safetensors::HfDirSource::open_file(path));
      return std::unique_ptr<TensorSource>(std::move(s));
    }
    case SourceKind::kHfDir: {
      CKPT_ASSIGN_OR_RETURN(auto s, safetensors::HfDirSource::open(path));
      return std::unique_ptr<TensorSource>(std::move(s));
    }
    case SourceKind::kNativeStore:
    {
      CKPT_ASSIGN_OR_RETURN(auto s, store::StoreReader::open(path));
      return std::unique_ptr<TensorSource>(std::move(s));
    }
    case SourceKind::kUnknown: break;
  }
  return Status::Unsupported("'" + path + "' is neither a .safetensors file, a HuggingFace directory (model.safetensors[.index.json]) "
                             "nor a native store (manifest.json)");
}

}  // namespace ckpt
