// The names an enum's values have in YAML, JSON and messages to users, declared once beside the
// enum (a specialization of EnumNames) and used both ways: the config schema parses a key into
// the enum with them, and code that must print or pass the name on uses enum_name().
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace troupe {

// Specialize with `static constexpr std::pair<std::string_view, E> table[] = {{"name", E::value}, ...};`
template <class E>
struct EnumNames;

template <class E, class = void>
inline constexpr bool has_enum_names = false;
template <class E>
inline constexpr bool has_enum_names<E, std::void_t<decltype(EnumNames<E>::table)>> = true;

template <class E>
constexpr std::string_view enum_name(E value) {
  for (const auto& [name, v] : EnumNames<E>::table)
    if (v == value) return name;
  return "?";
}

template <class E>
constexpr std::optional<E> enum_from_name(std::string_view name) {
  for (const auto& [n, v] : EnumNames<E>::table)
    if (n == name) return v;
  return std::nullopt;
}

// For messages: "the cpu device" etc. without a std::string(string_view) at every call.
template <class E>
std::string enum_string(E value) {
  return std::string(enum_name(value));
}

}  // namespace troupe
