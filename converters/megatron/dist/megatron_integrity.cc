#include "converters/megatron/dist/megatron_integrity.h"

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "formats/base/file_io.h"
#include "formats/base/fs_util.h"
#include "formats/base/json_read.h"
#include "formats/digest/sha256.h"

namespace ckpt {

namespace megatron_integrity_detail {  // named: the library is a unity build

namespace fs = std::filesystem;

constexpr uint64_t kHashBlock = uint64_t{4} << 20;
// A manifest of one entry per file: a few hundred bytes per data file of the checkpoint.
constexpr JsonLimits kIntegrityJsonLimits{uint64_t{64} << 20, 4, uint64_t{1} << 22};

Status bad_integrity(const std::string& file, const std::string& msg) {
  return Status::Error("BadMegatronIntegrity", "'" + file + "': " + msg).with_file(file);
}

bool plain_file_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

// SHA-256 of the whole file `path` (hex), hashing in blocks.
Result<std::string> hash_file(const std::string& path, const std::function<void(uint64_t)>& on_bytes) {
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, O_RDONLY, "checkpoint file"));
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return Status::Io("'" + path + "': " + ec.message()).with_file(path);
  Sha256 h;
  std::string buf(static_cast<size_t>(std::min(size, kHashBlock)), '\0');
  for (uint64_t off = 0; off < size;) {
    const uint64_t n = std::min(kHashBlock, size - off);
    CKPT_RETURN_IF_ERROR(pread_full(fd.get(), buf.data(), n, off, path));
    h.update(buf.data(), n);
    off += n;
    if (on_bytes) on_bytes(n);
  }
  return h.hex_digest();
}

}  // namespace megatron_integrity_detail

using namespace megatron_integrity_detail;

bool has_megatron_integrity(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kMegatronIntegrityFile, ec);
}

Result<MegatronIntegrity> read_megatron_integrity(const std::string& dir) {
  const std::string file = (fs::path(dir) / kMegatronIntegrityFile).string();
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(file, kIntegrityJsonLimits, "Megatron integrity manifest"));
  if (!j.is_object() || !j.contains("algorithm") || !j.contains("files")) return bad_integrity(file, "not {\"algorithm\", \"files\"}");
  if (!j["algorithm"].is_string()) return bad_integrity(file, "'algorithm' is not a string");
  if (j["algorithm"] != "sha256")
    return Status::Unsupported("'" + file + "': algorithm " + j["algorithm"].dump() + " (ckpt checks sha256, as megatron-core writes)")
        .with_file(file);
  if (!j["files"].is_object()) return bad_integrity(file, "'files' is not an object");
  MegatronIntegrity out;
  for (auto it = j["files"].begin(); it != j["files"].end(); ++it) {
    if (!plain_file_name(it.key())) return bad_integrity(file, "entry '" + it.key() + "' is not a file name of the directory");
    if (it.key() == kMegatronIntegrityFile) return bad_integrity(file, "lists itself");
    if (!it.value().is_string() || !is_sha256_hex(it.value().get<std::string>()))
      return bad_integrity(file, "entry '" + it.key() + "': the digest is not 64 lower-case hex digits");
    out.files.emplace_back(it.key(), it.value().get<std::string>());
  }
  return out;
}

uint64_t megatron_integrity_bytes(const std::string& dir) {
  auto m = read_megatron_integrity(dir);
  if (!m.ok()) return 0;
  uint64_t total = 0;
  for (const auto& [name, digest] : m->files) {
    std::error_code ec;
    const uint64_t n = fs::file_size(fs::path(dir) / name, ec);
    if (!ec) total += n;
  }
  return total;
}

void check_megatron_integrity(const std::string& dir, const CheckOptions& o, uint64_t* unit,
                              const std::function<void(uint64_t)>& on_bytes, CheckReport& rep) {
  const std::string manifest = (fs::path(dir) / kMegatronIntegrityFile).string();
  auto m = read_megatron_integrity(dir);
  if (!m.ok()) {  // one failure, reported by the first share of a distributed check
    if (o.share == 0)
      rep.failures.push_back({CheckFailure::kNoPiece, m.take_status().with_file(manifest), "", manifest, kMegatronIntegrityFile});
    return;
  }
  for (const auto& [name, want] : m->files) {
    const uint64_t u = (*unit)++;
    if (o.shares > 1 && u % static_cast<uint64_t>(o.shares) != static_cast<uint64_t>(o.share)) continue;
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      rep.failures.push_back({CheckFailure::kNoPiece,
                              Status::Error("MegatronIntegrityMissingFile",
                                            "'" + path + "' is listed in " + manifest + " but missing").with_file(path),
                              "", path, name});
      continue;
    }
    ++rep.pieces;
    auto got = hash_file(path, [&](uint64_t n) {
      rep.bytes += n;
      if (on_bytes) on_bytes(n);
    });
    if (!got.ok()) {
      rep.failures.push_back({CheckFailure::kNoPiece, got.take_status().with_context("Megatron integrity check"), "", path, name});
    } else if (*got != want) {
      rep.failures.push_back({CheckFailure::kNoPiece,
                              Status::Error("MegatronIntegrityMismatch", "'" + path + "': SHA-256 " + *got + ", " +
                                                                             kMegatronIntegrityFile + " records " + want)
                                  .with_file(path),
                              "", path, name});
    }
  }
}

}  // namespace ckpt
