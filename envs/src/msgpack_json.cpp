// msgpack_json.h on msgpack-c: a JSON value packed into an sbuffer, an unpacked msgpack object
// tree walked into a JSON value.
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

Result<json> msgpack_to_json(const void* data, size_t size) {
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
