#include "converters/hf/hf_files.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "formats/digest/sha256.h"

namespace ckpt {

namespace fs = std::filesystem;

const std::vector<std::string>& hf_side_file_names() {
  static const std::vector<std::string> kNames = {
      "tokenizer.json",   "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
      "added_tokens.json", "generation_config.json", "vocab.json",     "merges.txt"};
  return kNames;
}

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

Status corrupt(const std::string& name, const std::string& what) {
  return Status::Error("HfFilesCorrupt", "metadata hf_files['" + name + "']: " + what);
}

bool allowed_name(const std::string& n) {
  const auto& names = hf_side_file_names();
  return std::find(names.begin(), names.end(), n) != names.end();
}

}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) | static_cast<uint8_t>(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (size_t rest = in.size() - i; rest > 0) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (rest == 2) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return Status::Error("Base64Invalid", "base64 length " + std::to_string(in.size()) + " is not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = b64_value(c)) < 0)
        return Status::Error("Base64Invalid", "invalid base64 character at offset " + std::to_string(i + k));
    }
    uint32_t x = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) | (static_cast<uint32_t>(v[2]) << 6) |
                 static_cast<uint32_t>(v[3]);
    out += static_cast<char>(x >> 16);
    if (pad < 2) out += static_cast<char>((x >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(x & 0xFF);
  }
  return out;
}

Result<nlohmann::json> collect_hf_files(const std::string& dir) {
  nlohmann::json out = nlohmann::json::object();
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& name : hf_side_file_names()) {
    fs::path p = fs::path(dir) / name;
    if (!fs::is_regular_file(p, ec)) continue;  // follows symlinks (HF hub cache snapshots)
    uint64_t size = fs::file_size(p, ec);
    if (ec) return Status::FromErrno("cannot stat", p.string(), ec.value());
    total += size;
    if (size > kMaxHfFileBytes || total > kMaxHfFileBytes)
      return Status::Error("HfFilesTooLarge",
                           "side file '" + p.string() + "' (" + std::to_string(size) + " bytes) would bring the carried files above " +
                               std::to_string(kMaxHfFileBytes) + " bytes");
    std::ifstream in(p, std::ios::binary);
    if (!in) return Status::FromErrno("cannot open", p.string(), errno);
    std::string content(size, '\0');
    in.read(content.data(), static_cast<std::streamsize>(size));
    if (static_cast<uint64_t>(in.gcount()) != size) return Status::Io("short read of '" + p.string() + "' (changed while reading?)");
    out[name] = {{"bytes", size}, {"sha256", sha256_hex(content.data(), content.size())}, {"base64", base64_encode(content)}};
  }
  return out;
}

Result<std::map<std::string, std::string>> decode_hf_files(const nlohmann::json& metadata) {
  std::map<std::string, std::string> out;
  if (!metadata.is_object() || !metadata.contains(kHfFilesKey)) return out;
  const auto& hf = metadata[kHfFilesKey];
  if (!hf.is_object()) return Status::Error("HfFilesCorrupt", std::string("metadata hf_files is ") + hf.type_name() + ", expected an object");
  uint64_t total = 0;
  for (auto it = hf.begin(); it != hf.end(); ++it) {
    const std::string& name = it.key();
    if (!allowed_name(name)) return corrupt(name.substr(0, 100), "not a known HuggingFace side file name");
    const auto& e = it.value();
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("sha256") ||
        !e["sha256"].is_string() || !e.contains("base64") || !e["base64"].is_string())
      return corrupt(name, "expected {\"bytes\": n, \"sha256\": hex, \"base64\": text}");
    const uint64_t bytes = e["bytes"].get<uint64_t>();
    total += std::min(bytes, kMaxHfFileBytes + 1);
    if (bytes > kMaxHfFileBytes || total > kMaxHfFileBytes) return corrupt(name, "size " + std::to_string(bytes) + " above the limit");
    const std::string& b64 = e["base64"].get_ref<const std::string&>();
    if (b64.size() / 4 * 3 > bytes + 3) return corrupt(name, "base64 text longer than the recorded size");
    auto dec = base64_decode(b64);
    if (!dec.ok()) return corrupt(name, dec.status().message());
    if (dec->size() != bytes)
      return corrupt(name, "decoded size " + std::to_string(dec->size()) + ", recorded " + std::to_string(bytes));
    std::string sha = sha256_hex(dec->data(), dec->size());
    if (sha != e["sha256"].get<std::string>())
      return Status::Error("HfFilesChecksum",
                           "metadata hf_files['" + name + "']: SHA-256 " + sha + ", recorded " + e["sha256"].get<std::string>().substr(0, 64));
    out[name] = std::move(*dec);
  }
  return out;
}

}  // namespace ckpt
