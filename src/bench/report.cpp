#include "bench/report.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "base/format.h"
#include "base/io.h"
#include "bench/provenance.h"

namespace foundry {

namespace {

double num(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || !it->is_number() ? 0.0 : it->get<double>();
}

std::string header(const json& profile, const std::string& prefix) {
  if (profile.contains("provenance") && profile["provenance"].contains("host"))
    return format_provenance(provenance_from_json(profile["provenance"]), prefix);
  return prefix + "provenance: " +
         (profile.contains("provenance") ? profile["provenance"].dump() : std::string("unknown")) +
         "\n";
}

std::string gemm_csv_from(const json& profile) {
  std::string out = header(profile, "# ") + "dtype,kind,m,n,k,seconds,gflops,efficiency,label\n";
  if (!profile.contains("gemm")) return out;
  for (const auto& p : profile["gemm"].value("points", json::array()))
    out += fmt::format("{},{},{},{},{},{:.6g},{:.2f},{:.4f},\"{}\"\n", p.value("dtype", ""),
                       p.value("kind", ""), p.value("m", 0), p.value("n", 0), p.value("k", 0),
                       num(p, "seconds"), num(p, "flops_per_s") / 1e9, num(p, "efficiency"),
                       p.value("label", ""));
  return out;
}

std::string stream_csv_from(const json& profile) {
  std::string out = header(profile, "# ") + "kernel,threads,array_bytes,gb_per_s,valid\n";
  if (!profile.contains("memory")) return out;
  for (const auto& s : profile["memory"].value("stream", json::array()))
    out += fmt::format("{},{},{},{:.2f},{}\n", s.value("kernel", ""), s.value("threads", 0),
                       s.value("array_bytes", int64_t{0}), num(s, "bytes_per_s") / 1e9,
                       s.value("valid", false));
  return out;
}

std::string working_set_csv_from(const json& profile) {
  std::string out = header(profile, "# ") + "bytes,gb_per_s,kernel\n";
  if (!profile.contains("memory")) return out;
  for (const auto& w : profile["memory"].value("working_set", json::array()))
    out += fmt::format("{},{:.2f},{}\n", w.value("bytes", int64_t{0}), num(w, "bytes_per_s") / 1e9,
                       w.value("kernel", ""));
  return out;
}

std::string collectives_csv_from(const json& profile) {
  std::string out =
      header(profile, "# ") +
      "op,ranks,algorithm,bytes,avg_us,min_us,p50_us,p99_us,max_us,algbw_gb_s,busbw_gb_s,wrong\n";
  for (const auto& c : profile.value("collectives", json::array()))
    for (const auto& p : c.value("points", json::array()))
      out += fmt::format("{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.4f},{:.4f},{}\n",
                         c.value("op", ""), c.value("ranks", 0), c.value("algorithm", ""),
                         p.value("bytes", int64_t{0}), 1e6 * num(p, "avg_s"), 1e6 * num(p, "min_s"),
                         1e6 * num(p, "p50_s"), 1e6 * num(p, "p99_s"), 1e6 * num(p, "max_s"),
                         num(p, "algbw_bytes_per_s") / 1e9, num(p, "busbw_bytes_per_s") / 1e9,
                         p.value("wrong", 0));
  return out;
}

// Runs gnuplot on `script`; returns "" on success or what went wrong.
std::string run_gnuplot(const std::string& dir, const std::string& name,
                        const std::string& script) {
  const std::string path = dir + "/" + name + ".gp";
  write_file_atomic(path, script);
  const std::string cmd = "gnuplot '" + path + "' 2>'" + dir + "/" + name + ".gp.log'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    return fmt::format(
        "gnuplot failed on {} (exit {}; see {}.gp.log); install gnuplot-nox for the plots", path,
        WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, name);
  }
  std::remove((dir + "/" + name + ".gp.log").c_str());
  return "";
}

// One data block per series for gnuplot (separated by two blank lines, used with `index`).
struct Series {
  std::string title;
  std::vector<std::pair<double, double>> xy;
};

std::string plot_script(const std::string& png, const std::string& title, const std::string& xlabel,
                        const std::string& ylabel, const std::vector<Series>& series, bool logx,
                        const std::string& extra = "") {
  std::string s = "set terminal pngcairo size 900,560 noenhanced\n";
  s += "set output '" + png + "'\n";
  s += "set title '" + title + "'\nset xlabel '" + xlabel + "'\nset ylabel '" + ylabel + "'\n";
  s += "set grid\nset key top left\n";
  if (logx) s += "set logscale x 2\nset format x '%.0b %BB'\n";
  s += extra;
  s += "$data << EOD\n";
  for (const auto& se : series) {
    for (const auto& [x, y] : se.xy) s += fmt::format("{} {}\n", x, y);
    s += "\n\n";
  }
  s += "EOD\nplot ";
  for (size_t i = 0; i < series.size(); ++i)
    s += fmt::format("{}$data index {} with linespoints title '{}'", i ? ", " : "", i,
                     series[i].title);
  return s + "\n";
}

using Plots = std::vector<std::pair<std::string, std::string>>;  // name, gnuplot script

// The GEMM plots: square sizes, and what off-size dimensions cost.
void gemm_plots(const json& profile, Plots& plots) {
  if (!profile.contains("gemm")) return;
  std::map<std::string, Series> square, offsize;
  for (const auto& p : profile["gemm"].value("points", json::array())) {
    const std::string kind = p.value("kind", ""), dtype = p.value("dtype", "");
    const double gf = num(p, "flops_per_s") / 1e9;
    if (kind == "square") square[dtype].xy.push_back({num(p, "m"), gf});
    if (kind == "offsize") {
      // The scanned dimension is the one that is not the scan's base size.
      const double m = num(p, "m"), n = num(p, "n"), k = num(p, "k");
      const double x = (m == n) ? k : (m == k ? n : m);
      offsize[dtype].xy.push_back({x, gf});
    }
  }
  auto to_vec = [](std::map<std::string, Series>& m) {
    std::vector<Series> v;
    for (auto& [dt, s] : m) {
      s.title = dt;
      std::sort(s.xy.begin(), s.xy.end());
      v.push_back(s);
    }
    return v;
  };
  if (!square.empty())
    plots.push_back(
        {"gemm_square", plot_script("gemm_square.png", "GEMM throughput, square M = N = K (oneDNN)",
                                    "M = N = K", "GFLOP/s", to_vec(square), false)});
  if (!offsize.empty())
    plots.push_back(
        {"gemm_offsize", plot_script("gemm_offsize.png", "What off-size dimensions cost",
                                     "scanned dimension", "GFLOP/s", to_vec(offsize), false)});
}

// Bandwidth against working set, each cache level marked.
void working_set_plot(const json& profile, Plots& plots) {
  if (!profile.contains("memory") || !profile["memory"].contains("working_set")) return;
  Series ws{"triad", {}};
  for (const auto& w : profile["memory"]["working_set"])
    ws.xy.push_back({num(w, "bytes"), num(w, "bytes_per_s") / 1e9});
  std::string marks;
  // Mark each level at the capacity the sweep's threads reach: one instance per thread,
  // up to the instances there are (2 threads on 2 private L1s see both).
  int threads = 1;
  for (const auto& w : profile["memory"]["working_set"])
    threads = std::max(threads, w.value("threads", 1));
  for (const auto& c : profile["memory"].value("caches", json::array()))
    marks += fmt::format(
        "set arrow from {0},graph 0 to {0},graph 1 nohead dashtype 2\n"
        "set label 'L{1}' at {0},graph 0.95 offset 0.5,0\n",
        num(c, "bytes") * std::min(threads, c.value("instances", 1)), c.value("level", 0));
  if (!ws.xy.empty())
    plots.push_back({"memory_working_set",
                     plot_script("memory_working_set.png", "Memory bandwidth against working set",
                                 "working set (all arrays)", "GB/s", {ws}, true, marks)});
}

// One plot per collective: bus bandwidth against message size, a series per rank count and
// algorithm.
void collective_plots(const json& profile, Plots& plots) {
  std::map<std::string, std::vector<Series>> comm;  // op -> series per rank count/algorithm
  for (const auto& c : profile.value("collectives", json::array())) {
    if (!c.contains("points") || c["points"].empty()) continue;
    Series s;
    s.title = fmt::format(
        "{} ranks{}", c.value("ranks", 0),
        c.value("algorithm", "default") == "default" ? "" : ", " + c.value("algorithm", ""));
    for (const auto& p : c["points"])
      s.xy.push_back({num(p, "bytes"), num(p, "busbw_bytes_per_s") / 1e9});
    comm[c.value("op", "")].push_back(s);
  }
  for (const auto& [op, series] : comm)
    plots.push_back({"comm_" + op, plot_script("comm_" + op + ".png",
                                               op + " bus bandwidth (nccl-tests convention)",
                                               "message size", "busbw GB/s", series, true)});
}

}  // namespace

ReportFiles write_report(const json& profile, const std::string& dir) {
  make_dirs(dir);
  ReportFiles files;
  auto csv = [&](const std::string& name, const std::string& text) {
    write_file_atomic(dir + "/" + name, text);
    files.csv.push_back(name);
  };
  csv("gemm.csv", gemm_csv_from(profile));
  csv("memory_stream.csv", stream_csv_from(profile));
  csv("memory_working_set.csv", working_set_csv_from(profile));
  csv("collectives.csv", collectives_csv_from(profile));

  Plots plots;
  gemm_plots(profile, plots);
  working_set_plot(profile, plots);
  collective_plots(profile, plots);
  for (const auto& [name, script] : plots) {
    // gnuplot writes the PNG relative to its working directory: run it inside `dir`.
    const std::string warning = run_gnuplot(dir, name, "cd '" + dir + "'\n" + script);
    if (!warning.empty()) {
      files.plot_warning = warning;
      break;
    }
    files.png.push_back(name + ".png");
  }
  files.markdown = "report.md";
  write_file_atomic(dir + "/report.md", format_report(profile, files.png));
  return files;
}

std::string format_report(const json& profile, const std::vector<std::string>& pngs) {
  std::string md = "# Hardware profile: " + profile.value("name", std::string("unnamed")) + "\n\n";
  md += "## Provenance\n\n```\n" + header(profile, "") + "```\n\n";
  md += "Files: `profile.json` (the machine-readable profile), `gemm.csv`, `memory_stream.csv`, "
        "`memory_working_set.csv`, `collectives.csv`.\n\n";
  auto image = [&](const std::string& name) {
    if (std::find(pngs.begin(), pngs.end(), name) != pngs.end())
      md += "![" + name + "](" + name + ")\n\n";
  };

  if (profile.contains("compute")) {
    md +=
        "## Peak compute\n\n| dtype | spec peak (GFLOP/s) | basis | best measured GEMM (GFLOP/s) | "
        "measured / spec |\n|---|---:|---|---:|---:|\n";
    for (const char* dt : {"fp32", "bf16"}) {
      if (!profile["compute"].contains(dt)) continue;
      const json& c = profile["compute"][dt];
      const double spec = num(c, "spec_flops_per_s"), meas = num(c, "measured_flops_per_s");
      // A figure not measured is "—", never a measured 0.
      md += fmt::format(
          "| {} | {} | {} | {} | {} |\n", dt, spec > 0 ? fmt::format("{:.0f}", spec / 1e9) : "—",
          c.value("spec_basis", ""), meas > 0 ? fmt::format("{:.0f}", meas / 1e9) : "—",
          spec > 0 && meas > 0 ? fmt::format("{:.0f}%", 100 * meas / spec) : "—");
    }
    md += "\n";
  }
  if (profile.contains("gemm")) {
    md += "## GEMM throughput (oneDNN, minimum time over repeats)\n\n";
    image("gemm_square.png");
    md +=
        "| dtype | kind | M | N | K | GFLOP/s | efficiency | shape "
        "|\n|---|---|---:|---:|---:|---:|---:|---|\n";
    for (const auto& p : profile["gemm"].value("points", json::array()))
      if (p.value("kind", "") != "offsize")
        md += fmt::format("| {} | {} | {} | {} | {} | {:.0f} | {:.0f}% | {} |\n",
                          p.value("dtype", ""), p.value("kind", ""), p.value("m", 0),
                          p.value("n", 0), p.value("k", 0), num(p, "flops_per_s") / 1e9,
                          100 * num(p, "efficiency"), p.value("label", ""));
    md += "\n### Off-size dimensions\n\n";
    image("gemm_offsize.png");
    md +=
        "Efficiency of each scanned size against the best of the scan (see gemm.csv for all "
        "points).\n\n";
  }
  if (profile.contains("memory")) {
    const json& m = profile["memory"];
    md += "## Memory bandwidth (STREAM, doubles, no write-allocate traffic counted)\n\n";
    md += "| kernel | threads | array | GB/s | valid |\n|---|---:|---:|---:|---|\n";
    for (const auto& s : m.value("stream", json::array()))
      md +=
          fmt::format("| {} | {} | {} | {:.1f} | {} |\n", s.value("kernel", ""),
                      s.value("threads", 0), format_bytes(num(s, "array_bytes"), ByteUnit::MiB, 0),
                      num(s, "bytes_per_s") / 1e9, s.value("valid", false) ? "yes" : "NO");
    md += "\n";
    image("memory_working_set.png");
  }
  if (profile.contains("collectives") && !profile["collectives"].empty()) {
    md += "## Collectives (nccl-tests conventions: algbw = S/t, busbw = algbw × factor)\n\n";
    md += "Fitted latency–bandwidth model t(S) = α + S/β (β in the algbw convention):\n\n";
    md +=
        "| op | ranks | algorithm | α (µs) | β (GB/s) | peak busbw (GB/s) "
        "|\n|---|---:|---|---:|---:|---:|\n";
    std::set<std::string> ops;
    for (const auto& c : profile["collectives"]) {
      double peak = 0;
      for (const auto& p : c.value("points", json::array()))
        peak = std::max(peak, num(p, "busbw_bytes_per_s"));
      const json fit = c.value("fit", json::object());
      const bool fitted = num(fit, "beta_bytes_per_s") > 0;  // one size fits no line
      md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", c.value("op", ""), c.value("ranks", 0),
                        c.value("algorithm", ""),
                        fitted ? fmt::format("{:.1f}", 1e6 * num(fit, "alpha_s")) : "—",
                        fitted ? fmt::format("{:.2f}", num(fit, "beta_bytes_per_s") / 1e9) : "—",
                        peak > 0 ? fmt::format("{:.2f}", peak / 1e9) : "—");
      ops.insert(c.value("op", ""));
    }
    md += "\n";
    for (const auto& op : ops) image("comm_" + op + ".png");
  }
  return md;
}

}  // namespace foundry
