#include "converters/megatron/megatron_dir_source.h"

#include <filesystem>
#include <system_error>

#include "converters/megatron/megatron_rank_source.h"
#include "converters/megatron/megatron_segments.h"
#include "formats/base/json_read.h"
#include "formats/safetensors/st_reader.h"

namespace ckpt {

bool is_megatron_dir(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) && std::filesystem::is_regular_file(dir + "/megatron_args.json", ec);
}

Result<std::unique_ptr<TensorSource>> open_megatron_dir(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string args_file = dir + "/megatron_args.json";
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(args_file, kMegatronArgsJsonLimits, "megatron_args.json"));
  CKPT_ASSIGN_OR_RETURN(MegatronArgs a, megatron_args_from_json(std::move(j), args_file));
  MegatronRankFiles ranks;
  for (int p = 0; p < a.layout.pp; ++p)
    for (int r = 0; r < a.layout.tp; ++r) {
      const std::string f = dir + "/" + megatron_rank_dir(a.layout, r, p) + "/model.safetensors";
      auto sf = safetensors::SafetensorsFile::open(f);
      if (!sf.ok()) return sf.take_status().with_file(f).with_context("Megatron rank file");
      ranks.files.push_back(std::move(sf).value());
      ranks.paths.push_back(f);
    }
  ranks.integrity = {"Megatron-layout safetensors", "",
                     "Megatron-layout safetensors: safetensors and megatron_args.json have no checksums: structure validated and "
                     "every byte read, content not checkable"};
  return open_megatron_ranks(dir, std::move(a), std::move(ranks));
}

}  // namespace ckpt
