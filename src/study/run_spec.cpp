#include "study/run_spec.h"

namespace proplab {

RunSpec to_run_spec(const Study& study) {
  RunSpec spec;
  spec.name = study.name;
  spec.seed = study.seed;
  spec.model = study.model;
  spec.scaling = study.scaling;
  spec.train = study.train;
  spec.data = study.data;
  spec.record = study.record;
  spec.parallel = study.parallel;
  spec.device = study.device;
  spec.theory = study.theory;
  spec.config_toml = study.resolved_toml;
  return spec;
}

}  // namespace proplab
