#include "converters/verify_job.h"

#include <chrono>

#include "converters/open_checkpoint.h"
#include "formats/digest.h"
#include "formats/open_source.h"
#include "formats/store/manifest.h"
#include "formats/store/source_scan.h"

namespace ckpt {

const char* const kVerifyNoChecksumNote =
    "safetensors has no checksums: structure validated and every byte read, content integrity not checkable";

nlohmann::json VerifyOutcome::to_json() const {
  nlohmann::json fails = nlohmann::json::array();
  for (const auto& f : failures) {
    nlohmann::json fj = {{"code", f.status.code()}, {"piece", f.piece},      {"tensor", f.tensor},
                         {"file", f.file},          {"message", f.status.to_string()}};
    if (checksums) fj["dataset"] = f.dataset;
    fails.push_back(std::move(fj));
  }
  nlohmann::json j = {{"path", path},   {"format", format}, {"ok", ok()},         {"structure_ok", true},
                      {"checksums", checksums}, {"pieces", pieces}, {"bytes", bytes}, {"seconds", seconds},
                      {"failures", fails}};
  if (checksums)
    j["digests"] = digests;
  else
    j["note"] = kVerifyNoChecksumNote;
  return j;
}

Result<VerifyOutcome> verify_checkpoint(const std::string& path, int threads,
                                        const std::function<void(uint64_t, uint64_t)>& progress) {
  if (threads < 1 || threads > 64)
    return Status::InvalidArgument("threads " + std::to_string(threads) + ": expected 1..64");
  const SourceKind kind = detect_source(path);
  CKPT_ASSIGN_OR_RETURN(auto src, open_checkpoint(path));
  auto* store_reader = dynamic_cast<store::StoreReader*>(src.get());
  const auto t0 = std::chrono::steady_clock::now();
  store::VerifyReport rep = store_reader ? store_reader->verify(progress, threads) : store::scan_source(*src, progress);
  VerifyOutcome out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.checksums = store_reader != nullptr;
  if (store_reader) {
    out.format = std::string(store::kFormatName) + " v" + std::to_string(store_reader->manifest().version);
    out.path = store_reader->dir();
    for (const auto& p : store_reader->manifest().pieces) out.digests.insert(digest_algo_name(p.digest.algo));
  } else {
    const CheckpointKind* ck = detect_checkpoint(path);
    out.format = kind == SourceKind::kHfDir             ? "huggingface safetensors directory"
                 : kind == SourceKind::kSafetensorsFile ? "safetensors"
                 : ck                                   ? ck->name
                                                        : "unknown";
    out.path = src->describe();
  }
  out.pieces = rep.pieces;
  out.bytes = rep.bytes;
  for (const auto& f : rep.failures) {
    const bool known = f.piece < src->pieces().size();
    VerifyFailureInfo info{f.status, f.piece, known ? src->pieces()[f.piece].tensor : f.status.tensor(), f.status.file(), ""};
    if (store_reader && f.piece < store_reader->manifest().pieces.size()) {
      const auto& p = store_reader->manifest().pieces[f.piece];
      info.file = p.file;
      info.dataset = p.dataset;
    }
    out.failures.push_back(std::move(info));
  }
  return out;
}

}  // namespace ckpt
