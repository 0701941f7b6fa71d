#include "cli/common_flags.h"

#include <cstdio>

namespace ckpt::cli {

void LayoutFlags::add(CLI::App& sub, const std::string& zero_help) {
  sub.add_option("--tp", tp, "tensor-parallel size");
  sub.add_option("--pp", pp, "pipeline-parallel size");
  sub.add_option("--pp-layers", pp_layers, "layers per pipeline stage, e.g. 2,3,3 for uneven stages (default: even split)");
  sub.add_option("--dp", dp, "data-parallel size");
  sub.add_option("--zero", zero, zero_help)->check(CLI::Range(0, 1));
  sub.add_option("--ep", ep, "expert-parallel size of an MoE model: the tp x dp ranks of a stage hold its experts in ep groups "
                             "(Megatron-Core's order; docs/MOE.md)")->check(CLI::Range(1, 1 << 16));
  sub.add_option("--etp", etp, "expert tensor-parallel size (default: tp); etp x ep must divide tp x dp")
      ->check(CLI::Range(1, 1 << 16));
}

void StreamFlags::add(CLI::App& sub) {
  sub.add_option("--threads", threads,
                 "threads: 1 does everything on one; N reads on one, writes on another, casts/copies on N-1 workers, and a native "
                 "checkpoint being written copies and hashes pieces taken from source files on N (default " +
                     std::to_string(threads) + ")")
      ->check(CLI::Range(1, 64));
  sub.add_option("--max-memory", max_memory,
                 "memory budget of the whole process, e.g. 256M, 1G (default " + max_memory +
                     "); a job's fixed buffers are its floor (--json reports it; below it the job runs at the floor and says so)");
}

void StreamFlags::print_memory_note(const MemoryFit& fit) const {
  const std::string note = fit.note(threads);
  if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
}

void IoFlags::add(CLI::App& sub) { sub.add_option("--io", io, io_flag_help())->check(CLI::IsMember({"direct", "buffered", "auto"})); }

}  // namespace ckpt::cli
