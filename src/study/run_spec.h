// study/run_spec: the RunSpec (train/trainer.h) a validated Study describes: the study itself, without where it came
// from.
#pragma once

#include "study/study.h"
#include "train/trainer.h"

namespace proplab {

inline RunSpec to_run_spec(const Study& study) { return study; }

}  // namespace proplab
