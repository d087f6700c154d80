#include "comm/coll_tuning.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "base/error.h"
#include "comm/comm.h"
#include "comm/leak_check.h"

namespace foundry {

namespace {

std::string variable_name(const std::string& collective) {
  return "coll_tuned_" + collective + "_algorithm";
}

// MPI_T calls return MPI_T_ERR_* codes, which MPI_Error_string does not necessarily know.
void check_mpit(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS)
    fail(fmt::format("MPI_T {} failed (MPI_T error code {})", what, rc),
         "the MPI library refused a tool-interface call; force algorithms with mpirun --mca "
         "instead (see `foundry bench comm --help`)");
}

struct CvarInfo {
  MPI_Datatype datatype = MPI_DATATYPE_NULL;
  MPI_T_enum enumtype = MPI_T_ENUM_NULL;
  int scope = 0;
};

CvarInfo cvar_info(int index) {
  LeakCheckPause pause;
  char name[256];
  char desc[1024];
  int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0;
  CvarInfo info;
  check_mpit(MPI_T_cvar_get_info(index, name, &name_len, &verbosity, &info.datatype,
                                 &info.enumtype, desc, &desc_len, &bind, &info.scope),
             "cvar_get_info");
  return info;
}

// Reads a control variable of one element into a zeroed 8-byte buffer: wide enough for
// every integer and boolean type MPI_T uses, so booleans (whose MPI type varies) read as
// "non-zero or not" on this little-endian machine.
int64_t read_cvar(int index) {
  LeakCheckPause pause;  // MPI_T keeps what it allocates here (comm/leak_check.h)
  MPI_T_cvar_handle handle;
  int count = 0;
  check_mpit(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), "cvar_handle_alloc");
  int64_t value = 0;
  int rc = count == 1 ? MPI_T_cvar_read(handle, &value) : MPI_T_ERR_INVALID;
  MPI_T_cvar_handle_free(&handle);
  check_mpit(rc, "cvar_read");
  return value;
}

}  // namespace

CollTuning::CollTuning() {
  if (!MpiSession::active())
    fail("CollTuning needs MPI", "create an MpiSession before choosing collective algorithms");
  LeakCheckPause pause;
  int provided = 0;
  check_mpit(MPI_T_init_thread(MPI_THREAD_FUNNELED, &provided), "init_thread");
  initialized_ = true;
  int index = -1;
  available_ = MPI_T_cvar_get_index("coll_tuned_allreduce_algorithm", &index) == MPI_SUCCESS;
  if (available_ &&
      MPI_T_cvar_get_index("coll_tuned_use_dynamic_rules", &index) == MPI_SUCCESS)
    dynamic_rules_ = read_cvar(index) != 0;
}

CollTuning::~CollTuning() {
  for (auto it = restore_.rbegin(); it != restore_.rend(); ++it) {
    try {
      write_int(it->first, it->second);
    } catch (const std::exception&) {
      // Restoring is best effort: the variables only matter for communicators created
      // later, and MPI is probably shutting down.
    }
  }
  LeakCheckPause pause;
  if (initialized_) MPI_T_finalize();
}

std::string CollTuning::unavailable_reason() const {
  if (!available_)
    return "this MPI library has no Open MPI coll/tuned control variables "
           "(coll_tuned_<collective>_algorithm)";
  if (!dynamic_rules_)
    return "coll_tuned_use_dynamic_rules is off; it is read once when MPI starts (an "
           "environment or mpirun setting of 0 overrides Foundry's request to turn it on)";
  return "";
}

int CollTuning::cvar_index(const std::string& collective) const {
  int index = -1;
  if (MPI_T_cvar_get_index(variable_name(collective).c_str(), &index) != MPI_SUCCESS) return -1;
  return index;
}

int CollTuning::read_int(int index) const { return static_cast<int>(read_cvar(index)); }

void CollTuning::write_int(int index, int value) {
  LeakCheckPause pause;
  MPI_T_cvar_handle handle;
  int count = 0;
  check_mpit(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), "cvar_handle_alloc");
  int rc = MPI_T_cvar_write(handle, &value);
  MPI_T_cvar_handle_free(&handle);
  check_mpit(rc, "cvar_write");
}

std::vector<TunedAlgorithm> CollTuning::algorithms(const std::string& collective) const {
  const int index = cvar_index(collective);
  if (index < 0)
    fail(fmt::format("no control variable {}", variable_name(collective)),
         "check `ompi_info --param coll tuned --level 9` for the collectives tuned knows");
  // The variable's enumeration lists the algorithms with Open MPI's names, so nothing here
  // hard-codes them (they differ between Open MPI versions).
  const CvarInfo info = cvar_info(index);
  std::vector<TunedAlgorithm> out;
  if (info.enumtype == MPI_T_ENUM_NULL) return out;
  LeakCheckPause pause;
  int items = 0;
  char name[256];
  int name_len = sizeof name;
  check_mpit(MPI_T_enum_get_info(info.enumtype, &items, name, &name_len), "enum_get_info");
  for (int i = 0; i < items; ++i) {
    int value = 0;
    name_len = sizeof name;
    check_mpit(MPI_T_enum_get_item(info.enumtype, i, &value, name, &name_len), "enum_get_item");
    if (value != 0) out.push_back({value, name});
  }
  return out;
}

int CollTuning::forced(const std::string& collective) const {
  const int index = cvar_index(collective);
  return index < 0 ? 0 : read_int(index);
}

std::string CollTuning::algorithm_name(const std::string& collective, int id) const {
  if (id == 0) return "ignore";
  for (const TunedAlgorithm& a : algorithms(collective))
    if (a.id == id) return a.name;
  return fmt::format("algorithm {}", id);
}

void CollTuning::force(const std::string& collective, int id) {
  if (!dynamic_rules_)
    fail(fmt::format("cannot force {} = {}: {}", variable_name(collective), id,
                     unavailable_reason()),
         fmt::format("run with {} instead", mpirun_mca_flags(collective, id)));
  const int index = cvar_index(collective);
  if (index < 0)
    fail(fmt::format("no control variable {}", variable_name(collective)),
         "check `ompi_info --param coll tuned --level 9` for the collectives tuned knows");
  const int before = read_int(index);
  bool recorded = false;
  for (const auto& [i, v] : restore_) recorded |= i == index;
  if (!recorded) restore_.emplace_back(index, before);
  write_int(index, id);
  const int after = read_int(index);
  if (after != id)
    fail(fmt::format("{} = {} did not stick (reads back {})", variable_name(collective), id, after),
         fmt::format("run with {} instead", mpirun_mca_flags(collective, id)));
}

std::string mpirun_mca_flags(const std::string& collective, int id) {
  return fmt::format("mpirun --mca coll_tuned_use_dynamic_rules 1 --mca {} {}",
                     variable_name(collective), id);
}

}  // namespace foundry
