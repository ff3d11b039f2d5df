// msgpack_json.h on msgpack-c: a JSON value packed into an sbuffer, an unpacked msgpack object
// tree walked into a JSON value. Invariant: nothing is allocated for a container the bytes could not
// hold (msgpack-c would allocate a declared array's slots before reading them).
#include "msgpack_json.h"

#include <msgpack.h>

#include <cmath>
#include <memory>

namespace troupe::envs {

using json = nlohmann::json;

namespace {

void pack(msgpack_packer& pk, const json& j) {
  switch (j.type()) {
    case json::value_t::null: msgpack_pack_nil(&pk); break;
    case json::value_t::boolean:
      if (j.get<bool>()) msgpack_pack_true(&pk);
      else msgpack_pack_false(&pk);
      break;
    case json::value_t::number_integer: msgpack_pack_int64(&pk, j.get<int64_t>()); break;
    case json::value_t::number_unsigned: msgpack_pack_uint64(&pk, j.get<uint64_t>()); break;
    case json::value_t::number_float: msgpack_pack_double(&pk, j.get<double>()); break;
    case json::value_t::string: {
      const auto& s = j.get_ref<const std::string&>();
      msgpack_pack_str(&pk, s.size());
      msgpack_pack_str_body(&pk, s.data(), s.size());
      break;
    }
    case json::value_t::binary: {
      const auto& b = j.get_binary();
      msgpack_pack_bin(&pk, b.size());
      msgpack_pack_bin_body(&pk, b.data(), b.size());
      break;
    }
    case json::value_t::array:
      msgpack_pack_array(&pk, j.size());
      for (const auto& x : j) pack(pk, x);
      break;
    case json::value_t::object:
      msgpack_pack_map(&pk, j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        msgpack_pack_str(&pk, it.key().size());
        msgpack_pack_str_body(&pk, it.key().data(), it.key().size());
        pack(pk, it.value());
      }
      break;
    case json::value_t::discarded: msgpack_pack_nil(&pk); break;
  }
}

Result<json> to_json(const msgpack_object& o, const std::string& where, int depth) {
  if (depth > 256) return invalid_input("msgpack: nested deeper than 256 levels at " + where);
  switch (o.type) {
    case MSGPACK_OBJECT_NIL: return json(nullptr);
    case MSGPACK_OBJECT_BOOLEAN: return json(o.via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return json(o.via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json(o.via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
      if (!std::isfinite(o.via.f64)) return invalid_input("msgpack: a non-finite number at " + where);
      return json(o.via.f64);
    case MSGPACK_OBJECT_STR: return json(std::string(o.via.str.ptr, o.via.str.size));
    case MSGPACK_OBJECT_BIN: return json(std::string(o.via.bin.ptr, o.via.bin.size));
    case MSGPACK_OBJECT_ARRAY: {
      json a = json::array();
      for (uint32_t i = 0; i < o.via.array.size; ++i) {
        TROUPE_ASSIGN_OR_RETURN(json x, to_json(o.via.array.ptr[i], where + "[" + std::to_string(i) + "]", depth + 1));
        a.push_back(std::move(x));
      }
      return a;
    }
    case MSGPACK_OBJECT_MAP: {
      json m = json::object();
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack_object_kv& kv = o.via.map.ptr[i];
        std::string key;  // integer keys (e.g. node indices) become their decimal text
        if (kv.key.type == MSGPACK_OBJECT_STR) key.assign(kv.key.via.str.ptr, kv.key.via.str.size);
        else if (kv.key.type == MSGPACK_OBJECT_POSITIVE_INTEGER) key = std::to_string(kv.key.via.u64);
        else if (kv.key.type == MSGPACK_OBJECT_NEGATIVE_INTEGER) key = std::to_string(kv.key.via.i64);
        else return invalid_input("msgpack: a map key that is neither a string nor an integer at " + where);
        TROUPE_ASSIGN_OR_RETURN(json x, to_json(kv.val, where + "." + key, depth + 1));
        m[key] = std::move(x);
      }
      return m;
    }
    default: return invalid_input("msgpack: an extension type at " + where);
  }
}

}  // namespace

std::string json_to_msgpack(const json& j) {
  msgpack_sbuffer buf;
  msgpack_sbuffer_init(&buf);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &buf, msgpack_sbuffer_write);
  pack(pk, j);
  std::string out(buf.data, buf.size);
  msgpack_sbuffer_destroy(&buf);
  return out;
}

namespace {

uint64_t big_endian(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v = (v << 8) | p[k];
  return v;
}

// Walks the headers of one msgpack value: every array or map must declare no more elements than
// bytes remain (each element takes at least one), every str/bin/ext no more bytes. Truncation is
// left to the unpacker (which then reports it).
Status check_declared_sizes(const uint8_t* p, size_t size) {
  uint64_t pending = 1;  // values still to read
  size_t at = 0;
  while (pending > 0 && at < size) {
    const uint8_t t = p[at++];
    --pending;
    uint64_t items = 0, bytes = 0;
    int len_bytes = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) continue;   // fixint, nil, bool
    if ((t & 0xf0) == 0x80) items = 2u * (t & 0x0f);                                // fixmap
    else if ((t & 0xf0) == 0x90) items = t & 0x0f;                                  // fixarray
    else if ((t & 0xe0) == 0xa0) bytes = t & 0x1f;                                  // fixstr
    else if (t == 0xc4 || t == 0xd9) len_bytes = 1;                                 // bin8, str8
    else if (t == 0xc5 || t == 0xda || t == 0xdc || t == 0xde) len_bytes = 2;       // bin16, str16, array16, map16
    else if (t == 0xc6 || t == 0xdb || t == 0xdd || t == 0xdf) len_bytes = 4;       // bin32, str32, array32, map32
    else if (t >= 0xc7 && t <= 0xc9) len_bytes = t == 0xc7 ? 1 : t == 0xc8 ? 2 : 4, bytes = 1;  // ext8/16/32: + type
    else if (t == 0xca || t == 0xce || t == 0xd2) bytes = 4;                        // float32, uint32, int32
    else if (t == 0xcb || t == 0xcf || t == 0xd3) bytes = 8;
    else if (t == 0xcc || t == 0xd0) bytes = 1;
    else if (t == 0xcd || t == 0xd1) bytes = 2;
    else if (t >= 0xd4 && t <= 0xd8) bytes = 1 + (uint64_t{1} << (t - 0xd4));       // fixext 1..16: + type
    else return invalid_input("msgpack: byte " + std::to_string(t) + " is no msgpack type");
    if (len_bytes > 0) {
      if (size - at < static_cast<size_t>(len_bytes)) return {};
      const uint64_t n = big_endian(p + at, len_bytes);
      at += static_cast<size_t>(len_bytes);
      if (t == 0xdc || t == 0xdd) items = n;
      else if (t == 0xde || t == 0xdf) items = 2 * n;
      else bytes += n;
    }
    if (items > size - at || pending + items > size - at)
      return invalid_input("msgpack: a container declares " + std::to_string(items) + " values with " +
                           std::to_string(size - at) + " bytes left");
    if (bytes > size - at) return {};  // truncated: the unpacker says so
    pending += items;
    at += static_cast<size_t>(bytes);
  }
  return {};
}

}  // namespace

Result<json> msgpack_to_json(const void* data, size_t size) {
  TROUPE_TRY(check_declared_sizes(static_cast<const uint8_t*>(data), size));
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  const msgpack_unpack_return rc = msgpack_unpack_next(&u, static_cast<const char*>(data), size, &off);
  std::unique_ptr<msgpack_unpacked, void (*)(msgpack_unpacked*)> guard(&u, msgpack_unpacked_destroy);
  if (rc != MSGPACK_UNPACK_SUCCESS)
    return invalid_input(rc == MSGPACK_UNPACK_CONTINUE ? "msgpack: the message ends inside a value"
                                                       : "msgpack: not a msgpack value");
  if (off != size) return invalid_input("msgpack: " + std::to_string(size - off) + " bytes after the value");
  return to_json(u.data, "$", 0);
}

}  // namespace troupe::envs
