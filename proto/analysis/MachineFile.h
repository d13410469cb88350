// Machine descriptions (`--machine FILE` of piper-plan --simulate and piperc
// search): a JSON object whose keys override the default Machine
// (docs/simulator.md §5 lists them with the bundled H100 and H200 clusters).
#ifndef PIPER_PROTO_ANALYSIS_MACHINEFILE_H
#define PIPER_PROTO_ANALYSIS_MACHINEFILE_H

#include <string>

#include "proto/analysis/Simulate.h"

namespace piper::plan {

/// Applies the JSON machine description `text` (read from `path`, which
/// errors name) to `machine`: every key optional, a rate of 0 makes that
/// resource free. Unknown keys, wrong types and negative numbers are errors.
/// Returns "" or the error.
std::string parseMachine(const std::string &text, const std::string &path,
                         Machine &machine);

/// Reads the machine file `path` with the shared input reader and applies
/// it with parseMachine; "" or the error naming the file.
std::string readMachineFile(const std::string &path, Machine &machine);

} // namespace piper::plan

#endif // PIPER_PROTO_ANALYSIS_MACHINEFILE_H
