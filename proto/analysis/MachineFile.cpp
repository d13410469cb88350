// Machine descriptions: JSON keys over the default Machine.
#include "proto/analysis/MachineFile.h"

#include <map>

#include <nlohmann/json.hpp>

#include "proto/InputFile.h"

namespace piper::plan {

std::string parseMachine(const std::string &text, const std::string &path,
                         Machine &machine) {
  const std::string where = "machine file '" + path + "': ";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &e) {
    return where + e.what();
  }
  if (!j.is_object())
    return where + "expected a JSON object";
  const std::map<std::string, double *> fields = {
      {"flops_per_second", &machine.flopsPerSecond},
      {"peak_flops_per_second", &machine.peakFlopsPerSecond},
      {"memory_bytes_per_second", &machine.memoryBytesPerSecond},
      {"link_bytes_per_second", &machine.linkBytesPerSecond},
      {"link_latency_seconds", &machine.linkLatencySeconds},
      {"node_link_bytes_per_second", &machine.nodeLinkBytesPerSecond},
      {"node_link_latency_seconds", &machine.nodeLinkLatencySeconds}};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "devices_per_node") {
      if (!it.value().is_number_unsigned() ||
          it.value().get<uint64_t>() > (1u << 20))
        return where + "\"devices_per_node\" must be an integer from 0 to " +
               std::to_string(1u << 20);
      machine.devicesPerNode = static_cast<int>(it.value().get<uint64_t>());
      continue;
    }
    if (it.key() == "share_compute" || it.key() == "comm_uses_compute") {
      if (!it.value().is_boolean())
        return where + "\"" + it.key() + "\" must be true or false";
      (it.key() == "share_compute" ? machine.shareCompute
                                   : machine.commUsesCompute) =
          it.value().get<bool>();
      continue;
    }
    auto f = fields.find(it.key());
    if (f == fields.end())
      return where + "unknown key \"" + it.key() +
             "\" (expected flops_per_second, peak_flops_per_second, "
             "memory_bytes_per_second, link_bytes_per_second, "
             "link_latency_seconds, devices_per_node, "
             "node_link_bytes_per_second, node_link_latency_seconds, "
             "share_compute, comm_uses_compute)";
    if (!it.value().is_number() || it.value().get<double>() < 0)
      return where + "\"" + it.key() + "\" must be a non-negative number";
    *f->second = it.value().get<double>();
  }
  if (machine.commUsesCompute && !machine.shareCompute)
    return where + "\"comm_uses_compute\" needs \"share_compute\": true "
                   "(one compute engine a device, which communication then "
                   "shares)";
  return "";
}

std::string readMachineFile(const std::string &path, Machine &machine) {
  std::string text;
  if (std::string err = readInputFile(path, text); !err.empty())
    return inputError("machine file", path, err);
  return parseMachine(text, path, machine);
}

} // namespace piper::plan
