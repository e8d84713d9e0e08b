// cli/report: `proplab report DIR [--out OUT]` — the standard figures (PNG) and report.md of a sweep folder or a
// folder of run files, rendered headless (gui/report/report.h). The renderer is part of the GUI build: a proplab
// built without the GUI app (PROPLAB_GUI=OFF, or AUTO without imgui/glfw/EGL) says so and exits 1.
//
// Exit status: 0 written; 1 this build has no renderer (or an internal error); 2 bad input (no runs in DIR,
// nothing written) or some run file could not be read (the report covers the others and lists them).
#pragma once

#include <ostream>
#include <string>

namespace proplab {

struct ReportCommandOptions {
  std::string dir;
  std::string out;  // "": DIR/report
};

// Runs the command; returns the exit status. Throws UserError for bad input.
int report_command(const ReportCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace proplab
