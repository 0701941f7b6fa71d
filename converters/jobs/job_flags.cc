#include "converters/jobs/job_flags.h"

#include "formats/base/byte_size.h"
#include "formats/io/output_file.h"

namespace ckpt {

Result<uint64_t> parse_max_memory(const std::string& text) { return parse_byte_size(text, "--max-memory"); }

Result<uint64_t> parse_max_shard_size(const std::string& text) { return parse_byte_size(text, "--max-shard-size"); }

Result<IoMode> parse_io_flag(const std::string& text) { return parse_io_mode(text, "--io"); }

Result<store::StoreOptions> parse_store_flags(const std::string& compress, const std::string& digest, const std::string& io) {
  CKPT_ASSIGN_OR_RETURN(store::StoreOptions so, store::parse_compress_spec(compress, "--compress"));
  CKPT_ASSIGN_OR_RETURN(so, store::parse_digest_spec(digest, "--digest", so));
  CKPT_ASSIGN_OR_RETURN(so.io, parse_io_flag(io));
  return so;
}

Result<std::optional<DType>> float_dtype_flag(const std::string& value) {
  if (value.empty()) return std::optional<DType>{};
  auto dt = dtype_from_name(value, /*cli_aliases=*/true);
  if (!dt.ok() || !dtype_is_float(*dt))
    return Status::InvalidArgument("--dtype '" + value + "': expected bf16, fp16 or fp32");
  return std::optional<DType>{*dt};
}

Result<std::optional<Layout>> parse_layout_file(const std::string& file) {
  if (file.empty()) return std::optional<Layout>{};
  CKPT_ASSIGN_OR_RETURN(Layout l, Layout::from_file(file));
  return std::optional<Layout>{std::move(l)};
}

}  // namespace ckpt
