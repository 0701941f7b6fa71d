#include "cli/common_flags.h"

#include <vector>

#include "formats/byte_size.h"
#include "reshard/executor.h"
#include "reshard/flags.h"

namespace ckpt::cli {

void LayoutFlags::add(CLI::App& sub, const std::string& zero_help) {
  sub.add_option("--tp", tp, "tensor-parallel size");
  sub.add_option("--pp", pp, "pipeline-parallel size");
  sub.add_option("--pp-layers", pp_layers, "layers per pipeline stage, e.g. 2,3,3 for uneven stages (default: even split)");
  sub.add_option("--dp", dp, "data-parallel size");
  sub.add_option("--zero", zero, zero_help)->check(CLI::Range(0, 1));
}

Result<Layout> LayoutFlags::make(int64_t num_layers) const {
  if (tp < 1 || pp < 1 || dp < 1)
    return Status::InvalidArgument("layout flags: give --tp N --pp N --dp N (each >= 1), optionally --pp-layers and --zero");
  std::vector<int> per;
  if (!pp_layers.empty()) {
    CKPT_ASSIGN_OR_RETURN(per, parse_int_list(pp_layers, "--pp-layers"));
  }
  return Layout::make(tp, pp, dp, zero < 0 ? 0 : zero, static_cast<int>(num_layers), per);
}

void StreamFlags::add(CLI::App& sub) {
  sub.add_option("--threads", threads,
                 "threads: 1 does everything on one; N reads on one, writes on another, casts/copies on N-1 workers, and a native "
                 "checkpoint being written copies and SHA-256-hashes pieces taken from source files on N (default " +
                     std::to_string(threads) + ")")
      ->check(CLI::Range(1, 64));
  sub.add_option("--max-memory", max_memory, "buffer budget, e.g. 256M, 1G (default " + max_memory + ")");
}

Result<uint64_t> StreamFlags::chunk_bytes(size_t max_src_elem, size_t min_out_elem, uint64_t reserve) const {
  CKPT_ASSIGN_OR_RETURN(uint64_t mem, parse_byte_size(max_memory, "--max-memory"));
  const uint64_t floor = 4u << 20;
  const uint64_t budget = mem > reserve + floor ? mem - reserve : floor;
  return exec_chunk_bytes(budget, threads, max_src_elem, min_out_elem);
}

}  // namespace ckpt::cli
