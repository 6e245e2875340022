#include "disagg/ticket.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"

namespace oasis::disagg {
namespace {

constexpr char kTicketMagic[4] = {'O', 'K', 'H', 'T'};

bool GeometryEqual(const StagedKvGeometry& a, const StagedKvGeometry& b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.dtype_bytes == b.dtype_bytes &&
         a.num_blocks == b.num_blocks && a.draft_kv_heads == b.draft_kv_heads &&
         a.draft_head_dim == b.draft_head_dim && a.kv_dtype == b.kv_dtype &&
         a.draft_dtype_bytes == b.draft_dtype_bytes;
}

// Scales compare by their bits (an exact match is what lets imported bytes stay as they are).
bool BitsEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

Status Bad(const std::string& what) { return InvalidArgument("handoff ticket: " + what); }

// Bounds-checked cursor over the ticket bytes.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }

  // Fails (naming `field`) unless `n` more bytes are present.
  Status Need(size_t n, const char* field) const {
    if (n > left()) {
      return Bad(std::string(field) + ": truncated (needs " + std::to_string(n) +
                 " bytes at offset " + std::to_string(pos_) + ", " + std::to_string(left()) +
                 " left)");
    }
    return Status::Ok();
  }
  StatusOr<uint16_t> U16(const char* field) {
    OASIS_RETURN_IF_ERROR(Need(2, field));
    pos_ += 2;
    return LoadU16(b_.data() + pos_ - 2);
  }
  StatusOr<uint32_t> U32(const char* field) {
    OASIS_RETURN_IF_ERROR(Need(4, field));
    pos_ += 4;
    return LoadU32(b_.data() + pos_ - 4);
  }
  StatusOr<uint64_t> U64(const char* field) {
    OASIS_RETURN_IF_ERROR(Need(8, field));
    pos_ += 8;
    return LoadU64(b_.data() + pos_ - 8);
  }
  StatusOr<std::string_view> Bytes(size_t n, const char* field) {
    OASIS_RETURN_IF_ERROR(Need(n, field));
    pos_ += n;
    return b_.substr(pos_ - n, n);
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

Status CheckAddress(std::string_view a) {
  if (a.empty()) return Bad("staging address: empty");
  if (a.size() > kMaxTicketAddressBytes) {
    return Bad("staging address: " + std::to_string(a.size()) + " bytes, at most " +
               std::to_string(kMaxTicketAddressBytes));
  }
  for (char c : a) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return Bad("staging address: not printable ASCII without spaces");
  }
  const size_t colon = a.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Bad("staging address: \"" + std::string(a) + "\" is not host:port");
  }
  const std::string_view port = a.substr(colon + 1);
  if (port.empty() || port.size() > 5) {
    return Bad("staging address: \"" + std::string(a) + "\" has no port 1..65535");
  }
  uint32_t p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') {
      return Bad("staging address: \"" + std::string(a) + "\" has no port 1..65535");
    }
    p = p * 10 + static_cast<uint32_t>(c - '0');
  }
  if (p == 0 || p > 65535) {
    return Bad("staging address: \"" + std::string(a) + "\" has no port 1..65535");
  }
  return Status::Ok();
}

}  // namespace

bool HandoffTicket::operator==(const HandoffTicket& o) const {
  return staging_address == o.staging_address && pool_id == o.pool_id && lease_id == o.lease_id &&
         lease_ttl_ms == o.lease_ttl_ms && GeometryEqual(geometry, o.geometry) &&
         prompt_length == o.prompt_length && position == o.position && tokens == o.tokens &&
         sampling_state == o.sampling_state && extents == o.extents && admission == o.admission &&
         prompt_block_hashes == o.prompt_block_hashes && BitsEqual(k_scales, o.k_scales) &&
         BitsEqual(v_scales, o.v_scales);
}

std::string EncodeHandoffTicket(const HandoffTicket& t) {
  OASIS_CHECK_LE(t.staging_address.size(), size_t{UINT16_MAX});
  OASIS_CHECK_LE(t.sampling_state.size(), size_t{UINT16_MAX});
  OASIS_CHECK_EQ(t.k_scales.size(), t.v_scales.size()) << "handoff ticket: K and V scales";
  size_t n = 4 + 2 + 2 + t.staging_address.size() + 8 + 8 + 4 + 9 * 4 + 4 + 4 + 4 +
             4 * t.tokens.size() + 2 + t.sampling_state.size() + 4 + 8 * t.extents.size();
  for (const auto& list : t.admission) n += 2 + 2 * list.size();
  n += 4 + 8 * t.prompt_block_hashes.size() + 4 + 8 * t.k_scales.size();
  std::string out;
  out.reserve(n);
  out.append(kTicketMagic, 4);
  AppendU16(out, kHandoffTicketVersion);
  AppendU16(out, static_cast<uint16_t>(t.staging_address.size()));
  out.append(t.staging_address);
  AppendU64(out, t.pool_id);
  AppendU64(out, t.lease_id);
  AppendU32(out, t.lease_ttl_ms);
  const StagedKvGeometry& g = t.geometry;
  for (uint32_t v : {g.num_layers, g.num_kv_heads, g.head_dim, g.dtype_bytes, g.num_blocks,
                     g.draft_kv_heads, g.draft_head_dim, g.kv_dtype, g.draft_dtype_bytes}) {
    AppendU32(out, v);
  }
  AppendU32(out, t.prompt_length);
  AppendU32(out, t.position);
  AppendU32(out, static_cast<uint32_t>(t.tokens.size()));
  for (uint32_t tok : t.tokens) AppendU32(out, tok);
  AppendU16(out, static_cast<uint16_t>(t.sampling_state.size()));
  out.append(t.sampling_state);
  out.append(EncodeSlotExtents(t.extents));
  for (const auto& list : t.admission) {
    OASIS_CHECK_LE(list.size(), size_t{UINT16_MAX});
    AppendU16(out, static_cast<uint16_t>(list.size()));
    for (uint16_t id : list) AppendU16(out, id);
  }
  AppendU32(out, static_cast<uint32_t>(t.prompt_block_hashes.size()));
  for (uint64_t h : t.prompt_block_hashes) AppendU64(out, h);
  AppendU32(out, static_cast<uint32_t>(t.k_scales.size()));
  for (const auto* scales : {&t.k_scales, &t.v_scales}) {
    for (float f : *scales) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      AppendU32(out, bits);
    }
  }
  return out;
}

StatusOr<HandoffTicket> ParseHandoffTicket(std::string_view bytes) {
  Reader r(bytes);
  HandoffTicket t;

  OASIS_ASSIGN_OR_RETURN(std::string_view magic, r.Bytes(4, "magic"));
  if (magic != std::string_view(kTicketMagic, 4)) {
    return Bad("magic: not \"OKHT\" (not an OasisKV handoff ticket)");
  }
  OASIS_ASSIGN_OR_RETURN(uint16_t version, r.U16("version"));
  if (version != kHandoffTicketVersion) {
    return Bad("version: " + std::to_string(version) + ", this build reads version " +
               std::to_string(kHandoffTicketVersion) +
               " (run the same OasisKV build on the prefill and decode instances)");
  }

  OASIS_ASSIGN_OR_RETURN(uint16_t address_len, r.U16("staging address length"));
  OASIS_ASSIGN_OR_RETURN(std::string_view address, r.Bytes(address_len, "staging address"));
  OASIS_RETURN_IF_ERROR(CheckAddress(address));
  t.staging_address.assign(address);

  OASIS_ASSIGN_OR_RETURN(t.pool_id, r.U64("pool id"));
  OASIS_ASSIGN_OR_RETURN(t.lease_id, r.U64("lease id"));
  OASIS_ASSIGN_OR_RETURN(t.lease_ttl_ms, r.U32("lease TTL"));
  if (t.lease_ttl_ms == 0) return Bad("lease TTL: 0 ms");

  StagedKvGeometry& g = t.geometry;
  OASIS_ASSIGN_OR_RETURN(g.num_layers, r.U32("geometry layers"));
  OASIS_ASSIGN_OR_RETURN(g.num_kv_heads, r.U32("geometry KV heads"));
  OASIS_ASSIGN_OR_RETURN(g.head_dim, r.U32("geometry head_dim"));
  OASIS_ASSIGN_OR_RETURN(g.dtype_bytes, r.U32("geometry dtype bytes"));
  OASIS_ASSIGN_OR_RETURN(g.num_blocks, r.U32("geometry blocks"));
  OASIS_ASSIGN_OR_RETURN(g.draft_kv_heads, r.U32("geometry draft KV heads"));
  OASIS_ASSIGN_OR_RETURN(g.draft_head_dim, r.U32("geometry draft head_dim"));
  OASIS_ASSIGN_OR_RETURN(g.kv_dtype, r.U32("geometry KV dtype"));
  OASIS_ASSIGN_OR_RETURN(g.draft_dtype_bytes, r.U32("geometry draft dtype bytes"));
  if (g.num_blocks > kMaxTicketBlocks) {
    return Bad("geometry blocks: " + std::to_string(g.num_blocks) + ", at most " +
               std::to_string(kMaxTicketBlocks) + " (admission ids are u16)");
  }
  // StagedKvLayout::Create bounds each size (head_dim, dtype, layers, heads) before it
  // multiplies them, so the products below fit 64 bits and a slot fits a wire block.
  static_assert(uint64_t{kStagedBlockTokens} * kMaxStagedHeadDim * 4 <= kMaxBlockBytes);
  auto layout = StagedKvLayout::Create(g);
  if (!layout.ok()) return Bad("geometry: " + layout.status().message());
  const uint64_t num_lists = uint64_t{g.num_layers} * g.num_kv_heads;
  if (num_lists > uint64_t{UINT32_MAX}) {
    return Bad("geometry layers × KV heads: " + std::to_string(num_lists) + ", too many");
  }

  OASIS_ASSIGN_OR_RETURN(t.prompt_length, r.U32("prompt length"));
  if (t.prompt_length == 0) return Bad("prompt length: 0");
  const uint64_t want_blocks =
      (uint64_t{t.prompt_length} + 1 + kStagedBlockTokens - 1) / kStagedBlockTokens;
  if (g.num_blocks != want_blocks) {
    return Bad("geometry blocks: " + std::to_string(g.num_blocks) + " for prompt length " +
               std::to_string(t.prompt_length) + ", which stages " + std::to_string(want_blocks) +
               " blocks (ceil((P + 1) / 16))");
  }
  OASIS_ASSIGN_OR_RETURN(t.position, r.U32("position"));
  if (uint64_t{t.position} != uint64_t{t.prompt_length} + 1) {
    return Bad("position: " + std::to_string(t.position) + ", x2 of a prompt of length " +
               std::to_string(t.prompt_length) + " is at " +
               std::to_string(uint64_t{t.prompt_length} + 1));
  }

  OASIS_ASSIGN_OR_RETURN(uint32_t num_tokens, r.U32("token count"));
  if (num_tokens != TicketTokenCount(g)) {
    return Bad("token count: " + std::to_string(num_tokens) + ", a ticket " +
               (g.draft_kv_heads > 0 ? "with" : "without") + " a draft head carries " +
               std::to_string(TicketTokenCount(g)) + " (x1, x2" +
               (g.draft_kv_heads > 0 ? ", x̂3)" : ")"));
  }
  t.tokens.resize(num_tokens);
  for (uint32_t& tok : t.tokens) {
    OASIS_ASSIGN_OR_RETURN(tok, r.U32("tokens"));
  }

  OASIS_ASSIGN_OR_RETURN(uint16_t sampling_len, r.U16("sampling state length"));
  if (sampling_len > kMaxSamplingStateBytes) {
    return Bad("sampling state: " + std::to_string(sampling_len) + " bytes, at most " +
               std::to_string(kMaxSamplingStateBytes));
  }
  OASIS_ASSIGN_OR_RETURN(std::string_view sampling, r.Bytes(sampling_len, "sampling state"));
  t.sampling_state.assign(sampling);

  // Slot extents: u32 count, then count × 8 bytes; ParseSlotExtents wants exactly its bytes.
  OASIS_RETURN_IF_ERROR(r.Need(4, "slot extents"));
  const size_t extents_at = r.pos();
  OASIS_ASSIGN_OR_RETURN(uint32_t num_extents, r.U32("slot extents"));
  if (num_extents > kMaxExtentsPerList) {
    return Bad("slot extents: " + std::to_string(num_extents) + " extents, at most " +
               std::to_string(kMaxExtentsPerList));
  }
  OASIS_RETURN_IF_ERROR(r.Bytes(8 * size_t{num_extents}, "slot extents").status());
  auto extents =
      ParseSlotExtents(bytes.substr(extents_at, 4 + 8 * size_t{num_extents}), kMaxBlocks);
  if (!extents.ok()) return Bad(extents.status().message());
  t.extents = std::move(*extents);
  uint64_t total = 0;
  for (const SlotExtent& e : t.extents) total += e.count;  // ≤ 2^20 × 2^31: no overflow
  if (total != layout->num_slots()) {
    return Bad("slot extents: " + std::to_string(total) + " slots, the geometry's layout has " +
               std::to_string(layout->num_slots()));
  }
  {
    std::vector<SlotExtent> sorted = t.extents;
    std::sort(sorted.begin(), sorted.end(),
              [](const SlotExtent& a, const SlotExtent& b) { return a.start < b.start; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (uint64_t{sorted[i - 1].start} + sorted[i - 1].count > sorted[i].start) {
        return Bad("slot extents: [" + std::to_string(sorted[i - 1].start) + ", +" +
                   std::to_string(sorted[i - 1].count) + ") and [" +
                   std::to_string(sorted[i].start) + ", +" + std::to_string(sorted[i].count) +
                   ") overlap");
      }
    }
  }

  // Admission lists: exactly layers × heads of them, each at least its 2-byte count.
  if (num_lists > r.left() / 2) {
    return Bad("admission lists: truncated (the geometry has " + std::to_string(num_lists) +
               " lists of at least 2 bytes, " + std::to_string(r.left()) + " bytes left)");
  }
  t.admission.resize(num_lists);
  std::vector<uint32_t> seen_in(g.num_blocks, 0);  // 1 + index of the last list naming a block
  for (uint64_t i = 0; i < num_lists; ++i) {
    const uint64_t l = i / g.num_kv_heads, h = i % g.num_kv_heads;
    auto name = [&] {
      return "admission list (" + std::to_string(l) + ", " + std::to_string(h) + ")";
    };
    auto count = r.U16("admission list count");
    if (!count.ok()) return Bad(name() + ": truncated count");
    auto ids = r.Bytes(2 * size_t{*count}, "admission list");
    if (!ids.ok()) {
      return Bad(name() + ": " + std::to_string(*count) + " ids run past the end (" +
                 std::to_string(r.left()) + " bytes left)");
    }
    std::vector<uint16_t>& list = t.admission[i];
    list.resize(*count);
    for (size_t j = 0; j < *count; ++j) {
      const uint16_t id = LoadU16(ids->data() + 2 * j);
      if (id >= g.num_blocks) {
        return Bad(name() + ": block id " + std::to_string(id) + " not below the geometry's " +
                   std::to_string(g.num_blocks) + " blocks");
      }
      if (seen_in[id] == i + 1) {
        return Bad(name() + ": block id " + std::to_string(id) + " twice");
      }
      seen_in[id] = static_cast<uint32_t>(i + 1);
      list[j] = id;
    }
  }
  // The prompt's full blocks' hashes: exactly P / 16.
  auto hashes = r.U32("prompt block hashes count");
  if (!hashes.ok()) return Bad("prompt block hashes: truncated count");
  if (*hashes != t.prompt_length / kStagedBlockTokens) {
    return Bad("prompt block hashes: " + std::to_string(*hashes) + " for prompt length " +
               std::to_string(t.prompt_length) +
               " (its full blocks: " + std::to_string(t.prompt_length / kStagedBlockTokens) + ")");
  }
  auto hash_bytes = r.Bytes(8 * size_t{*hashes}, "prompt block hashes");
  if (!hash_bytes.ok()) {
    return Bad("prompt block hashes: " + std::to_string(*hashes) + " run past the end (" +
               std::to_string(r.left()) + " bytes left)");
  }
  t.prompt_block_hashes.resize(*hashes);
  for (size_t i = 0; i < *hashes; ++i)
    t.prompt_block_hashes[i] = LoadU64(hash_bytes->data() + 8 * i);
  // The KV scales: layers × heads of each for an FP8 KV dtype, none otherwise.
  auto scales = r.U32("KV scales count");
  if (!scales.ok()) return Bad("KV scales: truncated count");
  const bool fp8 = g.kv_dtype == static_cast<uint32_t>(StagedKvDtype::kF8E4M3);
  if (*scales != (fp8 ? num_lists : 0)) {
    return Bad("KV scales: " + std::to_string(*scales) + " for a " + StagedKvDtypeName(g.kv_dtype) +
               " KV dtype of " + std::to_string(num_lists) + " (layer, KV head) pairs (" +
               (fp8 ? "one K and one V scale each" : "none") + ")");
  }
  auto scale_bytes = r.Bytes(8 * size_t{*scales}, "KV scales");
  if (!scale_bytes.ok()) {
    return Bad("KV scales: " + std::to_string(*scales) + " K and V scales run past the end (" +
               std::to_string(r.left()) + " bytes left)");
  }
  for (int kv = 0; kv < 2; ++kv) {
    std::vector<float>& out = kv == 0 ? t.k_scales : t.v_scales;
    out.resize(*scales);
    for (size_t i = 0; i < *scales; ++i) {
      const uint32_t bits = LoadU32(scale_bytes->data() + 4 * (kv * size_t{*scales} + i));
      std::memcpy(&out[i], &bits, 4);
      if (!std::isfinite(out[i]) || !(out[i] > 0)) {
        return Bad("KV scales: the " + std::string(kv == 0 ? "K" : "V") + " scale of (layer " +
                   std::to_string(i / g.num_kv_heads) + ", KV head " +
                   std::to_string(i % g.num_kv_heads) + ") is " + std::to_string(out[i]) +
                   ", not finite and positive");
      }
    }
  }
  if (r.left() != 0) {
    return Bad("trailing bytes: " + std::to_string(r.left()) + " after the KV scales");
  }
  return t;
}

Status CheckTicketForDecode(const HandoffTicket& t, const DecodeSideModel& m) {
  const auto mismatch = [](const std::string& what, uint64_t ticket, uint64_t model) {
    return InvalidArgument("handoff ticket for this model: " + what + " differs (ticket " +
                           std::to_string(ticket) + ", model " + std::to_string(model) + ")");
  };
  const StagedKvGeometry& g = t.geometry;
  const StagedKvGeometry& e = m.geometry;
  if (g.kv_dtype != e.kv_dtype) {
    return InvalidArgument(
        "handoff ticket for this model: KV cache dtype differs (ticket " +
        StagedKvDtypeName(g.kv_dtype) + ", this instance " + StagedKvDtypeName(e.kv_dtype) +
        "): the prefill and decode instances of a pair need the same --kv-cache-dtype");
  }
  if (g.num_layers != e.num_layers) return mismatch("staged layers", g.num_layers, e.num_layers);
  if (g.num_kv_heads != e.num_kv_heads) return mismatch("KV heads", g.num_kv_heads, e.num_kv_heads);
  if (g.head_dim != e.head_dim) return mismatch("head_dim", g.head_dim, e.head_dim);
  if (g.dtype_bytes != e.dtype_bytes) return mismatch("dtype bytes", g.dtype_bytes, e.dtype_bytes);
  if (g.draft_kv_heads != e.draft_kv_heads)
    return mismatch("draft head KV heads", g.draft_kv_heads, e.draft_kv_heads);
  if (g.draft_kv_heads > 0 && g.draft_head_dim != e.draft_head_dim) {
    return mismatch("draft head_dim", g.draft_head_dim, e.draft_head_dim);
  }
  if (g.draft_kv_heads > 0 && g.draft_dtype_bytes != e.draft_dtype_bytes) {
    return mismatch("draft dtype bytes", g.draft_dtype_bytes, e.draft_dtype_bytes);
  }
  if (m.pool_id != 0 && t.pool_id != m.pool_id)
    return mismatch("staging pool id", t.pool_id, m.pool_id);
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    if (m.vocab_size != 0 && t.tokens[i] >= m.vocab_size) {
      static constexpr const char* kNames[] = {"x1", "x2", "draft x3"};
      return InvalidArgument("handoff ticket for this model: token " +
                             std::string(kNames[i < 3 ? i : 2]) + " = " +
                             std::to_string(t.tokens[i]) + " is outside the vocabulary of " +
                             std::to_string(m.vocab_size));
    }
  }
  if (m.max_context != 0 && uint64_t{t.prompt_length} + 2 > m.max_context) {
    return InvalidArgument(
        "handoff ticket for this model: a prompt of " + std::to_string(t.prompt_length) +
        " tokens leaves no room to decode in a context of " + std::to_string(m.max_context));
  }
  const auto tail = static_cast<uint16_t>(g.num_blocks - 1);
  const uint64_t max_list = m.topk_blocks == 0 ? UINT64_MAX : 2ull * m.topk_blocks + 1;
  for (size_t i = 0; i < t.admission.size(); ++i) {
    const auto& list = t.admission[i];
    const std::string where = "(layer " + std::to_string(i / g.num_kv_heads) + ", KV head " +
                              std::to_string(i % g.num_kv_heads) + ")";
    if (std::find(list.begin(), list.end(), tail) == list.end()) {
      return InvalidArgument("handoff ticket for this model: the admission list of " + where +
                             " lacks the tail block " + std::to_string(tail));
    }
    if (list.size() > max_list) {
      return InvalidArgument("handoff ticket for this model: the admission list of " + where +
                             " holds " + std::to_string(list.size()) +
                             " blocks, more than 2K + 1 = " + std::to_string(max_list));
    }
  }
  return Status::Ok();
}

}  // namespace oasis::disagg
