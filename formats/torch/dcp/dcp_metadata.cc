// The `.metadata` file of a DCP directory (docs/DCP.md): a pickle of
// torch.distributed.checkpoint.metadata.Metadata read by the restricted unpickler into inert
// records, then checked rule by rule (each rule one error code, formats/base/error_codes.cc).
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "formats/base/checked.h"
#include "formats/base/file_io.h"
#include "formats/base/fs_util.h"
#include "formats/tensor/tiling.h"
#include "formats/torch/dcp/dcp.h"
#include "formats/torch/pickle/unpickler.h"

namespace ckpt::torch {

namespace dcp_meta_detail {

constexpr std::string_view kMetaMod = "torch.distributed.checkpoint.metadata.";
constexpr std::string_view kFsMod = "torch.distributed.checkpoint.filesystem.";

Status bad(const std::string& msg) { return Status::Error("DcpBadMetadata", "DCP .metadata: " + msg); }

bool is_cls(const PyObj* o, std::string_view mod, std::string_view name) {
  return o && o->type == PyType::kRecord && o->cls.size() == mod.size() + name.size() &&
         o->cls.compare(0, mod.size(), mod) == 0 && o->cls.compare(mod.size(), name.size(), name) == 0;
}

std::string what_is(const PyObj* o) {
  if (!o) return "nothing";
  if (o->type == PyType::kRecord) return o->cls;
  return py_type_name(o->type);
}

// A torch.Size / tuple / list of non-negative ints (torch.Size is a kTuple; a record
// torch.Size((...)) is accepted too).
Result<Shape> as_shape(const PyObj* o, const std::string& what) {
  if (o && o->type == PyType::kRecord && o->cls == "torch.Size" && o->args && o->args->type == PyType::kTuple &&
      o->args->items.size() == 1)
    o = o->args->items[0];
  if (!o || (o->type != PyType::kTuple && o->type != PyType::kList))
    return bad(what + ": expected a torch.Size, found " + what_is(o));
  if (o->items.size() > kMaxDcpRank)
    return Status::Error("DcpTooLarge", "DCP .metadata: " + what + " has " + std::to_string(o->items.size()) +
                                            " dimensions (at most " + std::to_string(kMaxDcpRank) + ")");
  Shape s;
  for (const PyObj* d : o->items) {
    if (!d || d->type != PyType::kInt || d->i < 0) return bad(what + ": expected non-negative integers, found " + what_is(d));
    s.push_back(d->i);
  }
  return s;
}

Result<uint64_t> as_u64(const PyObj* o, const std::string& what) {
  if (!o || o->type != PyType::kInt || o->i < 0) return bad(what + ": expected a non-negative integer, found " + what_is(o));
  return static_cast<uint64_t>(o->i);
}

// TensorProperties: its state is the tuple (dtype, layout, requires_grad, memory format, pinned)
// (torch >= 2.0 __getstate__), or a dict of attributes.
Result<DType> properties_dtype(const PyObj* props, const std::string& fqn) {
  if (!is_cls(props, kMetaMod, "TensorProperties"))
    return bad("tensor '" + fqn + "': properties is " + what_is(props) + ", expected TensorProperties");
  const PyObj* dt = nullptr;
  if (props->state && props->state->type == PyType::kTuple && !props->state->items.empty()) dt = props->state->items[0];
  else dt = props->get("dtype");
  if (!dt || dt->type != PyType::kRecord)
    return bad("tensor '" + fqn + "': TensorProperties has no dtype (found " + what_is(dt) + ")");
  DType t;
  if (!dtype_from_torch_name(dt->cls, &t))
    return Status::Error("DcpUnknownDType", "DCP .metadata: tensor '" + fqn + "' has dtype " + dt->cls + ", which ckpt does not read");
  return t;
}

// The chunks of `t` inside it and disjoint (formats/tensor/tiling.h); holes are legal here
// (docs/DCP.md), reported when read.
Status check_chunks(const DcpTensor& t) {
  std::vector<Region> chunks;
  chunks.reserve(t.chunks.size());
  for (const auto& c : t.chunks) chunks.push_back(Region{Box{c.offsets, c.sizes}});
  auto f = find_tiling_fault(t.size, chunks, TilingRules{.flat_ranges = false, .cover = false});
  if (!f) return Status::Ok();
  if (f->kind == TilingFault::Kind::kOverlap)
    return Status::Error("DcpChunkOverlap", "DCP .metadata: tensor '" + t.fqn + "': chunks " + chunks[f->a].box.to_string() + " and " +
                                                chunks[f->b].box.to_string() + " overlap")
        .with_tensor(t.fqn);
  const DcpChunk& c = t.chunks[f->a];
  return Status::Error("DcpChunkOutside", "DCP .metadata: tensor '" + t.fqn + "' chunk " + std::to_string(f->a) + " (offsets " +
                                              shape_to_string(c.offsets) + ", sizes " + shape_to_string(c.sizes) +
                                              ") does not lie inside the tensor's size " + shape_to_string(t.size))
      .with_tensor(t.fqn);
}

Result<DcpTensor> parse_tensor(const std::string& fqn, const PyObj* md, size_t* total_chunks) {
  DcpTensor t;
  t.fqn = fqn;
  CKPT_ASSIGN_OR_RETURN(t.dtype, properties_dtype(md->get("properties"), fqn));
  CKPT_ASSIGN_OR_RETURN(t.size, as_shape(md->get("size"), "tensor '" + fqn + "' size"));
  if (!shape_numel(t.size).ok())
    return Status::Error("DcpTooLarge", "DCP .metadata: tensor '" + fqn + "' has size " + shape_to_string(t.size) + ", which overflows");
  const PyObj* chunks = md->get("chunks");
  if (!chunks || chunks->type != PyType::kList) return bad("tensor '" + fqn + "': chunks is " + what_is(chunks) + ", expected a list");
  *total_chunks += chunks->items.size();
  if (*total_chunks > kMaxDcpChunks)
    return Status::Error("DcpTooLarge", "DCP .metadata: more than " + std::to_string(kMaxDcpChunks) + " chunks");
  for (size_t k = 0; k < chunks->items.size(); ++k) {
    const PyObj* c = chunks->items[k];
    const std::string where = "tensor '" + fqn + "' chunk " + std::to_string(k);
    if (!is_cls(c, kMetaMod, "ChunkStorageMetadata")) return bad(where + " is " + what_is(c) + ", expected ChunkStorageMetadata");
    DcpChunk ch;
    CKPT_ASSIGN_OR_RETURN(ch.offsets, as_shape(c->get("offsets"), where + " offsets"));
    CKPT_ASSIGN_OR_RETURN(ch.sizes, as_shape(c->get("sizes"), where + " sizes"));
    t.chunks.push_back(std::move(ch));
  }
  CKPT_RETURN_IF_ERROR(check_chunks(t));
  return t;
}

struct StorageEntry {
  std::string file;
  uint64_t offset = 0, length = 0;
  bool used = false;
};
using StorageKey = std::pair<std::string, Shape>;  // fqn, chunk offsets (empty for bytes items)

Status parse_storage(const PyObj* sd, std::map<StorageKey, StorageEntry>& out) {
  if (!sd || sd->type != PyType::kDict) return bad("storage_data is " + what_is(sd) + ", expected a dict");
  for (const auto& [k, v] : sd->entries) {
    if (!is_cls(k, kMetaMod, "MetadataIndex")) return bad("a storage_data key is " + what_is(k) + ", expected MetadataIndex");
    const PyObj* fqn = k->get("fqn");
    if (!fqn || fqn->type != PyType::kStr) return bad("a MetadataIndex has no fqn string");
    StorageKey key{fqn->s, {}};
    const PyObj* off = k->get("offset");
    if (off && off->type != PyType::kNone) {
      CKPT_ASSIGN_OR_RETURN(key.second, as_shape(off, "MetadataIndex '" + fqn->s + "' offset"));
    }
    if (!is_cls(v, kFsMod, "_StorageInfo")) return bad("storage of '" + fqn->s + "' is " + what_is(v) + ", expected _StorageInfo");
    const PyObj* td = v->get("transform_descriptors");
    if (td && td->type != PyType::kNone && !(td->items.empty() && (td->type == PyType::kList || td->type == PyType::kTuple))) {
      std::string names;
      for (const PyObj* d : td->items) names += (names.empty() ? "" : ", ") + (d && d->type == PyType::kStr ? d->s.substr(0, 64) : what_is(d));
      return Status::Error("DcpTransform", "DCP .metadata: item '" + fqn->s + "' is stored through transforms [" + names +
                                               "] (e.g. zstandard compression), which ckpt does not read")
          .with_tensor(fqn->s);
    }
    const PyObj* rp = v->get("relative_path");
    if (!rp || rp->type != PyType::kStr) return bad("storage of '" + fqn->s + "' has no relative_path string");
    CKPT_RETURN_IF_ERROR(check_dcp_relative_path(rp->s, fqn->s));
    StorageEntry e;
    e.file = rp->s;
    CKPT_ASSIGN_OR_RETURN(e.offset, as_u64(v->get("offset"), "storage of '" + fqn->s + "' offset"));
    CKPT_ASSIGN_OR_RETURN(e.length, as_u64(v->get("length"), "storage of '" + fqn->s + "' length"));
    if (!checked_add(e.offset, e.length)) return bad("storage of '" + fqn->s + "': offset + length overflows");
    if (!out.emplace(std::move(key), std::move(e)).second)
      return Status::Error("DcpDuplicateStorage", "DCP .metadata: two storage entries for item '" + fqn->s + "' at the same offsets")
          .with_tensor(fqn->s);
  }
  return Status::Ok();
}

// Joins chunks and bytes items to their storage entries.
Status attach_storage(DcpMetadata& m, std::map<StorageKey, StorageEntry>& st) {
  for (auto& t : m.tensors) {
    for (auto& c : t.chunks) {
      auto it = st.find(StorageKey{t.fqn, c.offsets});
      if (it == st.end() || it->second.used)
        return Status::Error("DcpMissingStorage", "DCP .metadata: tensor '" + t.fqn + "' chunk at offsets " + shape_to_string(c.offsets) +
                                                      " has no storage_data entry (no file holds it)")
            .with_tensor(t.fqn);
      it->second.used = true;
      c.file = it->second.file;
      c.offset = it->second.offset;
      c.length = it->second.length;
    }
  }
  for (auto& b : m.bytes) {
    auto it = st.find(StorageKey{b.fqn, {}});
    if (it == st.end())
      return Status::Error("DcpMissingStorage", "DCP .metadata: bytes item '" + b.fqn + "' has no storage_data entry").with_tensor(b.fqn);
    b.file = it->second.file;
    b.offset = it->second.offset;
    b.length = it->second.length;
  }
  return Status::Ok();
}

}  // namespace dcp_meta_detail

Result<DcpMetadata> parse_dcp_metadata(std::string_view bytes) {
  using namespace dcp_meta_detail;
  CKPT_ASSIGN_OR_RETURN(Pickle p, unpickle(bytes));
  const PyObj* root = p.root;
  if (!is_cls(root, kMetaMod, "Metadata")) return bad("the pickle holds " + what_is(root) + ", expected " + std::string(kMetaMod) + "Metadata");
  const PyObj* sdm = root->get("state_dict_metadata");
  if (!sdm || sdm->type != PyType::kDict) return bad("state_dict_metadata is " + what_is(sdm) + ", expected a dict");
  if (sdm->entries.size() > kMaxDcpEntries)
    return Status::Error("DcpTooLarge", "DCP .metadata: " + std::to_string(sdm->entries.size()) + " entries (at most " +
                                            std::to_string(kMaxDcpEntries) + ")");
  DcpMetadata m;
  if (const PyObj* v = root->get("version"); v && v->type == PyType::kStr) m.version = v->s.substr(0, 64);
  size_t total_chunks = 0;
  for (const auto& [k, v] : sdm->entries) {
    if (!k || k->type != PyType::kStr) return bad("a state_dict_metadata key is " + what_is(k) + ", expected a string");
    if (is_cls(v, kMetaMod, "BytesStorageMetadata")) {
      DcpBytesItem b;
      b.fqn = k->s;
      m.bytes.push_back(std::move(b));
    } else if (is_cls(v, kMetaMod, "TensorStorageMetadata")) {
      CKPT_ASSIGN_OR_RETURN(DcpTensor t, parse_tensor(k->s, v, &total_chunks));
      m.tensors.push_back(std::move(t));
    } else {
      return bad("entry '" + k->s + "' is " + what_is(v) + ", expected TensorStorageMetadata or BytesStorageMetadata");
    }
  }
  std::map<StorageKey, StorageEntry> st;
  CKPT_RETURN_IF_ERROR(parse_storage(root->get("storage_data"), st));
  CKPT_RETURN_IF_ERROR(attach_storage(m, st));
  return m;
}

Status check_dcp_relative_path(const std::string& rel, const std::string& fqn) {
  bool escapes = rel.empty() || rel.front() == '/' || rel.find('\0') != std::string::npos;
  for (const auto& part : std::filesystem::path(rel)) escapes = escapes || part == "..";
  if (escapes)
    return Status::Error("DcpBadPath", "DCP item '" + fqn + "' names the file '" + rel.substr(0, 256) +
                                           "', which is not a relative path inside the checkpoint directory")
        .with_tensor(fqn);
  return Status::Ok();
}

bool is_dcp_dir(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(dir) / ".metadata", ec)) return true;
  // Data files without .metadata: an incomplete DCP, detected so that opening it names what is
  // missing (open_dcp_dir: IncompleteCheckpoint) instead of "no checkpoint kind".
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".distcp") return true;
  return false;
}

namespace dcp_meta_detail {

// Checks every item's byte range against its file, and tells raw items from embedded zips.
// Files are visited one at a time (one descriptor open at once, whatever the number of ranks).
Status check_items(const std::string& dir, DcpMetadata& m) {
  struct Item {
    const std::string* fqn;
    uint64_t offset, length;
    DcpChunk* chunk;  // nullptr for bytes items
    DType dtype;
  };
  std::map<std::string, std::vector<Item>> by_file;
  for (auto& b : m.bytes) by_file[b.file].push_back(Item{&b.fqn, b.offset, b.length, nullptr, DType::kU8});
  for (auto& t : m.tensors)
    for (auto& c : t.chunks) by_file[c.file].push_back(Item{&t.fqn, c.offset, c.length, &c, t.dtype});
  for (const auto& [rel, items] : by_file) {
    const std::string path = (std::filesystem::path(dir) / rel).string();
    CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, O_RDONLY, "DCP data file"));
    struct stat sb {};
    if (fstat(fd.get(), &sb) != 0) return Status::FromErrno("stat", path, errno);
    const auto size = static_cast<uint64_t>(sb.st_size);
    for (const Item& it : items) {
      if (it.offset + it.length > size)  // no overflow: checked at parse
        return Status::Error("DcpItemPastFile", "DCP item '" + *it.fqn + "': bytes [" + std::to_string(it.offset) + ", " +
                                                    std::to_string(it.offset + it.length) + ") run past the end of '" + rel + "' (" +
                                                    std::to_string(size) + " bytes)")
            .with_file(path)
            .with_tensor(*it.fqn);
      if (!it.chunk) continue;
      DcpChunk& c = *it.chunk;
      char magic[4] = {0, 0, 0, 0};
      if (c.length >= 4) CKPT_RETURN_IF_ERROR(pread_full(fd.get(), magic, 4, c.offset, path));
      c.raw = std::string_view(magic, 4) != std::string_view("PK\x03\x04", 4);
      const uint64_t want = checked_mul(static_cast<uint64_t>(Box{c.offsets, c.sizes}.numel()), uint64_t{dtype_size(it.dtype)}).value_or(UINT64_MAX);
      if (c.raw && c.length != want)
        return Status::Error("DcpItemSize", "DCP item '" + *it.fqn + "' chunk at " + shape_to_string(c.offsets) + ": " +
                                                std::to_string(c.length) + " bytes that are not a torch.save zip; a raw chunk of sizes " +
                                                shape_to_string(c.sizes) + " in " + std::string(dtype_name(it.dtype)) + " has " +
                                                std::to_string(want))
            .with_file(path)
            .with_tensor(*it.fqn);
    }
  }
  return Status::Ok();
}

}  // namespace dcp_meta_detail

Result<DcpMetadata> read_dcp_metadata(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / ".metadata").string();
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, O_RDONLY, "DCP metadata"));
  struct stat sb {};
  if (fstat(fd.get(), &sb) != 0) return Status::FromErrno("stat", path, errno);
  const auto size = static_cast<uint64_t>(sb.st_size);
  if (size > kMaxDcpMetadataBytes)
    return Status::Error("DcpTooLarge", "DCP .metadata is " + std::to_string(size) + " bytes (at most " + std::to_string(kMaxDcpMetadataBytes) + ")")
        .with_file(path);
  std::string bytes(size, '\0');
  CKPT_RETURN_IF_ERROR(pread_full(fd.get(), bytes.data(), size, 0, path));
  auto m = parse_dcp_metadata(bytes);
  if (!m.ok()) return m.take_status().with_file(path);
  CKPT_RETURN_IF_ERROR(dcp_meta_detail::check_items(dir, *m));
  return m;
}

}  // namespace ckpt::torch
