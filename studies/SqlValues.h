// Optional numbers in SQLite columns (NULL <-> nullopt), shared by the study store's tables.
#pragma once
#include <SQLiteCpp/SQLiteCpp.h>

#include <optional>

namespace bs::sql {

inline void bind_opt(SQLite::Statement& s, int i, const std::optional<double>& v) {
  if (v) s.bind(i, *v);
  else
    s.bind(i);
}
inline std::optional<double> opt(const SQLite::Column& c) {
  if (c.isNull()) return std::nullopt;
  return c.getDouble();
}

}  // namespace bs::sql
