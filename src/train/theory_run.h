// train/theory_run: the theoretical predictions for a run's model at initialisation, with the inputs the
// formulae need measured the way the run will see them (the embedding output's token correlation on the first
// training batch), and their place in the run file (/theory).
#pragma once

#include "io/run_file.h"
#include "scaling/rule.h"
#include "theory/model_theory.h"
#include "train/trainer.h"

namespace proplab {

// Predictions for every probe of spec's model, in the model's probe order. Builds only the embedding tables
// (not the model), so it is fast for very deep models — except for a rule that needs a profiling pass (admin),
// whose rule is built by make_model_rule like the model's, one forward pass of the model included, so the
// predictions use the model's own residual weights. UserError for data problems (as run_training).
theory::ProbePrediction predict_for_run(const RunSpec& spec);
// The same with the run's rule (make_model_rule), as run_training builds it once for the model and the theory.
theory::ProbePrediction predict_for_run(const RunSpec& spec, const ScalingRule& rule);

// Writes /theory/forward/{var,mean,corr,var_log_sd} and /theory/backward/{var,corr} [n_probes] (NaN where a probe
// has no such prediction) with the attributes `formulae` and `no_prediction` (call between RunWriter::create and
// start).
void write_theory(RunWriter& writer, const theory::ProbePrediction& prediction);

}  // namespace proplab
