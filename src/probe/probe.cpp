#include "probe/probe.h"

namespace proplab {

const char* probe_kind_name(ProbeKind kind) {
  switch (kind) {
    case ProbeKind::residual:
      return "residual";
    case ProbeKind::branch:
      return "branch";
    case ProbeKind::norm:
      return "norm";
    case ProbeKind::preact:
      return "preact";
    case ProbeKind::postact:
      return "postact";
    case ProbeKind::logits:
      return "logits";
    case ProbeKind::embed:
      return "embed";
  }
  return "?";
}

}  // namespace proplab
