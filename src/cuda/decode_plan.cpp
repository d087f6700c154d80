// decode.h's work plan for grouped decode attention: host code, the same in every build (a
// build without CUDA tests it too).
#include <algorithm>
#include <climits>
#include <map>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "cuda/decode.h"

namespace foundry::gpu::ops {

DecodePlan plan_attention_decode(const DecodeSpan* spans, const int64_t* first, int64_t rows,
                                 int64_t h, int64_t kvh, int64_t max_queries) {
  FOUNDRY_CHECK(kvh > 0 && h % kvh == 0 && rows >= 0 && rows < INT_MAX);
  const int64_t group = h / kvh;
  const int64_t part_rows = std::max<int64_t>(1, std::min(kDecodeGroupRows, max_queries / group));
  // Each level's groups, in the order of their first rows: the span (its longest length) and
  // the rows with their lengths.
  struct Group {
    DecodeSpan span;
    std::vector<int64_t> rows, lens;
  };
  std::vector<std::vector<Group>> levels;
  for (int64_t level = 0;; ++level) {
    std::vector<Group> groups;
    std::map<std::tuple<const float*, const float*, int64_t>, size_t> index;
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      if (first[r] + level >= first[r + 1]) continue;
      any = true;
      const DecodeSpan& s = spans[first[r] + level];
      FOUNDRY_CHECK(s.len >= 0 && s.len <= s.capacity && s.capacity < INT_MAX - kDecodeChunk);
      if (s.len == 0) continue;
      const auto [at, fresh] = index.try_emplace({s.k, s.v, s.capacity}, groups.size());
      if (fresh) groups.push_back({s, {}, {}});
      Group& grp = groups[at->second];
      grp.span.len = std::max(grp.span.len, s.len);
      grp.rows.push_back(r);
      grp.lens.push_back(s.len);
    }
    if (!any) break;
    levels.push_back(std::move(groups));
  }

  // Row r's slots: a level's chunks that its length reaches into, level by level.
  DecodePlan plan;
  std::vector<int64_t> next(rows + 1, 0);
  for (const std::vector<Group>& groups : levels)
    for (const Group& grp : groups)
      for (size_t m = 0; m < grp.rows.size(); ++m)
        next[grp.rows[m] + 1] += (grp.lens[m] + kDecodeChunk - 1) / kDecodeChunk;
  for (int64_t r = 0; r < rows; ++r) next[r + 1] += next[r];
  FOUNDRY_CHECK(next[rows] < INT_MAX);
  plan.slots.assign(next.begin(), next.end());

  std::vector<int64_t> reach;  // a chunk's rows: indices into its group's
  for (const std::vector<Group>& groups : levels)
    for (const Group& grp : groups)
      for (int64_t begin = 0; begin < grp.span.len; begin += kDecodeChunk) {
        reach.clear();
        for (size_t m = 0; m < grp.rows.size(); ++m)
          if (grp.lens[m] > begin) reach.push_back(static_cast<int64_t>(m));
        const int64_t n = static_cast<int64_t>(reach.size()),
                      parts = (n + part_rows - 1) / part_rows;
        for (int64_t part = 0; part < parts; ++part) {
          const int64_t lo = part * n / parts, hi = (part + 1) * n / parts;
          DecodeWork w{grp.span, static_cast<int32_t>(begin), static_cast<int32_t>(begin),
                       static_cast<int32_t>(plan.work_rows.size()), static_cast<int32_t>(hi - lo)};
          for (int64_t x = lo; x < hi; ++x) {
            const int64_t m = reach[x], r = grp.rows[m];
            const int64_t end = std::min(grp.lens[m], begin + kDecodeChunk);
            plan.work_rows.push_back({static_cast<int32_t>(r), static_cast<int32_t>(next[r]++),
                                      static_cast<int32_t>(end)});
            w.end = std::max(w.end, static_cast<int32_t>(end));
          }
          plan.work.push_back(w);
          plan.queries = std::max(plan.queries, (hi - lo) * group);
          FOUNDRY_CHECK(plan.work_rows.size() < INT_MAX);
        }
      }
  // The longest items first, so that the short ones fill in behind them.
  std::stable_sort(
      plan.work.begin(), plan.work.end(),
      [](const DecodeWork& a, const DecodeWork& b) { return a.end - a.begin > b.end - b.begin; });
  return plan;
}

int64_t attention_decode_partials(const DecodePlan& plan, int64_t h, int64_t d) {
  return int64_t{plan.slots.empty() ? 0 : plan.slots.back()} * h * (d + 2);
}

}  // namespace foundry::gpu::ops
