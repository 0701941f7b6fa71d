#include "formats/store/manifest.h"

#include <algorithm>
#include <cerrno>
#include <set>
#include <unordered_map>

#include "formats/base/checked.h"
#include "formats/base/json_read.h"
#include "formats/digest/digest.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/tiling.h"

namespace ckpt::store {

using nlohmann::json;

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::kNone: return "none";
    case Codec::kZstd: return "zstd";
    case Codec::kShuffleZstd: return "shuffle+zstd";
  }
  return "none";
}

Result<Codec> codec_from_name(const std::string& s) {
  if (s == "none") return Codec::kNone;
  if (s == "zstd") return Codec::kZstd;
  if (s == "shuffle+zstd") return Codec::kShuffleZstd;
  return Status::Error("BadField", "unknown codec '" + s + "' (expected none, zstd, shuffle+zstd)");
}

bool is_reserved_key(const std::string& key) {
  return key == "format" || key == "version" || key == "tensors" || key == "pieces" || key == kManifestDigestKey;
}

namespace {

Status bad(const std::string& what) { return Status::Error("BadField", what); }

json shape_json(const Shape& s) { return json(s); }

Result<Shape> shape_from(const json& j, const std::string& what) {
  if (!j.is_array()) return bad(what + " must be an array of integers");
  if (j.size() > kMaxRank) return bad(what + " has " + std::to_string(j.size()) + " dimensions (max " + std::to_string(kMaxRank) + ")");
  Shape s;
  s.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_integer()) return bad(what + " must be an array of integers");
    int64_t x = v.get<int64_t>();
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return bad(what + " value too large");
    if (x < 0) return bad(what + " has a negative value");
    s.push_back(x);
  }
  return s;
}

Result<std::string> str_field(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return bad(where + ": field '" + key + "' missing or not a string");
  return it->get<std::string>();
}

Result<int64_t> int_field(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) return bad(where + ": field '" + key + "' missing or not an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return bad(where + ": field '" + key + "' too large");
  return it->get<int64_t>();
}

}  // namespace

json piece_record_to_json(const PieceRecord& r) {
  json region = {{"offset", shape_json(r.piece.region.box.offset)}, {"extent", shape_json(r.piece.region.box.extent)}};
  if (r.piece.region.is_flat()) region["flat"] = {r.piece.region.flat_begin, r.piece.region.flat_end};
  json j = {{"tensor", r.piece.tensor},
            {"file", r.file},
            {"dataset", r.dataset},
            {"region", region},
            {"dtype", std::string(dtype_name(r.piece.dtype))},
            {"bytes", r.bytes},
            {"digest", r.digest.to_string()},
            {"codec", codec_name(r.codec)}};
  if (r.codec != Codec::kNone) j["codec_level"] = r.codec_level;
  return j;
}

namespace {
// The piece's digest: version 2 "digest": "<algorithm>:<hex>", version 1 "sha256": "<hex>".
Result<DigestValue> digest_field(const json& j, int version, const std::string& where) {
  if (version >= 2) {
    if (j.contains("sha256")) return bad(where + ": field 'sha256' belongs to version 1; version " + std::to_string(version) + " records 'digest'");
    CKPT_ASSIGN_OR_RETURN(std::string text, str_field(j, "digest", where));
    return parse_digest(text, where);
  }
  if (j.contains("digest")) return bad(where + ": field 'digest' is not allowed in a version 1 manifest (it records 'sha256')");
  CKPT_ASSIGN_OR_RETURN(std::string hex, str_field(j, "sha256", where));
  if (!is_digest_hex(DigestAlgo::kSha256, hex)) return bad(where + ": sha256 must be 64 lower-case hex digits");
  return DigestValue{DigestAlgo::kSha256, hex};
}
// F8_E8M0 and F4 came with version 4 (manifest.h).
bool dtype_in_version(DType t, int version) {
  return version >= kFirstLowPrecisionVersion || (t != DType::kF8E8M0 && t != DType::kF4);
}
std::string version_note(const Result<DType>& d, int version) {
  if (!d.ok()) return "";
  return " in a version " + std::to_string(version) + " manifest (it came with version " + std::to_string(kFirstLowPrecisionVersion) + ")";
}
}  // namespace

Result<PieceRecord> piece_record_from_json(const json& j, int version) {
  if (!j.is_object()) return bad("piece entry is not an object");
  PieceRecord r;
  CKPT_ASSIGN_OR_RETURN(r.piece.tensor, str_field(j, "tensor", "piece"));
  const std::string where = "piece of tensor '" + r.piece.tensor + "'";
  CKPT_ASSIGN_OR_RETURN(r.file, str_field(j, "file", where));
  CKPT_ASSIGN_OR_RETURN(r.dataset, str_field(j, "dataset", where));
  CKPT_ASSIGN_OR_RETURN(std::string dt, str_field(j, "dtype", where));
  auto d = dtype_from_name(dt);
  if (!d.ok() || !dtype_in_version(*d, version))
    return Status::Error("UnknownDType", where + ": unknown dtype '" + dt + "'" + version_note(d, version)).with_tensor(r.piece.tensor);
  r.piece.dtype = *d;
  auto rit = j.find("region");
  if (rit == j.end() || !rit->is_object()) return bad(where + ": field 'region' missing or not an object");
  auto oit = rit->find("offset"), eit = rit->find("extent");
  if (oit == rit->end() || eit == rit->end()) return bad(where + ": region needs 'offset' and 'extent'");
  CKPT_ASSIGN_OR_RETURN(r.piece.region.box.offset, shape_from(*oit, where + " region.offset"));
  CKPT_ASSIGN_OR_RETURN(r.piece.region.box.extent, shape_from(*eit, where + " region.extent"));
  if (auto fit = rit->find("flat"); fit != rit->end()) {
    if (!fit->is_array() || fit->size() != 2 || !(*fit)[0].is_number_integer() || !(*fit)[1].is_number_integer())
      return bad(where + ": region.flat must be [begin, end]");
    CKPT_ASSIGN_OR_RETURN(Shape fl, shape_from(*fit, where + " region.flat"));
    r.piece.region.flat_begin = fl[0];
    r.piece.region.flat_end = fl[1];
  }
  auto bit = j.find("bytes");
  if (bit == j.end() || !bit->is_number_unsigned()) return bad(where + ": field 'bytes' missing or not a non-negative integer");
  r.bytes = bit->get<uint64_t>();
  auto dg = digest_field(j, version, where);
  if (!dg.ok()) return dg.take_status().with_tensor(r.piece.tensor);
  r.digest = std::move(dg).value();
  CKPT_ASSIGN_OR_RETURN(std::string cn, str_field(j, "codec", where));
  CKPT_ASSIGN_OR_RETURN(r.codec, codec_from_name(cn));
  if (r.codec != Codec::kNone) {
    CKPT_ASSIGN_OR_RETURN(int64_t lvl, int_field(j, "codec_level", where));
    if (lvl < -131072 || lvl > 22) return bad(where + ": codec_level out of range");
    r.codec_level = static_cast<int>(lvl);
  }
  return r;
}

std::string canonical_manifest_text(const json& j) {
  if (!j.is_object() || !j.contains(kManifestDigestKey)) return j.dump();
  json rest = j;
  rest.erase(kManifestDigestKey);
  return rest.dump();
}

json manifest_to_json(const Manifest& m) {
  json j = json::object();
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;  // pieces are written in this version's form whatever was read
  if (m.metadata.is_object())
    for (auto it = m.metadata.begin(); it != m.metadata.end(); ++it)
      if (!is_reserved_key(it.key())) j[it.key()] = it.value();
  json ts = json::array();
  for (const auto& t : m.tensors)
    ts.push_back({{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", shape_json(t.shape)}});
  j["tensors"] = std::move(ts);
  json ps = json::array();
  for (const auto& p : m.pieces) ps.push_back(piece_record_to_json(p));
  j["pieces"] = std::move(ps);
  const std::string text = j.dump();  // canonical_manifest_text(j): j has no manifest_digest yet
  j[kManifestDigestKey] = digest_of(m.manifest_digest.algo, text.data(), text.size()).to_string();
  return j;
}

namespace {
// Version 3: "manifest_digest" present, well-formed, and the digest of the rest of `j` (the key is
// taken out of `j`: no copy of a large manifest).
Result<DigestValue> check_manifest_digest(json& j, int version) {
  auto it = j.find(kManifestDigestKey);
  if (version < kFirstChecksummedVersion) {
    if (it != j.end())
      return bad(std::string("manifest field '") + kManifestDigestKey + "' belongs to version " + std::to_string(kFirstChecksummedVersion) +
                 " and later; this manifest is version " + std::to_string(version));
    return DigestValue{kDefaultDigest, ""};
  }
  if (it == j.end())
    return Status::Error("ManifestChecksumMissing", "manifest version " + std::to_string(version) + " has no '" + kManifestDigestKey +
                                                        "' (every version " + std::to_string(kFirstChecksummedVersion) +
                                                        "+ writer seals its manifest; the field was removed)");
  if (!it->is_string()) return bad(std::string("manifest field '") + kManifestDigestKey + "' is not a string");
  CKPT_ASSIGN_OR_RETURN(DigestValue want, parse_digest(it->get<std::string>(), std::string("manifest field '") + kManifestDigestKey + "'"));
  j.erase(it);
  const std::string text = j.dump();  // canonical_manifest_text
  const DigestValue got = digest_of(want.algo, text.data(), text.size());
  if (got.hex != want.hex)
    return Status::Error("ManifestChecksumMismatch", std::string("manifest does not match its '") + kManifestDigestKey + "': " +
                                                         digest_algo_name(want.algo) + " of its canonical text expected " + want.hex +
                                                         ", got " + got.hex + " (a field was changed after it was written: dtype, shape, "
                                                         "region, codec, file, dataset or metadata)");
  return want;
}

Result<Manifest> manifest_from_json(json& j) {
  if (!j.is_object()) return Status::Error("InvalidJson", "manifest is not a JSON object");
  auto fit = j.find("format");
  if (fit == j.end() || !fit->is_string() || fit->get<std::string>() != kFormatName)
    return Status::Error("UnknownFormat", std::string("manifest field 'format' must be \"") + kFormatName + "\"");
  auto vit = j.find("version");
  if (vit == j.end() || !vit->is_number_integer()) return bad("manifest field 'version' missing or not an integer");
  const int64_t version = vit->get<int64_t>();  // an unsigned above INT64_MAX reads negative: refused too
  if (version < kOldestReadableVersion || version > kFormatVersion)
    return Status::Error("UnsupportedVersion", "manifest version " + vit->dump() + " is not supported (this ckpt reads versions " +
                                                   std::to_string(kOldestReadableVersion) + " to " + std::to_string(kFormatVersion) + ")");
  Manifest m;
  m.version = static_cast<int>(version);
  CKPT_ASSIGN_OR_RETURN(m.manifest_digest, check_manifest_digest(j, m.version));
  auto tit = j.find("tensors");
  auto pit = j.find("pieces");
  if (tit == j.end() || !tit->is_array()) return bad("manifest field 'tensors' missing or not an array");
  if (pit == j.end() || !pit->is_array()) return bad("manifest field 'pieces' missing or not an array");
  m.tensors.reserve(tit->size());
  for (const auto& t : *tit) {
    if (!t.is_object()) return bad("tensor entry is not an object");
    TensorMeta meta;
    CKPT_ASSIGN_OR_RETURN(meta.name, str_field(t, "name", "tensor"));
    CKPT_ASSIGN_OR_RETURN(std::string dt, str_field(t, "dtype", "tensor '" + meta.name + "'"));
    auto d = dtype_from_name(dt);
    if (!d.ok() || !dtype_in_version(*d, m.version))
      return Status::Error("UnknownDType", "tensor '" + meta.name + "': unknown dtype '" + dt + "'" + version_note(d, m.version))
          .with_tensor(meta.name);
    meta.dtype = *d;
    auto sit = t.find("shape");
    if (sit == t.end()) return bad("tensor '" + meta.name + "': field 'shape' missing");
    CKPT_ASSIGN_OR_RETURN(meta.shape, shape_from(*sit, "tensor '" + meta.name + "' shape"));
    m.tensors.push_back(std::move(meta));
  }
  m.pieces.reserve(pit->size());
  for (const auto& p : *pit) {
    CKPT_ASSIGN_OR_RETURN(PieceRecord r, piece_record_from_json(p, m.version));
    m.pieces.push_back(std::move(r));
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!is_reserved_key(it.key())) m.metadata[it.key()] = it.value();
  return m;
}
}  // namespace

Result<std::string> manifest_text(const Manifest& m) {
  std::string text = manifest_to_json(m).dump(1);
  if (auto back = parse_manifest(text); !back.ok())
    return Status::Internal("the manifest about to be committed does not read back: " + back.status().to_string());
  return text;
}

Result<Manifest> parse_manifest(const std::string& text) {
  CKPT_ASSIGN_OR_RETURN(json j, parse_json(text, kManifestJsonLimits, "manifest"));
  return manifest_from_json(j);
}

bool is_safe_relative_path(const std::string& p) {
  if (p.empty() || p.size() > 4096 || p[0] == '/') return false;
  if (p.find('\0') != std::string::npos || p.find('\\') != std::string::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    std::string c = p.substr(start, end - start);
    if (c.empty() || c == "." || c == "..") return false;
    start = end + 1;
  }
  return true;
}

namespace {

// A tiling fault of tensor `t`'s pieces (`index`: their numbers in the manifest) as its rule code.
Status tiling_status(const TilingFault& f, const TensorMeta& t, const std::vector<Piece>& pieces, const std::vector<size_t>& index) {
  using Kind = TilingFault::Kind;
  const Piece& a = pieces[index[f.a]];
  const std::string where = "piece #" + std::to_string(index[f.a]) + " of tensor '" + t.name + "'";
  const std::string flat_box = "flat pieces of tensor '" + t.name + "' box " + a.region.box.to_string();
  switch (f.kind) {
    case Kind::kBadShape:
      return Status::Error("BadShape", "tensor '" + t.name + "' has an invalid shape " + shape_to_string(t.shape)).with_tensor(t.name);
    case Kind::kNotABox:  // flat ranges are allowed
    case Kind::kOutside:
      return Status::Error("RegionOutOfBounds", where + ": region " + a.region.box.to_string() + " is not inside shape " +
                                                    shape_to_string(t.shape) + " (" + f.detail + ")")
          .with_tensor(t.name);
    case Kind::kFlatOutside:
      return Status::Error("RegionOutOfBounds", where + ": flat range " + std::to_string(a.region.flat_begin) + ".." +
                                                    std::to_string(a.region.flat_end) + " is not inside [0, " +
                                                    std::to_string(a.region.box.numel()) + "]")
          .with_tensor(t.name);
    case Kind::kFlatOverlap:
      return Status::Error("PieceOverlap", flat_box + " overlap at element " + std::to_string(f.at)).with_tensor(t.name);
    case Kind::kFlatGap:
      return Status::Error("FlatRangeGap", flat_box + " leave a gap at element " + std::to_string(f.at) + " of " +
                                               std::to_string(a.region.box.numel()))
          .with_tensor(t.name);
    case Kind::kOverlap: {
      if (t.shape.empty())
        return Status::Error("PieceOverlap", "scalar tensor '" + t.name + "' is stored by more than one piece").with_tensor(t.name);
      const Piece& b = pieces[index[f.b]];
      return Status::Error("PieceOverlap", "pieces #" + std::to_string(index[f.a]) + " (" + a.region.to_string() + ") and #" +
                                               std::to_string(index[f.b]) + " (" + b.region.to_string() + ") of tensor '" + t.name + "' overlap")
          .with_tensor(t.name);
    }
    case Kind::kGap:
      break;
  }
  return Status::Error("PieceGap", "pieces of tensor '" + t.name + "' " + shape_to_string(t.shape) + " cover " + std::to_string(f.covered) +
                                       " of " + std::to_string(f.total) + " elements")
      .with_tensor(t.name);
}

}  // namespace

Status validate_pieces(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, bool whole) {
  std::unordered_map<std::string, size_t> index;
  index.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.name.empty() || t.name.size() > 1024)
      return Status::Error("BadField", "tensor #" + std::to_string(i) + " has an empty or over-long name");
    if (!index.emplace(t.name, i).second)
      return Status::Error("DuplicateTensor", "tensor '" + t.name + "' is declared twice").with_tensor(t.name);
    if (t.shape.size() > kMaxRank || !checked_numel(t.shape))
      return Status::Error("BadShape", "tensor '" + t.name + "' has an invalid shape " + shape_to_string(t.shape)).with_tensor(t.name);
  }
  std::vector<std::vector<size_t>> by_tensor(tensors.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto it = index.find(pieces[i].tensor);
    if (it == index.end())
      return Status::Error("UnknownTensor", "piece #" + std::to_string(i) + " names tensor '" + pieces[i].tensor + "', which is not declared")
          .with_tensor(pieces[i].tensor);
    by_tensor[it->second].push_back(i);
  }
  for (size_t ti = 0; ti < tensors.size(); ++ti)
    if (by_tensor[ti].size() > kMaxPiecesPerTensor)
      return Status::Error("TooManyPieces", "tensor '" + tensors[ti].name + "' is stored in " + std::to_string(by_tensor[ti].size()) +
                                                " pieces, more than the bound " + std::to_string(kMaxPiecesPerTensor))
          .with_tensor(tensors[ti].name);
  // Each tensor's pieces tile it; the flat pieces of one box tile that box (formats/tensor/tiling.h).
  const TilingRules rules{.flat_ranges = true, .cover = whole};
  std::vector<Region> regions;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    regions.clear();
    for (size_t pi : by_tensor[ti]) regions.push_back(pieces[pi].region);
    if (auto f = find_tiling_fault(tensors[ti].shape, regions, rules)) return tiling_status(*f, tensors[ti], pieces, by_tensor[ti]);
  }
  return Status::Ok();
}

Status validate_manifest(const Manifest& m) {
  if (m.version < kOldestReadableVersion || m.version > kFormatVersion)
    return Status::Error("UnsupportedVersion", "manifest version " + std::to_string(m.version) + " is not supported");
  std::vector<Piece> pieces;
  pieces.reserve(m.pieces.size());
  std::set<std::pair<std::string, std::string>> datasets;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& r = m.pieces[i];
    const std::string where = "piece #" + std::to_string(i) + " of tensor '" + r.piece.tensor + "'";
    if (!is_safe_relative_path(r.file))
      return Status::Error("BadFileName", where + ": file name '" + r.file + "' must be a relative path without '..'").with_tensor(r.piece.tensor);
    if (r.dataset.empty() || r.dataset[0] != '/' || r.dataset.size() > 1024 || r.dataset.find('\0') != std::string::npos)
      return Status::Error("BadField", where + ": dataset '" + r.dataset + "' must be an absolute HDF5 path").with_tensor(r.piece.tensor);
    if (!is_digest_hex(r.digest.algo, r.digest.hex) || (m.version < 2 && r.digest.algo != DigestAlgo::kSha256))
      return Status::Error("BadField", where + ": digest '" + r.digest.to_string().substr(0, 80) + "' is malformed or not allowed in version " +
                                           std::to_string(m.version)).with_tensor(r.piece.tensor);
    if (!datasets.emplace(r.file, r.dataset).second)
      return Status::Error("DuplicateDataset", where + ": dataset '" + r.dataset + "' of '" + r.file + "' is used by two pieces")
          .with_tensor(r.piece.tensor);
    pieces.push_back(r.piece);
  }
  CKPT_RETURN_IF_ERROR(validate_pieces(m.tensors, pieces));
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& r = m.pieces[i];
    auto want = checked_mul(static_cast<uint64_t>(r.piece.region.numel()), static_cast<uint64_t>(dtype_size(r.piece.dtype)));
    if (!want || *want != r.bytes)
      return Status::Error("BadByteCount", "piece #" + std::to_string(i) + " of tensor '" + r.piece.tensor + "': bytes " + std::to_string(r.bytes) +
                                                    ", expected " + (want ? std::to_string(*want) : std::string("overflow")) + " (" +
                                                    std::to_string(r.piece.region.numel()) + " x " + std::string(dtype_name(r.piece.dtype)) + ")")
          .with_tensor(r.piece.tensor);
  }
  return Status::Ok();
}

Result<Manifest> load_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestFile;
  CKPT_ASSIGN_OR_RETURN(json j, read_json_file(path, kManifestJsonLimits, "manifest"));
  auto m = manifest_from_json(j);
  if (!m.ok()) return m.take_status().with_file(path);
  Status v = validate_manifest(*m);
  if (!v.ok()) return std::move(v).with_file(path);
  return m;
}

}  // namespace ckpt::store
