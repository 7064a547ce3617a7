// manifest.json: the artifact's contract (twostep/artifact.py reads the same file the same way).
#include <fstream>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "twostep/twostep.h"

namespace twostep {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kFormat = "twostep-artifact";
constexpr int kSchemaVersion = 1;
constexpr const char* kManifest = "manifest.json";

std::vector<std::string> names(const json& tensors) {
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(t.at("name").get<std::string>());
  return out;
}

Manifest::Graph read_graph(const json& graph) {
  return {graph.at("file").get<std::string>(), names(graph.at("inputs")), names(graph.at("outputs"))};
}

// [batch, heads, len, head_dim] of one decoder input.
const json& kv_shape(const json& decoder, const std::string& name, const std::string& where) {
  for (const auto& t : decoder.at("inputs"))
    if (t.at("name") == name) return t.at("shape");
  throw Error(where + ": malformed manifest (the decoder has no input " + name + ")");
}
}  // namespace

std::string sha256_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot read");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || !EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr)) throw Error("sha256: OpenSSL init failed");
  std::vector<char> block(1 << 20);
  while (in.read(block.data(), block.size()) || in.gcount() > 0)
    EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(in.gcount()));
  if (in.bad()) throw Error(path.string() + ": read error");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < size; ++i) out += {hex[digest[i] >> 4], hex[digest[i] & 15]};
  return out;
}

Manifest Manifest::read(const fs::path& dir, bool check_hashes) {
  const fs::path file = dir / kManifest;
  const std::string where = file.string();
  if (!fs::is_directory(dir))
    throw Error(dir.string() + ": not an artifact directory (expected a folder with " + kManifest +
                "); create one with `twostep export`");
  if (!fs::is_regular_file(file))
    throw Error(dir.string() + ": missing " + kManifest + "; create the directory with `twostep export`");
  json j;
  try {
    std::ifstream in(file);
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", json()) != kFormat)
    throw Error(where + ": not a twostep manifest (format != '" + kFormat + "')");
  const json version = j.value("schema_version", json());
  if (version != kSchemaVersion)
    throw Error(where + ": schema version " + version.dump() + ", this twostep reads version " +
                std::to_string(kSchemaVersion) + "; re-export with this twostep or install the matching one");
  Manifest m;
  m.dir = dir;
  try {
    const json& model = j.at("model");
    m.src_vocab_size = model.at("src_vocab_size").get<int64_t>();
    m.tgt_vocab_size = model.at("tgt_vocab_size").get<int64_t>();
    m.max_positions = model.at("max_positions").get<int64_t>();
    m.pad_id = model.at("pad_id").get<int64_t>();
    m.unk_id = model.at("unk_id").get<int64_t>();
    m.bos_id = model.at("bos_id").get<int64_t>();
    m.eos_id = model.at("eos_id").get<int64_t>();
    m.dtype = j.at("dtype").get<std::string>();
    if (j.contains("tokenizer") && j["tokenizer"].is_string()) m.tokenizer = j["tokenizer"].get<std::string>();
    m.encoder = read_graph(j.at("graphs").at("encoder"));
    m.decoder = read_graph(j.at("graphs").at("decoder"));
    const json& key = kv_shape(j["graphs"]["decoder"], "past_key_self_0", where);
    m.n_heads = key.at(1).get<int64_t>();
    m.head_dim_k = key.at(3).get<int64_t>();
    m.head_dim_v = kv_shape(j["graphs"]["decoder"], "past_value_self_0", where).at(3).get<int64_t>();
    m.files = j.at("files").get<std::map<std::string, std::string>>();
  } catch (const json::exception& e) {
    throw Error(where + ": malformed manifest (missing or wrong " + e.what() + ")");
  }
  for (const auto& [name, expected] : m.files) {
    const fs::path path = dir / name;
    if (!fs::is_regular_file(path)) throw Error(path.string() + ": missing (listed in " + kManifest + ")");
    if (check_hashes && sha256_file(path) != expected)
      throw Error(path.string() + ": sha256 does not match " + kManifest +
                  "; the file was changed or damaged, re-export the artifact");
  }
  return m;
}

}  // namespace twostep
