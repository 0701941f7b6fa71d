// Deterministic greedy balancing of sized items over bins (ranks, processes): items largest first
// (ties: lower index first), each to the bin with the least load so far (ties: lowest bin); an
// item counts its size + 1, so that empty items spread too. Used wherever work or bytes are split
// over ranks (the distributed reshard's files, the distributed source check). Pure; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt {

// The bin of every item.
std::vector<int> balance_greedy(const std::vector<uint64_t>& sizes, int bins);
// The items of bin `bin`, ascending.
std::vector<size_t> balanced_share(const std::vector<uint64_t>& sizes, int bins, int bin);

}  // namespace ckpt
