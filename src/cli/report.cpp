#include "cli/report.h"

#include <unistd.h>

#ifdef PROPLAB_HAVE_REPORT
#include "gui/report/report.h"
#endif

namespace proplab {

int report_command(const ReportCommandOptions& options, std::ostream& out, std::ostream& err) {
#ifdef PROPLAB_HAVE_REPORT
  gui::ReportOptions report;
  report.dir = options.dir;
  report.out = options.out;
  return gui::report_command(report, out, err, isatty(STDERR_FILENO) != 0);
#else
  (void)options;
  (void)out;
  err << "proplab: error: this build of proplab has no renderer for `proplab report`: it draws its figures with the "
         "GUI's offscreen renderer, which was not built (PROPLAB_GUI=OFF, or imgui/glfw3/EGL/stb not found). "
         "Install them (scripts/setup-debian.sh) and reconfigure with -DPROPLAB_GUI=ON.\n";
  return 1;
#endif
}

}  // namespace proplab
