// data/config: the typed data description a study resolves to.
#pragma once

#include <cstdint>
#include <string>

namespace proplab {

struct DataConfig {
  std::string kind = "markov";      // uniform | markov | text | tokens | gaussian | images | idx | cifar10
  std::string path;                 // text, tokens: the file (relative paths are relative to the study file)
  double val_fraction = 0.1;        // share of the data held out for evaluation (text, tokens: the file's tail)
  int markov_successors = 4;        // markov: non-zero transitions per state (sparse chains learn fast)
  double markov_temperature = 1.0;  // markov: spread of the transition weights (lower = more peaked)
  double gaussian_noise = 0.0;      // gaussian: std of noise added to regression targets
  // Images (data/images.h; kinds images | idx | cifar10): path is the directory of the IDX or CIFAR-10 files.
  bool augment = true;   // idx, cifar10: random crop (zero padding crop_padding) and, with flip, horizontal flips
  int crop_padding = 4;  // pixels of zero padding before the random crop (0: no crop)
  bool flip = true;      // random horizontal flips (off for digits and letters, whose mirror images differ)
};

}  // namespace proplab
