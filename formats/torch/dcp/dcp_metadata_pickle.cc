// pickle_dcp_metadata and torch_save_bytes (formats/torch/dcp/dcp_writer.h): the object tree of a DCP
// Metadata as torch 2.13 pickles it (checked against torch's own .metadata with pickletools), and
// an in-memory torch.save zip for bytes items.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include "formats/base/file_io.h"
#include "formats/torch/dcp/dcp_writer.h"
#include "formats/torch/pickle/pickler.h"

namespace ckpt::torch {

namespace dcp_pickle_detail {

const std::string kMd = "torch.distributed.checkpoint.metadata.";

struct TreeBuilder {
  PyArena a;
  const PyObj* str(const std::string& s) { return a.str(s); }
  const PyObj* size(const Shape& dims) {  // torch.Size((d0, d1, ...))
    std::vector<const PyObj*> v;
    for (int64_t d : dims) v.push_back(a.integer(d));
    return a.record("torch.Size", a.tuple({a.tuple(std::move(v))}), nullptr);
  }
  // A dataclass instance: cls.__new__(cls) then BUILD of its __dict__.
  const PyObj* dataclass(const std::string& cls, std::vector<std::pair<const PyObj*, const PyObj*>> fields) {
    return a.record(cls, a.tuple({}), fields.empty() ? nullptr : a.dict(std::move(fields)), true);
  }
  const PyObj* properties(DType dt) {
    const PyObj* layout = a.record("torch.serialization._get_layout", a.tuple({a.str("torch.strided")}), nullptr);
    const PyObj* mem = a.record(kMd + "_MEM_FORMAT_ENCODING", a.tuple({a.integer(0)}), nullptr);  // contiguous
    const PyObj* state = a.tuple({a.record(torch_dtype_name(dt), nullptr, nullptr), layout, a.boolean(false), mem,
                                  a.boolean(false)});
    return a.record(kMd + "TensorProperties", a.tuple({}), state, true);
  }
  const PyObj* storage_info(const std::string& file, uint64_t offset, uint64_t length) {
    return dataclass("torch.distributed.checkpoint.filesystem._StorageInfo",
                     {{str("relative_path"), str(file)},
                      {str("offset"), a.integer(static_cast<int64_t>(offset))},
                      {str("length"), a.integer(static_cast<int64_t>(length))}});
  }
};

std::string random_save_id() {
  std::random_device rd;
  const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    s += hex[rd() % 16];
  }
  return s;
}

}  // namespace dcp_pickle_detail


Result<std::string> pickle_dcp_metadata(const DcpMetadata& md, const std::string& save_id, bool flat_planner_data) {
  dcp_pickle_detail::TreeBuilder b;
  std::vector<std::pair<const PyObj*, const PyObj*>> sdm, planner, storage;
  for (const auto& bi : md.bytes) {
    const PyObj* fqn = b.str(bi.fqn);
    sdm.emplace_back(fqn, b.dataclass(dcp_pickle_detail::kMd + "BytesStorageMetadata", {}));
    planner.emplace_back(fqn, b.a.tuple({fqn}));
    const PyObj* index = b.dataclass(dcp_pickle_detail::kMd + "MetadataIndex", {{b.str("fqn"), fqn}, {b.str("index"), b.a.none()}});
    storage.emplace_back(index, b.storage_info(bi.file, bi.offset, bi.length));
  }
  for (const auto& t : md.tensors) {
    const PyObj* fqn = b.str(t.fqn);
    std::vector<const PyObj*> chunks;
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      const DcpChunk& c = t.chunks[i];
      const PyObj* offsets = b.size(c.offsets);
      chunks.push_back(
          b.dataclass(dcp_pickle_detail::kMd + "ChunkStorageMetadata", {{b.str("offsets"), offsets}, {b.str("sizes"), b.size(c.sizes)}}));
      const PyObj* index = b.dataclass(dcp_pickle_detail::kMd + "MetadataIndex", {{b.str("fqn"), fqn},
                                                               {b.str("offset"), offsets},
                                                               {b.str("index"), b.a.integer(static_cast<int64_t>(i))}});
      storage.emplace_back(index, b.storage_info(c.file, c.offset, c.length));
    }
    sdm.emplace_back(fqn, b.dataclass(dcp_pickle_detail::kMd + "TensorStorageMetadata", {{b.str("properties"), b.properties(t.dtype)},
                                                                       {b.str("size"), b.size(t.size)},
                                                                       {b.str("chunks"), b.a.list(std::move(chunks))}}));
    planner.emplace_back(fqn, b.a.tuple({fqn}));
  }
  const PyObj* meta = b.dataclass(dcp_pickle_detail::kMd + "StorageMeta", {{b.str("checkpoint_id"), b.a.none()},
                                                        {b.str("save_id"), b.str(save_id.empty() ? dcp_pickle_detail::random_save_id() : save_id)},
                                                        {b.str("load_id"), b.a.none()},
                                                        {b.str("modules"), b.a.list({})}});
  const PyObj* root = b.dataclass(dcp_pickle_detail::kMd + "Metadata", {{b.str("state_dict_metadata"), b.a.dict(std::move(sdm))},
                                                     {b.str("planner_data"), flat_planner_data ? b.a.dict(std::move(planner)) : b.a.none()},
                                                     {b.str("storage_data"), b.a.dict(std::move(storage))},
                                                     {b.str("storage_meta"), meta},
                                                     {b.str("version"), b.str("1.0.0")}});
  return pickle_dumps(root);
}

Result<std::string> torch_save_bytes(const PyObj* root) {
  TorchWriteOptions opts;
  opts.archive_name = "archive";
  CKPT_ASSIGN_OR_RETURN(auto zip, TorchZipWriter::plan(root, {}, opts));
  int fd = ::memfd_create("ckpt_torch_save", MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno("memfd_create failed", "torch_save_bytes", errno);
  const OutputFile file = OutputFile::adopt(ScopedFd(fd), "torch_save_bytes");
  zip->attach(file, 0, "torch_save_bytes");
  CKPT_RETURN_IF_ERROR(zip->finish());
  std::string out(zip->size(), '\0');
  CKPT_RETURN_IF_ERROR(pread_full(fd, out.data(), out.size(), 0, "torch_save_bytes"));
  return out;
}

}  // namespace ckpt::torch
