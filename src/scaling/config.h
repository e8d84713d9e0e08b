// scaling/config: which scaling rule a study uses and the rule's own parameters (validated by the rule).
#pragma once

#include <map>
#include <string>

namespace proplab {

struct ScalingConfig {
  std::string rule = "standard";
  // The rule's parameters from [scaling] (everything but `rule`), as numbers or booleans (true = 1).
  std::map<std::string, double> params;
};

}  // namespace proplab
