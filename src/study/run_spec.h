// study/run_spec: the RunSpec (train/trainer.h) a validated Study describes.
#pragma once

#include "study/study.h"
#include "train/trainer.h"

namespace proplab {

RunSpec to_run_spec(const Study& study);

}  // namespace proplab
