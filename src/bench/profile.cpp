#include "bench/profile.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "base/format.h"
#include "base/io.h"
#include "bench/comm_bench.h"

namespace foundry {

namespace fs = std::filesystem;

namespace {

// The collective named as in profiles and bench comm ("all_reduce", ...), if it is one.
std::optional<CollectiveOp> find_op(const std::string& name) {
  for (CollectiveOp op : kAllCollectiveOps)
    if (op_name(op) == name) return op;
  return std::nullopt;
}

bool known_op(const std::string& op) { return find_op(op).has_value(); }

DType dtype_at(const std::string& s, const std::string& where) {
  if (const std::optional<DType> dtype = parse_dtype(s)) return *dtype;
  fail(fmt::format("{}: unknown dtype '{}'", where, s), "use \"bf16\" or \"fp32\"");
}

// A number at `key` of `obj` (null or absent -> `fallback`); anything else non-numeric fails.
double number(const json& obj, const std::string& key, const std::string& where,
              double fallback = 0) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number())
    fail(fmt::format("{}: '{}' must be a number, got {}", where, key, it->dump()),
         "fix the profile (SI units: FLOP/s, bytes/s, bytes, seconds)");
  double v = it->get<double>();
  if (!std::isfinite(v) || v < 0)
    fail(fmt::format("{}: '{}' = {} must be finite and >= 0", where, key, v),
         "fix the profile");
  return v;
}

constexpr char kProfileHint[] = "fix the profile (docs/formats.md, \"Hardware profile\")";

// The value at `key` of `obj`: none where it is absent or null; a failure, naming `what` it
// must be, where `is` says it is of another type.
const json* value_at(const json& obj, const std::string& key, const std::string& where,
                     bool (json::*is)() const noexcept, const char* what) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  if (!((*it).*is)())
    fail(fmt::format("{}: '{}' must be {}, got {}", where, key, what, it->dump()), kProfileHint);
  return &*it;
}

// The object at `key` of `obj` (an empty one where it is absent or null).
const json& object_at(const json& obj, const std::string& key, const std::string& where) {
  static const json kEmpty = json::object();
  const json* v = value_at(obj, key, where, &json::is_object, "an object");
  return v ? *v : kEmpty;
}

// The array at `key` of `obj`, of objects (an empty one where it is absent or null).
const json& objects_at(const json& obj, const std::string& key, const std::string& where) {
  static const json kEmpty = json::array();
  const json* v = value_at(obj, key, where, &json::is_array, "an array");
  if (!v) return kEmpty;
  for (const json& item : *v)
    if (!item.is_object())
      fail(
          fmt::format("{}: every entry of '{}' must be an object, got {}", where, key, item.dump()),
          kProfileHint);
  return *v;
}

// The string at `key` of `obj` (`fallback` where it is absent or null).
std::string text_at(const json& obj, const std::string& key, const std::string& where,
                    const std::string& fallback = "") {
  const json* v = value_at(obj, key, where, &json::is_string, "a string");
  return v ? v->get<std::string>() : fallback;
}

// A number `obj` must have.
double required_number(const json& obj, const std::string& key, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null())
    fail(fmt::format("{}: '{}' is missing", where, key),
         "fix the profile, or measure it again with foundry bench");
  return number(obj, key, where);
}

PeakCompute parse_peak(const json& compute, const char* dtype, const std::string& where) {
  PeakCompute p;
  const json& peak = object_at(compute, dtype, where + ": compute");
  const std::string w = fmt::format("{}: compute.{}", where, dtype);
  p.spec_flops_per_s = number(peak, "spec_flops_per_s", w);
  p.measured_flops_per_s = number(peak, "measured_flops_per_s", w);
  return p;
}

// Largest power of two (up to 1024) dividing x.
int64_t pow2_divisor(int64_t x) {
  int64_t d = 1;
  while (d < 1024 && x % (d * 2) == 0) d *= 2;
  return d;
}

// Alignment factors measured by the off-size scan: each off-size point's rate relative to
// the best rate of its scan, grouped by the power of two its inner dimensions share.
std::vector<AlignmentFactor> alignment_from_offsize(const std::vector<GemmPoint>& offsize) {
  std::vector<AlignmentFactor> out;
  if (offsize.empty()) return out;
  for (DType dtype : {DType::bf16, DType::f32}) {
    double best = 0;
    for (const auto& p : offsize)
      if (p.dtype == dtype) best = std::max(best, p.flops_per_s);
    if (best <= 0) continue;
    for (int64_t multiple : {64, 32, 16, 8, 4, 2, 1}) {
      double sum = 0;
      int count = 0;
      for (const auto& p : offsize) {
        if (p.dtype != dtype) continue;
        const int64_t a = std::min({pow2_divisor(p.n), pow2_divisor(p.k), int64_t{64}});
        if (a != multiple) continue;
        sum += p.flops_per_s / best;
        ++count;
      }
      if (count == 0) continue;
      // bf16 and fp32 both measured: keep the lower (more cautious) factor per multiple.
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const AlignmentFactor& a) { return a.multiple == multiple; });
      const double f = std::min(1.0, sum / count);
      if (it == out.end()) out.push_back({multiple, f});
      else it->factor = std::min(it->factor, f);
    }
  }
  std::sort(out.begin(), out.end(), [](const AlignmentFactor& a, const AlignmentFactor& b) {
    return a.multiple > b.multiple;
  });
  // Factors must not rise as alignment falls (noise in the scan could say otherwise).
  for (size_t i = 1; i < out.size(); ++i)
    out[i].factor = std::min(out[i].factor, out[i - 1].factor);
  if (!out.empty()) {
    const double top = out.front().factor;  // relative to the best-aligned points
    for (auto& a : out) a.factor /= top;
  }
  return out;
}

std::string exe_dir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.parent_path().string();
}

}  // namespace

double busbw_factor(const std::string& op, int64_t ranks) {
  if (auto known = find_op(op)) return busbw_factor(*known, static_cast<int>(ranks));
  fail(fmt::format("unknown collective '{}'", op),
       "use all_reduce, reduce_scatter, all_gather, broadcast or all_to_all");
}

double HardwareProfile::max_gemm_rate(DType dtype) const {
  const PeakCompute& p = peak(dtype);
  return p.measured_flops_per_s > 0 ? p.measured_flops_per_s : p.spec_flops_per_s;
}

double HardwareProfile::alignment_factor(int64_t n, int64_t k) const {
  const int64_t x = std::min(pow2_divisor(n), pow2_divisor(k));
  for (const auto& a : alignment)  // largest multiple first
    if (x >= a.multiple) return a.factor;
  return alignment.empty() ? 1.0 : alignment.back().factor;
}

namespace {

// Inverse-distance weighting over the 4 nearest points of `dtype` (and of the decode kind or
// not) in log space, of their rates over `best`; an exact match returns its own. -1 when no
// point qualifies.
double nearest_efficiency(const std::vector<GemmPoint>& points, DType dtype, bool decode,
                          int64_t m, int64_t n, int64_t k, double best) {
  struct Near {
    double d2, eff;
  };
  std::vector<Near> near;
  const double lm = std::log2(double(m)), ln = std::log2(double(n)), lk = std::log2(double(k));
  for (const auto& p : points) {
    if (p.dtype != dtype || (p.kind == "decode") != decode) continue;
    const double dm = lm - std::log2(double(p.m)), dn = ln - std::log2(double(p.n)),
                 dk = lk - std::log2(double(p.k));
    near.push_back({dm * dm + dn * dn + dk * dk, p.flops_per_s / best});
  }
  if (near.empty()) return -1;
  const size_t keep = std::min<size_t>(4, near.size());
  std::partial_sort(near.begin(), near.begin() + keep, near.end(),
                    [](const Near& a, const Near& b) { return a.d2 < b.d2; });
  double wsum = 0, esum = 0;
  for (size_t i = 0; i < keep; ++i) {
    if (near[i].d2 < 1e-12) return near[i].eff;
    const double w = 1.0 / near[i].d2;
    wsum += w;
    esum += w * near[i].eff;
  }
  return esum / wsum;
}

}  // namespace

double HardwareProfile::gemm_rate(DType dtype, int64_t m, int64_t n, int64_t k,
                                  bool roofline) const {
  const double best = max_gemm_rate(dtype);
  FOUNDRY_CHECK(best > 0 && m > 0 && n > 0 && k > 0);
  double efficiency = 1.0;
  if (gemm_half_efficiency_flops > 0) {
    const double w = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    efficiency = w / (w + gemm_half_efficiency_flops);
  } else {
    const double near = nearest_efficiency(gemm_points, dtype, false, m, n, k, best);
    efficiency = near < 0 ? 1.0 : std::min(1.0, near);
  }
  double rate = best * efficiency * alignment_factor(n, k);
  // Roofline: a GEMM cannot outrun the memory traffic of its operands (A and B in the
  // input type, C in fp32), which bounds small-M shapes such as decoding.
  const double bw = memory_bandwidth();
  if (roofline && bw > 0) {
    const double in = dtype == DType::bf16 ? 2.0 : 4.0;
    const double bytes =
        (double(m) * double(k) + double(k) * double(n)) * in + double(m) * double(n) * 4.0;
    rate = std::min(rate, 2.0 * double(m) * double(n) * double(k) / bytes * bw);
  }
  return rate;
}

double HardwareProfile::decode_gemm_rate(DType dtype, int64_t m, int64_t n, int64_t k) const {
  const double best = max_gemm_rate(dtype);
  FOUNDRY_CHECK(best > 0 && m > 0 && n > 0 && k > 0);
  const double near = nearest_efficiency(gemm_points, dtype, true, m, n, k, best);
  return near < 0 ? 0.0 : best * near;
}

double HardwareProfile::memory_bandwidth() const {
  return memory_measured_bytes_per_s > 0 ? memory_measured_bytes_per_s : memory_spec_bytes_per_s;
}

void HardwareProfile::require_memory_bandwidth(const std::string& use) const {
  if (memory_bandwidth() > 0) return;
  fail(fmt::format("profile {} has no memory bandwidth (memory.measured_bytes_per_s or "
                   "memory.spec_bytes_per_s), which {} needs",
                   path.empty() ? name : path, use),
       fmt::format("measure it with `foundry bench membw --profile {}`, or use `foundry bench "
                   "all`, which measures everything a plan reads",
                   path.empty() ? "FILE" : path));
}

const CollectiveFit& HardwareProfile::collective(const std::string& op, int64_t ranks) const {
  // At equal rank counts: NCCL's fit on a GPU, the library's default choice on a CPU.
  const std::string preferred = kind == "gpu" ? "nccl" : "default";
  const CollectiveFit* below = nullptr;
  const CollectiveFit* above = nullptr;
  for (const auto& c : collectives) {
    if (c.op != op) continue;
    if (c.ranks <= ranks) {
      if (!below || c.ranks > below->ranks ||
          (c.ranks == below->ranks && c.algorithm == preferred))
        below = &c;
    } else if (!above || c.ranks < above->ranks ||
               (c.ranks == above->ranks && c.algorithm == preferred)) {
      above = &c;
    }
  }
  if (below) return *below;
  if (above) return *above;
  fail(
      fmt::format("profile {} has no '{}' collective measurements", path.empty() ? name : path, op),
      "measure them with `mpirun -np N foundry bench comm --profile FILE`, or pick a profile "
      "that has them");
}

double HardwareProfile::collective_time(const std::string& op, int64_t ranks, double bytes) const {
  if (ranks <= 1 || bytes <= 0) return 0;
  const CollectiveFit& fit = collective(op, ranks);
  if (fit.max_bytes > 0 && bytes > 2 * fit.max_bytes) {
    auto& [asked, measured] = beyond_measured[{op, fit.ranks}];
    asked = std::max(asked, bytes);
    measured = fit.max_bytes;
  }
  // busbw = algbw · factor(n) is what stays constant across n for bandwidth-optimal
  // algorithms, so the algorithm bandwidth at n is busbw / factor(n).
  const double bus = fit.beta_bytes_per_s * busbw_factor(op, std::max<int64_t>(fit.ranks, 2));
  const double beta = bus / busbw_factor(op, ranks);
  return fit.alpha_s + bytes / beta;
}

std::string HardwareProfile::notes_on_extrapolation() const {
  std::string out;
  for (const auto& [fit, sizes] : beyond_measured)
    out += fmt::format(
        "note: {}'s fit at {} ranks in {} was measured up to {} and is stretched to messages of "
        "{} ({:.0f}x): "
        "measure larger ones with `mpirun -np N foundry bench comm -e SIZE --profile {}`\n",
        fit.first, fit.second, path.empty() ? name : path,
        format_bytes(sizes.second, 1, Zeros::trim), format_bytes(sizes.first, 1, Zeros::trim),
        sizes.first / sizes.second, path.empty() ? "FILE" : path);
  return out;
}

namespace {

// The "gemm" section: the best rates (where "compute" left them unset), the measured points
// (the off-size scan's apart, in `offsize`), the efficiency model, grouped expert GEMMs and the
// alignment factors.
void read_gemm_section(const json& g, const std::string& where, HardwareProfile& p,
                       std::vector<GemmPoint>& offsize) {
  const std::string w = where + ": gemm";
  {
    const json& b = object_at(g, "best_flops_per_s", w);
    if (p.bf16.measured_flops_per_s == 0) p.bf16.measured_flops_per_s = number(b, "bf16", w);
    if (p.fp32.measured_flops_per_s == 0) p.fp32.measured_flops_per_s = number(b, "fp32", w);
  }
  for (const auto& pt : objects_at(g, "points", w)) {
    GemmPoint gp;
    gp.dtype = dtype_at(text_at(pt, "dtype", w + ".points", "bf16"), w);
    gp.m = static_cast<int64_t>(number(pt, "m", w));
    gp.n = static_cast<int64_t>(number(pt, "n", w));
    gp.k = static_cast<int64_t>(number(pt, "k", w));
    gp.flops_per_s = number(pt, "flops_per_s", w);
    gp.kind = text_at(pt, "kind", w + ".points");
    if (gp.m < 1 || gp.n < 1 || gp.k < 1 || gp.flops_per_s <= 0)
      fail(fmt::format("{}: point {} has a zero dimension or rate", w, pt.dump()),
           "fix or remove the point");
    (gp.kind == "offsize" ? offsize : p.gemm_points).push_back(gp);
  }
  if (g.contains("efficiency_model")) {
    const json& m = object_at(g, "efficiency_model", w);
    const std::string kind = text_at(m, "kind", w + ".efficiency_model");
    if (kind != "saturation")
      fail(fmt::format("{}: efficiency_model.kind = \"{}\"", w, kind),
           "the only model is \"saturation\" (rate = best · W/(W + half_efficiency_flops))");
    p.gemm_half_efficiency_flops = number(m, "half_efficiency_flops", w + ".efficiency_model");
  }
  if (g.contains("grouped_expert_gemms")) {
    if (!g["grouped_expert_gemms"].is_boolean())
      fail(fmt::format("{}: 'grouped_expert_gemms' must be true or false", w), "fix the profile");
    p.grouped_expert_gemms = g["grouped_expert_gemms"].get<bool>();
  }
  for (const auto& a : objects_at(g, "alignment", w)) {
    const AlignmentFactor f{static_cast<int64_t>(required_number(a, "multiple", w + ".alignment")),
                            required_number(a, "factor", w + ".alignment")};
    // A rate factor: 1 for the best-aligned shapes, less for the others, never more.
    if (f.multiple < 1 || (f.multiple & (f.multiple - 1)) != 0 || !(f.factor > 0) || f.factor > 1)
      fail(fmt::format("{}.alignment: {} is not a power-of-two multiple with a factor in (0, 1]", w,
                       a.dump()),
           "e.g. {\"multiple\": 64, \"factor\": 0.95}; fix or remove the entry");
    p.alignment.push_back(f);
  }
}

// One "collectives" entry; nothing where it has measured points but no fit.
std::optional<CollectiveFit> read_collective(const json& c, const std::string& where) {
  CollectiveFit f;
  const std::string w = where + ": collectives";
  f.op = text_at(c, "op", w);
  if (!known_op(f.op))
    fail(fmt::format("{}: unknown op \"{}\"", w, f.op),
         "use all_reduce, reduce_scatter, all_gather, broadcast or all_to_all");
  f.ranks = static_cast<int64_t>(required_number(c, "ranks", w));
  f.algorithm = text_at(c, "algorithm", w, "default");
  f.scope = text_at(c, "scope", w);
  if (!c.contains("fit") || c["fit"].is_null()) return std::nullopt;  // points only
  const json& fit = object_at(c, "fit", w);
  const std::string wf = fmt::format("{} ({} at {} ranks).fit", w, f.op, f.ranks);
  f.alpha_s = required_number(fit, "alpha_s", wf);
  f.beta_bytes_per_s = required_number(fit, "beta_bytes_per_s", wf);
  f.max_bytes = number(fit, "max_bytes", wf);
  if (f.ranks < 2)
    fail(fmt::format("{}: {} at {} ranks: a collective needs at least 2", w, f.op, f.ranks),
         "fix the entry or measure it again");
  if (f.beta_bytes_per_s <= 0)
    fail(fmt::format("{}: beta_bytes_per_s must be above 0", wf),
         "fix the entry or measure it again");
  return f;
}

}  // namespace

bool is_bench_output(const std::string& contents) {
  if (contents.rfind("# date: ", 0) == 0) return true;
  const json j = json::parse(contents, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("provenance") &&
         j.value("format", std::string()) != kHardwareProfileFormat;
}

HardwareProfile parse_profile(const json& doc, const std::string& where) {
  if (!doc.is_object() || doc.value("format", "") != kHardwareProfileFormat)
    fail(fmt::format("{}: not a foundry hardware profile (\"format\" must be "
                     "\"foundry-hardware-profile\")", where),
         "write one with `foundry bench all`, or start from profiles/mi300x.json");
  if (!doc.contains("version") || doc["version"] != 1)
    fail(fmt::format("{}: unsupported profile version {}", where,
                     doc.contains("version") ? doc["version"].dump() : "(none)"),
         "this foundry reads version 1");
  HardwareProfile p;
  p.path = where;
  p.raw = doc;
  p.name = text_at(doc, "name", where);
  if (doc.contains("device")) {
    const json& d = object_at(doc, "device", where);
    p.kind = text_at(d, "kind", where + ": device", "cpu");
    if (p.kind != "cpu" && p.kind != "gpu")
      fail(fmt::format("{}: device.kind = \"{}\"", where, p.kind), "use \"cpu\" or \"gpu\"");
    p.memory_bytes = static_cast<int64_t>(number(d, "memory_bytes", where + ": device"));
    p.devices_per_node = static_cast<int64_t>(number(d, "devices_per_node", where + ": device", 1));
  }
  const json& compute = object_at(doc, "compute", where);
  p.bf16 = parse_peak(compute, "bf16", where);
  p.fp32 = parse_peak(compute, "fp32", where);
  const json& memory = object_at(doc, "memory", where);
  p.memory_spec_bytes_per_s = number(memory, "spec_bytes_per_s", where + ": memory");
  p.memory_measured_bytes_per_s = number(memory, "measured_bytes_per_s", where + ": memory");
  std::vector<GemmPoint> offsize;
  read_gemm_section(object_at(doc, "gemm", where), where, p, offsize);
  if (p.alignment.empty()) p.alignment = alignment_from_offsize(offsize);
  std::sort(
      p.alignment.begin(), p.alignment.end(),
      [](const AlignmentFactor& a, const AlignmentFactor& b) { return a.multiple > b.multiple; });
  for (const auto& c : objects_at(doc, "collectives", where))
    if (std::optional<CollectiveFit> f = read_collective(c, where)) p.collectives.push_back(*f);
  const json& storage = object_at(doc, "storage", where);
  p.storage_iops_budget = number(storage, "iops_budget", where + ": storage");
  p.storage_page_bytes =
      static_cast<int64_t>(number(storage, "page_bytes", where + ": storage", 4096));
  if (p.max_gemm_rate(DType::bf16) <= 0 && p.max_gemm_rate(DType::f32) <= 0)
    fail(fmt::format("{}: no compute rate (compute.*.measured_flops_per_s or spec_flops_per_s)",
                     where),
         "measure one with `foundry bench gemm --profile FILE`");
  return p;
}

std::vector<std::string> profile_search_dirs() {
  std::vector<std::string> dirs = {"profiles"};
  const std::string exe = exe_dir();
  if (!exe.empty()) {
    dirs.push_back(exe + "/../profiles");  // build/foundry -> profiles/
    dirs.push_back(exe + "/profiles");
  }
#ifdef FOUNDRY_SOURCE_DIR
  dirs.push_back(std::string(FOUNDRY_SOURCE_DIR) + "/profiles");
#endif
  return dirs;
}

HardwareProfile load_profile(const std::string& spec) {
  std::string path = spec;
  const bool bare = spec.find('/') == std::string::npos && spec.find(".json") == std::string::npos;
  // A directory given as a path (a bare name is looked up as a reference profile's first).
  const auto refuse_directory = [&spec] {
    if (std::error_code ec; fs::is_directory(spec, ec))
      fail(fmt::format("profile '{}' is a directory", spec),
           fs::exists(fs::path(spec) / "profile.json", ec)
               ? fmt::format("give the profile file in it: {}/profile.json", spec)
               : std::string("give a reference profile's name (mi300x, h100) or a profile JSON "
                             "written by `foundry bench all`"));
  };
  if (!bare) refuse_directory();
  if (bare) {
    path.clear();
    for (const auto& dir : profile_search_dirs()) {
      const std::string candidate = dir + "/" + spec + ".json";
      if (path_exists(candidate)) {
        path = candidate;
        break;
      }
    }
    if (path.empty()) {
      refuse_directory();
      std::vector<std::string> names;
      for (const auto& dir : profile_search_dirs()) {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir, ec))
          if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
      }
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      fail(fmt::format("unknown profile '{}'", spec),
           fmt::format("available: {} (or give a path to a profile JSON written by `foundry "
                       "bench all`)", list.empty() ? "none found" : list));
    }
  } else if (!path_exists(path)) {
    fail(
        fmt::format("profile file '{}' does not exist", path),
        "write one with `foundry bench all --out DIR`, or name a reference profile (mi300x, h100)");
  }
  json doc;
  try {
    doc = json::parse(read_text_file(path));
  } catch (const json::parse_error& e) {
    fail(fmt::format("{}: not valid JSON: {}", path, e.what()), "fix or regenerate the profile");
  }
  return parse_profile(doc, path);
}

}  // namespace foundry
